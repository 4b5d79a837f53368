//! The etcd backend: leases and revisions (feature `etcd`), for a fleet
//! that outgrows one database primary.
//!
//! # How locks are held
//!
//! - **Session = lease.** A locker grants one lease (TTL = its
//!   [`dead_peer_timeout`](crate::LockerBuilder::dead_peer_timeout) in whole
//!   seconds, at least 2 s; 10 s by default) at its first acquisition and
//!   keeps it alive from a background task, one keep-alive every
//!   [`keepalive`](crate::LockerBuilder::keepalive) (at most a third of the
//!   TTL). Every key it puts is attached to that lease.
//! - **Queue = prefix.** A name's locks live under one key prefix (see
//!   [`key`](crate::key), "etcd"); each acquisition puts its own key
//!   `<prefix><lease>-<n>` and the key with the lowest create revision holds
//!   the lock. A waiter watches only the key just below its own for its
//!   deletion, as etcd's `concurrency.Mutex` does: first come, first served,
//!   and a release wakes exactly the next waiter. A try-once puts its key
//!   and, if another is below it, deletes it again. A timed-out wait
//!   deletes its key.
//! - **In-process first.** Tasks of one locker take the in-process hold
//!   before they put a key, and a grant gives it back only once its key is
//!   deleted: a locker never queues behind its own unlock in flight.
//! - **Release** deletes the key (and answers [`Error::LockLost`] if it
//!   was gone already: its lease revoked, or deleted by someone else); a
//!   dropped guard deletes it in the
//!   background (on the runtime it was taken on). A delete etcd does not
//!   confirm is retried every second until it is, or the lease ends. With
//!   that runtime gone, the session revokes its lease from a thread of its
//!   own when its last guard goes (else the lease expires within its TTL).
//! - **Loss.** The session is over — and every lock on it reported lost
//!   ([`LockGuard::lost`](crate::LockGuard::lost)) — when etcd answers a
//!   keep-alive with "no such lease" (revoked, or expired), within one
//!   keep-alive period of that; or when no keep-alive has been answered for
//!   half the TTL, counted from the sending of the last answered one (5 s
//!   by default). etcd frees a silent session's keys a full TTL after the
//!   last keep-alive it received, so a holder that can be told is told
//!   first. The next acquisition grants a new lease. A lock whose key
//!   someone else deleted (`etcdctl del`, another client) is reported lost
//!   on its own, within one keep-alive period: while the session holds
//!   locks, it asks etcd once a period which keys its lease still has
//!   (`held.rs`).
//! - **Fencing token** ([`LockOptions::fenced`](crate::LockOptions::fenced)):
//!   the key's create revision, which etcd's cluster-wide revision counter
//!   makes strictly greater than every earlier holder's, across leader
//!   changes; nothing is written for it.
//! - **Not here (yet):** shared locks, transaction locks, upgrade,
//!   once-per-window runs and lock-delay are [`Error::Unsupported`].
//! - **Who holds it.** A key's value notes its holder (start time, process
//!   id, application name); `holders` reads the head of a queue, `list` the
//!   heads of every queue under the URL's root.

mod client;
mod grant;
mod held;
mod introspect;
mod queue;
mod session;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use etcd_client::Client;

use crate::core::backend::{rows, Attempt, Backend, Fut, Missing, Plan, WaitIn, Waited};
use crate::key::etcd_lock_prefix;
use crate::redact::EtcdUrl;
use crate::settings::Settings;
use crate::types::ListedLock;
use crate::{Error, LockName, LockOptions, Result};
use client::etcd_err;
use session::{Session, Timing};

pub(crate) struct EtcdBackend {
    client: Client,
    /// The members' URLs (a revoke without the runtime connects anew).
    endpoints: Vec<String>,
    root: String,
    prefix: crate::Prefix,
    timing: Timing,
    /// The locker's session, granted at the first acquisition and again
    /// after one ends.
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Tells this locker's keys apart (one per acquisition).
    next: AtomicU64,
    application: String,
}

