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
//! "unknown database" error, and logs). [`check`] refuses such strings before
//! anything connects, naming the characters to percent-encode:
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

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::fmt::Write as _;

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use crate::{Error, Result};

/// What a description shows in place of a string that cannot be shown.
pub(crate) const UNPARSEABLE: &str = "<unparseable connection string>";

/// Characters escaped in the user, host and database names a description
/// shows, so that a description can never be mistaken for a longer one (or
/// forge a second line of output).
const FIELD: &AsciiSet = &CONTROLS
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
const PATH: &AsciiSet = &FIELD.remove(b'/');

/// As [`FIELD`], but keeping `:` (IPv6 addresses, shown in brackets).
#[cfg(any(feature = "postgres", feature = "mysql"))]
const IPV6: &AsciiSet = &FIELD.remove(b':');

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn enc(s: &str) -> String {
    utf8_percent_encode(s, FIELD).to_string()
}

/// A description of the database a connection string names, for messages:
/// `postgres://user@host:port/db`, `mysql://user@host:port/db`,
/// `file:///lock/dir`, or for libpq `key=value` strings
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
        Some((scheme, rest)) => match scheme.as_str() {
            "postgres" | "postgresql" => match describe_pg_url(rest) {
                Some(d) => format!("{scheme}://{d}"),
                None => format!("{scheme}://{UNPARSEABLE}"),
            },
            "mysql" | "mariadb" => match describe_mysql_url(rest) {
                Some(d) => format!("{scheme}://{d}"),
                None => format!("{scheme}://{UNPARSEABLE}"),
            },
            "file" => match file_url_path(url) {
                Ok(path) => format!("file://{}", utf8_percent_encode(&path, PATH)),
                Err(_) => format!("file://{UNPARSEABLE}"),
            },
            _ => format!("{scheme}://…"),
        },
        None => describe_key_value(url).unwrap_or_else(|| UNPARSEABLE.to_owned()),
    }
}

/// The URL's scheme, lowercased, and what follows `://`; `None` unless the
/// text before `://` is a well-formed scheme (RFC 3986: a letter, then
/// letters, digits, `+`, `-`, `.`), so a malformed string's text is never
/// shown as its "scheme".
pub(crate) fn split_scheme(url: &str) -> Option<(String, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && scheme.len() <= 32;
    ok.then(|| (scheme.to_ascii_lowercase(), rest))
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
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).map_err(|_| Error::Config("a file URL's path is not UTF-8 once decoded".into()))
}

/// Refuses, before anything connects, a database URL that the driver would
/// read differently from what its author meant (see the module docs), so a
/// misplaced password is never sent to a server as a host or database name.
/// The error shows no part of the URL beyond its scheme.
pub(crate) fn check(url: &str) -> Result<()> {
    let Some((scheme, rest)) = split_scheme(url) else {
        return Ok(());
    };
    let why = match scheme.as_str() {
        "postgres" | "postgresql" => pg_ambiguity(rest),
        "mysql" | "mariadb" => mysql_ambiguity(rest),
        _ => None,
    };
    match why {
        Some(why) => Err(Error::Config(format!("{scheme}://{UNPARSEABLE}: {why}"))),
        None => Ok(()),
    }
}

fn pg_ambiguity(rest: &str) -> Option<&'static str> {
    let at = rest.find('@')?;
    if rest[at + 1..].contains('@') {
        return Some("more than one '@': percent-encode '@' in the user name, password or parameters as %40");
    }
    if rest[..at].contains('?') {
        return Some(
            "a '?' comes before the '@': percent-encode '?' in the user name or password as %3F \
             (and '@' in parameters as %40)",
        );
    }
    None
}

fn mysql_ambiguity(rest: &str) -> Option<&'static str> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    rest[end..].contains('@').then_some(
        "an '@' follows a '/', '?' or '#': percent-encode '/', '?' and '#' in the user name or \
         password (%2F, %3F, %23), and '@' in the path or parameters (%40)",
    )
}

