//! Lock-delay records on PostgreSQL (see [`crate::delay`]): read and
//! written on the lock's own server session, the writes guarded by its
//! claim like every lock statement; times from the server's
//! `clock_timestamp()`.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};

use super::fence::{claimed, create_table, failed, lost, Failed};
use super::session_lock::SessionLock;
use crate::core::guard::DelayRecord;
use crate::delay::{no_table_help, Step, POSTGRES_TABLE};
use crate::{Error, Result};

/// How long `$1` is still closed, in microseconds (none or past: zero).
const LEFT: &str =
    "SELECT GREATEST(ceil(extract(epoch FROM closed_until - clock_timestamp()) * 1000000), 0)::int8 \
     FROM public.dbmutex_delay WHERE lock_key = $1";

/// Records `$1` closed for `$3` microseconds from now (NULL: open), only on
/// the session this connection claimed (`$2`), where the lock is held; no
/// row: a pooler moved us. The row wait is bounded as the fencing
/// statement's is (see `fence::ISSUE`).
const WRITE: &str = "INSERT INTO public.dbmutex_delay AS d (lock_key, closed_until) \
     SELECT $1, clock_timestamp() + $3 * interval '1 microsecond' \
     WHERE current_setting('dbmutex.owner', true) = $2 \
     AND set_config('lock_timeout', '250ms', true) IS NOT NULL \
     ON CONFLICT (lock_key) DO UPDATE SET closed_until = EXCLUDED.closed_until RETURNING 1";

/// A grant's [`delay`](crate::core::guard::OnSession::delay) record: `lock`
/// is the grant's session lock while it holds it.
pub(crate) fn record(lock: Option<SessionLock>, key: String) -> DelayRecord {
    let (lock, key) = (Arc::new(lock), Arc::new(key));
    Arc::new(move |step| {
        let (lock, key) = (lock.clone(), key.clone());
        Box::pin(async move {
            let lock = lock
                .as_ref()
                .as_ref()
                .ok_or_else(|| Error::Database("a lock-delay record for a released lock".into()))?;
            run(lock, &key, step).await
        })
    })
}

async fn run(lock: &SessionLock, key: &str, step: Step) -> Result<Duration> {
    let (conn, name) = (&lock.conn, &lock.name);
    let owner = claimed(conn, name)?;
    let closed = match step {
        Step::Enter(d) => {
            match conn.client.query_typed(LEFT, &[(&key, Type::TEXT)]).await {
                Ok(rows) => {
                    let left: i64 = match rows.first() {
                        Some(row) => row.try_get(0).map_err(|e| Error::Database(Box::new(e)))?,
                        None => 0,
                    };
                    if left > 0 {
                        return Ok(Duration::from_micros(left.unsigned_abs()));
                    }
                }
                // No table yet: open; the write creates it.
                Err(e) => match failed(e, conn, name, no_table_help) {
                    Failed::NoTable(_) => {}
                    Failed::Other(e) => return Err(e),
                },
            }
            Some(d)
        }
        Step::Renew(d) => Some(d),
        Step::Open => None,
    };
    let micros = closed.map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [(&key, Type::TEXT), (&owner, Type::TEXT), (&micros, Type::INT8)];
    let mut created = false;
    loop {
        match conn.client.query_typed(WRITE, &params).await {
            Ok(rows) if rows.is_empty() => {
                conn.moved();
                return Err(lost(name));
            }
            Ok(_) => return Ok(Duration::ZERO),
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
