//! The effective user's entry in the password database (`getpwuid_r`), as
//! the database clients read it: libpq's home directory when `HOME` is
//! unset, the MySQL clients' user name when the URL names none.

use std::path::PathBuf;

/// The effective user's name and home directory, as the password database
/// has them (`None` where there is no entry, or off Unix).
pub(crate) struct Entry {
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) name: Option<String>,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) home: Option<PathBuf>,
}

/// The effective user's entry, looked up once per process: a password
/// database behind NSS (LDAP, SSSD) may be slow, and every connect that
/// needs it asks.
pub(crate) fn effective_user() -> Option<&'static Entry> {
    static ENTRY: std::sync::OnceLock<Option<Entry>> = std::sync::OnceLock::new();
    ENTRY.get_or_init(lookup).as_ref()
}

/// The effective user's entry (`getpwuid_r(geteuid())`).
#[cfg(unix)]
#[allow(unsafe_code)]
fn lookup() -> Option<Entry> {
    use std::ffi::{CStr, OsStr};
    use std::os::unix::ffi::OsStrExt;
    let mut size = 1024;
    loop {
        let mut buf = vec![0u8; size];
        // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids).
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: `entry`, `buf` (of `size` bytes) and `found` are valid
        // and writable for the call; the strings it fills in point into
        // `buf`, which outlives their use below.
        let rc = unsafe {
            libc::getpwuid_r(
                libc::geteuid(),
                &mut entry,
                buf.as_mut_ptr().cast(),
                size,
                &mut found,
            )
        };
        if rc == libc::ERANGE && size < 1 << 20 {
            size *= 4;
            continue;
        }
        if rc != 0 || found.is_null() {
            return None;
        }
        // SAFETY: a non-null string field of a found entry is a
        // NUL-terminated string in `buf`.
        let text = |p: *const libc::c_char| (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes());
        let name = text(entry.pw_name)
            .filter(|n| !n.is_empty())
            .and_then(|n| std::str::from_utf8(n).ok())
            .map(str::to_owned);
        let home = text(entry.pw_dir)
            .filter(|d| !d.is_empty())
            .map(|d| PathBuf::from(OsStr::from_bytes(d)));
        return Some(Entry { name, home });
    }
}

#[cfg(not(unix))]
fn lookup() -> Option<Entry> {
    None
}

/// Whether the process runs as root (effective uid 0).
#[cfg(all(unix, feature = "mysql"))]
#[allow(unsafe_code)]
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(all(not(unix), feature = "mysql"))]
pub(crate) fn is_root() -> bool {
    false
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// The name and home `/etc/passwd` lists for this user (where the
    /// entry is there).
    #[test]
    fn the_entry_is_the_password_databases() {
        let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let listed = uid.ok().and_then(|uid| {
            passwd.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 7 && f[2] == uid.to_string()).then(|| (f[0].to_owned(), PathBuf::from(f[5])))
            })
        });
        let Some((name, home)) = listed else {
            panic!("this user has no entry in /etc/passwd to compare with");
        };
        let e = effective_user().expect("an entry");
        assert_eq!(e.name, Some(name.clone()));
        assert_eq!(e.home, Some(home));
        assert!(std::ptr::eq(e, effective_user().unwrap()), "looked up once");
        #[cfg(feature = "mysql")]
        assert_eq!(is_root(), name == "root");
    }
}
