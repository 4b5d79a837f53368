//! The PostgreSQL backend, and helpers for callers who own the transaction.
//!
//! # How locks are held
//!
//! - **Session locks, polling (the default).** One connection per
//!   [`Locker`](crate::Locker) — the *lock session* — holds every such lock of
//!   the process. PostgreSQL cannot tell the tasks on one session apart
//!   (session locks are re-entrant), so tasks first take an in-process hold on
//!   the key, then ask the server. Concurrent requests are pipelined on the
//!   one connection.
//! - **Server-side waits** ([`WaitStrategy::Server`]) and **transaction
//!   locks** ([`LockOptions::transaction`]) use a dedicated connection per
//!   guard, because a blocked statement would stall the shared session.
//! - **Your own transaction**: [`lock_xact`] takes a transaction-level lock in
//!   a `tokio_postgres::Transaction` you own.
//! - **Behind a transaction pooler** (PgBouncer `pool_mode = transaction`),
//!   which dbmutex detects when it connects, session locks fail with
//!   [`Error::Unsupported`]; use [`LockOptions::transaction`].
//!
//! A lock lives as long as its connection: when the connection ends (server
//! restart, `pg_terminate_backend`, network failure noticed by TCP
//! keepalive), every guard on it reports the loss at once. Nothing is ever
//! re-acquired silently.

mod budget;
mod conn;
mod handoff;
mod pooler;
mod sql;

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

pub(crate) use conn::{Connector, NotifyHandler, PgConn};
use sql::Call;

use crate::arbiter::{Arbiter, Hold};
use crate::guard::{BoxFuture, Held};
use crate::key::{name_from_comments, pg_key, PgKey, Prefix};
use crate::settings::Settings;
use crate::types::{Holder, ListedLock};
use crate::wait;
use crate::{BackendKind, Error, LockName, LockOptions, Mode, Result, WaitStrategy};

/// Maps a driver error met while acquiring `name`.
fn db_err(e: tokio_postgres::Error, name: &LockName) -> Error {
    match e.code() {
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED => Error::Deadlock {
            name: name.to_string(),
            source: Box::new(e),
        },
        Some(c) if *c == SqlState::OUT_OF_MEMORY => Error::LockTableFull(Box::new(e)),
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW =>
        {
            Error::Connect(Box::new(e))
        }
        _ if e.is_closed() => Error::Connect(Box::new(e)),
        _ => Error::Database(Box::new(e)),
    }
}

/// The server ended the session (terminated, shutting down): its locks are gone.
fn is_session_end(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CRASH_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW
    })
}

fn is_lock_timeout(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
}

/// The first boolean of a `query_typed` result.
fn first_bool(rows: &[tokio_postgres::Row]) -> Result<bool> {
    rows.first()
        .and_then(|r| r.try_get::<_, bool>(0).ok())
        .ok_or_else(|| Error::Database("the lock function returned no boolean".into()))
}

/// The first text value of a simple-query batch result.
fn first_text(msgs: &[tokio_postgres::SimpleQueryMessage]) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
        _ => None,
    })
}

/// Makes `conn` the lock session: it listens on the hand-off channel (never
/// through a detected pooler: the caller checks first), prepares its
/// statements when they carry no name, and probes a quiet spell (it runs
/// only statements that answer at once, so a probe is never mistaken for a
/// wait).
async fn prepare_session(conn: &Arc<PgConn>, settings: &Settings, listen: bool) -> Result<()> {
    if listen {
        conn.client
            .batch_execute(&format!("LISTEN {}", handoff::CHANNEL))
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
    }
    if !settings.name_comments {
        conn.warm_statements()
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
    }
    drop(conn.start_heartbeat(settings.keepalive, false));
    Ok(())
}

/// A connection made on first use and replaced when lost.
#[derive(Default)]
struct LazyConn {
    conn: Mutex<Option<Arc<PgConn>>>,
    gate: tokio::sync::Mutex<()>,
}

