//! The loss token: one per held lock, telling whether the session that
//! holds *this* lock ended while the lock was held.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

/// Watches one lock for its loss. Clones share the "released" mark.
pub(crate) struct LossToken {
    /// Turns `true` when the holding session ends; `None`: the lock cannot
    /// be lost while the process lives (local backend).
    session: Option<watch::Receiver<bool>>,
    /// Set once the guard let go: a session ending afterwards is no loss.
    released: AtomicBool,
    /// The mark as clones and [`LossToken::lost`]'s futures see it, made
    /// on first need: most guards are never watched, and an allocation per
    /// lock is not free.
    shared: OnceLock<Arc<AtomicBool>>,
}

impl Clone for LossToken {
    fn clone(&self) -> Self {
        let shared = self.shared().clone();
        LossToken {
            session: self.session.clone(),
            released: AtomicBool::new(shared.load(Ordering::SeqCst)),
            shared: OnceLock::from(shared),
        }
    }
}

impl LossToken {
    /// For a lock that cannot be lost.
    pub(crate) fn never() -> Self {
        Self::new(None)
    }

    /// For a lock held as long as the session `ended` reports alive.
    pub(crate) fn of(ended: watch::Receiver<bool>) -> Self {
        Self::new(Some(ended))
    }

    fn new(session: Option<watch::Receiver<bool>>) -> Self {
        LossToken {
            session,
            released: AtomicBool::new(false),
            shared: OnceLock::new(),
        }
    }

    /// The shared mark, made now if need be. Made, it is read again: a
    /// [`LossToken::mark_released`] racing with its making either sees it
    /// or is seen here (both sides are `SeqCst`).
    fn shared(&self) -> &Arc<AtomicBool> {
        let shared = self
            .shared
            .get_or_init(|| Arc::new(AtomicBool::new(self.released.load(Ordering::SeqCst))));
        if self.released.load(Ordering::SeqCst) {
            shared.store(true, Ordering::SeqCst);
        }
        shared
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
        if let Some(shared) = self.shared.get() {
            shared.store(true, Ordering::SeqCst);
        }
    }

    /// Whether [`LossToken::mark_released`] was called (on this token or a
    /// clone).
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst) || self.shared.get().is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Completes when the lock is lost while still held; pending for ever
    /// for a lock that cannot be lost or once released.
    pub(crate) fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let session = self.session.clone();
        let released = self.shared().clone();
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

    #[tokio::test]
    async fn clones_and_watchers_share_the_released_mark_whenever_made() {
        // Released before anyone watched: a later watcher sees it.
        let (tx, rx) = watch::channel(false);
        let early = LossToken::of(rx);
        early.mark_released();
        let lost = early.lost();
        tx.send(true).unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(20), lost)
            .await
            .is_err());

        // Released through a clone: the original knows, and so do the
        // futures made from either.
        let (tx, rx) = watch::channel(false);
        let original = LossToken::of(rx);
        let before = original.lost();
        let clone = original.clone();
        clone.mark_released();
        assert!(original.is_released());
        tx.send(true).unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(20), before)
            .await
            .is_err());
        assert!(tokio::time::timeout(Duration::from_millis(20), original.lost())
            .await
            .is_err());
    }
}
