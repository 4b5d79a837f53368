//! The queue of processes waiting for one lock file.
//!
//! - `<lock file>.queue` holds two numbers (16 bytes, little-endian): the
//!   lowest ticket that may still wait, and the next ticket to hand out.
//!   Tickets are handed out under an exclusive `flock` of this file, never
//!   waited for (a busy counter means no ticket this try).
//! - `<lock file>.q<n>` is ticket `n`: created (exclusively, mode 0644)
//!   and locked (`flock`, exclusive) by its waiter, removed when it gets the
//!   lock or stops waiting. It says the waiter's mode and how to wake it
//!   (see [`super::wake`]); its modification time is the waiter's last look
//!   at the lock (a heartbeat). A ticket nobody holds locked is dead: its
//!   waiter was killed (the OS dropped its lock). Dead tickets are skipped,
//!   and removed by the next waiter that may.
//!
//! So a lock file that processes waited for has one `.queue` file beside
//! it, and one `.q<n>` per process waiting now. The counter file is created
//! with mode 0666 whatever the umask: in the shared directory every user
//! must be able to take tickets. Whoever can write it can disturb the order
//! — never the exclusion, which is the lock file's alone. As for lock files,
//! symlinks are never followed and only regular files with one link used.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::Mode;

/// Tickets more than this far below the next one are not looked at (a
/// queue that long is a broken counter, not waiters).
const WINDOW: u64 = 256;

/// Open flags: never follow a symlink, never block on a FIFO.
const FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK;

fn beside(lock: &Path, suffix: &str) -> PathBuf {
    let mut p = OsString::from(lock.as_os_str());
    p.push(suffix);
    PathBuf::from(p)
}

fn ticket_path(lock: &Path, n: u64) -> PathBuf {
    beside(lock, &format!(".q{n}"))
}

/// The first waiter queued before a given place that one must let go
/// first.
pub(super) struct Ahead {
    /// Its number.
    pub(super) n: u64,
    /// How to wake it: its process's address and channel.
    pub(super) wake: Option<(String, usize)>,
}

