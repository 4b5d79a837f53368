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
//! has announced it waits, nor for shared locks, nor for longer than
//! [`PARK_BUDGET`] in a row: then a real unlock lets the server hand the lock
//! to whoever queues for it (a server-side wait, the gem's next poll).
//!
//! **Between processes.**
//! Every lock session listens on one channel. A waiter whose try fails
//! announces `w <sender> <key>` ("I want it"); a locker holding that key
//! marks it wanted, and when it releases, it sends `r <sender> <key>` after
//! the unlock has been answered, which wakes the waiter's poll loop at once.
//! A locker ignores its own messages. They go out on the locker's side
//! connection (opened by the first one), never on the lock session: a
//! `NOTIFY` commits and can wait on the disk, which must not hold up the
//! lock session's statements (nor its heartbeat). A waiter that goes on to
//! wait in the server has announced itself by then, so a holder does not
//! park the lock for its own tasks. Nothing is notified for keys nobody
//! waits for (a NOTIFY on every unlock
//! would cost about as much as the unlock itself). Holders that do not speak
//! this protocol (the gem, psql) are still noticed by the waiter's backoff
//! polling.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_postgres::types::Type;

use super::conn::NotifyHandler;
use super::lazy::Side;
use super::session_lock::SessionLock;
use super::sql::CHANNEL;
use crate::core::arbiter::{Arbiter, Hold, Slot, SlotExt};
use crate::key::PgKey;

/// PostgreSQL's hand-off state for one key, beside the in-process hold.
#[derive(Default)]
pub(crate) struct PgSlot {
    /// Woken when another process may have released (`NOTIFY`).
    pub(crate) remote: Notify,
    /// Another process has said it waits for this key: tell it on release.
    pub(crate) wanted: AtomicBool,
    /// Server locks a releaser left on its session for the next in-process
    /// holder, one entry per lock: the session's id.
    pub(crate) parked: Mutex<Vec<u64>>,
    /// Since when (ms on the process clock, 0: not) in-process hand-offs
    /// have kept the server lock on the session without a break.
    pub(crate) parked_since_ms: AtomicU64,
}

impl SlotExt for PgSlot {
    /// A parked lock keeps the key's entry until it is taken or reaped.
    fn idle(&self) -> bool {
        self.parked.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}

/// The arbiter of a PostgreSQL locker.
pub(crate) type PgArbiter = Arbiter<PgKey, PgSlot>;
/// An in-process hold on a PostgreSQL key.
pub(crate) type PgHold = Hold<PgKey, PgSlot>;

/// How often a waiter repeats its announcement (a holder that took the key
/// after the last one has not heard it).
const REANNOUNCE: Duration = Duration::from_millis(250);

/// How long a parked lock waits for an in-process taker.
pub(crate) const REAP_AFTER: Duration = Duration::from_millis(2);

/// The longest run of in-process hand-offs before a real unlock.
pub(crate) const PARK_BUDGET: Duration = Duration::from_millis(20);

fn payload(kind: char, sender: u64, key: &PgKey) -> String {
    format!("{kind} {sender} {key}")
}

fn parse(payload: &str) -> Option<(char, u64, PgKey)> {
    let mut parts = payload.splitn(3, ' ');
    let kind = parts.next()?.chars().next()?;
    let sender: u64 = parts.next()?.parse().ok()?;
    Some((kind, sender, PgKey::from_text(parts.next()?)?))
}

/// The lock session's handler for the channel; `me` is the locker's id.
pub(crate) fn handler(arbiter: Arc<PgArbiter>, me: u64) -> NotifyHandler {
    Arc::new(move |channel: &str, msg: &str| {
        if channel != CHANNEL {
            return;
        }
        let Some((kind, sender, key)) = parse(msg) else {
            return;
        };
        if sender == me {
            return;
        }
        // Only keys this locker uses now have a slot; others are ignored.
        if let Some(slot) = arbiter.existing_slot(&key) {
            match kind {
                'w' => slot.slot().ext.wanted.store(true, Ordering::Relaxed),
                'r' => slot.slot().ext.remote.notify_waiters(),
                _ => {}
            }
        }
    })
}

/// Where a locker's hand-off messages go out, and who sends them.
#[derive(Clone)]
pub(crate) struct Channel {
    pub(crate) sender: u64,
    /// Where messages go out (connected on the first one).
    pub(crate) side: Arc<Side>,
    pub(crate) runtime: tokio::runtime::Handle,
}

impl Channel {
    fn send(&self, kind: char, key: &PgKey) {
        let side = self.side.clone();
        let text = payload(kind, self.sender, key);
        // Fire and forget: a lost notification only means a later poll.
        drop(self.runtime.spawn(async move {
            let Ok(c) = side.get().await else { return };
            let _ = c
                .client
                .query_typed(
                    "SELECT pg_notify($1, $2)",
                    &[(&CHANNEL, Type::TEXT), (&text, Type::TEXT)],
                )
                .await;
        }));
    }

