//! Where the lock files live, and making sure that place is fit for them.
//!
//! # The default: one directory per host
//!
//! A local lock excludes only the processes that use the same file, so the
//! default directory must be the same for every user and every environment
//! on the host: a login shell, cron (no `XDG_RUNTIME_DIR`, minimal `PATH`),
//! systemd units, `env -i`, `sudo`. It therefore depends on nothing in the
//! environment and nothing about the user: it is `/run/lock/dbmutex`, the
//! FHS place for lock files (`/var/lock` is a symlink to `/run/lock` on
//! Debian and most Linux systems; `/run/lock` is a root-owned tmpfs directory
//! with mode 1777, unaffected by systemd's `PrivateTmp`). Hosts without
//! `/run/lock` use `/var/lock/dbmutex`, else `/tmp/dbmutex` (the literal
//! `/tmp`, not `$TMPDIR`, which differs between environments).
//!
//! Every user must be able to lock there, so the directory is created
//! world-writable with the sticky bit (mode 1777, as `/tmp`): anyone may
//! create lock files, nobody but a file's owner (and the directory's owner)
//! may remove or rename it. Lock files are made readable by
//! every user whatever the umask; another user opens them read-only, which
//! is enough to lock them (`flock(2)` needs no write access).
//!
//! # Threat model
//!
//! Users who share a host share its lock directory, as they share `/tmp`
//! and `/run/lock` with `flock(1)`. What dbmutex protects against:
//!
//! - **Planted symlinks.** The directory itself must be a real directory,
//!   not a symlink (checked with `lstat`). Lock files are opened with
//!   `O_NOFOLLOW` and must be regular files; a file with other hard links
//!   is locked but never written. So a local user cannot make dbmutex
//!   (perhaps run by root from cron) create, truncate or write a file
//!   elsewhere.
//! - **A world-writable directory without the sticky bit** (someone
//!   `chmod 777`-ed it, or created it so): refused, since anyone could then
//!   delete or swap other users' lock files.
//!
//! What it cannot prevent: a local user may hold any lock forever (denial
//! of service) — or stand first in its queue, keeping a ticket fresh
//! without ever taking the lock, which stalls the waiters behind it the
//! same way, and may rewrite the queue's counter (`<lock file>.queue` is
//! mode 0666 so that every user can queue), which disturbs the order only,
//! or a fencing token or run record (`.fence` and `.run` are mode 0666 so
//! that every user can take a fenced or once-per-window lock), which can
//! hand out a token again or make a run due early — and the owner of a lock file (whoever created it first) or
//! of the directory (whoever created it first after boot, unless root made
//! it, e.g. with the tmpfiles.d line `d /run/lock/dbmutex 1777 root root -`)
//! can delete a lock file while it is held, after which a second holder can
//! lock a new file of the same name. Where local users are not trusted with
//! each other's exclusion, give each group of cooperating jobs its own
//! directory (`DBMUTEX_LOCK_DIR`, mode 0700 or a private group), or use a
//! database backend.

use std::fs::DirBuilder;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::file::io_error;
use crate::{Error, Result};

/// The environment variable that names the lock directory.
pub(crate) const DIR_ENV: &str = "DBMUTEX_LOCK_DIR";

/// Where the default directory goes: the first of these that is a
/// directory (the same answer for every user and environment on a host).
const SHARED_PARENTS: [&str; 3] = ["/run/lock", "/var/lock", "/tmp"];

/// The default directory's name inside its parent.
const SHARED_NAME: &str = "dbmutex";

/// Which directory to use, before anything is created.
#[derive(Debug, PartialEq, Eq)]
enum Choice {
    /// Named by the caller or by `DBMUTEX_LOCK_DIR`: used as it is.
    Named(PathBuf),
    /// The host-wide default (see the module docs).
    Shared,
}

fn choose(given: Option<PathBuf>, named_env: Option<std::ffi::OsString>) -> Choice {
    let set = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
    match set(given).or_else(|| set(named_env.map(PathBuf::from))) {
        Some(dir) => Choice::Named(dir),
        None => Choice::Shared,
    }
}

/// The lock directory: `given`, else `$DBMUTEX_LOCK_DIR` (each created with
/// mode 0700 when missing), else the host-wide default
/// (`/run/lock/dbmutex`; see the module docs), created with mode 1777 when
/// missing. Empty values count as unset.
pub(crate) fn resolve(given: Option<PathBuf>) -> Result<PathBuf> {
    match choose(given, std::env::var_os(DIR_ENV)) {
        Choice::Named(dir) => ensure(&dir),
        Choice::Shared => {
            let parents = SHARED_PARENTS.map(Path::new);
            ensure_shared(&shared_dir(&parents)?)
        }
    }
}

