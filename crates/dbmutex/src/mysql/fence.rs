//! Fencing tokens on MySQL / MariaDB (see [`crate::fence`]): issued on the
//! lock's own connection, while the server shows the lock held there.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::conn::{ConnFuture, Connector, RunError};
use super::errors::db_err;
use super::lock_conn::{ping_timeout, LockConn};
use crate::fence::{no_table_help, MYSQL_TABLE};
use crate::runs;
use crate::{Error, LockName, Result};

/// One autocommit statement: the next token of the key (first `?`), only
/// while this session holds the lock (second `?`). `LAST_INSERT_ID(expr)`
/// puts the new token into the statement's OK packet: no second round
/// trip. Affected rows: 1 inserted, 2 updated, 0 not held.
const ISSUE: &str = "INSERT INTO dbmutex_fence (lock_key, token) \
     SELECT ?, LAST_INSERT_ID(1) FROM DUAL WHERE IS_USED_LOCK(?) = CONNECTION_ID() \
     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(dbmutex_fence.token + 1)";

/// `ER_NO_SUCH_TABLE`.
pub(super) const NO_SUCH_TABLE: u16 = 1146;
/// `ER_TABLEACCESS_DENIED_ERROR` (a command on a table, `CREATE`
/// included), `ER_DBACCESS_DENIED_ERROR`.
const DENIED: [u16; 2] = [1142, 1044];
/// `ER_NO_DB_ERROR`.
const NO_DATABASE: u16 = 1046;
const NO_DATABASE_HELP: &str =
    "fencing tokens and once-per-window runs need a database in the MySQL URL (mysql://user@host/db): \
     their tables (dbmutex_fence, dbmutex_runs) live there";

/// The next fencing token of `key`, issued on `lc`, which holds `lock`
/// (the lock string) for `name`; the table is created on first use.
pub(super) async fn issue(lc: Arc<LockConn>, key: String, lock: String, name: LockName) -> Result<u64> {
    on_lock_conn(&lc, &name, MYSQL_TABLE, no_table_help, |conn| {
        let (key, lock) = (key.clone(), lock.clone());
        Box::pin(async move {
            conn.exec_drop(ISSUE, (key.as_bytes(), lock.as_str())).await?;
            // Affected rows 0: the server does not show the lock here.
            Ok((conn.affected_rows() != 0).then(|| conn.last_insert_id()))
        })
    })
    .await?
    .ok_or_else(|| Error::Database("the fencing statement returned no token".into()))
}

/// Runs `work` on `lc`'s connection, which holds the lock on `name`, within
/// a bound; creates `table` (`help` for a role that may not) and runs it
/// again once if it is missing. `work` answers `None` when the server does
/// not show the lock held there: the lock is then marked lost. No answer
/// within the bound leaves the statement's fate unknown: the session is
/// ended, which frees the lock.
pub(super) async fn on_lock_conn<T, F>(
    lc: &Arc<LockConn>,
    name: &LockName,
    table: &str,
    help: fn(&str) -> String,
    work: F,
) -> Result<T>
where
    F: for<'c> Fn(&'c mut mysql_async::Conn) -> ConnFuture<'c, Option<T>>,
{
    let lost = || Error::LockLost {
        name: name.to_string(),
    };
    let bound = ping_timeout(Duration::ZERO);
    // The session's watcher or a nested acquisition may be using it.
    let Ok(mut slot) = tokio::time::timeout(bound, lc.conn.lock()).await else {
        return Err(Error::Database(
            format!("the connection holding {name:?} stayed busy for {bound:?}").into(),
        ));
    };
    let Some(conn) = slot.as_mut() else {
        return Err(lost());
    };
    let mut created = false;
    loop {
        match tokio::time::timeout(bound, work(conn)).await {
            Ok(Ok(Some(v))) => return Ok(v),
            Ok(Ok(None)) => {
                drop(slot);
                lc.mark_lost();
                return Err(lost());
            }
            Ok(Err(e)) if server_code(&e) == Some(NO_SUCH_TABLE) && !created => {
                conn.query_drop(table).await.map_err(|e| create_err(e, help))?;
                created = true;
            }
            Ok(Err(e)) if server_code(&e).is_some_and(|c| DENIED.contains(&c)) => {
                return Err(Error::Config(help("write")))
            }
            Ok(Err(e)) if server_code(&e) == Some(NO_DATABASE) => {
                return Err(Error::Config(NO_DATABASE_HELP.into()))
            }
            Ok(Err(e)) => return Err(db_err(e, name)),
            Err(_) => {
                drop(slot.take());
                drop(slot);
                lc.mark_lost();
                lc.spawn_kill();
                return Err(Error::Database(
                    format!("a statement on the lock's connection got no answer within {bound:?}; the connection was closed")
                        .into(),
                ));
            }
        }
    }
}

fn server_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

/// The tables, created on a connection of the locker's own.
pub(super) async fn create_tables(connector: &Connector) -> Result<()> {
    for (table, help) in [
        (MYSQL_TABLE, no_table_help as fn(&str) -> String),
        (runs::MYSQL_TABLE, runs::no_table_help),
        (crate::delay::MYSQL_TABLE, crate::delay::no_table_help),
    ] {
        match connector.run(|c| c.query_drop(table)).await {
            Ok(()) => {}
            Err(RunError::Connect(e)) => return Err(e),
            Err(RunError::Query(e)) => return Err(create_err(e, help)),
        }
    }
    Ok(())
}

fn create_err(e: mysql_async::Error, help: fn(&str) -> String) -> Error {
    match e {
        mysql_async::Error::Server(s) if DENIED.contains(&s.code) => Error::Config(help("create")),
        mysql_async::Error::Server(s) if s.code == NO_DATABASE => Error::Config(NO_DATABASE_HELP.into()),
        e => Error::Database(Box::new(e)),
    }
}
