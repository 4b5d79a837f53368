//! Detecting a transaction-pooling proxy (PgBouncer `pool_mode = transaction`
//! or `statement`, and poolers that behave alike) between us and PostgreSQL.
//!
//! Behind such a pooler a client's statements run on whichever server
//! session is free when a transaction starts, so a session-level advisory
//! lock stays on a server session that other clients use next: they "hold"
//! the lock too (session locks are re-entrant), and our own unlock may land
//! elsewhere and fail. Transaction-level locks in a held-open transaction
//! are safe, because the pooler pins the client to one server session until
//! the transaction ends.
//!
//! No pooler announces its mode in-band (PgBouncer answers `SHOW` only on its
//! admin console, and reports a made-up `BackendKeyData` in every mode), so
//! detection is behavioural, needs no setting from the user, and has two
//! layers:
//!
//! **The guarantee: claims, checked by every statement.** Each connection
//! marks the server session it lands on at connect with a random token in
//! the session setting `dbmutex.owner`, unless another client's token is
//! already there (then the session is shared: a pooler, or one that keeps
//! session state between clients). Every session-lock statement, unlock and
//! heartbeat carries `WHERE current_setting('dbmutex.owner', true) =
//! <token>` in the same statement, so:
//!
//! - a statement a pooler hands to another server session locks nothing
//!   there (no row comes back);
//! - the move is seen at once, and our own server session, which may still
//!   hold our locks out of reach of every later statement, is ended
//!   (`pg_terminate_backend` by pid and backend start; same role, so no
//!   privilege is needed): nothing stays orphaned, and every guard on the
//!   connection reports the loss;
//! - a transaction lock refuses a server session that another client
//!   claimed and that holds a session lock on the key (re-entrant there).
//!
//! **The hint: a check at connect**, so the common case fails early with a
//! clear message instead of at the first lock:
//!
//! 1. the lock session asks `pg_backend_pid()` → `p1`;
//! 2. a second connection opens a transaction and asks `pg_backend_pid()` →
//!    `q`, and keeps the transaction open (pinning its server session);
//! 3. the lock session asks again → `p2`; then the transaction is rolled back.
//!
//! A session of its own (direct connection, or a session-pooling proxy)
//! always gives `p1 == p2` and `q != p1`. A transaction pooler usually gives
//! itself away here (or by a failed claim); a statement pooler refuses the
//! `BEGIN` of step 2, and the connect fails naming it. What slips past this
//! check is caught by the claims above.
//!
//! **Load balancers** (pgpool-II `load_balance_mode = on`, and per
//! statement with `statement_level_load_balance = on`) send a statement
//! that calls only stable functions to a standby, where no lock is; a
//! volatile one (every lock statement, the claim, the keepalive probe's
//! `pg_is_in_recovery()`) goes to the primary. The lock session's pid
//! questions above also ask `transaction_read_only`: on after a claim that
//! found a writable primary means a standby answered, and the connect is
//! refused ([`LOAD_BALANCED`], with pgpool's settings from `PGPOOL SHOW`).
//! Weights that send some reads to the primary may let all five
//! questions miss it; the probe's routing keeps a holder from a false
//! loss then, but `status` and `list` may read the standby.

use std::time::{Duration, Instant};

use tokio_postgres::types::Type;

use super::PgConn;
use crate::postgres::errors::first_text;
use crate::settings::Settings;
use crate::{Error, Result};

/// The message of the [`Error::Unsupported`] a session lock gets behind a
/// transaction pooler.
pub(crate) const SESSION_LOCKS_UNSAFE: &str =
    "this connection goes through a transaction-pooling proxy (e.g. PgBouncer with \
     pool_mode=transaction), or a pool that hands a server session to the next client without \
     resetting it (PgBouncer server_reset_query without DISCARD ALL): server sessions are \
     shared between clients, so session-level advisory locks would not exclude anyone. Use \
     LockOptions::transaction(true), or connect to PostgreSQL directly or through a \
     session-pooling proxy that resets sessions";