/// The default directory for a host whose candidate parents are `parents`.
fn shared_dir(parents: &[&Path]) -> Result<PathBuf> {
    parents
        .iter()
        .find(|p| p.is_dir())
        .map(|p| p.join(SHARED_NAME))
        .ok_or_else(|| {
            Error::Config(format!(
                "none of {} exists for the default lock directory; set {DIR_ENV}",
                parents
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Makes `dir` absolute (so a later `chdir` does not move the locks) and
/// creates it when missing.
fn ensure(dir: &Path) -> Result<PathBuf> {
    let dir = std::path::absolute(dir)
        .map_err(|e| io_error(format!("cannot resolve lock directory {}", dir.display()), e))?;
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(dir),
        Ok(_) => Err(Error::Config(format!(
            "lock directory {} exists but is not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| io_error(format!("cannot create lock directory {}", dir.display()), e))?;
            Ok(dir)
        }
        Err(e) => Err(io_error(
            format!("cannot access lock directory {}", dir.display()),
            e,
        )),
    }
}

/// Creates the host-wide directory `dir` (mode 1777) when missing, and
/// checks that it is fit to share: a real directory, and sticky if others
/// may write to it.
fn ensure_shared(dir: &Path) -> Result<PathBuf> {
    match DirBuilder::new().mode(0o777).create(dir) {
        Ok(()) => {
            // Whatever the umask: every user must be able to create lock
            // files here, and only their owners remove them. The entry is
            // ours now and the parent is sticky, so nobody can swap it
            // before this chmod.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(|e| {
                io_error(
                    format!("cannot set the mode of lock directory {}", dir.display()),
                    e,
                )
            })?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io_error(
                format!(
                    "cannot create lock directory {} (set {DIR_ENV} to choose another)",
                    dir.display()
                ),
                e,
            ))
        }
    }
    check_shared(dir)?;
    Ok(dir.to_path_buf())
}

/// Refuses a shared directory that is a symlink (it could point anywhere)
/// or that others may write to without the sticky bit (they could delete
/// or replace our lock files).
fn check_shared(dir: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| io_error(format!("cannot access lock directory {}", dir.display()), e))?;
    let why = if m.file_type().is_symlink() {
        "it is a symlink".to_owned()
    } else if !m.file_type().is_dir() {
        "it is not a directory".to_owned()
    } else if m.mode() & 0o002 != 0 && m.mode() & 0o1000 == 0 {
        format!(
            "mode {:o}: anyone may write to it but the sticky bit is missing, so anyone \
             could remove other users' lock files",
            m.mode() & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(Error::Config(format!(
        "lock directory {} is unsafe to share ({why}); remove it (it is recreated with \
         mode 1777), or set {DIR_ENV} to another directory",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn os(s: &str) -> Option<OsString> {
        Some(s.into())
    }

    #[test]
    fn precedence_and_no_environment_in_the_default() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(choose(Some(p("/given")), os("/env")), Choice::Named(p("/given")));
        assert_eq!(choose(None, os("/env")), Choice::Named(p("/env")));
        assert_eq!(
            choose(Some(p("")), os("")),
            Choice::Shared,
            "empty values count as unset"
        );
        assert_eq!(choose(None, None), Choice::Shared);
        // The default is a fixed path: nothing from the environment or the user.
        let parents = SHARED_PARENTS.map(Path::new);
        let dir = shared_dir(&parents).unwrap();
        assert!(
            ["/run/lock/dbmutex", "/var/lock/dbmutex", "/tmp/dbmutex"].contains(&dir.to_str().unwrap()),
            "{}",
            dir.display()
        );
    }

    #[test]
    fn the_first_existing_parent_wins() {
        let base = super::super::tests::TempDir::new("parents");
        let missing = base.path().join("missing");
        let there = base.path().join("there");
        std::fs::create_dir(&there).unwrap();
        assert_eq!(shared_dir(&[&missing, &there]).unwrap(), there.join(SHARED_NAME));
        assert!(matches!(shared_dir(&[&missing]), Err(Error::Config(_))));
    }

    #[test]
    fn named_directories_are_private_and_files_refused() {
        let base = super::super::tests::TempDir::new("dir");
        let dir = ensure(&base.path().join("a/b")).unwrap();
        assert!(dir.is_absolute());
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);

        let file = base.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = ensure(&file).unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains(&*file.to_string_lossy())),
            "{err}"
        );
    }

    #[test]
    fn the_shared_directory_is_sticky_and_world_writable() {
        let base = super::super::tests::TempDir::new("shared");
        let dir = base.path().join("dbmutex");
        assert_eq!(ensure_shared(&dir).unwrap(), dir);
        let mode = std::fs::symlink_metadata(&dir).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o1777, "{mode:o}");
        // A second call (another process, another user) accepts it.
        ensure_shared(&dir).unwrap();
    }

    #[test]
    fn unsafe_shared_directories_are_refused() {
        let base = super::super::tests::TempDir::new("unsafe");
        // A symlink planted where the directory should be.
        let elsewhere = base.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = ensure_shared(&link).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        // World-writable without the sticky bit.
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_shared(&open).unwrap_err();
        assert!(err.to_string().contains("sticky"), "{err}");
        // A file.
        let file = base.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(ensure_shared(&file), Err(Error::Config(_))));
        // A private directory someone made is fine (others just cannot use it).
        let private = base.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        ensure_shared(&private).unwrap();
    }
}
