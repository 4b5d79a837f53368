//! What the own-connection calls return: a transaction lock's token, and
//! the `Err` side every one of them uses for "not acquired".

use crate::key::PgKey;
use crate::LockName;

/// The wait ended without the lock (try-once, or the timeout ran out):
/// the `Err` side of what an own-connection call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAcquired;

impl std::fmt::Display for NotAcquired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lock was not acquired")
    }
}

impl std::error::Error for NotAcquired {}

/// A transaction-level lock taken in a caller's transaction
/// ([`lock_xact`](super::lock_xact), `sqlx::lock_xact` with the `sqlx` feature).
/// It lasts until that transaction ends (commit or rollback, an aborted
/// one included); there is nothing to release, and dropping this value
/// changes nothing.
#[must_use = "the lock is held only if this was returned: check the result before the critical section"]
#[derive(Debug, Clone)]
pub struct XactLock {
    name: LockName,
    key: PgKey,
}

impl XactLock {
    pub(crate) fn new(name: LockName, key: PgKey) -> Self {
        XactLock { name, key }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The PostgreSQL key the name maps to.
    pub fn key(&self) -> PgKey {
        self.key
    }
}
