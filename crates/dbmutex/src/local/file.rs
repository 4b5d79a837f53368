//! One lock file: a descriptor that locks it without blocking, and probes.
//!
//! Everything here does file-system calls that may block on a slow disk, so
//! the backend runs it on tokio's blocking pool. Only the unlock in a guard's
//! `Drop` runs in place: `flock(LOCK_UN)` and `close` do not wait.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::note;
use crate::{Error, Mode, Result};

/// An I/O error whose message names what was being done, and to which path.
pub(crate) fn io_error(context: String, e: io::Error) -> Error {
    Error::Io(io::Error::new(e.kind(), format!("{context}: {e}")))
}

/// Runs file-system work on the blocking pool.
///
/// Cancel safety: if the caller stops waiting, the work still finishes and
/// its result is dropped; a lock file in it closes, and with it its lock.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::Io(io::Error::other(format!("lock file task ended: {e}")))),
    }
}

/// A descriptor on a lock file. Each holder opens its own: the OS lock
/// belongs to the open file description, so two descriptors conflict within
/// one process just as in two processes.
pub(crate) struct LockFile {
    file: File,
    /// False for a file another user created in a shared directory: a
    /// read-only descriptor locks as well, it just cannot write the note.
    writable: bool,
}

impl LockFile {
    /// Opens `path`, creating it when missing. Never truncates: the file may
    /// be locked by someone else.
    ///
    /// The directory may be shared with other users (see `dir`), so a
    /// symlink is never followed (`O_NOFOLLOW`), anything but a regular file
    /// is refused, and a file with other hard links is locked but never
    /// written: nobody can point dbmutex at a file elsewhere.
    pub(crate) fn open(path: &Path) -> Result<LockFile> {
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(NO_SURPRISES)
            .open(path);
        let (file, writable) = match rw {
            Ok(file) => (file, true),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => match read_only(path) {
                Ok(file) => (file, false),
                Err(_) => return Err(io_error(format!("cannot open lock file {}", path.display()), e)),
            },
            Err(e) => return Err(io_error(format!("cannot open lock file {}", path.display()), e)),
        };
        let m = file
            .metadata()
            .map_err(|e| io_error(format!("cannot stat lock file {}", path.display()), e))?;
        if !m.file_type().is_file() {
            return Err(crate::Error::Config(format!(
                "lock file {} is not a regular file",
                path.display()
            )));
        }
        if writable && m.nlink() == 1 && m.mode() & 0o444 != 0o444 {
            // A strict umask (077) left it unreadable to other users, who
            // could then never lock it: readable is all they need. Only
            // its owner may change the mode; for anyone else this fails,
            // and changes nothing.
            let _ = file.set_permissions(std::fs::Permissions::from_mode(m.mode() | 0o444));
        }
        Ok(LockFile {
            file,
            writable: writable && m.nlink() == 1,
        })
    }

