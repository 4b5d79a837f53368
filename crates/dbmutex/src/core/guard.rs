//! The owned lock guard.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use super::delay::DelayRecord;
use super::delay::Renewal;
use super::loss::LossToken;
use super::metrics::{Hold, Labels};
use crate::runs::{Run, RunStart, Who};
use crate::{Error, LockName, Mode, Result};

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A borrowed-lifetime boxed, sendable future (the engine's methods).
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

super::reuse::shelf! {
    /// The spare allocation of each thread's release futures
    /// ([`Grant::release`]), for grants without a shelf of their own.
    pub(crate) static RELEASES;
}

/// A grant's release on its way: boxed, in the allocation of the last
/// release of the same size this thread finished on the same shelf (see
/// [`super::reuse`]).
pub(crate) type Releasing = super::reuse::Reused<'static, Result<()>>;

/// Boxes a grant's release future for [`Grant::release`], on `shelf`: a
/// grant whose release future differs in size from others' that the same
/// thread may release in turn (PostgreSQL's lock-session and dedicated
/// grants) keeps a shelf of its own, else [`RELEASES`]. The future is the
/// one `make` returns, built in place.
pub(crate) fn releasing<F>(shelf: &'static super::reuse::Shelf, make: impl FnOnce() -> F) -> Releasing
where
    F: Future<Output = Result<()>> + Send + 'static,
{
    super::reuse::Reused::new(shelf, make)
}

/// A *grant*: one server lock (or lock file) on one session, as a backend
/// hands it to the core, carrying the in-process hold and the lock-table
/// ticket it was acquired with.
///
/// Dropping it without [`Grant::release`] must free the lock without
/// blocking: an armed [`Undo`](crate::core::detach::Undo) queues the unlock
/// or closes the session.
pub(crate) trait Grant: Send + Sync + 'static {
    /// Releases the lock and reports whether the server confirmed it. On a
    /// failure that leaves the lock's fate unknown, the implementation closes
    /// the connection so the server frees the lock anyway.
    /// The future is boxed on [`RELEASES`]' spare box ([`releasing`]).
    fn release(self: Box<Self>) -> Releasing;

    /// This lock's loss token.
    fn loss(&self) -> LossToken;

    /// The statements fencing tokens and once-per runs need, run on the
    /// lock's own session while this grant holds the lock; `None` if this
    /// backend cannot.
    fn on_session(&self) -> Option<&dyn OnSession> {
        None
    }

    /// For a shared lock whose session can also take it exclusive: how a
    /// nested scoped call upgrades it (see `core::upgrade`).
    fn upgrader(&self) -> Option<std::sync::Arc<dyn super::upgradable::Upgrade>> {
        None
    }
}

/// Statements on a held lock's own session (where there is one), so that
/// nothing is recorded for a lock that session no longer holds: what
/// fencing tokens ([`crate::fence`]) and once-per-window runs
/// ([`crate::runs`]) need of a backend.
pub(crate) trait OnSession: Send + Sync {
    /// Issues the next fencing token of `key` (the backend's key text),
    /// committed (durable) before it returns. The core calls it once, right
    /// after the grant, when [`LockOptions::fenced`](crate::LockOptions::fenced)
    /// asks.
    fn fence(&self, key: String) -> BoxFuture<Result<u64>>;

    /// Reads this lock's last run and, if none started within `window` (by
    /// the server's clock), records a start by `who`.
    fn start_run(&self, window: Duration, who: Who) -> BoxFuture<Result<RunStart>>;

    /// Records the end of `run`, started under this hold.
    fn finish_run(&self, run: u64, exit_code: Option<i32>) -> BoxFuture<Result<()>>;

    /// The lock-delay record of `key` (the backend's key text) on this
    /// lock's session ([`crate::delay`]): each call runs one step. It must
    /// not keep the lock: the core drops it before the release.
    fn delay(&self, key: String) -> DelayRecord;
}

/// An acquired lock. Release it with [`LockGuard::release`]; dropping it also
/// releases the lock (the unlock is queued, never blocking the dropping thread).
///
/// Which to use: `release().await` waits for the server's answer (one round
/// trip) and reports a lock found lost at that moment; `drop(guard)` returns
/// at once and the unlock goes out without waiting for its answer, so a loop
/// of acquisitions does not wait a round trip per release (BENCHMARKS.md).
/// On PostgreSQL, on a connection that reaches the server directly, the
/// dropping thread itself queues the unlock on the connection (no task), and
/// this locker's next statement runs after it; elsewhere a task sends it. A
/// failed background unlock is logged as a `tracing` warning where a task
/// awaits it, and is not returned to anyone; where the lock's fate is
/// unknown, the lock's connection is closed, so the server frees it.
///
/// The guard is `Send` and `Sync` and may be held across `.await` points and
/// moved between tasks.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    grant: Option<Box<dyn Grant>>,
    name: LockName,
    mode: Mode,
    acquired_at: Instant,
    count: Arc<AtomicUsize>,
    /// The fencing token issued with the lock, if asked for.
    fence: Option<u64>,
    /// Marked released when the guard lets go of the lock, so that closing
    /// its connection afterwards is not reported as a loss.
    loss: LossToken,
    /// The hold's metrics (nothing without the `metrics` feature).
    metrics: Hold,
    /// When the hold passes its `max_hold`.
    max_hold_at: Option<tokio::time::Instant>,
    /// The locker's server-wait permit a wait in the server took (its
    /// connection), kept until the lock is released.
    _permit: Option<super::permits::Permit>,
    /// Lock-delay's renewal, when asked for; opened at a clean release.
    delay: Option<Renewal>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("mode", &self.mode)
            .field("held", &self.is_held())
            .finish()
    }
}