impl LazyConn {
    /// The live connection, connecting a new one if there is none. With
    /// `listen`, the new connection listens on the hand-off channel.
    async fn get(
        &self,
        connector: &Connector,
        settings: &Settings,
        listen: Option<&NotifyHandler>,
    ) -> Result<Arc<PgConn>> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let _gate = self.gate.lock().await;
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let conn = connector.connect(settings, listen.cloned(), true).await?;
        if listen.is_some() {
            if !conn.is_claimed() {
                return Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()));
            }
            prepare_session(&conn, settings, true).await?;
        }
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    /// Adopts `conn` if it is alive.
    fn set(&self, conn: Arc<PgConn>) {
        if !conn.is_lost() {
            *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
        }
    }

    fn live(&self) -> Option<Arc<PgConn>> {
        let c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        c.as_ref().filter(|c| !c.is_lost()).cloned()
    }
}

pub(crate) struct PgBackend {
    connector: Connector,
    /// The lock session shared by polling session locks.
    session: LazyConn,
    /// Introspection runs elsewhere, so `pg_stat_activity` keeps showing the
    /// lock session's last lock statement (with its name comment).
    probe: LazyConn,
    arbiter: Arc<Arbiter<PgKey>>,
    /// Handles the hand-off channel's messages on the lock session.
    on_notify: NotifyHandler,
    /// This locker's id on the hand-off channel.
    id: u64,
    /// A transaction pooler shares server sessions: session locks are refused.
    shared_sessions: bool,
    /// Clean dedicated connections, kept for the next server-side wait.
    spares: Spares,
    /// This locker's share of the server's lock table.
    budget: Arc<budget::Budget>,
}

/// Idle dedicated connections that hold nothing.
type Spares = Arc<Mutex<Vec<Arc<PgConn>>>>;

/// How many idle dedicated connections a locker keeps.
const MAX_SPARES: usize = 4;

/// Keeps `conn` for reuse if it is alive and there is room; else closes it.
fn spare(spares: &Spares, conn: Arc<PgConn>) {
    let mut s = spares.lock().unwrap_or_else(|e| e.into_inner());
    if !conn.is_lost() && s.len() < MAX_SPARES {
        s.push(conn);
    } else {
        conn.close();
    }
}

impl PgBackend {
    pub(crate) async fn connect(url: &str, settings: &Settings) -> Result<Self> {
        Self::with_connector(Connector::from_url(url, settings)?, settings).await
    }

    pub(crate) async fn from_config(config: tokio_postgres::Config, settings: &Settings) -> Result<Self> {
        Self::with_connector(Connector::from_config(config, settings)?, settings).await
    }

    async fn with_connector(connector: Connector, settings: &Settings) -> Result<Self> {
        let arbiter: Arc<Arbiter<PgKey>> = Arc::default();
        // Tells this locker's hand-off messages from others'.
        let id = fastrand::u64(1..);
        let mut backend = PgBackend {
            connector,
            session: LazyConn::default(),
            probe: LazyConn::default(),
            arbiter: arbiter.clone(),
            on_notify: handoff::handler(arbiter, id),
            id,
            shared_sessions: false,
            spares: Spares::default(),
            // Until the first connection reads the server's settings.
            budget: budget::Budget::new(budget::LockTable {
                per_transaction: 64,
                slots: 100,
            }),
        };
        // Connect now, so a bad URL, server or password fails here. The
        // second connection serves the pooler check, then introspection.
        // The lock session listens only once no pooler was seen.
        let (session, other) = tokio::join!(
            backend
                .connector
                .connect(settings, Some(backend.on_notify.clone()), true),
            backend.connector.connect(settings, None, true)
        );
        let (session, other) = (session?, other?);
        if let Some(t) = session.lock_table.get().or(other.lock_table.get()) {
            backend.budget = budget::Budget::new(*t);
        }
        // The behavioural check runs even when a claim already told: it is
        // what finds a statement pooler (which refuses its BEGIN).
        let moves = !settings.skip_pooler_check && pooler::shares_sessions(&session, &other).await?;
        backend.shared_sessions = moves
            || (!settings.skip_pooler_check && (!session.is_claimed() || backend.connector.pooler_seen()));
        if backend.shared_sessions {
            tracing::warn!("dbmutex: {}", pooler::SESSION_LOCKS_UNSAFE);
            session.close();
        } else {
            prepare_session(&session, settings, true).await?;
            backend.session.set(session);
        }
        backend.probe.set(other);
        Ok(backend)
    }

