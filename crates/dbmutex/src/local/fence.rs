//! Fencing tokens on the local backend (see [`crate::fence`]): the last
//! token in a file beside the lock file, replaced while the lock is held.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::file::io_error;
use crate::Result;

/// `<lock file><suffix>`.
pub(super) fn beside(lock: &Path, suffix: &str) -> PathBuf {
    let mut p = OsString::from(lock.as_os_str());
    p.push(suffix);
    PathBuf::from(p)
}

/// The next token of the lock file at `lock`, which the caller holds:
/// read the last one (none yet: 0), write the next to a temporary file,
/// `fsync` it, rename it over the fence file and `fsync` the directory, so
/// the token is on disk before it is handed out. Blocking.
pub(super) fn issue(lock: &Path) -> Result<u64> {
    let path = beside(lock, ".fence");
    let last = match read(&path) {
        Ok(text) => text.trim().parse::<u64>().map_err(|_| {
            io_error(
                format!("fence file {} does not hold a token", path.display()),
                io::Error::from(io::ErrorKind::InvalidData),
            )
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io_error(format!("cannot read fence file {}", path.display()), e)),
    };
    let next = last + 1;
    replace(lock, ".fence", &format!("{next}\n"))?;
    Ok(next)
}

/// Replaces `<lock><suffix>` with `text` durably: write a temporary file,
/// `fsync` it, rename it over, `fsync` the directory. Blocking.
///
/// The file serves every user of a shared directory, so it is mode 0666
/// whatever the umask. In a sticky directory (the host-wide default) only
/// its owner may rename over it: another user rewrites it in place, under
/// the lock like the rename (a reader without the lock, `status`, may then
/// see it half written and say so).
pub(super) fn replace(lock: &Path, suffix: &str, text: &str) -> Result<()> {
    let path = beside(lock, suffix);
    let tmp = beside(lock, &format!("{suffix}.tmp"));
    let replaced = write_synced(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = replaced {
        // Not left for the next holder, who may be another user unable to
        // truncate it (a shared directory).
        let _ = std::fs::remove_file(&tmp);
        if e.kind() != io::ErrorKind::PermissionDenied {
            return Err(io_error(format!("cannot write {}", path.display()), e));
        }
        return rewrite(&path, text).map_err(|e| {
            io_error(
                format!(
                    "cannot write {} (another user's, not writable by this one: \
                     remove it, or make it mode 0666)",
                    path.display()
                ),
                e,
            )
        });
    }
    match path.parent() {
        Some(dir) => File::open(dir).and_then(|d| d.sync_all()),
        None => Ok(()),
    }
    .map_err(|e| io_error(format!("cannot sync the directory of {}", path.display()), e))
}

/// Rewrites the existing file at `path` in place (see [`replace`]): never
/// through a symlink or into a file with other links.
fn rewrite(path: &Path, text: &str) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() || m.nlink() != 1 {
        return Err(io::Error::from(io::ErrorKind::PermissionDenied));
    }
    f.set_len(0)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// The directory may be shared with other users: a symlink is never
/// followed (`O_NOFOLLOW`), as for lock files.
pub(super) fn read(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?
        .read_to_string(&mut text)?;
    Ok(text)
}

fn write_synced(path: &Path, text: &str) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o666)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // The umask took bits away: put them back (every user rewrites it).
    f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_count_up_from_one_and_a_bad_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("dbmutex-fence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("x.lock");
        let _ = std::fs::remove_file(beside(&lock, ".fence"));
        assert_eq!(issue(&lock).unwrap(), 1);
        assert_eq!(issue(&lock).unwrap(), 2);
        assert_eq!(std::fs::read_to_string(beside(&lock, ".fence")).unwrap(), "2\n");
        std::fs::write(beside(&lock, ".fence"), "two").unwrap();
        assert!(
            issue(&lock).is_err(),
            "a token that cannot be read is never reset"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
