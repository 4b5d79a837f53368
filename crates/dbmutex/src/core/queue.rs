//! A key's in-process state: a reader-writer hold and the first-come,
//! first-served queue of tasks waiting for it (see [`super::arbiter`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::Mode;

/// One queued waiter: granted by the releaser, which then wakes it.
pub(crate) struct Queued {
    pub(crate) mode: Mode,
    pub(crate) granted: AtomicBool,
    pub(crate) wake: Notify,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) exclusive: bool,
    pub(crate) shared: u32,
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

    pub(crate) fn give_back(&mut self, mode: Mode) {
        match mode {
            Mode::Exclusive => self.exclusive = false,
            Mode::Shared => self.shared = self.shared.saturating_sub(1),
        }
        self.grant_queued();
    }

    /// Hands the hold to the head of the queue while it can take it: one
    /// exclusive waiter, or every shared waiter up to the next exclusive one.
    fn grant_queued(&mut self) {
        while let Some(head) = self.queue.front() {
            if !self.try_take(head.mode) {
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
        if q.granted.load(Ordering::SeqCst) {
            self.give_back(q.mode);
        } else if let Some(i) = self.queue.iter().position(|e| Arc::ptr_eq(e, q)) {
            self.queue.remove(i);
            // An exclusive head that leaves may let shared waiters behind it go.
            self.grant_queued();
        }
    }
}
