//! The MySQL / MariaDB backend: user locks (`GET_LOCK`).
//!
//! # How locks are held
//!
//! A lock lives on a server session of its own: `GET_LOCK` blocks its
//! connection while it waits and MySQL connections cannot pipeline, so a
//! session shared by unrelated tasks would stall them all; and a lock whose
//! session holds nothing else can be released by closing the connection,
//! with no round trip and no runtime. The one exception: an acquisition made
//! inside a scoped call ([`Locker::with_lock`](crate::Locker::with_lock))
//! that holds a lock of the same locker runs on that lock's session, as the
//! Ruby gem's nested locks do, so the server sees who waits for whom.
//!
//! Connections are plain `mysql_async::Conn`s, never `mysql_async::Pool`
//! members: the pool resets connections it takes back, and a reset silently
//! releases every user lock. When a session's last lock is released and the
//! server confirms it holds nothing (`RELEASE_LOCK` = 1 and
//! `RELEASE_ALL_LOCKS` = 0 in one statement), the connection is kept, up to
//! a few, for the next acquisition; any other outcome closes it.
//!
//! Tasks of one process first take an in-process hold on the lock string,
//! so a second acquisition of a held name waits (or is refused) exactly as
//! on PostgreSQL, even inside a scoped call on the holder's session.
//!
//! # Waiting
//!
//! `GET_LOCK` always waits in the server, so [`WaitStrategy`](crate::WaitStrategy)
//! makes no difference here. A wait is a series of `GET_LOCK(name, t)`
//! calls, each with the remaining time in fractional seconds but at most an
//! hour (MariaDB rejects negative timeouts instead of waiting forever, and
//! answers 0 at once to timeouts beyond about 1.7e10 s); "wait forever"
//! repeats them without end. A nested acquisition (below) waits in chunks of
//! at most a second, giving the session back between them.
//!
//! Each `GET_LOCK` call is also bounded in the client: if no answer comes
//! within its timeout plus `2 × keepalive + 2 s` (a silent network
//! partition, a stalled server), the session is treated as dead — closed and
//! killed from another connection — and the acquisition fails with
//! [`Error::Connect`]. No wait outlives its bound by more than that margin.
//!
//! If an acquisition is dropped while `GET_LOCK` runs on a session of its
//! own, that session is killed (`KILL CONNECTION` from another connection,
//! sent in the background), so the abandoned wait cannot keep the lock. If
//! the holder releases in the few milliseconds before the `KILL` lands, the
//! abandoned session may take the lock for that moment; the `KILL` then
//! frees it (the next waiter is delayed, no one runs unprotected). A nested
//! acquisition runs on the enclosing lock's session, which must survive: its
//! wait runs in a task of its own, and when the acquisition is dropped that
//! task ends the statement with `KILL QUERY` (from another connection),
//! reads the result, releases the lock if `GET_LOCK` took it first, and only
//! then gives the session back. The enclosing lock stays held throughout;
//! its release waits for the session meanwhile.
//!
//! Limit: statements on one session run one at a time, so releasing a lock
//! held on a session (a nested guard, or the enclosing one) waits for the
//! `GET_LOCK` chunk or keepalive ping in progress there — at most about a
//! second plus the margin above in normal operation. If the session stays
//! busy much longer than that (bounded by a few multiples of that margin
//! plus the connect timeout), the release gives up: the session is killed,
//! which frees every lock it held, and the release reports an error.
//!
//! # Deadlocks
//!
//! The server detects a cycle among sessions that wait while holding:
//! workers that nest scoped calls in opposite orders. The requester that
//! closes the cycle gets [`Error::Deadlock`] at once and keeps its other
//! locks. Locks held through separate guards live on separate sessions, so
//! the server cannot relate them; neither can it see tasks of one
//! [`Locker`](crate::Locker) waiting in the in-process hold. Use timeouts
//! there, as with PostgreSQL's polling waits.
//!
//! # Semantics per server
//!
//! dbmutex tells the servers apart by `VERSION()` at connect: lock strings
//! follow each server's own limit on names (MariaDB 192 bytes, MySQL 8 64
//! characters), so a name is sent exactly as the Ruby gem sends it wherever
//! the server accepts it (see [`crate::key`]).
//!
//! - MariaDB (measured on 10.11): lock names are case-sensitive; a session's
//!   `GET_LOCK` of a name it holds succeeds and counts (each needs its own
//!   `RELEASE_LOCK`) — dbmutex never asks twice on one session.
//! - MySQL 8 (from its documentation, not measured): names compare
//!   case-insensitively, so `Report` and `report` are one lock; deadlocks
//!   are error 3058 and over-long names error 3057, both mapped like
//!   MariaDB's.
//! - Shared locks and transaction-level locks do not exist:
//!   [`Error::Unsupported`].
//!
//! # Losing a lock
//!
//! mysql_async reads a connection only while a command runs on it, so an
//! idle lock session that the server ends is not noticed by its socket
//! alone. Two things watch it:
//!
//! - **The server's view, every 50 ms** (or every `keepalive`, if shorter):
//!   one statement, `SELECT IS_USED_LOCK(?), …`, asks who holds each lock the
//!   [`Locker`](crate::Locker) holds, all of them at once, on a connection
//!   that holds no lock. A lock whose holder is no longer the session that
//!   took it (its `CONNECTION_ID()`) — the session was `KILL`ed, reset, or
//!   the server restarted — is reported lost at once, with every other lock
//!   of that session, and the session is closed. Measured
//!   (`tests/mysql_faults.rs`, MariaDB 10.11, loaded 2-core machine): `KILL`
//!   of the holder → `lost()` p50 ≈ 32 ms, p99 49–114 ms (eleven runs of 30
//!   trials);
//!   a contender waiting in `GET_LOCK` got the lock ≈ 1 ms after the `KILL`,
//!   so the two overlap for that long. When the check cannot reach the
//!   server (a restart or crash closes every session), every lock session
//!   pings at once; a closed socket fails the ping: restart → `lost()`
//!   measured p50 25–51 ms, max 210 ms (private server, 36 locks). Cost: one statement per check period
//!   (per 512 locks) and one more connection (from the idle list) while any
//!   lock is held; nothing while none is.
//! - **A ping on each lock session every `keepalive`**: when it fails or
//!   gets no answer within `max(2 × keepalive, 2 s)`, the connection is
//!   closed and its locks reported lost. This is what notices a silent
//!   network partition (which stalls the check too): within `keepalive +
//!   max(2 × keepalive, 2 s)`, measured 2.0–2.9 s at the default 1 s
//!   keepalive (bound 3 s).
//!
//! Nothing is re-acquired.
//!
//! # Introspection
//!
//! [`Locker::holders`](crate::Locker::holders) asks `IS_USED_LOCK` and joins
//! `information_schema.PROCESSLIST` (a role without the `PROCESS` privilege
//! sees only its own sessions' user and host). Its `since` is when the
//! holder session's current command began (`NOW() - TIME`): for an idle
//! client its last statement, for a dbmutex holder its last keepalive ping
//! (pings reset it) — "seen alive at", not the lock's age.
//! [`Locker::list`](crate::Locker::list) reads MariaDB's
//! `information_schema.METADATA_LOCK_INFO`, which needs the
//! `metadata_lock_info` plugin (`INSTALL SONAME 'metadata_lock_info'`; dbmutex
//! never installs it; without it `list` is [`Error::Unsupported`] saying
//! so), and there `since` is when the lock was acquired. On MySQL 8 it reads
//! `performance_schema.metadata_locks` (from the documentation; not measured).
//!
//! Names in `list`: MariaDB shows at most the first 64 characters of a lock
//! string there, with 4-byte characters as `?` (measured on 10.11). For the
//! locks its own locker holds, `list` shows the real name and lock string
//! (mapped or not); for other holders it shows the name only when the
//! string is the whole, unmapped lock string (checked with `IS_USED_LOCK`
//! when it might be cut), and `None` otherwise, with the server's string as
//! the key — never a mapped or cut string as a name.

