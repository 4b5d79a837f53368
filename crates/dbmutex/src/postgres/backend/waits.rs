//! The statements of a wait in the server on a connection of its own (see
//! [`super::dedicated`]): a lock session's one bounded-wait statement, a
//! session lock's wait on a dedicated connection, and what their outcome
//! means for the lock.

use std::sync::Arc;

use super::conn::{PgConn, Text};
use super::introspect;
use super::pooler;
use super::session_lock::SessionLock;
use super::xact::wait_xact_dedicated;
use crate::core::detach::Undo;
use crate::core::wait::Deadline;
use crate::key::PgKey;
use crate::postgres::errors::{db_err, first_bool, is_lock_timeout, row_count};
use crate::postgres::sql::{self, Call};
use crate::{Error, LockName, LockOptions, Result};

/// The wait on a dedicated connection until `deadline` (once it has
/// passed, one try), cancel-safe: if the future is dropped while a
/// statement may still run, the statement is cancelled and the session
/// closed. Of `opts`, the mode, the lock's level and the strategy count.
pub(super) async fn wait_dedicated(
    conn: &Arc<PgConn>,
    name: &LockName,
    key: PgKey,
    opts: &LockOptions,
    deadline: Deadline,
    text: Text,
    session_names: Option<bool>,
) -> Result<Got> {
    let mut abandon = Undo::with(conn.clone(), |c| c.cancel_and_close());
    let named = text == Text::Named;
    if session_names.is_some() {
        // What the claim learns (a `statement_timeout` in force) picks the
        // form below.
        claimed(conn).await?;
    } else if opts.transaction {
        // No claim on a transaction lock's connection; not a standby either.
        conn.check_not_standby().await?;
    }
    let got = match session_names {
        // A lock session's wait goes as its try does: prepared and nameless
        // on a direct connection (the name then shows in the keepalive
        // probe once granted), else with the name in a comment if names go
        // in comments (`session_names`).
        // Not while a `statement_timeout` is in force: it would cut the one
        // statement short (its timer starts before the statement's own
        // `set_config` can clear it); the batch below clears it first.
        Some(names) if !deadline.passed() && !conn.has_statement_timeout() => {
            wait_session_one(conn, name, key, opts, deadline, names && text != Text::Prepared).await
        }
        // Boxed: a lock session's wait is the common one, and these futures
        // would make every wait's larger.
        _ if opts.transaction => Box::pin(wait_xact_dedicated(conn, name, key, opts, deadline, named))
            .await
            .map(Got::made_none),
        _ => Box::pin(wait_session_dedicated(conn, name, key, opts, deadline, named))
            .await
            .map(Got::made_none),
    };
    abandon.disarm();
    got
}

/// What a wait ended with.
pub(super) enum Got {
    /// Not granted: refused, or its bound passed.
    No,
    /// Granted; with the lock's value when the wait made one (the plain
    /// wait: [`SessionLock::call`]), which the grant then takes as it is
    /// instead of copying the name again.
    Yes(Option<SessionLock>),
}

impl Got {
    fn made_none(got: bool) -> Got {
        match got {
            true => Got::Yes(None),
            false => Got::No,
        }
    }
}

/// Claims `conn`'s server session (see `conn/claim.rs`); a session lock on
/// one that another client claimed would not exclude anyone.
async fn claimed(conn: &Arc<PgConn>) -> Result<()> {
    conn.claim().await?;
    if !conn.is_claimed() {
        return Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()));
    }
    Ok(())
}

