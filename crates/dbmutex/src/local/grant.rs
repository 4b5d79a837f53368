//! A held lock file, as the core's [`Grant`]: unlocks on release or drop,
//! and issues fencing tokens beside the file.

use std::path::PathBuf;
use std::sync::Arc;

use super::file::{blocking, io_error, LockFile};
use super::wake::Woken;
use super::{delay, fence, runs};
use crate::core::arbiter::Hold;
use crate::core::guard::{releasing, BoxFuture, DelayRecord, Grant, OnSession, Releasing, RELEASES};
use crate::core::loss::LossToken;
use crate::runs::{RunStart, Who};
use crate::Result;
use std::time::Duration;

/// A held lock file: its descriptor and its in-process hold. Dropped, it
/// unlocks at once (a file lock needs no round trip).
pub(super) struct FileGrant {
    /// `None` once released. Shared only with a fence being issued, which
    /// keeps the file (and so the lock) until it is done.
    file: Option<Arc<LockFile>>,
    /// Where the lock file is (its fence file is beside it).
    path: PathBuf,
    hold: Option<Hold<String, Woken>>,
}

impl FileGrant {
    pub(super) fn new(file: LockFile, path: PathBuf, hold: Option<Hold<String, Woken>>) -> Self {
        FileGrant {
            file: Some(Arc::new(file)),
            path,
            hold,
        }
    }

    fn unlock(&mut self) -> Result<()> {
        let (r, freed) = match self.file.take().map(Arc::try_unwrap) {
            // Closing would free the lock even if unlocking failed.
            Some(Ok(f)) => (
                f.unlock()
                    .map_err(|e| io_error("cannot unlock a lock file".into(), e)),
                true,
            ),
            // A fence still being written (its acquisition was cancelled)
            // closes the file, and so frees the lock, once it is done: no
            // later holder's fence may overlap with it.
            Some(Err(_)) | None => (Ok(()), false),
        };
        // After the file, so the in-process waiter it wakes finds it free.
        self.hold = None;
        // And the first waiter of another process, at once.
        if freed {
            super::turns::wake_first(&self.path);
        }
        r
    }
}

impl Grant for FileGrant {
    fn release(mut self: Box<Self>) -> Releasing {
        releasing(&RELEASES, move || std::future::ready(self.unlock()))
    }

    fn loss(&self) -> LossToken {
        LossToken::never()
    }

    fn on_session(&self) -> Option<&dyn OnSession> {
        Some(self)
    }
}

impl OnSession for FileGrant {
    fn fence(&self, _key: String) -> BoxFuture<Result<u64>> {
        self.beside(fence::issue)
    }

    fn start_run(&self, window: Duration, who: Who) -> BoxFuture<Result<RunStart>> {
        self.beside(move |path| runs::start(path, window, &who))
    }

    fn finish_run(&self, run: u64, exit_code: Option<i32>) -> BoxFuture<Result<()>> {
        self.beside(move |path| runs::finish(path, run, exit_code))
    }

    /// Keeps only a weak hold on the file: the record must not keep the
    /// lock once the grant lets it go.
    fn delay(&self, _key: String) -> DelayRecord {
        let (path, file) = (self.path.clone(), self.file.as_ref().map(Arc::downgrade));
        Arc::new(move |step| {
            let file = file.as_ref().and_then(std::sync::Weak::upgrade);
            on_file(path.clone(), file, move |path| delay::step(path, step))
        })
    }
}

impl FileGrant {
    /// Runs `work` on the lock file's path on the blocking pool, keeping the
    /// file (and so the lock) until it is done, even if the grant is
    /// released or dropped meanwhile.
    fn beside<T: Send + 'static>(
        &self,
        work: impl FnOnce(&std::path::Path) -> Result<T> + Send + 'static,
    ) -> BoxFuture<Result<T>> {
        on_file(self.path.clone(), self.file.clone(), work)
    }
}

/// Runs `work` on the lock file's `path` on the blocking pool while `file`
/// (the held lock; `None` once released) is kept.
fn on_file<T: Send + 'static>(
    path: PathBuf,
    file: Option<Arc<LockFile>>,
    work: impl FnOnce(&std::path::Path) -> Result<T> + Send + 'static,
) -> BoxFuture<Result<T>> {
    Box::pin(blocking(move || {
        if file.is_none() {
            return Err(crate::Error::LockLost {
                name: path.display().to_string(),
            });
        }
        let r = work(&path);
        drop(file);
        r
    }))
}

impl Drop for FileGrant {
    fn drop(&mut self) {
        let _ = self.unlock();
    }
}