mod check;
mod conn;
mod held;
mod introspect;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::time::Instant;

use conn::{Checkout, Connector, RunError};
use held::{Claim, MyHeld};
use tokio::sync::oneshot;

use crate::arbiter::{Arbiter, Hold};
use crate::guard::Held;
use crate::key::{mysql_lock_string_for, MysqlFlavour, Prefix};
use crate::settings::Settings;
use crate::types::{Holder, ListedLock};
use crate::{wait, BackendKind, Error, LockName, LockOptions, Mode, Result};

/// The longest single `GET_LOCK` of a wait; a longer one (or one without a
/// bound) goes on with another. MariaDB answers 0 at once to timeouts beyond
/// about 1.7e10 s, so a large finite timeout must be cut up too.
const FOREVER_CHUNK: Duration = Duration::from_secs(3600);

/// The longest single `GET_LOCK` of a nested acquisition: between chunks the
/// enclosing session is free for the release of its other locks and for its
/// keepalive pings.
pub(crate) const NESTED_CHUNK: Duration = Duration::from_secs(1);

/// How long the client waits for the answer to a statement that may wait
/// `wait` in the server before treating the session as dead.
pub(crate) fn answer_bound(wait: Duration, keepalive: Duration) -> Duration {
    wait.saturating_add(keepalive.saturating_mul(2))
        .saturating_add(Duration::from_secs(2))
}