/// A lock session's wait in the server, as one statement
/// ([`sql::Form::Bound`]): with the name in a comment (parsed each time, so
/// `pg_stat_activity` shows who waits for what), or without, prepared once
/// per connection (name comments off: [`sql::bounded_wait_plain`]).
async fn wait_session_one(
    conn: &Arc<PgConn>,
    name: &LockName,
    key: PgKey,
    opts: &LockOptions,
    deadline: Deadline,
    comment: bool,
) -> Result<Got> {
    // Claimed by `wait_dedicated`, before it chose this form.
    let params = sql::Params::of(&key, conn.owner());
    // Whether the statement returned its one row (none: the claim check
    // refused it on a session that is not ours).
    let ran = if comment {
        let sql = sql::BoundedWait {
            xact: false,
            mode: opts.mode,
            key: &key,
            claim: Some(conn.owner()),
            comment: Some(name),
            within: sql::Within::Autocommit,
            form: sql::Form::Bound,
        }
        .text();
        let ms = sql::lock_timeout(deadline);
        let ms = &*ms;
        // The claim token is inlined in the text: the key, then the bound.
        let mut typed = params.key_typed();
        typed.push((&ms, tokio_postgres::types::Type::TEXT));
        conn.client
            .query_typed(&sql, &typed)
            .await
            .map(|rows| rows.len() == 1)
    } else if deadline == Deadline::NEVER && conn.has_no_lock_timeout() {
        // No bound, and no timeout in force to clear (`wait_dedicated`
        // sends none here with a `statement_timeout`): the plain wait, as
        // the lock session's try and unlock go (one body of code for the
        // three; `SessionLock::call`). Its lock, granted, is the grant's.
        let lock = SessionLock {
            conn: conn.clone(),
            key,
            mode: opts.mode,
            name: name.clone(),
            text: Text::Prepared,
        };
        let (lock, answer) = lock.call(Call::Wait).await;
        let got = settle_wait(conn, name, key, opts, answer.map(|row| row.is_some())).await?;
        return Ok(match got {
            true => Got::Yes(Some(lock)),
            false => Got::No,
        });
    } else {
        match conn.prepared_wait(opts.mode, &key).await {
            Ok(stmt) => {
                let ms = sql::lock_timeout(deadline);
                let ms = &*ms;
                // On the stack, and counted, not collected: every wait of a
                // fleet runs this.
                let (values, n) = params.key_values();
                let mut all: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [values[0], values[1], &ms];
                all[n] = &ms;
                conn.client.execute(stmt, &all[..=n]).await.map(|rows| rows == 1)
            }
            Err(e) => Err(e),
        }
    };
    settle_wait(conn, name, key, opts, ran).await.map(Got::made_none)
}

/// What a wait statement's outcome (`Ok(false)`: it ran on a session that is
/// not ours) means for the lock.
async fn settle_wait(
    conn: &Arc<PgConn>,
    name: &LockName,
    key: PgKey,
    opts: &LockOptions,
    ran: std::result::Result<bool, tokio_postgres::Error>,
) -> Result<bool> {
    match ran {
        Ok(true) => Ok(true),
        Ok(false) => {
            conn.moved();
            Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()))
        }
        // The server may grant the lock just as the timeout fires, and a
        // session lock outlives the aborted statement: ask whether we hold
        // it (then it is ours, a little late), so a spare never keeps one.
        Err(e) if is_lock_timeout(&e) => {
            match Box::pin(introspect::holds(conn, &key, opts.mode))
                .await
                .map_err(|e| db_err(e, name))?
            {
                Some(held) => Ok(held),
                None => {
                    conn.moved();
                    Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()))
                }
            }
        }
        Err(e) => Err(db_err(e, name)),
    }
}

/// A session lock on a dedicated connection, waiting in the server until
/// `deadline` (once it has passed, one try).
async fn wait_session_dedicated(
    conn: &Arc<PgConn>,
    name: &LockName,
    key: PgKey,
    opts: &LockOptions,
    deadline: Deadline,
    comment: bool,
) -> Result<bool> {
    claimed(conn).await?;
    if deadline.passed() {
        let (sql, params) = sql::bound(
            Call::Try,
            false,
            opts.mode,
            &key,
            comment.then_some(name),
            conn.owner(),
        );
        let rows = conn
            .client
            .query_typed(&sql, &params.as_typed())
            .await
            .map_err(|e| db_err(e, name))?;
        if rows.is_empty() {
            conn.moved();
            return Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()));
        }
        return first_bool(&rows);
    }
    // One round trip; the session's own settings are never touched.
    let wait = sql::BoundedWait {
        xact: false,
        mode: opts.mode,
        key: &key,
        claim: Some(conn.owner()),
        comment: comment.then_some(name),
        within: sql::Within::Autocommit,
        form: sql::Form::Inline(deadline),
    };
    let ran = conn
        .client
        .simple_query(&wait.text())
        .await
        .map(|msgs| row_count(&msgs) == wait.rows());
    settle_wait(conn, name, key, opts, ran).await
}