/// The message of the [`Error::Unsupported`] a connection through a
/// statement-pooling proxy gets.
pub(crate) const STATEMENT_POOLING: &str =
    "this connection goes through a statement-pooling proxy (PgBouncer with pool_mode=statement), \
     which runs every statement on whichever server session is free and refuses transactions: \
     neither session nor transaction advisory locks can exclude anyone through it. Connect to \
     PostgreSQL directly, or through a pool with pool_mode=session (session locks) or \
     pool_mode=transaction (LockOptions::transaction(true))";

/// The message of the [`Error::Unsupported`] a connection through a pool
/// that keeps a closed client's advisory locks gets.
pub(crate) const RESET_KEEPS_LOCKS: &str =
    "this connection goes through a session pool that hands a server session to the next client \
     with the advisory locks of the client that left it (PgBouncer pool_mode=session with a \
     server_reset_query other than DISCARD ALL, e.g. RESET ALL, DEALLOCATE ALL or empty): a \
     holder that dies would leave its locks held for every later client. Set server_reset_query \
     = DISCARD ALL (PgBouncer's default), or connect to PostgreSQL directly";

/// How long a closed connection's advisory lock may take to go before the
/// path to the server is found to keep it. A direct backend frees it
/// within milliseconds of the close, PgBouncer's `DISCARD ALL` as fast.
pub(crate) const RELEASE_BOUND: Duration = Duration::from_secs(2);

/// Whether the closed connection's probe lock (`$1`, a random key no one
/// else takes) is free again: taken and given back at once, in one
/// statement (`CASE` orders the two; an unlock of a lock not held would
/// warn in the server's log). Only its server session can hold the key,
/// so "free" is "that session let it go". Asked so, not in `pg_locks`:
/// that view's first use in a session, and its scan of the whole lock
/// table, made this the slowest statement of a connect through NAT
/// (1.75 ms under strace; this one 0.26-0.50 ms in four traces of five,
/// about the check's other statements; BENCHMARKS.md, session 14).
const PROBE_FREE: &str =
    "SELECT CASE WHEN pg_try_advisory_lock($1) THEN pg_advisory_unlock($1) ELSE false END";

/// The message of the [`Error::Unsupported`] a connection through a
/// proxy that sends read-only statements to a standby gets; the proxy's
/// own setting follows when it answers `PGPOOL SHOW`.
pub(crate) const LOAD_BALANCED: &str =
    "this connection goes through a load-balancing proxy (pgpool-II with load_balance_mode = on, \
     or statement_level_load_balance = on) that sends read-only statements to a standby, while \
     locks run on the primary: a lock's keepalive and the holders dbmutex reports would be read \
     where no lock is. Turn load balancing off for dbmutex (pgpool-II: \
     app_name_redirect_preference_list = 'dbmutex:primary', for the application_name dbmutex \
     connects with), or connect to the primary directly";

/// The statement of the connect check on the lock session: its server
/// session's pid, and whether that session is read-only (a standby's
/// always is). Both functions are stable: a load balancer may route it.
const READ_PID: &str = "SELECT pg_backend_pid(), current_setting('transaction_read_only')";

/// [`READ_PID`] on `session`: the pid. Fails with [`LOAD_BALANCED`] when
/// it ran on a read-only server session though the claim (a volatile
/// statement, never load-balanced) found a writable primary.
async fn read_pid(session: &PgConn) -> Result<i32> {
    let msgs = session
        .client
        .simple_query(READ_PID)
        .await
        .map_err(|e| Error::Connect(Box::new(e)))?;
    let read_only = msgs.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(1) == Some("on"),
        _ => false,
    });
    if read_only && session.is_writable() {
        return Err(Error::Unsupported(load_balanced(session).await));
    }
    first_text(&msgs)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| Error::Connect("pg_backend_pid() returned no number".into()))
}

/// [`LOAD_BALANCED`], with pgpool-II's settings if it answers.
async fn load_balanced(session: &PgConn) -> String {
    let mut seen = Vec::new();
    for setting in ["load_balance_mode", "statement_level_load_balance"] {
        if let Ok(msgs) = session
            .client
            .simple_query(&format!("PGPOOL SHOW {setting}"))
            .await
        {
            if let Some(v) = first_text(&msgs) {
                seen.push(format!("{setting} = {v}"));
            }
        }
    }
    if seen.is_empty() {
        LOAD_BALANCED.to_owned()
    } else {
        format!("{LOAD_BALANCED} (this pgpool-II has {})", seen.join(", "))
    }
}

