//! Lock-delay in the core ([`crate::delay`]): the wait a new holder makes
//! while the record says closed, the renewal while it holds, and the
//! opening at a clean release. The backend only runs the steps on the
//! lock's session ([`OnSession::delay`](super::guard::OnSession::delay)).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::delay::{beat, closed_for, Step};
use crate::{Error, LockName, Result};

/// Runs one lock-delay step on a held lock's session and answers how long
/// the lock is still closed (zero: open, and now recorded as this
/// holder's). See [`OnSession::delay`](super::guard::OnSession::delay).
pub(crate) type DelayRecord =
    Arc<dyn Fn(Step) -> Pin<Box<dyn Future<Output = Result<Duration>> + Send>> + Send + Sync>;

/// After the grant: waits, holding the lock, while the record says closed,
/// then records this holder's closure. `Ok(None)` when the closure outlasts
/// `deadline` (nothing written: the record stays as it was).
pub(crate) async fn enter(
    record: Option<DelayRecord>,
    d: Duration,
    deadline: Option<Instant>,
) -> Result<Option<DelayRecord>> {
    let Some(record) = record else {
        return Err(Error::Unsupported(
            "this backend keeps no lock-delay record".into(),
        ));
    };
    loop {
        let left = record(Step::Enter(closed_for(d))).await?;
        if left.is_zero() {
            return Ok(Some(record));
        }
        let until = Instant::now() + left;
        if deadline.is_some_and(|at| until > at) {
            tracing::debug!(
                closed_for_ms = left.as_millis() as u64,
                "dbmutex: closed by lock-delay past the deadline"
            );
            return Ok(None);
        }
        tracing::debug!(
            closed_for_ms = left.as_millis() as u64,
            "dbmutex: waiting out a lost holder's lock-delay"
        );
        tokio::time::sleep_until(until).await;
    }
}

/// A held lock's record, renewed every beat by a task of its own until
/// opened or dropped.
pub(crate) struct Renewal {
    record: DelayRecord,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Renewal {
    /// Starts renewing `record` (just written by [`enter`]) for a delay of
    /// `d`.
    pub(crate) fn start(record: DelayRecord, d: Duration, name: LockName) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let renew = record.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(beat(d)) => {}
                }
                // A renewal is never cut off midway: its statement runs to
                // its answer, and the next one waits for it.
                match renew(Step::Renew(closed_for(d))).await {
                    Ok(_) => {}
                    Err(e @ Error::LockLost { .. }) => {
                        tracing::debug!(name = %name, error = %e, "dbmutex: lock-delay renewal ends with the lock");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(name = %name, error = %e, "dbmutex: lock-delay renewal failed; retried at the next beat")
                    }
                }
            }
        });
        Renewal { record, stop, task }
    }

    /// A clean release, before the unlock: stops the renewal (waiting for
    /// one in flight) and clears the record, so the next holder goes at
    /// once. A failure leaves the lock closed for its delay (logged).
    pub(crate) async fn open(self, name: &LockName) {
        let Renewal { record, stop, task } = self;
        drop(stop);
        let _ = task.await;
        if let Err(e) = record(Step::Open).await {
            tracing::warn!(name = %name, error = %e, "dbmutex: could not open the lock-delay record; the lock stays closed for its delay");
        }
    }
}
