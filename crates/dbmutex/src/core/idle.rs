//! Idle connections kept for reuse: one pool type for every backend, each
//! with its own bound and idle limit. A pool with an idle limit closes what
//! sits unused past it in a task of its own (spawned on the runtime of the
//! `put` that found none running), so a quiet locker keeps no spare
//! connection open; what is met past the limit is closed then too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

// tokio's, so that a test with the clock paused sees what a real wait would.
use tokio::time::Instant;

/// A connection an [`Idle`] pool can keep.
pub(crate) trait Reusable: Send + 'static {
    /// Whether it may still serve (not known to be closed or lost).
    fn alive(&self) -> bool;

    /// Whether nobody else is using it now (a shared connection handed out
    /// by [`Idle::shared`] may be); only an unused one is closed for idling.
    fn unused(&self) -> bool {
        true
    }

    /// Whether a pool of these starts the process's timer thread for its
    /// reaper's sleeps (`core/timers.rs`); else it uses it once it runs.
    const TIMER_THREAD: bool = false;

    /// Closes it (default: dropping it does).
    fn discard(self)
    where
        Self: Sized,
    {
    }
}

/// The reaper's shortest sleep, whatever the limit.
const MIN_REAP: Duration = Duration::from_millis(10);

/// A limit this long is never reached: no reaper wakes for it.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Clean idle connections, newest first out.
pub(crate) struct Idle<C: Reusable> {
    list: Mutex<Vec<(C, Instant)>>,
    max: usize,
    /// Unused for this long, a connection is closed (a middlebox may have
    /// dropped it silently, and a quiet locker should hold no spare server
    /// connection); `None`: no limit.
    ttl: Option<Duration>,
    /// A task closing connections past `ttl` is running (or being started).
    reaping: AtomicBool,
}

impl<C: Reusable> Idle<C> {
    pub(crate) fn new(max: usize, ttl: Option<Duration>) -> Self {
        Idle {
            list: Mutex::new(Vec::new()),
            max,
            ttl,
            reaping: AtomicBool::new(false),
        }
    }