    /// Room for one more server lock (see [`budget`]).
    async fn reserve(&self, settings: &Settings) -> Result<budget::Slot> {
        self.budget
            .reserve(settings.connect_timeout, || {
                self.probe.get(&self.connector, settings, None)
            })
            .await
    }

    async fn session(&self, settings: &Settings) -> Result<Arc<PgConn>> {
        self.session
            .get(&self.connector, settings, Some(&self.on_notify))
            .await
    }

    /// Hand-off messages go out on the second connection when it is up
    /// (never holding up the lock session), else on the lock session.
    fn channel(&self, session: &Arc<PgConn>) -> handoff::Channel {
        handoff::Channel {
            sender: self.id,
            conn: self.probe.live().unwrap_or_else(|| session.clone()),
        }
    }

    pub(crate) fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
        settings: &Settings,
    ) -> Result<Option<Box<dyn Held>>> {
        let pooled = self.shared_sessions || (self.connector.pooler_seen() && !settings.skip_pooler_check);
        if pooled && !opts.transaction {
            return Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()));
        }
        let key = pg_key(name, &settings.prefix);
        if opts.transaction || opts.strategy == WaitStrategy::Server {
            let slot = self.reserve(settings).await?;
            return self.acquire_dedicated(name, key, opts, settings, slot).await;
        }
        let deadline = wait::deadline(opts.timeout);
        // In-process first: costs the server nothing, and the server could
        // not tell our tasks apart anyway.
        let Some(hold) = self.arbiter.hold(&key, opts.mode, deadline).await else {
            return Ok(None);
        };
        // Room in the server's lock table only once this task may ask the
        // server: waiters queued in-process for one key take none.
        let slot = self.reserve(settings).await?;
        let conn = self.session(settings).await?;
        let channel = self.channel(&conn);
        // A task of ours may have left the server lock on the session for us.
        let parked = opts.mode == Mode::Exclusive && handoff::take_parked(hold.slot(), conn.id);
        if !parked {
            let remote = hold.slot().clone();
            let want = handoff::Want::new(&channel, key);
            let got = wait::poll_until(deadline, opts.max_backoff, Some(&remote.remote), || async {
                let got = try_on_session(&conn, key, opts.mode, name, settings.name_comments).await?;
                if got.is_none() {
                    // Ask the holder's process (if it is a dbmutex) to tell us
                    // when it lets go, instead of waiting for the next poll.
                    want.announce();
                }
                Ok(got)
            })
            .await?;
            if got.is_none() {
                return Ok(None);
            }
        }
        Ok(Some(Box::new(SessionHeld {
            channel,
            conn,
            key,
            mode: opts.mode,
            name: name.clone(),
            comment: settings.name_comments,
            hold: Some(hold),
            budget: Some(slot.granted()),
        })))
    }

    async fn acquire_dedicated(
        &self,
        name: &LockName,
        key: PgKey,
        opts: &LockOptions,
        settings: &Settings,
        slot: budget::Slot,
    ) -> Result<Option<Box<dyn Held>>> {
        let spare_conn = {
            let mut s = self.spares.lock().unwrap_or_else(|e| e.into_inner());
            std::iter::from_fn(|| s.pop()).find(|c| !c.is_lost())
        };
        let deadline = wait::deadline(opts.timeout);
        let (conn, got) = match spare_conn {
            Some(c) => match wait_dedicated(&c, name, key, opts).await {
                // A spare may have died unnoticed while idle: once, on a new
                // one, within what is left of the caller's bound.
                Err(Error::Connect(_)) => {
                    c.close();
                    let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
                    let opts = opts.clone().timeout_opt(left);
                    let c = self.connector.connect(settings, None, false).await?;
                    let got = wait_dedicated(&c, name, key, &opts).await;
                    (c, got)
                }
                got => (c, got),
            },
            None => {
                let c = self.connector.connect(settings, None, false).await?;
                let got = wait_dedicated(&c, name, key, opts).await;
                (c, got)
            }
        };
        match got {
            Ok(true) => Ok(Some(Box::new(DedicatedHeld {
                heartbeat: conn.start_heartbeat(settings.keepalive, opts.transaction),
                conn: Some(conn),
                key,
                mode: opts.mode,
                name: name.clone(),
                xact: opts.transaction,
                spares: self.spares.clone(),
                budget: Some(slot.granted()),
            }))),
            Ok(false) if !opts.transaction => {
                // A refused try or a timed-out wait leaves the session clean
                // (the timeout's implicit transaction has ended).
                spare(&self.spares, conn);
                Ok(None)
            }
            Ok(false) => {
                conn.close();
                Ok(None)
            }
            Err(e) => {
                conn.close();
                Err(e)
            }
        }
    }

    pub(crate) async fn is_locked(&self, name: &LockName, settings: &Settings) -> Result<bool> {
        Ok(!self.holders(name, settings).await?.is_empty())
    }

    pub(crate) async fn holders(&self, name: &LockName, settings: &Settings) -> Result<Vec<Holder>> {
        let key = pg_key(name, &settings.prefix);
        let (classid, objid, objsubid) = key.pg_locks_ids();
        let conn = self.probe.get(&self.connector, settings, None).await?;
        let sql =
            format!("{LOCKS_QUERY} AND l.classid = $1 AND l.objid = $2 AND l.objsubid = $3 ORDER BY l.pid");
        let rows = conn
            .client
            .query_typed(
                &sql,
                &[
                    (&classid, Type::OID),
                    (&objid, Type::OID),
                    (&objsubid, Type::INT2),
                ],
            )
            .await
            .map_err(|e| db_err(e, name))?;
        Ok(rows.iter().map(|r| listed(r, &settings.prefix).holder).collect())
    }

    pub(crate) async fn list(&self, settings: &Settings) -> Result<Vec<ListedLock>> {
        let conn = self.probe.get(&self.connector, settings, None).await?;
        let rows = conn
            .client
            .query_typed(&format!("{LOCKS_QUERY} ORDER BY l.pid, l.classid, l.objid"), &[])
            .await
            .map_err(|e| db_err(e, &LockName::Str("(list)".into())))?;
        Ok(rows.iter().map(|r| listed(r, &settings.prefix)).collect())
    }
}

