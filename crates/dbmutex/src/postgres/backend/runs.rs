//! Once-per-window runs on PostgreSQL (see [`crate::runs`]): read and
//! recorded on the lock's own server session, the writes guarded by its
//! claim like every lock statement; times from the server's
//! `clock_timestamp()`.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::conn::PgConn;
use super::fence::{claimed, create_table, failed, lost, Failed};
use super::session_lock::SessionLock;
use crate::core::guard::BoxFuture;
use crate::runs::{self, no_table_help, LastRun, Run, RunStart, Who, POSTGRES_TABLE};
use crate::{Error, LockName, Result};

/// The last run of `$1`, its times as microseconds since the epoch and its
/// age by the server's clock.
const LAST: &str = "SELECT run, (extract(epoch FROM started_at) * 1000000)::int8, \
     (extract(epoch FROM clock_timestamp() - started_at) * 1000000)::int8, host, pid, \
     (extract(epoch FROM finished_at) * 1000000)::int8, exit_code \
     FROM dbmutex_runs WHERE lock_key = $1";

/// Records a start of `$1` (named `$3`, by host `$4`, pid `$5`), only on
/// the session this connection claimed (`$2`), where the lock is held; no
/// row: a pooler moved us. The row wait is bounded as the fencing
/// statement's is (see `fence::ISSUE`).
const START: &str = "INSERT INTO dbmutex_runs AS r (lock_key, lock_name, run, started_at, host, pid) \
     SELECT $1, $3, 1, clock_timestamp(), $4, $5 WHERE current_setting('dbmutex.owner', true) = $2 \
     AND set_config('lock_timeout', '250ms', true) IS NOT NULL \
     ON CONFLICT (lock_key) DO UPDATE SET run = r.run + 1, lock_name = EXCLUDED.lock_name, \
     started_at = EXCLUDED.started_at, host = EXCLUDED.host, pid = EXCLUDED.pid, \
     finished_at = NULL, exit_code = NULL RETURNING r.run";

/// Records the end of run `$2` of `$1` with exit status `$3`, on the
/// claimed session (`$4`) only.
const FINISH: &str = "UPDATE dbmutex_runs SET finished_at = clock_timestamp(), exit_code = $3 \
     WHERE lock_key = $1 AND run = $2 AND current_setting('dbmutex.owner', true) = $4 \
     AND set_config('lock_timeout', '250ms', true) IS NOT NULL RETURNING run";

/// A grant's [`start_run`](crate::core::guard::Grant::start_run): `lock` is
/// the grant's session lock while it holds it (`None` for a transaction
/// lock).
pub(crate) fn start_for_grant(
    lock: Option<SessionLock>,
    window: Duration,
    who: Who,
) -> BoxFuture<Result<RunStart>> {
    Box::pin(async move {
        let lock = lock.ok_or_else(|| {
            Error::Unsupported(
                "once-per-window runs need a held session lock (not transaction(true): its record \
                 would roll back with its transaction)"
                    .into(),
            )
        })?;
        start(&lock.conn, &lock.key.to_string(), &lock.name, window, &who).await
    })
}

/// A grant's [`finish_run`](crate::core::guard::Grant::finish_run).
pub(crate) fn finish_for_grant(
    lock: Option<SessionLock>,
    run: u64,
    exit_code: Option<i32>,
) -> BoxFuture<Result<()>> {
    Box::pin(async move {
        let lock = lock.ok_or_else(|| Error::Database("a run under a released lock".into()))?;
        finish(&lock.conn, &lock.key.to_string(), &lock.name, run, exit_code).await
    })
}