    fn fresh(&self, c: &C, since: Instant) -> bool {
        c.alive() && self.ttl.is_none_or(|ttl| since.elapsed() < ttl)
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<(C, Instant)>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest live connection within the idle limit, if any; older or
    /// dead ones met on the way are closed.
    pub(crate) fn take(&self) -> Option<C> {
        let mut list = self.list();
        while let Some((c, since)) = list.pop() {
            if self.fresh(&c, since) {
                return Some(c);
            }
            c.discard();
        }
        None
    }

    /// Whether [`take`](Self::take) would now hand out a connection (the
    /// newest is alive and within the idle limit), without taking it.
    pub(crate) fn has_fresh(&self) -> bool {
        self.list().last().is_some_and(|(c, since)| self.fresh(c, *since))
    }

    /// Keeps `c` for reuse if it is alive and there is room (`true`); else
    /// closes it.
    pub(crate) fn put(self: &Arc<Self>, c: C) -> bool {
        let mut list = self.list();
        // In place: a put comes after every wait, and must not allocate.
        let mut stale = Vec::new();
        let mut i = 0;
        while i < list.len() {
            if self.fresh(&list[i].0, list[i].1) {
                i += 1;
            } else {
                stale.push(list.remove(i).0);
            }
        }
        let kept = c.alive() && list.len() < self.max;
        if kept {
            list.push((c, Instant::now()));
        } else {
            c.discard();
        }
        // Under the list's lock, as the reaper's decision to stop is.
        let start = !list.is_empty()
            && self.ttl.is_some_and(|ttl| ttl < NEVER)
            && !self.reaping.swap(true, Ordering::AcqRel);
        drop(list);
        stale.into_iter().for_each(C::discard);
        if start {
            self.reap();
        }
        kept
    }

    /// Closes what has sat unused past the idle limit; when something
    /// remains, the instant the oldest reaches it. With nothing left, the
    /// reaper stops (decided under the list's lock, where `put` starts one).
    fn close_stale(&self) -> Option<Instant> {
        let ttl = self.ttl?;
        // A zero limit must not make the reaper spin while a connection is
        // in use; a huge one (`Duration::MAX`: never) must not overflow.
        let wake = |since: Instant| since.checked_add(ttl.max(MIN_REAP)).filter(|_| ttl < NEVER);
        let mut list = self.list();
        let (mut keep, mut stale) = (Vec::new(), Vec::new());
        for (c, since) in std::mem::take(&mut *list) {
            match (c.alive(), since.elapsed() >= ttl, c.unused()) {
                (false, ..) | (true, true, true) => stale.push(c),
                // In use by someone: idle again from now.
                (true, true, false) => keep.push((c, Instant::now())),
                (true, false, _) => keep.push((c, since)),
            }
        }
        *list = keep;
        let next = list.iter().filter_map(|(_, since)| wake(*since)).min();
        if next.is_none() {
            self.reaping.store(false, Ordering::Release);
        }
        drop(list);
        stale.into_iter().for_each(C::discard);
        next
    }

    /// Starts the task that closes connections past the idle limit, on the
    /// current runtime (its sleeps on the timer thread, when that runs);
    /// with none, they are closed when next met instead.
    fn reap(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reaping.store(false, Ordering::Release);
            return;
        };
        /// Lets the next `put` start a reaper if this one is cut short (its
        /// runtime shut down) rather than stopped by `close_stale`.
        struct Running<C: Reusable>(Weak<Idle<C>>, bool);
        impl<C: Reusable> Running<C> {
            fn stopped(&mut self) {
                self.1 = false;
            }
        }
        impl<C: Reusable> Drop for Running<C> {
            fn drop(&mut self) {
                if let Some(pool) = self.0.upgrade().filter(|_| self.1) {
                    pool.reaping.store(false, Ordering::Release);
                }
            }
        }
        let mut running = Running(Arc::downgrade(self), true);
        // Nothing put now is stale before its limit: the first look is then
        // (a look at once would find the pool empty again as often as not,
        // when a connection is put back and taken again on every lock, and
        // stop, to be spawned again on the next put).
        let first = self.ttl.map(|ttl| Instant::now() + ttl.max(MIN_REAP));
        // The sleeps on the process's timer thread (see `core/timers.rs`:
        // a timer in the pool's runtime taxes its every park), each look on
        // the pool's runtime (closing a connection may need it). A pool
        // whose connections ask for it starts the thread, from a task (not
        // in this `put`); the others use it once it runs. (Neither in this
        // module's unit tests: they pause their runtime's clock, which the
        // timer thread's does not follow.)
        let reaper = move |on_timers: bool, pool_rt: tokio::runtime::Handle| async move {
            if let Some(first) = first {
                tokio::time::sleep_until(first).await;
            }
            loop {
                let pool = running.0.clone();
                let look = move || pool.upgrade().and_then(|pool| pool.close_stale());
                let next = match on_timers {
                    false => look(),
                    true => match pool_rt.spawn(async move { look() }).await {
                        Ok(next) => next,
                        // The pool's runtime shut down: the next put starts
                        // a reaper (`running` tells it on drop).
                        Err(_) => return,
                    },
                };
                let Some(next) = next else {
                    // Stopped under the list's lock (or the pool is gone).
                    running.stopped();
                    return;
                };
                tokio::time::sleep_until(next).await;
            }
        };
        match super::timers::started().flatten().filter(|_| !cfg!(test)) {
            Some(clock) => drop(clock.spawn(reaper(true, rt))),
            None if C::TIMER_THREAD && !cfg!(test) => drop(rt.clone().spawn(async move {
                match super::timers::handle() {
                    Some(clock) => drop(clock.spawn(reaper(true, rt))),
                    None => reaper(false, rt).await,
                }
            })),
            None => drop(rt.clone().spawn(reaper(false, rt))),
        }
    }
}

