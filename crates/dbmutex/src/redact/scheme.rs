//! URL schemes, and the character sets descriptions escape: what every
//! part of [`super`] shares.

use std::borrow::Cow;

use percent_encoding::{percent_decode_str, AsciiSet, CONTROLS};

use crate::{Error, Result};

/// What a description shows in place of a string that cannot be shown.
pub(crate) const UNPARSEABLE: &str = "<unparseable connection string>";

/// Characters escaped in the user, host and database names a description
/// shows, so that a description can never be mistaken for a longer one (or
/// forge a second line of output).
pub(super) const FIELD: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'\'')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'/')
    .add(b':')
    .add(b';')
    .add(b'<')
    .add(b'>')
    .add(b'=')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}')
    .add(b',')
    .add(b'+');

/// As [`FIELD`], but keeping `/` (Unix socket directories).
pub(super) const PATH: &AsciiSet = &FIELD.remove(b'/');

/// `url` with its scheme replaced by `scheme` (the drivers know only their
/// own, lowercase spelling: `POSTGRES://` and `mariadb://` must reach them
/// as `postgres://` and `mysql://`). Unchanged when `url` has no scheme.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn with_scheme(url: &str, scheme: &str) -> String {
    match crate::types::split_scheme(url) {
        Some((_, rest)) => format!("{scheme}://{rest}"),
        None => url.to_owned(),
    }
}

/// The path of a `file://` URL: `file:///dir` or `file://localhost/dir`,
/// with `%XX` escapes decoded. Errors do not quote the URL.
pub(crate) fn file_url_path(url: &str) -> Result<String> {
    let rest = url.get("file://".len()..).unwrap_or_default();
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return Err(Error::Config(
            "a file URL must name an absolute path: file:///path/to/lock/dir".into(),
        ));
    }
    percent_decode_str(rest)
        .decode_utf8()
        .map(Cow::into_owned)
        .map_err(|_| Error::Config("a file URL's path is not UTF-8 once decoded".into()))
}

/// A file of credentials a database client reads (libpq's password file,
/// MySQL's option file): its text, if it is a regular file whose mode has
/// none of the `forbidden` bits (on Unix) — else `None`, with a warning
/// (`ignored` says why; once per file and process), as the clients ignore such a file.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn read_credentials_file(file: &std::path::Path, forbidden: u32, ignored: &str) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & forbidden != 0 {
            // Once per file and process: a locker reads it at each
            // connect, and a reconnecting waiter would repeat itself.
            static WARNED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
            let first = {
                let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let first = !warned.iter().any(|w| w == file);
                if first {
                    warned.push(file.to_owned());
                }
                first
            };
            // Told outside the lock: a subscriber may describe a URL,
            // which reads the option file again.
            if first {
                tracing::warn!(file = %file.display(), "dbmutex: {ignored}");
            }
            return None;
        }
    }
    #[cfg(not(unix))]
    let _ = (forbidden, ignored);
    // Bytes, as the clients read them: a Latin-1 comment must not make the
    // whole file (and what it includes) vanish.
    std::fs::read(file)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}
