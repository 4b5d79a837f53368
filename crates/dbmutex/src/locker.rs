//! The `Locker`: one entry point for every backend.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::core::guard::LockGuard;
use crate::core::pipeline::Engine;
use crate::core::scope;
use crate::core::scoped::{self, Held};
use crate::types::{BackendKind, Capabilities, HeldLock, Holder, ListedLock, Outcome};
use crate::{Error, LockName, LockOptions, Result};

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
    engine: Arc<dyn Engine>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.backend())
            .field("held", &self.held_count())
            .finish()
    }
}

impl Locker {
    /// Which backend this locker uses.
    pub fn backend(&self) -> BackendKind {
        self.engine.kind()
    }

    /// What this locker can do now: its backend's
    /// [`capabilities`](BackendKind::capabilities), less what the server
    /// in front of it rules out (PostgreSQL behind a transaction pooler has
    /// no session locks).
    pub fn capabilities(&self) -> Capabilities {
        self.engine.capabilities()
    }

    /// The number of locks held through this locker (and its clones) now.
    pub fn held_count(&self) -> usize {
        self.engine.held_count()
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
    // Not an `async fn`: the engine's future is returned as it is, with
    // no state machine of its own around it (one layer fewer to poll and
    // move per acquisition).
    pub fn acquire<'a>(
        &'a self,
        name: impl Into<LockName>,
        opts: &'a LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send + 'a {
        self.engine.acquire(name.into(), opts)
    }

    /// Runs `f` under the lock and returns its value, or
    /// [`Outcome::NotAcquired`] when the lock was not acquired within the
    /// wait (`f` did not run).
    ///
    /// - Re-entrant: a nested call for the same name in the same task (on
    ///   this locker), in the same mode or shared inside exclusive, runs `f`
    ///   at once, with no SQL (and no new fencing token: a fenced nested
    ///   call inside an unfenced one is [`Error::Unsupported`]).
    /// - Upgrade: a nested *exclusive* call inside a *shared* one for the
    ///   same name in the same task (on this locker) upgrades the lock, as
    ///   the Ruby gem allows on PostgreSQL. The task keeps its shared lock
    ///   throughout (there is no moment without a lock) and waits, within
    ///   the nested call's options, only for the *other* holders — other
    ///   tasks of this locker (shared requests arriving meanwhile queue
    ///   behind the upgrade), other lockers and processes. Then `f` runs
    ///   holding the name exclusive, and when the nested call ends the lock
    ///   is back to shared (still held by the outer call). Not acquired in
    ///   time ([`LockOptions::try_once`], a timeout): [`Outcome::NotAcquired`],
    ///   the shared lock intact; cancelled at any point: the shared lock
    ///   intact, nothing exclusive left held. Two tasks that both hold the
    ///   name shared and both upgrade wait for each other: among the tasks
    ///   of one locker the second upgrader gets [`Error::Deadlock`] at once
    ///   (the first goes on waiting for the second's shared lock). On
    ///   PostgreSQL only (see [`crate::postgres`] for between processes); the
    ///   local backend refuses it with [`Error::Unsupported`] (`flock(2)`
    ///   drops the shared lock before taking the exclusive one), as do a
    ///   transaction-level lock on either side and a fenced nested call.
    ///   Inside the upgraded call, nested shared and exclusive calls for the
    ///   name are re-entrant.
    /// - A guard ([`Locker::acquire`]) for a name this task holds in a
    ///   scoped call of this locker, in a mode the hold excludes (exclusive
    ///   inside shared, anything inside exclusive), would wait for the task
    ///   itself: a try ([`LockOptions::try_once`]) finds it busy (`None`),
    ///   a wait fails at once with [`Error::Deadlock`].
    /// - With [`LockOptions::fenced`], `f` reads its token from
    ///   [`current_locks`](crate::current_locks) (`.last()`'s
    ///   [`HeldLock::fence`]).
    /// - If the lock is lost while `f` runs, `f` is dropped at its next await
    ///   point and the call returns [`Error::LockLost`]; past
    ///   [`LockOptions::max_hold`], the same, then the lock is released (an
    ///   upgrade: back to shared) and the call returns
    ///   [`Error::MaxHoldExceeded`].
    /// - An error value from `f` is just a value: the lock is released and the
    ///   value returned. A panic in `f` releases the lock and propagates.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops `f` and releases the lock (an
    /// upgrade: drops the exclusive lock, the shared one stays).
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
            fence: None,
            locker_id: self.engine.id(),
        };
        let stack = scope::stack();
        if let Some(outer) = stack.iter().find(|s| s.held.is_same_lock(&me)) {
            if opts.fenced && outer.held.fence.is_none() {
                return Err(Error::Unsupported(format!(
                    "a fenced scoped call for {:?} inside an unfenced one for the same lock: \
                     the enclosing call holds it without a token (fence the outer call)",
                    me.name.to_string()
                )));
            }
            return Ok(Outcome::Acquired(f().await));
        }
        let held = match stack.iter().find(|s| s.held.is_upgraded_by(&me)) {
            Some(outer) => match self.engine.upgrade(&me.name, opts, outer.upgrade.clone()).await? {
                Some(x) => Held::Upgraded(x),
                None => return Ok(Outcome::NotAcquired),
            },
            None => match self.acquire(me.name.clone(), opts).await? {
                Some(g) => Held::Guard(g),
                None => return Ok(Outcome::NotAcquired),
            },
        };
        let name = me.name.to_string();
        match scoped::within(&held, me, f).await {
            Some(v) => {
                if let Err(e) = held.release().await {
                    // The work is done and the connection is closed, so the
                    // server has freed the lock: the value stands.
                    tracing::warn!(error = %e, "dbmutex: unlock after a scoped call failed");
                }
                Ok(Outcome::Acquired(v))
            }
            None => Err(held.stopped(name, opts).await),
        }
    }

    /// The scope entry of a lock this locker holds through `guard`.
    pub(crate) fn scope_entry(&self, guard: &LockGuard) -> HeldLock {
        HeldLock {
            name: guard.name().clone(),
            mode: guard.mode(),
            backend: self.backend(),
            fence: guard.fence(),
            locker_id: self.engine.id(),
        }
    }

    /// Whether this task holds `name` (in either mode) in a scoped call of
    /// this locker.
    pub(crate) fn held_in_scope(&self, name: &LockName) -> bool {
        let id = self.engine.id();
        scope::current_locks()
            .iter()
            .any(|h| h.locker_id == id && &h.name == name)
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

    /// As [`Locker::with_lock`], for a closure that returns a `Result`: its
    /// error is the call's error, and so is dbmutex's own (converted with
    /// `From<Error>`), so one `?` unpacks what would otherwise be a
    /// `Result<Outcome<Result<T, E>>>`.
    ///
    /// ```no_run
    /// # async fn demo(locker: dbmutex::Locker) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use dbmutex::{LockOptions, Outcome};
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    /// let outcome = locker
    ///     .with_lock_result("import", &LockOptions::new(), || async {
    ///         let n: u64 = "42".parse()?; // the closure's own errors...
    ///         Ok::<_, BoxError>(n)
    ///     })
    ///     .await?; // ...and dbmutex's, in one `?`
    /// if let Outcome::Acquired(n) = outcome {
    ///     println!("imported {n}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::with_lock`].
    pub async fn with_lock_result<T, E, F, Fut>(
        &self,
        name: impl Into<LockName>,
        opts: &LockOptions,
        f: F,
    ) -> std::result::Result<Outcome<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.with_lock(name, opts, f).await?.transpose()
    }

    /// Whether anyone holds `name` now (either mode). A snapshot: the answer
    /// may be stale by the time you read it; use `try_lock` to act on it.
    pub async fn is_locked(&self, name: impl Into<LockName>) -> Result<bool> {
        self.engine.is_locked(name.into()).await
    }

    /// Who holds `name` now, as far as the server tells (a snapshot).
    pub async fn holders(&self, name: impl Into<LockName>) -> Result<Vec<Holder>> {
        self.engine.holders(name.into()).await
    }

    /// Every lock held on the server now (PostgreSQL: this database's
    /// advisory locks; MySQL: user locks the server shows; local: this lock
    /// directory's held files), with the name where it can be known.
    pub async fn list(&self) -> Result<Vec<ListedLock>> {
        self.engine.list().await
    }

    /// Creates the tables dbmutex keeps on the server if they are missing:
    /// `dbmutex_fence`, which issues fencing tokens ([`LockOptions::fenced`];
    /// see [`crate::fence`]), and `dbmutex_runs`, which records
    /// once-per-window runs ([`crate::runs`]). For deployments whose
    /// application role may not create tables, run once by a role that may
    /// (`dbmutex init` does). The local backend has nothing to create.
    pub async fn create_tables(&self) -> Result<()> {
        self.engine.create_tables().await
    }

    /// The last once-per-window run recorded for `name`
    /// ([`Locker::once_per`], `dbmutex run --once-per`; see [`crate::runs`]),
    /// read without taking the lock: `None` if none was ever recorded.
    pub async fn last_run(&self, name: impl Into<LockName>) -> Result<Option<crate::runs::LastRun>> {
        self.engine.last_run(name.into()).await
    }

    /// The database key `name` maps to on this locker's backend and prefix.
    pub fn key_of(&self, name: impl Into<LockName>) -> Result<String> {
        self.engine.key_of(&name.into())
    }
}

impl Locker {
    pub(crate) fn from_engine(engine: Arc<dyn Engine>) -> Self {
        Locker { engine }
    }
}
