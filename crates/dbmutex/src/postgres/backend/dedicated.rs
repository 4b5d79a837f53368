//! Server-side waits: a lock on a connection of its own (a
//! [`WaitStrategy::Server`](crate::WaitStrategy::Server) wait, or a
//! transaction lock), which may block in the server without stalling the
//! shared lock session; and the idle connections kept for the next one.

use std::sync::Arc;
use std::time::Duration;

use super::budget;
use super::conn::{Connector, PgConn, Text};
use super::handoff::PgHold;
use super::session_lock::SessionLock;
use super::waits::{wait_dedicated, Got};
use crate::core::backend::{Attempt, Backend};
use crate::core::detach::Undo;
use crate::core::guard::{releasing, BoxFuture, DelayRecord, Grant, OnSession, Releasing};
use crate::core::idle::Idle;
use crate::core::loss::LossToken;
use crate::core::wait::Deadline;
use crate::key::PgKey;
use crate::runs::{RunStart, Who};
use crate::settings::Settings;
use crate::{Error, Result};

/// How many idle dedicated connections a locker keeps.
const MAX_SPARES: usize = 4;

/// Idle dedicated connections that hold nothing, kept for the next
/// server-side wait.
#[derive(Clone)]
pub(crate) struct Spares(Arc<Idle<Arc<PgConn>>>);

impl Spares {
    /// Spares closed once unused for `idle` (the locker's `idle_timeout`).
    pub(crate) fn new(idle: Duration) -> Self {
        Spares(Arc::new(Idle::new(MAX_SPARES, Some(idle))))
    }

    /// An idle connection, if one is at hand.
    pub(crate) fn take(&self) -> Option<Arc<PgConn>> {
        self.0.take()
    }

    /// Whether [`take`](Self::take) would now hand out a connection.
    pub(crate) fn has_fresh(&self) -> bool {
        self.0.has_fresh()
    }

    /// Keeps `conn` (clean: it holds nothing) for the next wait, if there is
    /// room; else closes it.
    pub(crate) fn put(&self, conn: Arc<PgConn>) {
        self.0.put(conn);
    }

