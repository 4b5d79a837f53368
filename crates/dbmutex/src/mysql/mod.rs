//! The MySQL / MariaDB backend: user locks (`GET_LOCK`).
//!
//! # How locks are held
//!
//! Every guard owns a connection of its own, which holds exactly one lock.
//! `GET_LOCK` blocks its connection while it waits and MySQL connections
//! cannot pipeline, so a shared session would stall every other task; and a
//! lock that lives on its own connection can be released by closing that
//! connection, which needs no round trip and no runtime. The connection is a
//! plain `mysql_async::Conn`, never a `mysql_async::Pool` member: the pool
//! resets connections it takes back, and a reset silently releases every user
//! lock. After a confirmed release (`RELEASE_LOCK` = 1 and `RELEASE_ALL_LOCKS`
//! = 0 in one statement) the connection is clean and is kept, up to a few, for
//! the next acquisition; any other outcome closes it.
//!
//! Tasks of one process first take an in-process hold on the lock string
//! (fewer connections while waiting, hand-over without a server round trip);
//! exclusion itself never depends on it, since every holder has its own
//! session.
//!
//! # Waiting
//!
//! `GET_LOCK` always waits in the server, so [`WaitStrategy`](crate::WaitStrategy)
//! makes no difference here. A bounded wait passes the remaining time in
//! fractional seconds; "wait forever" repeats `GET_LOCK(name, 3600)`
//! (MariaDB rejects negative timeouts instead of waiting forever).
//! Deadlocks between sessions are detected by the server: the requester
//! that closes a cycle gets [`Error::Deadlock`] at once and keeps its other
//! locks. Tasks of one [`Locker`](crate::Locker) that wait for each other in
//! the in-process hold are not seen by the server; use timeouts there.
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
//! sees only its own sessions' user and host). [`Locker::list`](crate::Locker::list)
//! reads MariaDB's `information_schema.METADATA_LOCK_INFO`, which needs the
//! `metadata_lock_info` plugin (`INSTALL SONAME 'metadata_lock_info'`; dbmutex
//! never installs it), or MySQL 8's `performance_schema.metadata_locks`.

mod conn;
mod held;
mod introspect;

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::time::Instant;

use conn::{Checkout, Connector, RunError};
use held::MyHeld;

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
}

pub(crate) struct MyBackend {
    shared: Arc<Shared>,
    arbiter: Arc<Arbiter<String>>,
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

fn run_err(e: RunError, name: &LockName) -> Error {
    match e {
        RunError::Connect(e) => e,
        RunError::Query(e) => db_err(e, name),
    }
}

impl MyBackend {
    pub(crate) async fn connect(url: &str, settings: &Settings) -> Result<Self> {
        let connector = Connector::from_url(url, settings)?;
        // Connect now, so a bad URL, server or password fails here; the
        // connection serves the first lock.
        let first = connector.connect().await?;
        connector.checkin(first);
        Ok(MyBackend {
            shared: Arc::new(Shared {
                connector,
                runtime: tokio::runtime::Handle::current(),
            }),
            arbiter: Arc::default(),
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
        let mut retried = false;
        loop {
            let Checkout { mut conn, reused } = self.shared.connector.checkout().await?;
            match self.get_lock(&mut conn, &lock, deadline).await {
                Ok(GetLock::Acquired) => {
                    return Ok(Some(Box::new(MyHeld::start(
                        self.shared.clone(),
                        conn,
                        lock,
                        name.clone(),
                        hold,
                        settings.keepalive,
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
                    return Err(Error::Database(
                        format!(
                            "GET_LOCK({lock:?}) returned NULL: the statement was killed, or the server \
                             rejected the name or the timeout"
                        )
                        .into(),
                    ));
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