/// Granted advisory locks of the current database, with what
/// `pg_stat_activity` tells of their holders (the server hides the query
/// text of other roles' sessions unless the role may see it).
const LOCKS_QUERY: &str = "SELECT l.classid, l.objid, l.objsubid, l.mode, l.pid, \
     a.application_name, a.usename::text, \
     CASE WHEN a.client_addr IS NULL THEN 'local' ELSE host(a.client_addr) || ':' || a.client_port END, \
     coalesce(a.xact_start, a.backend_start)::text, a.query \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())";

fn listed(r: &tokio_postgres::Row, prefix: &Prefix) -> ListedLock {
    let classid: u32 = r.get(0);
    let objid: u32 = r.get(1);
    let objsubid: i16 = r.get(2);
    let mode: &str = r.get(3);
    let key = PgKey::from_pg_locks(classid, objid, objsubid);
    let query: Option<String> = r.get(9);
    ListedLock {
        name: query.as_deref().and_then(|q| name_from_comments(q, &key, prefix)),
        key: key.to_string(),
        holder: Holder {
            pid: i64::from(r.get::<_, i32>(4)),
            mode: if mode == "ShareLock" {
                Mode::Shared
            } else {
                Mode::Exclusive
            },
            application: r.get(5),
            user: r.get(6),
            client: r.get(7),
            since: r.get(8),
        },
    }
}

/// One `pg_try_advisory_lock*` on the lock session, cancel-safe: the
/// statement runs in its own task, and a success travels back as a
/// [`Taken`] that undoes the lock if nobody is left to take it over — whether
/// the acquire was dropped before the answer came or after it was sent.
async fn try_on_session(
    conn: &Arc<PgConn>,
    key: PgKey,
    mode: Mode,
    name: &LockName,
    comment: bool,
) -> Result<Option<()>> {
    let (tx, rx) = oneshot::channel();
    let c = conn.clone();
    let name2 = name.clone();
    // On the connection's runtime: if the caller's runtime shuts down
    // meanwhile, the task (and the undo of an unreceived grant) still runs.
    drop(conn.runtime.spawn(async move {
        let r = c
            .lock_call(Call::Try, mode, &key, comment.then_some(&name2))
            .await;
        let r = match r {
            Err(e) => Err(db_err(e, &name2)),
            Ok(None) => Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into())),
            Ok(Some(got)) => Ok(got.then(|| Taken {
                undo: Some((c.clone(), key, mode, name2.clone(), comment)),
            })),
        };
        // If the receiver is gone, `r` drops here, and a `Taken` in it undoes.
        let _ = tx.send(r);
    }));
    match rx.await {
        Ok(r) => Ok(r?.map(Taken::keep)),
        Err(_) => Err(Error::Database(
            "the lock statement's task ended unexpectedly".into(),
        )),
    }
}

