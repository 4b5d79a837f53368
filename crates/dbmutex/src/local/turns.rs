//! Turns between processes: first come, first served. The kernel's file
//! locks keep no queue: a process that releases a lock and asks for it again
//! at once wins it back before a woken waiter has run, so under steady
//! contention one process would starve the others. So waiting acquisitions
//! queue in `<lock file>.queue` (see [`super::queue`]):
//!
//! - **A newcomer** first looks at the queue. If anyone it must let go
//!   first waits there (anyone, for an exclusive request; an exclusive
//!   waiter, for a shared one), it takes a ticket behind them without
//!   trying the lock; else it tries, and takes a ticket when the lock is
//!   busy (then tries once more, in case the holder let go meanwhile).
//!   Letting someone go first, it wakes the first of them (see
//!   [`super::wake`]): a process that released the lock and asks again at
//!   once hands it over without the waiter sleeping out its poll.
//! - **A queued waiter** tries the lock only when no one it must let go
//!   first holds an earlier ticket (readers behind a reader all try), and
//!   gives up its ticket once it has the lock (or stops waiting).
//! - **Otherwise** waiters poll, at most `MAX_POLL` apart (a release by a
//!   process that does not ask again wakes nobody).
//! - **Never stuck.** Each try of a queued waiter marks its ticket (a
//!   heartbeat); a ticket not marked for [`STALE`] is passed over: an
//!   earlier waiter whose process is stopped, or too busy to run its task,
//!   delays the others by that much at most. A killed waiter's ticket vanishes with
//!   its process, a cancelled one's with its descriptor.
//! - **Try-once requests** never queue nor let anyone go first.
//!
//! This orders processes (and separate lockers), not tasks: tasks of one
//! locker queue first come, first served in the in-process arbiter, and only
//! the head of a key's in-process queue reaches the lock file. Nothing here
//! affects exclusion, which is the lock file's lock alone; a queue that
//! cannot be used (another user's file made read-only, no open file
//! counter file) leaves acquisitions polling unqueued.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::queue::{self, Ticket};
use super::wake;
use crate::Mode;

/// The longest sleep between two looks at a lock file held elsewhere: the
/// worst-case delay before a waiter notices a release in another process
/// when the release does not wake it.
pub(super) const MAX_POLL: Duration = Duration::from_millis(5);

/// How long a queued waiter may go without a try before others pass it.
pub(super) const STALE: Duration = Duration::from_millis(100);

/// One acquisition's place in the turns.
#[derive(Default)]
pub(super) struct Turn {
    /// Not a try-once request.
    can_wait: bool,
    mode: Mode,
    /// No try made yet.
    started: bool,
    /// The lock file.
    lock: PathBuf,
    /// Where this acquisition waits in the queue.
    ticket: Option<Ticket>,
    /// The wake-up channel of this acquisition's in-process slot.
    channel: Option<usize>,
}

/// After a release of the lock file at `lock`: wakes the first process
/// waiting for it, if it can be woken, rather than leave it to its next
/// poll. Best effort, and cheap without waiters (one failed `open`).
pub(super) fn wake_first(lock: &Path) {
    if let Ok(Some(first)) = queue::waiting(lock, Mode::Exclusive, STALE) {
        if let Some((address, channel)) = &first.wake {
            wake::poke(address, *channel);
        }
    }
}

impl Turn {
    /// For an acquisition in `mode` of the lock file at `lock`, whose
    /// in-process slot wakes on `channel`.
    pub(super) fn new(can_wait: bool, mode: Mode, lock: &Path, channel: Option<usize>) -> Turn {
        Turn {
            can_wait,
            mode,
            lock: lock.to_owned(),
            channel,
            ..Turn::default()
        }
    }

    /// Before a try (file-system calls: run on the blocking pool): whether
    /// it is this acquisition's turn to try the lock.
    pub(super) fn may_try(&mut self) -> bool {
        if !self.can_wait {
            return true;
        }
        let newcomer = !std::mem::replace(&mut self.started, true);
        let ahead = match (&self.ticket, newcomer) {
            (Some(t), _) => t.ahead(STALE),
            (None, true) => queue::waiting(&self.lock, self.mode, STALE),
            // Could not queue: tries unqueued.
            (None, false) => Ok(None),
        };
        let ahead = ahead.unwrap_or_else(|e| {
            tracing::debug!(path = %self.lock.display(), error = %e, "dbmutex: cannot read the queue");
            None
        });
        let Some(ahead) = ahead else {
            return true;
        };
        if self.ticket.is_some() {
            return false;
        }
        // A newcomer with waiters before it: behind them, and the first of
        // them is woken (this process may just have released the lock).
        tracing::trace!(path = %self.lock.display(), ticket = ahead.n, "dbmutex: an earlier waiter goes first");
        if let Some((address, channel)) = &ahead.wake {
            wake::poke(address, *channel);
        }
        self.join();
        self.ticket.is_none()
    }

    /// After a try: taken (the ticket is given up), or busy. `true` when
    /// the acquisition just joined the queue at its head: worth one more
    /// try at once, in case the lock was released meanwhile.
    pub(super) fn after(&mut self, locked: bool) -> bool {
        if locked {
            self.ticket = None;
            return false;
        }
        if !self.can_wait || self.ticket.is_some() {
            return false;
        }
        self.join();
        self.ticket
            .as_ref()
            .is_some_and(|t| matches!(t.ahead(STALE), Ok(None)))
    }

    /// Takes a ticket (best effort: without one the acquisition tries
    /// unqueued).
    fn join(&mut self) {
        let wake = wake::address().zip(self.channel);
        match Ticket::take(&self.lock, self.mode, wake) {
            Ok(t) => self.ticket = t,
            Err(e) => {
                tracing::debug!(path = %self.lock.display(), error = %e, "dbmutex: cannot queue");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::tests::TempDir;

    fn turn(lock: &Path, mode: Mode, channel: usize) -> Turn {
        Turn::new(true, mode, lock, Some(channel))
    }

    #[tokio::test]
    async fn a_newcomer_queues_behind_waiters_and_wakes_the_first() {
        let dir = TempDir::new("turns");
        let lock = dir.path().join("t.lock");
        let mut first = turn(&lock, Mode::Exclusive, 3);
        assert!(first.may_try(), "nobody waits: try");
        assert!(first.after(false), "busy: queued first, one more try");
        assert!(first.may_try(), "the first in line tries");

        // Another process releases and asks again: it lets `first` go and
        // wakes it.
        let mut woken = std::pin::pin!(wake::channel(3).notified());
        woken.as_mut().enable();
        let mut again = turn(&lock, Mode::Exclusive, 9);
        assert!(!again.may_try(), "a newcomer lets the waiter go first");
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("the first waiter was woken");
        assert!(!again.may_try(), "still behind");
        let mut reader = turn(&lock, Mode::Shared, 5);
        assert!(!reader.may_try(), "a reader queues behind writers too");
        let mut once = Turn::new(false, Mode::Exclusive, &lock, None);
        assert!(once.may_try(), "a try-once request never waits its turn");

        first.after(true);
        assert!(again.may_try(), "next in line");
        assert!(!reader.may_try());
        again.after(true);
        assert!(reader.may_try());
        reader.after(true);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["t.lock.queue".to_owned()], "no ticket left");
    }
}
