//! The one way to undo something from `Drop`: an armed [`Undo`] runs its
//! action when dropped, unless disarmed first. Every backend's
//! fire-and-forget unlock, cancel or kill is one of these, so that a
//! dropped guard or a cancelled acquisition never blocks and never leaks.

use std::future::Future;
use std::sync::Mutex;

type Action = Box<dyn FnOnce() + Send>;

/// A value that is undone when dropped armed: `action(value)` runs in
/// `Drop`. [`Undo::take`] disarms it and hands the value back to the path
/// that finishes the work properly (an explicit release).
///
/// `Sync` (the value sits behind a mutex), so it can live in a guard.
#[must_use = "an Undo runs its action when dropped"]
pub(crate) struct Undo<T: Send + 'static = Action> {
    armed: Mutex<Option<T>>,
    action: fn(T),
}

impl Undo {
    /// Runs `f` on drop.
    pub(crate) fn new(f: impl FnOnce() + Send + 'static) -> Self {
        Undo::with(Box::new(f), |f| f())
    }

    /// Spawns `work` on `runtime` on drop: never blocks the dropping thread,
    /// needs no runtime there. If `runtime` has shut down, the work does not
    /// run (whatever it undoes went with the runtime's connections).
    pub(crate) fn spawn(
        runtime: &tokio::runtime::Handle,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let runtime = runtime.clone();
        Undo::new(move || drop(runtime.spawn(work)))
    }
}

impl<T: Send + 'static> Undo<T> {
    /// `action(value)` on drop.
    pub(crate) fn with(value: T, action: fn(T)) -> Self {
        Undo {
            armed: Mutex::new(Some(value)),
            action,
        }
    }

    /// Disarms it, handing the value back (`None` if already taken).
    pub(crate) fn take(&mut self) -> Option<T> {
        self.armed.get_mut().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// `f` of the value while it is armed (`None` once taken).
    pub(crate) fn peek<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }

    /// The action will not run (the value is dropped as it is).
    pub(crate) fn disarm(&mut self) {
        drop(self.take());
    }

    /// Whether the action is still to run.
    #[cfg(test)]
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl<T: Send + 'static> Drop for Undo<T> {
    fn drop(&mut self) {
        if let Some(v) = self.take() {
            (self.action)(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn runs_once_on_drop_unless_disarmed() {
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        drop(Undo::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(n.load(Ordering::SeqCst), 1);
        let n3 = n.clone();
        let mut u = Undo::new(move || {
            n3.fetch_add(1, Ordering::SeqCst);
        });
        assert!(u.is_armed());
        u.disarm();
        assert!(!u.is_armed());
        drop(u);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        let mut v = Undo::with(5u8, |_| panic!("taken values are not undone"));
        assert_eq!(v.take(), Some(5));
        assert_eq!(v.take(), None);
    }

    #[tokio::test]
    async fn spawn_runs_the_work_on_the_runtime() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Dropped on a thread with no runtime: the work still runs.
        let u = Undo::spawn(&tokio::runtime::Handle::current(), async move {
            let _ = tx.send(7);
        });
        std::thread::spawn(move || drop(u)).join().unwrap();
        assert_eq!(rx.await.unwrap(), 7);
    }
}
