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
mod delay;
mod errors;
mod fence;
mod get_lock;
mod grant;
mod introspect;
mod lock_conn;
mod mycnf;
mod nested;
mod registry;
mod runs;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;

use conn::{answer_bound, Checkout, Connector};
use errors::{db_err, fail_err, null_err, Fail};
use get_lock::{get_lock, GetLock};
use grant::MyGrant;
use lock_conn::LockConn;
use registry::Shared;

use crate::core::arbiter::Hold;
use crate::core::backend::{rows, Attempt, Backend, Fut, Missing, Plan, Records, WaitIn, Waited};
use crate::core::guard::{BoxFut, Grant};
use crate::key::MysqlFlavour;
use crate::runs::LastRun;
use crate::settings::Settings;
use crate::types::ListedLock;
use crate::{Error, LockName, LockOptions, Result};

pub(crate) struct MyBackend {
    shared: Arc<Shared>,
    settings: Settings,
}

impl MyBackend {
    pub(crate) async fn connect(url: &str, settings: &Settings) -> Result<Self> {
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
            connector: Arc::new(connector),
            runtime: tokio::runtime::Handle::current(),
            flavour,
            registry: Mutex::default(),
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
            settings: settings.clone(),
        })
    }

    /// `GET_LOCK` on a connection of its own (an idle one if there is one).
    async fn wait_own(
        &self,
        at: &Attempt<'_, Self>,
        hold: Option<Hold<String>>,
    ) -> Result<Option<Box<dyn Grant>>> {
        let (lock, name, keepalive) = (at.key, at.name, at.settings.keepalive);
        let mut retried = false;
        loop {
            let Checkout { mut conn, reused } = self.shared.connector.checkout().await?;
            match get_lock(
                &self.shared.connector,
                &self.shared.runtime,
                &mut conn,
                lock,
                at.deadline.at(),
                keepalive,
            )
            .await
            {
                Ok(GetLock::Acquired(server_id)) => {
                    let lc = LockConn::start(
                        &self.shared.connector,
                        &self.shared.runtime,
                        conn,
                        server_id,
                        keepalive,
                    );
                    let g = MyGrant::new(self.shared.clone(), lc, lock.clone(), name.clone(), hold);
                    return Ok(Some(Box::new(g)));
                }
                // In the cases below the session holds nothing: GET_LOCK did
                // not take the lock, and the connection took no other.
                Ok(GetLock::TimedOut) => {
                    self.shared.connector.checkin(conn);
                    return Ok(None);
                }
                Ok(GetLock::Null) => {
                    self.shared.connector.checkin(conn);
                    return Err(null_err(lock));
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
}

impl Backend for MyBackend {
    /// The `GET_LOCK` string.
    type Key = String;
    type SlotExt = ();
    type Tries = ();

    fn refusal(&self, missing: Missing) -> Option<String> {
        match missing {
            Missing::Shared => Some(
                "MySQL/MariaDB user locks are exclusive only; shared locks need PostgreSQL or the local backend"
                    .into(),
            ),
            Missing::Transaction => Some(
                "MySQL/MariaDB user locks are not tied to transactions; transaction-level \
                 locks need PostgreSQL — on MySQL take a session lock and release it when your transaction ends"
                    .into(),
            ),
            Missing::Upgrade => Some("MySQL/MariaDB user locks have no shared mode to upgrade".into()),
            Missing::SessionLocks | Missing::Fencing => None,
        }
    }

    /// The lock string for this server (MariaDB and MySQL differ).
    fn key(&self, name: &LockName) -> Result<String> {
        self.shared.lock_string(name, &self.settings.prefix)
    }

    /// `GET_LOCK` waits in the server, on a connection per lock; tasks of
    /// this process are told apart in process first (a nested acquisition
    /// shares its enclosing lock's session).
    fn plan(&self, _opts: &LockOptions) -> Plan {
        Plan {
            hold: true,
            wait: WaitIn::Server,
        }
    }

    fn begin<'a>(&'a self, _at: &'a Attempt<'_, Self>) -> impl Fut<'a, ()> {
        std::future::ready(Ok(()))
    }

    /// Inside a scoped call holding a lock of this locker, waits on that
    /// lock's session, as the gem does: the server then sees the whole
    /// chain and can detect a deadlock. Otherwise on a connection of its own.
    fn wait_in_server<'a>(&'a self, _: (), at: &'a mut Attempt<'_, Self>) -> impl Fut<'a, Waited<()>> {
        async move {
            let mut hold = at.hold.take();
            if let Some(claim) = nested::claim_enclosing(&self.shared, at.enclosing().as_ref(), at.settings) {
                match nested::wait(&self.shared, claim, at, hold).await {
                    Ok(r) => return r.map(waited),
                    Err(back) => hold = back,
                }
            }
            self.wait_own(at, hold).await.map(waited)
        }
    }

    fn held<'a>(&'a self, only: Option<(&'a LockName, &'a String)>) -> impl Fut<'a, Vec<ListedLock>> {
        async move {
            match only {
                Some((name, key)) => Ok(rows(
                    name,
                    key,
                    introspect::holders(&self.shared.connector, name, key).await?,
                )),
                None => introspect::list_with_own(&self.shared, &self.settings).await,
            }
        }
    }

    fn records(&self) -> Option<&dyn Records> {
        Some(self)
    }
}

/// A server wait's grant as the core takes it.
fn waited(g: Option<Box<dyn Grant>>) -> Waited<()> {
    g.map_or(Waited::TimedOut, Waited::Granted)
}

/// Fencing tokens and runs in tables of the lock's database.
impl Records for MyBackend {
    fn create_tables(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(fence::create_tables(&self.shared.connector))
    }

    fn last_run<'a>(&'a self, name: &'a LockName, key: &'a str) -> BoxFut<'a, Result<Option<LastRun>>> {
        Box::pin(runs::last(&self.shared.connector, key, name))
    }
}
