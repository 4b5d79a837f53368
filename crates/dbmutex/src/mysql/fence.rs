//! Fencing tokens on MySQL / MariaDB (see [`crate::fence`]): issued on the
//! lock's own connection, while the server shows the lock held there.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::conn::{Connector, RunError};
use super::errors::db_err;
use super::lock_conn::{ping_timeout, LockConn};
use crate::fence::{no_table_help, MYSQL_TABLE};
use crate::{Error, LockName, Result};

/// One autocommit statement: the next token of the key (first `?`), only
/// while this session holds the lock (second `?`). `LAST_INSERT_ID(expr)`
/// puts the new token into the statement's OK packet: no second round
/// trip. Affected rows: 1 inserted, 2 updated, 0 not held.
const ISSUE: &str = "INSERT INTO dbmutex_fence (lock_key, token) \
     SELECT ?, LAST_INSERT_ID(1) FROM DUAL WHERE IS_USED_LOCK(?) = CONNECTION_ID() \
     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(dbmutex_fence.token + 1)";

/// `ER_NO_SUCH_TABLE`.
const NO_SUCH_TABLE: u16 = 1146;
/// `ER_TABLEACCESS_DENIED_ERROR` (a command on a table, `CREATE`
/// included), `ER_DBACCESS_DENIED_ERROR`.
const DENIED: [u16; 2] = [1142, 1044];
/// `ER_NO_DB_ERROR`.
const NO_DATABASE: u16 = 1046;
const NO_DATABASE_HELP: &str =
    "fencing tokens need a database in the MySQL URL (mysql://user@host/db): the table dbmutex_fence lives there";

/// The next fencing token of `key`, issued on `lc`, which holds `lock`
/// (the lock string) for `name`; the table is created on first use.
pub(super) async fn issue(lc: Arc<LockConn>, key: String, lock: String, name: LockName) -> Result<u64> {
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
        let answer =
            tokio::time::timeout(bound, conn.exec_drop(ISSUE, (key.as_bytes(), lock.as_str()))).await;
        let server_code = |e: &mysql_async::Error| match e {
            mysql_async::Error::Server(s) => Some(s.code),
            _ => None,
        };
        match answer {
            Ok(Ok(())) if conn.affected_rows() == 0 => {
                // The server does not show the lock on this session.
                drop(slot);
                lc.mark_lost();
                return Err(lost());
            }
            Ok(Ok(())) => {
                return conn
                    .last_insert_id()
                    .ok_or_else(|| Error::Database("the fencing statement returned no token".into()))
            }
            Ok(Err(e)) if server_code(&e) == Some(NO_SUCH_TABLE) && !created => {
                create(conn).await?;
                created = true;
            }
            Ok(Err(e)) if server_code(&e).is_some_and(|c| DENIED.contains(&c)) => {
                return Err(Error::Config(no_table_help("write")))
            }
            Ok(Err(e)) if server_code(&e) == Some(NO_DATABASE) => {
                return Err(Error::Config(NO_DATABASE_HELP.into()))
            }
            Ok(Err(e)) => return Err(db_err(e, &name)),
            Err(_) => {
                // The statement's fate is unknown: end the session, which
                // frees the lock (the acquisition then fails).
                drop(slot.take());
                drop(slot);
                lc.mark_lost();
                lc.spawn_kill();
                return Err(Error::Database(
                    format!(
                        "the fencing statement got no answer within {bound:?}; the connection was closed"
                    )
                    .into(),
                ));
            }
        }
    }
}

async fn create(conn: &mut mysql_async::Conn) -> Result<()> {
    conn.query_drop(MYSQL_TABLE).await.map_err(create_err)
}

/// The table, created on a connection of the locker's own.
pub(super) async fn create_table(connector: &Connector) -> Result<()> {
    match connector.run(|c| c.query_drop(MYSQL_TABLE)).await {
        Ok(()) => Ok(()),
        Err(RunError::Connect(e)) => Err(e),
        Err(RunError::Query(e)) => Err(create_err(e)),
    }
}

fn create_err(e: mysql_async::Error) -> Error {
    match e {
        mysql_async::Error::Server(s) if DENIED.contains(&s.code) => Error::Config(no_table_help("create")),
        mysql_async::Error::Server(s) if s.code == NO_DATABASE => Error::Config(NO_DATABASE_HELP.into()),
        e => Error::Database(Box::new(e)),
    }
}
