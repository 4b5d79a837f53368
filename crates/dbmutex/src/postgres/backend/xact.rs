//! Transaction-level locks on a dedicated connection, for the
//! [`Locker`](crate::Locker): a transaction opened there, then a bounded
//! server wait or polled tries inside it.

use tokio_postgres::GenericClient;

use super::conn::PgConn;
use crate::core::wait::{self, Deadline};
use crate::key::PgKey;
use crate::postgres::errors::{db_err, first_bool, is_lock_timeout, row_count, SESSION_OF_ANOTHER};
use crate::postgres::sql::{self, BoundedWait, Call, Form, Within};
use crate::{Error, LockName, LockOptions, Result, WaitStrategy};

/// `pg_try_advisory_xact_lock*` in the open transaction of `c`, retried
/// with backoff until `deadline`. `owner` is the session's claim token
/// (empty: the connection has no claim); `comment`: whether
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
