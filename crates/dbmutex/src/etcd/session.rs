//! The session: one lease per locker, kept alive by a background task,
//! that every key this locker puts is attached to. When etcd says the
//! lease is gone, or no keep-alive has been answered for half its TTL, the
//! session is over: every lock on it is reported lost, and the next
//! acquisition grants a new lease.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::watch;
use tokio::time::Instant;

use super::client::{etcd_err, TRY_TIMEOUT};
use super::held::HeldKeys;
use crate::core::detach::Undo;
use crate::Result;

/// One lease and the task that keeps it alive.
pub(crate) struct Session {
    /// The lease id every key of this session is attached to.
    pub(super) lease: i64,
    /// Turns `true` when the session is over.
    ended: watch::Receiver<bool>,
    /// Ends it from outside the keep-alive task.
    end: watch::Sender<bool>,
    /// The keys it holds locks with, checked for deletion by others.
    pub(super) held: Arc<HeldKeys>,
    /// Stops the keep-alive task and revokes the lease (in the
    /// background) once nothing uses the session any more.
    _end: Undo,
}

/// A lease's TTL and keep-alive period, from the locker's settings.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    /// The lease's TTL: the server frees a silent session's locks this
    /// long after the last keep-alive it received.
    pub(super) ttl: Duration,
    /// How often a keep-alive is sent.
    pub(super) every: Duration,
}

impl Timing {
    /// TTL = `dead_peer_timeout` in whole seconds (at least 2 s, etcd's
    /// floor for a lease); a keep-alive every `keepalive`, at most a third
    /// of the TTL.
    pub(super) fn new(dead_peer_timeout: Duration, keepalive: Duration) -> Self {
        let ttl = Duration::from_secs(dead_peer_timeout.as_secs_f64().ceil().max(2.0) as u64);
        Timing {
            ttl,
            every: keepalive.min(ttl / 3),
        }
    }

    /// How long without an answered keep-alive before the holder is told:
    /// half the TTL, counted from when the last answered one was sent, so
    /// the holder is told before the server can free its locks.
    pub(super) fn holder_bound(&self) -> Duration {
        self.ttl / 2
    }
}

impl Session {
    /// Grants a lease and starts keeping it alive.
    /// `endpoints` are the members' URLs, for a revoke after the runtime
    /// is gone.
    pub(super) async fn start(client: &Client, timing: Timing, endpoints: Vec<String>) -> Result<Session> {
        let mut lc = client.lease_client();
        let granted = lc
            .grant(timing.ttl.as_secs() as i64, None)
            .await
            .map_err(etcd_err)?;
        let lease = granted.id();
        let (tx, ended) = watch::channel(false);
        let held = Arc::new(HeldKeys::default());
        let end = tx.clone();
        let task = tokio::spawn(keep_alive(client.clone(), lease, timing, tx, held.clone()));
        let checks = tokio::spawn(check_held(client.clone(), lease, timing, held.clone()));
        let revoke_client = client.clone();
        let runtime = tokio::runtime::Handle::current();
        let alive = ended.clone();
        let stop = Undo::new(move || {
            // The keep-alive task gone with the session still on: its
            // runtime has shut down (and the client's connections with it).
            let runtime_gone = alive.has_changed().is_err() && !*alive.borrow();
            task.abort();
            checks.abort();
            // Frees the session's keys at once instead of after the TTL.
            if runtime_gone {
                drop(std::thread::spawn(move || {
                    revoke_without_runtime(endpoints, lease)
                }));
            } else {
                let mut lc = revoke_client.lease_client();
                drop(runtime.spawn(async move {
                    let _ = lc.revoke(lease).await;
                }));
            }
        });
        tracing::debug!(
            lease = format_args!("{lease:x}"),
            ttl_s = timing.ttl.as_secs(),
            "dbmutex: etcd lease granted"
        );
        Ok(Session {
            lease,
            ended,
            end,
            held,
            _end: stop,
        })
    }

    /// Whether the session is over.
    pub(super) fn is_over(&self) -> bool {
        *self.ended.borrow()
    }

    /// Ends the session now (etcd said its lease is gone): its locks are
    /// lost, and the next acquisition grants a new lease.
    pub(super) fn end(&self, why: &str) {
        if !self.is_over() {
            tracing::warn!(
                lease = format_args!("{:x}", self.lease),
                why,
                "dbmutex: etcd session over; its locks are lost"
            );
        }
        self.held.end();
        let _ = self.end.send(true);
    }

    /// A receiver that turns `true` when the session is over.
    pub(super) fn ended(&self) -> watch::Receiver<bool> {
        self.ended.clone()
    }
}

/// Revokes `lease` from a thread of its own, with a runtime and a client
/// of its own: for a session whose runtime has shut down. Bounded by 5 s;
/// if it fails, the lease expires within its TTL.
fn revoke_without_runtime(endpoints: Vec<String>, lease: i64) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return;
    };
    rt.block_on(async {
        let revoke = async {
            let client = Client::connect(endpoints, None).await?;
            client.lease_client().revoke(lease).await
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), revoke).await;
    });
}

/// Completes when the session is over (or its keep-alive task is gone).
pub(super) async fn over(ended: &mut watch::Receiver<bool>) {
    let _ = ended.wait_for(|over| *over).await;
}

/// Keeps `lease` alive until etcd says it is gone or no keep-alive was
/// answered within the holder's bound; then reports the session over.
async fn keep_alive(
    client: Client,
    lease: i64,
    timing: Timing,
    ended: watch::Sender<bool>,
    held: Arc<HeldKeys>,
) {
    let mut alive_until = Instant::now() + timing.holder_bound();
    let mut stream = None;
    let why = loop {
        let sent = Instant::now();
        if sent >= alive_until {
            break "no keep-alive answered within half the lease's TTL";
        }
        let round = async {
            if stream.is_none() {
                stream = Some(client.lease_client().keep_alive(lease).await?);
            }
            let (keeper, answers) = stream.as_mut().expect("just opened");
            keeper.keep_alive().await?;
            answers.message().await
        };
        // One round at most TRY_TIMEOUT: a member that holds it (a follower
        // of a dead leader) is left for another on the next round.
        match tokio::time::timeout_at(alive_until.min(sent + TRY_TIMEOUT), round).await {
            Ok(Ok(Some(answer))) if answer.ttl() <= 0 => break "etcd says the lease expired or was revoked",
            Ok(Ok(Some(_))) => alive_until = sent + timing.holder_bound(),
            // A broken or slow stream: open another (to whichever member
            // answers) on the next round.
            _ => stream = None,
        }
        tokio::time::sleep_until((sent + timing.every).min(alive_until)).await;
    };
    tracing::warn!(
        lease = format_args!("{lease:x}"),
        why,
        "dbmutex: etcd session over; its locks are lost"
    );
    held.end();
    let _ = ended.send(true);
}

/// Once a keep-alive period, looks for held keys deleted by someone else
/// (see `held`); ends with the session's tasks.
async fn check_held(client: Client, lease: i64, timing: Timing, held: Arc<HeldKeys>) {
    loop {
        tokio::time::sleep(timing.every).await;
        held.check(&client, lease).await;
    }
}
