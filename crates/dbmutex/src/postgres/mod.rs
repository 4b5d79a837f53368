//! The PostgreSQL backend, and helpers for callers who own the transaction.
//!
//! # How locks are held
//!
//! - **Session locks (the default).** One connection per
//!   [`Locker`](crate::Locker) — the *lock session* — takes every session
//!   lock of the process that is free when asked. PostgreSQL cannot tell the
//!   tasks on one session apart (session locks are re-entrant), so tasks
//!   first take an in-process hold on the key (first come, first served),
//!   then ask the server. Concurrent requests are pipelined on the one
//!   connection.
//! - **A busy lock** is waited for in the server (the default
//!   [`WaitStrategy::TryThenServer`]): the task holding the in-process hold
//!   waits in the server's queue, so processes take turns and any holder's
//!   release (the gem's, psql's) hands the lock over at once, waking only
//!   the next waiter. It waits on the lock session itself when that holds
//!   nothing else (the session then holds the lock, and the next lock
//!   session is the next idle connection): a process that takes one lock at
//!   a time keeps **one connection**, waiting or holding. Otherwise it waits
//!   on a connection of its own, if the server has room for one (see
//!   `budget.rs`); at most
//!   [`LockerBuilder::max_server_waits`](crate::LockerBuilder::max_server_waits)
//!   names wait (and are then held) that way per locker; past that, or
//!   when the server is short of connections, waiters poll the lock
//!   session.
//! - **Server-side waits** asked for ([`WaitStrategy::Server`]) and
//!   **transaction locks** ([`LockOptions::transaction`]) use a dedicated
//!   connection per guard, because a blocked statement would stall the
//!   shared session.
//! - **Your own connection**: [`lock_xact`] takes a transaction-level lock in
//!   a `tokio_postgres::Transaction` you own, [`lock_session`] a session lock
//!   on a `Client` (or a pool object that derefs to one); with the `sqlx`
//!   feature, the `sqlx` module does both on an sqlx connection.
//! - **Behind a transaction pooler** (PgBouncer `pool_mode = transaction`),
//!   which dbmutex detects when it connects, session locks fail with
//!   [`Error::Unsupported`]; use [`LockOptions::transaction`].
//!
//! # Upgrade inside one task
//!
//! A nested scoped exclusive call inside a scoped shared one for the same
//! name upgrades ([`Locker::with_lock`](crate::Locker::with_lock)), as the
//! gem does: the session holding the shared lock takes it exclusive too
//! (its own locks never conflict), and `pg_advisory_unlock` drops just that
//! at the end. It *tries* with backoff (that session serves other locks
//! and its keepalive probe, so it never blocks): shared requests of other
//! processes may overtake it, and the server's deadlock detector does not
//! see it. So a waiting upgrader holds an *intent* lock (a `bigint` key
//! with the high bit set, mixed from the name's; `list` shows it unnamed):
//! a second upgrader in another process finds it and fails at once with
//! [`Error::Deadlock`]. Behind a session that only waits in the server for
//! the name (it waits for the upgrader's shared lock), the server refuses
//! the upgrader's try but grants its blocking request at once, ahead of
//! that waiter: the upgrader sends that request (200 ms bound). A
//! transaction lock on either side, or a fenced nested call, is
//! [`Error::Unsupported`].
//!
//! A lock lives as long as its connection: when the connection ends (server
//! restart, `pg_terminate_backend`, network failure noticed by TCP
//! keepalive), every guard on it reports the loss at once. Nothing is ever
//! re-acquired silently.

mod budget;
mod caller;
mod conn;
mod dedicated;
mod errors;
mod fence;
mod handoff;
mod introspect;
mod lazy;
mod names;
mod pooler;
mod runs;
mod session;
mod session_lock;
mod sql;
mod upgrade;
mod xact;

use std::sync::Arc;

