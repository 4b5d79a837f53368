//! Hand-off without polling: between tasks of one process by parking the
//! server lock, between processes over `LISTEN`/`NOTIFY`.
//!
//! **In-process.** When a task releases an exclusive lock that another task
//! of the same locker is waiting for, the unlock is skipped: the server lock
//! stays on the shared session, "parked" for the next in-process holder,
//! who takes it without a round trip. A parked lock nobody takes within
//! [`REAP_AFTER`] (the waiter was cancelled or timed out) is unlocked then.
//! Session locks are counted, so a parked lock is exactly one count that is
//! either taken over or unlocked, never both. Not done when another process
//! has announced it waits (so processes take turns), nor for shared locks.
//!
//! **Between processes.**
//! Every lock session listens on one channel. A waiter whose try fails
//! announces `w <key>` ("I want it"); a process holding that key marks it
//! wanted, and when it releases, it sends `r <key>` after the unlock, which
//! wakes the waiter's poll loop at once. Nothing is notified for keys nobody
//! waits for, so uncontended locks pay nothing (a NOTIFY on every unlock
//! would cost about as much as the unlock itself). Holders that do not speak
//! this protocol (the gem, psql) are still noticed by the waiter's backoff
//! polling.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::Type;

use super::{unlock_on, NotifyHandler, PgConn};
use crate::arbiter::{Arbiter, Hold};
use crate::key::PgKey;
use crate::{LockName, Mode};

/// The channel every lock session listens on.
pub(crate) const CHANNEL: &str = "dbmutex_handoff";

/// How often a waiter repeats its announcement (a holder that took the key
/// after the last one has not heard it).
const REANNOUNCE: Duration = Duration::from_millis(250);

fn payload(kind: char, key: &PgKey) -> String {
    format!("{kind} {key}")
}

fn parse(payload: &str) -> Option<(char, PgKey)> {
    let mut parts = payload.split(' ');
    let kind = parts.next()?.chars().next()?;
    let a: i64 = parts.next()?.parse().ok()?;
    let key = match parts.next() {
        Some(b) => PgKey::Pair(i32::try_from(a).ok()?, b.parse().ok()?),
        None => PgKey::Big(a),
    };
    parts.next().is_none().then_some((kind, key))
}

/// The lock session's handler for the channel.
pub(crate) fn handler(arbiter: Arc<Arbiter<PgKey>>) -> NotifyHandler {
    Arc::new(move |channel: &str, msg: &str| {
        if channel != CHANNEL {
            return;
        }
        let Some((kind, key)) = parse(msg) else { return };
        // Only keys this process uses now have a slot; others are ignored.
        if let Some(slot) = arbiter.existing_slot(&key) {
            match kind {
                'w' => slot.wanted.store(true, Ordering::Relaxed),
                'r' => slot.remote.notify_waiters(),
                _ => {}
            }
        }
    })
}

fn send(conn: &Arc<PgConn>, text: String) {
    let c = conn.clone();
    // Fire and forget: a lost notification only means a later poll.
    drop(conn.runtime.spawn(async move {
        let _ = c
            .client
            .query_typed(
                "SELECT pg_notify($1, $2)",
                &[(&CHANNEL, Type::TEXT), (&text, Type::TEXT)],
            )
            .await;
    }));
}

/// A waiter's announcements for one wait.
pub(crate) struct Want<'a> {
    conn: &'a Arc<PgConn>,
    key: PgKey,
    last: Mutex<Option<Instant>>,
}

impl<'a> Want<'a> {
    pub(crate) fn new(conn: &'a Arc<PgConn>, key: PgKey) -> Self {
        Want {
            conn,
            key,
            last: Mutex::new(None),
        }
    }

    /// Announces the wait, at most every [`REANNOUNCE`].
    pub(crate) fn announce(&self) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < REANNOUNCE) {
            return;
        }
        *last = Some(Instant::now());
        send(self.conn, payload('w', &self.key));
    }
}

/// Whether another process announced it waits for the held key.
pub(crate) fn wanted(hold: Option<&Hold<PgKey>>) -> bool {
    hold.is_some_and(|h| h.slot().wanted.load(Ordering::Relaxed))
}

/// After an unlock that someone wanted: tell waiting processes. The
/// notification follows the unlock on the same connection, so the server has
/// processed the unlock before anyone hears of it.
pub(crate) fn notify_release(conn: &Arc<PgConn>, key: PgKey) {
    send(conn, payload('r', &key));
}

/// How long a parked lock waits for an in-process taker.
pub(crate) const REAP_AFTER: Duration = Duration::from_millis(2);

/// Parks the exclusive lock `hold` guards on `conn` for an in-process
/// waiter instead of unlocking it, if one waits and no other process does.
/// Returns the hold back when it did not park.
pub(crate) fn park(
    conn: &Arc<PgConn>,
    key: PgKey,
    name: &LockName,
    comment: bool,
    hold: Hold<PgKey>,
) -> Option<Hold<PgKey>> {
    let slot = hold.slot().clone();
    if slot.waiting.load(Ordering::SeqCst) == 0 || slot.wanted.load(Ordering::Relaxed) || conn.is_lost() {
        return Some(hold);
    }
    slot.parked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(conn.id);
    // Wakes the waiters; the first to take the hold takes the parked lock.
    drop(hold);
    let (c, name) = (conn.clone(), name.clone());
    drop(conn.runtime.spawn(async move {
        tokio::time::sleep(REAP_AFTER).await;
        if take_parked(&slot, c.id) {
            let _ = unlock_on(&c, key, Mode::Exclusive, &name, comment).await;
        }
    }));
    None
}

/// Takes a lock parked on session `conn_id`, if there is one.
pub(crate) fn take_parked(slot: &crate::arbiter::Slot, conn_id: u64) -> bool {
    let mut parked = slot.parked.lock().unwrap_or_else(|e| e.into_inner());
    match parked.iter().position(|&id| id == conn_id) {
        Some(i) => {
            parked.swap_remove(i);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        for key in [
            PgKey::Pair(1, -2),
            PgKey::Pair(i32::MIN, i32::MAX),
            PgKey::Big(i64::MIN),
            PgKey::Big(7),
        ] {
            assert_eq!(parse(&payload('w', &key)), Some(('w', key)));
        }
        for junk in ["", "w", "w x", "w 1 2 3", "w 99999999999 1"] {
            assert_eq!(parse(junk), None, "{junk:?}");
        }
    }
}
