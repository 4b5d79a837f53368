//! The owned lock guard.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::{LockName, Mode, Result};

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a backend holds for one acquired lock.
///
/// Dropping it without [`Held::release`] must free the lock without blocking:
/// queue or spawn the unlock, or close the connection.
pub(crate) trait Held: Send + Sync + 'static {
    /// Releases the lock and reports whether the server confirmed it. On a
    /// failure that leaves the lock's fate unknown, the implementation closes
    /// the connection so the server frees the lock anyway.
    fn release(self: Box<Self>) -> BoxFuture<Result<()>>;

    /// A receiver that turns `true` when the lock is lost; `None` when the
    /// lock cannot be lost while the process lives (local backend).
    fn lost_signal(&self) -> Option<watch::Receiver<bool>>;
}

/// An acquired lock. Release it with [`LockGuard::release`]; dropping it also
/// releases the lock (the unlock is queued, never blocking the dropping thread).
///
/// The guard is `Send` and `Sync` and may be held across `.await` points and
/// moved between tasks.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    held: Option<Box<dyn Held>>,
    name: LockName,
    mode: Mode,
    acquired_at: Instant,
    count: Arc<AtomicUsize>,
    /// Set when the guard lets go of the lock, so that closing its
    /// connection afterwards is not reported as a loss.
    done: Arc<std::sync::atomic::AtomicBool>,
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
    pub(crate) fn new(held: Box<dyn Held>, name: LockName, mode: Mode, count: Arc<AtomicUsize>) -> Self {
        LockGuard {
            held: Some(held),
            name,
            mode,
            acquired_at: Instant::now(),
            count,
            done: Arc::default(),
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

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.acquired_at.elapsed()
    }

    /// False once the connection that holds the lock is known to be gone
    /// (the server has then freed the lock). Never re-acquired silently.
    pub fn is_held(&self) -> bool {
        match self.held.as_ref().and_then(|h| h.lost_signal()) {
            Some(rx) => !*rx.borrow(),
            None => self.held.is_some(),
        }
    }

    /// Completes when the lock is lost while this guard holds it. Never
    /// completes for a lock that cannot be lost (local backend), nor once
    /// the guard has released it (or been dropped).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the future only watches.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let rx = self.held.as_ref().and_then(|h| h.lost_signal());
        let done = self.done.clone();
        async move {
            if let Some(mut rx) = rx {
                // The connection's end is this lock's loss only if the guard
                // still held it then.
                if rx.wait_for(|lost| *lost).await.is_ok() && !done.load(Ordering::SeqCst) {
                    return;
                }
            }
            std::future::pending::<()>().await
        }
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
        let held = self.held.take().expect("guard holds until released");
        self.done.store(true, Ordering::SeqCst);
        self.count.fetch_sub(1, Ordering::Relaxed);
        let hold_time = self.acquired_at.elapsed();
        // If this future is dropped mid-way, `held` is dropped with it and its
        // Drop queues the unlock.
        let r = held.release().await;
        match &r {
            Ok(()) => {
                tracing::debug!(name = %self.name, held_us = hold_time.as_micros() as u64, "dbmutex: released")
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
        if let Some(held) = self.held.take() {
            self.done.store(true, Ordering::SeqCst);
            self.count.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!(name = %self.name, held_us = self.acquired_at.elapsed().as_micros() as u64, "dbmutex: released on drop");
            // Dropping the release future is not enough for every backend;
            // each backend's Held::drop queues its own unlock.
            drop(held);
        }
    }
}
