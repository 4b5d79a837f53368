//! The locker's long-lived connections, made on first use and replaced
//! when lost: the lock session, and a side connection for what must not
//! hold up the lock session (the lock table's listing, the records'
//! tables; one key's holders and lock-table counts while the lock session
//! is in use) — opened only when first needed, so an uncontended locker
//! keeps one connection.
//!
//! Connections move between roles: a lock session that holds nothing when
//! its task must wait is [detached](LazyConn::detach) to wait in the server
//! (it then holds that lock as a dedicated connection), and a clean idle
//! connection becomes the next lock session. So a process that takes one
//! lock at a time keeps one connection, waiting or not.

use std::sync::{Arc, Mutex};

use super::conn::{Connector, PgConn};
use super::dedicated::Spares;
use super::pooler;
use crate::core::idle::{Idle, Reusable};
use crate::settings::Settings;
use crate::{Error, Result};

/// Makes `conn` the lock session: it probes a quiet spell (it runs only
/// statements that answer at once, so a probe is never mistaken for a
/// wait).
pub(crate) fn prepare_session(conn: &Arc<PgConn>, settings: &Settings) {
    conn.start_heartbeat(settings.keepalive, false);
}

/// The lock session: made on first use (from an idle connection when one is
/// at hand) and replaced when lost or detached.
#[derive(Default)]
pub(crate) struct LazyConn {
    conn: Mutex<Option<Arc<PgConn>>>,
    gate: tokio::sync::Mutex<()>,
}

impl LazyConn {
    /// The live lock session: the current one, else an idle connection of
    /// `spares`, else a new one.
    pub(crate) async fn get(
        &self,
        connector: &Connector,
        settings: &Settings,
        spares: &Spares,
    ) -> Result<Arc<PgConn>> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        // Boxed: connecting is rare, and its future is large; inline it
        // would be moved with every acquisition's.
        Box::pin(self.open(connector, settings, spares)).await
    }

    /// [`get`](Self::get) without a live lock session: adopts a spare or
    /// connects, once for all the tasks that ask at the same time.
    async fn open(&self, connector: &Connector, settings: &Settings, spares: &Spares) -> Result<Arc<PgConn>> {
        let _gate = self.gate.lock().await;
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let conn = match spares.take() {
            Some(c) => {
                c.claim().await?;
                c
            }
            // Boxed too: a spare is at hand far more often (a waiter's
            // connection comes back after each wait).
            None => Box::pin(connector.connect(settings, true)).await?,
        };
        if !conn.is_claimed() {
            return Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into()));
        }
        prepare_session(&conn, settings);
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    /// Takes the lock session out, to wait in the server on it, if nothing
    /// uses it (no lock held on it, no statement of another task under way:
    /// each of those keeps a reference). The next task that needs a lock
    /// session gets another.
    pub(crate) fn detach(&self) -> Option<Arc<PgConn>> {
        let mut slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(free) {
            let c = slot.take()?;
            c.stop_heartbeat();
            return Some(c);
        }
        None
    }

    /// Moves the lock session to `spares` if it holds nothing (the next
    /// wait then takes it, and the next lock session is made from an idle
    /// connection when needed): `true` if it did.
    pub(crate) fn lend_to(&self, spares: &Spares) -> bool {
        match self.detach() {
            Some(c) => {
                spares.put(c);
                true
            }
            None => false,
        }
    }

    /// Adopts `conn` if it is alive.
    pub(crate) fn set(&self, conn: Arc<PgConn>) {
        if !conn.is_lost() {
            *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
        }
    }

    /// The lock session if it is live and nothing uses it (no lock held on
    /// it, no statement of another task under way): a quick read can run on
    /// it instead of opening the side connection.
    pub(crate) fn idle(&self) -> Option<Arc<PgConn>> {
        let c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        c.as_ref().filter(|c| free(c)).cloned()
    }

    pub(crate) fn live(&self) -> Option<Arc<PgConn>> {
        let c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        c.as_ref().filter(|c| !c.is_lost()).cloned()
    }
}

/// The lock session `c` is alive and nothing but its slot refers to it (no
/// lock held on it, no statement of another task under way; a heartbeat
/// holds a `Weak`): it may be lent out.
fn free(c: &Arc<PgConn>) -> bool {
    c.alive() && c.unused()
}

/// Side and spare connections, as idle pools keep them.
impl Reusable for Arc<PgConn> {
    /// A fleet waiter puts a spare back on every acquisition: its reaper's
    /// 60 s sleep would sit in the caller's timer wheel for good.
    const TIMER_THREAD: bool = true;

    fn alive(&self) -> bool {
        !self.is_lost()
    }

    fn unused(&self) -> bool {
        // The pool's own reference only (a heartbeat holds a `Weak`).
        Arc::strong_count(self) == 1
    }

    fn discard(self) {
        self.close();
    }
}

/// The side connection: opened on first use (see the module's comment)
/// and closed once unused for the locker's `idle_timeout`, so a quiet
/// locker keeps only its lock session.
pub(crate) struct Side {
    conn: Arc<Idle<Arc<PgConn>>>,
    gate: tokio::sync::Mutex<()>,
    connector: Connector,
    settings: Settings,
}

impl Side {
    pub(crate) fn new(connector: Connector, settings: Settings) -> Self {
        Side {
            conn: Arc::new(Idle::new(1, Some(settings.idle_limit()))),
            gate: tokio::sync::Mutex::new(()),
            connector,
            settings,
        }
    }

    /// The live side connection, if there is one.
    pub(crate) fn live(&self) -> Option<Arc<PgConn>> {
        self.conn.shared()
    }

    /// The live side connection, connecting one if there is none.
    pub(crate) async fn get(&self) -> Result<Arc<PgConn>> {
        if let Some(c) = self.conn.shared() {
            return Ok(c);
        }
        let _gate = self.gate.lock().await;
        if let Some(c) = self.conn.shared() {
            return Ok(c);
        }
        let conn = self.connector.connect(&self.settings, true).await?;
        if self.conn.put(conn.clone()) {
            return Ok(conn);
        }
        // Lost at once, or another was adopted meanwhile (`set`).
        self.conn
            .shared()
            .ok_or_else(|| Error::Connect("the side connection was lost as soon as it was made".into()))
    }

    /// Adopts `conn` (the pooler check's second connection, behind a pooler).
    pub(crate) fn set(&self, conn: Arc<PgConn>) {
        self.conn.put(conn);
    }
}
