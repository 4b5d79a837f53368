//! Who holds what: `IS_USED_LOCK`, `information_schema.PROCESSLIST`, and the
//! metadata-lock tables.

use mysql_async::prelude::Queryable;

use super::conn::{Connector, RunError};
use super::errors::run_err;
use super::registry::Shared;
use crate::key::{mysql_as_listed, mysql_maybe_cut, mysql_name_of};
use crate::settings::Settings;
use crate::types::{Holder, HolderId, ListedLock};
use crate::{Error, LockName, Mode, Result};

/// The holder's connection id, user, host, and when its current state began
/// (a server timestamp), for one lock string.
const HOLDER_SQL: &str = "SELECT l.id, p.USER, p.HOST, DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL p.TIME SECOND, '%Y-%m-%dT%H:%i:%s.%fZ') \
     FROM (SELECT IS_USED_LOCK(?) AS id) l \
     LEFT JOIN information_schema.PROCESSLIST p ON p.ID = l.id \
     WHERE l.id IS NOT NULL";

/// MariaDB: granted user locks, from the `metadata_lock_info` plugin, with
/// when each was acquired (`LOCK_TIME_MS` is the lock's age).
const MARIADB_LIST_SQL: &str = "SELECT m.TABLE_SCHEMA, m.THREAD_ID, p.USER, p.HOST, \
     DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL m.LOCK_TIME_MS * 1000 MICROSECOND, '%Y-%m-%dT%H:%i:%s.%fZ') \
     FROM information_schema.METADATA_LOCK_INFO m \
     LEFT JOIN information_schema.PROCESSLIST p ON p.ID = m.THREAD_ID \
     WHERE m.LOCK_TYPE = 'User lock' ORDER BY m.THREAD_ID, m.TABLE_SCHEMA";

/// MySQL 8 (from its documentation; not measured here): granted user locks
/// from performance_schema.
const MYSQL8_LIST_SQL: &str = "SELECT m.OBJECT_NAME, t.PROCESSLIST_ID, t.PROCESSLIST_USER, \
     t.PROCESSLIST_HOST, DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL t.PROCESSLIST_TIME SECOND, '%Y-%m-%dT%H:%i:%s.%fZ') \
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
    let id = id?;
    Some(Holder {
        id: HolderId::ConnectionId(id),
        pid: id,
        mode: Mode::Exclusive,
        application: None,
        user,
        client: host,
        since,
    })
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
                name: mysql_name_of(&key, &settings.prefix),
                holder: holder((id, user, host, since))?,
                key,
            })
        })
        .collect())
}

// The inverse of the lock-string mapping lives beside it, in crate::key;
// mysql/mod.rs reads the listing through these names.

/// Whether `lock`, exactly, is held by session `id` now.
pub(super) async fn held_by(connector: &Connector, lock: &str, id: i64) -> Result<bool> {
    let lock = lock.to_owned();
    let row: Option<(Option<i64>,)> = connector
        .run(|c| c.exec_first("SELECT IS_USED_LOCK(?)", (lock.clone(),)))
        .await
        .map_err(|e| run_err(e, &LockName::Str("(list)".into())))?;
    Ok(row.and_then(|(v,)| v) == Some(id))
}
/// [`list`], with the names of this locker's own locks, which are known
/// here, mapped or not, however the server shows their strings.
pub(super) async fn list_with_own(shared: &Shared, settings: &Settings) -> Result<Vec<ListedLock>> {
    let mut rows = list(&shared.connector, settings).await?;
    let mine: Vec<(String, String, u64, String)> = {
        let registry = shared.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry
            .iter()
            .map(|(lock, r)| {
                (
                    mysql_as_listed(lock),
                    lock.clone(),
                    r.lc.server_id(),
                    r.name.to_string(),
                )
            })
            .collect()
    };
    for row in &mut rows {
        let holder = u64::try_from(row.holder.pid).ok();
        if let Some((_, lock, _, name)) = mine
            .iter()
            .find(|(shown, _, id, _)| Some(*id) == holder && *shown == row.key)
        {
            row.key = lock.clone();
            row.name = Some(name.clone());
        } else if row.name.is_some()
            && mysql_maybe_cut(&row.key)
            && !held_by(&shared.connector, &row.key, row.holder.pid).await?
        {
            // The server showed a cut or altered string: its name is unknown.
            row.name = None;
        }
    }
    Ok(rows)
}
