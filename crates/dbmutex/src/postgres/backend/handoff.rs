//! Hand-off between tasks of one process, by parking the server lock.
//!
//! When a task releases an exclusive lock that another task of the same
//! locker is waiting for, the unlock is skipped: the server lock stays on
//! the shared session, "parked" for the next in-process holder, who takes
//! it without a round trip. A parked lock nobody takes within
//! [`REAP_AFTER`] (the waiter was cancelled or timed out) is unlocked then.
//! Session locks are counted, so a parked lock is exactly one count that is
//! either taken over or unlocked, never both. Not done for shared locks, nor
//! for longer than [`PARK_BUDGET`] in a row: then a real unlock lets the
//! server hand the lock to whoever queues for it in the server.
//!
//! Between processes the server's own lock queue hands over: a waiter
//! waits in the server (see `dedicated.rs`), and the server wakes exactly
//! the next one. There is no `LISTEN`/`NOTIFY`: on PostgreSQL a `NOTIFY`
//! wakes every listening backend of the database, so one per release cost
//! 1.4–9.2 ms of server CPU per acquisition at 50–200 lockers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::session_lock::SessionLock;
use crate::core::arbiter::{Hold, Slot, SlotExt};
use crate::key::PgKey;

/// PostgreSQL's hand-off state for one key, beside the in-process hold.
#[derive(Default)]
pub(crate) struct PgSlot {
    /// Server locks a releaser left on its session for the next in-process
    /// holder, one entry per lock: the session's id.
    pub(crate) parked: Mutex<Vec<u64>>,
    /// Since when (ms on the process clock, 0: not) in-process hand-offs
    /// have kept the server lock on the session without a break.
    pub(crate) parked_since_ms: AtomicU64,
    /// When (ms on the process clock, 0: not) this locker last got the key
    /// only by waiting, or found it held with a try-once (see
    /// [`contended_lately`]).
    contended_ms: AtomicU64,
}

impl SlotExt for PgSlot {
    /// A parked lock keeps the key's entry until it is taken or reaped.
    fn idle(&self) -> bool {
        self.parked.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}

/// An in-process hold on a PostgreSQL key.
pub(crate) type PgHold = Hold<PgKey, PgSlot>;

/// How long a parked lock waits for an in-process taker.
pub(crate) const REAP_AFTER: Duration = Duration::from_millis(2);

/// The longest run of in-process hand-offs before a real unlock (so a
/// process that keeps re-requesting a key lets another process's waiter in).
pub(crate) const PARK_BUDGET: Duration = Duration::from_millis(20);

/// How long a key that was last got by waiting counts as contended.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// Marks whether the key of `slot` was just got by waiting, or found held
/// by a try-once (`true`), or got by a try. The mark lives in the key's in-process slot, which stays in the
/// arbiter's table while idle (up to its `KEEP_IDLE` entries): a process
/// taking one lock at a time still finds it at its next acquisition. No
/// lock and no clock read for an uncontended try.
pub(crate) fn note_contended(slot: &Slot<PgSlot>, waited: bool) {
    let at = &slot.ext.contended_ms;
    if waited {
        at.store(clock_ms(), Ordering::Relaxed);
    } else if at.load(Ordering::Relaxed) != 0 {
        at.store(0, Ordering::Relaxed);
    }
}

/// Whether this locker last got the key of `slot` by waiting (or found it
/// held with a try-once), within [`CONTENDED_FOR`]: then a try would most likely fail, and a waiter that
/// can wait in the server on its own session goes there at once (the raw
/// floor's one `pg_advisory_lock`, not a try and then a wait).
pub(crate) fn contended_lately(slot: &Slot<PgSlot>) -> bool {
    let at = slot.ext.contended_ms.load(Ordering::Relaxed);
    at != 0 && clock_ms().saturating_sub(at) < CONTENDED_FOR.as_millis() as u64
}

use crate::core::clock::coarse_ms as clock_ms;

/// Parks the exclusive lock `hold` guards for an in-process waiter instead
/// of unlocking it — if one waits, and the key has not been handed over
/// in-process for longer than [`PARK_BUDGET`]. Returns the hold back when it
/// did not park.
pub(crate) fn park(lock: &SessionLock, hold: PgHold) -> Option<PgHold> {
    let slot = hold.slot();
    if slot.waiting.load(Ordering::SeqCst) == 0 {
        // Nobody of ours waits (the common case): no clock read.
        slot.ext.parked_since_ms.store(0, Ordering::Relaxed);
        return Some(hold);
    }
    let now = clock_ms();
    let since = slot.ext.parked_since_ms.load(Ordering::Relaxed);
    let over_budget = since != 0 && now.saturating_sub(since) > PARK_BUDGET.as_millis() as u64;
    if lock.conn.is_lost() || over_budget {
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
