//! One server session: its lock statements, and its end, reported at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{CancelToken, Client};

use super::tls::Tls;
use crate::key::PgKey;
use crate::postgres::sql::{self, Call};
use crate::{LockName, Mode};

/// How a lock statement is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Text {
    /// Unnamed (one round trip, parsed each time), the name in a comment.
    Named,
    /// Unnamed, no comment. Safe behind any pooler: nothing is left on the
    /// server session between statements.
    Plain,
    /// `EXECUTE` of a statement this connection `PREPARE`d under a name of
    /// its own (see `executed.rs`): parsed once, and no other client's
    /// statement can ever run under that name.
    Executed,
    /// A protocol-level prepared statement: parsed once per connection.
    /// Behind a pooler that passes statement names through, a name may meet
    /// another client's statement: used only on a connection that reaches
    /// the server directly (see `direct.rs`), or with `name_comments(false)`.
    Prepared,
}

/// A server session marked as ours: a random token in the session-level
/// setting `dbmutex.owner`, which only this connection's statements can
/// have set on that session. Every lock statement and heartbeat checks it
/// in the same statement, so a pooler that hands our next statement to
/// another server session is caught before anything is locked there.
pub(crate) struct Claim {
    /// 32 hex digits.
    pub(crate) token: String,
    /// The claimed session's backend pid and start, to end it if we are
    /// ever moved away from it while it holds our locks. No start on a
    /// connection found direct, which nothing can move (`claim.rs`).
    pub(super) pid: i32,
    pub(super) started: Option<std::time::SystemTime>,
}

/// What the server's lock table can hold, as its settings say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockTable {
    /// `max_locks_per_transaction`.
    pub(crate) per_transaction: u64,
    /// `max_connections + max_prepared_transactions`.
    pub(crate) slots: u64,
}

impl LockTable {
    /// Table entries: `max_locks_per_transaction × (max_connections +
    /// max_prepared_transactions)`.
    pub(crate) fn capacity(self) -> u64 {
        self.per_transaction * self.slots
    }
}