/// A session lock the server granted, not yet owned by a guard. Dropped
/// unkept, it unlocks: session locks are counted, so this undoes exactly
/// this grant even if another task of ours has taken the key since.
struct Taken {
    undo: Option<(Arc<PgConn>, PgKey, Mode, LockName, bool)>,
}

impl Taken {
    fn keep(mut self) {
        self.undo = None;
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some((conn, key, mode, name, comment)) = self.undo.take() {
            let c = conn.clone();
            drop(conn.runtime.spawn(async move {
                let _ = unlock_on(&c, key, mode, &name, comment).await;
            }));
        }
    }
}

/// `pg_advisory_unlock*` on `conn`: `Err(LockLost)` when the server says we
/// did not hold it or the connection is gone.
pub(super) async fn unlock_on(
    conn: &Arc<PgConn>,
    key: PgKey,
    mode: Mode,
    name: &LockName,
    comment: bool,
) -> Result<()> {
    if conn.is_lost() {
        return Err(Error::LockLost {
            name: name.to_string(),
        });
    }
    match conn
        .lock_call(Call::Unlock, mode, &key, comment.then_some(name))
        .await
    {
        Ok(Some(true)) => Ok(()),
        // Not held, or (`None`) the statement ran on another server session:
        // ours has been ended, and its locks with it.
        Ok(Some(false) | None) => Err(Error::LockLost {
            name: name.to_string(),
        }),
        Err(e) if e.is_closed() || conn.is_lost() || is_session_end(&e) => Err(Error::LockLost {
            name: name.to_string(),
        }),
        Err(e) => {
            // The lock's fate is unknown: close the session so the server
            // frees it for sure.
            conn.close();
            Err(Error::Database(Box::new(e)))
        }
    }
}

/// The wait on a dedicated connection, cancel-safe: if the future is dropped
/// while a statement may still run, the statement is cancelled and the
/// session closed.
async fn wait_dedicated(conn: &Arc<PgConn>, name: &LockName, key: PgKey, opts: &LockOptions) -> Result<bool> {
    let mut abandon = Abandon(Some(conn.clone()));
    let got = if opts.transaction {
        wait_xact_dedicated(conn, name, key, opts).await
    } else {
        wait_session_dedicated(conn, name, key, opts).await
    };
    abandon.0 = None;
    got
}

/// How many rows a simple-query batch returned.
fn row_count(msgs: &[tokio_postgres::SimpleQueryMessage]) -> usize {
    msgs.iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count()
}

/// A session lock on a dedicated connection, waiting in the server.
async fn wait_session_dedicated(
    conn: &Arc<PgConn>,
    name: &LockName,
    key: PgKey,
    opts: &LockOptions,
) -> Result<bool> {
    conn.claim().await?;
    if !conn.is_claimed() {
        return Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()));
    }
    if opts.is_try_once() {
        let (sql, params) = sql::bound(Call::Try, false, opts.mode, &key, name, conn.owner());
        let rows = conn
            .client
            .query_typed(&sql, &params.as_typed())
            .await
            .map_err(|e| db_err(e, name))?;
        if rows.is_empty() {
            conn.moved();
            return Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()));
        }
        return first_bool(&rows);
    }
    let lock = sql::inline(Call::Wait, false, opts.mode, &key, name, conn.owner());
    // A multi-statement simple query runs as one implicit transaction, so
    // the transaction-local settings end with it: one round trip, and the
    // session's own settings are never touched. Both are set even for an
    // unbounded wait: a role's or database's default lock_timeout or
    // statement_timeout must not cut short the wait the caller chose.
    let batch = format!(
        "SELECT set_config('lock_timeout', '{}ms', true), set_config('statement_timeout', '0', true); {lock}",
        sql::wait_ms(opts.timeout)
    );
    match conn.client.simple_query(&batch).await {
        // One row from the settings, one from the lock.
        Ok(msgs) if row_count(&msgs) == 2 => Ok(true),
        Ok(_) => {
            conn.moved();
            Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()))
        }
        // The server may grant the lock just as the timeout fires, and a
        // session lock outlives the aborted statement: ask whether we hold
        // it (then it is ours, a little late), so a spare never keeps one.
        Err(e) if is_lock_timeout(&e) => {
            match holds(conn, &key, opts.mode).await.map_err(|e| db_err(e, name))? {
                Some(held) => Ok(held),
                None => {
                    conn.moved();
                    Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()))
                }
            }
        }
        Err(e) => Err(db_err(e, name)),
    }
}

