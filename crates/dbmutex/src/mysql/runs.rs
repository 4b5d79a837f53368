//! Once-per-window runs on MySQL / MariaDB (see [`crate::runs`]): read and
//! recorded on the lock's own connection, the writes only while the server
//! shows the lock held there; times from the server's `UTC_TIMESTAMP(6)`.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Row;

use super::conn::{Connector, RunError};
use super::errors::db_err;
use super::fence::on_lock_conn;
use super::lock_conn::LockConn;
use crate::runs::{self, no_table_help, LastRun, Run, RunStart, Who, MYSQL_TABLE};
use crate::{LockName, Result};

/// The last run of the key `?`: times as microseconds since the epoch
/// (stored in UTC), and its age by the server's clock.
const LAST: &str = "SELECT run, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', started_at), \
     TIMESTAMPDIFF(MICROSECOND, started_at, UTC_TIMESTAMP(6)), host, pid, \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', finished_at), exit_code \
     FROM dbmutex_runs WHERE lock_key = ?";

/// Records a start (key, name, host, pid), only while this session holds
/// the lock (the fifth `?`); an existing row gets the same values (the
/// last three `?`: `VALUES()` is deprecated on MySQL 8, and
/// `UTC_TIMESTAMP` is the statement's start, the same in both places).
/// `LAST_INSERT_ID(expr)` puts the run's number in the OK packet. Affected
/// rows: 1 inserted, 2 updated, 0 not held.
const START: &str = "INSERT INTO dbmutex_runs (lock_key, lock_name, run, started_at, host, pid) \
     SELECT ?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6), ?, ? FROM DUAL \
     WHERE IS_USED_LOCK(?) = CONNECTION_ID() \
     ON DUPLICATE KEY UPDATE run = LAST_INSERT_ID(dbmutex_runs.run + 1), \
     lock_name = ?, started_at = UTC_TIMESTAMP(6), host = ?, pid = ?, \
     finished_at = NULL, exit_code = NULL";

/// Records the end (exit status, key, run), only while this session holds
/// the lock (the last `?`).
const FINISH: &str = "UPDATE dbmutex_runs SET finished_at = UTC_TIMESTAMP(6), exit_code = ? \
     WHERE lock_key = ? AND run = ? AND IS_USED_LOCK(?) = CONNECTION_ID()";

/// [`Grant::start_run`](crate::core::guard::Grant::start_run) on `lc`,
/// which holds `lock` for `name`.
pub(super) async fn start(
    lc: Arc<LockConn>,
    lock: String,
    name: LockName,
    window: Duration,
    who: Who,
) -> Result<RunStart> {
    let shown = runs::stored_name(&name);
    on_lock_conn(&lc, &name, MYSQL_TABLE, no_table_help, |conn| {
        let (lock, shown, who) = (lock.clone(), shown.clone(), who.clone());
        Box::pin(async move {
            let row: Option<Row> = conn.exec_first(LAST, (lock.as_bytes(),)).await?;
            if let Some((last, ago)) = row.map(last_run).transpose()? {
                if !runs::due(ago, window) {
                    return Ok(Some(RunStart::NotDue(last)));
                }
            }
            let (host, pid) = (who.host.as_str(), who.pid);
            let params: Vec<mysql_async::Value> = vec![
                lock.as_bytes().into(),
                shown.as_bytes().into(),
                host.into(),
                pid.into(),
                lock.as_str().into(),
                // ON DUPLICATE KEY UPDATE's
                shown.as_bytes().into(),
                host.into(),
                pid.into(),
            ];
            conn.exec_drop(START, params).await?;
            if conn.affected_rows() == 0 {
                return Ok(None);
            }
            let run = conn.last_insert_id().unwrap_or(0);
            Ok(Some(RunStart::Due(Run { run })))
        })
    })
    .await
}

/// [`Grant::finish_run`](crate::core::guard::Grant::finish_run) on `lc`.
pub(super) async fn finish(
    lc: Arc<LockConn>,
    lock: String,
    name: LockName,
    run: u64,
    exit_code: Option<i32>,
) -> Result<()> {
    on_lock_conn(&lc, &name, MYSQL_TABLE, no_table_help, |conn| {
        let lock = lock.clone();
        Box::pin(async move {
            conn.exec_drop(FINISH, (exit_code, lock.as_bytes(), run, lock.as_str()))
                .await?;
            // None updated: the lock is not held here (or a later run began).
            Ok((conn.affected_rows() != 0).then_some(()))
        })
    })
    .await
}

/// [`Backend::last_run`](crate::core::backend::Backend::last_run) on a
/// connection of the locker's own; no table yet is no run.
pub(super) async fn last(connector: &Connector, lock: &str, name: &LockName) -> Result<Option<LastRun>> {
    let answer = connector
        .run(|c| {
            let lock = lock.to_owned();
            Box::pin(async move { c.exec_first::<Row, _, _>(LAST, (lock.as_bytes(),)).await })
        })
        .await;
    match answer {
        Ok(row) => Ok(row
            .map(last_run)
            .transpose()
            .map_err(|e| db_err(e, name))?
            .map(|(l, _)| l)),
        Err(RunError::Connect(e)) => Err(e),
        Err(RunError::Query(mysql_async::Error::Server(s))) if s.code == super::fence::NO_SUCH_TABLE => {
            Ok(None)
        }
        Err(RunError::Query(e)) => Err(db_err(e, name)),
    }
}

type Columns = (u64, i64, i64, String, i64, Option<i64>, Option<i32>);

/// A row of [`LAST`] and the run's age in microseconds.
fn last_run(row: Row) -> mysql_async::Result<(LastRun, i64)> {
    let (run, started, ago, host, pid, finished, exit_code): Columns =
        mysql_async::from_row_opt(row).map_err(|e| mysql_async::Error::Other(Box::new(e)))?;
    Ok((
        LastRun {
            run,
            started_at: runs::from_micros(started),
            ago: runs::ago(ago),
            host,
            pid: u32::try_from(pid).unwrap_or(0),
            finished_at: finished.map(runs::from_micros),
            exit_code,
        },
        ago,
    ))
}
