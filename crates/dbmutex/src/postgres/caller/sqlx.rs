//! Locks on an sqlx PostgreSQL connection (feature `sqlx`): a transaction
//! lock in an sqlx transaction ([`lock_xact`]), and a session lock on a
//! connection handed over for the hold ([`lock_session`]): a pool's
//! `PoolConnection<Postgres>` or a `PgConnection`.
//!
//! Same names, keys, timeouts, shared mode, deadlock error and re-entrancy
//! (the server's) as a [`Locker`](crate::Locker). Statements go over the
//! simple protocol: nothing is added to the connection's statement cache.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use dbmutex::postgres::sqlx::{lock_session, lock_xact};
//! use dbmutex::{LockOptions, Prefix};
//! use sqlx::Connection;
//! use std::time::Duration;
//! let (opts, prefix) = (LockOptions::new().timeout(Duration::from_secs(2)), Prefix::from_env());
//!
//! // A transaction lock: released when the transaction ends.
//! let mut tx = pool.begin().await?;
//! if let Ok(_lock) = lock_xact(&mut tx, "ledger-42", &opts, &prefix).await? {
//!     sqlx::query("UPDATE ledger SET n = n + 1 WHERE id = 42").execute(&mut *tx).await?;
//! }
//! tx.commit().await?;
//!
//! // A session lock: the guard owns the pool connection until released.
//! if let Ok(mut guard) = lock_session(pool.acquire().await?, "nightly", &opts, &prefix).await? {
//!     sqlx::query("SELECT 1").execute(&mut *guard).await?; // the app's own queries
//!     let conn = guard.release().await?; // unlocked; the connection is yours again
//!     drop(conn); // back to the pool, holding nothing
//! }
//! # Ok(()) }
//! ```

use std::future::Future;

use ::sqlx::pool::PoolConnection;
use ::sqlx::postgres::{PgConnection, Postgres};
use ::sqlx::Connection;

use super::guard::{Pending, Taken, Undo};
use super::procedure::{acquire, unlock, Exec, Request};
use super::{NotAcquired, XactLock};
use crate::key::{PgKey, Prefix};
use crate::postgres::errors::Failure;
use crate::{Error, LockName, LockOptions, Result};

/// An sqlx connection as an [`Exec`].
struct Sx<'a>(&'a mut PgConnection);

impl Exec for Sx<'_> {
    fn batch<'a>(
        &'a mut self,
        sql: &'a str,
    ) -> impl Future<Output = std::result::Result<Vec<Option<String>>, Failure>> + Send + 'a {
        fetch(self.0, sql)
    }
}

/// A connection a guard owns, as a [`Pending`] acquisition's or unlock's:
/// cut short, it ends its session instead of going back to a pool (sqlx
/// cannot queue an unlock behind a statement in flight, which may hold a
/// lock).
struct Owned<C: OwnedConnection>(C);

impl<C: OwnedConnection> Exec for Owned<C> {
    fn batch<'a>(
        &'a mut self,
        sql: &'a str,
    ) -> impl Future<Output = std::result::Result<Vec<Option<String>>, Failure>> + Send + 'a {
        fetch(self.0.pg(), sql)
    }
}

impl<C: OwnedConnection> Undo for Owned<C> {
    fn undo(self, _may_hold: bool) {
        self.0.end_session();
    }
}

/// Runs `sql` on `conn`, as [`Exec::batch`] answers.
fn fetch<'a>(
    conn: &'a mut PgConnection,
    sql: &'a str,
) -> impl Future<Output = std::result::Result<Vec<Option<String>>, Failure>> + Send + 'a {
    // Executor's own boxed future: `raw_sql(..).fetch_all(..)` in an
    // `async` block is not provably `Send` (a higher-ranked lifetime).
    let fetch = ::sqlx::Executor::fetch_all(conn, ::sqlx::raw_sql(sql));
    async move {
        use ::sqlx::Row;
        let rows = fetch.await.map_err(failure)?;
        // Simple-protocol rows are text; read the first column as such.
        Ok(rows
            .iter()
            .map(|r| r.try_get_unchecked::<Option<String>, _>(0).ok().flatten())
            .collect())
    }
}

fn failure(e: ::sqlx::Error) -> Failure {
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    let closed = matches!(
        e,
        ::sqlx::Error::Io(_)
            | ::sqlx::Error::PoolClosed
            | ::sqlx::Error::WorkerCrashed
            | ::sqlx::Error::Protocol(_)
    );
    Failure {
        code,
        closed,
        source: Box::new(e),
    }
}

/// Takes a transaction-level advisory lock in the open sqlx transaction on
/// `conn` (pass `&mut tx` or `&mut *tx`); the transaction's end releases
/// it. `Ok(Err(NotAcquired))`: the wait ended without the lock (the same
/// shape as [`lock_session`]'s). A bounded server wait runs
/// in a savepoint with `lock_timeout` set for the wait only; afterwards
/// (acquired, timed out or deadlocked) the settings read as before and the
/// transaction is usable.
///
/// [`Error::Config`] when `conn` is not in a transaction begun through
/// sqlx (`begin()`): a transaction lock outside one would end with its
/// statement.
///
/// # Cancel safety
///
/// Not cancel-safe: if the future is dropped mid-wait, roll the
/// transaction back (dropping an sqlx `Transaction` does).
pub async fn lock_xact(
    conn: &mut PgConnection,
    name: impl Into<LockName>,
    opts: &LockOptions,
    prefix: &Prefix,
) -> Result<std::result::Result<XactLock, NotAcquired>> {
    if !conn.is_in_transaction() {
        return Err(Error::Config(
            "postgres::sqlx::lock_xact needs an open transaction (begin() one and pass it)".into(),
        ));
    }
    let r = Request::xact(name.into(), opts, prefix)?;
    if !acquire(&mut Sx(conn), &r).await? {
        return Ok(Err(NotAcquired));
    }
    Ok(Ok(XactLock::new(r.name, r.key)))
}

