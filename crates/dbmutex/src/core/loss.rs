//! The loss token: one per held lock, telling whether the session that
//! holds *this* lock ended while the lock was held.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

/// Watches one lock for its loss. Clones share the "released" mark.
#[derive(Clone)]
pub(crate) struct LossToken {
    /// Turns `true` when the holding session ends; `None`: the lock cannot
    /// be lost while the process lives (local backend).
    session: Option<watch::Receiver<bool>>,
    /// Set once the guard let go: a session ending afterwards is no loss.
    released: Arc<AtomicBool>,
}

impl LossToken {
    /// For a lock that cannot be lost.
    pub(crate) fn never() -> Self {
        LossToken {
            session: None,
            released: Arc::default(),
        }
    }

    /// For a lock held as long as the session `ended` reports alive.
    pub(crate) fn of(ended: watch::Receiver<bool>) -> Self {
        LossToken {
            session: Some(ended),
            released: Arc::default(),
        }
    }

    /// Whether the session holding the lock is known to have ended.
    pub(crate) fn is_lost(&self) -> bool {
        self.session.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Whether the lock can be lost at all (false: local backend).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn can_be_lost(&self) -> bool {
        self.session.is_some()
    }

    /// The holder let go: from now on nothing is a loss.
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// Whether [`LossToken::mark_released`] was called.
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Completes when the lock is lost while still held; pending for ever
    /// for a lock that cannot be lost or once released.
    pub(crate) fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let session = self.session.clone();
        let released = self.released.clone();
        async move {
            if let Some(mut rx) = session {
                if rx.wait_for(|ended| *ended).await.is_ok() && !released.load(Ordering::SeqCst) {
                    return;
                }
            }
            std::future::pending::<()>().await
        }
    }

    /// Completes when the lock is lost, or at `max_hold_at` (a hold's
    /// `max_hold`), whichever comes first.
    pub(crate) fn lost_or_past(
        &self,
        max_hold_at: Option<tokio::time::Instant>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let lost = self.lost();
        async move {
            match max_hold_at {
                Some(at) => tokio::select! {
                    () = lost => {}
                    () = tokio::time::sleep_until(at) => {}
                },
                None => lost.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_session_end_is_a_loss_only_while_held() {
        let (tx, rx) = watch::channel(false);
        let held = LossToken::of(rx.clone());
        let lost = held.lost();
        assert!(!held.is_lost());
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(1), lost).await.unwrap();
        assert!(held.is_lost());

        let (tx, rx) = watch::channel(false);
        let released = LossToken::of(rx);
        let lost = released.lost();
        released.mark_released();
        tx.send(true).unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(20), lost)
            .await
            .is_err());
        let never = LossToken::never();
        assert!(!never.is_lost());
        assert!(tokio::time::timeout(Duration::from_millis(5), never.lost())
            .await
            .is_err());
    }
}