/// One server session. When its connection ends, for whatever reason, `lost`
/// turns true at once: every lock held on it is gone.
pub(crate) struct PgConn {
    /// Unique in the process, to tell sessions apart.
    pub(crate) id: u64,
    pub(crate) client: Client,
    pub(super) lost: watch::Sender<bool>,
    pub(super) cancel: CancelToken,
    pub(super) tls: Tls,
    pub(super) task: tokio::task::AbortHandle,
    /// The keepalive probe's task (see `heartbeat.rs`), started once and
    /// kept for the connection's life.
    pub(super) beat: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// What the probe does now, and since when (see `heartbeat.rs`):
    /// paused before the connection serves a wait that blocks in the server.
    pub(super) beat_mode: std::sync::atomic::AtomicU64,
    /// Where to spawn unlocks queued by a drop on a thread with no runtime.
    pub(crate) runtime: tokio::runtime::Handle,
    /// The text of the last lock name sent or remembered, in a buffer reused
    /// from lock to lock, so the keepalive query can carry it in a comment
    /// (`pg_stat_activity` keeps showing it); made into a comment only there,
    /// not on every lock.
    pub(super) last_name: std::sync::Mutex<String>,
    /// When the session last heard from the server
    /// ([`coarse_ms`](crate::core::clock::coarse_ms)).
    pub(super) last_answer_ms: std::sync::atomic::AtomicU64,
    /// Prepared lock statements (used when name comments are off), one
    /// slot per call, mode and key form (see `prepared.rs`): the hot path
    /// finds one with no SQL text, no hash and no lock, and borrows it.
    pub(super) statements: [std::sync::OnceLock<tokio_postgres::Statement>; 12],
    /// Prepared bounded waits that set their own timeouts
    /// ([`sql::bounded_wait_plain`], see `prepared.rs`), one per mode and
    /// key form. A wait without a bound is `statements`' wait.
    pub(super) bounded_waits: [std::sync::OnceLock<tokio_postgres::Statement>; 4],
    /// The lock statements this connection has `PREPARE`d ([`Text::Executed`]):
    /// bit `prepared::slot(call, mode, key)` each (read on every try: no
    /// lock, no hash).
    pub(super) executed: std::sync::atomic::AtomicU32,
    /// The server session this connection claimed when it connected; unset
    /// when that session was already claimed by another client.
    pub(super) claim: std::sync::OnceLock<Claim>,
    pub(super) claim_tried: std::sync::atomic::AtomicBool,
    /// The server answered, on this connection, that it is not a hot
    /// standby (in the claim, or in [`PgConn::check_not_standby`]).
    pub(super) not_standby: std::sync::atomic::AtomicBool,
    /// The server's lock-table settings, read with the claim.
    pub(crate) lock_table: std::sync::OnceLock<LockTable>,
    /// The connector's flag: a pooler moved one of its connections.
    pub(super) pooler_seen: Arc<std::sync::atomic::AtomicBool>,
    /// The one TCP host and port dialed, if one (see `direct.rs`).
    pub(super) dialed: Option<super::direct::Dialed>,
    /// The server's own address and port for the claimed session (see
    /// `direct.rs`), read by the claim.
    pub(super) server_end: std::sync::OnceLock<(Option<String>, Option<i32>)>,
    /// The server itself answers on what we dialed (and, on a socket we
    /// dialed, sees our own end as its client), no pooler in between: set
    /// for a lock session by [`PgConn::check_direct`].
    pub(super) direct: std::sync::atomic::AtomicBool,
    /// The server answers on the address and port we dialed (its peer may
    /// still be a pooler or a NAT: see [`PgConn::watch_once_cleared`]).
    pub(super) answers: std::sync::atomic::AtomicBool,
    /// The connector's flag: its locker's pooler check found no pooler.
    pub(super) cleared: Arc<std::sync::atomic::AtomicBool>,
    /// Both ends of our socket, when we dialed it ourselves (see
    /// `connector.rs`).
    pub(super) ends: Option<super::direct::Ends>,
    /// The Unix socket we dialed ourselves, and who listens on it (see
    /// `connector.rs`).
    pub(super) unix: Option<super::direct::UnixEnds>,
    /// Found direct on a socket we dialed ourselves: the claimed session is
    /// at the other end of that very socket (see `direct.rs`). Nothing can
    /// move this connection: its prepared lock statements carry no claim
    /// check, and the claim needs no session start.
    pub(super) own_socket: std::sync::atomic::AtomicBool,
    /// The bound for the server's side of liveness (see `liveness.rs`).
    pub(super) dead_peer: Duration,
    /// Whether the server was asked to watch this session.
    pub(super) watched: std::sync::atomic::AtomicBool,
    /// The server's major version, from its `server_version` at connect
    /// (`0`: not told), for the settings it knows (see `liveness.rs`).
    pub(super) server_major: u32,
    /// The claim found a writable primary (not in recovery, not
    /// read-only): the keepalive probe then reports the server going
    /// read-only as a loss (see `heartbeat.rs`).
    pub(super) writable: std::sync::atomic::AtomicBool,
    /// Whether the claim found a `statement_timeout` in force on the
    /// session (a role's, database's or URL's default): then no wait goes
    /// as one statement, whose timer that setting arms before the
    /// statement can clear it.
    pub(super) statement_timeout: std::sync::atomic::AtomicBool,
    /// Whether the claim found a `lock_timeout` in force on the session:
    /// then even a wait without a bound sets it (to `0`) for itself.
    pub(super) lock_timeout: std::sync::atomic::AtomicBool,
}

/// What a new connection takes from the connector that made it.
pub(super) struct Origin {
    pub(super) tls: Tls,
    pub(super) pooler_seen: Arc<std::sync::atomic::AtomicBool>,
    pub(super) cleared: Arc<std::sync::atomic::AtomicBool>,
    pub(super) dialed: Option<super::direct::Dialed>,
    pub(super) ends: Option<super::direct::Ends>,
    pub(super) unix: Option<super::direct::UnixEnds>,
    pub(super) dead_peer: Duration,
}

