//! Upgrading a shared lock to exclusive inside one task: a nested scoped
//! exclusive call for a name the task holds shared through an enclosing
//! scoped call of the same locker (see [`Locker::with_lock`](crate::Locker::with_lock)).
//!
//! The task keeps its shared lock throughout. In process, the upgrade jumps
//! the key's queue (every waiter there waits for the upgrader's shared hold
//! anyway) and is granted once the upgrader's hold is the only one; shared
//! requests arriving meanwhile queue behind it. In the server, it takes the
//! key exclusive on the shared lock's own session ([`Upgrade`]), trying
//! with backoff (that session serves other locks and its keepalive probe:
//! it never blocks). Two upgraders of one key are a deadlock (each waits for
//! the other's shared hold): within a locker the second fails at once.

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use tokio::time::Instant;

use super::arbiter::{wait_queued, Arbiter, SlotExt, SlotRef};
use super::backend::{Backend, Missing};
use super::loss::LossToken;
use super::queue::{Queued, Want};
pub(crate) use super::upgradable::Upgrade;
use super::wait::{Backoff, Deadline};
use crate::{Error, LockName, LockOptions, Mode, Result};

/// An acquisition of `name` in `wanted` by a task that holds it `held`
/// through a scoped call of the same locker: it would wait for itself.
pub(crate) fn self_deadlock(name: &LockName, held: Mode, wanted: Mode) -> Error {
    Error::Deadlock {
        name: name.to_string(),
        source: format!(
            "this task holds it {} in a scoped call of this locker, and a {} acquisition would wait \
             for that hold (to upgrade a shared hold, nest a scoped exclusive call)",
            held.as_str(),
            wanted.as_str()
        )
        .into(),
    }
}

/// The in-process half: the key is marked as upgrading (and, for a holder
/// with an in-process hold, held exclusive once granted) until dropped.
struct Upgrading<K: Hash + Eq + Clone, X: SlotExt> {
    slot: SlotRef<K, X>,
    granted: bool,
}

impl<K: Hash + Eq + Clone, X: SlotExt> Drop for Upgrading<K, X> {
    fn drop(&mut self) {
        let mut st = self.slot.slot().state.lock().unwrap_or_else(|e| e.into_inner());
        st.end_upgrade(self.granted);
    }
}

/// Starts the in-process half: `Err(())` when another task of the locker
/// upgrades the key now (a deadlock), `Ok(None)` when `deadline` passed.
///
/// Cancel safety: dropping the future leaves nothing marked or held.
async fn begin<K: Hash + Eq + Clone, X: SlotExt>(
    arbiter: &Arc<Arbiter<K, X>>,
    key: &K,
    in_process: bool,
    deadline: Option<Instant>,
) -> std::result::Result<Option<Upgrading<K, X>>, ()> {
    let slot = arbiter.slot_ref(key);
    let queued = {
        let mut st = slot.slot().state.lock().unwrap_or_else(|e| e.into_inner());
        if st.upgrading {
            return Err(());
        }
        st.upgrading = true;
        if !in_process {
            None
        } else if st.try_upgrade() {
            Some(None)
        } else {
            let q = Queued::new(Want::Upgrade);
            st.queue.push_front(q.clone());
            Some(Some(q))
        }
    };
    let queued = match queued {
        // No in-process hold: only marked, for the deadlock check.
        None => return Ok(Some(Upgrading { slot, granted: false })),
        Some(None) => return Ok(Some(Upgrading { slot, granted: true })),
        Some(Some(q)) => q,
    };
    // Not granted in time (or dropped): leaving the queue ends the upgrade.
    Ok(wait_queued(slot.slot(), queued, deadline)
        .await
        .then_some(Upgrading { slot, granted: true }))
}

/// An upgraded lock: exclusive on top of the enclosing shared one, until
/// released (or dropped: the exclusive lock is then dropped in the
/// background; the shared one stays).
pub(crate) struct Upgraded {
    up: Arc<dyn Upgrade>,
    /// The in-process half, given back after the server's exclusive lock.
    held: Option<Box<dyn Send + Sync>>,
    loss: LossToken,
    /// When the upgraded hold passes its `max_hold`.
    max_hold_at: Option<Instant>,
}

impl Upgraded {
    /// Completes if the session is lost while upgraded, or at `max_hold`.
    pub(crate) fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.loss.lost_or_past(self.max_hold_at)
    }

    /// Whether the upgraded hold has lasted past its `max_hold`.
    pub(crate) fn max_hold_exceeded(&self) -> bool {
        self.max_hold_at.is_some_and(|at| Instant::now() >= at)
    }

    /// Whether the session still holds it.
    pub(crate) fn is_held(&self) -> bool {
        !self.loss.is_lost()
    }

    /// Back to shared: drops the exclusive lock and reports the server's answer.
    ///
    /// Cancel safety: dropped early, the release still completes.
    pub(crate) async fn release(mut self) -> Result<()> {
        let held = self.held.take().expect("held until released");
        self.loss.mark_released();
        self.up.unlock_exclusive(held).await
    }
}

impl Drop for Upgraded {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            self.loss.mark_released();
            drop(self.up.unlock_exclusive(held));
        }
    }
}

