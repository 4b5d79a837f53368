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

/// Where the MySQL and MariaDB clients go when a URL names no host
/// (`mysql://root@/db`, which mysql_async refuses: "empty host"): the
/// local server's Unix socket. Debian's and Ubuntu's
/// `/var/run/mysqld/mysqld.sock` (`/run/mysqld/mysqld.sock` where
/// `/var/run` is not there) wherever its directory exists (a socket missing
/// there, as while the server restarts, is not looked for in `/tmp`, where
/// any local user could put one), else upstream MySQL's `/tmp/mysql.sock`.
#[cfg(all(feature = "mysql", unix))]
const MYSQL_SOCKETS: [&str; 3] = [
    "/var/run/mysqld/mysqld.sock",
    "/run/mysqld/mysqld.sock",
    "/tmp/mysql.sock",
];

/// The local server's socket, as [`MYSQL_SOCKETS`] says.
#[cfg(all(feature = "mysql", unix))]
fn mysql_socket() -> &'static str {
    MYSQL_SOCKETS
        .into_iter()
        .find(|p| {
            std::path::Path::new(p)
                .parent()
                .is_some_and(std::path::Path::is_dir)
        })
        .unwrap_or(MYSQL_SOCKETS[0])
}

/// The `socket` parameter of a `mysql://` URL, as mysql_async reads it
/// (form-encoded, the last one wins, nothing after a `#`).
#[cfg(feature = "mysql")]
pub(crate) fn mysql_socket_param(url: &str) -> Option<String> {
    let url = &url[..url.find('#').unwrap_or(url.len())];
    let decode = |s: &str| {
        percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    url.split_once('?')?
        .1
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .rfind(|(k, _)| decode(k) == "socket")
        .map(|(_, v)| decode(v))
}

/// `url` (`mysql://…`) with an empty host made `localhost` and, unless the
/// URL names a `socket`, the local server's socket ([`MYSQL_SOCKETS`])
/// added, as the MySQL clients read a missing host. Unchanged when it
/// names a host (off Unix: `localhost` only). `None` for a port with no
/// host (`mysql://root@:3307/db`): the clients would go to the socket and
/// ignore the port, the server a TCP URL with that port reaches may be
/// another, and a lock taken on each would exclude nothing.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_default_host(url: &str) -> Option<Cow<'_, str>> {
    let Some(at) = url.find("://").map(|i| i + 3) else {
        return Some(url.into());
    };
    let end = url[at..].find(['/', '?', '#']).map_or(url.len(), |i| at + i);
    let host_at = url[at..end].rfind('@').map_or(at, |i| at + i + 1);
    if url[host_at..end].starts_with(':') {
        return None;
    }
    if host_at != end {
        return Some(url.into());
    }
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut out = format!("{}localhost{}", &url[..host_at], &url[host_at..]);
    #[cfg(unix)]
    if mysql_socket_param(&out).is_none() {
        let fragment = out.find('#').unwrap_or(out.len());
        let sep = if out[..fragment].contains('?') { "&" } else { "?" };
        out.insert_str(fragment, &format!("{sep}socket={}", mysql_socket()));
    }
    Some(out.into())
}

/// A file of credentials a database client reads (libpq's password file,
/// MySQL's option file): its text, if it is a regular file whose mode has
/// none of the `forbidden` bits (on Unix) — else `None`, with a warning
/// (`ignored` says why), as the clients ignore such a file.
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
            tracing::warn!(file = %file.display(), "dbmutex: {ignored}");
            return None;
        }
    }
    #[cfg(not(unix))]
    let _ = (forbidden, ignored);
    std::fs::read_to_string(file).ok()
}

#[cfg(all(test, unix, feature = "mysql"))]
mod tests {
    use super::*;

    #[test]
    fn a_mysql_url_without_a_host_goes_to_the_local_socket() {
        let socket = if std::path::Path::new("/var/run/mysqld").is_dir() {
            "/var/run/mysqld/mysqld.sock"
        } else if std::path::Path::new("/run/mysqld").is_dir() {
            "/run/mysqld/mysqld.sock"
        } else {
            "/tmp/mysql.sock"
        };
        assert_eq!(mysql_socket(), socket);
        for (url, want) in [
            (
                "mysql://root@/test",
                format!("mysql://root@localhost/test?socket={socket}"),
            ),
            ("mysql:///test", format!("mysql://localhost/test?socket={socket}")),
            (
                "mysql://u:p%40ss@/test?x=1#f",
                format!("mysql://u:p%40ss@localhost/test?x=1&socket={socket}#f"),
            ),
            (
                "mysql://root@/test?socket=/s",
                "mysql://root@localhost/test?socket=/s".into(),
            ),
            (
                "mysql://root@/test?soc%6Bet=/s",
                "mysql://root@localhost/test?soc%6Bet=/s".into(),
            ),
            ("mysql://root@h/test", "mysql://root@h/test".into()),
            ("mysql://root@h:3306", "mysql://root@h:3306".into()),
        ] {
            assert_eq!(mysql_default_host(url).as_deref(), Some(want.as_str()), "{url}");
        }
        // A port with no host is refused, not sent to the socket.
        assert_eq!(mysql_default_host("mysql://root@:3307/test"), None);
        assert_eq!(mysql_default_host("mysql://:3307"), None);
    }

    #[test]
    fn the_socket_parameter_is_read_as_mysql_async_reads_it() {
        assert_eq!(mysql_socket_param("mysql://h/db"), None);
        assert_eq!(
            mysql_socket_param("mysql://h/db?socket=/a&socket=/b").as_deref(),
            Some("/b")
        );
        assert_eq!(
            mysql_socket_param("mysql://h/db?socket=%2Fmy+sock").as_deref(),
            Some("/my sock")
        );
        assert_eq!(mysql_socket_param("mysql://h/db#x?socket=/s"), None);
        assert_eq!(mysql_socket_param("mysql://h/db?x=1#socket=/s"), None);
    }
}