/// The part of a `postgres://` URL after the scheme that describes the
/// target: the URL up to its query string, plus those query parameters
/// that name the target (`host`, `hostaddr`, `port`, `user`, `dbname`).
/// Everything else — `password`, `sslpassword`, `options`, unknown keys —
/// is dropped before parsing, so it cannot reach the description. `None`
/// if ambiguous.
#[cfg(feature = "postgres")]
fn pg_target_only(rest: &str) -> Option<String> {
    if pg_ambiguity(rest).is_some() {
        return None;
    }
    let from = rest.find('@').map_or(0, |i| i + 1);
    let (base, query) = match rest[from..].find('?') {
        Some(q) => (&rest[..from + q], &rest[from + q + 1..]),
        None => (rest, ""),
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            let key = kv.split('=').next().unwrap_or_default();
            matches!(key, "host" | "hostaddr" | "port" | "user" | "dbname")
        })
        .collect();
    Some(format!("postgres://{base}?{}", kept.join("&")))
}

#[cfg(feature = "postgres")]
fn describe_pg_url(rest: &str) -> Option<String> {
    let config: tokio_postgres::Config = pg_target_only(rest)?.parse().ok()?;
    Some(describe_pg_config(&config))
}

#[cfg(not(feature = "postgres"))]
fn describe_pg_url(_rest: &str) -> Option<String> {
    None
}

/// `user@host:port,host2:port2/db` from a parsed configuration (its
/// password is never read).
#[cfg(feature = "postgres")]
pub(crate) fn describe_pg_config(c: &tokio_postgres::Config) -> String {
    let mut out = String::new();
    if let Some(u) = c.get_user() {
        let _ = write!(out, "{}@", enc(u));
    }
    let hosts: Vec<String> = pg_hosts(c).iter().map(|(h, p)| format!("{h}:{p}")).collect();
    out.push_str(&hosts.join(","));
    if let Some(db) = c.get_dbname() {
        let _ = write!(out, "/{}", enc(db));
    }
    out
}

/// Each host the configuration names (escaped; IPv6 in brackets) with its port.
#[cfg(feature = "postgres")]
fn pg_hosts(c: &tokio_postgres::Config) -> Vec<(String, u16)> {
    use tokio_postgres::config::Host;
    let ports = c.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let mut hosts: Vec<(String, u16)> = c
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let shown = match h {
                Host::Tcp(h) if h.contains(':') => format!("[{}]", utf8_percent_encode(h, IPV6)),
                Host::Tcp(h) => enc(h),
                #[cfg(unix)]
                Host::Unix(p) => utf8_percent_encode(&p.to_string_lossy(), PATH).to_string(),
            };
            (shown, port(i))
        })
        .collect();
    if hosts.is_empty() {
        hosts = c
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                std::net::IpAddr::V6(a) => (format!("[{a}]"), port(i)),
                std::net::IpAddr::V4(a) => (a.to_string(), port(i)),
            })
            .collect();
    }
    hosts
}

/// A libpq `key=value` string (which tokio-postgres accepts), described as
/// `host=… port=… user=… dbname=…` from tokio-postgres's parse of it.
#[cfg(feature = "postgres")]
fn describe_key_value(s: &str) -> Option<String> {
    if !s.contains('=') {
        return None;
    }
    let c: tokio_postgres::Config = s.parse().ok()?;
    let mut parts = Vec::new();
    let hosts = pg_hosts(&c);
    if !hosts.is_empty() {
        let names: Vec<&str> = hosts.iter().map(|(h, _)| h.as_str()).collect();
        let ports: Vec<String> = hosts.iter().map(|(_, p)| p.to_string()).collect();
        parts.push(format!("host={} port={}", names.join(","), ports.join(",")));
    }
    if let Some(u) = c.get_user() {
        parts.push(format!("user={}", enc(u)));
    }
    if let Some(db) = c.get_dbname() {
        parts.push(format!("dbname={}", enc(db)));
    }
    if parts.is_empty() {
        parts.push("(no host, user or dbname)".into());
    }
    Some(parts.join(" "))
}