/// Whether this connection's own server session holds `key` in `mode`;
/// `None` when the question ran on another server session (see
/// `PgConn::claim`).
async fn holds(
    conn: &PgConn,
    key: &PgKey,
    mode: Mode,
) -> std::result::Result<Option<bool>, tokio_postgres::Error> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let lock_mode = if mode == Mode::Shared {
        "ShareLock"
    } else {
        "ExclusiveLock"
    };
    let owner = conn.owner();
    let rows = conn
        .client
        .query_typed(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND pid = pg_backend_pid() AND classid = $1 AND objid = $2 AND objsubid = $3 AND mode = $4) \
             WHERE current_setting('dbmutex.owner', true) = $5",
            &[
                (&classid, Type::OID),
                (&objid, Type::OID),
                (&objsubid, Type::INT2),
                (&lock_mode, Type::TEXT),
                (&owner, Type::TEXT),
            ],
        )
        .await?;
    Ok(rows.first().map(|r| r.get::<_, bool>(0)))
}

/// The message when a transaction landed on a server session that another
/// client of ours claimed (behind a pooler): its session locks would be
/// re-entrant for our transaction lock there.
const SESSION_OF_ANOTHER: &str = "this transaction runs on a server session that another dbmutex \
     client holds session locks on (a pooler shares server sessions, and some client took session \
     locks through it): a transaction lock there would not exclude that client. Use transaction \
     locks only (LockOptions::transaction(true)) for every client behind this pooler";

/// A transaction-level lock inside a transaction opened on a dedicated connection.
async fn wait_xact_dedicated(conn: &PgConn, name: &LockName, key: PgKey, opts: &LockOptions) -> Result<bool> {
    let c = &conn.client;
    if opts.strategy == WaitStrategy::Poll || opts.is_try_once() {
        c.batch_execute("BEGIN").await.map_err(|e| db_err(e, name))?;
        let (sql, params) = sql::bound(Call::Try, true, opts.mode, &key, name, conn.owner());
        let got = wait::poll_until(wait::deadline(opts.timeout), opts.max_backoff, None, || async {
            let rows = c
                .query_typed(&sql, &params.as_typed())
                .await
                .map_err(|e| db_err(e, name))?;
            if rows.is_empty() {
                return Err(Error::Unsupported(SESSION_OF_ANOTHER.into()));
            }
            Ok(first_bool(&rows)?.then_some(()))
        })
        .await?;
        return Ok(got.is_some());
    }
    let lock = sql::inline(Call::Wait, true, opts.mode, &key, name, conn.owner());
    let batch = format!(
        "BEGIN; SET LOCAL lock_timeout = '{}ms'; SET LOCAL statement_timeout = 0; {lock}; \
         SET LOCAL lock_timeout TO DEFAULT; SET LOCAL statement_timeout TO DEFAULT",
        sql::wait_ms(opts.timeout)
    );
    // A timeout aborts the transaction, and its locks with it: no race.
    match c.simple_query(&batch).await {
        Ok(msgs) if row_count(&msgs) == 1 => Ok(true),
        Ok(_) => Err(Error::Unsupported(SESSION_OF_ANOTHER.into())),
        Err(e) if is_lock_timeout(&e) => Ok(false),
        Err(e) => Err(db_err(e, name)),
    }
}

/// Cancels the running statement and closes the session when dropped armed.
struct Abandon(Option<Arc<PgConn>>);

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            conn.cancel_and_close();
        }
    }
}