impl LockGuard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        grant: Box<dyn Grant>,
        permit: Option<super::permits::Permit>,
        name: LockName,
        mode: Mode,
        fence: Option<u64>,
        count: Arc<AtomicUsize>,
        labels: Labels,
        max_hold: Option<Duration>,
        delay: Option<Renewal>,
    ) -> Self {
        let loss = grant.loss();
        let max_hold_at = max_hold.and_then(|d| tokio::time::Instant::now().checked_add(d));
        LockGuard {
            fence,
            metrics: Hold::start(labels, &loss),
            loss,
            grant: Some(grant),
            name,
            mode,
            acquired_at: Instant::now(),
            count,
            max_hold_at,
            _permit: permit,
            delay,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Exclusive or shared.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The fencing token issued with this lock when it was acquired with
    /// [`LockOptions::fenced`](crate::LockOptions::fenced), else `None`.
    /// Strictly greater than the token of every earlier holder of the same
    /// key; pass it to the protected resource with each write, which keeps
    /// the highest token it has seen and rejects lower ones (see the crate
    /// docs, "Fencing tokens", and [`fence`](crate::fence)).
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Starts a once-per-window run under this lock: `RunStart::NotDue`
    /// (nothing recorded) if the name's last run started less than `window`
    /// ago by the server's clock, else `RunStart::Due` with its start
    /// recorded (time, host, process id). See [`crate::runs`];
    /// [`Locker::once_per`](crate::Locker::once_per) wraps it.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a shared or transaction-level lock (it
    /// does not exclude other starters); [`Error::LockLost`] if the lock is
    /// no longer held; [`Error::Config`] if the table is missing and this
    /// role may not create it.
    pub async fn start_run(&self, window: Duration) -> Result<RunStart> {
        self.live_exclusive()?.start_run(window, Who::me()).await
    }

    /// Records the end of `run` (from [`LockGuard::start_run`] on this
    /// guard) with the job's exit status, if it has one. Call it before the
    /// lock is released.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the lock is no longer held (the record then
    /// keeps the start only).
    pub async fn finish_run(&self, run: &Run, exit_code: Option<i32>) -> Result<()> {
        self.live_exclusive()?.finish_run(run.run, exit_code).await
    }

    /// The grant's session statements, if it still holds an exclusive lock.
    fn live_exclusive(&self) -> Result<&dyn OnSession> {
        if self.mode != Mode::Exclusive {
            return Err(Error::Unsupported(
                "once-per-window runs need an exclusive lock: shared holders do not exclude each other"
                    .into(),
            ));
        }
        match &self.grant {
            Some(g) if self.is_held() => g.on_session().ok_or_else(|| {
                Error::Unsupported("once-per-window runs need an exclusive session lock".into())
            }),
            _ => Err(Error::LockLost {
                name: self.name.to_string(),
            }),
        }
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.acquired_at.elapsed()
    }

    /// False once the connection that holds the lock is known to be gone
    /// (the server has then freed the lock). Never re-acquired silently.
    pub fn is_held(&self) -> bool {
        !self.loss.is_released() && !self.loss.is_lost()
    }

    /// Completes when the lock is lost while this guard holds it, or when
    /// the hold passes its [`LockOptions::max_hold`](crate::LockOptions::max_hold)
    /// ([`LockGuard::max_hold_exceeded`] tells which). Never completes for a
    /// lock that cannot be lost (local backend) and has no `max_hold`, nor
    /// once the guard has released it (or been dropped).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the future only watches.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.loss.lost_or_past(self.max_hold_at)
    }

    /// True once the hold has lasted longer than its
    /// [`LockOptions::max_hold`](crate::LockOptions::max_hold). The lock is
    /// still held (until released or dropped): the limit is reported, not
    /// enforced.
    pub fn max_hold_exceeded(&self) -> bool {
        self.max_hold_at
            .is_some_and(|at| tokio::time::Instant::now() >= at)
    }

    /// How a nested scoped call upgrades this (shared) lock, if it can.
    pub(crate) fn upgrader(&self) -> Option<Arc<dyn super::upgradable::Upgrade>> {
        self.grant.as_ref()?.upgrader()
    }

    /// Releases the lock now and reports the server's answer.
    ///
    /// An error means the release could not be confirmed; dbmutex then
    /// closes the lock's connection, so the server frees the lock anyway.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before it completes, the release still
    /// happens in the background.
    pub async fn release(mut self) -> Result<()> {
        let grant = self.grant.take().expect("guard holds until released");
        self.metrics.end(self.loss.is_lost());
        self.loss.mark_released();
        self.count.fetch_sub(1, Ordering::Relaxed);
        // If this future is dropped mid-way, `grant` is dropped with it and
        // its Drop queues the unlock (a lock-delay record not yet opened
        // then keeps the lock closed for its delay: the safe side).
        if let Some(delay) = self.delay.take() {
            delay.open(&self.name).await;
        }
        let r = grant.release().await;
        match &r {
            Ok(()) => {
                tracing::debug!(name = %self.name, held_us = self.acquired_at.elapsed().as_micros() as u64, "dbmutex: released")
            }
            // A lost lock has nothing to release: the error says so to
            // the caller, and the loss was told where it was watched.
            Err(e @ Error::LockLost { .. }) => {
                tracing::debug!(name = %self.name, error = %e, "dbmutex: release of a lost lock")
            }
            Err(e) => {
                tracing::warn!(name = %self.name, error = %e, "dbmutex: release failed; connection closed")
            }
        }
        r
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            self.metrics.end(self.loss.is_lost());
            self.loss.mark_released();
            self.count.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!(name = %self.name, held_us = self.acquired_at.elapsed().as_micros() as u64, "dbmutex: released on drop");
            match (self.delay.take(), tokio::runtime::Handle::try_current()) {
                // Opened, then released, in the background (the grant keeps
                // the lock, and the in-process hold, until then).
                (Some(delay), Ok(rt)) => {
                    let name = self.name.clone();
                    drop(rt.spawn(async move {
                        delay.open(&name).await;
                        if let Err(e) = grant.release().await {
                            tracing::warn!(name = %name, error = %e, "dbmutex: release after opening a lock-delay failed");
                        }
                    }));
                }
                // Each grant's Drop queues its own unlock (with no runtime
                // to open a lock-delay record, the renewal just stops: the
                // lock stays closed for its delay, the safe side).
                _ => drop(grant),
            }
        }
    }
}