#[cfg(feature = "sqlx")]
pub use caller::sqlx;
pub use caller::{lock_session, CallerClient, ClientLockGuard, NotAcquired, XactLock};
pub(crate) use conn::{Connector, PgConn};
use dedicated::Spares;
use errors::first_text;
use handoff::{PgArbiter, PgSlot};
use lazy::{prepare_session, LazyConn, Side};
use session::SessionGrant;
use session_lock::SessionLock;
pub use xact::lock_xact;

use crate::core::backend::{Attempt, Backend, Fut, Missing, Plan, WaitIn};
use crate::core::guard::Grant;
use crate::key::{pg_key, PgKey};
use crate::runs::LastRun;
use crate::settings::Settings;
use crate::types::{Capabilities, Holder, ListedLock};
use crate::{BackendKind, Error, LockName, LockOptions, Mode, Result, WaitStrategy};

pub(crate) struct PgBackend {
    connector: Connector,
    /// The lock session shared by polling session locks.
    session: LazyConn,
    /// The side connection (introspection, counts), opened on first use:
    /// an uncontended locker keeps one connection.
    side: Arc<Side>,
    arbiter: Arc<PgArbiter>,
    /// A transaction pooler shares server sessions: session locks are refused.
    shared_sessions: bool,
    /// Whether the pooler checks are skipped (dbmutex's own tests).
    skip_pooler_check: bool,
    /// Clean dedicated connections, kept for the next server-side wait.
    spares: Spares,
    /// This locker's share of the server's lock table.
    budget: Arc<budget::Budget>,
    /// The names of the locks held on the lock session, for `list`.
    names: Arc<names::OwnNames>,
    /// Keys lately got only by waiting: waited for at once next time.
    contended: handoff::Contended,
}

impl PgBackend {
    pub(crate) async fn connect(url: &str, settings: &Settings) -> Result<Self> {
        Self::with_connector(Connector::from_url(url, settings)?, settings).await
    }

    pub(crate) async fn from_config(config: tokio_postgres::Config, settings: &Settings) -> Result<Self> {
        Self::with_connector(Connector::from_config(config, settings)?, settings).await
    }

    async fn with_connector(connector: Connector, settings: &Settings) -> Result<Self> {
        let mut backend = PgBackend {
            side: Arc::new(Side::new(connector.clone(), settings.clone())),
            connector,
            session: LazyConn::default(),
            arbiter: Arc::default(),
            shared_sessions: false,
            skip_pooler_check: settings.skip_pooler_check,
            spares: Spares::new(settings.idle_limit()),
            // Until the first connection reads the server's settings.
            names: Arc::default(),
            contended: handoff::Contended::default(),
            budget: budget::Budget::new(conn::LockTable {
                per_transaction: 64,
                slots: 100,
            }),
        };
        // Connect now, so a bad URL, server or password fails here.
        let session = backend.connector.connect(settings, true).await?;
        if let Some(t) = session.lock_table.get() {
            backend.budget = budget::Budget::new(*t);
        }
        // A claimed session on the very address and port we dialed is the
        // server itself: no pooler can be in between, and one connection
        // is all it takes. Anything else gets the behavioural check on a
        // second connection, even when a claim already told: it is what
        // finds a statement pooler (which refuses its BEGIN).
        let direct = session.is_claimed() && session.is_direct();
        let check = !(settings.skip_pooler_check || direct);
        let other = match check {
            true => Some(backend.connector.connect(settings, true).await?),
            false => None,
        };
        let moves = match &other {
            Some(other) => pooler::shares_sessions(&session, other).await?,
            None => false,
        };
        backend.shared_sessions = moves
            || (!settings.skip_pooler_check && (!session.is_claimed() || backend.connector.pooler_seen()));
        if backend.shared_sessions {
            tracing::warn!("dbmutex: {}", pooler::SESSION_LOCKS_UNSAFE);
            session.close();
            if let Some(other) = other {
                backend.side.set(other);
            }
        } else {
            // A session pooler that keeps a leaver's locks is refused
            // (`pooler::check_release_on_close`); a direct connection has
            // none in between.
            if let Some(other) = &other {
                pooler::check_release_on_close(&session, other, settings).await?;
            }
            prepare_session(&session, settings);
            backend.session.set(session);
            // One connection at steady state: the check's second one goes.
            if let Some(other) = other {
                other.close();
            }
        }
        Ok(backend)
    }

