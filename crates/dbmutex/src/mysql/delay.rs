//! Lock-delay records on MySQL / MariaDB (see [`crate::delay`]): read and
//! written on the lock's own connection, the writes only while the server
//! shows the lock held there; times from the server's `UTC_TIMESTAMP(6)`.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::fence::on_lock_conn;
use super::lock_conn::LockConn;
use crate::delay::{no_table_help, Step, MYSQL_TABLE};
use crate::{LockName, Result};

/// How long the key `?` is still closed, in microseconds (NULL or
/// negative: open).
const LEFT: &str =
    "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), closed_until) FROM dbmutex_delay WHERE lock_key = ?";

/// Records the key (first `?`) closed for the second (and last) `?`
/// microseconds from now (NULL: open), only while this session holds the
/// lock (third `?`). Affected rows: 1 inserted, 2 updated, 0 not held (or,
/// opening, already open).
const WRITE: &str = "INSERT INTO dbmutex_delay (lock_key, closed_until) \
     SELECT ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND FROM DUAL WHERE IS_USED_LOCK(?) = CONNECTION_ID() \
     ON DUPLICATE KEY UPDATE closed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND";

/// One lock-delay step on `lc`, which holds `lock` for `name`.
pub(super) async fn step(
    lc: Arc<LockConn>,
    key: String,
    lock: String,
    name: LockName,
    step: Step,
) -> Result<Duration> {
    on_lock_conn(&lc, &name, MYSQL_TABLE, no_table_help, |conn| {
        let (key, lock) = (key.clone(), lock.clone());
        Box::pin(async move {
            let closed = match step {
                Step::Enter(d) => {
                    let left: Option<Option<i64>> = conn.exec_first(LEFT, (key.as_bytes(),)).await?;
                    if let Some(left) = left.flatten().filter(|us| *us > 0) {
                        return Ok(Some(Duration::from_micros(left.unsigned_abs())));
                    }
                    Some(d)
                }
                Step::Renew(d) => Some(d),
                Step::Open => None,
            };
            let micros = closed.map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
            conn.exec_drop(WRITE, (key.as_bytes(), micros, lock.as_str(), micros))
                .await?;
            // Affected rows 0: the server does not show the lock here (an
            // open record opened again changes nothing, and says 0 too).
            let held = conn.affected_rows() != 0 || step == Step::Open;
            Ok(held.then_some(Duration::ZERO))
        })
    })
    .await
}
