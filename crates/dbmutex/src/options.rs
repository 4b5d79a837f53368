//! Per-acquisition options.

use std::time::Duration;

/// Exclusive or shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Mode {
    /// One holder at a time (the default).
    #[default]
    Exclusive,
    /// Any number of shared holders, excluded by an exclusive one (PostgreSQL
    /// and the local backend; MySQL answers [`Error::Unsupported`](crate::Error::Unsupported)).
    Shared,
}

impl Mode {
    /// `"exclusive"` or `"shared"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

/// How a waiter waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// The default. One try on the locker's shared lock session (the
    /// cheapest way when the lock is free), then a wait in the server's
    /// queue as [`WaitStrategy::Server`] does: fair between processes (the
    /// server hands the lock to the longest waiter), woken the moment any
    /// holder releases (the gem, psql, another dbmutex). Tasks of one
    /// process queue first come, first served in the process, so for an
    /// exclusive lock at most one task per name and locker waits in the
    /// server. A PostgreSQL locker has at most
    /// [`LockerBuilder::max_server_waits`](crate::LockerBuilder::max_server_waits)
    /// such waits (and locks won by them) at once, each on a connection of
    /// its own; past that it polls as [`WaitStrategy::Poll`]. PostgreSQL's
    /// deadlock detection sees only the waiting connection's own locks, so a
    /// cycle through other locks the process holds is not detected (as with
    /// [`WaitStrategy::Poll`]). The local backend always polls; MySQL always
    /// waits in the server.
    #[default]
    TryThenServer,
    /// Try, then retry with jittered, growing backoff (capped at
    /// [`LockOptions::max_backoff`]), woken early when a task of this process
    /// releases (and, on PostgreSQL, when a releasing dbmutex process says
    /// so). Costs the server nothing while waiting and uses no extra
    /// connection; no deadlock detection, and not fair: a process that
    /// releases and asks again at once may take the lock again before a
    /// polling waiter elsewhere looks.
    Poll,
    /// Block in the server (`pg_advisory_lock`, `GET_LOCK`) on a dedicated
    /// connection: the server queues waiters, hands the lock over the moment
    /// it is released, and (PostgreSQL) detects deadlocks. A bounded wait sets
    /// `lock_timeout` for that one statement only.
    Server,
}

/// Options for one acquisition. The default: exclusive, wait forever,
/// [`WaitStrategy::TryThenServer`].
///
/// ```
/// use std::time::Duration;
/// use dbmutex::{LockOptions, WaitStrategy};
/// let opts = LockOptions::new()
///     .timeout(Duration::from_millis(500))
///     .shared(true)
///     .wait_strategy(WaitStrategy::Server);
/// assert_eq!(opts.get_timeout(), Some(Duration::from_millis(500)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) timeout: Option<Duration>,
    pub(crate) mode: Mode,
    pub(crate) transaction: bool,
    pub(crate) strategy: WaitStrategy,
    pub(crate) max_backoff: Duration,
    pub(crate) fenced: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) lock_delay: Option<Duration>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            timeout: None,
            mode: Mode::Exclusive,
            transaction: false,
            strategy: WaitStrategy::TryThenServer,
            max_backoff: Duration::from_millis(100),
            fenced: false,
            max_hold: None,
            lock_delay: None,
        }
    }
}

impl LockOptions {
    /// Exclusive, wait forever, [`WaitStrategy::TryThenServer`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Try once: do not wait at all.
    pub fn try_once() -> Self {
        Self::new().timeout(Duration::ZERO)
    }

