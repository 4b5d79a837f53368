//! The server-session claim (see [`Claim`]), and what happens when a pooler
//! moves a connection off its claimed session.

use std::sync::Arc;

use super::session::{Claim, LockTable, PgConn};
use crate::{Error, Result};

/// The message of the [`Error::Connect`] a connection to a hot standby
/// gets.
pub(crate) const ON_A_STANDBY: &str =
    "this connection reaches a hot standby (pg_is_in_recovery() is true): advisory locks are not \
     replicated, so a lock there would exclude only that standby's own clients. Connect to the \
     primary (a multi-host URL with target_session_attrs=read-write finds it)";

/// A claim's last step, still to run (see
/// [`PgConn::claim_start_later`]): the token and pid it claimed with. The
/// connection is not claimed until [`PgConn::finish_claim`] has run it.
pub(crate) struct StartLater {
    token: String,
    pid: i32,
}

impl PgConn {
    /// Marks the server session as this connection's (see [`Claim`]), if no
    /// other client did. A session that carries another client's token is
    /// shared: we are behind a pooler (or one that keeps session state
    /// between clients), and this connection stays unclaimed.
    ///
    /// A claimed connection then learns whether it reaches the server
    /// directly (see [`check_direct`](Self::check_direct)).
    ///
    /// Fails with [`ON_A_STANDBY`] (a connect error) on a hot standby; records whether the
    /// server is a writable primary, for the keepalive probe.
    ///
    /// Tried once per connection; later calls return at once.
    pub(crate) async fn claim(self: &Arc<Self>) -> Result<()> {
        match self.claim_start_later().await? {
            // Boxed, as the claim's statement is: asked on every wait, the
            // claim runs once per connection.
            Some(start) => Box::pin(self.finish_claim(start)).await,
            None => Ok(()),
        }
    }

    /// [`claim`](Self::claim) but for its last step, which a new locker's
    /// first connection runs beside its pooler check's second connect (see
    /// `PgBackend::with_connector`): where that step is needed, it is
    /// returned, and the connection is claimed only once
    /// [`finish_claim`](Self::finish_claim) has run it. Dropped instead,
    /// the connection stays unclaimed for good (no session lock goes
    /// there): the claim is tried once per connection, by either entry,
    /// and a later [`claim`](Self::claim) returns at once, claimed or not.
    pub(crate) async fn claim_start_later(self: &Arc<Self>) -> Result<Option<StartLater>> {
        if self.claim_tried.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        // Boxed: asked on every wait, it runs once per connection.
        Box::pin(self.claim_now()).await
    }

    /// The claim's last step, on a claimed connection that may have a
    /// pooler in between: the claimed session's start
    /// ([`session_start`](Self::session_start)), which with its pid names
    /// it for [`moved`](Self::moved). A connection that a pooler moved
    /// meanwhile stays unclaimed.
    pub(crate) async fn finish_claim(&self, StartLater { token, pid }: StartLater) -> Result<()> {
        match self.session_start(&token).await? {
            Some(started) => {
                let _ = self.claim.set(Claim {
                    token,
                    pid,
                    started: Some(started),
                });
            }
            // Moved off the session it claimed before any lock statement
            // went there: that session holds nothing of ours, and this
            // connection stays unclaimed.
            None => self.pooler_seen.store(true, std::sync::atomic::Ordering::Relaxed),
        }
        Ok(())
    }

