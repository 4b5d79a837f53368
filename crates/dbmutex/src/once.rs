//! [`Locker::once_per`]: a scoped call that runs at most once per window
//! across every process and host that shares the lock (see [`crate::runs`]).

use std::future::Future;
use std::time::Duration;

use crate::core::scoped::{self, Held};
use crate::runs::{OncePer, RunStart};
use crate::{Error, LockName, LockOptions, Locker, Mode, Result};

impl Locker {
    /// Runs `f` under the lock `name` unless its last run (by this call, or
    /// `dbmutex run --once-per`, anywhere) started less than `window` minus
    /// its [`grace`](crate::runs::grace) ago by the server's clock. The start is recorded before `f` runs, its end
    /// (exit status 0) after, both while the lock is held; see
    /// [`crate::runs`].
    ///
    /// - [`OncePer::NotDue`] when the last run is too recent (`f` did not
    ///   run; it says when and where that run started);
    /// - [`OncePer::NotAcquired`] when the lock was not acquired within the
    ///   wait `opts` sets — usually another worker running it now; with the
    ///   default (wait for ever) a worker that waited then finds the run
    ///   done and gets `NotDue`;
    /// - a scoped call otherwise, as [`Locker::with_lock`]: a nested call
    ///   for the same name in `f` is re-entrant, a lost lock stops `f` with
    ///   [`Error::LockLost`](crate::Error::LockLost) (the record then keeps
    ///   the start only), `max_hold` with
    ///   [`Error::MaxHoldExceeded`](crate::Error::MaxHoldExceeded).
    ///
    /// Exclusive session locks only: `shared(true)` or `transaction(true)`
    /// is [`Error::Unsupported`](crate::Error::Unsupported), as is a call
    /// inside a scoped call of this task that holds the same lock (its
    /// acquisition would wait for that hold for ever).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `f` and releases the lock; a start already
    /// recorded stays recorded (the window is used up), with no end.
    pub async fn once_per<T, F, Fut>(
        &self,
        name: impl Into<LockName>,
        window: Duration,
        opts: &LockOptions,
        f: F,
    ) -> Result<OncePer<T>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        if opts.mode == Mode::Shared || opts.transaction {
            return Err(Error::Unsupported(
                "once-per-window runs need an exclusive session lock (not shared(true) or transaction(true))"
                    .into(),
            ));
        }
        let name = name.into();
        if self.held_in_scope(&name) {
            // Its acquisition would wait for this task's own hold.
            return Err(Error::Unsupported(format!(
                "once_per for {:?} inside a scoped call that holds the same lock: \
                 call it outside, or use LockGuard::start_run on an owned guard",
                name.to_string()
            )));
        }
        let Some(guard) = self.acquire(name, opts).await? else {
            return Ok(OncePer::NotAcquired);
        };
        let run = match guard.start_run(window).await {
            Ok(RunStart::Due(run)) => run,
            Ok(RunStart::NotDue(last)) => {
                release(Held::Guard(guard)).await;
                return Ok(OncePer::NotDue(last));
            }
            Err(e) => {
                release(Held::Guard(guard)).await;
                return Err(e);
            }
        };
        let (me, shown) = (self.scope_entry(&guard), guard.name().to_string());
        let held = Held::Guard(guard);
        match scoped::within(&held, me, f).await {
            Some(v) => {
                if let Some(g) = held.guard() {
                    if let Err(e) = g.finish_run(&run, Some(0)).await {
                        tracing::warn!(name = %shown, error = %e, "dbmutex: could not record the end of a run");
                    }
                }
                release(held).await;
                Ok(OncePer::Ran(v))
            }
            None => Err(held.stopped(shown, opts).await),
        }
    }
}

/// Releases after the work, whose outcome stands either way: a failed
/// release has closed the connection, so the server freed the lock.
async fn release(held: Held) {
    if let Err(e) = held.release().await {
        tracing::warn!(error = %e, "dbmutex: unlock after a once-per-window call failed");
    }
}
