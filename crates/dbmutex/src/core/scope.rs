//! The task's *scope* stack: the locks the current task holds through
//! [`Locker::with_lock`](crate::Locker::with_lock), outermost first. Nested
//! acquisitions learn their enclosing lock from it, and a nested upgrade
//! the session of the shared lock it upgrades.

use std::future::Future;
use std::sync::Arc;

use super::upgradable::Upgrade;
use crate::types::HeldLock;
use crate::{LockName, Mode};

/// One scoped lock of the task.
#[derive(Clone)]
pub(crate) struct Scoped {
    pub(crate) held: HeldLock,
    /// For a shared lock whose grant can take the key exclusive on its own
    /// session: how a nested exclusive call upgrades it.
    pub(crate) upgrade: Option<Arc<dyn Upgrade>>,
}

tokio::task_local! {
    static SCOPE: Vec<Scoped>;
}

/// The locks the current task holds through [`Locker::with_lock`](crate::Locker::with_lock)
/// (any locker), outermost first. Empty outside any scoped call. Locks held
/// through guards are not listed: a guard can move between tasks. An
/// upgrade (a nested exclusive call inside a shared one for the same name)
/// is listed twice: shared (the outer call), then exclusive.
pub fn current_locks() -> Vec<HeldLock> {
    SCOPE
        .try_with(|h| h.iter().map(|s| s.held.clone()).collect())
        .unwrap_or_default()
}

/// The task's scope stack, with the upgrade handles.
pub(crate) fn stack() -> Vec<Scoped> {
    SCOPE.try_with(|h| h.clone()).unwrap_or_default()
}

/// The innermost scoped lock of locker `locker_id` in this task: the context
/// a nested acquisition on that locker runs in.
pub(crate) fn enclosing(locker_id: u64) -> Option<LockName> {
    SCOPE
        .try_with(|h| {
            h.iter()
                .rev()
                .find(|l| l.held.locker_id == locker_id)
                .map(|l| l.held.name.clone())
        })
        .ok()
        .flatten()
}

/// The mode in which this task holds `name` through a scoped call of
/// locker `locker_id`, if that excludes `mode`: an acquisition of `name` in
/// `mode` would wait for the task itself.
pub(crate) fn held_against(locker_id: u64, name: &LockName, mode: Mode) -> Option<Mode> {
    SCOPE
        .try_with(|h| {
            h.iter()
                .find(|l| {
                    l.held.locker_id == locker_id
                        && l.held.name == *name
                        && (l.held.mode == Mode::Exclusive || mode == Mode::Exclusive)
                })
                .map(|l| l.held.mode)
        })
        .ok()
        .flatten()
}

/// Runs `f` with `stack` as the task's scope stack.
pub(crate) async fn within<F: Future>(stack: Vec<Scoped>, f: F) -> F::Output {
    SCOPE.scope(stack, f).await
}