#[cfg(not(feature = "postgres"))]
fn describe_key_value(_s: &str) -> Option<String> {
    None
}

#[cfg(feature = "mysql")]
fn describe_mysql_url(rest: &str) -> Option<String> {
    if mysql_ambiguity(rest).is_some() {
        return None;
    }
    // Parameters do not name the target: parse without them.
    let base = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    let opts = mysql_async::Opts::from_url(&format!("mysql://{base}")).ok()?;
    let mut out = String::new();
    if let Some(u) = opts.user() {
        let _ = write!(out, "{}@", enc(u));
    }
    let host = opts.ip_or_hostname();
    if host.contains(':') {
        let _ = write!(out, "[{}]", utf8_percent_encode(host, IPV6));
    } else {
        out.push_str(&enc(host));
    }
    let _ = write!(out, ":{}", opts.tcp_port());
    if let Some(db) = opts.db_name() {
        let _ = write!(out, "/{}", enc(db));
    }
    Some(out)
}

#[cfg(not(feature = "mysql"))]
fn describe_mysql_url(_rest: &str) -> Option<String> {
    None
}

/// Why tokio-postgres rejected a connection string, in words that quote
/// nothing from it: option names it knows (`invalid value for option
/// `port``) and its fixed texts; an unknown option's name, a character it
/// tripped on and UTF-8 details are left out.
#[cfg(feature = "postgres")]
pub(crate) fn pg_reason(e: &tokio_postgres::Error) -> String {
    let Some(cause) = std::error::Error::source(e) else {
        return e.to_string();
    };
    let text = cause.to_string();
    let why = if text.starts_with("invalid value for option `") {
        // The option name is a `&'static str` inside tokio-postgres.
        text.as_str()
    } else if text.starts_with("unknown option `") {
        "an unknown option"
    } else if text.starts_with("unexpected character") {
        "an unexpected character"
    } else if matches!(
        text.as_str(),
        "unexpected EOF" | "unterminated quoted connection parameter value" | "unterminated parameter"
    ) {
        text.as_str()
    } else {
        "malformed (bad percent-encoding or UTF-8?)"
    };
    format!("{e}: {why}")
}

