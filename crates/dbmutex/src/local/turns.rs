//! Turns between processes. The kernel's file locks keep no queue: a
//! process that releases a lock and asks for it again at once wins it back
//! before a woken waiter has run, so under steady contention one process
//! starves. So a waiter says that it waits — it holds a shared lock on
//! `<lock file>.want` from its first busy try until it gets the lock (or
//! gives up; closing the descriptor ends it) — and an acquisition that
//! starts while anyone waits lets them go first: it skips its tries until
//! no one holds `.want` (a waiter that got the lock has let go of it), for
//! at most [`YIELD_MAX`], longer than any waiter sleeps between two tries.
//! A try-once request never yields.
//!
//! This orders processes, not tasks: tasks of one process queue first come,
//! first served in the in-process arbiter before they reach a lock file.
//! Nothing here affects exclusion, which is the lock file's alone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::file::LockFile;
use crate::{Mode, Result};

/// The longest sleep between two looks at a lock file held elsewhere: the
/// worst-case delay before a waiter notices a release in another process.
pub(super) const MAX_POLL: Duration = Duration::from_millis(5);

/// The longest an acquisition lets waiters go first.
const YIELD_MAX: Duration = MAX_POLL.saturating_add(Duration::from_millis(5));

/// One acquisition's place in the turns.
#[derive(Default)]
pub(super) struct Turn {
    /// Not a try-once request.
    can_wait: bool,
    /// Tries made or skipped so far.
    tries: u32,
    /// Since when this acquisition has let waiters go first.
    yielding: Option<Instant>,
    /// `<lock file>.want`.
    want_path: PathBuf,
    /// The shared lock on `.want` that says this acquisition waits.
    want: Option<LockFile>,
}

impl Turn {
    /// For an acquisition of the lock file at `lock`.
    pub(super) fn new(can_wait: bool, lock: &Path) -> Turn {
        let mut want = lock.as_os_str().to_owned();
        want.push(".want");
        Turn {
            can_wait,
            want_path: PathBuf::from(want),
            ..Turn::default()
        }
    }

    /// Before a try (file-system calls: run on the blocking pool): `true`
    /// to skip it, letting processes that already wait go first.
    pub(super) fn skip(&mut self) -> Result<bool> {
        let first = self.tries == 0;
        self.tries = self.tries.saturating_add(1);
        if !self.can_wait || !(first || self.yielding.is_some()) {
            return Ok(false);
        }
        if self.yielding.is_some_and(|t| t.elapsed() >= YIELD_MAX) || !others_wait(&self.want_path)? {
            self.yielding = None;
            return Ok(false);
        }
        self.yielding.get_or_insert_with(Instant::now);
        Ok(true)
    }

    /// After a try: taken (no longer waiting), or busy (this acquisition
    /// waits, and says so).
    pub(super) fn after(&mut self, locked: bool) {
        if locked {
            self.want = None;
        } else if self.want.is_none() && self.can_wait {
            // Refused only while another process tests for waiters (a
            // moment): the next busy try says it again.
            if let Ok(fd) = LockFile::open(&self.want_path) {
                if fd.try_lock(Mode::Shared, &self.want_path).unwrap_or(false) {
                    self.want = Some(fd);
                }
            }
        }
    }
}

/// Whether some process holds `.want` (waits for the lock).
fn others_wait(want: &Path) -> Result<bool> {
    match LockFile::open_existing(want)? {
        None => Ok(false),
        // Free for an exclusive lock: nobody waits (dropping `fd` lets go).
        Some(fd) => Ok(!fd.try_lock(Mode::Exclusive, want)?),
    }
}
