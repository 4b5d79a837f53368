//! The `Locker`: one entry point for every backend.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guard::{Held, LockGuard};
use crate::key::Prefix;
pub(crate) use crate::settings::Settings;
use crate::types::{BackendKind, Holder, ListedLock};
use crate::{Error, LockName, LockOptions, Mode, Result};

/// A lock held by the current task through [`Locker::with_lock`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// The lock's name.
    pub name: LockName,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The backend that holds it.
    pub backend: BackendKind,
    locker_id: u64,
}

impl HeldLock {
    /// The id of the [`Locker`] that holds it.
    pub(crate) fn locker_id(&self) -> u64 {
        self.locker_id
    }
}

tokio::task_local! {
    static HELD: Vec<HeldLock>;
}

/// The locks the current task holds through [`Locker::with_lock`] (any
/// locker), outermost first. Empty outside any scoped call. Locks held
/// through guards are not listed: a guard can move between tasks.
pub fn current_locks() -> Vec<HeldLock> {
    HELD.try_with(|h| h.clone()).unwrap_or_default()
}

/// The result of a scoped call: the closure's value, or "not acquired".
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Outcome<T> {
    /// The lock was acquired and the closure returned this value.
    Acquired(T),
    /// The lock was not acquired within the wait; the closure did not run.
    NotAcquired,
}

impl<T> Outcome<T> {
    /// `Some(value)` if the closure ran.
    pub fn acquired(self) -> Option<T> {
        match self {
            Outcome::Acquired(v) => Some(v),
            Outcome::NotAcquired => None,
        }
    }

    /// True if the closure ran.
    pub fn was_acquired(&self) -> bool {
        matches!(self, Outcome::Acquired(_))
    }
}

/// Backend operations behind a [`Locker`].
pub(crate) enum Backend {
    #[cfg(feature = "postgres")]
    Postgres(Box<crate::postgres::PgBackend>),
    #[cfg(feature = "mysql")]
    Mysql(crate::mysql::MyBackend),
    Local(crate::local::LocalBackend),
}

macro_rules! dispatch {
    ($backend:expr, $b:ident => $body:expr) => {
        match $backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres($b) => $body,
            #[cfg(feature = "mysql")]
            Backend::Mysql($b) => $body,
            Backend::Local($b) => $body,
        }
    };
}

struct Inner {
    backend: Backend,
    settings: Settings,
    id: u64,
    count: Arc<AtomicUsize>,
}

/// A handle for taking locks on one backend. Cheap to clone; clones share
/// connections and in-process arbitration.
///
/// ```no_run
/// # async fn demo() -> Result<(), dbmutex::Error> {
/// use dbmutex::{Locker, LockOptions, Outcome};
/// let locker = Locker::connect("postgres://postgres@127.0.0.1/test").await?;
///
/// // Scoped: run a closure under the lock.
/// let out = locker
///     .with_lock("account-sync-42", &LockOptions::try_once(), || async { 42 })
///     .await?;
/// assert_eq!(out, Outcome::Acquired(42));
///
/// // Guard: hold it as long as you like, release explicitly.
/// let guard = locker.lock("nightly-report").await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.backend())
            .field("held", &self.held_count())
            .finish()
    }
}

/// Builds a [`Locker`] with non-default settings.
#[derive(Clone, Debug)]
pub struct LockerBuilder {
    target: Target,
    settings: Settings,
}

