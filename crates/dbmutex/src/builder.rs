//! The [`LockerBuilder`]: settings, and which backend a target names.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::pipeline::{Engine, Pipeline};
use crate::key::Prefix;
use crate::settings::Settings;
use crate::types::BackendKind;
use crate::{Error, Locker, Result};

/// How a [`Locker`] is made: from a URL, a tokio-postgres `Config` or a
/// lock directory, with default settings or through a [`LockerBuilder`].
impl Locker {
    /// Connects with default settings. `postgres://` / `postgresql://`,
    /// `mysql://` / `mariadb://`, or `file:///lock/dir` for the local backend.
    ///
    /// What a URL leaves out is filled in as the database's own client
    /// fills it in. PostgreSQL first takes libpq's environment for each
    /// part the URL does not say: `PGHOST`, `PGHOSTADDR`, `PGPORT`,
    /// `PGUSER`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`,
    /// `PGTARGETSESSIONATTRS`, and before them the section of libpq's
    /// service file (`pg_service.conf`) that the URL's `service=NAME` or
    /// `PGSERVICE` names (so `postgres:///db` goes where psql goes);
    /// MySQL/MariaDB, for a URL that names no host (nor `socket`), the
    /// `host`, `port` and `socket` of the option files' client groups
    /// (`/etc/my.cnf`, `/etc/mysql/my.cnf`, then `~/.my.cnf`; `[client]`,
    /// `[client-server]`, `[client-mariadb]`),
    /// else `MYSQL_HOST`, `MYSQL_TCP_PORT` and `MYSQL_UNIX_PORT`, as the
    /// `mysql` client does. No host anywhere: the local server's Unix socket (PostgreSQL:
    /// libpq's socket directory, `/var/run/postgresql` where it exists,
    /// else `/tmp`; MySQL/MariaDB: `/var/run/mysqld/mysqld.sock`, else
    /// `/tmp/mysql.sock`). No password: PostgreSQL takes `PGPASSWORD`,
    /// else the password file (`PGPASSFILE`, else `~/.pgpass`, readable by
    /// its owner only; used only where it gives every host of the URL the
    /// same password); MySQL/MariaDB takes the option files' password,
    /// else `MYSQL_PWD`. No user: MySQL/MariaDB takes the option files'
    /// user, else the login's name (`root`
    /// for the superuser), as the clients do. The passwords and the option
    /// files are read at each connect, as the clients read them, so a
    /// reconnect after a password rotation sends the new password;
    /// libpq's environment and service file are read once, when the
    /// locker is built (a password in the service file included).
    pub async fn connect(url: &str) -> Result<Locker> {
        Self::builder(url).connect().await
    }

    /// A builder for `url` (see [`Locker::connect`] for the schemes).
    pub fn builder(url: &str) -> LockerBuilder {
        LockerBuilder::new(Target::Url(url.to_owned()))
    }

    /// A builder for PostgreSQL from a tokio-postgres `Config` (for callers
    /// that already build one). TLS follows its `ssl_mode`: `disable`, or
    /// encryption without certificate verification (libpq's `prefer` and
    /// `require`); use a URL with `sslmode=verify-full` to verify. No
    /// password is looked up for it (`PGPASSWORD`, `~/.pgpass`): the
    /// `Config` says what to send.
    #[cfg(feature = "postgres")]
    pub fn pg_config_builder(config: tokio_postgres::Config) -> LockerBuilder {
        LockerBuilder::new(Target::PgConfig(Box::new(config)))
    }

    /// A builder for the local backend: lock files under `dir`, or (`None`)
    /// under env `DBMUTEX_LOCK_DIR`, else the host-wide `/run/lock/dbmutex`.
    pub fn local_builder(dir: Option<PathBuf>) -> LockerBuilder {
        LockerBuilder::new(Target::Local(dir))
    }
}

/// Builds a [`Locker`] with non-default settings.
#[derive(Clone, Debug)]
pub struct LockerBuilder {
    target: Target,
    settings: Settings,
}

#[derive(Clone)]
pub(crate) enum Target {
    Url(String),
    Local(Option<PathBuf>),
    #[cfg(feature = "postgres")]
    PgConfig(Box<tokio_postgres::Config>),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Described from parsed fields: never the string itself.
            Target::Url(u) => write!(f, "Url({})", crate::redact::redact_url(u)),
            Target::Local(p) => write!(f, "Local({p:?})"),
            #[cfg(feature = "postgres")]
            Target::PgConfig(c) => write!(f, "PgConfig({})", crate::redact::describe_pg_config(c)),
        }
    }
}

