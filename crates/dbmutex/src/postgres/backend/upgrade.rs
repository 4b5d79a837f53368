//! The server half of an upgrade (see `core::upgrade`): the shared lock's
//! own session takes the key exclusive too — a session's own locks never
//! conflict, so this waits only for other sessions — and later drops just
//! that one (`pg_advisory_unlock`; the shared lock stays). It only tries,
//! never blocks: the session is the lock session that other tasks' locks
//! share, or a dedicated one whose keepalive probe must be answered.
//!
//! Since no upgrader waits in the server, the server cannot see two of
//! them deadlock. So a waiting upgrader also holds the *intent* key of its
//! key ([`intent_key`], exclusive, on the same session): a second upgrader
//! of the key, which must hold it shared too, finds the intent taken and
//! fails with [`Error::Deadlock`] at once (each would wait for the other).

use std::sync::Arc;
use std::time::Duration;

use super::session_lock::SessionLock;
use crate::core::detach::Undo;
use crate::core::guard::BoxFuture;
use crate::core::loss::LossToken;
use crate::core::upgradable::Upgrade;
use crate::core::wait::Deadline;
use crate::key::PgKey;
use crate::postgres::errors::{db_err, is_lock_timeout, row_count};
use crate::postgres::sql;
use crate::{Error, Mode, Result};

/// The key an upgrader of `key` holds while it waits: a `bigint` key with
/// the high bit set, mixed from `key` (splitmix64's finaliser), so that no
/// name's key (two non-negative `int4`s) is ever one.
pub(crate) fn intent_key(key: &PgKey) -> PgKey {
    let mut x = match *key {
        PgKey::Pair(a, b) => (u64::from(a as u32) << 32 | u64::from(b as u32)) ^ 0x6462_6d75_7465_7821,
        PgKey::Big(v) => v as u64 ^ 0x7570_6772_6164_6521,
    };
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    PgKey::Big((x | 1 << 63) as i64)
}

pub(crate) struct PgUpgrade {
    /// The shared lock's session, key and name, in exclusive mode.
    lock: SessionLock,
    in_process: bool,
}

impl PgUpgrade {
    /// For a session lock held `shared` on its session; `None` for an
    /// exclusive one (nothing to upgrade).
    pub(crate) fn of(shared: &SessionLock, in_process: bool) -> Option<Arc<dyn Upgrade>> {
        if shared.mode != Mode::Shared {
            return None;
        }
        Some(Arc::new(PgUpgrade {
            lock: SessionLock {
                mode: Mode::Exclusive,
                ..shared.clone()
            },
            in_process,
        }))
    }
}

impl Upgrade for PgUpgrade {
    fn in_process(&self) -> bool {
        self.in_process
    }

    /// A failed try asks whether other sessions only wait in the server for
    /// the key (none holds it): the server refuses this session's
    /// exclusive *try* while a waiter is queued, but grants its blocking
    /// request at once (a session that holds the key goes ahead of waiters
    /// that wait for it), so that is no deadlock: the blocking request is
    /// sent, bounded by a short `lock_timeout` in case the queue changed.
    fn try_exclusive(&self) -> BoxFuture<Result<bool>> {
        let lock = self.lock.clone();
        Box::pin(async move {
            let (lock, got) = lock.try_lock().await;
            if got? {
                return Ok(true);
            }
            match super::introspect::only_waited_for(&lock.conn, &lock.key).await {
                Ok(false) => Ok(false),
                Ok(true) => ahead_of_waiters(lock).await,
                Err(e) => Err(crate::postgres::errors::db_err(e, &lock.name)),
            }
        })
    }

    fn unlock_exclusive(&self, after: Box<dyn Send + Sync>) -> BoxFuture<Result<()>> {
        let lock = self.lock.clone();
        // On the session's runtime, at once: the exclusive lock goes even if
        // nobody awaits the answer, and the in-process half after it.
        let task = self.lock.conn.runtime.spawn(async move {
            let r = lock.unlock().await;
            drop(after);
            r
        });
        Box::pin(async move {
            task.await
                .unwrap_or_else(|_| Err(Error::Database("the unlock task ended unexpectedly".into())))
        })
    }

    fn loss(&self) -> LossToken {
        LossToken::of(self.lock.conn.lost_signal())
    }

    fn claim(&self) -> BoxFuture<Result<Option<Box<dyn Send + Sync>>>> {
        let intent = SessionLock {
            key: intent_key(&self.lock.key),
            ..self.lock.clone()
        };
        Box::pin(async move {
            let (intent, got) = intent.try_lock().await;
            if !got? {
                return Ok(None);
            }
            Ok(Some(
                Box::new(Undo::with(intent, SessionLock::spawn_unlock)) as Box<dyn Send + Sync>
            ))
        })
    }
}

/// The bound of [`ahead_of_waiters`]' request: granted at once when only
/// waiters are queued; anything longer means the queue changed.
const AHEAD: Duration = Duration::from_millis(200);

/// A blocking exclusive request of the shared lock's session, with
/// `lock_timeout` set for it only (one implicit transaction); `false` when
/// it timed out. Run to its end on the session's runtime, so that a
/// dropped upgrade gives back a lock the request took.
async fn ahead_of_waiters(lock: SessionLock) -> Result<bool> {
    let wait = sql::BoundedWait {
        xact: false,
        mode: Mode::Exclusive,
        key: &lock.key,
        claim: Some(lock.conn.owner()),
        comment: Some(&lock.name),
        within: sql::Within::Autocommit,
        form: sql::Form::Inline(Deadline::after(Some(AHEAD))),
    };
    let (sql, rows) = (wait.text(), wait.rows());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let runtime = lock.conn.runtime.clone();
    runtime.spawn(async move {
        let r = match lock.conn.client.simple_query(&sql).await {
            Ok(msgs) if row_count(&msgs) == rows => Ok(true),
            Ok(_) => Err(Error::Unsupported(super::pooler::SESSION_LOCKS_UNSAFE.into())),
            Err(e) if is_lock_timeout(&e) => Ok(false),
            Err(e) => Err(db_err(e, &lock.name)),
        };
        if let Err(Ok(true)) = tx.send(r) {
            lock.spawn_unlock(); // nobody waits for it any more
        }
    });
    rx.await
        .unwrap_or_else(|_| Err(Error::Database("the upgrade task ended unexpectedly".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent_keys_are_no_names_keys_and_differ_per_key() {
        let keys = [
            PgKey::Pair(0, 0),
            PgKey::Pair(1, 0),
            PgKey::Pair(0, 1),
            PgKey::Big(0),
            PgKey::Big(-1),
        ];
        let intents: std::collections::BTreeSet<_> = keys.iter().map(intent_key).collect();
        assert_eq!(intents.len(), keys.len());
        for k in intents {
            assert!(matches!(k, PgKey::Big(v) if v < 0), "{k:?}");
        }
    }
}