#[derive(Clone)]
enum Target {
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

impl LockerBuilder {
    fn new(target: Target) -> Self {
        LockerBuilder {
            target,
            settings: Settings {
                prefix: Prefix::from_env(),
                max_locks: DEFAULT_MAX_LOCKS,
                keepalive: Duration::from_secs(1),
                connect_timeout: Duration::from_secs(5),
                application_name: "dbmutex".into(),
                name_comments: true,
                skip_pooler_check: false,
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
    /// 2.0–2.9 s at the default 1 s).
    pub fn keepalive(mut self, d: Duration) -> Self {
        self.settings.keepalive = d.max(Duration::from_millis(10));
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

    /// Whether PostgreSQL lock statements carry the lock name in an SQL
    /// comment (default `true`, as the gem does): `pg_stat_activity` and
    /// `dbmutex list` then show which name a session locked last. The
    /// comment makes each statement's text unique, so it runs unprepared
    /// (one round trip, parsed each time); with `false`, lock statements are
    /// prepared once per connection, which is cheaper for the server. See
    /// BENCHMARKS.md for what the comment costs.
    pub fn name_comments(mut self, on: bool) -> Self {
        self.settings.name_comments = on;
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
        let backend = match &self.target {
            Target::Local(dir) => {
                Backend::Local(crate::local::LocalBackend::new(dir.clone(), &self.settings)?)
            }
            #[cfg(feature = "postgres")]
            Target::PgConfig(config) => Backend::Postgres(Box::new(
                crate::postgres::PgBackend::from_config((**config).clone(), &self.settings).await?,
            )),
            Target::Url(url) => {
                // A URL the driver would misread is refused before anything
                // connects: its password would reach the server as a host or
                // database name (and come back in the server's error).
                crate::redact::check(url)?;
                match BackendKind::from_url(url) {
                    #[cfg(feature = "postgres")]
                    Some(BackendKind::Postgres) => Backend::Postgres(Box::new(
                        crate::postgres::PgBackend::connect(url, &self.settings).await?,
                    )),
                    #[cfg(feature = "mysql")]
                    Some(BackendKind::Mysql) => {
                        Backend::Mysql(crate::mysql::MyBackend::connect(url, &self.settings, id).await?)
                    }
                    Some(BackendKind::Local) => Backend::Local(crate::local::LocalBackend::new(
                        Some(PathBuf::from(crate::redact::file_url_path(url)?)),
                        &self.settings,
                    )?),
                    #[allow(unreachable_patterns)]
                    Some(kind) => {
                        return Err(Error::Config(format!(
                            "the {} backend is not built in (cargo feature `{}`)",
                            kind.as_str(),
                            kind.as_str()
                        )))
                    }
                    None => {
                        return Err(Error::Config(match crate::redact::split_scheme(url) {
                            Some((s, _)) => format!(
                            "unsupported URL scheme {s:?}: use postgres://, mysql://, mariadb:// or file://"
                        ),
                            None => format!(
                                "not a URL: {} (expected postgres://, mysql://, mariadb:// or file://)",
                                crate::redact::redact_url(url)
                            ),
                        }))
                    }
                }
            }
        };
        Ok(Locker {
            inner: Arc::new(Inner {
                backend,
                settings: self.settings,
                id,
                count: Arc::new(AtomicUsize::new(0)),
            }),
        })
    }
}

impl Locker {
    /// Connects with default settings. `postgres://` / `postgresql://`,
    /// `mysql://` / `mariadb://`, or `file:///lock/dir` for the local backend.
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
    /// `require`); use a URL with `sslmode=verify-full` to verify.
    #[cfg(feature = "postgres")]
    pub fn pg_config_builder(config: tokio_postgres::Config) -> LockerBuilder {
        LockerBuilder::new(Target::PgConfig(Box::new(config)))
    }

    /// A builder for the local backend: lock files under `dir`, or (`None`)
    /// under env `DBMUTEX_LOCK_DIR`, else the host-wide `/run/lock/dbmutex`.
    pub fn local_builder(dir: Option<PathBuf>) -> LockerBuilder {
        LockerBuilder::new(Target::Local(dir))
    }

    /// Which backend this locker uses.
    pub fn backend(&self) -> BackendKind {
        dispatch!(&self.inner.backend, _b => _b.kind())
    }

    /// The number of locks held through this locker (and its clones) now.
    pub fn held_count(&self) -> usize {
        self.inner.count.load(Ordering::Relaxed)
    }

    /// Waits as long as it takes for an exclusive lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: if the future is dropped at any point, the lock is not
    /// left held (an acquisition already under way in the server is undone).
    pub async fn lock(&self, name: impl Into<LockName>) -> Result<LockGuard> {
        match self.acquire(name, &LockOptions::new()).await? {
            Some(g) => Ok(g),
            None => unreachable!("a wait without a bound only ends acquired or with an error"),
        }
    }

    /// Tries once for an exclusive lock; `None` if someone holds it.
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::lock`].
    pub async fn try_lock(&self, name: impl Into<LockName>) -> Result<Option<LockGuard>> {
        self.acquire(name, &LockOptions::try_once()).await
    }

    /// Acquires with the given options; `None` when the wait ended without
    /// the lock (contention, timeout).
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::lock`].
    pub async fn acquire(&self, name: impl Into<LockName>, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let name = name.into();
        name.validate()?;
        let inner = &self.inner;
        // Reserve a place before the first await, atomically, so concurrent
        // acquirers never pass the cap together.
        let limit = inner.settings.max_locks;
        if inner
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Error::TooManyLocks { limit });
        }
        let reservation = Reservation(&inner.count);
        let start = Instant::now();
        // Events inside the backend (contention, waits) carry the name.
        let span = tracing::debug_span!("dbmutex", name = %name, mode = opts.mode.as_str());
        let held: Option<Box<dyn Held>> = tracing::Instrument::instrument(
            async { dispatch!(&inner.backend, b => b.acquire(&name, opts, &inner.settings).await) },
            span,
        )
        .await?;
        let waited = start.elapsed();
        let waited_us = waited.as_micros() as u64;
        match held {
            Some(h) => {
                std::mem::forget(reservation);
                tracing::debug!(name = %name, mode = opts.mode.as_str(), waited_us, "dbmutex: acquired");
                Ok(Some(LockGuard::new(h, name, opts.mode, inner.count.clone())))
            }
            None if opts.is_try_once() => {
                tracing::debug!(name = %name, "dbmutex: busy (tried once)");
                Ok(None)
            }
            None => {
                tracing::debug!(name = %name, waited_us, "dbmutex: timed out");
                Ok(None)
            }
        }
    }

    /// Runs `f` under the lock and returns its value, or
    /// [`Outcome::NotAcquired`] when the lock was not acquired within the
    /// wait (`f` did not run).
    ///
    /// - Re-entrant: a nested call for the same name and mode in the same task
    ///   (on this locker) runs `f` at once, with no SQL.
    /// - If the lock is lost while `f` runs, `f` is dropped at its next await
    ///   point and the call returns [`Error::LockLost`].
    /// - An error value from `f` is just a value: the lock is released and the
    ///   value returned. A panic in `f` releases the lock and propagates.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops `f` and releases the lock.
    pub async fn with_lock<T, F, Fut>(
        &self,
        name: impl Into<LockName>,
        opts: &LockOptions,
        f: F,
    ) -> Result<Outcome<T>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let name = name.into();
        let me = HeldLock {
            name,
            mode: opts.mode,
            backend: self.backend(),
            locker_id: self.inner.id,
        };
        let mut stack = current_locks();
        if stack.contains(&me) {
            return Ok(Outcome::Acquired(f().await));
        }
        let Some(guard) = self.acquire(me.name.clone(), opts).await? else {
            return Ok(Outcome::NotAcquired);
        };
        let lost = guard.lost();
        stack.push(me);
        let run = HELD.scope(stack, async {
            tokio::select! {
                biased;
                v = f() => Some(v),
                () = lost => None,
            }
        });
        match run.await {
            Some(v) => {
                if let Err(e) = guard.release().await {
                    // The work is done and the connection is closed, so the
                    // server has freed the lock: the value stands.
                    tracing::warn!(error = %e, "dbmutex: unlock after a scoped call failed");
                }
                Ok(Outcome::Acquired(v))
            }
            None => {
                let name = guard.name().to_string();
                tracing::warn!(name = %name, "dbmutex: lock lost during a scoped call; the work was stopped");
                drop(guard);
                Err(Error::LockLost { name })
            }
        }
    }

