//! Locks on a tokio-postgres connection the caller owns: a session lock on
//! a `Client` ([`lock_session`]), a transaction lock in a `Transaction`
//! ([`lock_xact`]).

use std::future::Future;
use std::task::{Context, Poll, Waker};

use tokio_postgres::{Client, SimpleQueryMessage};

use super::guard::{Pending, Taken, Undo};
use super::procedure::{acquire, unlock, unlock_sql, Exec, Request};
use super::{NotAcquired, XactLock};
use crate::key::{PgKey, Prefix};
use crate::postgres::errors::{failure, Failure};
use crate::{LockName, LockOptions, Mode, Result};

/// A tokio-postgres client of the caller's that dbmutex can take session
/// locks on. Pool objects deref to a `Client` (`&**deadpool_object`,
/// `&*bb8_connection`).
///
/// Not implemented for a `Transaction`: a session lock taken in a
/// transaction block outlives it, and once the transaction is aborted
/// (any failed statement) its unlock fails too, so the client would go
/// back to its pool locked. Inside a transaction, take
/// [`lock_xact`]: its end releases the lock.
///
/// ```compile_fail
/// # async fn demo(tx: &tokio_postgres::Transaction<'_>) {
/// use dbmutex::{postgres::lock_session, LockOptions, Prefix};
/// // A session lock in a transaction: refused at compile time.
/// let _ = lock_session(tx, "ledger-42", &LockOptions::new(), &Prefix::none()).await;
/// # }
/// ```
pub trait CallerClient: Sync {
    /// The client that sends the statements.
    fn client(&self) -> &Client;
}

impl CallerClient for Client {
    fn client(&self) -> &Client {
        self
    }
}

/// A tokio-postgres client as an [`Exec`].
struct Tp<'a>(&'a Client);

impl Exec for Tp<'_> {
    async fn batch(&mut self, sql: &str) -> std::result::Result<Vec<Option<String>>, Failure> {
        let msgs = self.0.simple_query(sql).await.map_err(failure)?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
                _ => None,
            })
            .collect())
    }
}

/// A session lock being taken on a caller's client, as a [`Pending`]
/// acquisition's connection: cut short between "a statement that may take
/// the lock was sent" and "its answer said no", it queues the unlock behind
/// that statement, so the session holds nothing afterwards. Exact under
/// re-entrancy: the unlock is queued only when a lock statement was sent,
/// and the server runs that statement before it.
struct Taking<'a> {
    tp: Tp<'a>,
    r: &'a Request<'a>,
}

impl Exec for Taking<'_> {
    fn batch<'a>(
        &'a mut self,
        sql: &'a str,
    ) -> impl Future<Output = std::result::Result<Vec<Option<String>>, Failure>> + Send + 'a {
        self.tp.batch(sql)
    }
}

impl Undo for Taking<'_> {
    fn undo(self, may_hold: bool) {
        if may_hold {
            queue_unlock(self.tp.0, &self.r.key, self.r.opts.get_mode(), &self.r.name);
        }
    }
}

/// Sends the unlock of a session lock without waiting for its answer.
fn queue_unlock(client: &Client, key: &PgKey, mode: Mode, name: &LockName) {
    // tokio-postgres sends a request when its future is first polled; the
    // answer is discarded once the future is gone, and the client runs
    // every later request after it.
    let sql = unlock_sql(key, mode);
    let fut = std::pin::pin!(client.batch_execute(&sql));
    if let Poll::Ready(Err(e)) = fut.poll(&mut Context::from_waker(Waker::noop())) {
        // The connection is closed: the server has ended the session and
        // its locks with it.
        tracing::debug!(error = %e, lock = %name, "dbmutex: unlock on a closed client");
    }
}