/// The queue's range: (lowest ticket that may wait, next ticket); `None`
/// when nobody ever waited.
fn range(lock: &Path) -> io::Result<Option<(u64, u64)>> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(FLAGS)
        .open(beside(lock, ".queue"))
    {
        Ok(f) => Ok(Some(read_range(&f)?)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn read_range(f: &File) -> io::Result<(u64, u64)> {
    let mut b = [0u8; 16];
    let mut n = 0;
    while n < b.len() {
        match f.read_at(&mut b[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    if n < 16 {
        return Ok((1, 1));
    }
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let next = word(8).clamp(1, u64::MAX / 2);
    Ok((word(0).clamp(next.saturating_sub(WINDOW).max(1), next), next))
}

/// The first live waiter in `[lo, below)` that one in `mode` must let go
/// first (any, for an exclusive request; an exclusive one, for a shared
/// request), skipping tickets whose waiter has not looked at the lock for
/// `stale` (its process is stopped or starved).
fn first_live(lock: &Path, lo: u64, below: u64, mode: Mode, stale: Duration) -> io::Result<Option<Ahead>> {
    for n in lo.max(below.saturating_sub(WINDOW))..below {
        let f = match OpenOptions::new()
            .read(true)
            .custom_flags(FLAGS)
            .open(ticket_path(lock, n))
        {
            Ok(f) => f,
            // Gone, or another user's made unreadable: not ours to order.
            Err(_) => continue,
        };
        if f.try_lock_shared().is_ok() {
            continue; // Dead.
        }
        let mut text = String::new();
        let _ = (&f).take(200).read_to_string(&mut text);
        let mut words = text.split_whitespace();
        let exclusive = words.next() != Some("s");
        if mode == Mode::Shared && !exclusive {
            continue;
        }
        let fresh = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < stale);
        if !fresh {
            continue;
        }
        // Only one of our own wake-up sockets: in a shared directory
        // another user could name any abstract socket here.
        let wake = match (words.next(), words.next().and_then(|c| c.parse().ok())) {
            (Some(a), Some(c)) if a.starts_with(super::wake::PREFIX) => Some((a.to_owned(), c)),
            _ => None,
        };
        return Ok(Some(Ahead { n, wake }));
    }
    Ok(None)
}

/// For an acquisition not queued yet: the first live waiter it must let go
/// first, if any.
pub(super) fn waiting(lock: &Path, mode: Mode, stale: Duration) -> io::Result<Option<Ahead>> {
    match range(lock)? {
        Some((lo, next)) if lo < next => first_live(lock, lo, next, mode, stale),
        _ => Ok(None),
    }
}

/// A place in the queue: its ticket file, locked.
pub(super) struct Ticket {
    lock: PathBuf,
    file: File,
    n: u64,
    mode: Mode,
}

impl Ticket {
    /// Takes a ticket at the end of the queue of the lock file at `lock`,
    /// saying how to wake this waiter: `None` when none could be had now
    /// (counter busy or not usable), so the acquisition waits unqueued.
    pub(super) fn take(lock: &Path, mode: Mode, wake: Option<(&str, usize)>) -> io::Result<Option<Ticket>> {
        let Some(counter) = open_counter(lock)? else {
            return Ok(None);
        };
        let mut locked = false;
        for _ in 0..8 {
            if counter.try_lock().is_ok() {
                locked = true;
                break;
            }
            std::thread::yield_now();
        }
        if !locked {
            return Ok(None);
        }
        let r = Self::take_locked(lock, &counter, mode, wake);
        let _ = counter.unlock();
        r
    }

    fn take_locked(
        lock: &Path,
        counter: &File,
        mode: Mode,
        wake: Option<(&str, usize)>,
    ) -> io::Result<Option<Ticket>> {
        let (mut lo, mut next) = read_range(counter)?;
        lo = advance(lock, lo, next);
        // A number taken by a stale file of someone else's: the next one.
        for _ in 0..16 {
            let n = next;
            next += 1;
            let path = ticket_path(lock, n);
            let file = match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(FLAGS)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            };
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o644));
            if file.try_lock().is_err() {
                continue;
            }
            let kind = if mode == Mode::Shared { "s" } else { "x" };
            let text = match wake {
                Some((a, c)) => format!("{kind} {a} {c}\n"),
                None => format!("{kind}\n"),
            };
            let _ = file.write_all_at(text.as_bytes(), 0);
            write_range(counter, lo, next)?;
            return Ok(Some(Ticket {
                lock: lock.to_owned(),
                file,
                n,
                mode,
            }));
        }
        write_range(counter, lo, next)?;
        Ok(None)
    }

    /// The first live waiter queued before this one that it must let go
    /// first; and says that this one is still looking (the heartbeat).
    pub(super) fn ahead(&self, stale: Duration) -> io::Result<Option<Ahead>> {
        let _ = self.file.set_modified(SystemTime::now());
        let lo = range(&self.lock)?.map_or(1, |(lo, _)| lo);
        first_live(&self.lock, lo, self.n, self.mode, stale)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Removed while still locked, so nobody takes it for dead and
        // removes a successor's file of the same name.
        let _ = std::fs::remove_file(ticket_path(&self.lock, self.n));
        // The first waiter moves the queue's start on, if the counter is
        // free (else the next ticket taken does).
        if let Ok(Some(counter)) = open_counter(&self.lock) {
            if counter.try_lock().is_ok() {
                if let Ok((lo, next)) = read_range(&counter) {
                    if lo == self.n {
                        let _ = write_range(&counter, advance(&self.lock, lo, next), next);
                    }
                }
                let _ = counter.unlock();
            }
        }
    }
}

/// The queue's new start: past tickets that are gone, or dead (removed
/// when this user may).
fn advance(lock: &Path, mut lo: u64, next: u64) -> u64 {
    while lo < next {
        let path = ticket_path(lock, lo);
        match OpenOptions::new().read(true).custom_flags(FLAGS).open(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Ok(f) if f.try_lock().is_ok() => {
                let _ = std::fs::remove_file(&path);
            }
            _ => break,
        }
        lo += 1;
    }
    lo
}

fn write_range(counter: &File, lo: u64, next: u64) -> io::Result<()> {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&lo.to_le_bytes());
    b[8..].copy_from_slice(&next.to_le_bytes());
    counter.write_all_at(&b, 0)
}