/// The timeout of the next `GET_LOCK` of a wait: what is left until
/// `deadline` (forever when `None`), at most `cap`; and whether it is the
/// last one (it reaches the deadline).
fn chunk(deadline: Option<Instant>, now: Instant, cap: Duration) -> (Duration, bool) {
    match deadline {
        None => (cap, false),
        Some(d) => {
            let left = d.saturating_duration_since(now);
            if left <= cap {
                (left, true)
            } else {
                (cap, false)
            }
        }
    }
}

/// How one `GET_LOCK` call failed.
enum Fail {
    Driver(mysql_async::Error),
    /// No answer within this long.
    NoAnswer(Duration),
}

fn fail_err(f: Fail, name: &LockName) -> Error {
    match f {
        Fail::Driver(e) => db_err(e, name),
        Fail::NoAnswer(bound) => Error::Connect(
            format!(
                "GET_LOCK for {name:?} got no answer within {bound:?} (its timeout plus the keepalive \
                 margin); the connection was treated as dead and closed"
            )
            .into(),
        ),
    }
}

/// One `SELECT GET_LOCK(lock, wait)`, its answer awaited at most `bound`.
async fn get_lock_once(
    conn: &mut Conn,
    lock: &str,
    wait: Duration,
    bound: Duration,
) -> Result<Option<i64>, Fail> {
    get_lock_once_id(conn, lock, wait, bound).await.map(|(v, _)| v)
}

/// [`get_lock_once`], also answering the session's `CONNECTION_ID()` — the
/// id `IS_USED_LOCK` names the holder by (the handshake's id is 32 bits,
/// and a proxy may show its own), for the loss check.
async fn get_lock_once_id(
    conn: &mut Conn,
    lock: &str,
    wait: Duration,
    bound: Duration,
) -> Result<(Option<i64>, Option<u64>), Fail> {
    let q = conn.exec_first::<(Option<i64>, Option<u64>), _, _>(
        "SELECT GET_LOCK(?, ?), CONNECTION_ID()",
        (lock, wait.as_secs_f64()),
    );
    match tokio::time::timeout(bound, q).await {
        Ok(Ok(row)) => Ok(row.unwrap_or_default()),
        Ok(Err(e)) => Err(Fail::Driver(e)),
        Err(_) => Err(Fail::NoAnswer(bound)),
    }
}

/// MariaDB `ER_LOCK_DEADLOCK` and MySQL 8 `ER_USER_LOCK_DEADLOCK`.
const DEADLOCK_CODES: [u16; 2] = [1213, 3058];
/// MariaDB `ER_TOO_LONG_IDENT` and MySQL 8 `ER_USER_LOCK_WRONG_NAME`.
const BAD_NAME_CODES: [u16; 2] = [1059, 3057];

