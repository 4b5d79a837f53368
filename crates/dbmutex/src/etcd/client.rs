//! Requests to etcd: their errors as dbmutex's, and the retry that
//! carries a request past a dead or leaderless member.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, GetResponse, Txn, TxnResponse};

use crate::settings::Settings;

use crate::{Error, Result};

/// An etcd client error: unreachable members are [`Error::Connect`] (the
/// core then waits for them until the acquisition's deadline), anything
/// else [`Error::Database`].
pub(super) fn etcd_err(e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    match &e {
        E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) | E::WatchError(_) => {
            Error::Connect(Box::new(e))
        }
        // gRPC's Cancelled (1), Unknown (2), DeadlineExceeded (4) and
        // Unavailable (14): the member is gone or cut off.
        E::GRpcStatus(s) if matches!(i32::from(s.code()), 1 | 2 | 4 | 14) => Error::Connect(Box::new(e)),
        // NotFound (5): the lease is gone (see `is_lease_gone`): the session
        // is over, and the core tries again on a new one.
        E::GRpcStatus(s) if i32::from(s.code()) == 5 => Error::Connect(Box::new(e)),
        // A connection etcd closed for its pings (a quiet watch's
        // connection, pinged every keep-alive): the request goes again.
        E::GRpcStatus(_) if format!("{e:?}").contains("too_many_pings") => Error::Connect(Box::new(e)),
        _ => Error::Database(Box::new(e)),
    }
}

/// The client's connection options: the connect timeout, and an HTTP/2
/// ping every `keepalive` (which finds a member that went silent, so that
/// requests stop going to it) while a request or watch is open, never on
/// an idle connection: etcd answers pings on a connection without streams,
/// or more often than every 5 s without data in between
/// (`--grpc-keepalive-min-time`), with `GOAWAY too_many_pings` after the
/// third, which once failed a fleet worker's lock request.
pub(super) fn options(settings: &Settings) -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(settings.connect_timeout)
        .with_keep_alive(
            settings.keepalive,
            settings.keepalive.max(Duration::from_millis(500)),
        )
        .with_keep_alive_while_idle(false)
}

/// How long one try of a request may take before it is tried again.
pub(super) const TRY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs `call` (one idempotent etcd request) again while it fails only
/// because the member it went to is unreachable or does not answer within
/// [`TRY_TIMEOUT`] (a follower holds a request for a dead leader for
/// seconds): the client spreads requests over every member, a dead one
/// included, so the next try likely reaches a live one. At most 8 tries.
pub(super) async fn retried<T, F, R>(mut call: F) -> Result<T>
where
    F: FnMut() -> R,
    R: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let mut pause = std::time::Duration::from_millis(10);
    let mut tries = 1;
    loop {
        let answer = tokio::time::timeout(TRY_TIMEOUT, call()).await;
        match answer
            .unwrap_or_else(|_| Err(etcd_client::Error::IoError(std::io::ErrorKind::TimedOut.into())))
            .map_err(etcd_err)
        {
            Err(Error::Connect(e)) if tries < 8 => {
                tracing::debug!(error = %e, "dbmutex: an etcd member did not answer; trying another");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(250));
                tries += 1;
            }
            r => return r,
        }
    }
}

/// What a delete found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Deleted {
    /// This call deleted the key.
    Now,
    /// The key was gone before this call.
    Gone,
    /// The key was gone when a retry got there: either it was gone before,
    /// or an earlier try whose answer was lost (a timeout right after a
    /// partition heals) deleted it.
    GoneOnRetry,
}

/// Deletes `key` (retried while a member is unreachable).
pub(super) async fn delete(client: &Client, key: &str) -> Result<Deleted> {
    let mut tries = 0;
    let deleted = retried(|| {
        tries += 1;
        let mut kv = client.kv_client();
        async move { kv.delete(key, None).await }
    })
    .await?
    .deleted();
    Ok(match (deleted, tries) {
        (1.., _) => Deleted::Now,
        (_, 1) => Deleted::Gone,
        _ => Deleted::GoneOnRetry,
    })
}

/// Whether `lease` is still alive (not revoked, not expired).
pub(super) async fn lease_alive(client: &Client, lease: i64) -> Result<bool> {
    retried(|| {
        let mut lc = client.lease_client();
        async move { lc.time_to_live(lease, None).await }
    })
    .await
    .map(|r| r.ttl() > 0)
}

/// Whether `e` is etcd saying a lease is gone (revoked or expired): a put
/// with it answers gRPC NotFound, "requested lease not found".
pub(super) fn is_lease_gone(e: &Error) -> bool {
    matches!(e, Error::Connect(b) if matches!(
        b.downcast_ref::<etcd_client::Error>(),
        Some(etcd_client::Error::GRpcStatus(s)) if i32::from(s.code()) == 5
    ))
}

/// Runs `txn` (retried while a member is unreachable: every transaction
/// here may run twice).
pub(super) async fn txn(client: &Client, txn: Txn) -> Result<TxnResponse> {
    retried(|| {
        let (mut kv, txn) = (client.kv_client(), txn.clone());
        async move { kv.txn(txn).await }
    })
    .await
}

/// Reads `key` with `opts` (retried while a member is unreachable).
pub(super) async fn get(client: &Client, key: &str, opts: GetOptions) -> Result<GetResponse> {
    retried(|| {
        let (mut kv, opts) = (client.kv_client(), opts.clone());
        async move { kv.get(key, Some(opts)).await }
    })
    .await
}

/// A session that ended under an acquisition: as a lost connection, so the
/// core tries again (on a new lease) until the acquisition's deadline.
pub(super) fn session_over(why: &str) -> Error {
    Error::Connect(why.into())
}
