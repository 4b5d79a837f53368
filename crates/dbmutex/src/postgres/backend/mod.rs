//! The [`Locker`](crate::Locker)'s PostgreSQL backend: [`PgBackend`] and
//! what it runs on (the lock session, dedicated connections for server
//! waits, the in-process hand-off, the lock-table budget, fencing and run
//! records, introspection). How locks are held: the `postgres` module's
//! docs.

mod budget;
mod conn;
mod dedicated;
mod delay;
mod fence;
mod handoff;
mod introspect;
mod lazy;
mod names;
mod pooler;
mod runs;
mod session;
mod session_lock;
mod upgrade;
mod waits;
mod xact;

use std::sync::{Arc, Mutex, PoisonError};

pub(crate) use conn::{Connector, PgConn};
use dedicated::Spares;
use handoff::PgSlot;
use lazy::{prepare_session, LazyConn, Side};
use session::SessionGrant;
use session_lock::SessionLock;

use crate::core::backend::{rows, Attempt, Backend, Fut, Missing, Plan, Records, WaitIn, Waited};
use crate::core::guard::{BoxFut, Grant};
use crate::key::{pg_key, PgKey};
use crate::runs::LastRun;
use crate::settings::Settings;
use crate::types::ListedLock;
use crate::{Error, LockName, LockOptions, Mode, Result, WaitStrategy};