/// What the backend and its guards share.
pub(crate) struct Shared {
    connector: Connector,
    /// Where guards spawn their watchers and queued releases.
    runtime: tokio::runtime::Handle,
    /// MariaDB or MySQL, from `VERSION()` at connect: their limits on lock
    /// names differ.
    flavour: MysqlFlavour,
    /// Every lock string this backend holds, with the session holding it:
    /// for acquisitions nested in a scoped call, for the loss check
    /// ([`check`]) and for the names [`Locker::list`](crate::Locker::list)
    /// shows.
    held: Mutex<HashMap<String, Registered>>,
    /// Numbers registrations, so the loss check can tell a lock it saw
    /// from the same lock released and taken again meanwhile.
    generation: AtomicU64,
    /// Wakes the loss check when a lock is registered.
    check_wake: Arc<tokio::sync::Notify>,
}

/// A held lock as [`Shared::held`] records it.
pub(crate) struct Registered {
    lc: Arc<held::LockConn>,
    generation: u64,
    name: LockName,
}

impl Shared {
    fn remember(&self, lock: &str, lc: &Arc<held::LockConn>, name: &LockName) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.insert(
            lock.to_owned(),
            Registered {
                lc: lc.clone(),
                generation,
                name: name.clone(),
            },
        );
        drop(held);
        self.check_wake.notify_one();
    }

    /// Called before the release's `RELEASE_LOCK` is sent: the loss check
    /// trusts an answer about a lock only while it is still registered.
    fn forget(&self, lock: &str, lc: &Arc<held::LockConn>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.get(lock).is_some_and(|h| Arc::ptr_eq(&h.lc, lc)) {
            held.remove(lock);
        }
    }

    fn held_is_empty(&self) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Whether `lock` is still registered as the loss check saw it.
    fn still_registered(&self, lock: &str, lc: &Arc<held::LockConn>, generation: u64) -> bool {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(lock)
            .is_some_and(|r| Arc::ptr_eq(&r.lc, lc) && r.generation == generation)
    }

    /// The `GET_LOCK` string for `name` on this server.
    fn lock_string(&self, name: &LockName, prefix: &Prefix) -> Result<String> {
        mysql_lock_string_for(name, prefix, self.flavour)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The loss check holds only a weak reference: it wakes, finds the
        // backend gone and ends.
        self.check_wake.notify_one();
    }
}

pub(crate) struct MyBackend {
    shared: Arc<Shared>,
    arbiter: Arc<Arbiter<String>>,
    /// The id of the [`Locker`](crate::Locker) this backend serves: nested
    /// acquisitions borrow only sessions of scoped calls of that locker.
    locker_id: u64,
    /// The locker's key prefix, to find the enclosing scoped call's lock.
    prefix: crate::Prefix,
}

/// Maps a driver error met while working on `name`.
pub(crate) fn db_err(e: mysql_async::Error, name: &LockName) -> Error {
    match &e {
        mysql_async::Error::Server(s) if DEADLOCK_CODES.contains(&s.code) => Error::Deadlock {
            name: name.to_string(),
            source: Box::new(e),
        },
        mysql_async::Error::Server(s) if BAD_NAME_CODES.contains(&s.code) => {
            Error::InvalidName(format!("the server rejected the lock string for {name:?}: {e}"))
        }
        mysql_async::Error::Server(_) => Error::Database(Box::new(e)),
        // The connection is gone or unusable.
        _ => Error::Connect(Box::new(e)),
    }
}

fn null_err(lock: &str) -> Error {
    Error::Database(
        format!(
            "GET_LOCK({lock:?}) returned NULL: the statement was killed, or the server rejected the name \
             or the timeout"
        )
        .into(),
    )
}

fn run_err(e: RunError, name: &LockName) -> Error {
    match e {
        RunError::Connect(e) => e,
        RunError::Query(e) => db_err(e, name),
    }
}

