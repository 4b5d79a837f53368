//! Fencing tokens on PostgreSQL (see [`crate::fence`]): issued on the
//! lock's own server session, guarded by its claim like every lock
//! statement.

use std::sync::Arc;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::conn::PgConn;
use super::session_lock::SessionLock;
use crate::core::guard::BoxFuture;
use crate::fence::{no_table_help, POSTGRES_TABLE};
use crate::postgres::errors::{db_err, is_session_end};
use crate::{Error, LockName, Result};

/// One autocommit statement: the next token of `$1`, only on the server
/// session this connection claimed (`$2`), where the lock is held. No row:
/// a pooler moved us.
///
/// The token is the row's last one plus one, but at least `(timeline - 1)
/// << 40 | 1` (see [`crate::fence`]): on timeline 1 the plain counter of
/// earlier versions, and after a promotion above every token any earlier
/// timeline issued, whatever rows the new primary missed. The timeline is
/// the current WAL file's (its name's first 8 hex digits): right after
/// `pg_ctl promote`, `pg_control_checkpoint()` still says the old one
/// until the next checkpoint.
///
/// Only a holder of the lock updates its row, so the row lock is free but
/// for someone else's transaction on the table (an operator's): then the
/// statement gives up after 250 ms (55P03) rather than stall the
/// shared lock session, whose keepalive probe would otherwise end it, and
/// every lock on it. `lock_timeout` is set for this statement's implicit
/// transaction, in its `WHERE`, which runs before the row is locked.
const ISSUE: &str = "INSERT INTO public.dbmutex_fence AS f (lock_key, token) \
     SELECT $1, ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 40) + 1 \
     WHERE current_setting('dbmutex.owner', true) = $2 \
     AND set_config('lock_timeout', '250ms', true) IS NOT NULL \
     ON CONFLICT (lock_key) DO UPDATE SET token = GREATEST(f.token + 1, EXCLUDED.token) RETURNING f.token";

/// The longest wait for the row (in [`ISSUE`]): under the keepalive probe's
/// shortest answer bound (500 ms).
#[cfg(test)]
const ROW_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// A grant's [`fence`](crate::core::guard::Grant::fence): `lock` is the
/// grant's lock while it holds it.
pub(crate) fn for_grant(lock: Option<SessionLock>, key: String) -> BoxFuture<Result<u64>> {
    Box::pin(async move {
        let lock = lock.ok_or_else(|| Error::Database("a fencing token for a released lock".into()))?;
        issue(&lock.conn, &key, &lock.name).await
    })
}

/// The next fencing token of `key`, issued on `conn`, which holds the lock
/// on `name`; the table is created on first use.
pub(crate) async fn issue(conn: &Arc<PgConn>, key: &str, name: &LockName) -> Result<u64> {
    let owner = claimed(conn, name)?;
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&key, Type::TEXT), (&owner, Type::TEXT)];
    let mut created = false;
    loop {
        match conn.client.query_typed(ISSUE, &params).await {
            Ok(rows) => {
                let Some(row) = rows.first() else {
                    conn.moved();
                    return Err(lost(name));
                };
                let token: i64 = row.try_get(0).map_err(|e| Error::Database(Box::new(e)))?;
                return u64::try_from(token).map_err(|_| {
                    Error::Database(format!("dbmutex_fence holds a negative token for {key:?}").into())
                });
            }
            Err(e) => match failed(e, conn, name, no_table_help) {
                Failed::NoTable(_) if !created => {
                    create(conn).await?;
                    created = true;
                }
                Failed::NoTable(e) | Failed::Other(e) => return Err(e),
            },
        }
    }
}

pub(super) fn lost(name: &LockName) -> Error {
    Error::LockLost {
        name: name.to_string(),
    }
}

/// The claim token of `conn`, which must still hold the lock on `name`:
/// a statement guarded by it only runs on the server session that holds
/// the lock.
pub(super) fn claimed(conn: &Arc<PgConn>, name: &LockName) -> Result<String> {
    if conn.is_lost() {
        return Err(lost(name));
    }
    let owner = conn.owner();
    if owner.is_empty() {
        // Unclaimed: the statement could land on any server session.
        conn.moved();
        return Err(lost(name));
    }
    Ok(owner.to_string())
}

/// How a statement on the lock session of `name` failed.
pub(super) enum Failed {
    /// Its table does not exist (yet); the error, if it stays so.
    NoTable(Error),
    Other(Error),
}

/// Sorts a failed statement on the lock session: the table is missing, the
/// role may not write it (`help` says what to do), the session is gone (the
/// lock with it), or a database error.
pub(super) fn failed(
    e: tokio_postgres::Error,
    conn: &PgConn,
    name: &LockName,
    help: fn(&str) -> String,
) -> Failed {
    if e.code() == Some(&SqlState::UNDEFINED_TABLE) {
        Failed::NoTable(db_err(e, name))
    } else if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        Failed::Other(Error::Config(help("write")))
    } else if e.is_closed() || conn.is_lost() || is_session_end(&e) {
        Failed::Other(lost(name))
    } else {
        Failed::Other(db_err(e, name))
    }
}

/// `CREATE TABLE IF NOT EXISTS`, which two sessions racing may both run:
/// the loser fails on the catalog's unique index (23505), on the table's
/// row type (42710, "type already exists") or finds the table (42P07);
/// either way the table is there.
///
/// Refused while a `dbmutex_fence` outside `public` is on the
/// `search_path`: earlier versions issued tokens there, and a new table
/// would start them again at 1, below what resources have accepted.
pub(crate) async fn create(conn: &PgConn) -> Result<()> {
    let elsewhere = conn
        .client
        .query_typed(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = to_regclass('dbmutex_fence') AND to_regclass('public.dbmutex_fence') IS NULL",
            &[],
        )
        .await
        .map_err(|e| Error::Database(Box::new(e)))?;
    if let Some(table) = elsewhere.first().map(|r| r.get::<_, String>(0)) {
        return Err(Error::Config(format!(
            "fencing tokens live in public.dbmutex_fence, whatever the search_path; this \
             database has {table} (used before by its search_path): move it, so that tokens go \
             on from its last ones (ALTER TABLE {table} SET SCHEMA public)"
        )));
    }
    create_table(conn, POSTGRES_TABLE, no_table_help).await
}

/// Every table of dbmutex's (`dbmutex init`).
pub(super) async fn create_tables(conn: &PgConn) -> Result<()> {
    create(conn).await?;
    create_table(conn, crate::runs::POSTGRES_TABLE, crate::runs::no_table_help).await?;
    create_table(conn, crate::delay::POSTGRES_TABLE, crate::delay::no_table_help).await
}

/// [`create`] for any of dbmutex's tables.
pub(super) async fn create_table(conn: &PgConn, sql: &str, help: fn(&str) -> String) -> Result<()> {
    match conn.client.batch_execute(sql).await {
        Ok(()) => Ok(()),
        Err(e)
            if [
                SqlState::UNIQUE_VIOLATION,
                SqlState::DUPLICATE_TABLE,
                SqlState::DUPLICATE_OBJECT,
            ]
            .iter()
            .any(|c| e.code() == Some(c)) =>
        {
            Ok(())
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(Error::Config(help("create"))),
        Err(e) => Err(Error::Database(Box::new(e))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_row_wait_is_the_statements() {
        let ms = super::ROW_WAIT.as_millis();
        assert!(super::ISSUE.contains(&format!("'lock_timeout', '{ms}ms'")));
        assert!(ms < 500, "under the keepalive probe's answer bound");
    }
}