    /// Opens an existing file for a probe; `None` when there is none.
    pub(super) fn open_existing(path: &Path) -> Result<Option<LockFile>> {
        match read_only(path) {
            Ok(file) => Ok(Some(LockFile {
                file,
                writable: false,
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(format!("cannot open lock file {}", path.display()), e)),
        }
    }

    /// Takes the OS lock if nobody conflicting has it; never waits.
    pub(crate) fn try_lock(&self, mode: Mode, path: &Path) -> Result<bool> {
        let r = match mode {
            Mode::Exclusive => self.file.try_lock(),
            Mode::Shared => self.file.try_lock_shared(),
        };
        match r {
            Ok(()) => Ok(true),
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(e)) => Err(io_error(format!("cannot lock {}", path.display()), e)),
        }
    }

    /// Whether `path` still names the file this descriptor is open on. A lock
    /// on a file that was removed (or replaced) since it was opened excludes
    /// nobody: the next opener creates and locks a new file.
    pub(crate) fn is_at(&self, path: &Path) -> Result<bool> {
        let mine = self
            .file
            .metadata()
            .map_err(|e| io_error(format!("cannot stat lock file {}", path.display()), e))?;
        match std::fs::metadata(path) {
            Ok(now) => Ok(now.dev() == mine.dev() && now.ino() == mine.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error(format!("cannot stat lock file {}", path.display()), e)),
        }
    }

    /// Writes the note for a holder in `mode` (see [`note`]). Best effort:
    /// the note only informs `holders` and `list`, so a failure is logged and
    /// the lock kept.
    pub(crate) fn write_note(&self, mode: Mode, name: &str, application: &str, path: &Path) {
        if !self.writable {
            return;
        }
        let r = match mode {
            Mode::Exclusive => {
                let bytes = note::exclusive(name, application);
                self.file
                    .write_all_at(&bytes, 0)
                    .and_then(|()| self.file.set_len(bytes.len() as u64))
            }
            // Only into an empty file; see the `note` module on why.
            Mode::Shared => match self.file.metadata() {
                Ok(m) if m.len() == 0 => self.file.write_all_at(&note::shared(name), 0),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = r {
            tracing::debug!(path = %path.display(), error = %e, "dbmutex: cannot write the holder note");
        }
    }

    /// Unlocks and closes. Closing alone frees the lock only when no copy of
    /// the descriptor is left, and a child being spawned holds one between its
    /// fork and its exec; the unlock frees it whatever copies exist.
    pub(crate) fn unlock(self) -> io::Result<()> {
        self.file.unlock()
    }
}

/// Open flags for every lock file: never follow a symlink (`O_NOFOLLOW`:
/// the open fails with `ELOOP`), never block on a FIFO planted in its place.
const NO_SURPRISES: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK;

fn read_only(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(NO_SURPRISES)
        .open(path)
}

/// Who holds the file at `path` now: `None` (free, or no such file), or the
/// mode it is held in. Found by taking and at once dropping a lock on a fresh
/// descriptor, so it costs no server and needs no privileges; a `try_lock`
/// elsewhere that lands in that instant (microseconds) is refused as if the
/// lock were held.
pub(crate) fn probe(path: &Path) -> Result<Option<Mode>> {
    let Some(fd) = LockFile::open_existing(path)? else {
        return Ok(None);
    };
    let held = if fd.try_lock(Mode::Exclusive, path)? {
        None
    } else if fd.try_lock(Mode::Shared, path)? {
        Some(Mode::Shared)
    } else {
        Some(Mode::Exclusive)
    };
    // The descriptor closes here too; unlocking first says so.
    let _ = fd.unlock();
    Ok(held)
}

/// The note in the file at `path`, empty when it cannot be read.
pub(crate) fn read_note(path: &Path) -> note::Note {
    std::fs::read(path).map(|b| note::parse(&b)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::tests::TempDir;

    #[test]
    fn descriptors_of_one_process_conflict_like_processes() {
        let dir = TempDir::new("fds");
        let path = dir.path().join("x.lock");
        let a = LockFile::open(&path).unwrap();
        let b = LockFile::open(&path).unwrap();
        assert!(a.try_lock(Mode::Exclusive, &path).unwrap());
        assert!(!b.try_lock(Mode::Exclusive, &path).unwrap());
        assert!(!b.try_lock(Mode::Shared, &path).unwrap());
        a.unlock().unwrap();
        assert!(b.try_lock(Mode::Shared, &path).unwrap());
        let c = LockFile::open(&path).unwrap();
        assert!(c.try_lock(Mode::Shared, &path).unwrap(), "shared + shared");
        assert!(!LockFile::open(&path)
            .unwrap()
            .try_lock(Mode::Exclusive, &path)
            .unwrap());
    }

    #[test]
    fn probes_report_the_mode_and_leave_nothing_held() {
        let dir = TempDir::new("probe");
        let path = dir.path().join("p.lock");
        assert_eq!(probe(&path).unwrap(), None, "no file");
        assert!(!path.exists(), "a probe creates no file");

        let holder = LockFile::open(&path).unwrap();
        assert_eq!(probe(&path).unwrap(), None, "free");
        assert!(
            holder.try_lock(Mode::Exclusive, &path).unwrap(),
            "the probe of a free file let go"
        );
        assert_eq!(probe(&path).unwrap(), Some(Mode::Exclusive));
        holder.unlock().unwrap();

        let reader = LockFile::open(&path).unwrap();
        assert!(reader.try_lock(Mode::Shared, &path).unwrap());
        assert_eq!(probe(&path).unwrap(), Some(Mode::Shared));
        reader.unlock().unwrap();
        let after = LockFile::open(&path).unwrap();
        assert!(
            after.try_lock(Mode::Exclusive, &path).unwrap(),
            "the probe of a shared file let go"
        );
    }

    #[test]
    fn a_replaced_file_is_noticed() {
        let dir = TempDir::new("replaced");
        let path = dir.path().join("r.lock");
        let old = LockFile::open(&path).unwrap();
        assert!(old.is_at(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(!old.is_at(&path).unwrap(), "removed");
        let new = LockFile::open(&path).unwrap();
        assert!(!old.is_at(&path).unwrap(), "replaced");
        assert!(new.is_at(&path).unwrap());
    }

    #[test]
    fn notes_by_mode() {
        let dir = TempDir::new("notes");
        let path = dir.path().join("n.lock");
        let s = LockFile::open(&path).unwrap();
        s.write_note(Mode::Shared, "the-name", "app", &path);
        assert_eq!(read_note(&path).name.as_deref(), Some("the-name"));
        assert_eq!(read_note(&path).pid, None, "shared holders write no pid");
        let x = LockFile::open(&path).unwrap();
        x.write_note(Mode::Exclusive, "the-name", "app", &path);
        let n = read_note(&path);
        assert_eq!(n.pid, Some(i64::from(std::process::id())));
        assert_eq!(n.application.as_deref(), Some("app"));
        // A shared holder leaves an existing note alone.
        s.write_note(Mode::Shared, "the-name", "app", &path);
        assert_eq!(read_note(&path), n);
    }

    #[test]
    fn symlinks_fifos_and_hard_links_are_not_followed_or_written() {
        let dir = TempDir::new("planted");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("link.lock");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(LockFile::open(&link).is_err(), "followed a symlink");
        let dangling = dir.path().join("dangling.lock");
        std::os::unix::fs::symlink(dir.path().join("created"), &dangling).unwrap();
        assert!(LockFile::open(&dangling).is_err());
        assert!(!dir.path().join("created").exists(), "created a symlink's target");
        assert!(probe(&link).is_err(), "a probe followed a symlink");

        let fifo = dir.path().join("fifo.lock");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        assert!(LockFile::open(&fifo).is_err(), "a FIFO is no lock file");

        let hard = dir.path().join("hard.lock");
        std::fs::hard_link(&victim, &hard).unwrap();
        let fd = LockFile::open(&hard).unwrap();
        assert!(fd.try_lock(Mode::Exclusive, &hard).unwrap());
        fd.write_note(Mode::Exclusive, "name", "app", &hard);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }
}