impl MyBackend {
    pub(crate) async fn connect(url: &str, settings: &Settings, locker_id: u64) -> Result<Self> {
        let connector = Connector::from_url(url, settings)?;
        // Connect now, so a bad URL, server or password fails here; the
        // connection serves the first lock.
        let mut first = connector.connect().await?;
        let version = tokio::time::timeout(
            answer_bound(Duration::ZERO, settings.keepalive),
            first.query_first::<String, _>("SELECT VERSION()"),
        )
        .await
        .map_err(|_| Error::Connect("SELECT VERSION() got no answer".into()))?
        .map_err(|e| Error::Connect(Box::new(e)))?
        .unwrap_or_default();
        let flavour = MysqlFlavour::from_version(&version);
        tracing::debug!(%version, ?flavour, "dbmutex: MySQL server");
        connector.checkin(first);
        let check_wake = Arc::new(tokio::sync::Notify::new());
        let shared = Arc::new(Shared {
            connector,
            runtime: tokio::runtime::Handle::current(),
            flavour,
            held: Mutex::default(),
            generation: AtomicU64::new(0),
            check_wake: check_wake.clone(),
        });
        drop(tokio::spawn(check::run(
            Arc::downgrade(&shared),
            check_wake,
            check::interval(settings.keepalive),
            settings.keepalive,
        )));
        Ok(MyBackend {
            shared,
            arbiter: Arc::default(),
            locker_id,
            prefix: settings.prefix.clone(),
        })
    }

    pub(crate) fn kind(&self) -> BackendKind {
        BackendKind::Mysql
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
        settings: &Settings,
    ) -> Result<Option<Box<dyn Held>>> {
        if opts.mode == Mode::Shared {
            return Err(Error::Unsupported(
                "MySQL/MariaDB user locks are exclusive only; shared locks need PostgreSQL or the local backend"
                    .into(),
            ));
        }
        if opts.transaction {
            return Err(Error::Unsupported(
                "MySQL/MariaDB user locks are not tied to transactions; transaction-level locks need \
                 PostgreSQL — on MySQL take a session lock and release it when your transaction ends"
                    .into(),
            ));
        }
        let lock = self.shared.lock_string(name, &settings.prefix)?;
        let deadline = wait::deadline(opts.timeout);
        let Some(hold) = self.arbiter.hold(&lock, Mode::Exclusive, deadline).await else {
            return Ok(None);
        };
        // Inside a scoped call holding a lock of this locker, wait on that
        // lock's session, as the gem does: the server then sees the whole
        // chain and can detect a deadlock.
        let hold = match self.enclosing() {
            None => hold,
            Some(claim) => {
                let (tx, rx) = oneshot::channel();
                let nested = Nested {
                    shared: self.shared.clone(),
                    claim,
                    lock: lock.clone(),
                    name: name.clone(),
                    deadline,
                    keepalive: settings.keepalive,
                };
                // A task of its own: if this acquisition is dropped midway,
                // the task still ends the wait cleanly and gives the
                // session back (see `Nested::run`).
                drop(self.shared.runtime.spawn(nested.run(hold, tx)));
                match rx.await {
                    Ok(NestedEnd::Done(r)) => return r.map(|h| h.map(|h| Box::new(h) as Box<dyn Held>)),
                    // The enclosing session is gone; its scoped call is
                    // stopping. Wait on a connection of our own.
                    Ok(NestedEnd::Gone(hold)) => hold,
                    Err(_) => {
                        return Err(Error::Database(
                            "the nested MySQL acquisition task ended unexpectedly".into(),
                        ))
                    }
                }
            }
        };
        let mut retried = false;
        loop {
            let Checkout { mut conn, reused } = self.shared.connector.checkout().await?;
            match self
                .get_lock(&mut conn, &lock, deadline, settings.keepalive)
                .await
            {
                Ok(GetLock::Acquired(server_id)) => {
                    let lc = held::LockConn::start(&self.shared, conn, server_id, settings.keepalive);
                    return Ok(Some(Box::new(MyHeld::new(
                        self.shared.clone(),
                        lc,
                        lock,
                        name.clone(),
                        hold,
                    ))));
                }
                // In the cases below the session holds nothing: GET_LOCK did
                // not take the lock, and the connection took no other.
                Ok(GetLock::TimedOut) => {
                    self.shared.connector.checkin(conn);
                    return Ok(None);
                }
                Ok(GetLock::Null) => {
                    self.shared.connector.checkin(conn);
                    return Err(null_err(&lock));
                }
                Err(Fail::Driver(e @ mysql_async::Error::Server(_))) => {
                    self.shared.connector.checkin(conn);
                    return Err(db_err(e, name));
                }
                Err(e @ Fail::NoAnswer(_)) => {
                    // `get_lock` is killing the session; never retried: the
                    // wait used up its bound.
                    drop(conn);
                    return Err(fail_err(e, name));
                }
                Err(Fail::Driver(e)) => {
                    // The connection died. If it was an idle one, it may have
                    // died while idle: one more try on a new connection.
                    drop(conn);
                    if reused && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(db_err(e, name));
                }
            }
        }
    }