    /// As [`Locker::with_lock`], but "not acquired" is
    /// [`Error::NotAcquired`].
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::with_lock`].
    pub async fn with_lock_or_err<T, F, Fut>(
        &self,
        name: impl Into<LockName>,
        opts: &LockOptions,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let name = name.into();
        let start = Instant::now();
        match self.with_lock(name.clone(), opts, f).await? {
            Outcome::Acquired(v) => Ok(v),
            Outcome::NotAcquired => Err(Error::NotAcquired {
                name: name.to_string(),
                waited: start.elapsed(),
            }),
        }
    }

    /// Whether anyone holds `name` now (either mode). A snapshot: the answer
    /// may be stale by the time you read it; use `try_lock` to act on it.
    pub async fn is_locked(&self, name: impl Into<LockName>) -> Result<bool> {
        let name = name.into();
        name.validate()?;
        dispatch!(&self.inner.backend, b => b.is_locked(&name, &self.inner.settings).await)
    }

    /// Who holds `name` now, as far as the server tells (a snapshot).
    pub async fn holders(&self, name: impl Into<LockName>) -> Result<Vec<Holder>> {
        let name = name.into();
        name.validate()?;
        dispatch!(&self.inner.backend, b => b.holders(&name, &self.inner.settings).await)
    }

    /// Every lock held on the server now (PostgreSQL: this database's
    /// advisory locks; MySQL: user locks the server shows; local: this lock
    /// directory's held files), with the name where it can be known.
    pub async fn list(&self) -> Result<Vec<ListedLock>> {
        dispatch!(&self.inner.backend, b => b.list(&self.inner.settings).await)
    }

    /// The database key `name` maps to on this locker's backend and prefix.
    pub fn key_of(&self, name: impl Into<LockName>) -> Result<String> {
        let name = name.into();
        name.validate()?;
        let prefix = &self.inner.settings.prefix;
        // MySQL's lock strings depend on the server (MariaDB or MySQL).
        #[cfg(feature = "mysql")]
        if let Backend::Mysql(b) = &self.inner.backend {
            return b.key_of(&name, prefix);
        }
        match self.backend() {
            BackendKind::Postgres => Ok(crate::key::pg_key(&name, prefix).to_string()),
            BackendKind::Mysql => crate::key::mysql_lock_string(&name, prefix),
            BackendKind::Local => crate::key::local_file_name(&name, prefix),
        }
    }
}

/// Undoes a cap reservation unless forgotten.
struct Reservation<'a>(&'a AtomicUsize);

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