    /// Wait at most `d` (measured on a monotonic clock; a last attempt is made
    /// at the deadline). `Duration::ZERO` tries once.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Wait forever (the default).
    pub fn wait_forever(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// `Some(d)`: wait at most `d`; `None`: wait forever.
    pub fn timeout_opt(mut self, d: Option<Duration>) -> Self {
        self.timeout = d;
        self
    }

    /// Shared (`true`) or exclusive (`false`, the default).
    pub fn shared(mut self, shared: bool) -> Self {
        self.mode = if shared { Mode::Shared } else { Mode::Exclusive };
        self
    }

    /// Exclusive or shared.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Hold a transaction-level lock (`pg_advisory_xact_lock*`) inside a
    /// transaction that the guard keeps open on a dedicated connection; the
    /// lock ends with that transaction. This mode stays correct behind
    /// PgBouncer in transaction pooling. PostgreSQL only.
    pub fn transaction(mut self, transaction: bool) -> Self {
        self.transaction = transaction;
        self
    }

    /// How to wait (see [`WaitStrategy`]).
    pub fn wait_strategy(mut self, strategy: WaitStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The longest sleep between two polls (default 100 ms).
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d.max(Duration::from_millis(1));
        self
    }

    /// Issue a *fencing token* with the lock: [`LockGuard::fence`](crate::LockGuard::fence)
    /// then returns a number strictly greater than the token of every
    /// earlier holder of the same key, on any host, across client and server
    /// restarts (see the crate docs, "Fencing tokens"). It is issued while the
    /// lock is held, after it was granted, so token order is lock order; a
    /// token that cannot be issued releases the lock and fails the
    /// acquisition. Exclusive session locks only: with `shared(true)` or
    /// `transaction(true)` the acquisition fails with
    /// [`Error::Unsupported`](crate::Error::Unsupported). Costs one round
    /// trip (PostgreSQL, MySQL) or two `fsync`s (local backend) per
    /// acquisition.
    pub fn fenced(mut self, fenced: bool) -> Self {
        self.fenced = fenced;
        self
    }

    /// Whether a fencing token is issued with the lock.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// The longest the lock may be held (default: no limit). Past it the
    /// guard reports the hold as over, as it reports a loss:
    /// [`LockGuard::lost`](crate::LockGuard::lost) completes,
    /// [`LockGuard::max_hold_exceeded`](crate::LockGuard::max_hold_exceeded)
    /// turns true, and a scoped call ([`Locker::with_lock`](crate::Locker::with_lock))
    /// stops its closure at the next await point, releases the lock and
    /// returns [`Error::MaxHoldExceeded`](crate::Error::MaxHoldExceeded). A
    /// guard you hold yourself keeps the lock until you release or drop it:
    /// the limit is reported, never enforced behind your back. The CLI's
    /// `--max-hold` stops the command's process tree.
    ///
    /// ```
    /// use dbmutex::LockOptions;
    /// use std::time::Duration;
    /// let opts = LockOptions::new().max_hold(Duration::from_secs(3600));
    /// assert_eq!(opts.get_max_hold(), Some(Duration::from_secs(3600)));
    /// ```
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.max_hold = Some(d);
        self
    }

    /// The hold limit, if any.
    pub fn get_max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// *Lock-delay* (opt-in, as Chubby's and Consul's): when a holder of
    /// this name is lost uncleanly — killed, frozen, cut off, its session
    /// ended by the server — nobody gets the lock for `d` after its last
    /// sign of life, by the server's clock, so that the lost holder's
    /// in-flight work drains before the next holder starts. A lock released
    /// cleanly ([`LockGuard::release`](crate::LockGuard::release), or a
    /// dropped guard inside a runtime) opens at once.
    ///
    /// How: while held, the holder keeps a record `closed_until = now + d +
    /// beat` on the lock's own session, renewed every `beat` (a quarter of
    /// `d`, between 100 ms and 1 s); a clean release clears it before the
    /// unlock. The next holder is granted the server lock as usual, then
    /// finds the record and waits (holding the lock, so others queue
    /// behind it) until `closed_until` has passed: the lock stays closed
    /// between `d` and `d + beat` after the lost holder's last renewal.
    /// A wait that the acquisition's timeout cannot cover ends as "not
    /// acquired" at once (the record is left as it was). Every holder of the
    /// name should ask for the same `d`: a holder without lock-delay neither
    /// honours nor writes the record.
    ///
    /// PostgreSQL and MySQL/MariaDB keep the record in a `dbmutex_delay`
    /// table (created on first use, or by
    /// [`Locker::create_tables`](crate::Locker::create_tables) / `dbmutex
    /// init`), written on the lock's own session while it is held; the
    /// local backend in `<lock file>.delay`. Exclusive session locks only:
    /// with `shared(true)` or `transaction(true)` the acquisition fails with
    /// [`Error::Unsupported`](crate::Error::Unsupported), as it does on etcd.
    /// Costs two round trips per acquisition, one per release, and one write
    /// per `beat` while held. `Duration::ZERO` turns it off.
    ///
    /// A guard dropped (not released) opens the record and unlocks in the
    /// background: until then, a new request of this process for the same
    /// name may find it busy. Use [`LockGuard::release`](crate::LockGuard::release)
    /// to take it again at once.
    ///
    /// ```
    /// use dbmutex::LockOptions;
    /// use std::time::Duration;
    /// let opts = LockOptions::new().lock_delay(Duration::from_secs(15));
    /// assert_eq!(opts.get_lock_delay(), Some(Duration::from_secs(15)));
    /// ```
    pub fn lock_delay(mut self, d: Duration) -> Self {
        self.lock_delay = (!d.is_zero()).then_some(d);
        self
    }

    /// The lock-delay, if any.
    pub fn get_lock_delay(&self) -> Option<Duration> {
        self.lock_delay
    }

    /// The wait bound: `None` = forever.
    pub fn get_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The lock mode.
    pub fn get_mode(&self) -> Mode {
        self.mode
    }

    /// Whether this is a transaction-level lock.
    pub fn is_transaction(&self) -> bool {
        self.transaction
    }

    /// The wait strategy.
    pub fn get_wait_strategy(&self) -> WaitStrategy {
        self.strategy
    }

    /// True when the options ask for a single attempt.
    pub(crate) fn is_try_once(&self) -> bool {
        self.timeout == Some(Duration::ZERO)
    }
}