    /// The session of the innermost scoped call of this task that holds a
    /// lock of this backend's locker, claimed for one nested acquisition.
    /// Scoped calls of other lockers never lend their sessions: their lock
    /// strings may equal ones this locker holds through unrelated guards.
    fn enclosing(&self) -> Option<Claim> {
        let scoped = crate::current_locks();
        let held = self.shared.held.lock().unwrap_or_else(|e| e.into_inner());
        scoped
            .iter()
            .rev()
            .find(|h| h.backend == BackendKind::Mysql && h.locker_id() == self.locker_id)
            .and_then(|h| self.shared.lock_string(&h.name, &self.prefix).ok())
            .and_then(|key| held.get(&key).map(|r| r.lc.clone()))
            .filter(|lc| !lc.is_lost())
            .and_then(|lc| lc.claim())
    }

    /// `GET_LOCK` until acquired, refused (the deadline passed) or NULL, on
    /// a session that holds nothing else.
    ///
    /// Cancel safety: if dropped while a `GET_LOCK` runs, the session is
    /// killed from another connection (and `conn`, dropped by the caller,
    /// closes), so a wait that is still running cannot take the lock later.
    /// The same happens when the connection fails midway or gives no answer
    /// in time.
    async fn get_lock(
        &self,
        conn: &mut Conn,
        lock: &str,
        deadline: Option<Instant>,
        keepalive: Duration,
    ) -> Result<GetLock, Fail> {
        let mut abandon = Abandon {
            shared: Some(self.shared.clone()),
            id: conn.id(),
        };
        let r = async {
            loop {
                let (wait, last) = chunk(deadline, Instant::now(), FOREVER_CHUNK);
                match get_lock_once_id(conn, lock, wait, answer_bound(wait, keepalive)).await? {
                    (Some(1), id) => return Ok(GetLock::Acquired(id.unwrap_or(u64::from(conn.id())))),
                    (Some(_), _) if !last => continue,
                    (Some(_), _) => return Ok(GetLock::TimedOut),
                    (None, _) => return Ok(GetLock::Null),
                }
            }
        }
        .await;
        if matches!(r, Ok(_) | Err(Fail::Driver(mysql_async::Error::Server(_)))) {
            // The statement ended in the server: nothing is left running.
            abandon.shared = None;
        }
        r
    }

    pub(crate) async fn is_locked(&self, name: &LockName, settings: &Settings) -> Result<bool> {
        let lock = self.shared.lock_string(name, &settings.prefix)?;
        introspect::is_locked(&self.shared.connector, name, &lock).await
    }

    pub(crate) async fn holders(&self, name: &LockName, settings: &Settings) -> Result<Vec<Holder>> {
        let lock = self.shared.lock_string(name, &settings.prefix)?;
        introspect::holders(&self.shared.connector, name, &lock).await
    }

