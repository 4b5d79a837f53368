//! Idle connections kept for reuse: one pool type for every backend, each
//! with its own bound and age limit.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A connection an [`Idle`] pool can keep.
pub(crate) trait Reusable: Send + 'static {
    /// Whether it may still serve (not known to be closed or lost).
    fn alive(&self) -> bool;

    /// Closes it (default: dropping it does).
    fn discard(self)
    where
        Self: Sized,
    {
    }
}

/// Clean idle connections, newest first out.
pub(crate) struct Idle<C: Reusable> {
    list: Mutex<Vec<(C, Instant)>>,
    max: usize,
    /// Older than this, a connection is closed rather than reused (a
    /// middlebox may have dropped it silently); `None`: no limit.
    ttl: Option<Duration>,
}

impl<C: Reusable> Idle<C> {
    pub(crate) fn new(max: usize, ttl: Option<Duration>) -> Self {
        Idle {
            list: Mutex::new(Vec::new()),
            max,
            ttl,
        }
    }

    fn fresh(&self, c: &C, since: Instant) -> bool {
        c.alive() && self.ttl.is_none_or(|ttl| since.elapsed() < ttl)
    }

    /// The newest live connection within the age limit, if any; older or
    /// dead ones met on the way are closed.
    pub(crate) fn take(&self) -> Option<C> {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((c, since)) = list.pop() {
            if self.fresh(&c, since) {
                return Some(c);
            }
            c.discard();
        }
        None
    }

    /// Keeps `c` for reuse if it is alive and there is room; else closes it.
    pub(crate) fn put(&self, c: C) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let (keep, stale): (Vec<_>, Vec<_>) = std::mem::take(&mut *list)
            .into_iter()
            .partition(|(c, since)| self.fresh(c, *since));
        *list = keep;
        if c.alive() && list.len() < self.max {
            list.push((c, Instant::now()));
        } else {
            c.discard();
        }
        drop(list);
        stale.into_iter().for_each(|(c, _)| c.discard());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Conn {
        id: usize,
        alive: Arc<AtomicBool>,
        closed: Arc<AtomicUsize>,
    }

    impl Reusable for Conn {
        fn alive(&self) -> bool {
            self.alive.load(Ordering::SeqCst)
        }
        fn discard(self) {
            self.closed.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn bounded_newest_first_and_dead_or_old_ones_closed() {
        let closed = Arc::new(AtomicUsize::new(0));
        let conn = |id, alive: &Arc<AtomicBool>| Conn {
            id,
            alive: alive.clone(),
            closed: closed.clone(),
        };
        let live = Arc::new(AtomicBool::new(true));
        let pool = Idle::new(2, None);
        pool.put(conn(1, &live));
        pool.put(conn(2, &live));
        pool.put(conn(3, &live));
        assert_eq!(closed.load(Ordering::SeqCst), 1, "over the bound: closed");
        assert_eq!(pool.take().map(|c| c.id), Some(2), "newest first");
        let dying = Arc::new(AtomicBool::new(true));
        pool.put(conn(4, &dying));
        dying.store(false, Ordering::SeqCst);
        assert_eq!(pool.take().map(|c| c.id), Some(1), "a dead one is skipped");
        assert_eq!(closed.load(Ordering::SeqCst), 2, "and closed");
        assert!(pool.take().is_none());

        let aged = Idle::new(4, Some(Duration::ZERO));
        aged.put(conn(5, &live));
        assert!(aged.take().is_none(), "past the age limit");
        assert_eq!(closed.load(Ordering::SeqCst), 3);
    }
}