/// A session lock held on the shared lock session.
struct SessionHeld {
    conn: Arc<PgConn>,
    /// Where hand-off notifications go out.
    channel: handoff::Channel,
    key: PgKey,
    mode: Mode,
    name: LockName,
    comment: bool,
    /// `None` once the unlock is under way.
    hold: Option<Hold<PgKey>>,
    /// Room in the server's lock table, given back once the server lock
    /// is (`None` once the unlock is under way).
    budget: Option<budget::Slot>,
}

impl Held for SessionHeld {
    fn release(self: Box<Self>) -> BoxFuture<Result<()>> {
        Box::pin(async move {
            let mut this = self;
            // From here on this future owns the unlock; dropped before its
            // first poll, `this` drops instead and queues the unlock itself.
            let mut hold = this.hold.take();
            if this.mode == Mode::Exclusive {
                if let Some(h) = hold.take() {
                    hold = handoff::park(&this.conn, this.key, &this.name, this.comment, h);
                    if hold.is_none() {
                        return Ok(());
                    }
                }
            }
            let unlock = unlock_on(&this.conn, this.key, this.mode, &this.name, this.comment);
            tokio::pin!(unlock);
            // The first poll sends the unlock. Once it is on the wire, an
            // in-process waiter may go: whatever it sends reaches the server
            // after our unlock, so the hand-off costs it one round trip.
            let first = std::future::poll_fn(|cx| std::task::Poll::Ready(unlock.as_mut().poll(cx))).await;
            let wanted = handoff::take_wanted(hold.as_ref());
            drop(hold);
            let r = match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => unlock.await,
            };
            if r.is_ok() {
                this.channel.released(&this.key, wanted);
            }
            r
        })
    }

    fn lost_signal(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        Some(self.conn.lost_signal())
    }
}

impl Drop for SessionHeld {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            let (conn, key, mode, name, comment) = (
                self.conn.clone(),
                self.key,
                self.mode,
                self.name.clone(),
                self.comment,
            );
            let channel = self.channel.clone();
            let slot = self.budget.take();
            // No runtime here is fine: the handle spawns onto the
            // connection's own runtime. If that runtime is gone, so is the
            // connection, and the server has freed the lock.
            drop(self.conn.runtime.spawn(async move {
                let wanted = handoff::take_wanted(Some(&hold));
                let r = unlock_on(&conn, key, mode, &name, comment).await;
                drop((hold, slot));
                if r.is_ok() {
                    channel.released(&key, wanted);
                }
            }));
        }
    }
}

/// A lock on a connection of its own (server-side wait or transaction lock).
struct DedicatedHeld {
    /// `None` once released.
    conn: Option<Arc<PgConn>>,
    /// Checks the connection while the lock is held; stopped before the
    /// connection can serve another (blocking) wait.
    heartbeat: tokio::task::AbortHandle,
    key: PgKey,
    mode: Mode,
    name: LockName,
    xact: bool,
    spares: Spares,
    /// Room in the server's lock table, given back once the server lock
    /// is (`None` once the unlock is under way).
    budget: Option<budget::Slot>,
}

impl Held for DedicatedHeld {
    fn release(mut self: Box<Self>) -> BoxFuture<Result<()>> {
        let conn = self.conn.take().expect("held until released");
        // Before the unlock: no keepalive probe may follow it, since the
        // connection may next serve a wait that blocks.
        self.heartbeat.abort();
        let (key, mode, name, xact) = (self.key, self.mode, self.name.clone(), self.xact);
        let spares = self.spares.clone();
        let slot = self.budget.take();
        let task = conn.runtime.clone().spawn(async move {
            let _slot = slot;
            let r = if xact {
                match conn.client.batch_execute("COMMIT").await {
                    Ok(()) => Ok(()),
                    Err(_) => Err(Error::LockLost {
                        name: name.to_string(),
                    }),
                }
            } else {
                unlock_on(&conn, key, mode, &name, true).await
            };
            // Confirmed released: the session holds nothing and can serve
            // the next wait. On any doubt it is closed instead.
            if r.is_ok() {
                spare(&spares, conn);
            } else {
                conn.close();
            }
            r
        });
        Box::pin(async move {
            task.await
                .unwrap_or_else(|_| Err(Error::Database("the unlock task ended unexpectedly".into())))
        })
    }

    fn lost_signal(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.conn.as_ref().map(|c| c.lost_signal())
    }
}

