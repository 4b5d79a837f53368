//! Who holds what: `IS_USED_LOCK`, `information_schema.PROCESSLIST`, and the
//! metadata-lock tables.

use mysql_async::prelude::Queryable;

use super::conn::{Connector, RunError};
use super::errors::run_err;
use crate::key::{mysql_looks_mapped, Prefix};
use crate::settings::Settings;
use crate::types::{Holder, ListedLock};
use crate::{Error, LockName, Mode, Result};

/// The holder's connection id, user, host, and when its current state began
/// (a server timestamp), for one lock string.
const HOLDER_SQL: &str = "SELECT l.id, p.USER, p.HOST, CAST(NOW() - INTERVAL p.TIME SECOND AS CHAR) \
     FROM (SELECT IS_USED_LOCK(?) AS id) l \
     LEFT JOIN information_schema.PROCESSLIST p ON p.ID = l.id \
     WHERE l.id IS NOT NULL";

/// MariaDB: granted user locks, from the `metadata_lock_info` plugin, with
/// when each was acquired (`LOCK_TIME_MS` is the lock's age).
const MARIADB_LIST_SQL: &str = "SELECT m.TABLE_SCHEMA, m.THREAD_ID, p.USER, p.HOST, \
     CAST(NOW(3) - INTERVAL m.LOCK_TIME_MS * 1000 MICROSECOND AS CHAR) \
     FROM information_schema.METADATA_LOCK_INFO m \
     LEFT JOIN information_schema.PROCESSLIST p ON p.ID = m.THREAD_ID \
     WHERE m.LOCK_TYPE = 'User lock' ORDER BY m.THREAD_ID, m.TABLE_SCHEMA";

/// MySQL 8 (from its documentation; not measured here): granted user locks
/// from performance_schema.
const MYSQL8_LIST_SQL: &str = "SELECT m.OBJECT_NAME, t.PROCESSLIST_ID, t.PROCESSLIST_USER, \
     t.PROCESSLIST_HOST, CAST(NOW() - INTERVAL t.PROCESSLIST_TIME SECOND AS CHAR) \
     FROM performance_schema.metadata_locks m \
     JOIN performance_schema.threads t ON t.THREAD_ID = m.OWNER_THREAD_ID \
     WHERE m.OBJECT_TYPE = 'USER LEVEL LOCK' AND m.LOCK_STATUS = 'GRANTED' \
     ORDER BY t.PROCESSLIST_ID, m.OBJECT_NAME";