/// Upgrades `key` (held shared by this task through `up`'s grant) within
/// `opts`' wait: `None` when the wait ended first, the shared lock intact.
///
/// Cancel safety: cancel-safe; dropped at any await point, nothing
/// exclusive is left held and the shared lock stays.
pub(crate) async fn acquire<B: Backend>(
    backend: &B,
    arbiter: &Arc<Arbiter<B::Key, B::SlotExt>>,
    key: &B::Key,
    name: &LockName,
    opts: &LockOptions,
    up: Option<Arc<dyn Upgrade>>,
) -> Result<Option<Upgraded>> {
    let refused = if opts.fenced {
        Some("a fenced upgrade: fencing tokens need a lock held exclusive from the start (fence neither call, or take the name exclusive in the outer call)")
    } else if opts.transaction {
        Some("an upgrade to a transaction-level lock: the exclusive lock could not be given back before the transaction ends")
    } else {
        None
    };
    if let Some(why) = refused {
        return Err(Error::Unsupported(why.into()));
    }
    let Some(up) = up else {
        let why = backend.refusal(Missing::Upgrade);
        return Err(Error::Unsupported(
            why.unwrap_or_else(|| "this lock cannot be upgraded".into()),
        ));
    };
    let deadline = Deadline::after(opts.timeout);
    let deadlock = |who: &str| Error::Deadlock {
        name: name.to_string(),
        source: format!(
            "{who} holds it shared and is upgrading it too: each would wait for the other's shared lock"
        )
        .into(),
    };
    let upgrading = match begin(arbiter, key, up.in_process(), deadline.at()).await {
        Err(()) => return Err(deadlock("another task of this locker")),
        Ok(None) => return Ok(None),
        Ok(Some(u)) => u,
    };
    let slot = upgrading.slot.slot().clone();
    let wake = <B::SlotExt as SlotExt>::wake(&slot);
    let mut backoff = Backoff::new(deadline, opts.max_backoff);
    // Claimed after the first failed try: an uncontended upgrade costs one
    // round trip.
    let mut claim = None;
    loop {
        // Registered before the try, so a release in between is not missed.
        let mut notified = wake.map(|w| Box::pin(w.notified()));
        if let Some(n) = notified.as_mut() {
            n.as_mut().enable();
        }
        if up.try_exclusive().await? {
            return Ok(Some(Upgraded {
                loss: up.loss(),
                max_hold_at: opts.max_hold.and_then(|d| Instant::now().checked_add(d)),
                up,
                held: Some(Box::new(upgrading)),
            }));
        }
        if claim.is_none() {
            match up.claim().await? {
                Some(c) => claim = Some(c),
                None => return Err(deadlock("another session")),
            }
        }
        if !backoff.pause(notified.as_mut().map(|n| n.as_mut())).await {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type A = Arc<Arbiter<u8>>;

    fn soon(ms: u64) -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(ms))
    }

    /// Waits only for the other shared holder; shared requests that come
    /// meanwhile queue behind it; back to shared when it ends.
    #[tokio::test]
    async fn an_upgrade_waits_for_the_others_and_blocks_newcomers() {
        let a: A = Arc::default();
        let mine = a.hold(&1, Mode::Shared, None).await.unwrap();
        let other = a.hold(&1, Mode::Shared, None).await.unwrap();
        let a2 = a.clone();
        let up = tokio::spawn(async move { begin(&a2, &1, true, None).await.unwrap().unwrap() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!up.is_finished(), "granted while another task holds it shared");
        assert!(
            a.hold(&1, Mode::Shared, soon(10)).await.is_none(),
            "a newcomer overtook the upgrade"
        );
        let a3 = a.clone();
        let late = tokio::spawn(async move { a3.hold(&1, Mode::Shared, None).await.is_some() });
        drop(other);
        let up = up.await.unwrap();
        assert!(
            a.hold(&1, Mode::Shared, soon(10)).await.is_none(),
            "shared while upgraded"
        );
        assert!(!late.is_finished());
        drop(up);
        assert!(
            late.await.unwrap(),
            "the queued shared request goes once back to shared"
        );
        assert!(
            a.hold(&1, Mode::Exclusive, soon(10)).await.is_none(),
            "the shared hold stays"
        );
        drop(mine);
        assert_eq!(a.busy(), 0);
    }

    #[tokio::test]
    async fn a_second_upgrader_is_a_deadlock_and_a_timeout_leaves_the_queue_clean() {
        let a: A = Arc::default();
        let (h1, h2) = (
            a.hold(&1, Mode::Shared, None).await.unwrap(),
            a.hold(&1, Mode::Shared, None).await.unwrap(),
        );
        let a2 = a.clone();
        let first = tokio::spawn(async move { begin(&a2, &1, true, soon(50)).await.map(|u| u.is_some()) });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            begin(&a, &1, true, None).await.is_err(),
            "two upgraders wait for each other"
        );
        assert_eq!(first.await.unwrap(), Ok(false), "timed out while the other holds");
        // Nothing left behind: shared newcomers go at once, a new upgrade works.
        let h3 = a.hold(&1, Mode::Shared, soon(10)).await.unwrap();
        drop((h2, h3));
        assert!(begin(&a, &1, true, soon(10)).await.unwrap().is_some());
        drop(h1);
        assert_eq!(a.busy(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_upgrade_leaves_nothing() {
        let a: A = Arc::default();
        let (h1, h2) = (
            a.hold(&1, Mode::Shared, None).await.unwrap(),
            a.hold(&1, Mode::Shared, None).await.unwrap(),
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(10), begin(&a, &1, true, None))
                .await
                .is_err()
        );
        let h3 = a.hold(&1, Mode::Shared, soon(10)).await.unwrap();
        drop((h1, h2, h3));
        assert_eq!(a.busy(), 0);
    }
}