async fn backend_pid(conn: &PgConn, sql: &str) -> Result<i32> {
    let msgs = conn.client.simple_query(sql).await.map_err(|e| {
        // PgBouncer's own words when statement pooling refuses BEGIN.
        let db = e
            .as_db_error()
            .map(|d| d.message().to_owned())
            .unwrap_or_default();
        if db.contains("statement pooling mode") {
            Error::Unsupported(STATEMENT_POOLING.into())
        } else {
            Error::Connect(Box::new(e))
        }
    })?;
    first_text(&msgs)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| Error::Connect("pg_backend_pid() returned no number".into()))
}

/// True when `session`'s statements are not bound to one server session
/// (see the module docs).
///
/// `other` is a second connection of ours; it is left clean (no transaction)
/// for reuse.
pub(crate) async fn shares_sessions(session: &PgConn, other: &PgConn) -> Result<bool> {
    let p1 = read_pid(session).await?;
    let verdict = async {
        let q = backend_pid(other, "BEGIN; SELECT pg_backend_pid()").await?;
        if q == p1 {
            return Ok::<_, Error>(true);
        }
        // A pool with no free server session would queue this statement until
        // the other transaction ends: end it after a while, then look again.
        let again = read_pid(session);
        tokio::pin!(again);
        let p2 = match tokio::time::timeout(Duration::from_secs(1), &mut again).await {
            Ok(p2) => p2?,
            Err(_) => {
                let _ = other.client.batch_execute("ROLLBACK").await;
                again.await?
            }
        };
        Ok(p2 != p1)
    }
    .await;
    // End the pinning transaction cleanly, so the pooler keeps its server
    // session; a connection whose rollback failed is not kept.
    if other.client.batch_execute("ROLLBACK").await.is_err() {
        other.close();
    }
    if verdict? {
        return Ok(true);
    }
    // With every server session idle again, a round-robin pool hands
    // consecutive statements to them in turn: a few more questions catch it.
    for _ in 0..3 {
        if read_pid(session).await? != p1 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Fails with [`RESET_KEEPS_LOCKS`] when the server session of a client
/// that closed its connection keeps that client's advisory locks (see the
/// module docs), unless `settings` skip the pooler checks. `other`, a
/// second connection of ours with no lock, is closed; `session` only reads
/// `pg_locks`.
pub(crate) async fn check_release_on_close(
    session: &PgConn,
    other: &PgConn,
    settings: &Settings,
) -> Result<()> {
    if settings.skip_pooler_check {
        other.close();
        return Ok(());
    }
    let key = fastrand::i64(0..);
    let probe = other
        .client
        .query_typed(
            "SELECT pg_backend_pid(), pg_try_advisory_lock($1)",
            &[(&key, Type::INT8)],
        )
        .await;
    other.close();
    let row = probe.map_err(|e| Error::Connect(Box::new(e)))?;
    let Some(row) = row.first() else {
        return Err(Error::Connect("pg_backend_pid() returned no row".into()));
    };
    let (pid, locked): (i32, bool) = (row.get(0), row.get(1));
    if !locked {
        // Someone holds this random key: nothing to watch (odds 2^-63).
        return Ok(());
    }
    let deadline = Instant::now() + RELEASE_BOUND;
    let mut pause = Duration::from_millis(1);
    loop {
        let free: bool = session
            .client
            .query_typed(PROBE_FREE, &[(&key, Type::INT8)])
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?
            .first()
            .is_some_and(|r| r.get(0));
        if free {
            return Ok(());
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    // Leave no probe lock on the pooled server session (same role: no
    // privilege needed; if it fails, the pool's next reconnect frees it).
    let _ = session
        .client
        .query_typed("SELECT pg_terminate_backend($1)", &[(&pid, Type::INT4)])
        .await;
    Err(Error::Unsupported(RESET_KEEPS_LOCKS.into()))
}
