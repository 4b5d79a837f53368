//! In-process arbitration: a reader-writer lock per key, shared by the tasks
//! of one process that use one server session (or one lock directory).
//!
//! The server cannot tell two tasks on one session apart (its locks are
//! re-entrant per session), so exclusion between those tasks happens here,
//! before the server is asked. Waiting here costs the server nothing.
//!
//! **First come, first served.** Waiters queue in arrival order; a release
//! hands the hold straight to the head of the queue (and to every shared
//! waiter right behind a shared head), so no task overtakes one that waits
//! longer, and only the head of each key's queue asks the server.

use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::queue::{Queued, State, Want};
use crate::Mode;

/// What a backend keeps per key beside the in-process hold (PostgreSQL:
/// its hand-off state). `()` for backends that keep nothing.
pub(crate) trait SlotExt: Default + Send + Sync + 'static {
    /// Whether the entry may leave the table once nobody holds or waits:
    /// false while the backend still keeps something for the key (a
    /// PostgreSQL lock parked for the next in-process holder).
    fn idle(&self) -> bool {
        true
    }

    /// What wakes a polling waiter of `slot` early besides an in-process
    /// release (the local backend: a release in another process).
    fn wake(_slot: &Slot<Self>) -> Option<&Notify> {
        None
    }
}

impl SlotExt for () {}

/// The per-key state.
#[derive(Default)]
pub(crate) struct Slot<X = ()> {
    pub(crate) state: Mutex<State>,
    /// Tasks waiting for the in-process hold now.
    pub(crate) waiting: std::sync::atomic::AtomicUsize,
    /// The backend's own per-key state.
    pub(crate) ext: X,
}

/// Counts a task as waiting while it lives.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Waiting(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A queued waiter's place; leaves the queue (or passes a grant it did not
/// take on) when dropped.
struct Place<'a, X> {
    slot: &'a Slot<X>,
    q: Arc<Queued>,
    taken: bool,
}

impl<X> Drop for Place<'_, X> {
    fn drop(&mut self) {
        if !self.taken {
            self.slot
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .leave(&self.q);
        }
    }
}

/// The table of keys in use, and of up to [`KEEP_IDLE`] keys used before.
pub(crate) struct Arbiter<K, X = ()> {
    slots: Mutex<super::FastMap<K, Arc<Slot<X>>>>,
}

/// Idle entries the table keeps, at most: a key used again (most are: a
/// worker's names recur) finds its slot, with no allocation, no insert and
/// no remove per acquisition. Past this many entries, an entry leaves the
/// table once idle.
const KEEP_IDLE: usize = 1024;

impl<K: Hash + Eq + Clone, X: SlotExt> Default for Arbiter<K, X> {
    fn default() -> Self {
        Arbiter {
            slots: Mutex::default(),
        }
    }
}

/// A reference to a key's slot that removes the table entry, when it is the
/// last user and the table is past [`KEEP_IDLE`] entries, on drop (also
/// when a waiting future is cancelled).
pub(crate) struct SlotRef<K: Hash + Eq + Clone, X: SlotExt = ()> {
    arbiter: Arc<Arbiter<K, X>>,
    key: K,
    slot: Arc<Slot<X>>,
}

/// Whether nobody holds, waits for or upgrades the slot's key in process,
/// and the backend keeps nothing for it; `users` references to the slot
/// are the caller's own.
fn idle<X: SlotExt>(slot: &Arc<Slot<X>>, users: usize) -> bool {
    if Arc::strong_count(slot) != users {
        return false;
    }
    let st = slot.state.lock().unwrap_or_else(|e| e.into_inner());
    !st.exclusive && st.shared == 0 && !st.upgrading && st.queue.is_empty() && slot.ext.idle()
}

impl<K: Hash + Eq + Clone, X: SlotExt> Drop for SlotRef<K, X> {
    fn drop(&mut self) {
        let mut slots = self.arbiter.slots.lock().unwrap_or_else(|e| e.into_inner());
        // Two references: the table's and ours.
        if slots.len() > KEEP_IDLE && idle(&self.slot, 2) {
            slots.remove(&self.key);
        }
    }
}

impl<K: Hash + Eq + Clone, X: SlotExt> SlotRef<K, X> {
    /// The slot.
    pub(crate) fn slot(&self) -> &Arc<Slot<X>> {
        &self.slot
    }
}

impl<K: Hash + Eq + Clone, X: SlotExt> Clone for SlotRef<K, X> {
    fn clone(&self) -> Self {
        SlotRef {
            arbiter: self.arbiter.clone(),
            key: self.key.clone(),
            slot: self.slot.clone(),
        }
    }
}

