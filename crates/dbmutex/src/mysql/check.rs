//! The loss check: every [`interval`], one statement asks the server who
//! holds each lock this backend holds, for all of them at once.
//!
//! mysql_async reads a connection only while a command runs on it, so a
//! session the server ended (`KILL`, a reset) looks fine to its client until
//! the next ping — up to `keepalive` later. The server, though, frees a
//! killed session's user locks at once, and `IS_USED_LOCK(name)` then
//! answers NULL or another session's id. So one connection (taken from the
//! idle list, holding no lock) sends
//! `SELECT IS_USED_LOCK(?), IS_USED_LOCK(?), …` with every held lock string
//! (up to [`BATCH`] per statement, padded to a power of two so that few
//! prepared statements are cached), and any answer that is not the holding
//! session's `CONNECTION_ID()` reports that session's locks lost at once.
//!
//! Cost: nothing while no lock is held; else one statement per interval per
//! [`Locker`](crate::Locker) (per [`BATCH`] locks), about a round trip of
//! server time. A silent partition stalls the check as it stalls the lock
//! sessions; each statement is bounded like a ping, and the pings on the lock
//! sessions still notice the partition (see the module docs).
//!
//! When the check cannot reach the server (a restart, a crash), it asks
//! every lock session to ping now instead of at the end of its keepalive
//! period: a socket the server closed fails the ping at once.
//!
//! No false alarms from releases: an answer about a lock counts only if the
//! lock is still registered, with the same registration, after the answer
//! arrived — and a release unregisters the lock before it sends
//! `RELEASE_LOCK`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};
use tokio::sync::Notify;

use super::conn::answer_bound;
use super::lock_conn::LockConn;
use super::registry::Shared;

/// The longest time between two checks (shorter when `keepalive` is).
pub(super) const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// Failed checks in a row before the check backs off.
const FAST_FAILURES: u32 = 5;

/// The most lock strings one statement asks about.
const BATCH: usize = 512;

/// The check interval for a locker with this `keepalive`.
pub(super) fn interval(keepalive: Duration) -> Duration {
    CHECK_INTERVAL.min(keepalive)
}

/// One held lock as the check sees it.
struct Seen {
    lock: String,
    lc: Arc<LockConn>,
    generation: u64,
}

/// The check's task: parks while nothing is held, ends when the backend is
/// dropped.
///
/// While the server cannot be reached, every failed check pokes the lock
/// sessions (a ping each); after [`FAST_FAILURES`] failures in a row the
/// check backs off, doubling its pause up to `keepalive`, so a server that
/// refuses connections (down, or at `max_connections`) is not hammered
/// with connection attempts and pings.
pub(super) async fn run(shared: Weak<Shared>, wake: Arc<Notify>, every: Duration, keepalive: Duration) {
    let mut conn: Option<Conn> = None;
    let mut pause = every;
    let mut failures = 0u32;
    loop {
        let Some(idle) = shared.upgrade().map(|s| s.held_is_empty()) else {
            return;
        };
        if idle {
            // Give the connection back while there is nothing to check: it
            // holds no lock (it only ever ran IS_USED_LOCK).
            if let (Some(c), Some(s)) = (conn.take(), shared.upgrade()) {
                s.connector.checkin(c);
            }
            pause = every;
            failures = 0;
            wake.notified().await;
            continue;
        }
        tokio::time::sleep(pause).await;
        let Some(s) = shared.upgrade() else { return };
        let seen = snapshot(&s);
        if seen.is_empty() {
            continue;
        }
        // A lock held this long gets its session's watcher (pings after a
        // quiet keepalive period, for a silent partition).
        for x in &seen {
            x.lc.ensure_watcher();
        }
        // One retry at once on a fresh connection when the check's own
        // connection failed: it may have been killed.
        let mut checked = false;
        for _ in 0..2 {
            let had_conn = conn.is_some();
            match check_once(&s, &mut conn, &seen, keepalive).await {
                Ok(()) => {
                    checked = true;
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "dbmutex: MySQL loss check failed");
                    conn = None;
                    if !had_conn {
                        break;
                    }
                }
            }
        }
        if checked {
            pause = every;
            failures = 0;
            continue;
        }
        failures = failures.saturating_add(1);
        if failures > FAST_FAILURES {
            pause = pause.saturating_mul(2).min(keepalive.max(every));
        }
        // The server may be gone (restart, crash): then every lock session's
        // socket is closed, and a ping says so at once. A graceful shutdown
        // may close them a little after it stops taking connections, hence
        // a poke after every failed check.
        for x in &seen {
            x.lc.poke();
        }
    }
}

fn snapshot(s: &Shared) -> Vec<Seen> {
    let registry = s.registry.lock().unwrap_or_else(|e| e.into_inner());
    registry
        .iter()
        .filter(|(_, r)| !r.lc.is_lost())
        .map(|(lock, r)| Seen {
            lock: lock.clone(),
            lc: r.lc.clone(),
            generation: r.generation,
        })
        .collect()
}

/// `SELECT IS_USED_LOCK(?), …` with `width` columns.
fn statement(width: usize) -> String {
    let mut sql = String::from("SELECT ");
    for i in 0..width {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str("IS_USED_LOCK(?)");
    }
    sql
}

async fn check_once(
    s: &Arc<Shared>,
    conn: &mut Option<Conn>,
    seen: &[Seen],
    keepalive: Duration,
) -> Result<(), crate::Error> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(s.connector.checkout().await?.conn),
    };
    let bound = answer_bound(Duration::ZERO, keepalive);
    let mut gone = Vec::new();
    for batch in seen.chunks(BATCH) {
        let width = batch.len().next_power_of_two();
        let params: Vec<Value> = batch
            .iter()
            .map(|x| Value::from(x.lock.as_str()))
            .chain(std::iter::repeat(Value::NULL))
            .take(width)
            .collect();
        let row: Option<Row> = match tokio::time::timeout(bound, c.exec_first(statement(width), params)).await
        {
            Ok(Ok(row)) => row,
            Ok(Err(e)) => return Err(crate::Error::Connect(Box::new(e))),
            Err(_) => {
                return Err(crate::Error::Connect(
                    format!("the loss check got no answer within {bound:?}").into(),
                ))
            }
        };
        let Some(row) = row else {
            return Err(crate::Error::Database("the loss check returned no row".into()));
        };
        for (i, x) in batch.iter().enumerate() {
            let holder = match row.get_opt::<Option<u64>, usize>(i) {
                Some(Ok(holder)) => holder,
                _ => {
                    return Err(crate::Error::Database(
                        "the loss check got an unexpected answer".into(),
                    ))
                }
            };
            if holder != Some(x.lc.server_id()) {
                gone.push(x);
            }
        }
    }
    for x in gone {
        if s.still_registered(&x.lock, &x.lc, x.generation) {
            x.lc.mark_lost();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_and_intervals() {
        assert_eq!(statement(1), "SELECT IS_USED_LOCK(?)");
        assert_eq!(
            statement(3),
            "SELECT IS_USED_LOCK(?), IS_USED_LOCK(?), IS_USED_LOCK(?)"
        );
        assert_eq!(statement(BATCH).matches('?').count(), BATCH);
        assert_eq!(interval(Duration::from_secs(1)), CHECK_INTERVAL);
        assert_eq!(interval(Duration::from_millis(10)), Duration::from_millis(10));
    }
}