impl PgConn {
    pub(super) fn start<S, T>(
        client: Client,
        mut conn: tokio_postgres::Connection<S, T>,
        origin: Origin,
    ) -> Arc<PgConn>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Origin {
            tls,
            pooler_seen,
            cleared,
            dialed,
            ends,
            unix,
            dead_peer,
        } = origin;
        let server_major = major_version(conn.parameter("server_version"));
        let (lost, _) = watch::channel(false);
        let lost_tx = lost.clone();
        let task = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    // Notices and notifications: nothing for us.
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        // The server's own words ("FATAL: terminating
                        // connection due to administrator command"), not
                        // the driver's bare "db error".
                        tracing::warn!(error = %crate::error::chain(&e), "dbmutex: PostgreSQL connection ended");
                        break;
                    }
                    None => break,
                }
            }
            lost_tx.send_replace(true);
        });
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Arc::new(PgConn {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cancel: client.cancel_token(),
            client,
            lost,
            tls,
            task: task.abort_handle(),
            beat: Default::default(),
            beat_mode: Default::default(),
            runtime: tokio::runtime::Handle::current(),
            statements: Default::default(),
            bounded_waits: Default::default(),
            executed: Default::default(),
            last_name: Default::default(),
            last_answer_ms: std::sync::atomic::AtomicU64::new(0),
            claim: std::sync::OnceLock::new(),
            claim_tried: Default::default(),
            not_standby: Default::default(),
            lock_table: Default::default(),
            pooler_seen,
            dialed,
            server_end: Default::default(),
            direct: Default::default(),
            answers: Default::default(),
            cleared,
            ends,
            unix,
            own_socket: Default::default(),
            dead_peer,
            watched: Default::default(),
            server_major,
            writable: Default::default(),
            statement_timeout: Default::default(),
            lock_timeout: Default::default(),
        })
    }

    /// How this connection's lock-session statements for a lock in `mode`
    /// on `key` go: protocol-level prepared on a claimed connection that
    /// reaches the server directly (or with name comments off, as asked),
    /// else `EXECUTE` of statements `PREPARE`d under a name of our own,
    /// safe behind any pooler. On a direct connection the first lock of each
    /// kind still goes as `EXECUTE` (prepare and run in one round trip):
    /// parsing once pays off only from the second, and a process that takes
    /// one lock (`dbmutex run`) is spared the extra round trip.
    pub(crate) fn session_text(&self, name_comments: bool, mode: Mode, key: &PgKey) -> Text {
        if !name_comments {
            return Text::Prepared;
        }
        let direct = self.direct.load(std::sync::atomic::Ordering::Relaxed)
            && !self.pooler_seen.load(std::sync::atomic::Ordering::Relaxed);
        if direct && self.has_executed(Call::Try, mode, key) {
            Text::Prepared
        } else {
            Text::Executed
        }
    }

    /// Runs one session-lock call and returns its boolean (`true` for the
    /// void-returning waits), or `None` when the statement ran on a server
    /// session that is not ours (see [`Claim`]; the connection is then
    /// [`moved`](Self::moved) and lost). With `name`, the statement carries
    /// it in a comment and runs unprepared (`query_typed`: one round trip);
    /// without, it runs as a statement prepared once per connection.
    pub(crate) async fn lock_call(
        self: &Arc<Self>,
        call: Call,
        mode: Mode,
        key: &PgKey,
        name: &LockName,
        text: Text,
    ) -> std::result::Result<Option<bool>, tokio_postgres::Error> {
        let owner = self.owner();
        if owner.is_empty() {
            // Unclaimed: a session lock here could land anywhere.
            self.moved();
            return Ok(None);
        }
        let Text::Prepared = text else {
            // Rare (the first lock of each kind, or behind a pooler):
            // boxed, so that the prepared path's future, awaited in every
            // lock and unlock, stays small.
            return crate::core::reuse::boxed_cold(|| {
                self.unprepared_call(call, mode, key, name, text, owner)
            })
            .await;
        };
        let stmt = match self.cached(call, mode, key) {
            Some(stmt) => stmt,
            None => crate::core::reuse::boxed_cold(|| self.prepared(call, mode, key)).await?,
        };
        let params = sql::Params::of(key, owner);
        let (values, n) = params.key_values();
        match self.client.query_opt(stmt, &values[..n]).await {
            Ok(row) => Ok(self.answered(row.as_ref())),
            // Our prepared statement is not on this server session:
            // a pooler moved us (to a session where the name may even
            // be another client's statement, which the claim check in
            // it refuses). Our former session may hold locks: end it.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME) => {
                self.moved();
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Puts the unlock of `key` in `mode` on the wire now and does not wait
    /// for its answer: a dropped guard's release, with no task and no
    /// thread hop. The connection runs every later statement of ours after
    /// it, so this locker's next try of the key finds it free, and a
    /// connection that goes back to the spares holds nothing by the time it
    /// serves again. Done only where nothing can go wrong unseen: a claimed
    /// connection that reaches the server directly (no pooler can move the
    /// statement to another session, so the claim check cannot refuse it):
    /// the prepared statement when it is, else the statement inlined in a
    /// simple query. `false` otherwise: the caller then unlocks (or closes)
    /// the usual way. The answer (a lock that was not held any more) is not
    /// looked at; a guard dropped without `release()` has nobody to tell.
    pub(crate) fn send_unlock(&self, mode: Mode, key: &PgKey) -> bool {
        use std::future::Future;
        use std::task::{Context, Waker};
        let owner = self.owner();
        let direct = self.direct.load(std::sync::atomic::Ordering::Relaxed)
            && !self.pooler_seen.load(std::sync::atomic::Ordering::Relaxed);
        if owner.is_empty() || !direct {
            return false;
        }
        // tokio-postgres sends a request when its future is first polled;
        // the answer is discarded once the future is gone. A first poll
        // that fails found the connection closed: the server has ended the
        // session, and its locks with it.
        let mut cx = Context::from_waker(Waker::noop());
        // Prepared unlocks are cached only where this connection's lock
        // statements go prepared: on a direct one (checked above) or with
        // name comments off (behind a pooler, refused above).
        match self.cached(Call::Unlock, mode, key) {
            Some(stmt) => {
                let params = sql::Params::of(key, owner);
                let (values, n) = params.key_values();
                let query = std::pin::pin!(self.client.query_opt(stmt, &values[..n]));
                let _ = query.poll(&mut cx);
            }
            None => {
                let sql = sql::inline(Call::Unlock, false, mode, key, None, owner);
                let batch = std::pin::pin!(self.client.batch_execute(&sql));
                let _ = batch.poll(&mut cx);
            }
        }
        true
    }

    /// [`Self::lock_call`] for every text but [`Text::Prepared`].
    async fn unprepared_call(
        self: &Arc<Self>,
        call: Call,
        mode: Mode,
        key: &PgKey,
        name: &LockName,
        text: Text,
        owner: &str,
    ) -> std::result::Result<Option<bool>, tokio_postgres::Error> {
        let rows = match text {
            Text::Named => {
                let comment = crate::key::sql_comment(name);
                let (sql, params) = sql::bound_commented(call, false, mode, key, &comment, owner);
                self.remember_name(name);
                self.client.query_typed(&sql, &params.as_typed()).await?
            }
            Text::Plain => {
                let (sql, params) = sql::bound_plain(call, false, mode, key, owner);
                self.client.query_typed(&sql, &params.as_typed()).await?
            }
            Text::Executed | Text::Prepared => return self.executed_call(call, mode, key, owner).await,
        };
        Ok(self.answered(rows.first()))
    }

    /// A lock statement's answer: its one row's boolean, or (no row: the
    /// claim check refused) `None`, after reporting the move.
    fn answered(self: &Arc<Self>, row: Option<&tokio_postgres::Row>) -> Option<bool> {
        self.heard_from_server();
        match row {
            // A wait's void column is `true`; typed first, so that it
            // makes no error value to throw away.
            Some(r) => Some(match r.columns().first() {
                Some(c) if *c.type_() == tokio_postgres::types::Type::BOOL => r.try_get(0).unwrap_or(true),
                _ => true,
            }),
            None => {
                self.moved();
                None
            }
        }
    }

    pub(crate) fn heard_from_server(&self) {
        let now = crate::core::clock::coarse_ms();
        self.last_answer_ms
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// The claimed server session's backend pid, if claimed.
    pub(crate) fn server_pid(&self) -> Option<i32> {
        self.claim.get().map(|c| c.pid)
    }

    /// Shows `name` in the comment of this session's next keepalive probe,
    /// so that `pg_stat_activity` (and `dbmutex list`) name the session's
    /// last lock once it has been quiet for the keepalive period, though its
    /// lock statements themselves are prepared and carry no name.
    pub(crate) fn remember_name(&self, name: &LockName) {
        use std::fmt::Write;
        let mut text = self.last_name.lock().unwrap_or_else(|e| e.into_inner());
        text.clear();
        match name {
            // Most names: a copy, not the formatting machinery.
            LockName::Str(s) => text.push_str(s),
            // Writing to a String cannot fail.
            other => drop(write!(text, "{other}")),
        }
    }

    /// True once the connection is gone.
    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// A receiver that turns true when the connection is gone.
    pub(crate) fn lost_signal(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Closes the connection now (the server then frees its locks) and
    /// reports it lost. Needs no runtime.
    pub(crate) fn close(&self) {
        self.task.abort();
        self.lost.send_replace(true);
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The major version in a `server_version` parameter (`15.10 (Debian
/// 15.10-1)`, `9.6.24`, `17beta1`), `0` when there is none.
fn major_version(server_version: Option<&str>) -> u32 {
    let v = server_version.unwrap_or("");
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    v[..digits].parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_versions() {
        assert_eq!(major_version(Some("15.10 (Debian 15.10-0+deb12u1)")), 15);
        assert_eq!(major_version(Some("9.6.24")), 9);
        assert_eq!(major_version(Some("17beta1")), 17);
        assert_eq!(major_version(Some("")), 0);
        assert_eq!(major_version(None), 0);
    }
}
