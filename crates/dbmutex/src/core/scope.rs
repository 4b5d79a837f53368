//! The task's *scope* stack: the locks the current task holds through
//! [`Locker::with_lock`](crate::Locker::with_lock), outermost first. Nested
//! acquisitions learn their enclosing lock from it.

use std::future::Future;

use crate::types::HeldLock;
use crate::LockName;

tokio::task_local! {
    static SCOPE: Vec<HeldLock>;
}

/// The locks the current task holds through [`Locker::with_lock`](crate::Locker::with_lock)
/// (any locker), outermost first. Empty outside any scoped call. Locks held
/// through guards are not listed: a guard can move between tasks.
pub fn current_locks() -> Vec<HeldLock> {
    SCOPE.try_with(|h| h.clone()).unwrap_or_default()
}

/// The innermost scoped lock of locker `locker_id` in this task: the context
/// a nested acquisition on that locker runs in.
pub(crate) fn enclosing(locker_id: u64) -> Option<LockName> {
    SCOPE
        .try_with(|h| {
            h.iter()
                .rev()
                .find(|l| l.locker_id == locker_id)
                .map(|l| l.name.clone())
        })
        .ok()
        .flatten()
}

/// Runs `f` with `stack` as the task's scope stack.
pub(crate) async fn within<F: Future>(stack: Vec<HeldLock>, f: F) -> F::Output {
    SCOPE.scope(stack, f).await
}