/// Connection id, user, host, since.
type Row = (Option<i64>, Option<String>, Option<String>, Option<String>);
/// The lock string, then a [`Row`].
type ListRow = (
    String,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn holder(row: Row) -> Option<Holder> {
    let (id, user, host, since) = row;
    Some(Holder {
        pid: id?,
        mode: Mode::Exclusive,
        application: None,
        user,
        client: host,
        since,
    })
}

pub(super) async fn is_locked(connector: &Connector, name: &LockName, lock: &str) -> Result<bool> {
    let lock = lock.to_owned();
    let row: Option<(Option<i64>,)> = connector
        .run(|c| c.exec_first("SELECT IS_USED_LOCK(?)", (lock.clone(),)))
        .await
        .map_err(|e| run_err(e, name))?;
    Ok(row.and_then(|(id,)| id).is_some())
}

pub(super) async fn holders(connector: &Connector, name: &LockName, lock: &str) -> Result<Vec<Holder>> {
    let lock = lock.to_owned();
    let rows: Vec<Row> = connector
        .run(|c| c.exec(HOLDER_SQL, (lock.clone(),)))
        .await
        .map_err(|e| run_err(e, name))?;
    Ok(rows.into_iter().filter_map(holder).collect())
}

pub(super) async fn list(connector: &Connector, settings: &Settings) -> Result<Vec<ListedLock>> {
    let listing = LockName::Str("(list)".into());
    let mariadb: Result<Vec<ListRow>, _> = connector.run(|c| c.exec(MARIADB_LIST_SQL, ())).await;
    let rows =
        match mariadb {
            Ok(rows) => rows,
            // 1109: unknown table — the plugin is not installed, or this is MySQL.
            Err(RunError::Query(mysql_async::Error::Server(e))) if e.code == 1109 => {
                // MariaDB has performance_schema.metadata_locks too, but with
                // performance_schema off (its default) the table is just empty.
                let flavour: Option<(Option<i64>, Option<i64>)> = connector
                    .run(|c| c.query_first("SELECT VERSION() LIKE '%MariaDB%', @@performance_schema"))
                    .await
                    .map_err(|e| run_err(e, &listing))?;
                match flavour {
                    Some((Some(0), Some(1))) => connector
                        .run(|c| c.exec(MYSQL8_LIST_SQL, ()))
                        .await
                        .map_err(|e| run_err(e, &listing))?,
                    Some((Some(0), _)) => return Err(Error::Unsupported(
                        "listing MySQL user locks needs performance_schema (performance_schema=ON in the \
                         server's configuration); is_locked and holders work without it"
                            .into(),
                    )),
                    _ => return Err(Error::Unsupported(
                        "listing MariaDB user locks needs the metadata_lock_info plugin (an administrator \
                         runs: INSTALL SONAME 'metadata_lock_info'); is_locked and holders work without it"
                            .into(),
                    )),
                }
            }
            Err(e) => return Err(run_err(e, &listing)),
        };
    Ok(rows
        .into_iter()
        .filter_map(|(key, id, user, host, since)| {
            Some(ListedLock {
                name: name_of(&key, &settings.prefix),
                holder: holder((id, user, host, since))?,
                key,
            })
        })
        .collect())
}

/// A lock string as MariaDB's `METADATA_LOCK_INFO` shows it (measured on
/// 10.11): read as `utf8mb3`, so each byte of a 4-byte character shows as
/// `?`, and cut to 64 characters.
pub(super) fn as_listed(lock: &str) -> String {
    lock.chars()
        .flat_map(|c| match c.len_utf8() {
            4 => std::iter::repeat_n('?', 4),
            _ => std::iter::repeat_n(c, 1),
        })
        .take(crate::key::MYSQL_MAX_CHARS)
        .collect()
}

/// Whether a listed string may be cut short or altered by the listing
/// (see [`as_listed`]), so that it must be checked before it counts as the
/// lock string.
pub(super) fn maybe_cut(listed: &str) -> bool {
    listed.contains('?') || listed.chars().count() >= crate::key::MYSQL_MAX_CHARS
}

/// Whether `lock`, exactly, is held by session `id` now.
pub(super) async fn held_by(connector: &Connector, lock: &str, id: i64) -> Result<bool> {
    let lock = lock.to_owned();
    let row: Option<(Option<i64>,)> = connector
        .run(|c| c.exec_first("SELECT IS_USED_LOCK(?)", (lock.clone(),)))
        .await
        .map_err(|e| run_err(e, &LockName::Str("(list)".into())))?;
    Ok(row.and_then(|(v,)| v) == Some(id))
}

/// The name behind a lock string, when it can be known from the string:
/// the string minus the prefix. A string in the shape of a mapped long name
/// (see [`mysql_looks_mapped`]: a head, `#`, 16 hex digits) is taken for
/// one, so its name is unknown here; the backend fills in the names of the
/// locks its own locker holds.
fn name_of(key: &str, prefix: &Prefix) -> Option<String> {
    let rest = key.strip_prefix(prefix.text())?;
    (!mysql_looks_mapped(key) && !rest.is_empty()).then(|| rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{mysql_lock_string_for, MysqlFlavour};

    #[test]
    fn names_from_lock_strings() {
        let p = Prefix::new("app:");
        assert_eq!(name_of("app:report", &p).as_deref(), Some("report"));
        assert_eq!(name_of("other:report", &p), None);
        assert_eq!(name_of("app:", &p), None);
        let long = "n".repeat(100);
        for flavour in [MysqlFlavour::MariaDb, MysqlFlavour::Mysql] {
            let key = mysql_lock_string_for(&long.as_str().into(), &p, flavour).unwrap();
            let want = (flavour == MysqlFlavour::MariaDb).then(|| long.clone());
            assert_eq!(name_of(&key, &p), want, "{flavour:?}");
        }
        // A mapped string does not reveal its name — multi-byte heads too,
        // which stop short of 47 characters.
        for long in [
            "n".repeat(300),
            "ü".repeat(100),
            "😀".repeat(60),
            format!("a{}", "😀".repeat(60)),
        ] {
            let key = mysql_lock_string_for(&long.as_str().into(), &p, MysqlFlavour::MariaDb).unwrap();
            assert_ne!(key, format!("app:{long}"));
            assert_eq!(name_of(&key, &p), None, "{key:?}");
        }
        assert_eq!(name_of("plain", &Prefix::none()).as_deref(), Some("plain"));
    }

    #[test]
    fn listed_strings() {
        assert_eq!(as_listed("report"), "report");
        assert_eq!(as_listed("a😀ü"), "a????ü");
        let long = "m".repeat(100);
        assert_eq!(as_listed(&long), "m".repeat(64));
        assert!(maybe_cut(&as_listed(&long)));
        assert!(maybe_cut("a?b"));
        assert!(!maybe_cut("report"));
        assert!(!maybe_cut(&"m".repeat(63)));
    }
}