impl Drop for DedicatedHeld {
    fn drop(&mut self) {
        // Closing the session frees its locks and ends its transaction, with
        // no round trip and no runtime needed.
        self.heartbeat.abort();
        if let Some(conn) = self.conn.take() {
            conn.close();
        }
    }
}

/// Takes a transaction-level advisory lock (`pg_advisory_xact_lock*`) inside
/// a transaction you own; it is released when that transaction ends. Returns
/// `false` when the wait ended without the lock.
///
/// - [`WaitStrategy::Poll`] retries `pg_try_advisory_xact_lock*` with backoff.
/// - [`WaitStrategy::Server`] waits in the server (deadlock detection
///   included) inside a savepoint, with `lock_timeout` set for the wait only.
///   Afterwards — acquired, timed out, or deadlocked — `lock_timeout` reads as
///   it did before and the transaction is usable: a timeout returns
///   `Ok(false)`, a deadlock [`Error::Deadlock`].
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), dbmutex::Error> {
/// use dbmutex::{postgres::lock_xact, LockOptions, Prefix, WaitStrategy};
/// use std::time::Duration;
/// let tx = client.transaction().await.map_err(|e| dbmutex::Error::Database(e.into()))?;
/// let opts = LockOptions::new().timeout(Duration::from_secs(2)).wait_strategy(WaitStrategy::Server);
/// if lock_xact(&tx, "ledger-42", &opts, &Prefix::from_env()).await? {
///     // ... work under the lock ...
/// }
/// tx.commit().await.map_err(|e| dbmutex::Error::Database(e.into()))?; // releases the lock
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Not cancel-safe: if the future is dropped while the server waits, the
/// transaction's state is unknown; roll it back.
pub async fn lock_xact(
    tx: &tokio_postgres::Transaction<'_>,
    name: impl Into<LockName>,
    opts: &LockOptions,
    prefix: &Prefix,
) -> Result<bool> {
    let name = name.into();
    name.validate()?;
    let key = pg_key(&name, prefix);
    if opts.strategy == WaitStrategy::Poll || opts.is_try_once() {
        let (sql, params) = sql::bound(Call::Try, true, opts.mode, &key, &name, "");
        let got = wait::poll_until(wait::deadline(opts.timeout), opts.max_backoff, None, || async {
            let rows = tx
                .query_typed(&sql, &params.as_typed())
                .await
                .map_err(|e| db_err(e, &name))?;
            if rows.is_empty() {
                return Err(Error::Unsupported(SESSION_OF_ANOTHER.into()));
            }
            Ok(first_bool(&rows)?.then_some(()))
        })
        .await?;
        return Ok(got.is_some());
    }
    let lock = sql::inline(Call::Wait, true, opts.mode, &key, &name, "");
    // lock_timeout is set even for an unbounded wait (to 0): a default from
    // the role or database must not cut the wait short.
    let batch = format!(
        "SAVEPOINT dbmutex_wait; SELECT current_setting('lock_timeout'); \
         SELECT set_config('lock_timeout', '{}ms', true); {lock}; RELEASE SAVEPOINT dbmutex_wait",
        sql::wait_ms(opts.timeout)
    );
    match tx.simple_query(&batch).await {
        Ok(msgs) => {
            // A setting made inside a released savepoint stays in force
            // until the transaction ends: put the old value back.
            let old = first_text(&msgs).unwrap_or_default();
            tx.query_typed(
                "SELECT set_config('lock_timeout', $1, true)",
                &[(&old, Type::TEXT)],
            )
            .await
            .map_err(|e| db_err(e, &name))?;
            // Rows: the old setting, the new one, the lock (unless its guard
            // found another client's session).
            if row_count(&msgs) == 3 {
                Ok(true)
            } else {
                Err(Error::Unsupported(SESSION_OF_ANOTHER.into()))
            }
        }
        Err(e) => {
            // Back to the savepoint: the transaction, its settings and its
            // other locks are as they were before the wait.
            tx.batch_execute("ROLLBACK TO SAVEPOINT dbmutex_wait; RELEASE SAVEPOINT dbmutex_wait")
                .await
                .map_err(|e2| db_err(e2, &name))?;
            if is_lock_timeout(&e) {
                Ok(false)
            } else {
                Err(db_err(e, &name))
            }
        }
    }
}
