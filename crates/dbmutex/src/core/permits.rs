//! A bound on how many of something run at once, for a caller that only
//! ever tries and never waits: the locker's server waits
//! ([`LockerBuilder::max_server_waits`](crate::LockerBuilder::max_server_waits)).
//!
//! Not `tokio::sync::Semaphore`: a fleet worker takes and gives back a
//! permit on every acquisition that waits in the server, and the
//! semaphore's release takes its waiters' mutex each time, for waiters
//! that never exist here. A count and a compare-and-swap do the same.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// At most `max` [`Permit`]s out at once.
pub(crate) struct Permits {
    out: AtomicUsize,
    max: usize,
}

/// One unit of a [`Permits`], given back when dropped.
pub(crate) struct Permit(Arc<Permits>);

impl Permits {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Permits {
            out: AtomicUsize::new(0),
            max,
        })
    }

    /// A permit, if fewer than `max` are out.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<Permit> {
        self.out
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit(self.clone()))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.out.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_out_and_dropped_ones_come_back() {
        let p = Permits::new(2);
        let a = p.try_take().expect("first");
        let b = p.try_take().expect("second");
        assert!(p.try_take().is_none(), "a third is refused");
        drop(a);
        let c = p.try_take().expect("given back by the drop");
        assert!(p.try_take().is_none());
        drop((b, c));
        assert_eq!(p.out.load(Ordering::Relaxed), 0);
        assert!(Permits::new(0).try_take().is_none(), "max 0: none");
    }
}
