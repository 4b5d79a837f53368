//! Metrics through the `metrics` facade (feature `metrics`): the series the
//! crate docs' "Metrics" table lists, recorded from two places only — an
//! [`Attempt`] per acquisition (the pipeline, `lock_xact`) and a [`Hold`]
//! per guard. Without the feature every item here is empty and inline, so
//! call sites carry no `cfg`.

use crate::types::BackendKind;
use crate::{LockName, Mode};

use super::loss::LossToken;

/// How an acquisition ended: the `outcome` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Outcome {
    Acquired,
    /// A try-once found the lock held.
    NotAcquired,
    /// A bounded (or unbounded, cut short) wait ended without the lock.
    TimedOut,
    /// The server chose this waiter as a deadlock victim.
    Deadlock,
    /// Any other error.
    Error,
    /// The acquiring future was dropped before it finished.
    Cancelled,
}

impl Outcome {
    /// The outcome of one acquisition's result (`Ok(true)`: acquired);
    /// `try_once`: the caller asked for one try (so "not acquired" is
    /// "busy", not "timed out").
    pub(crate) fn of(r: Result<bool, &crate::Error>, try_once: bool) -> Outcome {
        match r {
            Ok(true) => Outcome::Acquired,
            Ok(false) if try_once => Outcome::NotAcquired,
            Ok(false) => Outcome::TimedOut,
            Err(e) if e.is_deadlock() => Outcome::Deadlock,
            Err(_) => Outcome::Error,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::NotAcquired => "not_acquired",
            Outcome::TimedOut => "timed_out",
            Outcome::Deadlock => "deadlock",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) use on::{Attempt, Hold, Labels};

#[cfg(not(feature = "metrics"))]
pub(crate) use off::{Attempt, Hold, Labels};

#[cfg(feature = "metrics")]
mod on {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Once};
    use std::time::Instant;

    use ::metrics::{counter, gauge, histogram, Gauge, Histogram, Label, Unit};

    use super::{BackendKind, LockName, LossToken, Mode, Outcome};

    /// Gives each series its unit and help text, once per process, at the
    /// first acquisition. A recorder installed later misses them, as the
    /// facade has it; the series themselves are recorded all the same.
    fn describe() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            ::metrics::describe_counter!(
                "dbmutex_acquisitions_total",
                Unit::Count,
                "Lock acquisitions, by how they ended"
            );
            ::metrics::describe_histogram!(
                "dbmutex_wait_seconds",
                Unit::Seconds,
                "From asking for a lock to getting it or giving up"
            );
            ::metrics::describe_histogram!(
                "dbmutex_hold_seconds",
                Unit::Seconds,
                "From acquiring a lock to its release, drop or loss"
            );
            ::metrics::describe_gauge!("dbmutex_held", Unit::Count, "Locks held through guards now");
            ::metrics::describe_counter!(
                "dbmutex_losses_total",
                Unit::Count,
                "Locks lost while held (their session ended)"
            );
        });
    }

    /// The labels every series of one lock carries (cheap to clone).
    #[derive(Clone, Debug)]
    pub(crate) struct Labels(Arc<[Label]>);

    impl Labels {
        /// `backend` and `mode`, plus `name` when the locker opted in.
        pub(crate) fn new(kind: BackendKind, mode: Mode, name: &LockName, with_name: bool) -> Self {
            let mut v = Vec::with_capacity(4);
            v.push(Label::from_static_parts("backend", kind.as_str()));
            v.push(Label::from_static_parts("mode", mode.as_str()));
            if with_name {
                v.push(Label::new("name", name.to_string()));
            }
            Labels(v.into())
        }
    }

    /// One acquisition: recorded once, when it ends, or as `cancelled` if
    /// dropped before.
    pub(crate) struct Attempt {
        labels: Option<Labels>,
        start: Instant,
    }

    impl Attempt {
        pub(crate) fn start(labels: Labels) -> Self {
            describe();
            Attempt {
                labels: Some(labels),
                start: Instant::now(),
            }
        }

        /// Records how it ended.
        pub(crate) fn end(mut self, outcome: Outcome) {
            if let Some(labels) = self.labels.take() {
                record(&labels, outcome, self.start);
            }
        }
    }

    impl Drop for Attempt {
        fn drop(&mut self) {
            if let Some(labels) = self.labels.take() {
                record(&labels, Outcome::Cancelled, self.start);
            }
        }
    }

    fn record(labels: &Labels, outcome: Outcome, start: Instant) {
        let mut with = labels.0.to_vec();
        with.push(Label::from_static_parts("outcome", outcome.as_str()));
        counter!("dbmutex_acquisitions_total", with.clone()).increment(1);
        histogram!("dbmutex_wait_seconds", with).record(start.elapsed().as_secs_f64());
    }

    /// One guard's hold: `dbmutex_held` up while it lasts; its end (release,
    /// drop or loss, whichever comes first) is recorded once.
    pub(crate) struct Hold {
        inner: Arc<HoldInner>,
        /// Dropped with the hold: stops the loss watcher.
        _stop: Option<tokio::sync::oneshot::Sender<()>>,
    }

    struct HoldInner {
        held: Gauge,
        hold_time: Histogram,
        labels: Labels,
        since: Instant,
        ended: AtomicBool,
    }

    impl HoldInner {
        fn end(&self, lost: bool) {
            if self.ended.swap(true, Ordering::AcqRel) {
                return;
            }
            self.hold_time.record(self.since.elapsed().as_secs_f64());
            if lost {
                counter!("dbmutex_losses_total", self.labels.0.to_vec()).increment(1);
            }
            // Last: whoever sees the gauge down sees the rest.
            self.held.decrement(1.0);
        }
    }

    impl Hold {
        /// A lock that can be lost is watched by a task of its own, so the
        /// gauge goes down when the loss is known, not when the guard is
        /// dropped; the task ends with the hold.
        pub(crate) fn start(labels: Labels, loss: &LossToken) -> Self {
            let held = gauge!("dbmutex_held", labels.0.to_vec());
            held.increment(1.0);
            let inner = Arc::new(HoldInner {
                held,
                hold_time: histogram!("dbmutex_hold_seconds", labels.0.to_vec()),
                labels,
                since: Instant::now(),
                ended: AtomicBool::new(false),
            });
            let mut stop = None;
            if loss.can_be_lost() {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                    let (lost, watched) = (loss.lost(), inner.clone());
                    rt.spawn(async move {
                        tokio::select! {
                            () = lost => watched.end(true),
                            _ = rx => {}
                        }
                    });
                    stop = Some(tx);
                }
            }
            Hold { inner, _stop: stop }
        }

        /// The guard let go (`lost`: its session had ended already).
        pub(crate) fn end(&self, lost: bool) {
            self.inner.end(lost);
        }
    }

    /// A hold not ended before is ended by its drop (a guard that only
    /// owns one, such as a caller-connection guard).
    impl Drop for Hold {
        fn drop(&mut self) {
            self.inner.end(false);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod off {
    use super::{BackendKind, LockName, LossToken, Mode, Outcome};

    #[derive(Clone, Debug)]
    pub(crate) struct Labels;

    impl Labels {
        #[inline(always)]
        pub(crate) fn new(_: BackendKind, _: Mode, _: &LockName, _: bool) -> Self {
            Labels
        }
    }

    pub(crate) struct Attempt;

    impl Attempt {
        #[inline(always)]
        pub(crate) fn start(_: Labels) -> Self {
            Attempt
        }

        #[inline(always)]
        pub(crate) fn end(self, _: Outcome) {}
    }

    pub(crate) struct Hold;

    impl Hold {
        #[inline(always)]
        pub(crate) fn start(_: Labels, _: &LossToken) -> Self {
            Hold
        }

        #[inline(always)]
        pub(crate) fn end(&self, _: bool) {}
    }
}