    /// [`claim`](Self::claim)'s statement; on a claimed connection that may
    /// have a pooler in between, what [`finish_claim`](Self::finish_claim)
    /// then needs (the connection is not claimed until it has run).
    async fn claim_now(self: &Arc<Self>) -> Result<Option<StartLater>> {
        let token = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        // Without a socket we dialed ourselves (or with a Unix one whose
        // listener is no `postgres`), the session is never found at its
        // other end (`direct.rs`'s `is_own_socket`, `is_postmasters_own`):
        // the session's start comes with the claim, no extra round trip.
        // Else it is asked only if the session is not at the other end
        // (below).
        let with_start = self.ends.is_none() && self.unix.as_ref().is_none_or(|u| u.listener.is_none());
        let rows = self
            .client
            .query_typed(
                if with_start { CLAIM_WITH_START } else { CLAIM },
                &[(&token, tokio_postgres::types::Type::TEXT)],
            )
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
        let row = first_row(&rows, "the session claim")?;
        self.note_primary(row.get(7), row.get(8))?;
        let owner: Option<String> = row.get(0);
        // The first statement of a fresh backend: every function, operator
        // and cast it names costs catalog lookups there (BENCHMARKS.md, CLI
        // start). So settings come as text, the address in binary (no
        // `host()`), and no view.
        let setting = |i: usize| -> u64 {
            row.get::<_, Option<String>>(i)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let _ = self.lock_table.set(LockTable {
            per_transaction: setting(2).max(1),
            slots: (setting(3) + setting(4)).max(1),
        });
        self.heard_from_server();
        if owner.as_deref() != Some(token.as_str()) {
            self.pooler_seen.store(true, std::sync::atomic::Ordering::Relaxed);
            return Ok(None);
        }
        let addr = row.get::<_, Option<std::net::IpAddr>>(5).map(|a| a.to_string());
        let _ = self.server_end.set((addr, row.get(6)));
        let in_force = |i: usize| row.get::<_, Option<String>>(i).is_some_and(|t| t != "0");
        self.statement_timeout
            .store(in_force(9), std::sync::atomic::Ordering::Relaxed);
        self.lock_timeout
            .store(in_force(10), std::sync::atomic::Ordering::Relaxed);
        let pid = row.get(1);
        let client_end = match with_start {
            true => (None, None),
            false => (row.get(11), row.get(12)),
        };
        let own = match &self.unix {
            Some(unix) => self.check_unix(unix.listener, Some(pid)),
            None => self.check_direct(client_end).await,
        };
        self.own_socket.store(own, std::sync::atomic::Ordering::Relaxed);
        let started = if with_start {
            row.get(11)
        } else if own {
            // At the other end of our own socket: nothing can move this
            // connection to another server session, so
            // [`moved`](Self::moved) never needs the start.
            None
        } else {
            return Ok(Some(StartLater { token, pid }));
        };
        let _ = self.claim.set(Claim { token, pid, started });
        Ok(None)
    }

    /// The start of the server session this connection claimed with
    /// `token`, which with its pid names it for [`moved`](Self::moved);
    /// `None` if this statement ran on another session (a pooler moved the
    /// connection since the claim). A statement of its own, asked only
    /// where a pooler may be in between: on a fresh backend, the function
    /// costs more than the rest of the claim (BENCHMARKS.md, CLI start).
    /// `pg_is_in_recovery()` is volatile: a load-balancing pooler (pgpool-II)
    /// sends the statement to the primary, where the claim went.
    async fn session_start(&self, token: &str) -> Result<Option<std::time::SystemTime>> {
        let rows = self
            .client
            .query_typed(
                "SELECT backend_start FROM pg_stat_get_activity(pg_backend_pid()) \
                 WHERE current_setting('dbmutex.owner', true) = $1 AND NOT pg_is_in_recovery()",
                &[(&token, tokio_postgres::types::Type::TEXT)],
            )
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
        self.heard_from_server();
        Ok(rows.first().map(|r| r.get(0)))
    }

    /// Refuses a hot standby ([`ON_A_STANDBY`], a connect error) on a
    /// connection that takes locks without a claim (a transaction lock's
    /// own connection): a multi-host URL, or a primary demoted and back at
    /// its address, can hand a new connection to a standby, where a lock
    /// would exclude only that standby's clients. Asked once per
    /// connection, and not at all after a claim (which asks it too); like
    /// the claim, it records whether the server is a writable primary.
    pub(crate) async fn check_not_standby(&self) -> Result<()> {
        if self.not_standby.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let rows = self
            .client
            .query_typed(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
                &[],
            )
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
        let row = first_row(&rows, "the standby check")?;
        self.note_primary(row.get(0), row.get(1))?;
        self.heard_from_server();
        Ok(())
    }

    /// What the claim or the standby check read of the server: a hot
    /// standby (`in_recovery`) is refused with [`ON_A_STANDBY`], a connect
    /// error, so a wait reconnects until its bound and rides out a
    /// promotion of this very server. Otherwise records that it is not one,
    /// and whether it is a writable primary now (`transaction_read_only`
    /// off), which the keepalive probe of a lock held here then watches
    /// (see `heartbeat.rs`).
    fn note_primary(&self, in_recovery: Option<bool>, read_only: Option<String>) -> Result<()> {
        if in_recovery == Some(true) {
            return Err(Error::Connect(ON_A_STANDBY.into()));
        }
        self.not_standby.store(true, std::sync::atomic::Ordering::Relaxed);
        let writable = read_only.as_deref() == Some("off");
        self.writable
            .store(writable, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Decides whether this claimed connection reaches the server directly:
    /// on a socket we dialed ourselves, the server's end of the session is
    /// the peer we reached and its client is our own end (`client_end`, as
    /// `inet_client_addr()` and `inet_client_port()`). A pooler behind a
    /// port redirect dials the server where the client did, from an end of
    /// its own; a connection tokio-postgres dialed (its socket's ends
    /// unknown to us) is never found direct.
    ///
    /// Where the server answers on the address and port we dialed (a name
    /// is resolved), it is asked to watch for its client's vanishing
    /// (`liveness.rs`) at once if the connection is direct, else only once
    /// the locker's pooler check has found no pooler (a client behind
    /// NAT): see [`watch_once_cleared`](Self::watch_once_cleared).
    async fn check_direct(self: &Arc<Self>, client_end: (Option<std::net::IpAddr>, Option<i32>)) -> bool {
        let (Some(dialed), Some((addr, port))) = (&self.dialed, self.server_end.get()) else {
            return false;
        };
        // On our own socket the server's end must be the peer it reached
        // (one of the addresses the host resolved to, at the port dialed):
        // no second lookup of the name.
        let answers = match &self.ends {
            Some(e) => super::direct::is_peer(e.peer, addr.as_deref(), *port),
            None => {
                let addresses = dialed.addresses().await.unwrap_or_default();
                super::direct::is_direct(dialed, &addresses, addr.as_deref(), *port)
            }
        };
        self.answers.store(answers, std::sync::atomic::Ordering::Relaxed);
        let direct = answers
            && self
                .ends
                .as_ref()
                .is_some_and(|e| super::direct::is_own_socket(e.local, client_end.0, client_end.1));
        self.direct.store(direct, std::sync::atomic::Ordering::Relaxed);
        if direct || self.cleared.load(std::sync::atomic::Ordering::Relaxed) {
            self.watch_once_cleared();
        }
        direct
    }

    /// [`check_direct`](Self::check_direct) on a Unix socket we dialed
    /// ourselves: direct when the socket's `listener` is the postmaster
    /// whose child serves the session `pid` (`direct.rs`,
    /// [`is_postmasters_own`](super::direct::is_postmasters_own)); the
    /// server is then asked to watch for our vanishing at once (of its
    /// settings, a socket heeds the idle-session and connection checks).
    fn check_unix(self: &Arc<Self>, listener: Option<i32>, pid: Option<i32>) -> bool {
        let direct = super::direct::is_postmasters_own(listener, pid);
        self.answers.store(direct, std::sync::atomic::Ordering::Relaxed);
        self.direct.store(direct, std::sync::atomic::Ordering::Relaxed);
        if direct {
            self.ask_server_to_watch();
        }
        direct
    }

    /// Asks the server to watch for this connection's vanishing
    /// (`liveness.rs`) if it answers where we dialed and nothing is in
    /// between: the connection is direct, or the locker's pooler check
    /// found no pooler on this connector's sessions (then every later
    /// connection of it asks as it claims).
    pub(crate) fn watch_once_cleared(self: &Arc<Self>) {
        if self.answers.load(std::sync::atomic::Ordering::Relaxed) {
            self.ask_server_to_watch();
        }
    }

    /// Whether [`check_direct`](Self::check_direct) found the server itself
    /// at the address and port dialed.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the claim found a `statement_timeout` in force: a wait then
    /// goes as a batch whose first statement clears it for the wait's
    /// transaction (PostgreSQL arms the timeout per statement of a batch).
    pub(crate) fn has_statement_timeout(&self) -> bool {
        self.statement_timeout.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the claim found no `lock_timeout` in force: a wait without a
    /// bound then needs no settings of its own (see
    /// [`prepared_wait`](Self::prepared_wait)).
    pub(crate) fn has_no_lock_timeout(&self) -> bool {
        !self.lock_timeout.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the claim found a writable primary (not in recovery, not
    /// read-only).
    pub(crate) fn is_writable(&self) -> bool {
        self.writable.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This connection's claim token, `""` when it has none.
    pub(crate) fn owner(&self) -> &str {
        self.claim.get().map_or("", |c| c.token.as_str())
    }

    /// Whether this connection owns its server session (session locks are
    /// safe on it).
    pub(crate) fn is_claimed(&self) -> bool {
        self.claim.get().is_some()
    }

    /// A guarded statement found itself on a server session that is not
    /// ours: a pooler moved us. Our own session may still hold our locks,
    /// out of reach of every later statement, so it is ended (the only way
    /// to free them from outside), and this connection is closed: every
    /// guard on it reports the loss.
    pub(crate) fn moved(self: &Arc<Self>) {
        self.pooler_seen.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(
            "dbmutex: a statement ran on another server session than the one this connection \
             claimed: a transaction-pooling proxy (e.g. PgBouncer pool_mode=transaction) is in \
             between. Its locks are lost; ending our former server session if it holds them"
        );
        let me = self.clone();
        drop(self.runtime.spawn(async move {
            if let Some(c) = me.claim.get() {
                // Only a session that holds advisory locks (ours) is ended:
                // behind a pooler it may be running another client's
                // transaction right now. Matched by pid and start time (in
                // binary, to the microsecond: no TimeZone or DateStyle in
                // the way), so a reused pid is never hit.
                let ended = me
                    .client
                    .query_typed(
                        "SELECT pg_terminate_backend(a.pid) FROM pg_stat_get_activity($1) a \
                         WHERE a.backend_start = $2 \
                         AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory')",
                        &[
                            (&c.pid, tokio_postgres::types::Type::INT4),
                            (&c.started, tokio_postgres::types::Type::TIMESTAMPTZ),
                        ],
                    )
                    .await;
                match ended {
                    Ok(rows) if rows.iter().all(|r| r.get::<_, bool>(0)) => {}
                    Ok(_) => tracing::warn!(
                        pid = c.pid,
                        "dbmutex: the server refused to end our former server session; its locks stay until the pooler closes it"
                    ),
                    // Ended itself: the statement landed on that very session.
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN) => {}
                    Err(e) => {
                        tracing::warn!(error = %crate::error::chain(&e), pid = c.pid, "dbmutex: could not end our former server session; its locks stay until the pooler closes it")
                    }
                }
            }
            me.close();
        }));
        // Reported lost now, whatever the termination takes.
        self.lost.send_replace(true);
    }
}

/// The claim's columns (see [`PgConn::claim`]): the session's owner (ours,
/// if it had none), its pid, the lock table's settings, the server's
/// address and port, whether it is a writable primary, and its
/// `statement_timeout` and `lock_timeout`.
macro_rules! claim_columns {
    () => {
        "SELECT CASE WHEN coalesce(current_setting('dbmutex.owner', true), '') = '' \
         THEN set_config('dbmutex.owner', $1, false) \
         ELSE current_setting('dbmutex.owner', true) END, pg_backend_pid(), \
         current_setting('max_locks_per_transaction'), current_setting('max_connections'), \
         current_setting('max_prepared_transactions'), inet_server_addr(), inet_server_port(), \
         pg_is_in_recovery(), current_setting('transaction_read_only'), current_setting('statement_timeout'), \
         current_setting('lock_timeout')"
    };
}

/// The claim, and the server's view of its client's address and port (for
/// `direct.rs`'s [`is_own_socket`](super::direct::is_own_socket)).
const CLAIM: &str = concat!(claim_columns!(), ", inet_client_addr(), inet_client_port()");

/// [`CLAIM`] and the session's start, in one statement.
const CLAIM_WITH_START: &str = concat!(
    claim_columns!(),
    ", (SELECT backend_start FROM pg_stat_get_activity(pg_backend_pid()))"
);

/// The one row a statement of the claim's returns (`what` names it in the
/// error otherwise).
fn first_row<'r>(rows: &'r [tokio_postgres::Row], what: &str) -> Result<&'r tokio_postgres::Row> {
    rows.first()
        .ok_or_else(|| Error::Connect(format!("{what} returned no row").into()))
}