/// An sqlx connection that a [`SessionGuard`] can own for the hold:
/// `PoolConnection<Postgres>` or `PgConnection`.
pub trait OwnedConnection: Send + 'static {
    /// The connection.
    fn pg(&mut self) -> &mut PgConnection;
    /// The connection, shared.
    fn pg_ref(&self) -> &PgConnection;
    /// Drops this value, ending its server session (and every lock on it)
    /// instead of handing it to a pool; with or without a tokio runtime.
    fn end_session(self);
}

impl OwnedConnection for PgConnection {
    fn pg(&mut self) -> &mut PgConnection {
        self
    }
    fn pg_ref(&self) -> &PgConnection {
        self
    }
    /// A dropped `PgConnection` closes its socket: the server ends the session.
    fn end_session(self) {}
}

impl OwnedConnection for PoolConnection<Postgres> {
    fn pg(&mut self) -> &mut PgConnection {
        self
    }
    fn pg_ref(&self) -> &PgConnection {
        self
    }
    fn end_session(mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.close_on_drop(); // a graceful close, on a task
            return;
        }
        // No runtime (it is gone, or this is not a runtime thread): the
        // pool's drop would spawn, and panic. Detached, the connection is
        // dropped on the spot, closing its socket.
        drop(self.detach());
    }
}

/// Takes a session-level advisory lock on `conn`, which the guard keeps for
/// the hold (so a pool cannot hand it to anyone else while it holds the
/// lock). `Ok(Err(conn))`: the wait ended without the lock, the connection
/// comes back untouched.
///
/// - The guard derefs to the `PgConnection` for the app's own queries.
/// - [`SessionGuard::release`] unlocks and gives the connection back.
/// - Dropping the guard unlocks on a task of the current tokio runtime and
///   then drops the connection (back to its pool); if the unlock fails, or
///   there is no runtime, the connection is closed instead, which ends the
///   session and its locks. (sqlx's own guard queues the unlock on the
///   connection, through an API sqlx keeps to itself.)
/// - On an error, or if this future is dropped before it finishes, the
///   connection is closed, never pooled: a statement in flight may have
///   taken the lock.
/// - [`LockOptions::transaction`] is refused here ([`Error::Config`]); use
///   [`lock_xact`].
pub async fn lock_session<C: OwnedConnection>(
    mut conn: C,
    name: impl Into<LockName>,
    opts: &LockOptions,
    prefix: &Prefix,
) -> Result<std::result::Result<SessionGuard<C>, C>> {
    let in_tx = conn.pg().is_in_transaction();
    // Checked before anything is sent: a refused name or option drops the
    // connection untouched (a pool connection goes back to its pool).
    let r = Request::session(name.into(), opts, prefix, in_tx, "postgres::sqlx::lock_xact")?;
    let mut pending = Pending::new(Owned(conn));
    if !acquire(&mut pending, &r).await? {
        return Ok(Err(pending.done().0));
    }
    Ok(Ok(SessionGuard {
        conn: Some(pending.done().0),
        lock: Taken::of(r),
    }))
}

/// A session lock held on a connection it owns (see [`lock_session`]).
#[must_use = "dropping the guard releases the lock"]
pub struct SessionGuard<C: OwnedConnection> {
    conn: Option<C>,
    lock: Taken,
}

impl<C: OwnedConnection> SessionGuard<C> {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.lock.name
    }

    /// The PostgreSQL key the name maps to.
    pub fn key(&self) -> PgKey {
        self.lock.key
    }

    /// Unlocks, waits for the answer, and gives the connection back.
    /// [`Error::LockLost`] if its session no longer held the lock (the
    /// connection was reset, or a pooler moved it); on any error the
    /// connection is closed.
    pub async fn release(mut self) -> Result<C> {
        let conn = self.conn.take().expect("held connection present");
        let mut pending = Pending::new(Owned(conn));
        let lock = &self.lock;
        unlock(&mut pending, &lock.key, lock.mode, &lock.name).await?;
        Ok(pending.done().0)
    }
}

impl<C: OwnedConnection> std::ops::Deref for SessionGuard<C> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("held connection present").pg_ref()
    }
}

impl<C: OwnedConnection> std::ops::DerefMut for SessionGuard<C> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("held connection present").pg()
    }
}

impl<C: OwnedConnection> Drop for SessionGuard<C> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let mut pending = Pending::new(Owned(conn));
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // `pending` ends the session, and its locks with it.
        };
        let (key, mode, name) = (self.lock.key, self.lock.mode, self.lock.name.clone());
        rt.spawn(async move {
            if unlock(&mut pending, &key, mode, &name).await.is_ok() {
                drop(pending.done()); // back to its pool, holding nothing
            }
        });
    }
}

impl<C: OwnedConnection> std::fmt::Debug for SessionGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.lock.debug(f, "SessionGuard")
    }
}
