//! The keys a session holds locks with, and the check that finds one
//! deleted by someone else (`etcdctl del`, an operator's clean-up, another
//! client): once a keep-alive period, while the session holds any lock, one
//! request asks etcd which keys are still attached to the lease; a held key
//! missing there (and then from a linearizable read of it) is a lost lock.
//! The session's end loses every key at once.

use std::collections::HashMap;
use std::sync::Mutex;

use etcd_client::{Client, GetOptions, LeaseTimeToLiveOptions};
use tokio::sync::watch;

use super::client;

/// The held keys of one session, each with the sender that reports its loss.
#[derive(Default)]
pub(super) struct HeldKeys {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    keys: HashMap<String, watch::Sender<bool>>,
    /// The session is over: every key, even one added later, is lost.
    over: bool,
}

impl HeldKeys {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key` now holds a lock; the receiver turns `true` when it is lost.
    pub(super) fn add(&self, key: &str) -> watch::Receiver<bool> {
        let mut inner = self.inner();
        let (tx, rx) = watch::channel(inner.over);
        if !inner.over {
            inner.keys.insert(key.to_owned(), tx);
        }
        rx
    }

    /// `key` is being released: its deletion from now on is ours.
    pub(super) fn remove(&self, key: &str) {
        self.inner().keys.remove(key);
    }

    /// The session is over: every held key is lost.
    pub(super) fn end(&self) {
        let mut inner = self.inner();
        inner.over = true;
        for (_, tx) in inner.keys.drain() {
            let _ = tx.send(true);
        }
    }

    /// `key` was deleted by someone else, if it is still held.
    fn lose(&self, key: &str) {
        if let Some(tx) = self.inner().keys.remove(key) {
            tracing::warn!(
                key,
                "dbmutex: an etcd lock's key was deleted by another client; the lock is lost"
            );
            let _ = tx.send(true);
        }
    }

    fn snapshot(&self) -> Vec<String> {
        self.inner().keys.keys().cloned().collect()
    }

    /// One check: every key held before it that etcd no longer attaches to
    /// `lease`, and that a linearizable read then does not find, is lost.
    /// An unanswered request checks nothing (the next period tries again).
    pub(super) async fn check(&self, client: &Client, lease: i64) {
        let held = self.snapshot();
        if held.is_empty() {
            return;
        }
        let mut lc = client.lease_client();
        let asked = lc.time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()));
        let Ok(Ok(answer)) = tokio::time::timeout(client::TRY_TIMEOUT, asked).await else {
            return;
        };
        let attached: std::collections::HashSet<&[u8]> = answer.keys().iter().map(Vec::as_slice).collect();
        for key in held.iter().filter(|k| !attached.contains(k.as_bytes())) {
            // The lease's key set may lag a put just made: read the key itself.
            let read = client::get(client, key, GetOptions::new().with_count_only()).await;
            if read.is_ok_and(|r| r.count() == 0) {
                self.lose(key);
            }
        }
    }
}