    pub(crate) async fn list(&self, settings: &Settings) -> Result<Vec<ListedLock>> {
        let mut rows = introspect::list(&self.shared.connector, settings).await?;
        // The locks this locker holds: their names are known here, mapped
        // or not, however the server shows their strings.
        let mine: Vec<(String, String, u64, String)> = {
            let held = self.shared.held.lock().unwrap_or_else(|e| e.into_inner());
            held.iter()
                .map(|(lock, r)| {
                    (
                        introspect::as_listed(lock),
                        lock.clone(),
                        r.lc.server_id(),
                        r.name.to_string(),
                    )
                })
                .collect()
        };
        for row in &mut rows {
            let holder = u64::try_from(row.holder.pid).ok();
            if let Some((_, lock, _, name)) = mine
                .iter()
                .find(|(shown, _, id, _)| Some(*id) == holder && *shown == row.key)
            {
                row.key = lock.clone();
                row.name = Some(name.clone());
            } else if row.name.is_some()
                && introspect::maybe_cut(&row.key)
                && !introspect::held_by(&self.shared.connector, &row.key, row.holder.pid).await?
            {
                // The server showed a cut or altered string: its name is
                // unknown.
                row.name = None;
            }
        }
        Ok(rows)
    }

    /// The database key of `name`: the lock string this server gets.
    pub(crate) fn key_of(&self, name: &LockName, prefix: &Prefix) -> Result<String> {
        self.shared.lock_string(name, prefix)
    }
}

/// How one wait ended.
enum GetLock {
    /// Taken, on the session with this `CONNECTION_ID()`.
    Acquired(u64),
    TimedOut,
    /// `GET_LOCK` returned NULL: an error the server reports as a value.
    Null,
}

/// Kills the session when dropped armed: a `GET_LOCK` was in flight when the
/// acquisition was abandoned.
struct Abandon {
    shared: Option<Arc<Shared>>,
    id: u32,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let id = self.id;
            let runtime = shared.runtime.clone();
            drop(runtime.spawn(async move { shared.connector.kill(id).await }));
        }
    }
}

/// How a nested acquisition's task ended, sent to the acquisition.
enum NestedEnd {
    Done(Result<Option<MyHeld>>),
    /// The enclosing session is gone: the in-process hold comes back, and
    /// the acquisition goes on with a connection of its own.
    Gone(Hold<String>),
}

/// A nested acquisition: `GET_LOCK` on the enclosing scoped call's session.
struct Nested {
    shared: Arc<Shared>,
    claim: Claim,
    lock: String,
    name: LockName,
    deadline: Option<Instant>,
    keepalive: Duration,
}