/// Takes a session-level advisory lock on a connection you own, with the
/// same names, keys, timeouts, shared mode and deadlock error as a
/// [`Locker`](crate::Locker). `Ok(Err(NotAcquired))`: the wait ended
/// without the lock (the same shape as every own-connection call).
///
/// - Waits as [`LockOptions`] says: try once, then (by default) wait in the
///   server's queue with `lock_timeout` set to what is left of the timeout
///   for that wait only (the connection's settings read as before
///   afterwards), or poll ([`WaitStrategy::Poll`](crate::WaitStrategy::Poll)).
/// - Re-entrancy is the server's: a session that holds the lock gets it
///   again at once, and each guard gives back one hold.
/// - The guard borrows the client, so the pool object it came from cannot
///   go back to its pool while the lock is held. Dropping the guard sends
///   the unlock at once, on the spot (no task, no runtime needed): the
///   client queues it ahead of any statement sent after, so the next user
///   of the connection finds the lock released.
/// - [`LockOptions::transaction`] is refused here ([`Error::Config`](crate::Error::Config)): use
///   [`lock_xact`], as inside any transaction
///   (see [`CallerClient`]). A `BEGIN` you send yourself on the client is
///   yours to watch: a guard released while that transaction is aborted
///   reports the error and the lock stays until the session ends.
/// - Behind a transaction pooler a session lock does not hold; the guard's
///   [`release`](ClientLockGuard::release) then reports
///   [`Error::LockLost`](crate::Error::LockLost).
///
/// ```no_run
/// # async fn demo(client: &tokio_postgres::Client) -> Result<(), dbmutex::Error> {
/// use dbmutex::{postgres::lock_session, LockOptions, Prefix};
/// use std::time::Duration;
/// let opts = LockOptions::new().timeout(Duration::from_secs(2));
/// if let Ok(guard) = lock_session(client, "ledger-42", &opts, &Prefix::from_env()).await? {
///     client.execute("UPDATE ledger SET n = n + 1 WHERE id = 42", &[]).await
///         .map_err(|e| dbmutex::Error::Database(e.into()))?;
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Cancel-safe: if the future is dropped while a lock statement is in
/// flight, the unlock is queued behind it on the client, so whatever the
/// statement did, the session holds no lock from this call afterwards and
/// the client can go back to its pool. (The client still runs the
/// abandoned statement first: a cancelled wait without a timeout keeps
/// the client busy until the lock is granted, then gives it back.)
pub async fn lock_session<'c, C: CallerClient + ?Sized>(
    conn: &'c C,
    name: impl Into<LockName>,
    opts: &LockOptions,
    prefix: &Prefix,
) -> Result<std::result::Result<ClientLockGuard<'c>, NotAcquired>> {
    let r = Request::session(name.into(), opts, prefix, false, "postgres::lock_xact")?;
    let client = conn.client();
    let mut taking = Pending::new(Taking {
        tp: Tp(client),
        r: &r,
    });
    if !acquire(&mut taking, &r).await? {
        return Ok(Err(NotAcquired));
    }
    taking.done(); // the guard takes the hold over
    Ok(Ok(ClientLockGuard {
        client,
        lock: Taken::of(r),
        held: true,
    }))
}

/// A session lock held on a caller's tokio-postgres client (see
/// [`lock_session`]). Give it back with [`release`](Self::release) to learn
/// whether it was still held; dropping it sends the unlock without waiting.
#[must_use = "dropping the guard releases the lock at once"]
pub struct ClientLockGuard<'c> {
    client: &'c Client,
    lock: Taken,
    held: bool,
}

impl ClientLockGuard<'_> {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.lock.name
    }

    /// The PostgreSQL key the name maps to.
    pub fn key(&self) -> PgKey {
        self.lock.key
    }

    /// Unlocks and waits for the answer: [`Error::LockLost`](crate::Error::LockLost) if the session
    /// no longer held the lock (its connection was reset, or a pooler moved
    /// it).
    pub async fn release(mut self) -> Result<()> {
        self.held = false;
        let lock = &self.lock;
        unlock(&mut Tp(self.client), &lock.key, lock.mode, &lock.name).await
    }
}

impl Drop for ClientLockGuard<'_> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        queue_unlock(self.client, &self.lock.key, self.lock.mode, &self.lock.name);
    }
}

impl std::fmt::Debug for ClientLockGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.lock.debug(f, "ClientLockGuard")
    }
}

/// Takes a transaction-level advisory lock (`pg_advisory_xact_lock*`) inside
/// a transaction you own; it is released when that transaction ends.
/// `Ok(Ok(XactLock))`: held; `Ok(Err(NotAcquired))`: the wait ended without
/// the lock (the `Result` is `#[must_use]`: ignoring it is a warning).
///
/// - [`WaitStrategy::Poll`](crate::WaitStrategy::Poll) retries
///   `pg_try_advisory_xact_lock*` with backoff.
/// - [`WaitStrategy::Server`](crate::WaitStrategy::Server) and the default
///   [`WaitStrategy::TryThenServer`](crate::WaitStrategy::TryThenServer) wait
///   in the server (deadlock detection included) inside a savepoint, with
///   `lock_timeout` set for the wait only. Afterwards — acquired, timed out,
///   or deadlocked — `lock_timeout` reads as it did before and the
///   transaction is usable: a timeout returns `Ok(Err(NotAcquired))`, a
///   deadlock [`Error::Deadlock`](crate::Error::Deadlock).
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), dbmutex::Error> {
/// use dbmutex::{postgres::lock_xact, LockOptions, Prefix, WaitStrategy};
/// use std::time::Duration;
/// let tx = client.transaction().await.map_err(|e| dbmutex::Error::Database(e.into()))?;
/// let opts = LockOptions::new().timeout(Duration::from_secs(2)).wait_strategy(WaitStrategy::Server);
/// if let Ok(_lock) = lock_xact(&tx, "ledger-42", &opts, &Prefix::from_env()).await? {
///     // ... work under the lock ...
/// }
/// tx.commit().await.map_err(|e| dbmutex::Error::Database(e.into()))?; // releases the lock
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Not cancel-safe: if the future is dropped while the server waits, the
/// transaction's state is unknown; roll it back.
pub async fn lock_xact(
    tx: &tokio_postgres::Transaction<'_>,
    name: impl Into<LockName>,
    opts: &LockOptions,
    prefix: &Prefix,
) -> Result<std::result::Result<XactLock, NotAcquired>> {
    let r = Request::xact(name.into(), opts, prefix)?;
    if !acquire(&mut Tp(tx.client()), &r).await? {
        return Ok(Err(NotAcquired));
    }
    Ok(Ok(XactLock::new(r.name, r.key)))
}
