//! Where the lock files live, and making sure that place is fit for them.

use std::ffi::OsString;
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::io_error;
use crate::{Error, Result};

/// The environment variable that names the lock directory.
pub(crate) const DIR_ENV: &str = "DBMUTEX_LOCK_DIR";

/// The per-user runtime directory of the XDG Base Directory specification.
const RUNTIME_ENV: &str = "XDG_RUNTIME_DIR";

/// Which directory to use, before anything is created.
#[derive(Debug, PartialEq, Eq)]
enum Choice {
    /// Named by the caller or by `DBMUTEX_LOCK_DIR`: used as it is.
    Named(PathBuf),
    /// `$XDG_RUNTIME_DIR/dbmutex`: inside a directory that the specification
    /// makes private to the user.
    Runtime(PathBuf),
    /// `<temp>/dbmutex-<uid>`: in a directory anyone may write to, so it is
    /// checked to be this user's before use.
    Temp,
}

fn choose(given: Option<PathBuf>, named_env: Option<OsString>, runtime_env: Option<OsString>) -> Choice {
    let set = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = set(given).or_else(|| set(named_env.map(PathBuf::from))) {
        return Choice::Named(dir);
    }
    // The specification says to ignore a relative value.
    match set(runtime_env.map(PathBuf::from)).filter(|p| p.is_absolute()) {
        Some(run) => Choice::Runtime(run.join("dbmutex")),
        None => Choice::Temp,
    }
}

/// The lock directory: `given`, else `$DBMUTEX_LOCK_DIR`, else
/// `$XDG_RUNTIME_DIR/dbmutex`, else `<temp>/dbmutex-<uid>`; empty values
/// count as unset. Created (mode 0700) when missing.
pub(crate) fn resolve(given: Option<PathBuf>) -> Result<PathBuf> {
    let choice = choose(given, std::env::var_os(DIR_ENV), std::env::var_os(RUNTIME_ENV));
    match choice {
        Choice::Named(dir) | Choice::Runtime(dir) => ensure(&dir),
        Choice::Temp => {
            let tmp = std::env::temp_dir();
            let uid = current_uid(&tmp)?;
            let dir = ensure(&tmp.join(format!("dbmutex-{uid}")))?;
            check_private(&dir, uid)?;
            Ok(dir)
        }
    }
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

/// This process's user id, without `unsafe`: the owner of a file it creates.
fn current_uid(tmp: &Path) -> Result<u32> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let probe = tmp.join(format!(".dbmutex-uid-{}-{nanos}", std::process::id()));
    let made = OpenOptions::new().write(true).create_new(true).open(&probe);
    let uid = made.and_then(|f| f.metadata()).map(|m| m.uid());
    let _ = std::fs::remove_file(&probe);
    uid.map_err(|e| {
        io_error(
            format!(
                "cannot create a file in the temporary directory {} to learn the user id \
                 (set {DIR_ENV} to choose the lock directory)",
                tmp.display()
            ),
            e,
        )
    })
}

/// Refuses a default directory in a world-writable place that someone else
/// made (or made writable): they could then see, remove or swap our lock
/// files, or point the directory elsewhere with a symlink.
fn check_private(dir: &Path, uid: u32) -> Result<()> {
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| io_error(format!("cannot access lock directory {}", dir.display()), e))?;
    if m.file_type().is_dir() && m.uid() == uid && m.mode() & 0o022 == 0 {
        return Ok(());
    }
    let why = if m.file_type().is_symlink() {
        "it is a symlink".to_owned()
    } else {
        format!(
            "owner uid {}, mode {:o}; expected uid {uid} and no write access for others",
            m.uid(),
            m.mode() & 0o7777
        )
    };
    Err(Error::Config(format!(
        "lock directory {} is not private to this user ({why}); \
         remove it, or set {DIR_ENV} to another directory",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn os(s: &str) -> Option<OsString> {
        Some(s.into())
    }

    #[test]
    fn precedence() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            choose(Some(p("/given")), os("/env"), os("/run")),
            Choice::Named(p("/given"))
        );
        assert_eq!(choose(None, os("/env"), os("/run")), Choice::Named(p("/env")));
        assert_eq!(
            choose(Some(p("")), os(""), os("/run/user/7")),
            Choice::Runtime(p("/run/user/7/dbmutex")),
            "empty values count as unset"
        );
        assert_eq!(choose(None, None, os("relative/run")), Choice::Temp);
        assert_eq!(choose(None, None, None), Choice::Temp);
    }

    #[test]
    fn creates_private_directories_and_rejects_files() {
        let base = super::super::tests::TempDir::new("dir");
        let dir = ensure(&base.path().join("a/b")).unwrap();
        assert!(dir.is_absolute());
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let uid = current_uid(base.path()).unwrap();
        assert_eq!(uid, std::fs::metadata(&dir).unwrap().uid());
        check_private(&dir, uid).unwrap();

        let file = base.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = ensure(&file).unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains(&*file.to_string_lossy())),
            "{err}"
        );
    }

    #[test]
    fn foreign_or_open_directories_are_refused() {
        let base = super::super::tests::TempDir::new("private");
        let dir = ensure(&base.path().join("d")).unwrap();
        let uid = current_uid(base.path()).unwrap();
        assert!(matches!(check_private(&dir, uid + 1), Err(Error::Config(_))));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(check_private(&dir, uid), Err(Error::Config(_))));
        let link = base.path().join("link");
        std::os::unix::fs::symlink(base.path().join("elsewhere"), &link).unwrap();
        std::fs::create_dir(base.path().join("elsewhere")).unwrap();
        let err = check_private(&link, uid).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }
}