impl Nested {
    /// Waits in chunks of [`NESTED_CHUNK`], taking the session's connection
    /// for each and giving it back after each (the session mutex is fair:
    /// a queued release or ping runs in between), and sends the outcome on
    /// `tx`.
    ///
    /// If the acquisition stops listening (it was dropped) while a
    /// `GET_LOCK` runs, the statement is ended with `KILL QUERY` from
    /// another connection — never `KILL CONNECTION`: the session holds the
    /// enclosing lock — its answer read, and a lock it took after all
    /// released, before the connection goes back to its owner. An outcome
    /// sent just as the acquisition is dropped is dropped with the channel:
    /// a [`MyHeld`] then releases itself.
    async fn run(self, hold: Hold<String>, mut tx: oneshot::Sender<NestedEnd>) {
        let Nested {
            shared,
            claim,
            lock,
            name,
            deadline,
            keepalive,
        } = self;
        let id = claim.lock_conn().id();
        loop {
            let Some(mut borrowed) = claim.borrow().await else {
                let _ = tx.send(NestedEnd::Gone(hold));
                return;
            };
            if tx.is_closed() {
                borrowed.give_back(false);
                return;
            }
            let (wait, last) = chunk(deadline, Instant::now(), NESTED_CHUNK);
            let bound = answer_bound(wait, keepalive);
            let (r, mut abandoned) = {
                let once = get_lock_once(borrowed.conn(), &lock, wait, bound);
                tokio::pin!(once);
                tokio::select! {
                    r = &mut once => (r, false),
                    () = tx.closed() => {
                        // Ends the wait now: GET_LOCK returns NULL, or 1 if
                        // it took the lock first. If the kill fails, the
                        // chunk ends by itself within a second.
                        shared.connector.kill_query(id).await;
                        (once.await, true)
                    }
                }
            };
            abandoned |= tx.is_closed();
            let send = |tx: oneshot::Sender<NestedEnd>, r| drop(tx.send(NestedEnd::Done(r)));
            match r {
                Ok(Some(1)) if abandoned => {
                    // Taken after all: release it before the session goes
                    // back to its owner.
                    let sql = "SELECT RELEASE_LOCK(?)";
                    let q = borrowed
                        .conn()
                        .exec_first::<(Option<i64>,), _, _>(sql, (lock.as_str(),));
                    match tokio::time::timeout(answer_bound(Duration::ZERO, keepalive), q).await {
                        Ok(Ok(Some((Some(1),)))) => borrowed.give_back(false),
                        _ => {
                            // Unknown state: end the session (its locks
                            // are reported lost) rather than leave this
                            // lock held by nobody.
                            drop(borrowed);
                            spawn_kill(&shared, id);
                        }
                    }
                    drop(hold);
                    return;
                }
                Ok(Some(1)) => {
                    borrowed.give_back(true);
                    let held = MyHeld::new(shared.clone(), claim.lock_conn().clone(), lock, name, hold);
                    // The session is free for the caller's next nested
                    // acquisition before the caller hears of this one.
                    drop(claim);
                    send(tx, Ok(Some(held)));
                    return;
                }
                Ok(Some(_)) => {
                    borrowed.give_back(false);
                    if abandoned {
                        return;
                    }
                    if last {
                        drop(claim);
                        send(tx, Ok(None));
                        return;
                    }
                }
                Ok(None) => {
                    borrowed.give_back(false);
                    if !abandoned {
                        drop(claim);
                        send(tx, Err(null_err(&lock)));
                    }
                    return;
                }
                Err(Fail::Driver(e @ mysql_async::Error::Server(_))) => {
                    // The session keeps the locks it held (a deadlock
                    // victim too).
                    borrowed.give_back(false);
                    drop(claim);
                    send(tx, Err(db_err(e, &name)));
                    return;
                }
                Err(e) => {
                    // The connection failed or went silent: dropping
                    // `borrowed` closes it and reports its locks lost.
                    let silent = matches!(e, Fail::NoAnswer(_));
                    drop(borrowed);
                    if silent {
                        spawn_kill(&shared, id);
                    }
                    send(tx, Err(fail_err(e, &name)));
                    return;
                }
            }
        }
    }
}

/// Kills session `id` from another connection, in the background.
pub(crate) fn spawn_kill(shared: &Arc<Shared>, id: u32) {
    let shared2 = shared.clone();
    drop(
        shared
            .runtime
            .spawn(async move { shared2.connector.kill(id).await }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_bound_adds_the_keepalive_margin() {
        let s = Duration::from_secs;
        assert_eq!(answer_bound(s(10), s(1)), s(14));
        assert_eq!(
            answer_bound(Duration::ZERO, Duration::from_millis(250)),
            Duration::from_millis(2500)
        );
        assert_eq!(answer_bound(Duration::MAX, s(1)), Duration::MAX);
        assert_eq!(answer_bound(s(1), Duration::MAX), Duration::MAX);
    }

    #[test]
    fn chunks_are_capped_and_the_last_reaches_the_deadline() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(chunk(None, now, FOREVER_CHUNK), (FOREVER_CHUNK, false));
        // A huge finite timeout: capped, not the last.
        let far = now.checked_add(s(1 << 40)).unwrap();
        assert_eq!(chunk(Some(far), now, FOREVER_CHUNK), (FOREVER_CHUNK, false));
        assert_eq!(chunk(Some(now + s(5)), now, NESTED_CHUNK), (NESTED_CHUNK, false));
        assert_eq!(chunk(Some(now + s(1)), now, NESTED_CHUNK), (s(1), true));
        assert_eq!(chunk(Some(now + s(30)), now, FOREVER_CHUNK), (s(30), true));
        // Past the deadline: a try-once.
        assert_eq!(
            chunk(Some(now), now + s(1), FOREVER_CHUNK),
            (Duration::ZERO, true)
        );
        // Every GET_LOCK of a wait is answered within its bound: the client
        // never waits past the wait's own bound plus the margin.
        let (wait, _) = chunk(Some(now + s(30)), now, FOREVER_CHUNK);
        assert!(answer_bound(wait, s(1)) <= s(30) + s(4));
    }
}
