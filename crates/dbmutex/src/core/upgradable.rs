//! What a grant that can be upgraded hands out (see [`super::upgrade`]):
//! the [`Upgrade`] trait, apart from the upgrade itself so that grants need
//! not know the pipeline.

use std::future::Future;
use std::pin::Pin;

use super::loss::LossToken;
use crate::Result;

/// A boxed, sendable future (as `guard::BoxFuture`, which this leaf
/// module cannot import: `guard` imports it).
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The server half of an upgrade, handed out by a shared grant that can be
/// upgraded: its own session, which takes the key exclusive while keeping
/// the shared lock (PostgreSQL session locks are per session and mode).
pub(crate) trait Upgrade: Send + Sync + 'static {
    /// Whether the shared lock carries an in-process hold (then the upgrade
    /// also waits for the locker's other tasks holding the key).
    fn in_process(&self) -> bool;

    /// One try for the exclusive lock on the shared lock's session, never
    /// waiting. Cancel-safe: a success nobody receives is undone.
    fn try_exclusive(&self) -> Boxed<Result<bool>>;

    /// Drops the exclusive lock (only that one), then `after`. Under way
    /// once called: dropping the returned future does not stop it.
    fn unlock_exclusive(&self, after: Box<dyn Send + Sync>) -> Boxed<Result<()>>;

    /// The session's loss (it ends both locks).
    fn loss(&self) -> LossToken;

    /// Before the wait, after a failed try: marks the session as upgrading
    /// the key where other processes' upgraders see it, until the returned
    /// value is dropped; `None` when another session is marked already
    /// (it holds the key shared too: each would wait for the other).
    fn claim(&self) -> Boxed<Result<Option<Box<dyn Send + Sync>>>>;
}
