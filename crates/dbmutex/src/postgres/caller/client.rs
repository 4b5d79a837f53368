//! Session locks on a tokio-postgres `Client` the caller owns.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use tokio_postgres::{Client, SimpleQueryMessage, Transaction};

use super::procedure::{acquire, unlock, unlock_sql, Exec, Request};
use crate::core::loss::LossToken;
use crate::core::metrics::Hold;
use crate::key::{PgKey, Prefix};
use crate::postgres::errors::{failure, Failure};
use crate::{LockName, LockOptions, Mode, Result};

/// A tokio-postgres connection of the caller's that dbmutex can lock on:
/// a [`Client`] or a [`Transaction`]. Pool objects deref to a `Client`
/// (`&**deadpool_object`, `&*bb8_connection`).
pub trait CallerClient: Sync {
    /// The client that sends the statements.
    fn client(&self) -> &Client;
    /// Whether statements run inside a transaction block (then a bounded
    /// wait sets `lock_timeout` in a savepoint and puts it back).
    fn in_transaction(&self) -> bool;
}

impl CallerClient for Client {
    fn client(&self) -> &Client {
        self
    }
    fn in_transaction(&self) -> bool {
        false
    }
}

impl CallerClient for Transaction<'_> {
    fn client(&self) -> &Client {
        Transaction::client(self)
    }
    fn in_transaction(&self) -> bool {
        true
    }
}

/// A tokio-postgres client as an [`Exec`].
pub(crate) struct Tp<'a>(pub(crate) &'a Client);

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

/// Takes a session-level advisory lock on a connection you own, with the
/// same names, keys, timeouts, shared mode and deadlock error as a
/// [`Locker`](crate::Locker). `Ok(None)`: the wait ended without the lock.
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
///   [`lock_xact`](crate::postgres::lock_xact).
/// - Behind a transaction pooler a session lock does not hold; the guard's
///   [`release`](ClientLockGuard::release) then reports
///   [`Error::LockLost`](crate::Error::LockLost).
///
/// ```no_run
/// # async fn demo(client: &tokio_postgres::Client) -> Result<(), dbmutex::Error> {
/// use dbmutex::{postgres::lock_session, LockOptions, Prefix};
/// use std::time::Duration;
/// let opts = LockOptions::new().timeout(Duration::from_secs(2));
/// if let Some(guard) = lock_session(client, "ledger-42", &opts, &Prefix::from_env()).await? {
///     client.execute("UPDATE ledger SET n = n + 1 WHERE id = 42", &[]).await
///         .map_err(|e| dbmutex::Error::Database(e.into()))?;
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// If the future is dropped while its statement is in flight, the session
/// may end up holding the lock with no guard: discard the connection (as
/// after any cancelled tokio-postgres query).
pub async fn lock_session<'c, C: CallerClient + ?Sized>(
    conn: &'c C,
    name: impl Into<LockName>,
    opts: &LockOptions,
    prefix: &Prefix,
) -> Result<Option<ClientLockGuard<'c>>> {
    let name = name.into();
    let r = Request::session(&name, opts, prefix, conn.in_transaction(), "postgres::lock_xact")?;
    let key = r.key;
    let client = conn.client();
    if !acquire(&mut Tp(client), &r).await? {
        return Ok(None);
    }
    Ok(Some(ClientLockGuard {
        _metrics: Hold::start(r.labels(), &LossToken::never()),
        client,
        key,
        mode: opts.get_mode(),
        name,
        held: true,
    }))
}

/// A session lock held on a caller's tokio-postgres client (see
/// [`lock_session`]). Give it back with [`release`](Self::release) to learn
/// whether it was still held; dropping it sends the unlock without waiting.
#[must_use = "dropping the guard releases the lock at once"]
pub struct ClientLockGuard<'c> {
    client: &'c Client,
    key: PgKey,
    mode: Mode,
    name: LockName,
    held: bool,
    /// Ends (dbmutex_held down) when the guard is released or dropped.
    _metrics: Hold,
}

impl ClientLockGuard<'_> {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The PostgreSQL key the name maps to.
    pub fn key(&self) -> PgKey {
        self.key
    }

    /// Unlocks and waits for the answer: [`Error::LockLost`](crate::Error::LockLost) if the session
    /// no longer held the lock (its connection was reset, or a pooler moved
    /// it).
    pub async fn release(mut self) -> Result<()> {
        self.held = false;
        unlock(&mut Tp(self.client), &self.key, self.mode, &self.name).await
    }
}

impl Drop for ClientLockGuard<'_> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        // tokio-postgres sends a request when its future is first polled;
        // the answer is discarded once the future is gone.
        let sql = unlock_sql(&self.key, self.mode);
        let fut = std::pin::pin!(self.client.batch_execute(&sql));
        if let Poll::Ready(Err(e)) = fut.poll(&mut Context::from_waker(Waker::noop())) {
            // The connection is closed: the server has ended the session
            // and its locks with it.
            tracing::debug!(error = %e, lock = %self.name, "dbmutex: unlock on a closed client");
        }
    }
}

impl std::fmt::Debug for ClientLockGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLockGuard")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}
