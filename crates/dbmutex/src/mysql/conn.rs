//! MySQL connections: URL handling, connecting, and a small pool of clean
//! connections.
//!
//! Why not `mysql_async::Pool`: it resets a connection when it comes back
//! (`COM_RESET_CONNECTION`), which releases every user lock the session
//! holds, and it hands connections out again on its own terms. A lock must
//! live exactly as long as its guard, so every connection here is a plain
//! `Conn` owned by one guard at a time; dropping a `Conn` closes it, and the
//! server frees its locks. Only connections known to hold nothing come back
//! to [`Connector`]'s idle list.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

use crate::core::detach::Undo;
use crate::core::idle::{Idle, Reusable};
use crate::redact::{mysql_reason, redact_url, with_scheme};
use crate::settings::Settings;
use crate::{Error, Result};

/// What `Queryable` methods return.
pub(crate) type ConnFuture<'c, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = mysql_async::Result<T>> + Send + 'c>>;

/// At most this many clean connections wait for reuse; more are closed.
const IDLE_MAX: usize = 8;

/// Makes connections and keeps the clean ones for reuse.
pub(crate) struct Connector {
    opts: Opts,
    /// The URL named no password: each connect reads `MYSQL_PWD` or
    /// `~/.my.cnf` again, as the clients do at each start, so a long-lived
    /// locker that reconnects after a rotation sends the new one.
    password_files: bool,
    /// The URL named no user: each connect takes the one the clients
    /// would log in as (`~/.my.cnf`'s, else the login's), not none.
    default_user: bool,
    connect_timeout: Duration,
    keepalive: Duration,
    idle: Arc<Idle<Conn>>,
}

impl Reusable for Conn {
    fn alive(&self) -> bool {
        !self.is_disconnected()
    }
}

/// How long the client waits for the answer to a statement that may wait
/// `wait` in the server before treating the session as dead.
pub(crate) fn answer_bound(wait: Duration, keepalive: Duration) -> Duration {
    wait.saturating_add(keepalive.saturating_mul(2))
        .saturating_add(Duration::from_secs(2))
}

/// A connection and whether it came from the idle list (a reused
/// connection may have died while idle; a fresh one is worth one retry).
pub(crate) struct Checkout {
    pub(crate) conn: Conn,
    pub(crate) reused: bool,
}

impl Connector {
    /// Parses a `mysql://` or `mariadb://` URL (mysql_async's URL syntax and
    /// parameters, e.g. `?require_ssl=true`).
    pub(crate) fn from_url(url: &str, settings: &Settings) -> Result<Self> {
        let mysql_url = with_scheme(url, "mysql");
        let mysql_url = crate::redact::mysql_default_host(&mysql_url).ok_or_else(|| {
            Error::Config(format!(
                "bad MySQL URL {}: a port with no host (the MySQL clients would ignore it and use the local \
                 socket): name the host (mysql://user@127.0.0.1:PORT/db, or MYSQL_HOST) or the socket (?socket=PATH)",
                redact_url(url)
            ))
        })?;
        let opts = Opts::from_url(&mysql_url)
            .map_err(|e| Error::Config(format!("bad MySQL URL {}: {}", redact_url(url), mysql_reason(&e))))?;
        let query = mysql_url.split_once('?').map_or("", |(_, q)| q);
        let has_param = |p: &str| query.split('&').any(|kv| kv.split('=').next() == Some(p));
        let no_password = opts.pass().is_none();
        let no_user = opts.user().is_none_or(str::is_empty);
        let mut builder =
            OptsBuilder::from_opts(opts).connect_attribute("program_name", &settings.application_name);
        // mysql_async switches a loopback TCP connection to the server's Unix
        // socket by default: an extra connect per lock, and holders would no
        // longer show the address the URL names. Keep what the URL says.
        if !has_param("prefer_socket") {
            builder = builder.prefer_socket(false);
        }
        if !has_param("tcp_keepalive") {
            builder = builder.tcp_keepalive(Some(settings.keepalive.max(Duration::from_secs(1))));
        }
        // The server frees a vanished client's locks within the bound: a
        // session idle (or stuck sending) that long is closed. Each lock
        // session's ping keeps a live holder busy; see
        // `LockerBuilder::dead_peer_timeout`.
        let bound = settings.server_dead_peer_bound();
        let secs = bound.as_secs().max(2);
        builder = builder.init(vec![format!(
            "SET SESSION wait_timeout = {secs}, net_write_timeout = {secs}"
        )]);
        Ok(Connector {
            opts: builder.into(),
            password_files: no_password,
            default_user: no_user,
            connect_timeout: settings.connect_timeout,
            keepalive: settings.keepalive,
            // Unused past the locker's idle timeout, a connection is closed
            // (a middlebox may have dropped it silently, and a quiet locker
            // keeps none).
            idle: Arc::new(Idle::new(IDLE_MAX, Some(settings.idle_limit()))),
        })
    }

    /// The options to connect with now: the URL's, with the user and the
    /// password the clients would send read again where the URL named
    /// none (`mycnf`).
    fn opts_now(&self) -> Opts {
        if !self.password_files && !self.default_user {
            return self.opts.clone();
        }
        let env = |k: &str| std::env::var(k).ok();
        // Read once: the user and the password come from one version of it.
        let file = super::mycnf::option_file(&env);
        let mut b = OptsBuilder::from_opts(self.opts.clone());
        if self.default_user {
            b = b.user(super::mycnf::user(file.as_deref(), env));
        }
        if self.password_files {
            if let Some(p) = super::mycnf::password(file.as_deref(), env) {
                b = b.pass(Some(p));
            }
        }
        b.into()
    }

