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
    /// not hold it or the connection is gone. Sent at the first poll;
    /// dropped after it, the unlock still runs (its answer unread).
    pub(crate) async fn unlock(self) -> Result<()> {
        let lost = |name: &LockName| Error::LockLost {
            name: name.to_string(),
        };
        if self.conn.is_lost() {
            return Err(lost(&self.name));
        }
        let (lock, answer) = self.call(Call::Unlock).await;
        let conn = &lock.conn;
        match answer {
            Ok(Some(true)) => Ok(()),
            // Not held, or (`None`) the statement ran on another server
            // session: ours has been ended, and its locks with it.
            Ok(Some(false) | None) => Err(lost(&lock.name)),
            Err(e) if e.is_closed() || conn.is_lost() || is_session_end(&e) => Err(lost(&lock.name)),
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
        let (lock, answer) = self.call(Call::Try).await;
        let got = match answer {
            Err(e) => Err(db_err(e, &lock.name)),
            Ok(None) => Err(Error::Unsupported(pooler::SESSION_LOCKS_UNSAFE.into())),
            Ok(Some(got)) => Ok(got),
        };
        (lock, got)
    }

    /// The try's, the unbounded wait's or the unlock's statement on its
    /// way, carrying the lock ([`PgConn::lock_call`]'s answer). All three
    /// are this one future, made only here: the code that runs them
    /// (tokio-postgres's query path with it) is one copy in the binary, not
    /// one per caller, and an acquisition touches it once for all
    /// (BENCHMARKS.md, "code touched").
    pub(super) fn call(self, call: Call) -> InFlight {
        InFlight {
            // Only an abandoned try needs the runtime (to give back what it
            // took): the wait and the unlock take no copy of the handle.
            undo: (call == Call::Try).then(|| self.conn.runtime.clone()),
            call: Some(Reused::new(&CALLS, move || async move {
                let answer = self
                    .conn
                    .lock_call(call, self.mode, &self.key, &self.name, self.text)
                    .await;
                (self, answer)
            })),
            sent: false,
        }
    }
}

pub(super) type Answer = std::result::Result<Option<bool>, tokio_postgres::Error>;

/// A try's or an unlock's statement, boxed (in the box of this thread's
/// last one that answered): it owns the lock until it answers.
type LockCall = Reused<'static, (SessionLock, Answer)>;

crate::core::reuse::shelf! {
    /// The spare allocation of each thread's lock calls ([`LockCall`]).
    static CALLS;
}

/// A try or an unlock on its way, carrying its lock: polled in place.
/// Dropped before its first poll, nothing was sent. A try dropped once
/// sent (polled) and unanswered is finished in the background and its
/// lock, if it got one, given back; an unlock sent runs without us.
pub(super) struct InFlight {
    call: Option<LockCall>,
    sent: bool,
    /// A try's: the connection's runtime, where an abandoned try is
    /// finished and what it took unlocked.
    undo: Option<tokio::runtime::Handle>,
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
        let Some(runtime) = self.undo.take() else {
            return;
        };
        if let Some(call) = self.call.take().filter(|_| self.sent) {
            drop(runtime.spawn(async move {
                if let (lock, Ok(Some(true))) = call.await {
                    let _ = lock.unlock().await;
                }
            }));
        }
    }
}
