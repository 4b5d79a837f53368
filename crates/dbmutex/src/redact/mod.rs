//! Connection strings in messages: described, never echoed.
//!
//! dbmutex never prints a connection string as it was given, redacted or
//! not. [`redact_url`] rebuilds a description — `postgres://user@host:port/db`
//! — from the fields the driver's own parser read out of the string
//! (tokio-postgres's `Config`, mysql_async's `Opts`), so neither the
//! password nor any query parameter (`password=`, `sslpassword=`, …, in any
//! case) can reach a message: they are simply never copied. A string the
//! parser rejects, or one it would read differently from what the user
//! meant, is shown as its scheme and `<unparseable connection string>` only.
//!
//! "Read differently" is the dangerous case: in `mysql://u:pa/SECRET@h/db`
//! the URL grammar ends the host at the first `/`, so `SECRET@h/db` would
//! become the path (and the database name the server echoes back in its
//! "unknown database" error, and logs). [`check()`] refuses such strings
//! before anything connects, naming the characters to percent-encode:
//!
//! - PostgreSQL (tokio-postgres takes the user-info up to the *first* `@`):
//!   a second `@`, or a `?` before the first `@` (dbmutex reads the query
//!   string from the first `?`).
//! - MySQL/MariaDB (the WHATWG URL grammar ends the authority at the first
//!   `/`, `?` or `#`): an `@` after that point.
//!
//! Driver errors about a malformed string are reworded by [`pg_reason`] and
//! [`mysql_reason`], which keep only the driver's fixed texts and option
//! names, never a value (mysql_async's "Invalid value `...`" quotes it).

mod check;
mod describe;
mod etcd;
#[cfg(feature = "mysql")]
mod mysql_locate;
#[cfg(feature = "mysql")]
mod option_file;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod passwd;
#[cfg(feature = "postgres")]
mod pg_locate;
#[cfg(feature = "postgres")]
mod pg_service;
mod reasons;
mod scheme;

use percent_encoding::utf8_percent_encode;

use crate::types::split_scheme;
use crate::types::BackendKind;
#[cfg(feature = "mysql")]
pub(crate) use mysql_locate::{mysql_default_host, mysql_socket_param};
#[cfg(feature = "mysql")]
pub(crate) use option_file::{client_option, option_file};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use passwd::effective_user;
#[cfg(feature = "mysql")]
pub(crate) use passwd::is_root;
#[cfg(feature = "postgres")]
pub(crate) use pg_locate::{pg_default_host, pg_default_server, pg_locate};
#[cfg(feature = "postgres")]
pub(crate) use pg_service::{from_service, layered, pg_service};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use scheme::read_credentials_file;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use scheme::with_scheme;
use scheme::PATH;
pub(crate) use scheme::{file_url_path, UNPARSEABLE};

pub(crate) use check::check;
#[cfg(feature = "postgres")]
pub(crate) use describe::describe_pg_config;
use describe::{describe_key_value, describe_mysql_url, describe_pg_url};
use etcd::describe_etcd_url;
#[cfg(feature = "etcd")]
pub(crate) use etcd::{parse_etcd, EtcdUrl};
#[cfg(feature = "mysql")]
pub(crate) use reasons::mysql_reason;
#[cfg(feature = "postgres")]
pub(crate) use reasons::pg_reason;

/// A description of the database a connection string names, for messages:
/// `postgres://user@host:port/db`, `mysql://user@host:port/db`,
/// `file:///lock/dir`, `etcd://host:2379,host:2379/root`, or for libpq `key=value` strings
/// `host=… port=… user=… dbname=…`. Built from the fields the driver's
/// parser read, so it never contains a password or any query parameter,
/// whatever characters (`/ ? # @ %`, quotes, spaces) the password holds. A
/// string that does not parse, or would parse ambiguously, is shown as
/// `scheme://<unparseable connection string>` (or without the scheme, when
/// there is none). An unknown scheme is shown as `scheme://…`.
///
/// (The name is historical: the result is not the URL with the password
/// cut out, but a description rebuilt from parsed fields.)
pub fn redact_url(url: &str) -> String {
    match split_scheme(url) {
        Some((scheme, rest)) => match BackendKind::from_scheme(&scheme) {
            Some(BackendKind::Postgres) => match describe_pg_url(rest) {
                Some(d) => format!("{scheme}://{d}"),
                None => format!("{scheme}://{UNPARSEABLE}"),
            },
            Some(BackendKind::Mysql) => match describe_mysql_url(rest) {
                Some(d) => format!("{scheme}://{d}"),
                None => format!("{scheme}://{UNPARSEABLE}"),
            },
            Some(BackendKind::Local) => match file_url_path(url) {
                Ok(path) => format!("file://{}", utf8_percent_encode(&path, PATH)),
                Err(_) => format!("file://{UNPARSEABLE}"),
            },
            Some(BackendKind::Etcd) => match describe_etcd_url(rest) {
                Some(d) => format!("{scheme}://{d}"),
                None => format!("{scheme}://{UNPARSEABLE}"),
            },
            None => format!("{scheme}://…"),
        },
        None => describe_key_value(url).unwrap_or_else(|| UNPARSEABLE.to_owned()),
    }
}

#[cfg(all(test, feature = "postgres", feature = "mysql"))]
mod tests {
    use super::*;

    #[test]
    fn file_urls() {
        assert_eq!(file_url_path("file:///tmp/x").unwrap(), "/tmp/x");
        assert_eq!(file_url_path("file://localhost/tmp/x").unwrap(), "/tmp/x");
        assert_eq!(file_url_path("file:///tmp/a%20b").unwrap(), "/tmp/a b");
        assert_eq!(file_url_path("file:///tmp/100%").unwrap(), "/tmp/100%");
        assert_eq!(file_url_path("file:///tmp/%é").unwrap(), "/tmp/%é");
        assert!(file_url_path("file://relative").is_err());
    }
}