    /// Makes sure an idle connection is at hand for the next wait,
    /// connecting one (within `deadline`) if needed and `room` (asked only
    /// then; `None` where it cannot be asked) does not say the server is
    /// short of connections: `false` when none can be had now.
    pub(crate) async fn ready<R: std::future::Future<Output = Option<bool>>>(
        &self,
        connector: &Connector,
        settings: &Settings,
        deadline: Deadline,
        room: impl FnOnce() -> R,
    ) -> Result<bool> {
        // Looked at, not taken and put back: a fleet waiter comes here on
        // every acquisition.
        if self.0.has_fresh() {
            return Ok(true);
        }
        // Connecting is rare (a spare is at hand but for the first wait) and
        // its future is large: boxed, so the wait's own future stays small.
        if Box::pin(room()).await == Some(false) {
            tracing::debug!("dbmutex: the server is short of connections; polling instead of waiting in it");
            return Ok(false);
        }
        match Box::pin(connect_within(connector, settings, deadline)).await {
            Ok(Some(c)) => {
                self.0.put(c);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => {
                tracing::debug!(error = %e, "dbmutex: no connection for a server-side wait; polling instead");
                Ok(false)
            }
        }
    }

    /// Waits for `name` on a connection of its own: an idle one, else a new
    /// one (also when the idle one turns out dead: once, within what is
    /// left of the caller's bound). `ticket` is the room in the lock table
    /// admitted for it.
    pub(crate) async fn acquire<B: Backend<Key = PgKey>>(
        &self,
        connector: &Connector,
        at: &Attempt<'_, B>,
        ticket: budget::Slot,
        hold: Option<PgHold>,
    ) -> Result<Option<Box<dyn Grant>>> {
        let (settings, name, key, opts, deadline) = (at.settings, at.name, *at.key, at.opts, at.deadline);
        // A try-once still gets its connection (within connect_timeout); a
        // bounded wait connects within its bound.
        let connect_by = if opts.is_try_once() {
            Deadline::NEVER
        } else {
            deadline
        };
        let comment = settings.name_comments;
        // A lock session's wait (it has the in-process hold) is one
        // statement ([`wait_session_one`]), and its unlock goes as the lock
        // session's statements do (prepared on a direct connection).
        let as_session = hold.is_some() && !opts.transaction;
        let text = |c: &PgConn| match (as_session, comment) {
            (true, _) => c.session_text(comment, opts.mode, &key),
            (false, true) => Text::Named,
            (false, false) => Text::Plain,
        };
        // Every wait reads what is left of the acquisition's deadline.
        let wait = |c| {
            wait_dedicated(
                c,
                name,
                key,
                opts,
                deadline,
                text(c),
                as_session.then_some(comment),
            )
        };
        let (conn, got) = match self.0.take() {
            Some(c) => match wait(&c).await {
                // A spare may have died unnoticed while idle.
                Err(Error::Connect(_)) => {
                    c.close();
                    let Some(c) = Box::pin(connect_within(connector, settings, connect_by)).await? else {
                        return Ok(None);
                    };
                    let got = wait(&c).await;
                    (c, got)
                }
                got => (c, got),
            },
            None => {
                let Some(c) = Box::pin(connect_within(connector, settings, connect_by)).await? else {
                    return Ok(None);
                };
                let got = wait(&c).await;
                (c, got)
            }
        };
        match got {
            Ok(Got::Yes(made)) => Ok(Some(Box::new(DedicatedGrant::new(
                made.unwrap_or_else(|| SessionLock {
                    text: text(&conn),
                    conn,
                    key,
                    mode: opts.mode,
                    name: name.clone(),
                }),
                opts.transaction,
                settings,
                self.clone(),
                ticket.granted(),
                hold,
            )))),
            Ok(Got::No) if !opts.transaction => {
                // A refused try or a timed-out wait leaves the session clean
                // (the timeout's implicit transaction has ended).
                self.0.put(conn);
                Ok(None)
            }
            Ok(Got::No) => {
                conn.close();
                Ok(None)
            }
            Err(e) => {
                conn.close();
                Err(e)
            }
        }
    }
}

/// A new connection for a wait, within the wait's own bound (a wait of
/// 20 ms does not wait 5 s for a connection): `None` when the deadline
/// passes first.
async fn connect_within(
    connector: &Connector,
    settings: &Settings,
    deadline: Deadline,
) -> Result<Option<Arc<PgConn>>> {
    let connect = connector.connect(settings, false);
    match deadline.at() {
        None => connect.await.map(Some),
        Some(d) => match tokio::time::timeout_at(d, connect).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        },
    }
}

/// A lock on a connection of its own (server-side wait or transaction lock).
pub(crate) struct DedicatedGrant {
    /// Dropped armed, the connection closes: that frees its locks and ends
    /// its transaction, with no round trip and no runtime needed.
    held: Undo<Dedicated>,
    lost: tokio::sync::watch::Receiver<bool>,
}

struct Dedicated {
    lock: SessionLock,
    xact: bool,
    spares: Spares,
    /// Room in the server's lock table, given back once the server lock is.
    budget: budget::Slot,
    /// The in-process hold (a wait after a failed try on the lock session),
    /// given back once the server lock is.
    hold: Option<PgHold>,
}

impl Dedicated {
    /// Without an unlock: closing the session frees the lock at once (no
    /// round trip, no runtime); the hold goes after it.
    fn close(self) {
        self.lock.conn.close();
        drop(self.hold);
    }

    /// A guard dropped without `release()`: a session lock's unlock is
    /// queued on its connection by the dropping thread (see
    /// `PgConn::send_unlock`), and the connection goes back to the spares,
    /// so the next wait does not connect anew (a fleet whose guards go out
    /// of scope otherwise opened a server session for about every other
    /// acquisition). Where the unlock cannot be queued safely, and for a
    /// transaction lock, the connection is closed as before.
    fn dropped(self) {
        if !self.xact {
            // Before the unlock, as `release` does: no keepalive probe may
            // follow it on a connection that may next serve a blocking wait.
            self.lock.conn.stop_heartbeat();
            if self.lock.conn.send_unlock(self.lock.mode, &self.lock.key) {
                let Dedicated {
                    lock,
                    spares,
                    budget,
                    hold,
                    ..
                } = self;
                // The unlock is on the wire: whatever this process sends next
                // reaches the server after it.
                drop((hold, budget));
                spares.0.put(lock.conn);
                return;
            }
        }
        self.close();
    }
}