/// The default cap on locks one locker holds at once (see
/// [`LockerBuilder::max_locks`]): well below PostgreSQL's default lock table
/// (about 12,800 advisory locks for the whole server), which, once full,
/// makes every session's queries fail.
pub const DEFAULT_MAX_LOCKS: usize = 4096;

/// The default bound on names a locker waits for in the server at once (see
/// [`LockerBuilder::max_server_waits`]): with PostgreSQL's default of 100
/// connections, a dozen processes contending on many names at once still
/// leave room for everything else.
pub const DEFAULT_MAX_SERVER_WAITS: usize = 8;

/// The default for [`LockerBuilder::dead_peer_timeout`].
pub const DEFAULT_DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// The default for [`LockerBuilder::idle_timeout`]: long enough that a
/// reconnect a minute costs nothing worth counting, short enough that a
/// quiet locker soon holds no connection it does not need.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

impl LockerBuilder {
    pub(crate) fn new(target: Target) -> Self {
        LockerBuilder {
            target,
            settings: Settings {
                prefix: Prefix::from_env(),
                max_locks: DEFAULT_MAX_LOCKS,
                keepalive: Duration::from_secs(1),
                dead_peer_timeout: DEFAULT_DEAD_PEER_TIMEOUT,
                connect_timeout: Duration::from_secs(5),
                application_name: "dbmutex".into(),
                name_comments: true,
                max_server_waits: DEFAULT_MAX_SERVER_WAITS,
                idle_timeout: DEFAULT_IDLE_TIMEOUT,
                skip_pooler_check: false,
                metrics_name_label: false,
            },
        }
    }

    /// The key prefix (default: env `WITH_ADVISORY_LOCK_PREFIX`, else none).
    pub fn prefix(mut self, prefix: impl Into<Prefix>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// The most locks this locker holds at once (default
    /// [`DEFAULT_MAX_LOCKS`]); past it, acquisitions fail with
    /// [`Error::TooManyLocks`].
    pub fn max_locks(mut self, n: usize) -> Self {
        self.settings.max_locks = n;
        self
    }

    /// How soon a silently dead connection is noticed (default 1 s). A
    /// connection the server or the kernel closes (server restart,
    /// `pg_terminate_backend`, `KILL`, killed process) is reported lost at
    /// once on PostgreSQL. On MySQL/MariaDB the client only learns of it
    /// from the server: every 50 ms (or every `keepalive`, if shorter) one
    /// statement checks that the server still shows every held lock on its
    /// session — a `KILL` of the holder measured `lost()` p50 ≈ 32 ms, p99
    /// 49–114 ms; when that statement cannot reach the server (restart,
    /// crash), every lock session pings at once (restart measured p50
    /// 25–51 ms, max 210 ms) — and a ping every `keepalive` catches the rest.
    /// A silent failure (partition, hung server) is noticed on PostgreSQL by
    /// a probe that every connection holding a lock sends `keepalive` after
    /// the server last answered and that must be answered within
    /// `max(keepalive, 500 ms)`: within `keepalive + max(keepalive, 500 ms)`
    /// of the failure (2 s at the default; 1.80–1.99 s measured, see
    /// RELIABILITY.md); a waiting connection relies on TCP keepalive
    /// (`max(keepalive, 1 s)` idle and interval); on MySQL by a ping every
    /// `keepalive` (within `keepalive + max(2 × keepalive, 2 s)`; measured
    /// 2.0–2.9 s at the default 1 s). On PostgreSQL the same probe tells a
    /// holder whose server was a writable primary at connect and is now
    /// read-only or in recovery (a failover demoted it): within `keepalive`
    /// plus a round trip (94–704 ms measured at the default).
    pub fn keepalive(mut self, d: Duration) -> Self {
        self.settings.keepalive = d.max(Duration::from_millis(10));
        self
    }

    /// How soon the *server* frees the locks of a client that vanished
    /// without closing its connection — a silent partition, a frozen host
    /// or process, a client killed without a FIN (default
    /// [`DEFAULT_DEAD_PEER_TIMEOUT`], 10 s; at least twice the holder's own
    /// bound, `keepalive + max(keepalive, 500 ms)`, so a holder that can be
    /// told is told first).
    ///
    /// PostgreSQL, on a direct connection: the session's
    /// `tcp_keepalives_*`, `tcp_user_timeout`, `idle_session_timeout` and
    /// `client_connection_check_interval`; MySQL/MariaDB: the session's
    /// `wait_timeout` and `net_write_timeout`. Each holder's keepalive keeps
    /// its own session busy, so only a client that stopped answering is cut
    /// off. A frozen process cannot be told it lost its lock; fencing
    /// tokens ([`LockOptions::fenced`](crate::LockOptions::fenced)) cover
    /// that case. Behind a pooler the server's peer is the pooler, and the
    /// pooler's own settings decide.
    pub fn dead_peer_timeout(mut self, d: Duration) -> Self {
        self.settings.dead_peer_timeout = d;
        self
    }

    /// How long connecting may take before failing (default 5 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.settings.connect_timeout = d;
        self
    }