    /// After an unlock that was answered: wake the waiters that announced
    /// themselves, if `wanted` (see [`take_wanted`]).
    pub(crate) fn released(&self, key: &PgKey, wanted: bool) {
        if wanted {
            self.send('r', key);
        }
    }
}

/// Whether another locker announced it waits for the held key; clears the
/// mark (a waiter that still waits announces again).
pub(crate) fn take_wanted(hold: Option<&PgHold>) -> bool {
    hold.is_some_and(|h| h.slot().ext.wanted.swap(false, Ordering::Relaxed))
}

/// A waiter's announcements for one wait.
pub(crate) struct Want {
    channel: Channel,
    key: PgKey,
    last: Mutex<Option<Instant>>,
}

impl Want {
    pub(crate) fn new(channel: Channel, key: PgKey) -> Self {
        Want {
            channel,
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
        self.channel.send('w', &self.key);
    }
}

/// Milliseconds on a process-wide monotonic clock, never 0.
fn clock_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64 + 1
}

/// Parks the exclusive lock `hold` guards for an in-process waiter instead
/// of unlocking it — if one waits, no other locker announced it waits, and
/// the key has not been handed over in-process for longer than
/// [`PARK_BUDGET`]. Returns the hold back when it did not park.
pub(crate) fn park(lock: &SessionLock, hold: PgHold) -> Option<PgHold> {
    let slot = hold.slot();
    let now = clock_ms();
    let since = slot.ext.parked_since_ms.load(Ordering::Relaxed);
    let over_budget = since != 0 && now.saturating_sub(since) > PARK_BUDGET.as_millis() as u64;
    if slot.waiting.load(Ordering::SeqCst) == 0
        || slot.ext.wanted.load(Ordering::Relaxed)
        || lock.conn.is_lost()
        || over_budget
    {
        slot.ext.parked_since_ms.store(0, Ordering::Relaxed);
        return Some(hold);
    }
    if since == 0 {
        slot.ext.parked_since_ms.store(now, Ordering::Relaxed);
    }
    slot.ext
        .parked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(lock.conn.id);
    // The reaper's reference keeps the slot (and its parked lock) in the
    // table until it has looked, and cleans the entry up after.
    let slot_ref = hold.slot_ref();
    // Wakes the waiters; the first to take the hold takes the parked lock.
    drop(hold);
    let lock = lock.clone();
    drop(lock.conn.runtime.clone().spawn(async move {
        tokio::time::sleep(REAP_AFTER).await;
        if take_parked(slot_ref.slot(), lock.conn.id) {
            let _ = lock.unlock().await;
        }
        drop(slot_ref);
    }));
    None
}

/// Takes a lock parked on session `conn_id`, if there is one.
pub(crate) fn take_parked(slot: &Slot<PgSlot>, conn_id: u64) -> bool {
    let mut parked = slot.ext.parked.lock().unwrap_or_else(|e| e.into_inner());
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
            assert_eq!(parse(&payload('w', 42, &key)), Some(('w', 42, key)));
        }
        for junk in ["", "w", "w 1", "w x 1", "w 1 x", "w 1 2 3 4", "w 1 99999999999 1"] {
            assert_eq!(parse(junk), None, "{junk:?}");
        }
    }
}
