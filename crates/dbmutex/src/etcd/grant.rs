//! A held etcd lock: its key, deleted on release or drop; its create
//! revision is the fencing token.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::watch;

use super::client::{self, Deleted};
use super::session::Session;
use crate::core::arbiter::Hold;
use crate::core::detach::Undo;
use crate::core::guard::{releasing, BoxFuture, DelayRecord, Grant, OnSession, Releasing, RELEASES};
use crate::core::loss::LossToken;
use crate::runs::{RunStart, Who};
use crate::{Error, Result};

/// One held lock: the key that heads its queue.
pub(super) struct EtcdGrant {
    /// Dropped armed, the key is deleted in the background.
    release: Undo<Held>,
    /// The key's create revision: cluster-wide monotonic.
    revision: i64,
    /// Turns `true` when the lock is lost: its session ended, or someone
    /// else deleted its key.
    lost: watch::Receiver<bool>,
}

/// What deleting the key needs.
pub(super) struct Held {
    pub(super) client: Client,
    pub(super) key: String,
    pub(super) runtime: tokio::runtime::Handle,
    /// Kept so the lease outlives the key.
    pub(super) session: Arc<Session>,
    /// The in-process hold: given back once the key is deleted, so the
    /// next request of this locker for the name waits for that delete
    /// instead of queueing behind its own old key.
    pub(super) hold: Option<Hold<String>>,
}

impl EtcdGrant {
    pub(super) fn new(held: Held, revision: i64) -> Self {
        EtcdGrant {
            lost: held.session.held.add(&held.key),
            revision,
            release: Undo::with(held, spawn_delete),
        }
    }
}

/// Deletes the key in the background (a dropped guard, a cancelled
/// release): on the runtime the lock was taken on, so none is needed here.
/// With that runtime gone, the session revokes its lease when its last
/// user goes (see `session`).
pub(super) fn spawn_delete(mut held: Held) {
    held.session.held.remove(&held.key);
    if let Some(h) = held.hold.as_mut() {
        h.releasing();
    }
    let runtime = held.runtime.clone();
    drop(runtime.spawn(delete_until_done(held)));
}

/// Deletes the key, again every second while etcd cannot be reached, until
/// it is deleted or its session is over (the lease then takes the key).
pub(super) async fn delete_until_done(held: Held) {
    let mut ended = held.session.ended();
    loop {
        match client::delete(&held.client, &held.key).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "dbmutex: etcd unlock failed; retrying until the lease ends")
            }
        }
        tokio::select! {
            () = super::session::over(&mut ended) => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

impl Grant for EtcdGrant {
    /// Deletes the key; if etcd does not confirm it, the delete goes on in
    /// the background until it succeeds or the lease ends.
    fn release(mut self: Box<Self>) -> Releasing {
        let mut held = self.release.take().expect("held until released");
        held.session.held.remove(&held.key);
        if let Some(h) = held.hold.as_mut() {
            h.releasing();
        }
        let lost = self.lost.clone();
        releasing(&RELEASES, move || async move {
            // Cancelled midway, the delete goes on in the background.
            let mut again = Undo::with(held, spawn_delete);
            let (c, key, lease) = again
                .peek(|h| (h.client.clone(), h.key.clone(), h.session.lease))
                .expect("armed");
            let r = client::delete(&c, &key).await;
            if r.is_ok() {
                again.disarm();
            }
            let gone = || {
                Err(Error::LockLost {
                    name: "an etcd lock whose key was gone at release (lease revoked or key deleted)".into(),
                })
            };
            match r? {
                Deleted::Now => Ok(()),
                // Nothing to delete: someone else did (a revoked lease, a
                // deleted key) while it was held, which the holder must hear.
                Deleted::Gone => gone(),
                // A retry found nothing: our first try may have deleted it
                // with its answer lost. It was ours if the lease still lives
                // (no expiry or revoke took it) and no check found it
                // deleted by another client while held.
                Deleted::GoneOnRetry if *lost.borrow() => gone(),
                Deleted::GoneOnRetry => match client::lease_alive(&c, lease).await? {
                    true => Ok(()),
                    false => gone(),
                },
            }
        })
    }

    fn loss(&self) -> LossToken {
        LossToken::of(self.lost.clone())
    }

    fn on_session(&self) -> Option<&dyn OnSession> {
        Some(self)
    }
}

impl OnSession for EtcdGrant {
    /// The key's create revision: etcd's revision counter only goes up, in
    /// the whole cluster and across leader changes, and the key was
    /// created after every earlier holder's (or it would have waited for
    /// them): no write is needed.
    fn fence(&self, _key: String) -> BoxFuture<Result<u64>> {
        let token = match *self.lost.borrow() {
            false => Ok(self.revision as u64),
            true => Err(Error::LockLost {
                name: "an etcd lock whose lease ended or whose key was deleted".into(),
            }),
        };
        Box::pin(std::future::ready(token))
    }

    fn start_run(&self, _window: Duration, _who: Who) -> BoxFuture<Result<RunStart>> {
        Box::pin(std::future::ready(Err(unsupported("once-per-window runs"))))
    }

    fn finish_run(&self, _run: u64, _exit_code: Option<i32>) -> BoxFuture<Result<()>> {
        Box::pin(std::future::ready(Err(unsupported("once-per-window runs"))))
    }

    fn delay(&self, _key: String) -> DelayRecord {
        Arc::new(|_| Box::pin(std::future::ready(Err(unsupported("lock-delay")))))
    }
}

/// The refusal for what the etcd backend does not record yet.
fn unsupported(what: &str) -> Error {
    Error::Unsupported(format!(
        "{what}: not available on the etcd backend yet (it keeps no records beside its lock keys)"
    ))
}