pub(crate) struct PgBackend {
    connector: Connector,
    /// The lock session shared by polling session locks.
    session: LazyConn,
    /// The side connection (the lock table's listing, records; one key's
    /// holders and counts while the lock session is in use), opened on
    /// first use: an uncontended locker keeps one connection.
    side: Arc<Side>,
    /// The locker's name prefix.
    prefix: crate::Prefix,
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
            prefix: settings.prefix.clone(),
            shared_sessions: false,
            skip_pooler_check: settings.skip_pooler_check,
            spares: Spares::new(settings.idle_limit()),
            // Until the first connection reads the server's settings.
            names: Arc::default(),
            budget: budget::Budget::new(conn::LockTable {
                per_transaction: 64,
                slots: 100,
            }),
        };
        // Connect now, so a bad URL, server or password fails here. Where
        // no connection can be found direct (several hosts, a Unix socket
        // without PostgreSQL's lock file beside it), the pooler check below
        // always needs a second one: both are made at once, which takes a
        // whole connect off such a start (BENCHMARKS.md, "`dbmutex run`
        // through a Unix socket or NAT").
        let (session, later, early) = if !settings.skip_pooler_check && backend.connector.never_direct() {
            // If either fails, the other is dropped where it stands, and a
            // connection it made is closed with it.
            let (session, other) = tokio::try_join!(
                backend.connector.connect(settings, true),
                backend.connector.connect(settings, true)
            )?;
            (session, None, Some(other))
        } else {
            // The claim's last step, where there is one (a connection not
            // found at the other end of our own socket, as behind NAT), is
            // run below, beside the check's second connect.
            let (session, later) = backend.connector.connect_start_later(settings).await?;
            (session, later, None)
        };
        if let Some(t) = session.lock_table.get() {
            backend.budget = budget::Budget::new(*t);
        }
        // A claimed session on the very address and port we dialed is the
        // server itself: no pooler can be in between, and one connection
        // is all it takes. Anything else gets the behavioural check on a
        // second connection, even when a claim already told: it is what
        // finds a statement pooler (which refuses its BEGIN). (A claim with
        // its last step still to run is never direct.)
        let direct = session.is_claimed() && session.is_direct();
        let check = !(settings.skip_pooler_check || direct);
        let other = match early {
            // Made beside the session, both by `connect`, whose claims are
            // whole: where it was, the check always runs.
            Some(other) => Some(other),
            None => {
                let finish = async {
                    match later {
                        Some(later) => conn::bounded(settings, session.finish_claim(later)).await,
                        None => Ok(()),
                    }
                };
                if check {
                    // Run together, the second connection's claim may find
                    // the first's server session busy with this step and
                    // miss the first's token there (a hint only:
                    // `shares_sessions` below is what decides).
                    let ((), other) = tokio::try_join!(finish, backend.connector.connect(settings, true))?;
                    Some(other)
                } else {
                    finish.await?;
                    None
                }
            }
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
                // Nothing in between that shares sessions (a client behind
                // NAT, say): the server may watch for our vanishing.
                backend.connector.clear();
                session.watch_once_cleared();
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

    /// Where one key's holders and the lock-table count are read: small
    /// reads that answer at once (the lock session's keepalive probe counts
    /// on that). On the side connection if it is open, else on the lock
    /// session while nothing uses it, else on a side connection opened now:
    /// a process that looks before it waits (`dbmutex run`'s "held by")
    /// keeps one connection. Reads that may take long (the whole lock
    /// table, a table DDL may lock) go on the side connection only.
    async fn probe(&self) -> Result<Arc<PgConn>> {
        if let Some(c) = self.side.live().or_else(|| self.session.idle()) {
            return Ok(c);
        }
        self.side.get().await
    }

    /// One acquisition's tries with its lock-table `ticket`: on the lock
    /// session, unless the plan waits in the server only, or a key
    /// contended lately finds no lock session live (then they go straight
    /// to the wait, on an idle connection). Only the `first` tries of an
    /// acquisition may skip their first try; a poll's tries try at once.
    async fn tries(&self, at: &Attempt<'_, Self>, ticket: budget::Slot, first: bool) -> Result<Tries> {
        let wait = self.plan(at.opts).wait;
        if wait == WaitIn::Server {
            return Ok(Tries {
                conn: None,
                skip: false.into(),
                ticket: Mutex::new(Some(ticket)),
            });
        }
        let contended = first
            && !at.opts.is_try_once()
            && at
                .hold
                .as_ref()
                .is_some_and(|h| handoff::contended_lately(h.slot()));
        // A fleet waiter: its last wait took the lock session (detached to
        // wait in the server, then kept as a spare), and the key is
        // contended. It goes to the wait at once, on that spare, instead of
        // making it the lock session again only to detach it after a
        // skipped try (its gate, its keepalive probe started and paused,
        // a spare taken and put back: code a fleet of 200 pays for in
        // cache misses on every acquisition).
        if contended && matches!(wait, WaitIn::TryThenServer { .. }) && self.session.live().is_none() {
            return Ok(Tries {
                conn: None,
                skip: true.into(),
                ticket: Mutex::new(Some(ticket)),
            });
        }
        let conn = self
            .session
            .get(&self.connector, at.settings, &self.spares)
            .await?;
        let skip = contended
            // Before the tries take their reference: only `conn` here
            // holds it besides the lock session's own slot.
            && Arc::strong_count(&conn) == 2;
        Ok(Tries {
            conn: Some(conn),
            skip: skip.into(),
            ticket: Mutex::new(Some(ticket)),
        })
    }

    /// A connection for a wait after a failed try is at hand: the lock
    /// session itself if it holds nothing (no new connection), else an idle
    /// one, else a new one made now if the server has room for it (asked
    /// on the lock session; with none live, as when the tries went straight
    /// to the wait, it is made as the lock session would have been); else
    /// the core polls on the lock session, which needs none (a server
    /// short of connections must not fail a wait that polling would serve).
    async fn ready_to_wait(&self, at: &Attempt<'_, Self>) -> Result<bool> {
        if self.session.lend_to(&self.spares) {
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

/// One acquisition's tries: its room in the lock table and (unless it
/// waits in the server only, or goes straight to a wait) the lock session.
pub(crate) struct Tries {
    /// The lock session; `None` for a wait in the server only, or when the
    /// tries go straight to a wait on an idle connection (a try after that
    /// then gets the lock session itself).
    conn: Option<Arc<PgConn>>,
    /// Room in the server's lock table (see [`budget`]); a grant takes it.
    ticket: Mutex<Option<budget::Slot>>,
    /// Skip the first try: the key was contended lately, and the lock
    /// session is free to wait in the server or there is none live (see
    /// `handoff::contended_lately`).
    skip: std::sync::atomic::AtomicBool,
}

impl Backend for PgBackend {
    type Key = PgKey;
    type SlotExt = PgSlot;
    type Tries = Tries;

    /// Behind a transaction pooler, no session locks; a transaction-level
    /// shared lock gives no upgrade.
    fn refusal(&self, missing: Missing) -> Option<String> {
        match missing {
            Missing::SessionLocks => {
                let pooled =
                    self.shared_sessions || (self.connector.pooler_seen() && !self.skip_pooler_check);
                pooled.then(|| pooler::SESSION_LOCKS_UNSAFE.into())
            }
            Missing::Upgrade => Some(
                "a transaction-level lock (transaction(true)) cannot be upgraded: the exclusive lock \
                 could not be given back before the transaction ends"
                    .into(),
            ),
            Missing::Shared | Missing::Transaction | Missing::Fencing => None,
        }
    }

    fn key(&self, name: &LockName) -> Result<PgKey> {
        Ok(pg_key(name, &self.prefix))
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

    /// Room for one more server lock (see [`budget`]), then the tries.
    fn begin<'a>(&'a self, at: &'a Attempt<'_, Self>) -> impl Fut<'a, Tries> {
        async move {
            let ticket = self
                .budget
                .reserve(at.settings.connect_timeout, || self.probe())
                .await?;
            self.tries(at, ticket, true).await
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
            let session;
            let conn = match &tries.conn {
                Some(conn) => conn,
                // The tries skip straight to the wait (`tries`): nothing can
                // be parked on a session not there.
                None if tries.skip.swap(false, std::sync::atomic::Ordering::Relaxed) => return Ok(None),
                // No wait in the server after all (no permit left): the
                // core polls, on the lock session, got within the caller's
                // bound should it have to connect.
                None => {
                    let get = self.session.get(&self.connector, at.settings, &self.spares);
                    session = match at.deadline.at() {
                        None => get.await?,
                        Some(d) => match tokio::time::timeout_at(d, get).await {
                            Ok(got) => got?,
                            Err(_) => return Ok(None),
                        },
                    };
                    &session
                }
            };
            // A task of ours may have left the server lock on the session for us.
            let parked = at.opts.mode == Mode::Exclusive
                && at
                    .hold
                    .as_ref()
                    .is_some_and(|h| handoff::take_parked(h.slot(), conn.id));
            // Before the lock's value is made (a copy of the name): a fleet
            // waiter skips its try on every acquisition.
            if !parked && tries.skip.swap(false, std::sync::atomic::Ordering::Relaxed) {
                return Ok(None);
            }
            let lock = SessionLock {
                conn: conn.clone(),
                key: *at.key,
                mode: at.opts.mode,
                name: at.name.clone(),
                text: conn.session_text(at.settings.name_comments, at.opts.mode, at.key),
            };
            let lock = match parked {
                true => lock,
                false => match lock.try_lock().await {
                    (lock, Ok(true)) => lock,
                    (_, Ok(false)) => {
                        // A try-once that failed: a wait that follows
                        // (`dbmutex run`'s look at the holders, then its
                        // wait) goes straight to the server, no second try.
                        if let (true, Some(h)) = (at.opts.is_try_once(), &at.hold) {
                            handoff::note_contended(h.slot(), true);
                        }
                        return Ok(None);
                    }
                    (_, Err(e)) => return Err(e),
                },
            };
            if let Some(h) = &at.hold {
                handoff::note_contended(h.slot(), false);
            }
            if at.settings.name_comments {
                lock.conn.remember_name(at.name);
            }
            let ticket = tries
                .ticket
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
                .map(budget::Slot::granted);
            let grant = SessionGrant::new(lock, at.hold.take(), ticket, self.names.clone());
            Ok(Some(Box::new(grant) as Box<dyn Grant>))
        }
    }

    /// After a failed try (the tries' session let go first: the wait may
    /// take it), on a connection of its own if one is at hand, else the core
    /// polls; a server wait asked for, on a connection of its own.
    fn wait_in_server<'a>(
        &'a self,
        tries: Tries,
        at: &'a mut Attempt<'_, Self>,
    ) -> impl Fut<'a, Waited<Tries>> {
        async move {
            let Tries { conn, ticket, .. } = tries;
            drop(conn);
            let ticket = ticket
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .ok_or_else(|| Error::Database("no lock-table ticket for a server wait".into()))?;
            let after_try = matches!(self.plan(at.opts).wait, WaitIn::TryThenServer { .. });
            if after_try && !self.ready_to_wait(at).await? {
                // Polling tries on the lock session, every time.
                return Ok(Waited::Poll(self.tries(at, ticket, false).await?));
            }
            if !after_try && !self.spares.has_fresh() {
                // A wait in the server asked for, or a transaction lock,
                // with no idle connection at hand: on the lock session
                // itself if it holds nothing, so a process that takes one
                // lock at a time keeps one connection.
                self.session.lend_to(&self.spares);
            }
            // The key is contended whether the wait gets it or times out:
            // the next acquisition skips its try.
            if let Some(h) = &at.hold {
                handoff::note_contended(h.slot(), true);
            }
            let hold = at.hold.take();
            let got = self.spares.acquire(&self.connector, at, ticket, hold).await?;
            Ok(got.map_or(Waited::TimedOut, Waited::Granted))
        }
    }

    fn held<'a>(&'a self, only: Option<(&'a LockName, &'a PgKey)>) -> impl Fut<'a, Vec<ListedLock>> {
        async move {
            if let Some((name, key)) = only {
                let conn = self.probe().await?;
                let holders = introspect::holders(&conn, name, key, &self.prefix).await?;
                // An answer: a keepalive probe queued behind it is not
                // taken for silence.
                conn.heard_from_server();
                return Ok(rows(name, key, holders));
            }
            let conn = self.side.get().await?;
            let mut rows = introspect::list(&conn, &self.prefix).await?;
            if let Some(pid) = self.session.live().and_then(|s| s.server_pid()) {
                self.names.fill(&mut rows, pid);
            }
            Ok(rows)
        }
    }

    fn records(&self) -> Option<&dyn Records> {
        Some(self)
    }
}

/// The tables' own requests, on the side connection: a read of
/// `dbmutex_runs` waits behind DDL on it, and `create_tables` is DDL
/// (the lock session runs only quick statements).
impl Records for PgBackend {
    fn create_tables(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move { fence::create_tables(&*self.side.get().await?).await })
    }

    fn last_run<'a>(&'a self, name: &'a LockName, key: &'a str) -> BoxFut<'a, Result<Option<LastRun>>> {
        Box::pin(async move { runs::last(&*self.side.get().await?, key, name).await })
    }
}