/// An in-process hold on a key; released (and waiters woken) on drop.
pub(crate) struct Hold<K: Hash + Eq + Clone, X: SlotExt = ()> {
    slot: SlotRef<K, X>,
    mode: Mode,
    /// Marked by [`Hold::releasing`].
    releasing: bool,
}

impl<K: Hash + Eq + Clone, X: SlotExt> Arbiter<K, X> {
    /// The slot for `key`, created on first use.
    pub(crate) fn slot(&self, key: &K) -> Arc<Slot<X>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(key.clone()).or_default().clone()
    }

    /// A counted reference to `key`'s slot (created on first use).
    pub(crate) fn slot_ref(self: &Arc<Self>, key: &K) -> SlotRef<K, X> {
        SlotRef {
            arbiter: self.clone(),
            key: key.clone(),
            slot: self.slot(key),
        }
    }

    /// Takes the in-process hold, waiting until `deadline` (`None`: forever).
    /// Returns `None` when the deadline passed first.
    ///
    /// Cancel safety: dropping the future leaves nothing held.
    pub(crate) async fn hold(
        self: &Arc<Self>,
        key: &K,
        mode: Mode,
        deadline: Option<Instant>,
    ) -> Option<Hold<K, X>> {
        let slot = self.slot_ref(key);
        let place = {
            let mut st = slot.slot.state.lock().unwrap_or_else(|e| e.into_inner());
            // Nobody queued: take it now if free. Else join the queue, even
            // when the hold could be shared now: no overtaking.
            if st.queue.is_empty() && st.try_take(mode) {
                None
            } else {
                // First in line behind holds that are only waiting for
                // their unlocks (guards this process dropped): waited for
                // whatever the deadline, even by a try, so a process never
                // finds itself busy because of its own unlock in flight.
                // That wait is bounded by those unlocks' own bounds.
                let deadline = match st.queue.is_empty() && st.only_releasing() {
                    true => None,
                    false => deadline,
                };
                let q = Queued::new(Want::Take(mode));
                st.queue.push_back(q.clone());
                Some((q, deadline))
            }
        };
        let took = match place {
            None => true,
            // Boxed: queueing in process is rare, and its wait (a timer
            // inside) would grow every acquisition's future.
            Some((q, deadline)) => Box::pin(wait_queued(&slot.slot, q, deadline)).await,
        };
        // Not `then_some`: building a Hold we do not own would give back
        // someone else's hold when it drops.
        if took {
            Some(Hold {
                slot,
                mode,
                releasing: false,
            })
        } else {
            None
        }
    }

    /// Number of keys in the table (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.lock().unwrap().len()
    }

    /// Number of keys in the table that are not idle (for tests).
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.slots
            .lock()
            .unwrap()
            .values()
            .filter(|s| !idle(s, 1))
            .count()
    }
}

impl<K: Hash + Eq + Clone, X: SlotExt> Hold<K, X> {
    /// The key's slot (its wake-ups).
    pub(crate) fn slot(&self) -> &Arc<Slot<X>> {
        &self.slot.slot
    }

    /// Marks the hold as on its way out: its guard is gone and only the
    /// server's unlock is awaited before it drops. A request of this
    /// process for the key then waits for it, whatever its deadline (see
    /// [`Arbiter::hold`]).
    pub(crate) fn releasing(&mut self) {
        if !self.releasing {
            self.releasing = true;
            self.slot
                .slot
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .releasing += 1;
        }
    }

    /// A reference to the slot that outlives the hold (and cleans up after).
    pub(crate) fn slot_ref(&self) -> SlotRef<K, X> {
        self.slot.clone()
    }
}

impl<K: Hash + Eq + Clone, X: SlotExt> Drop for Hold<K, X> {
    fn drop(&mut self) {
        let slot = &self.slot.slot;
        // Hands it to the next waiter in line, if any.
        let mut st = slot.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.releasing {
            st.releasing -= 1;
        }
        st.give_back(self.mode);
        // Then `self.slot` drops, removing the entry if nobody else uses it.
    }
}

