//! What a scoped call holds while its closure runs, and how it runs it:
//! shared by [`Locker::with_lock`](crate::Locker::with_lock) and
//! [`Locker::once_per`](crate::Locker::once_per).

use std::future::Future;
use std::pin::Pin;

use super::guard::LockGuard;
use super::scope::{self, Scoped};
use super::upgrade::Upgraded;
use crate::types::HeldLock;
use crate::{Error, LockOptions, Result};

/// What a scoped call holds: its own lock, or an upgrade of the enclosing one.
pub(crate) enum Held {
    Guard(LockGuard),
    Upgraded(Upgraded),
}

impl Held {
    fn lost(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        match self {
            Held::Guard(g) => Box::pin(g.lost()),
            Held::Upgraded(x) => Box::pin(x.lost()),
        }
    }

    fn max_hold_exceeded(&self) -> bool {
        match self {
            Held::Guard(g) => g.max_hold_exceeded(),
            Held::Upgraded(x) => x.max_hold_exceeded(),
        }
    }

    fn is_held(&self) -> bool {
        match self {
            Held::Guard(g) => g.is_held(),
            Held::Upgraded(x) => x.is_held(),
        }
    }

    /// The scoped call's own guard (not an upgrade's).
    pub(crate) fn guard(&self) -> Option<&LockGuard> {
        match self {
            Held::Guard(g) => Some(g),
            Held::Upgraded(_) => None,
        }
    }

    pub(crate) async fn release(self) -> Result<()> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Upgraded(x) => x.release().await,
        }
    }

    /// Why the work was stopped ([`within`] gave `None`): past
    /// `max_hold` the lock is released (an upgrade: back to shared), then
    /// [`Error::MaxHoldExceeded`]; else it was lost, [`Error::LockLost`].
    pub(crate) async fn stopped(self, name: String, opts: &LockOptions) -> Error {
        if self.max_hold_exceeded() && self.is_held() {
            tracing::warn!(name = %name, "dbmutex: scoped call held its lock past max_hold; the work was stopped");
            if let Err(e) = self.release().await {
                tracing::warn!(error = %e, "dbmutex: unlock after max_hold failed");
            }
            return Error::MaxHoldExceeded {
                name,
                max_hold: opts.max_hold.unwrap_or_default(),
            };
        }
        tracing::warn!(name = %name, "dbmutex: lock lost during a scoped call; the work was stopped");
        drop(self);
        Error::LockLost { name }
    }
}

/// Runs `work` as the scoped call `me` that holds `held` (on this task's
/// scope stack for its duration); `None` when the lock was lost, or the
/// hold passed its `max_hold`, first (`work` is then dropped).
pub(crate) async fn within<T, F, Fut>(held: &Held, mut me: HeldLock, work: F) -> Option<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    let upgrade = match held {
        Held::Guard(g) => {
            me.fence = g.fence();
            g.upgrader()
        }
        Held::Upgraded(_) => None,
    };
    let mut stack = scope::stack();
    stack.push(Scoped { held: me, upgrade });
    let lost = held.lost();
    scope::within(stack, async {
        tokio::select! {
            biased;
            v = work() => Some(v),
            () = lost => None,
        }
    })
    .await
}