/// Opens (creating, mode 0666) the counter file; `None` when it is not a
/// regular file with one link, or not writable (another user's made
/// private).
fn open_counter(lock: &Path) -> io::Result<Option<File>> {
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .custom_flags(FLAGS)
        .open(beside(lock, ".queue"))
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(None),
        Err(e) => return Err(e),
    };
    let m = file.metadata()?;
    if !m.file_type().is_file() || m.nlink() != 1 {
        return Ok(None);
    }
    if m.mode() & 0o666 != 0o666 {
        // The umask took bits away (only the owner may put them back).
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    }
    Ok(Some(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::tests::TempDir;

    const STALE: Duration = Duration::from_secs(60);

    #[test]
    fn tickets_queue_in_order_and_leave_when_dropped() {
        let dir = TempDir::new("queue");
        let lock = dir.path().join("q.lock");
        assert!(waiting(&lock, Mode::Exclusive, STALE).unwrap().is_none());
        let addr = format!("{}test", super::super::wake::PREFIX);
        let a = Ticket::take(&lock, Mode::Exclusive, Some((addr.as_str(), 7)))
            .unwrap()
            .unwrap();
        let b = Ticket::take(&lock, Mode::Shared, None).unwrap().unwrap();
        let c = Ticket::take(&lock, Mode::Shared, None).unwrap().unwrap();
        assert!(a.n < b.n && b.n < c.n);
        assert!(a.ahead(STALE).unwrap().is_none(), "the first is the head");
        let first = b.ahead(STALE).unwrap().unwrap();
        assert_eq!((first.n, first.wake), (a.n, Some((addr.clone(), 7))));
        // Another user writes tickets too: only our own sockets are poked.
        let other = TempDir::new("queue-addr");
        let x = Ticket::take(&other.path().join("x.lock"), Mode::Exclusive, Some(("other", 3)));
        let y = Ticket::take(&other.path().join("x.lock"), Mode::Exclusive, None);
        let ahead = y.unwrap().unwrap().ahead(STALE).unwrap().unwrap();
        assert_eq!((ahead.n, ahead.wake), (x.unwrap().unwrap().n, None));
        assert_eq!(
            waiting(&lock, Mode::Shared, STALE).unwrap().map(|w| w.n),
            Some(a.n)
        );
        drop(a);
        assert!(b.ahead(STALE).unwrap().is_none());
        assert!(c.ahead(STALE).unwrap().is_none(), "readers behind a reader");
        assert!(
            waiting(&lock, Mode::Shared, STALE).unwrap().is_none(),
            "no writer queued"
        );
        assert_eq!(
            waiting(&lock, Mode::Exclusive, STALE).unwrap().map(|w| w.n),
            Some(b.n)
        );
        let d = Ticket::take(&lock, Mode::Exclusive, None).unwrap().unwrap();
        assert!(d.ahead(STALE).unwrap().is_some());
        assert!(
            d.ahead(Duration::ZERO).unwrap().is_none(),
            "stale waiters are passed"
        );
        drop((b, c));
        assert!(d.ahead(STALE).unwrap().is_none());
        drop(d);
        assert!(waiting(&lock, Mode::Exclusive, STALE).unwrap().is_none(), "empty");
        let files: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files, vec![OsString::from("q.lock.queue")], "tickets removed");
        let (lo, next) = range(&lock).unwrap().unwrap();
        assert_eq!(lo, next, "the start moved on");
        let mode = std::fs::metadata(beside(&lock, ".queue")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o666, "{mode:o}");
    }

    #[test]
    fn dead_tickets_are_skipped_and_removed() {
        let dir = TempDir::new("queue-dead");
        let lock = dir.path().join("d.lock");
        let a = Ticket::take(&lock, Mode::Exclusive, None).unwrap().unwrap();
        let b = Ticket::take(&lock, Mode::Exclusive, None).unwrap().unwrap();
        // As if a's process died: its lock is gone, its file stays.
        a.file.unlock().unwrap();
        let dead = ticket_path(&lock, a.n);
        std::mem::forget(a);
        assert!(b.ahead(STALE).unwrap().is_none(), "a dead waiter is skipped");
        let c = Ticket::take(&lock, Mode::Exclusive, None).unwrap().unwrap();
        assert!(!dead.exists(), "removed by the next ticket taken");
        assert_eq!(c.ahead(STALE).unwrap().map(|w| w.n), Some(b.n));
    }

    #[test]
    fn planted_links_are_not_used() {
        let dir = TempDir::new("queue-planted");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let lock = dir.path().join("l.lock");
        std::os::unix::fs::symlink(&victim, beside(&lock, ".queue")).unwrap();
        assert!(
            Ticket::take(&lock, Mode::Exclusive, None).is_err(),
            "followed a symlink"
        );
        let lock = dir.path().join("h.lock");
        std::fs::hard_link(&victim, beside(&lock, ".queue")).unwrap();
        assert!(Ticket::take(&lock, Mode::Exclusive, None).unwrap().is_none());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }
}
