//! Transaction-level locks: on a dedicated connection for the
//! [`Locker`](crate::Locker), and [`lock_xact`] inside a transaction the
//! caller owns.

use tokio_postgres::GenericClient;

use super::caller::client::Tp;
use super::caller::procedure::{acquire, Request, SESSION_OF_ANOTHER};
use super::caller::{NotAcquired, XactLock};
use super::conn::PgConn;
use super::errors::{db_err, first_bool, is_lock_timeout, row_count};
use super::sql::{self, BoundedWait, Call, Form, Within};
use crate::core::wait::{self, Deadline};
use crate::key::{PgKey, Prefix};
use crate::{Error, LockName, LockOptions, Result, WaitStrategy};

/// `pg_try_advisory_xact_lock*` in the open transaction of `c`, retried
/// with backoff until `deadline`. `owner` is the session's claim token
/// (empty: the caller's own connection, not claimed); `comment`: whether
/// the statement carries the name.
async fn poll_xact<C: GenericClient + Sync>(
    c: &C,
    name: &LockName,
    key: PgKey,
    opts: &LockOptions,
    deadline: Deadline,
    owner: &str,
    comment: bool,
) -> Result<bool> {
    let (sql, params) = sql::bound(Call::Try, true, opts.mode, &key, comment.then_some(name), owner);
    let got = wait::poll_until(deadline, opts.max_backoff, None, || async {
        let rows = c
            .query_typed(&sql, &params.as_typed())
            .await
            .map_err(|e| db_err(e, name))?;
        if rows.is_empty() {
            return Err(Error::Unsupported(SESSION_OF_ANOTHER.into()));
        }
        Ok(first_bool(&rows)?.then_some(()))
    })
    .await?;
    Ok(got.is_some())
}

/// A transaction-level lock inside a transaction opened on a dedicated
/// connection, until `deadline` (once it has passed, one try).
pub(crate) async fn wait_xact_dedicated(
    conn: &PgConn,
    name: &LockName,
    key: PgKey,
    opts: &LockOptions,
    deadline: Deadline,
    comment: bool,
) -> Result<bool> {
    let c = &conn.client;
    if opts.strategy == WaitStrategy::Poll || deadline.passed() {
        c.batch_execute("BEGIN").await.map_err(|e| db_err(e, name))?;
        return poll_xact(c, name, key, opts, deadline, conn.owner(), comment).await;
    }
    let wait = BoundedWait {
        xact: true,
        mode: opts.mode,
        key: &key,
        claim: Some(conn.owner()),
        comment: comment.then_some(name),
        within: Within::NewTransaction,
        form: Form::Inline(deadline),
    };
    // A timeout aborts the transaction, and its locks with it: no race.
    match c.simple_query(&wait.text()).await {
        Ok(msgs) if row_count(&msgs) == wait.rows() => Ok(true),
        Ok(_) => Err(Error::Unsupported(SESSION_OF_ANOTHER.into())),
        Err(e) if is_lock_timeout(&e) => Ok(false),
        Err(e) => Err(db_err(e, name)),
    }
}

/// Takes a transaction-level advisory lock (`pg_advisory_xact_lock*`) inside
/// a transaction you own; it is released when that transaction ends.
/// `Ok(Ok(XactLock))`: held; `Ok(Err(NotAcquired))`: the wait ended without
/// the lock (the `Result` is `#[must_use]`: ignoring it is a warning).
///
/// - [`WaitStrategy::Poll`] retries `pg_try_advisory_xact_lock*` with backoff.
/// - [`WaitStrategy::Server`] and the default [`WaitStrategy::TryThenServer`]
///   wait in the server (deadlock detection
///   included) inside a savepoint, with `lock_timeout` set for the wait only.
///   Afterwards — acquired, timed out, or deadlocked — `lock_timeout` reads as
///   it did before and the transaction is usable: a timeout returns
///   `Ok(Err(NotAcquired))`, a deadlock [`Error::Deadlock`].
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
    let name = name.into();
    let r = Request::xact(&name, opts, prefix)?;
    let key = r.key;
    if !acquire(&mut Tp(tx.client()), &r).await? {
        return Ok(Err(NotAcquired));
    }
    Ok(Ok(XactLock::new(name, key)))
}