    /// Where introspection and lock-table counts run: the side connection,
    /// so that the lock session only ever runs statements that answer at
    /// once (its keepalive probe counts on it).
    async fn probe(&self, _settings: &Settings) -> Result<Arc<PgConn>> {
        self.side.get().await
    }
}

/// One polling wait's session.
pub(crate) struct Tries {
    conn: Arc<PgConn>,
    /// Skip the first try: the key was contended lately and the session is
    /// free to wait in the server (see `handoff::contended_lately`).
    skip: std::sync::atomic::AtomicBool,
}

impl Backend for PgBackend {
    type Key = PgKey;
    type SlotExt = PgSlot;
    /// Room in the server's lock table (see [`budget`]).
    type Ticket = budget::Slot;
    type Tries = Tries;

    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    /// Behind a transaction pooler, no session locks.
    fn capabilities(&self) -> Capabilities {
        let pooled = self.shared_sessions || (self.connector.pooler_seen() && !self.skip_pooler_check);
        Capabilities {
            session_locks: !pooled,
            ..BackendKind::Postgres.capabilities()
        }
    }

    fn explain(&self, missing: Missing) -> String {
        match missing {
            Missing::SessionLocks => pooler::SESSION_LOCKS_UNSAFE.into(),
            m => format!("PostgreSQL cannot do this here: {m:?}"),
        }
    }

    fn key(&self, name: &LockName, settings: &Settings) -> Result<PgKey> {
        Ok(pg_key(name, &settings.prefix))
    }

    fn arbiter(&self) -> &Arc<PgArbiter> {
        &self.arbiter
    }

    /// Session locks share the lock session, so they are told apart in
    /// process and tried there; by default a busy one then waits in the
    /// server on a connection of its own, keeping its hold. A server-side
    /// wait asked for explicitly, or a transaction lock, gets a connection
    /// of its own at once and needs no in-process hold.
    fn plan(&self, opts: &LockOptions) -> Plan {
        match opts.strategy {
            _ if opts.transaction => Plan {
                hold: false,
                wait: WaitIn::Server,
            },
            WaitStrategy::Server => Plan {
                hold: false,
                wait: WaitIn::Server,
            },
            WaitStrategy::Poll => Plan {
                hold: true,
                wait: WaitIn::Poll {
                    max_backoff: opts.max_backoff,
                },
            },
            _ => Plan {
                hold: true,
                wait: WaitIn::TryThenServer {
                    max_backoff: opts.max_backoff,
                },
            },
        }
    }

    /// Room for one more server lock (see [`budget`]).
    fn admit<'a>(&'a self, settings: &'a Settings) -> impl Fut<'a, budget::Slot> {
        self.budget
            .reserve(settings.connect_timeout, move || self.probe(settings))
    }