/// Why mysql_async rejected a URL, without the values it quotes.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_reason(e: &mysql_async::UrlError) -> String {
    use mysql_async::UrlError as U;
    match e {
        // The parameter names in these come from mysql_async's own table.
        U::FeatureRequired { .. } | U::InvalidPoolConstraints { .. } | U::Invalid => e.to_string(),
        U::InvalidParamValue { param, .. } => format!("invalid value for URL parameter `{param}`"),
        // url::ParseError's texts are fixed ("invalid port number").
        U::Parse(p) => format!("URL parse error: {p}"),
        U::UnknownParameter { .. } => "an unknown URL parameter".into(),
        U::UnsupportedScheme { .. } => "unsupported URL scheme".into(),
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

    #[test]
    fn descriptions() {
        let cases = [
            ("postgres://u:secret@h/db", "postgres://u@h:5432/db"),
            ("postgresql://u:secret@h:6432/db", "postgresql://u@h:6432/db"),
            ("POSTGRES://u:secret@h", "postgres://u@h:5432"),
            ("postgres://u:pa/secret@h/db", "postgres://u@h:5432/db"),
            ("postgres://u:pa#secret@h/db", "postgres://u@h:5432/db"),
            ("postgres://u:pa%2Fse%40cret@h/db", "postgres://u@h:5432/db"),
            (
                "postgres://h/db?sslmode=require&password=secret&PASSWORD=secret&sslpassword=secret",
                "postgres://h:5432/db",
            ),
            (
                "postgres:///db?user=me&host=h&port=7&options=-csecret",
                "postgres://me@h:7/db",
            ),
            ("postgres://a,b:6/db", "postgres://a:5432,b:6/db"),
            ("postgres://[::1]:5/db", "postgres://[::1]:5/db"),
            (
                "postgres:///db?host=/run/postgresql",
                "postgres:///run/postgresql:5432/db",
            ),
            (
                "postgres://u:p@ss@h/db",
                "postgres://<unparseable connection string>",
            ),
            (
                "postgres://u:pa?x=secret@h/db",
                "postgres://<unparseable connection string>",
            ),
            (
                "postgres://u:secret@h/db?port=x",
                "postgres://<unparseable connection string>",
            ),
            ("mysql://u:secret@h:3306/db?x=1", "mysql://u@h:3306/db"),
            ("mariadb://u:p@ss@h/db", "mariadb://u@h:3306/db"),
            (
                "mysql://u:pa/secret@h/db",
                "mysql://<unparseable connection string>",
            ),
            (
                "mysql://u:pa#secret@h/db",
                "mysql://<unparseable connection string>",
            ),
            ("mysql://u:pa%2Fsecret@h/db", "mysql://u@h:3306/db"),
            ("mysql://u:secret@h/db?pool_min=secret", "mysql://u@h:3306/db"),
            (
                "mysql://u:secret@h:x/db",
                "mysql://<unparseable connection string>",
            ),
            ("file:///tmp/a%20b", "file:///tmp/a%20b"),
            ("file://u:secret@h/x", "file://<unparseable connection string>"),
            ("nosuch://u:secret@h/db", "nosuch://…"),
            ("u:secret@h/db", UNPARSEABLE),
            (
                "host=h port=5 user=u password=secret dbname=d",
                "host=h port=5 user=u dbname=d",
            ),
            ("host=h password='se cret' user=u", "host=h port=5432 user=u"),
            ("host=a,b port=1 sslpassword=secret", UNPARSEABLE),
            ("host=a,b port=1 password=secret", "host=a,b port=1,1"),
            ("host=h password=se cret", UNPARSEABLE),
            ("secret", UNPARSEABLE),
            ("", UNPARSEABLE),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn ambiguous_urls_are_refused_without_echo() {
        for url in [
            "postgres://u:p@ss@h/db",
            "postgres://u:pa?sslmode=secret@h/db",
            "postgres://h/db?user=a@secret",
            "mysql://u:pa/secret@h/db",
            "mariadb://u:pa?secret@h/db",
            "mysql://u:pa#secret@h/db",
        ] {
            let e = check(url).expect_err(url);
            let text = format!("{e} {e:?}");
            assert!(!text.contains("secret") && !text.contains("ss@"), "{text}");
            assert!(text.contains("percent-encode"), "{text}");
        }
        for url in [
            "postgres://u:pa/se#cret@h/db",
            "postgres://u:secret@h/db?x=1",
            "mysql://u:p@ss@h/db",
            "mysql://u:pa%2Fss@h/db",
            "file:///x",
            "host=h password=x",
        ] {
            check(url).expect(url);
        }
    }

    #[test]
    fn driver_reasons_quote_nothing() {
        // How many of the drivers' own texts quote the secret: why they are
        // reworded rather than shown.
        let mut raw_quotes = 0;
        for s in [
            "postgres://u:x@h/db?secret=1",
            "postgres://u:x@h:secret/db",
            "postgres://u:x@h/db?sslmode=secret",
            "host=h secret",
            "host=h password='secret",
            "postgres://u:x@h/%ff%fesecret",
        ] {
            let e = s.parse::<tokio_postgres::Config>().expect_err(s);
            raw_quotes += usize::from(format!("{e} {:?}", std::error::Error::source(&e)).contains("secret"));
            let why = pg_reason(&e);
            assert!(!why.contains("secret"), "{s}: {why}");
        }
        for s in [
            "mysql://u:x@h/db?secret=1",
            "mysql://u:x@h/db?pool_min=secret",
            "mysql://u:x@h:secret/db",
            "mysql://u:x@[secret/db",
        ] {
            let e = mysql_async::Opts::from_url(s).expect_err(s);
            raw_quotes += usize::from(e.to_string().contains("secret"));
            let why = mysql_reason(&e);
            assert!(!why.contains("secret"), "{s}: {why}");
        }
        assert!(raw_quotes >= 3, "the drivers quote values: {raw_quotes}");
    }
}
