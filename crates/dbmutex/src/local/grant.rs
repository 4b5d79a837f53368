//! A held lock file, as the core's [`Grant`]: unlocks on release or drop,
//! and issues fencing tokens beside the file.

use std::path::PathBuf;
use std::sync::Arc;

use super::fence;
use super::file::{blocking, io_error, LockFile};
use crate::core::arbiter::Hold;
use crate::core::guard::{BoxFuture, Grant};
use crate::core::loss::LossToken;
use crate::Result;

/// A held lock file: its descriptor and its in-process hold. Dropped, it
/// unlocks at once (a file lock needs no round trip).
pub(super) struct FileGrant {
    /// `None` once released. Shared only with a fence being issued, which
    /// keeps the file (and so the lock) until it is done.
    file: Option<Arc<LockFile>>,
    /// Where the lock file is (its fence file is beside it).
    path: PathBuf,
    hold: Option<Hold<String>>,
}

impl FileGrant {
    pub(super) fn new(file: LockFile, path: PathBuf, hold: Option<Hold<String>>) -> Self {
        FileGrant {
            file: Some(Arc::new(file)),
            path,
            hold,
        }
    }

    fn unlock(&mut self) -> Result<()> {
        let r = match self.file.take().map(Arc::try_unwrap) {
            // Closing would free the lock even if unlocking failed.
            Some(Ok(f)) => f
                .unlock()
                .map_err(|e| io_error("cannot unlock a lock file".into(), e)),
            // A fence still being written (its acquisition was cancelled)
            // closes the file, and so frees the lock, once it is done: no
            // later holder's fence may overlap with it.
            Some(Err(_)) | None => Ok(()),
        };
        // After the file, so the in-process waiter it wakes finds it free.
        self.hold = None;
        r
    }
}

impl Grant for FileGrant {
    fn release(mut self: Box<Self>) -> BoxFuture<Result<()>> {
        Box::pin(std::future::ready(self.unlock()))
    }

    fn loss(&self) -> LossToken {
        LossToken::never()
    }

    fn fence(&self, _key: String) -> BoxFuture<Result<u64>> {
        let (path, file) = (self.path.clone(), self.file.clone());
        Box::pin(blocking(move || {
            let r = fence::issue(&path);
            drop(file);
            r
        }))
    }
}

impl Drop for FileGrant {
    fn drop(&mut self) {
        let _ = self.unlock();
    }
}
