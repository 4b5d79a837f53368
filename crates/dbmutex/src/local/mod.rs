//! The local backend: lock files on this host plus in-process arbitration.
//! No server; locks exclude tasks of one process and processes of one host.
//!
//! # How locks are held
//!
//! - **Where.** One file per name, `<dir>/<head>-<hash>.lock` (see
//!   [`key::local_file_name`](crate::key::local_file_name)). `dir` is the
//!   directory given to [`Locker::local_builder`](crate::Locker::local_builder)
//!   (or in a `file:///dir` URL; an empty path counts as none), else env
//!   `DBMUTEX_LOCK_DIR` (created with mode 0700 when missing), else the
//!   host-wide `/run/lock/dbmutex` (`/var/lock/dbmutex`, else `/tmp/dbmutex`
//!   where there is no `/run/lock`): one directory for every user and
//!   environment (cron, systemd, `env -i`, `sudo`), created with mode 1777;
//!   see `dir` for the checks and the threat model.
//! - **What.** The OS's advisory file lock (`flock(2)` on Linux), exclusive or
//!   shared, taken on a descriptor each guard opens for itself. It is the same
//!   lock as util-linux `flock(1)`'s, so shell scripts and dbmutex exclude each
//!   other. The OS frees it when the holding process exits, however it exits,
//!   so a local lock is never lost while its process lives (and
//!   [`LockGuard::lost`](crate::LockGuard::lost) never completes).
//! - **In-process first.** Tasks of one locker queue in process before they
//!   touch the file, so a release hands the lock to the next task at once.
//!   Waiters in other processes (or other lockers) poll the file every at
//!   most 5 ms, whatever [`LockOptions::max_backoff`] says, so a lock freed
//!   elsewhere is taken within about 5 ms. [`WaitStrategy::Server`](crate::WaitStrategy::Server) behaves
//!   as polling: there is no server to wait in.
//! - **Turns between processes: first come, first served.** A waiter that
//!   finds the file locked takes a ticket in the lock's queue, and a process
//!   that asks afresh while anyone waits queues behind them and wakes the
//!   first of them (one datagram to its abstract Unix socket), so a process
//!   that releases and asks again at once hands over at once instead of
//!   winning again. Only the first of the queue tries the lock; a waiter
//!   whose process stops trying (stopped, starved) is passed after 100 ms,
//!   a killed one at once. Try-once requests never queue. See `turns`.
//! - **No upgrade.** A nested scoped exclusive call inside a scoped shared
//!   one for the same name is [`Error::Unsupported`]: `flock(2)` converts a
//!   shared lock to exclusive by dropping it first, so another process
//!   could take the lock in between. The shared lock stays held.
//! - **Transaction locks** need a database transaction:
//!   [`LockOptions::transaction`] is [`Error::Unsupported`] here, as are raw
//!   PostgreSQL keys.
//! - **Files stay.** Releasing never deletes the lock file: removing a file
//!   that someone else has just opened would let two holders lock two
//!   different files of one name. Files are tiny (a note of under 100 bytes
//!   plus the name). Do not clean the directory while locks may be held; an
//!   acquire that finds its file removed or replaced before it locked it
//!   starts over on the current file.
//! - **Queue files.** A lock that processes waited for has a
//!   `<lock file>.queue` beside it (16 bytes, mode 0666 so that every user
//!   of a shared directory can queue), and one `<lock file>.q<n>` per
//!   process waiting now, removed when it stops waiting (one left by a
//!   killed waiter is removed by the next waiter that may). See `queue`.
//! - **Fencing tokens** ([`LockOptions::fenced`]) live in
//!   `<lock file>.fence` (see [`crate::fence`]), written while the lock is
//!   held; a fence write still running when its acquisition is cancelled
//!   keeps the lock until it is done. These files stay too.
//! - **Who holds it.** [`Locker::holders`](crate::Locker::holders) and
//!   [`Locker::list`](crate::Locker::list) find out whether a file is locked
//!   by locking it for an instant (see [`file::probe`]). If it is, Linux's
//!   `/proc/locks` names every holder's pid and mode, shared ones included,
//!   whatever program holds it. An exclusive holder also writes a note into
//!   the file (pid,
//!   [`LockerBuilder::application_name`](crate::LockerBuilder::application_name),
//!   start time, name): its application and start time are reported, and
//!   the name appears in `list`. Where `/proc/locks` cannot be read, the
//!   note alone answers: one holder, with the noted pid when exclusive and
//!   pid 0 (unknown) when shared.
//!
//! File-system calls run on tokio's blocking pool; a guard's drop only
//! unlocks and closes, which never wait. Each held lock costs one file
//! descriptor.