/// Waits in the queue for `q`'s grant until `deadline`: true when granted
/// (the caller then owns what was granted); on the deadline or when the
/// future is dropped, `q` leaves the queue (passing on a grant it got).
pub(crate) async fn wait_queued<X>(slot: &Slot<X>, q: Arc<Queued>, deadline: Option<Instant>) -> bool {
    let _waiting = Waiting::new(&slot.waiting);
    let mut place = Place {
        slot,
        q,
        taken: false,
    };
    let granted = |q: &Queued| q.granted.load(std::sync::atomic::Ordering::SeqCst);
    loop {
        if granted(&place.q) {
            break;
        }
        // `notify_one` keeps a permit: a grant between the check and the
        // wait is not missed.
        let woken = place.q.wake.notified();
        match deadline {
            None => woken.await,
            Some(d) => {
                if tokio::time::timeout_at(d, woken).await.is_err() {
                    break;
                }
            }
        }
    }
    // Granted, even at the deadline's last moment: take it. Else `place`
    // leaves the queue on drop.
    place.taken = granted(&place.q);
    place.taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn exclusive_and_shared() {
        let a: Arc<Arbiter<u8>> = Arc::default();
        let now = || Some(Instant::now());
        let x = a.hold(&1, Mode::Exclusive, None).await.unwrap();
        assert!(a.hold(&1, Mode::Exclusive, now()).await.is_none());
        assert!(a.hold(&1, Mode::Shared, now()).await.is_none());
        assert!(a.hold(&2, Mode::Exclusive, now()).await.is_some());
        drop(x);
        let s1 = a.hold(&1, Mode::Shared, now()).await.unwrap();
        let s2 = a.hold(&1, Mode::Shared, now()).await.unwrap();
        assert!(a.hold(&1, Mode::Exclusive, now()).await.is_none());
        drop(s1);
        drop(s2);
        assert_eq!(a.busy(), 0);
        assert_eq!(a.len(), 2, "idle entries are kept for the next use");
    }

    /// Idle entries are kept up to `KEEP_IDLE`; past that, an entry leaves
    /// once idle, so the table stays bounded however many keys pass.
    #[tokio::test]
    async fn the_table_keeps_a_bounded_number_of_idle_entries() {
        let a: Arc<Arbiter<u32>> = Arc::default();
        for k in 0..(KEEP_IDLE as u32 + 100) {
            let h = a.hold(&k, Mode::Exclusive, None).await.unwrap();
            drop(h);
        }
        assert_eq!(
            a.len(),
            KEEP_IDLE,
            "kept up to KEEP_IDLE; past it, each left once idle"
        );
        assert_eq!(a.busy(), 0);
        // A kept key's slot serves again, as exclusive as a new one.
        let x = a.hold(&7, Mode::Exclusive, None).await.unwrap();
        assert!(a.hold(&7, Mode::Shared, Some(Instant::now())).await.is_none());
        assert_eq!(a.busy(), 1);
        drop(x);
        assert_eq!(a.busy(), 0);
    }

    #[tokio::test]
    async fn waiter_wakes_on_release() {
        let a: Arc<Arbiter<u8>> = Arc::default();
        let x = a.hold(&1, Mode::Exclusive, None).await.unwrap();
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.hold(&1, Mode::Exclusive, None).await.is_some() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(x);
        assert!(waiter.await.unwrap());
    }

    /// Waiters get the hold in arrival order; shared waiters right behind a
    /// shared head go together; a waiter that leaves passes its turn on.
    #[tokio::test]
    async fn first_come_first_served() {
        let a: Arc<Arbiter<u8>> = Arc::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let x = a.hold(&1, Mode::Exclusive, None).await.unwrap();
        let mut tasks = Vec::new();
        for (i, mode) in [
            (0, Mode::Exclusive),
            (1, Mode::Shared),
            (2, Mode::Shared),
            (3, Mode::Exclusive),
            (4, Mode::Exclusive),
        ] {
            let (a, order) = (a.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let h = a.hold(&1, mode, None).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(h);
            }));
            // Queued in this order.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A late shared request does not overtake the queue, though the
        // hold could be shared with 1 and 2 once they have it.
        drop(x);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order[0], 0);
        assert_eq!(
            [order[1], order[2]]
                .iter()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            [1, 2].into(),
            "{order:?}"
        );
        assert_eq!(&order[3..], &[3, 4], "{order:?}");
        assert_eq!(a.busy(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_times_out_passes_its_turn_on() {
        let a: Arc<Arbiter<u8>> = Arc::default();
        let x = a.hold(&1, Mode::Exclusive, None).await.unwrap();
        let soon = Some(Instant::now() + Duration::from_millis(20));
        let (a1, a2) = (a.clone(), a.clone());
        let first = tokio::spawn(async move { a1.hold(&1, Mode::Exclusive, soon).await.is_some() });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = tokio::spawn(async move { a2.hold(&1, Mode::Exclusive, None).await.is_some() });
        assert!(!first.await.unwrap(), "timed out in the queue");
        drop(x);
        assert!(second.await.unwrap(), "the next in line got it");
        assert_eq!(a.busy(), 0);
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_nothing() {
        let a: Arc<Arbiter<u8>> = Arc::default();
        let x = a.hold(&1, Mode::Exclusive, None).await.unwrap();
        let fut = a.hold(&1, Mode::Exclusive, None);
        assert!(tokio::time::timeout(Duration::from_millis(10), fut)
            .await
            .is_err());
        drop(x);
        assert_eq!(a.busy(), 0);
    }
}
