//! The locker's long-lived connections, made on first use and replaced
//! when lost: the lock session, and a side connection for what must not
//! hold up the lock session (introspection, lock-table counts, hand-off
//! `NOTIFY`s, which commit and may wait on the server's disk) — opened only
//! when first needed, so an uncontended locker keeps one connection.

use std::sync::{Arc, Mutex};

use super::conn::{Connector, NotifyHandler, PgConn};
use super::{pooler, sql};
use crate::core::idle::{Idle, Reusable};
use crate::settings::Settings;
use crate::{Error, Result};

/// Makes `conn` the lock session: it listens on the hand-off channel (never
/// through a detected pooler: the caller checks first), learns whether it
/// reaches the server directly (`PgConn::check_direct`), and probes a quiet
/// spell (it runs only statements that answer at once, so a probe is never
/// mistaken for a wait).
pub(crate) async fn prepare_session(conn: &Arc<PgConn>, settings: &Settings, listen: bool) -> Result<()> {
    if listen {
        conn.client
            .batch_execute(&format!("LISTEN {}", sql::CHANNEL))
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
    }
    conn.check_direct().await;
    drop(conn.start_heartbeat(settings.keepalive, false));
    Ok(())
}

/// A connection made on first use and replaced when lost.
#[derive(Default)]
pub(crate) struct LazyConn {
    conn: Mutex<Option<Arc<PgConn>>>,
    gate: tokio::sync::Mutex<()>,
}

impl LazyConn {
    /// The live connection, connecting a new one if there is none. With
    /// `listen`, the new connection listens on the hand-off channel.
    pub(crate) async fn get(
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
    pub(crate) fn set(&self, conn: Arc<PgConn>) {
        if !conn.is_lost() {
            *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
        }
    }

    pub(crate) fn live(&self) -> Option<Arc<PgConn>> {
        let c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        c.as_ref().filter(|c| !c.is_lost()).cloned()
    }
}

/// Side and spare connections, as idle pools keep them.
impl Reusable for Arc<PgConn> {
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

/// The side connection: opened on first use (introspection, lock-table
/// counts, hand-off messages) and closed once unused for the locker's
/// `idle_timeout`, so a quiet locker keeps only its lock session.
pub(crate) struct Side {
    conn: Arc<Idle<Arc<PgConn>>>,
    gate: tokio::sync::Mutex<()>,
    connector: Connector,
    settings: Settings,
}

impl Side {
    pub(crate) fn new(connector: Connector, settings: Settings) -> Self {
        Side {
            conn: Arc::new(Idle::new(1, Some(settings.idle_timeout))),
            gate: tokio::sync::Mutex::new(()),
            connector,
            settings,
        }
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
        let conn = self.connector.connect(&self.settings, None, true).await?;
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