mod delay;
mod dir;
mod fence;
mod file;
mod grant;
mod note;
mod proc_locks;
mod queue;
mod runs;
mod turns;
mod wake;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::core::backend::{rows, Attempt, Backend, Fut, Missing, Plan, Records, WaitIn};
use crate::core::guard::{BoxFut, Grant};
use crate::key::{local_file_name, local_name_from_note};
use crate::settings::Settings;
use crate::types::{Holder, HolderId, ListedLock};
use crate::{LockName, LockOptions, Mode, Result};
use file::{blocking, io_error, LockFile};
use grant::FileGrant;
use turns::MAX_POLL;
use wake::Woken;

pub(crate) struct LocalBackend {
    dir: PathBuf,
    /// The locker's name prefix.
    prefix: crate::Prefix,
}

/// What one acquisition needs on the blocking pool.
struct Request {
    path: PathBuf,
    mode: Mode,
    /// `prefix + name`, the text the file name hashes.
    full_name: String,
    application: String,
}

enum Tried {
    Locked(LockFile),
    /// Held elsewhere; the descriptor to try again with (`None` after the
    /// file was found replaced).
    Busy(Option<LockFile>),
}

/// One attempt: open the file unless a descriptor is left from the last
/// attempt, try the lock, and on success check the path still names the
/// locked file and note the holder.
fn attempt(req: &Request, fd: Option<LockFile>) -> Result<Tried> {
    let fd = match fd {
        Some(fd) => fd,
        None => LockFile::open(&req.path)?,
    };
    if !fd.try_lock(req.mode, &req.path)? {
        return Ok(Tried::Busy(Some(fd)));
    }
    if !fd.is_at(&req.path)? {
        // Dropping the descriptor frees the lock on the orphaned file.
        return Ok(Tried::Busy(None));
    }
    fd.write_note(req.mode, &req.full_name, &req.application, &req.path);
    Ok(Tried::Locked(fd))
}

impl LocalBackend {
    pub(crate) fn new(dir: Option<PathBuf>, settings: &Settings) -> Result<Self> {
        let dir = dir::resolve(dir)?;
        tracing::debug!(dir = %dir.display(), "dbmutex: local lock directory");
        Ok(LocalBackend {
            dir,
            prefix: settings.prefix.clone(),
        })
    }
}

/// One polling wait: the request and the descriptor kept between tries
/// (the mutex is never held across an await, only the plain value moved in
/// and out).
pub(crate) struct Tries {
    req: Arc<Request>,
    spare: Mutex<Option<LockFile>>,
    /// Where this acquisition stands in the turns between processes.
    turn: Mutex<turns::Turn>,
}

impl Backend for LocalBackend {
    /// The lock file's name, which is what the OS lock is on.
    type Key = String;
    type SlotExt = Woken;
    type Tries = Tries;

    fn refusal(&self, missing: Missing) -> Option<String> {
        match missing {
            Missing::Transaction => Some(
                "transaction-level locks need PostgreSQL; the local backend has no transactions \
                 (drop `transaction(true)` for a lock held until the guard is released)"
                    .into(),
            ),
            Missing::Upgrade => Some(
                "the local backend cannot upgrade a shared lock: flock(2) converts shared to exclusive \
                 by dropping the shared lock first, so another process could take the lock in between"
                    .into(),
            ),
            Missing::Shared | Missing::SessionLocks | Missing::Fencing => None,
        }
    }

    fn key(&self, name: &LockName) -> Result<String> {
        local_file_name(name, &self.prefix)
    }

    /// Polls: the kernel's file locks have no queue to wait in.
    fn plan(&self, opts: &LockOptions) -> Plan {
        Plan {
            hold: true,
            wait: WaitIn::Poll {
                max_backoff: opts.max_backoff.min(MAX_POLL),
            },
        }
    }