impl EtcdBackend {
    /// Connects to the members `url` names (any one that answers serves).
    pub(crate) async fn connect(url: &EtcdUrl, settings: &Settings) -> Result<Self> {
        let endpoints: Vec<String> = url.hosts.iter().map(|h| format!("http://{h}")).collect();
        let opts = client::options(settings);
        // The client connects lazily: one status call proves a member answers.
        let connect = async {
            let client = Client::connect(&endpoints, Some(opts)).await?;
            client.maintenance_client().status().await?;
            Ok::<_, etcd_client::Error>(client)
        };
        let client = tokio::time::timeout(settings.connect_timeout, connect)
            .await
            .map_err(|_| Error::Connect("no etcd member answered within the connect timeout".into()))?
            .map_err(etcd_err)?;
        Ok(EtcdBackend {
            client,
            endpoints,
            root: url.root.clone(),
            prefix: settings.prefix.clone(),
            timing: Timing::new(settings.dead_peer_timeout, settings.keepalive),
            session: tokio::sync::Mutex::new(None),
            next: AtomicU64::new(0),
            application: settings.application_name.clone(),
        })
    }

    /// The live session, granting a lease if there is none.
    async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        match slot.as_ref() {
            Some(s) if !s.is_over() => Ok(s.clone()),
            _ => {
                let s = Arc::new(Session::start(&self.client, self.timing, self.endpoints.clone()).await?);
                *slot = Some(s.clone());
                Ok(s)
            }
        }
    }
}

impl Backend for EtcdBackend {
    /// The queue's key prefix.
    type Key = String;
    type SlotExt = ();
    type Tries = Arc<Session>;

    fn refusal(&self, missing: Missing) -> Option<String> {
        let why = match missing {
            Missing::Fencing | Missing::SessionLocks => return None,
            Missing::Shared => "shared locks are not available on the etcd backend (one key queue per name admits one holder at a time); use PostgreSQL or the local backend for shared locks",
            Missing::Transaction => "transaction-level locks need PostgreSQL; etcd has no transaction that outlives a request",
            Missing::Upgrade => "the etcd backend has no shared locks to upgrade",
        };
        Some(why.into())
    }

    fn key(&self, name: &LockName) -> Result<String> {
        etcd_lock_prefix(name, &self.prefix, &self.root)
    }

    /// Every acquisition waits in etcd, in its own key, after the
    /// in-process hold (kept until the key is deleted, so a locker never
    /// queues behind its own unlock in flight).
    fn plan(&self, _opts: &LockOptions) -> Plan {
        Plan {
            hold: true,
            wait: WaitIn::Server,
        }
    }

    fn begin<'a>(&'a self, _at: &'a Attempt<'_, Self>) -> impl Fut<'a, Arc<Session>> {
        self.session()
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: see `queue::enqueue`.
    fn wait_in_server<'a>(
        &'a self,
        session: Arc<Session>,
        at: &'a mut Attempt<'_, Self>,
    ) -> impl Fut<'a, Waited<Arc<Session>>> {
        async move {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let key = format!("{}{:x}-{n:x}", at.key, session.lease);
            let note = introspect::note(&self.application);
            let hold = at.hold.take();
            match queue::enqueue(&self.client, session, at.key, key, note, at.deadline.at(), hold).await? {
                queue::Queued::Head(g) => Ok(Waited::Granted(g)),
                queue::Queued::TimedOut => Ok(Waited::TimedOut),
            }
        }
    }

    fn held<'a>(&'a self, only: Option<(&'a LockName, &'a String)>) -> impl Fut<'a, Vec<ListedLock>> {
        async move {
            match only {
                Some((name, key)) => Ok(rows(name, key, introspect::holders(&self.client, key).await?)),
                None => introspect::list(&self.client, &self.root, self.prefix.text()).await,
            }
        }
    }
}