    /// Opens a new connection, bounded by the connect timeout.
    pub(crate) async fn connect(&self) -> Result<Conn> {
        match tokio::time::timeout(self.connect_timeout, Conn::new(self.opts_now())).await {
            Ok(Ok(c)) => Ok(c),
            // A socket is named: it may be a default the URL did not say
            // (`mysql_default_host`).
            Ok(Err(mysql_async::Error::Io(mysql_async::IoError::Io(e)))) if self.opts.socket().is_some() => {
                let path = self.opts.socket().unwrap_or_default();
                let named = std::io::Error::new(e.kind(), format!("socket {path}: {e}"));
                Err(Error::Connect(Box::new(mysql_async::Error::Io(
                    mysql_async::IoError::Io(named),
                ))))
            }
            Ok(Err(e)) => Err(Error::Connect(Box::new(e))),
            Err(_) => {
                let from = match self.opts.socket() {
                    Some(path) => format!("socket {path}"),
                    None => format!("{}:{}", self.opts.ip_or_hostname(), self.opts.tcp_port()),
                };
                Err(Error::Connect(
                    format!("no answer from {from} within {:?}", self.connect_timeout).into(),
                ))
            }
        }
    }

    /// A clean idle connection, or a new one.
    pub(crate) async fn checkout(&self) -> Result<Checkout> {
        let reused = self.idle.take();
        match reused {
            Some(conn) => Ok(Checkout { conn, reused: true }),
            None => Ok(Checkout {
                conn: self.connect().await?,
                reused: false,
            }),
        }
    }

    /// Returns a connection that holds no lock, for reuse.
    ///
    /// Only call this when the connection is known to hold nothing: a
    /// statement confirmed it, and no statement was interrupted.
    pub(crate) fn checkin(&self, conn: Conn) {
        // Over the bound, `conn` drops, which closes it.
        self.idle.put(conn);
    }

    /// Runs `f` on a clean connection that takes no lock, retrying once on a
    /// fresh connection when a reused one turns out to be dead.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T, RunError>
    where
        F: for<'c> Fn(&'c mut Conn) -> ConnFuture<'c, T>,
    {
        let mut retried = false;
        loop {
            let Checkout { mut conn, reused } = self.checkout().await.map_err(RunError::Connect)?;
            match f(&mut conn).await {
                Ok(v) => {
                    self.checkin(conn);
                    return Ok(v);
                }
                Err(e @ mysql_async::Error::Server(_)) => {
                    // A server error leaves the session usable and lock-free.
                    self.checkin(conn);
                    return Err(RunError::Query(e));
                }
                Err(e) => {
                    drop(conn);
                    if reused && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(RunError::Query(e));
                }
            }
        }
    }

    /// The locker's keepalive period.
    pub(crate) fn keepalive(&self) -> Duration {
        self.keepalive
    }

    /// The longest [`kill`](Self::kill) or [`kill_query`](Self::kill_query)
    /// takes: a connect (twice, when a reused connection turns out dead) and
    /// one short statement.
    pub(crate) fn kill_bound(&self) -> Duration {
        self.connect_timeout
            .saturating_mul(2)
            .saturating_add(answer_bound(Duration::ZERO, self.keepalive))
    }

    /// Kills connection `id` (`KILL CONNECTION`) from another connection, so
    /// that a statement still running there ends now and the session's locks
    /// are freed. A connection that is already gone is fine.
    pub(crate) async fn kill(&self, id: u32) {
        self.kill_what("CONNECTION", id).await;
    }

    /// Kills session `id` (see [`Connector::kill`]) when dropped armed: a
    /// statement may still run there that nobody waits for.
    pub(crate) fn kill_on_drop(self: &Arc<Self>, runtime: &tokio::runtime::Handle, id: u32) -> Undo {
        let connector = self.clone();
        Undo::spawn(runtime, async move { connector.kill(id).await })
    }

    /// Kills session `id` in the background.
    pub(crate) fn spawn_kill(self: &Arc<Self>, runtime: &tokio::runtime::Handle, id: u32) {
        drop(self.kill_on_drop(runtime, id));
    }

    /// Ends the statement running on connection `id` (`KILL QUERY`) from
    /// another connection; the session and its locks stay. `false` when
    /// the kill could not be sent.
    pub(crate) async fn kill_query(&self, id: u32) -> bool {
        self.kill_what("QUERY", id).await
    }

    /// Bounded by [`kill_bound`](Self::kill_bound).
    async fn kill_what(&self, what: &str, id: u32) -> bool {
        // An integer we own: safe to inline, and KILL cannot be prepared everywhere.
        let sql = format!("KILL {what} {id}");
        let bound = self.kill_bound();
        let r = tokio::time::timeout(bound, self.run(|c| c.query_drop(sql.clone()))).await;
        match r {
            Ok(Ok(())) => true,
            // 1094: unknown thread id — it ended by itself.
            Ok(Err(RunError::Query(mysql_async::Error::Server(e)))) if e.code == 1094 => true,
            Ok(Err(e)) => {
                tracing::warn!(connection = id, error = %e, "dbmutex: could not send {sql}");
                false
            }
            Err(_) => {
                tracing::warn!(connection = id, "dbmutex: {sql} got no answer within {bound:?}");
                false
            }
        }
    }
}

/// A failure of [`Connector::run`].
#[derive(Debug)]
pub(crate) enum RunError {
    /// No connection could be made.
    Connect(Error),
    /// The statement failed.
    Query(mysql_async::Error),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Connect(e) => e.fmt(f),
            RunError::Query(e) => e.fmt(f),
        }
    }
}
