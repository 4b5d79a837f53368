//! One session lock on the shared lock session: the value that names it
//! ([`SessionLock`]), the try that takes it, and the unlock.

use std::sync::Arc;

use super::conn::{PgConn, Text};
use super::pooler;
use crate::core::reuse::Reused;
use crate::key::PgKey;
use crate::postgres::errors::{db_err, is_session_end};
use crate::postgres::sql::Call;
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

    /// One `pg_try_advisory_lock*`, polled by the caller (no task between
    /// it and the connection), and cancel-safe: dropped before its answer,
    /// the statement is finished on the connection's runtime, which unlocks
    /// if it took the lock. Session locks are counted, so that unlock
    /// releases exactly this try's lock even if another task of ours has
    /// taken the key since. The lock goes with the statement and comes back
    /// with its answer: no copy of it (and its name) per try.
    pub(crate) async fn try_lock(self) -> (SessionLock, Result<bool>) {
        let call = InFlight {
            runtime: self.conn.runtime.clone(),
            call: Some(Reused::new(&TRIES, move || async move {
                let answer = self
                    .conn
                    .lock_call(Call::Try, self.mode, &self.key, &self.name, self.text)
                    .await;
                (self, answer)
            })),
            sent: false,
        };
        let (lock, answer) = call.await;
        let got = match answer {
            Err(e) => Err(db_err(e, &lock.name)),
            Ok(None) => Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into())),
            Ok(Some(got)) => Ok(got),
        };
        (lock, got)
    }
}

type Answer = std::result::Result<Option<bool>, tokio_postgres::Error>;

/// The try's statement, boxed (in the box of this thread's last try that
/// answered): it owns the lock until it answers.
type TryCall = Reused<'static, (SessionLock, Answer)>;

crate::core::reuse::shelf! {
    /// The spare allocation of each thread's tries ([`TryCall`]).
    static TRIES;
}

/// A try on its way, carrying its lock: polled in place; dropped once sent
/// (polled) and unanswered, it is finished in the background and its
/// lock, if it got one, given back. Dropped before its first poll, nothing
/// was sent.
struct InFlight {
    /// The connection's runtime, where an abandoned call is finished.
    runtime: tokio::runtime::Handle,
    call: Option<TryCall>,
    sent: bool,
}

impl std::future::Future for InFlight {
    type Output = (SessionLock, Answer);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<(SessionLock, Answer)> {
        let Some(call) = self.call.as_mut() else {
            return std::task::Poll::Pending;
        };
        let polled = std::pin::Pin::new(call).poll(cx);
        self.sent = true;
        let answer = std::task::ready!(polled);
        self.call = None;
        std::task::Poll::Ready(answer)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(call) = self.call.take().filter(|_| self.sent) {
            drop(self.runtime.spawn(async move {
                if let (lock, Ok(Some(true))) = call.await {
                    let _ = lock.unlock().await;
                }
            }));
        }
    }
}
