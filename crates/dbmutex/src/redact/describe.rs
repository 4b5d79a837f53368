//! Descriptions rebuilt from the fields a driver's parser read, and the
//! drivers' own parse errors reworded so that they quote no value.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::fmt::Write as _;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use percent_encoding::{utf8_percent_encode, AsciiSet};

#[cfg(feature = "mysql")]
use super::check::mysql_ambiguity;
#[cfg(feature = "postgres")]
use super::check::pg_ambiguity;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::scheme::FIELD;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::scheme::PATH;

/// As [`FIELD`], but keeping `:` (IPv6 addresses, shown in brackets).
#[cfg(any(feature = "postgres", feature = "mysql"))]
const IPV6: &AsciiSet = &FIELD.remove(b':');

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn enc(s: &str) -> String {
    utf8_percent_encode(s, FIELD).to_string()
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
            matches!(key, "host" | "hostaddr" | "port" | "user" | "dbname" | "service")
        })
        .collect();
    Some(format!("postgres://{base}?{}", kept.join("&")))
}

#[cfg(feature = "postgres")]
pub(super) fn describe_pg_url(rest: &str) -> Option<String> {
    // What the URL leaves out as the connection fills it in: libpq's
    // environment, else its default socket directory.
    let target = pg_target_only(rest)?;
    let (base, query) = target.split_once('?').unwrap_or((&target, ""));
    let params: Vec<&str> = query.split('&').filter(|kv| !kv.is_empty()).collect();
    let env = |k: &str| std::env::var(k).ok();
    // A service found nowhere: described without it (the error says so).
    let service = super::pg_service(&params, &env).unwrap_or(None);
    let kept: Vec<&str> = params
        .into_iter()
        .filter(|kv| !kv.starts_with("service="))
        .collect();
    let filled = super::pg_locate(base, &kept, super::layered(&service, env)).ok()?;
    let mut config: tokio_postgres::Config = filled.parse().ok()?;
    super::pg_default_host(&mut config);
    Some(describe_pg_config(&config))
}

#[cfg(not(feature = "postgres"))]
pub(super) fn describe_pg_url(_rest: &str) -> Option<String> {
    None
}

/// `user@host:port,host2:port2/db` from a parsed configuration (its
/// password is never read), with `?hostaddr=a,b` where addresses are
/// dialed in the hosts' place (the hosts then only name the servers, for
/// TLS and the password file).
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
    if !c.get_hosts().is_empty() && !c.get_hostaddrs().is_empty() {
        let addrs: Vec<String> = c.get_hostaddrs().iter().map(ToString::to_string).collect();
        let _ = write!(out, "?hostaddr={}", addrs.join(","));
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
pub(super) fn describe_key_value(s: &str) -> Option<String> {
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
pub(super) fn describe_key_value(_s: &str) -> Option<String> {
    None
}

#[cfg(feature = "mysql")]
pub(super) fn describe_mysql_url(rest: &str) -> Option<String> {
    if mysql_ambiguity(rest).is_some() {
        return None;
    }
    // No host: the local socket, as the connection goes (its path is the
    // one parameter that names the target; the others are dropped).
    let url = super::mysql_default_host(&format!("mysql://{rest}"))?.into_owned();
    let socket = super::mysql_socket_param(&url);
    let rest = &url["mysql://".len()..];
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
    if let Some(path) = socket {
        let _ = write!(out, "?socket={}", utf8_percent_encode(&path, PATH));
    }
    Some(out)
}

#[cfg(not(feature = "mysql"))]
pub(super) fn describe_mysql_url(_rest: &str) -> Option<String> {
    None
}

#[cfg(all(test, feature = "postgres", feature = "mysql"))]
mod tests {
    use crate::redact::{redact_url, UNPARSEABLE};

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
            (
                "postgres://u:secret@db.example/db?hostaddr=127.0.0.2",
                "postgres://u@db.example:5432/db?hostaddr=127.0.0.2",
            ),
            ("postgres:///db?hostaddr=::1", "postgres://[::1]:5432/db"),
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
                "mysql://u:secret@h/db?socket=/run/my%20sql.sock&pool_min=secret",
                "mysql://u@h:3306/db?socket=/run/my%20sql.sock",
            ),
            (
                "mysql://u:secret@/db?socket=%2Fs",
                "mysql://u@localhost:3306/db?socket=/s",
            ),
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

    /// A PostgreSQL URL with no host is described with the socket
    /// directory it goes to.
    #[cfg(unix)]
    #[test]
    fn a_url_without_a_host_shows_where_it_goes() {
        let dir = match std::path::Path::new("/var/run/postgresql").is_dir() {
            true => "/var/run/postgresql",
            false => "/tmp",
        };
        assert_eq!(
            redact_url("postgres://u:secret@/db"),
            format!("postgres://u@{dir}:5432/db")
        );
        assert_eq!(
            redact_url("postgres://u:pa/secret@:6543/db"),
            format!("postgres://u@{dir}:6543/db")
        );
        assert_eq!(
            redact_url("postgres://u:secret@:5/db?host=h"),
            "postgres://u@:5,h:5/db"
        );
    }
}