async fn start(
    conn: &Arc<PgConn>,
    key: &str,
    name: &LockName,
    window: Duration,
    who: &Who,
) -> Result<RunStart> {
    let owner = claimed(conn, name)?;
    let mut created = false;
    loop {
        match read(conn, key, name).await {
            Ok(Some(last)) if !runs::due(last.1, window) => return Ok(RunStart::NotDue(last.0)),
            Ok(_) => {}
            Err(Failed::NoTable(_)) => {}
            Err(Failed::Other(e)) => return Err(e),
        }
        let shown = runs::stored_name(name);
        let pid = i64::from(who.pid);
        let params: [(&(dyn ToSql + Sync), Type); 5] = [
            (&key, Type::TEXT),
            (&owner, Type::TEXT),
            (&shown, Type::TEXT),
            (&who.host, Type::TEXT),
            (&pid, Type::INT8),
        ];
        match conn.client.query_typed(START, &params).await {
            Ok(rows) => {
                let Some(row) = rows.first() else {
                    conn.moved();
                    return Err(lost(name));
                };
                let run: i64 = row.try_get(0).map_err(|e| Error::Database(Box::new(e)))?;
                return Ok(RunStart::Due(Run {
                    run: u64::try_from(run).unwrap_or(0),
                }));
            }
            Err(e) => match failed(e, conn, name, no_table_help) {
                Failed::NoTable(_) if !created => {
                    create_table(conn, POSTGRES_TABLE, no_table_help).await?;
                    created = true;
                }
                Failed::NoTable(e) | Failed::Other(e) => return Err(e),
            },
        }
    }
}

async fn finish(
    conn: &Arc<PgConn>,
    key: &str,
    name: &LockName,
    run: u64,
    exit_code: Option<i32>,
) -> Result<()> {
    let owner = claimed(conn, name)?;
    let run = i64::try_from(run).unwrap_or(i64::MAX);
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&key, Type::TEXT),
        (&run, Type::INT8),
        (&exit_code, Type::INT4),
        (&owner, Type::TEXT),
    ];
    match conn.client.query_typed(FINISH, &params).await {
        // The row is this run's while the lock is held: none, and the
        // statement ran on another session (or the lock went, and a later
        // run began).
        Ok(rows) if rows.is_empty() => {
            conn.moved();
            Err(lost(name))
        }
        Ok(_) => Ok(()),
        Err(e) => match failed(e, conn, name, no_table_help) {
            Failed::NoTable(e) | Failed::Other(e) => Err(e),
        },
    }
}

/// The last run of `key` and its age in microseconds (server clock), read
/// on `conn`; `Ok(None)` if it never ran.
async fn read(
    conn: &PgConn,
    key: &str,
    name: &LockName,
) -> std::result::Result<Option<(LastRun, i64)>, Failed> {
    match conn.client.query_typed(LAST, &[(&key, Type::TEXT)]).await {
        Ok(rows) => rows.first().map(last_run).transpose().map_err(Failed::Other),
        Err(e) => Err(failed(e, conn, name, no_table_help)),
    }
}

fn last_run(row: &Row) -> Result<(LastRun, i64)> {
    let get = |e: tokio_postgres::Error| Error::Database(Box::new(e));
    let run: i64 = row.try_get(0).map_err(get)?;
    let started: i64 = row.try_get(1).map_err(get)?;
    let ago: i64 = row.try_get(2).map_err(get)?;
    let finished: Option<i64> = row.try_get(5).map_err(get)?;
    let pid: i64 = row.try_get(4).map_err(get)?;
    Ok((
        LastRun {
            run: u64::try_from(run).unwrap_or(0),
            started_at: runs::from_micros(started),
            ago: runs::ago(ago),
            host: row.try_get(3).map_err(get)?,
            pid: u32::try_from(pid).unwrap_or(0),
            finished_at: finished.map(runs::from_micros),
            exit_code: row.try_get(6).map_err(get)?,
        },
        ago,
    ))
}

/// [`Backend::last_run`](crate::core::backend::Backend::last_run): on any
/// connection, with no lock; no table yet is no run.
pub(super) async fn last(conn: &PgConn, key: &str, name: &LockName) -> Result<Option<LastRun>> {
    // Asked first (as the read would resolve it, by the search path), so
    // that a status on a server that never ran anything logs no error.
    let exists = conn
        .client
        .query_typed("SELECT to_regclass('dbmutex_runs') IS NOT NULL", &[])
        .await
        .map_err(|e| Error::Database(Box::new(e)))?;
    if !exists.first().is_some_and(|r| r.get::<_, bool>(0)) {
        return Ok(None);
    }
    match read(conn, key, name).await {
        Ok(r) => Ok(r.map(|(last, _)| last)),
        Err(Failed::NoTable(_)) => Ok(None),
        Err(Failed::Other(e)) => Err(e),
    }
}
