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
//! makes no difference here. A bounded wait passes the remaining time in
//! fractional seconds; "wait forever" repeats `GET_LOCK(name, 3600)`
//! (MariaDB rejects negative timeouts instead of waiting forever).
//! If an acquisition is dropped while `GET_LOCK` runs, its session is
//! killed (`KILL CONNECTION` from another connection), so the abandoned wait
//! can never take the lock later.
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
//! A watcher pings each lock's connection every `keepalive`; when a ping
//! fails (the session was killed, the server restarted, the network broke)
//! or gets no answer within `max(2 × keepalive, 2 s)`, the connection is
//! closed and the guard reports the lock lost. Nothing is re-acquired.
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

mod conn;
mod held;
mod introspect;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::time::Instant;

use conn::{Checkout, Connector, RunError};
use held::{Claim, LockConn, MyHeld};

use crate::arbiter::Arbiter;
use crate::guard::Held;
use crate::key::mysql_lock_string;
use crate::locker::{Holder, ListedLock, Settings};
use crate::{wait, BackendKind, Error, LockName, LockOptions, Mode, Result};

/// The longest single `GET_LOCK` of a wait without a bound; the wait goes on
/// with another one.
const FOREVER_CHUNK: Duration = Duration::from_secs(3600);

/// MariaDB `ER_LOCK_DEADLOCK` and MySQL 8 `ER_USER_LOCK_DEADLOCK`.
const DEADLOCK_CODES: [u16; 2] = [1213, 3058];
/// MariaDB `ER_TOO_LONG_IDENT` and MySQL 8 `ER_USER_LOCK_WRONG_NAME`.
const BAD_NAME_CODES: [u16; 2] = [1059, 3057];

/// What the backend and its guards share.
pub(crate) struct Shared {
    connector: Connector,
    /// Where guards spawn their watchers and queued releases.
    runtime: tokio::runtime::Handle,
    /// The session holding each lock string this backend holds, for
    /// acquisitions nested in a scoped call.
    held: Mutex<HashMap<String, Arc<LockConn>>>,
}

impl Shared {
    fn remember(&self, lock: &str, lc: &Arc<LockConn>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.insert(lock.to_owned(), lc.clone());
    }

    fn forget(&self, lock: &str, lc: &Arc<LockConn>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.get(lock).is_some_and(|h| Arc::ptr_eq(h, lc)) {
            held.remove(lock);
        }
    }
}

