//! What a MySQL backend and its grants share: the connector, the server's
//! flavour, and the *registry* of held lock strings (for nested
//! acquisitions, the loss check and `list`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::conn::Connector;
use super::lock_conn::LockConn;
use crate::key::{mysql_lock_string_for, MysqlFlavour, Prefix};
use crate::{LockName, Result};

/// What the backend and its guards share.
pub(crate) struct Shared {
    pub(super) connector: Arc<Connector>,
    /// Where guards spawn their watchers and queued releases.
    pub(super) runtime: tokio::runtime::Handle,
    /// MariaDB or MySQL, from `VERSION()` at connect: their limits on lock
    /// names differ.
    pub(super) flavour: MysqlFlavour,
    /// Every lock string this backend holds, with the session holding it:
    /// for acquisitions nested in a scoped call, for the loss check
    /// ([`check`](super::check)) and for the names [`Locker::list`](crate::Locker::list)
    /// shows.
    pub(super) registry: Mutex<crate::core::FastMap<String, Registered>>,
    /// Numbers registrations, so the loss check can tell a lock it saw
    /// from the same lock released and taken again meanwhile.
    pub(super) generation: AtomicU64,
    /// Wakes the loss check when a lock is registered.
    pub(super) check_wake: Arc<tokio::sync::Notify>,
}

/// A held lock as [`Shared::registry`] records it.
pub(crate) struct Registered {
    pub(super) lc: Arc<LockConn>,
    pub(super) generation: u64,
    pub(super) name: LockName,
}

impl Shared {
    pub(super) fn remember(&self, lock: &str, lc: &Arc<LockConn>, name: &LockName) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry.insert(
            lock.to_owned(),
            Registered {
                lc: lc.clone(),
                generation,
                name: name.clone(),
            },
        );
        drop(registry);
        self.check_wake.notify_one();
    }

    /// Called before the release's `RELEASE_LOCK` is sent: the loss check
    /// trusts an answer about a lock only while it is still registered.
    pub(super) fn forget(&self, lock: &str, lc: &Arc<LockConn>) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if registry.get(lock).is_some_and(|h| Arc::ptr_eq(&h.lc, lc)) {
            registry.remove(lock);
        }
    }

    pub(super) fn held_is_empty(&self) -> bool {
        self.registry.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Whether `lock` is still registered as the loss check saw it.
    pub(super) fn still_registered(&self, lock: &str, lc: &Arc<LockConn>, generation: u64) -> bool {
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry
            .get(lock)
            .is_some_and(|r| Arc::ptr_eq(&r.lc, lc) && r.generation == generation)
    }

    /// The `GET_LOCK` string for `name` on this server.
    pub(super) fn lock_string(&self, name: &LockName, prefix: &Prefix) -> Result<String> {
        mysql_lock_string_for(name, prefix, self.flavour)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The loss check holds only a weak reference: it wakes, finds the
        // backend gone and ends.
        self.check_wake.notify_one();
    }
}

impl Shared {
    /// Kills session `id` from another connection, in the background.
    pub(crate) fn spawn_kill(&self, id: u32) {
        self.connector.spawn_kill(&self.runtime, id);
    }
}