    fn begin<'a>(&'a self, at: &'a Attempt<'_, Self>) -> impl Fut<'a, Tries> {
        std::future::ready(Ok(Tries {
            req: Arc::new(Request {
                path: self.dir.join(at.key),
                mode: at.opts.mode,
                full_name: format!("{}{}", at.settings.prefix.text(), at.name),
                application: at.settings.application_name.clone(),
            }),
            spare: Mutex::new(None),
            turn: Mutex::new(turns::Turn::new(
                !at.opts.is_try_once(),
                at.opts.mode,
                &self.dir.join(at.key),
                at.hold
                    .as_ref()
                    .map(|h| wake::channel_of(Arc::as_ptr(h.slot()) as usize)),
            )),
        }))
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: a lock taken on the blocking pool belongs to a
    /// descriptor whose result is dropped with the task's, and a grant owns
    /// its descriptor and hold.
    fn try_once<'a>(
        &'a self,
        tries: &'a Tries,
        at: &'a mut Attempt<'_, Self>,
    ) -> impl Fut<'a, Option<Box<dyn Grant>>> {
        async move {
            let fd = tries.spare.lock().unwrap_or_else(PoisonError::into_inner).take();
            let mut turn = std::mem::take(&mut *tries.turn.lock().unwrap_or_else(PoisonError::into_inner));
            let req = tries.req.clone();
            let (tried, turn) = blocking(move || {
                if !turn.may_try() {
                    return Ok((Tried::Busy(fd), turn));
                }
                let tried = match attempt(&req, fd)? {
                    // Just queued, first in line: the holder may have let
                    // go before the watch began.
                    Tried::Busy(fd) if turn.after(false) => attempt(&req, fd)?,
                    tried => tried,
                };
                if matches!(tried, Tried::Locked(_)) {
                    turn.after(true);
                }
                Ok((tried, turn))
            })
            .await?;
            *tries.turn.lock().unwrap_or_else(PoisonError::into_inner) = turn;
            let file = match tried {
                Tried::Locked(fd) => fd,
                Tried::Busy(fd) => {
                    *tries.spare.lock().unwrap_or_else(PoisonError::into_inner) = fd;
                    return Ok(None);
                }
            };
            let grant = Box::new(FileGrant::new(file, tries.req.path.clone(), at.hold.take()));
            // One await point with the lock taken, even when the blocking-pool
            // work finished before it was awaited (a woken pool thread often
            // runs first): cancellation there must free the lock, and the
            // shared behaviour tests cancel each backend's acquire at each
            // await point.
            tokio::task::yield_now().await;
            Ok(Some(grant as Box<dyn Grant>))
        }
    }

    fn held<'a>(&'a self, only: Option<(&'a LockName, &'a String)>) -> impl Fut<'a, Vec<ListedLock>> {
        let dir = self.dir.clone();
        let prefix = self.prefix.text().to_owned();
        let only = only.map(|(name, key)| (name.clone(), key.clone()));
        blocking(move || match only {
            Some((name, key)) => {
                let path = dir.join(&key);
                let holders = match file::probe(&path)? {
                    Some(mode) => holders_at(&path, mode),
                    None => Vec::new(),
                };
                Ok(rows(&name, &key, holders))
            }
            None => list_dir(&dir, &prefix),
        })
    }

    fn records(&self) -> Option<&dyn Records> {
        Some(self)
    }
}

/// Fence and run files live beside the lock files.
impl Records for LocalBackend {
    /// Nothing to create.
    fn create_tables(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn last_run<'a>(
        &'a self,
        _name: &'a LockName,
        key: &'a str,
    ) -> BoxFut<'a, Result<Option<crate::runs::LastRun>>> {
        let path = self.dir.join(key);
        Box::pin(blocking(move || Ok(runs::last(&path)?.map(|(last, _)| last))))
    }
}

/// The holders of the file at `path`, which a probe found held in `mode`:
/// one per lock in the kernel's table where it can be read, else the one
/// the note describes. The note's application and start time are only
/// reported for the exclusive holder whose pid it names; under a shared
/// lock, or another program's, they are stale.
fn holders_at(path: &Path, mode: Mode) -> Vec<Holder> {
    let note = file::read_note(path);
    let holder = |pid: i64, mode: Mode| {
        let noted = mode == Mode::Exclusive && note.pid == Some(pid);
        Holder {
            id: if pid > 0 {
                HolderId::ClientPid(pid)
            } else {
                HolderId::Unknown
            },
            pid,
            mode,
            application: note.application.clone().filter(|_| noted),
            user: None,
            client: None,
            since: note.since.clone().filter(|_| noted),
        }
    };
    match std::fs::metadata(path)
        .ok()
        .and_then(|m| proc_locks::holders_of(&m))
    {
        Some(found) => found.into_iter().map(|(pid, mode)| holder(pid, mode)).collect(),
        None => {
            let pid = note.pid.filter(|_| mode == Mode::Exclusive).unwrap_or(0);
            vec![holder(pid, mode)]
        }
    }
}

/// The locked `*.lock` files of `dir`, one entry per holder, by file name.
/// The name is the noted one, without this locker's prefix when it starts
/// with it.
fn list_dir(dir: &Path, prefix: &str) -> Result<Vec<ListedLock>> {
    let read_err = |e| io_error(format!("cannot read lock directory {}", dir.display()), e);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let file_name = entry.file_name();
        let Some(key) = file_name.to_str().filter(|n| n.ends_with(".lock")) else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        let mode = match file::probe(&path) {
            Ok(Some(mode)) => mode,
            Ok(None) => continue,
            Err(e) => {
                // One unreadable file (another user's, in a shared
                // directory) should not hide the others.
                tracing::debug!(path = %path.display(), error = %e, "dbmutex: cannot probe lock file");
                continue;
            }
        };
        let name = file::read_note(&path)
            .name
            .map(|n| local_name_from_note(n, prefix));
        out.extend(holders_at(&path, mode).into_iter().map(|holder| ListedLock {
            name: name.clone(),
            key: key.to_owned(),
            holder,
        }));
    }
    out.sort_by(|a, b| (&a.key, a.holder.pid).cmp(&(&b.key, b.holder.pid)));
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests;