impl<C: Reusable + Clone> Idle<C> {
    /// A connection shared by all callers (at most one kept): the live one
    /// within the idle limit (or in use), idle again from now, or `None`.
    /// Hand a new one to [`Idle::put`].
    pub(crate) fn shared(&self) -> Option<C> {
        let mut list = self.list();
        while let Some((c, since)) = list.pop() {
            if c.alive() && (self.fresh(&c, since) || !c.unused()) {
                list.push((c.clone(), Instant::now()));
                return Some(c);
            }
            c.discard();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[derive(Clone)]
    struct Conn {
        id: usize,
        alive: Arc<AtomicBool>,
        closed: Arc<AtomicUsize>,
        busy: Arc<AtomicBool>,
    }

    impl Reusable for Conn {
        fn alive(&self) -> bool {
            self.alive.load(Ordering::SeqCst)
        }
        fn unused(&self) -> bool {
            !self.busy.load(Ordering::SeqCst)
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
            busy: Arc::default(),
        };
        let live = Arc::new(AtomicBool::new(true));
        let pool = Arc::new(Idle::new(2, None));
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

        let aged = Arc::new(Idle::new(4, Some(Duration::ZERO)));
        aged.put(conn(5, &live));
        assert!(aged.take().is_none(), "past the age limit");
        assert_eq!(closed.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn what_sits_unused_past_the_limit_is_closed_by_itself() {
        let closed = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(AtomicBool::new(false));
        let conn = |id| Conn {
            id,
            alive: Arc::new(AtomicBool::new(true)),
            closed: closed.clone(),
            busy: busy.clone(),
        };
        let ttl = Duration::from_millis(100);
        let pool = Arc::new(Idle::new(4, Some(ttl)));
        pool.put(conn(1));
        tokio::time::sleep(ttl / 2).await;
        pool.put(conn(2));
        tokio::time::sleep(ttl * 3 / 4).await;
        assert_eq!(
            closed.load(Ordering::SeqCst),
            1,
            "the first, past the limit, with no call"
        );
        assert_eq!(pool.list().len(), 1);
        tokio::time::sleep(ttl / 2).await;
        assert_eq!(closed.load(Ordering::SeqCst), 2, "then the second");
        assert!(
            !pool.reaping.load(Ordering::SeqCst),
            "an empty pool stops its reaper"
        );
        // A new one starts it again; one in use is kept, idle from then.
        busy.store(true, Ordering::SeqCst);
        pool.put(conn(3));
        tokio::time::sleep(ttl * 3 / 2).await;
        assert_eq!(closed.load(Ordering::SeqCst), 2, "in use: kept");
        busy.store(false, Ordering::SeqCst);
        tokio::time::sleep(ttl * 3 / 2).await;
        assert_eq!(closed.load(Ordering::SeqCst), 3, "unused again: closed");
        assert_eq!(pool.shared().map(|c| c.id), None);
        // A shared one is handed out and stays, idle again from each use.
        pool.put(conn(4));
        tokio::time::sleep(ttl * 3 / 4).await;
        assert_eq!(pool.shared().map(|c| c.id), Some(4));
        tokio::time::sleep(ttl * 3 / 4).await;
        assert_eq!(
            closed.load(Ordering::SeqCst),
            3,
            "used 3/4 of the limit ago: kept"
        );
        tokio::time::sleep(ttl / 2).await;
        assert_eq!(closed.load(Ordering::SeqCst), 4, "then closed");
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_and_huge_limits_close_nothing() {
        let closed = Arc::new(AtomicUsize::new(0));
        for ttl in [None, Some(Duration::MAX), Some(NEVER)] {
            let pool = Arc::new(Idle::new(2, ttl));
            assert!(pool.put(Conn {
                id: 1,
                alive: Arc::new(AtomicBool::new(true)),
                closed: closed.clone(),
                busy: Arc::default(),
            }));
            tokio::time::sleep(Duration::from_secs(3600)).await;
            assert_eq!(pool.take().map(|c| c.id), Some(1), "{ttl:?}: kept, no panic");
            assert!(
                !pool.reaping.load(Ordering::SeqCst),
                "{ttl:?}: no reaper left running"
            );
        }
        assert_eq!(closed.load(Ordering::SeqCst), 0);
    }
}