    fn prepare<'a>(&'a self, at: &'a Attempt<'_, Self>) -> impl Fut<'a, Tries> {
        async move {
            let conn = self
                .session
                .get(&self.connector, at.settings, &self.spares)
                .await?;
            let skip = !at.opts.is_try_once()
                && at.hold.is_some()
                && self.contended.lately(at.key)
                // Before the tries take their reference: only `conn` here
                // holds it besides the lock session's own slot.
                && Arc::strong_count(&conn) == 2;
            Ok(Tries {
                conn,
                skip: skip.into(),
            })
        }
    }

    fn try_once<'a>(
        &'a self,
        tries: &'a Tries,
        at: &'a mut Attempt<'_, Self>,
    ) -> impl Fut<'a, Option<Box<dyn Grant>>> {
        async move {
            // No name in the statement (prepared once per connection: see
            // `PgConn::session_text`); it goes into the session's keepalive
            // probe instead, where `pg_stat_activity` shows it.
            let lock = SessionLock {
                conn: tries.conn.clone(),
                key: *at.key,
                mode: at.opts.mode,
                name: at.name.clone(),
                text: tries
                    .conn
                    .session_text(at.settings.name_comments, at.opts.mode, at.key),
            };
            // A task of ours may have left the server lock on the session for us.
            let parked = lock.mode == Mode::Exclusive
                && at
                    .hold
                    .as_ref()
                    .is_some_and(|h| handoff::take_parked(h.slot(), lock.conn.id));
            if !parked && tries.skip.swap(false, std::sync::atomic::Ordering::Relaxed) {
                return Ok(None);
            }
            if !parked && !lock.try_lock().await? {
                return Ok(None);
            }
            self.contended.note(*at.key, false);
            if at.settings.name_comments {
                lock.conn.remember_name(at.name);
            }
            let ticket = at.ticket.take().map(budget::Slot::granted);
            let grant = SessionGrant::new(lock, at.hold.take(), ticket, self.names.clone());
            Ok(Some(Box::new(grant) as Box<dyn Grant>))
        }
    }

    /// A connection for the wait is at hand: the lock session itself if it
    /// holds nothing (no new connection), else an idle one, else a new one
    /// made now if the server has room for it; else the core polls on the
    /// lock session, which needs none (a server short of connections must
    /// not fail a wait that polling would serve).
    fn ready_to_wait<'a>(&'a self, at: &'a Attempt<'_, Self>) -> impl Fut<'a, bool> {
        async move {
            if let Some(c) = self.session.detach() {
                self.spares.put(c);
                return Ok(true);
            }
            let room = || async {
                let conn = self.session.live()?;
                Some(budget::room_for_connection(&conn).await)
            };
            self.spares
                .ready(&self.connector, at.settings, at.deadline, room)
                .await
        }
    }

    fn wait_in_server<'a>(&'a self, at: &'a mut Attempt<'_, Self>) -> impl Fut<'a, Option<Box<dyn Grant>>> {
        async move {
            let ticket = at
                .ticket
                .take()
                .ok_or_else(|| Error::Database("no lock-table ticket for a server wait".into()))?;
            let hold = at.hold.take();
            let got = self.spares.acquire(&self.connector, at, ticket, hold).await?;
            if got.is_some() {
                self.contended.note(*at.key, true);
            }
            Ok(got)
        }
    }

    /// On the side connection (the lock session runs only quick statements).
    fn create_tables<'a>(&'a self, settings: &'a Settings) -> impl Fut<'a, ()> {
        async move { fence::create_tables(&*self.probe(settings).await?).await }
    }

    fn last_run<'a>(
        &'a self,
        name: &'a LockName,
        key: &'a PgKey,
        settings: &'a Settings,
    ) -> impl Fut<'a, Option<LastRun>> {
        async move { runs::last(&*self.probe(settings).await?, &key.to_string(), name).await }
    }

    fn holders<'a>(
        &'a self,
        name: &'a LockName,
        key: &'a PgKey,
        settings: &'a Settings,
    ) -> impl Fut<'a, Vec<Holder>> {
        async move { introspect::holders(&*self.probe(settings).await?, name, key, &settings.prefix).await }
    }

    fn list<'a>(&'a self, settings: &'a Settings) -> impl Fut<'a, Vec<ListedLock>> {
        async move {
            let conn = self.probe(settings).await?;
            let mut rows = introspect::list(&conn, &settings.prefix).await?;
            if let Some(pid) = self.session.live().and_then(|s| s.server_pid()) {
                self.names.fill(&mut rows, pid);
            }
            Ok(rows)
        }
    }
}