impl DedicatedGrant {
    fn new(
        lock: SessionLock,
        xact: bool,
        settings: &Settings,
        spares: Spares,
        budget: budget::Slot,
        hold: Option<PgHold>,
    ) -> Self {
        if settings.name_comments {
            // The keepalive probe carries it on: `pg_stat_activity` keeps
            // naming the lock after the wait statement (or in its place,
            // for a prepared one).
            lock.conn.remember_name(&lock.name);
        }
        // Checks the connection while the lock is held; paused again
        // before the connection can serve another (blocking) wait.
        lock.conn.start_heartbeat(settings.keepalive, xact);
        DedicatedGrant {
            lost: lock.conn.lost_signal(),
            held: Undo::with(
                Dedicated {
                    lock,
                    xact,
                    spares,
                    budget,
                    hold,
                },
                Dedicated::dropped,
            ),
        }
    }
}

crate::core::reuse::shelf! {
    /// The spare allocation of each thread's dedicated-grant releases.
    static RELEASES;
}

impl Grant for DedicatedGrant {
    /// In the caller's task (no hop to another task on the way to the
    /// server): dropped before the unlock is confirmed, the connection is
    /// closed instead, which frees the lock just the same.
    fn release(mut self: Box<Self>) -> Releasing {
        let d = self.held.take().expect("held until released");
        // Before the unlock: no keepalive probe may follow it, since the
        // connection may next serve a wait that blocks.
        d.lock.conn.stop_heartbeat();
        // Dropped before its first poll, the future closes the connection
        // (no unlock was sent); from its first poll on, `abandoned` does.
        let mut unsent = Undo::with(d, Dedicated::close);
        releasing(&RELEASES, move || async move {
            let Dedicated {
                lock,
                xact,
                spares,
                budget,
                hold,
            } = unsent.take().expect("taken once, at the first poll");
            let _budget = budget;
            // Declared last, dropped first: the session closes before the
            // hold goes.
            let mut abandoned = Undo::with(lock.conn.clone(), |c| c.close());
            let r = if xact {
                match lock.conn.client.batch_execute("COMMIT").await {
                    Ok(()) => Ok(()),
                    Err(_) => Err(Error::LockLost {
                        name: lock.name.to_string(),
                    }),
                }
            } else {
                lock.unlock().await
            };
            let conn = abandoned.take().expect("armed until answered");
            // After the unlock, so the next task of this process finds the
            // server lock free.
            drop(hold);
            // Confirmed released: the session holds nothing and can serve
            // the next wait. On any doubt it is closed instead.
            if r.is_ok() {
                spares.0.put(conn);
            } else {
                conn.close();
            }
            r
        })
    }

    fn loss(&self) -> LossToken {
        LossToken::of(self.lost.clone())
    }

    /// A session lock only: a transaction lock's exclusive one could not be
    /// dropped before its transaction ends.
    fn upgrader(&self) -> Option<Arc<dyn crate::core::upgradable::Upgrade>> {
        let of = |d: &Dedicated| (!d.xact).then(|| super::upgrade::PgUpgrade::of(&d.lock, d.hold.is_some()));
        self.held.peek(of).flatten().flatten()
    }

    fn on_session(&self) -> Option<&dyn OnSession> {
        Some(self)
    }
}

impl OnSession for DedicatedGrant {
    /// Transaction locks are refused by the core (the token would roll back
    /// with their transaction): this is a session lock, in autocommit.
    fn fence(&self, key: String) -> BoxFuture<Result<u64>> {
        super::fence::for_grant(self.held.peek(|d| d.lock.clone()), key)
    }

    /// Not for a transaction lock: its record would roll back with it.
    fn start_run(&self, window: Duration, who: Who) -> BoxFuture<Result<RunStart>> {
        let lock = self.held.peek(|d| (!d.xact).then(|| d.lock.clone())).flatten();
        super::runs::start_for_grant(lock, window, who)
    }

    fn finish_run(&self, run: u64, exit_code: Option<i32>) -> BoxFuture<Result<()>> {
        super::runs::finish_for_grant(self.held.peek(|d| d.lock.clone()), run, exit_code)
    }

    /// Transaction locks are refused by the core, as for [`Self::fence`].
    fn delay(&self, key: String) -> DelayRecord {
        super::delay::record(self.held.peek(|d| d.lock.clone()), key)
    }
}
