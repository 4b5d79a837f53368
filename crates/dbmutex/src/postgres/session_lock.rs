//! One session lock on the shared lock session: the value that names it
//! ([`SessionLock`]), the try that takes it, and the unlock.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::conn::{PgConn, Text};
use super::errors::{db_err, is_session_end};
use super::pooler;
use super::sql::Call;
use crate::core::detach::Undo;
use crate::key::PgKey;
use crate::{Error, LockName, Mode, Result};

/// A session lock on one connection: everything its statements need.
#[derive(Clone)]
pub(crate) struct SessionLock {
    pub(crate) conn: Arc<PgConn>,
    pub(crate) key: PgKey,
    pub(crate) mode: Mode,
    pub(crate) name: LockName,
    /// How its statements are sent.
    pub(crate) text: Text,
}

impl SessionLock {
    /// `pg_advisory_unlock*`: `Err(LockLost)` when the server says we did
    /// not hold it or the connection is gone.
    pub(crate) async fn unlock(&self) -> Result<()> {
        let (conn, name) = (&self.conn, &self.name);
        let lost = || Error::LockLost {
            name: name.to_string(),
        };
        if conn.is_lost() {
            return Err(lost());
        }
        match conn
            .lock_call(Call::Unlock, self.mode, &self.key, name, self.text)
            .await
        {
            Ok(Some(true)) => Ok(()),
            // Not held, or (`None`) the statement ran on another server
            // session: ours has been ended, and its locks with it.
            Ok(Some(false) | None) => Err(lost()),
            Err(e) if e.is_closed() || conn.is_lost() || is_session_end(&e) => Err(lost()),
            Err(e) => {
                // The lock's fate is unknown: close the session so the server
                // frees it for sure.
                conn.close();
                Err(Error::Database(Box::new(e)))
            }
        }
    }

    /// Unlocks in the background, on the connection's runtime.
    pub(crate) fn spawn_unlock(self) {
        let runtime = self.conn.runtime.clone();
        drop(runtime.spawn(async move {
            let _ = self.unlock().await;
        }));
    }

    /// One `pg_try_advisory_lock*`, cancel-safe: the statement runs in its
    /// own task, and a success travels back as an armed [`Undo`] that
    /// unlocks if nobody is left to take it over — whether the acquisition
    /// was dropped before the answer came or after it was sent. Session
    /// locks are counted, so the undo releases exactly this grant even if
    /// another task of ours has taken the key since.
    pub(crate) async fn try_lock(&self) -> Result<bool> {
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        // On the connection's runtime: if the caller's runtime shuts down
        // meanwhile, the task (and the undo of an unreceived grant) still runs.
        drop(self.conn.runtime.spawn(async move {
            let r = this
                .conn
                .lock_call(Call::Try, this.mode, &this.key, &this.name, this.text)
                .await;
            let r = match r {
                Err(e) => Err(db_err(e, &this.name)),
                Ok(None) => Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into())),
                Ok(Some(got)) => Ok(got.then(|| Undo::with(this, SessionLock::spawn_unlock))),
            };
            // If the receiver is gone, `r` drops here, and an armed undo in
            // it unlocks.
            let _ = tx.send(r);
        }));
        match rx.await {
            Ok(r) => Ok(r?.map(|mut taken| taken.take()).is_some()),
            Err(_) => Err(Error::Database(
                "the lock statement's task ended unexpectedly".into(),
            )),
        }
    }
}
