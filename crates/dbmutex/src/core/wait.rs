//! Client-side waiting: retry with jittered, growing backoff until a deadline.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::Result;

/// The first sleep between two attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(2);

/// When one acquisition's wait ends: computed once from the caller's bound
/// and passed down as is (a backend's server wait reads what is left of it
/// where it builds its statement, never a timeout re-derived on the way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// No end: wait until granted.
    pub(crate) const NEVER: Deadline = Deadline(None);

    /// The deadline for a wait bound from now (`None`: wait forever; zero:
    /// now, a try-once). A bound too far away for the clock (centuries) is
    /// the same as forever.
    pub(crate) fn after(timeout: Option<Duration>) -> Self {
        Deadline(timeout.and_then(|d| Instant::now().checked_add(d)))
    }

    /// The instant it ends (`None`: never).
    pub(crate) fn at(self) -> Option<Instant> {
        self.0
    }

    /// What is left of the wait (`None`: forever; zero once passed).
    pub(crate) fn remaining(self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether it has passed: what is left is one try (a try-once's
    /// deadline has passed from the start).
    pub(crate) fn passed(self) -> bool {
        self.0.is_some_and(|d| Instant::now() >= d)
    }

    /// What is left in whole milliseconds, rounded up and at least 1 (a
    /// server's "0 ms" often means "no bound"); `None`: forever.
    pub(crate) fn millis_left(self) -> Option<u128> {
        self.remaining().map(|d| d.as_nanos().div_ceil(1_000_000).max(1))
    }
}

/// A sleep of `base`, scaled by a random factor in [0.5, 1.0) so waiters that
/// started together do not retry together.
fn jittered(base: Duration) -> Duration {
    base.mul_f64(0.5 + fastrand::f64() * 0.5)
}

/// The pauses between the attempts of one polling wait: doubling, jittered,
/// capped at `max`; woken early by a notification registered before the
/// attempt (so a release between the attempt and the pause is not missed).
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
    deadline: Deadline,
    first: bool,
}

impl Backoff {
    pub(crate) fn new(deadline: Deadline, max: Duration) -> Self {
        Backoff {
            next: FIRST_BACKOFF.min(max),
            max,
            deadline,
            first: true,
        }
    }

    /// After a failed attempt: `false` when the deadline has passed (the
    /// attempt just made was the last), else sleeps until the next attempt
    /// is due (at the latest, the deadline), or until `wake` fires.
    pub(crate) async fn pause(&mut self, wake: Option<Pin<&mut Notified<'_>>>) -> bool {
        if self.first {
            tracing::debug!("dbmutex: contended; waiting");
            self.first = false;
        }
        let now = Instant::now();
        let mut until = now + jittered(self.next);
        if let Some(d) = self.deadline.at() {
            if now >= d {
                return false;
            }
            until = until.min(d);
        }
        match wake {
            Some(n) => {
                let _ = tokio::time::timeout_at(until, n).await;
            }
            None => tokio::time::sleep_until(until).await,
        }
        self.next = (self.next * 2).min(self.max);
        true
    }
}

/// Calls `attempt` until it yields `Some`, the deadline passes, or it fails,
/// pausing between attempts as [`Backoff`] does (woken early when `wake` is
/// notified). A last attempt is made at the deadline.
///
/// Cancel safety: as cancel-safe as `attempt` is; nothing else is held.
pub(crate) async fn poll_until<T, F, Fut>(
    deadline: Deadline,
    max_backoff: Duration,
    wake: Option<&Notify>,
    mut attempt: F,
) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let mut backoff = Backoff::new(deadline, max_backoff);
    loop {
        let mut notified = wake.map(|w| Box::pin(w.notified()));
        if let Some(n) = notified.as_mut() {
            n.as_mut().enable();
        }
        if let Some(v) = attempt().await? {
            return Ok(Some(v));
        }
        if !backoff.pause(notified.as_mut().map(|n| n.as_mut())).await {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_deadline_tells_what_is_left() {
        let d = Deadline::after(Some(Duration::from_micros(300_500)));
        assert_eq!(d.millis_left(), Some(301), "rounded up");
        assert!(!d.passed());
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(d.millis_left(), Some(1), "never 0 while bounded");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(d.passed());
        assert_eq!(d.remaining(), Some(Duration::ZERO));
        assert_eq!(d.millis_left(), Some(1), "passed: still a bound");
        let now = Deadline::after(Some(Duration::ZERO));
        assert!(now.passed(), "a try-once's deadline has passed from the start");
        assert!(!Deadline::NEVER.passed());
        assert_eq!(Deadline::NEVER.remaining(), None);
        assert_eq!(Deadline::NEVER.millis_left(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_a_last_attempt_at_the_deadline() {
        let start = Instant::now();
        let mut attempts = 0;
        let mut last = start;
        let r: Option<()> = poll_until(
            Deadline::after(Some(Duration::from_millis(300))),
            Duration::from_millis(100),
            None,
            || {
                attempts += 1;
                last = Instant::now();
                async { Ok(None) }
            },
        )
        .await
        .unwrap();
        assert!(r.is_none());
        assert!(attempts >= 4, "attempts: {attempts}");
        assert_eq!(
            last - start,
            Duration::from_millis(300),
            "last attempt at the deadline"
        );
    }

    #[test]
    fn huge_bounds_do_not_overflow() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            assert_eq!(Deadline::after(Some(Duration::MAX)), Deadline::NEVER);
            assert!(Deadline::after(Some(Duration::from_secs(1))).at().is_some());
        });
    }

    #[tokio::test(start_paused = true)]
    async fn wakes_early_when_notified() {
        let wake = std::sync::Arc::new(Notify::new());
        let w2 = wake.clone();
        let mut n = 0;
        let start = Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            w2.notify_waiters();
        });
        let r = poll_until(Deadline::NEVER, Duration::from_secs(60), Some(&wake), || {
            n += 1;
            let done = Instant::now() - start >= Duration::from_millis(1000);
            async move { Ok(done.then_some(())) }
        })
        .await
        .unwrap();
        assert!(r.is_some());
        // Backoff alone (2, 4, 8, ... ms jittered) would not land at exactly 1 s.
        assert!(Instant::now() - start < Duration::from_millis(1100));
    }
}