pub(crate) struct MyBackend {
    shared: Arc<Shared>,
    arbiter: Arc<Arbiter<String>>,
    /// The id of the [`Locker`](crate::Locker) this backend serves: nested
    /// acquisitions borrow only sessions of scoped calls of that locker.
    locker_id: u64,
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
        let first = connector.connect().await?;
        connector.checkin(first);
        Ok(MyBackend {
            shared: Arc::new(Shared {
                connector,
                runtime: tokio::runtime::Handle::current(),
                held: Mutex::default(),
            }),
            arbiter: Arc::default(),
            locker_id,
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
        let lock = mysql_lock_string(name, &settings.prefix)?;
        let deadline = wait::deadline(opts.timeout);
        let Some(hold) = self.arbiter.hold(&lock, Mode::Exclusive, deadline).await else {
            return Ok(None);
        };
        // Inside a scoped call holding a lock of this backend, wait on that
        // lock's session, as the gem does: the server then sees the whole
        // chain and can detect a deadlock.
        if let Some(claim) = self.enclosing(settings) {
            if let Some(mut borrowed) = claim.borrow().await {
                let r = self.get_lock(borrowed.conn(), &lock, deadline).await;
                let lc = claim.lock_conn().clone();
                return match r {
                    Ok(GetLock::Acquired) => {
                        borrowed.give_back(true);
                        Ok(Some(Box::new(MyHeld::new(
                            self.shared.clone(),
                            lc,
                            lock,
                            name.clone(),
                            hold,
                        ))))
                    }
                    Ok(GetLock::TimedOut) => {
                        borrowed.give_back(false);
                        Ok(None)
                    }
                    Ok(GetLock::Null) => {
                        borrowed.give_back(false);
                        Err(null_err(&lock))
                    }
                    Err(e @ mysql_async::Error::Server(_)) => {
                        // The session keeps the locks it held (a deadlock
                        // victim too).
                        borrowed.give_back(false);
                        Err(db_err(e, name))
                    }
                    // Dropping `borrowed` closes the session and reports its
                    // locks lost.
                    Err(e) => Err(db_err(e, name)),
                };
            }
            // The enclosing session is gone; its scoped call is stopping.
        }
        let mut retried = false;
        loop {
            let Checkout { mut conn, reused } = self.shared.connector.checkout().await?;
            match self.get_lock(&mut conn, &lock, deadline).await {
                Ok(GetLock::Acquired) => {
                    let lc = LockConn::start(&self.shared, conn, settings.keepalive);
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
                Err(e @ mysql_async::Error::Server(_)) => {
                    self.shared.connector.checkin(conn);
                    return Err(db_err(e, name));
                }
                Err(e) => {
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
    /// lock of this backend, claimed for one nested acquisition.
    fn enclosing(&self, settings: &Settings) -> Option<Claim> {
        let scoped = crate::current_locks();
        let held = self.shared.held.lock().unwrap_or_else(|e| e.into_inner());
        scoped
            .iter()
            .rev()
            .filter(|h| h.backend == BackendKind::Mysql)
            .filter_map(|h| mysql_lock_string(&h.name, &settings.prefix).ok())
            .find_map(|key| held.get(&key).cloned())
            .filter(|lc| !lc.is_lost())
            .and_then(|lc| lc.claim())
    }

    /// `GET_LOCK` until acquired, refused (the deadline passed) or NULL.
    ///
    /// Cancel safety: if dropped while a `GET_LOCK` runs, the session is
    /// killed from another connection (and `conn`, dropped by the caller,
    /// closes), so a wait that is still running cannot take the lock later.
    /// The same happens when the connection fails midway.
    async fn get_lock(
        &self,
        conn: &mut Conn,
        lock: &str,
        deadline: Option<Instant>,
    ) -> Result<GetLock, mysql_async::Error> {
        let mut abandon = Abandon {
            shared: Some(self.shared.clone()),
            id: conn.id(),
        };
        let r = async {
            loop {
                let wait = match deadline {
                    None => FOREVER_CHUNK,
                    Some(d) => d.saturating_duration_since(Instant::now()),
                };
                let row: Option<(Option<i64>,)> = conn
                    .exec_first("SELECT GET_LOCK(?, ?)", (lock, wait.as_secs_f64()))
                    .await?;
                match row.and_then(|(v,)| v) {
                    Some(1) => return Ok(GetLock::Acquired),
                    Some(_) if deadline.is_none() => continue,
                    Some(_) => return Ok(GetLock::TimedOut),
                    None => return Ok(GetLock::Null),
                }
            }
        }
        .await;
        if matches!(r, Ok(_) | Err(mysql_async::Error::Server(_))) {
            // The statement ended in the server: nothing is left running.
            abandon.shared = None;
        }
        r
    }

    pub(crate) async fn is_locked(&self, name: &LockName, settings: &Settings) -> Result<bool> {
        introspect::is_locked(&self.shared.connector, name, settings).await
    }

    pub(crate) async fn holders(&self, name: &LockName, settings: &Settings) -> Result<Vec<Holder>> {
        introspect::holders(&self.shared.connector, name, settings).await
    }

    pub(crate) async fn list(&self, settings: &Settings) -> Result<Vec<ListedLock>> {
        introspect::list(&self.shared.connector, settings).await
    }
}

/// How one wait ended.
enum GetLock {
    Acquired,
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