    /// The `application_name` the server shows for lock connections
    /// (default `dbmutex`; a URL's own `application_name` wins).
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.settings.application_name = name.into();
        self
    }

    /// Whether PostgreSQL shows lock names in SQL comments (default `true`,
    /// as the gem does), where they are seen: a statement that waits in the
    /// server carries the name (so `pg_stat_activity` shows who waits for
    /// what), and a lock connection's keepalive probe carries the name of its
    /// last lock (so `pg_stat_activity` and another process's `dbmutex list`
    /// name it once the connection has been quiet for the
    /// [`keepalive`](Self::keepalive) period; a locker's own `list` names its
    /// locks at once). The lock session's try and unlock statements carry no
    /// name, and are parsed once per connection: on a connection that
    /// reaches the server itself (the server's own address and port for the
    /// session are the ones dialed: no proxy in between), as protocol-level
    /// prepared statements from its second lock of a kind (the first
    /// prepares and runs in one round trip, as below); anywhere else (a
    /// pooler, a Unix socket, several hosts), `PREPARE`d under a name of the
    /// connection's own (`dbmutex_`
    /// and its random claim token) and run with `EXECUTE`, safe behind any
    /// pooler (no other client can know the name), at the cost of a small
    /// parse per statement (BENCHMARKS.md). With `false`, no statement
    /// carries a name, and the lock session's statements are protocol-level
    /// prepared everywhere: not for use behind a pooler that could slip past
    /// the connect-time check, because tokio-postgres names them `s0`, `s1`,
    /// … in every process, so a name could meet another client's statement.
    /// [`postgres::lock_xact`](crate::postgres::lock_xact) in your own
    /// transaction always carries it.
    pub fn name_comments(mut self, on: bool) -> Self {
        self.settings.name_comments = on;
        self
    }

    /// The most waits in the server (and locks won by them, until released)
    /// this locker (and its clones) has at once under the default
    /// [`WaitStrategy::TryThenServer`](crate::WaitStrategy::TryThenServer)
    /// (default [`DEFAULT_MAX_SERVER_WAITS`]). Each takes a server connection
    /// of its own (up to 4 of them are kept idle afterwards for the next
    /// wait); past the bound, waiters poll on the shared lock session
    /// instead. Waits asked for with [`WaitStrategy::Server`](crate::WaitStrategy::Server)
    /// are not counted. PostgreSQL
    /// only (MySQL holds every lock on a connection of its own anyway; the
    /// local backend always polls). `0` makes every wait poll.
    pub fn max_server_waits(mut self, n: usize) -> Self {
        self.settings.max_server_waits = n;
        self
    }

    /// How long a connection besides the lock session may sit unused before
    /// it is closed (default [`DEFAULT_IDLE_TIMEOUT`], 60 s). On PostgreSQL
    /// that is the side connection (introspection and lock-table counts
    /// while the lock session is in use, listings, records) and the idle
    /// connections kept for the next wait in the server, so a locker that
    /// has been quiet this long keeps one server connection, its lock
    /// session, however many locks it holds
    /// there (a lock won by a wait in the server keeps the connection it
    /// waited on until released). On MySQL it is the clean connections kept
    /// for the next lock (each held lock keeps its own). A connection in use
    /// is never closed for this; the next need opens a new one. It is at
    /// most half the server's bound for idle sessions
    /// ([`dead_peer_timeout`](Self::dead_peer_timeout), 5 s by default), so
    /// dbmutex closes an idle connection before the server cuts it off.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = dbmutex::Locker::builder("postgres://127.0.0.1/app")
    ///     .idle_timeout(Duration::from_secs(10));
    /// # drop(builder);
    /// ```
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.settings.idle_timeout = d;
        self
    }

    /// Whether metrics carry the lock's name as a `name` label (default
    /// `false`; crate docs, "Metrics"). Every distinct name then makes
    /// series of its own in the recorder, kept for the life of the process:
    /// turn it on only for a small, fixed set of names, never for names
    /// made from ids (one per user, per job...). Without the `metrics`
    /// feature it has no effect.
    pub fn metrics_name_label(mut self, on: bool) -> Self {
        self.settings.metrics_name_label = on;
        self
    }

    /// For dbmutex's own tests: skips the connect-time pooler check
    /// (PostgreSQL), as if a pooler had slipped past it, so that the checks
    /// every lock statement carries are tested alone. Never useful otherwise.
    #[doc(hidden)]
    pub fn skip_pooler_check_for_tests(mut self) -> Self {
        self.settings.skip_pooler_check = true;
        self
    }

    /// Creates the locker. Database backends connect now, so a wrong URL,
    /// an unreachable server or bad credentials fail here.
    pub async fn connect(self) -> Result<Locker> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // The target as `Target`'s Debug describes it: never the string itself.
        let target = tracing::enabled!(tracing::Level::DEBUG).then(|| format!("{:?}", self.target));
        if let Some(t) = &target {
            tracing::debug!(target_db = %t, "dbmutex: connecting");
        }
        let r = self.connect_inner(id).await;
        if let (Some(t), Err(e)) = (&target, &r) {
            tracing::debug!(target_db = %t, error = %e, "dbmutex: connect failed");
        }
        r
    }

    async fn connect_inner(self, id: u64) -> Result<Locker> {
        let settings = self.settings;
        let engine: Arc<dyn Engine> = match &self.target {
            Target::Local(dir) => local(dir.clone(), settings, id)?,
            #[cfg(feature = "postgres")]
            Target::PgConfig(config) => {
                let b = crate::postgres::PgBackend::from_config((**config).clone(), &settings).await?;
                Arc::new(Pipeline::new(b, BackendKind::Postgres, settings, id))
            }
            Target::Url(url) => {
                // A URL the driver would misread is refused before anything
                // connects: its password would reach the server as a host or
                // database name (and come back in the server's error).
                crate::redact::check(url)?;
                match BackendKind::from_url(url) {
                    #[cfg(feature = "postgres")]
                    Some(BackendKind::Postgres) => {
                        let b = crate::postgres::PgBackend::connect(url, &settings).await?;
                        Arc::new(Pipeline::new(b, BackendKind::Postgres, settings, id))
                    }
                    #[cfg(feature = "mysql")]
                    Some(BackendKind::Mysql) => {
                        let b = crate::mysql::MyBackend::connect(url, &settings).await?;
                        Arc::new(Pipeline::new(b, BackendKind::Mysql, settings, id))
                    }
                    #[cfg(feature = "etcd")]
                    Some(BackendKind::Etcd) => {
                        let parsed = crate::redact::parse_etcd(url.split_once("://").map_or("", |(_, r)| r))?;
                        let b = crate::etcd::EtcdBackend::connect(&parsed, &settings).await?;
                        Arc::new(Pipeline::new(b, BackendKind::Etcd, settings, id))
                    }
                    Some(BackendKind::Local) => local(
                        Some(PathBuf::from(crate::redact::file_url_path(url)?)),
                        settings,
                        id,
                    )?,
                    #[allow(unreachable_patterns)]
                    Some(kind) => {
                        return Err(Error::Config(format!(
                            "the {} backend is not built in (cargo feature `{}`)",
                            kind.as_str(),
                            kind.as_str()
                        )))
                    }
                    None => {
                        return Err(Error::Config(match crate::types::split_scheme(url) {
                            Some((s, _)) => format!(
                            "unsupported URL scheme {s:?}: use postgres://, mysql://, mariadb://, file:// or etcd://"
                        ),
                            None => format!(
                                "not a URL: {} (expected postgres://, mysql://, mariadb://, file:// or etcd://)",
                                crate::redact::redact_url(url)
                            ),
                        }))
                    }
                }
            }
        };
        Ok(Locker::from_engine(engine))
    }
}

/// The local backend in its pipeline.
fn local(dir: Option<PathBuf>, settings: Settings, id: u64) -> Result<Arc<dyn Engine>> {
    let b = crate::local::LocalBackend::new(dir, &settings)?;
    Ok(Arc::new(Pipeline::new(b, BackendKind::Local, settings, id)))
}

#[cfg(all(test, feature = "postgres"))]
impl Settings {
    /// The builder's defaults, for unit tests of what takes settings.
    pub(crate) fn for_tests() -> Self {
        LockerBuilder::new(Target::Local(None)).settings
    }
}
