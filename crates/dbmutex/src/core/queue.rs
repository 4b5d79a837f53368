//! A key's in-process state: a reader-writer hold and the first-come,
//! first-served queue of tasks waiting for it (see [`super::arbiter`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::Mode;

/// What a waiter asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// A new hold in this mode.
    Take(Mode),
    /// Exclusive for a task that holds the key shared and keeps that hold
    /// (an upgrade): granted once it is the only shared holder.
    Upgrade,
}

/// One queued waiter: granted by the releaser, which then wakes it.
pub(crate) struct Queued {
    pub(crate) want: Want,
    pub(crate) granted: AtomicBool,
    pub(crate) wake: Notify,
}

impl Queued {
    pub(crate) fn new(want: Want) -> Arc<Self> {
        Arc::new(Queued {
            want,
            granted: false.into(),
            wake: Notify::new(),
        })
    }
}

#[derive(Default)]
pub(crate) struct State {
    /// Held exclusive: by a new hold, or by an upgrade (then `shared` is 1,
    /// the upgrader's own hold).
    pub(crate) exclusive: bool,
    pub(crate) shared: u32,
    /// An upgrade waits or is granted: a second one would wait for the
    /// first's shared hold while the first waits for its own (a deadlock).
    pub(crate) upgrading: bool,
    /// Holds whose guard is gone and that only wait for the server's
    /// unlock (see `Hold::releasing`).
    pub(crate) releasing: u32,
    /// Waiters in arrival order.
    pub(crate) queue: VecDeque<Arc<Queued>>,
}

impl State {
    pub(crate) fn try_take(&mut self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive if !self.exclusive && self.shared == 0 => self.exclusive = true,
            Mode::Shared if !self.exclusive => self.shared += 1,
            _ => return false,
        }
        true
    }

    /// An upgrade: exclusive while the upgrader's shared hold is the only one.
    pub(crate) fn try_upgrade(&mut self) -> bool {
        if self.exclusive || self.shared != 1 {
            return false;
        }
        self.exclusive = true;
        true
    }

    /// Whether the key is held, and only by holds on their way out: a wait
    /// for it is bounded by their unlocks, not by a holder's work.
    pub(crate) fn only_releasing(&self) -> bool {
        self.releasing > 0 && self.releasing == u32::from(self.exclusive && self.shared == 0) + self.shared
    }

    fn try_want(&mut self, want: Want) -> bool {
        match want {
            Want::Take(mode) => self.try_take(mode),
            Want::Upgrade => self.try_upgrade(),
        }
    }

    pub(crate) fn give_back(&mut self, mode: Mode) {
        match mode {
            Mode::Exclusive => self.exclusive = false,
            Mode::Shared => self.shared = self.shared.saturating_sub(1),
        }
        self.grant_queued();
    }

    /// Ends an upgrade (granted or not): back to the upgrader's shared hold.
    pub(crate) fn end_upgrade(&mut self, granted: bool) {
        self.upgrading = false;
        if granted {
            self.exclusive = false;
        }
        self.grant_queued();
    }

    /// Hands the hold to the head of the queue while it can take it: one
    /// exclusive waiter, or every shared waiter up to the next exclusive one.
    fn grant_queued(&mut self) {
        while let Some(head) = self.queue.front() {
            if !self.try_want(head.want) {
                break;
            }
            let head = self.queue.pop_front().expect("checked");
            head.granted.store(true, Ordering::SeqCst);
            head.wake.notify_one();
        }
    }

    /// A waiter leaves (deadline, cancelled): out of the queue, or, if it was
    /// granted meanwhile, the hold goes to the next.
    pub(crate) fn leave(&mut self, q: &Arc<Queued>) {
        let granted = q.granted.load(Ordering::SeqCst);
        if !granted {
            if let Some(i) = self.queue.iter().position(|e| Arc::ptr_eq(e, q)) {
                self.queue.remove(i);
            }
        }
        match (q.want, granted) {
            (Want::Upgrade, _) => self.end_upgrade(granted),
            (Want::Take(mode), true) => self.give_back(mode),
            // An exclusive head that leaves may let shared waiters behind it go.
            (Want::Take(_), false) => self.grant_queued(),
        }
    }
}
