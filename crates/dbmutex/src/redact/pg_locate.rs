//! Where a PostgreSQL URL goes, as libpq reads it: libpq's environment for
//! what the URL leaves out, and its default socket for a URL that names no
//! server. The connection (`Connector::from_url`) and its description
//! (`describe_pg_url`) both go through [`pg_locate`], so they cannot part.

use std::borrow::Cow;

/// libpq's default server, where a URL names none: the Unix socket
/// directory it was built with. Debian's, Ubuntu's and Red Hat's packages
/// use `/var/run/postgresql`, upstream uses `/tmp`: so `/var/run/postgresql`
/// wherever that directory exists (a socket missing there, as while the
/// server restarts, is not looked for in `/tmp`, where any local user could
/// put one), else `/tmp`; `localhost` where there are no Unix sockets.
pub(crate) fn pg_default_server() -> &'static str {
    if cfg!(unix) {
        const DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];
        DIRS.into_iter()
            .find(|d| std::path::Path::new(d).is_dir())
            .unwrap_or(DIRS[0])
    } else {
        "localhost"
    }
}

/// A configuration that names no server (no host, no hostaddr: which
/// tokio-postgres would refuse) gets [`pg_default_server`].
pub(crate) fn pg_default_host(config: &mut tokio_postgres::Config) {
    if !config.get_hosts().is_empty() || !config.get_hostaddrs().is_empty() {
        return;
    }
    #[cfg(unix)]
    config.host_path(pg_default_server());
    #[cfg(not(unix))]
    config.host(pg_default_server());
}

/// The parts of a URL after `scheme://` as tokio-postgres reads them: the
/// user part (with its '@', ending at the first '@': a password may hold a
/// '/'), the host list (to the next '/' or '?') and the rest.
fn url_parts(rest: &str) -> (&str, &str, &str) {
    let (user, after) = rest.split_at(rest.find('@').map_or(0, |i| i + 1));
    let (hosts, path) = after.split_at(after.find(['/', '?']).unwrap_or(after.len()));
    (user, hosts, path)
}

/// How many of the parameters `query` are named `key`.
fn count_of(query: &[&str], key: &str) -> usize {
    query
        .iter()
        .filter(|kv| kv.split('=').next() == Some(key))
        .count()
}

/// `base` (a URL before its query, `query` its parameters) with each empty
/// host of its host list (`postgres://user@:6543/db`, `@,other:5433`:
/// tokio-postgres reads an empty host as a TCP host named "") replaced by
/// [`pg_default_server`], percent-encoded, as libpq reads an empty host.
/// Unchanged where a `host` or `hostaddr` parameter names the server (they
/// take the URL's place in libpq), and where there is no host list at all
/// ([`pg_default_host`] then applies).
fn pg_fill_empty_hosts<'a>(base: &'a str, query: &[&str]) -> Cow<'a, str> {
    let Some((scheme, rest)) = base.split_once("://") else {
        return base.into();
    };
    if count_of(query, "host") + count_of(query, "hostaddr") > 0 {
        return base.into();
    }
    let (user, hosts, path) = url_parts(rest);
    let empty = |h: &str| h.is_empty() || h.starts_with(':');
    if hosts.is_empty() || !hosts.split(',').any(empty) {
        return base.into();
    }
    let server = pg_default_server().replace('/', "%2F");
    let filled: Vec<String> = hosts
        .split(',')
        .map(|h| {
            if empty(h) {
                format!("{server}{h}")
            } else {
                h.to_owned()
            }
        })
        .collect();
    format!("{scheme}://{user}{}{path}", filled.join(",")).into()
}

/// Where a PostgreSQL URL goes, as libpq reads it: what the URL leaves out
/// is taken from libpq's environment, then each empty host is libpq's
/// default socket directory ([`pg_fill_empty_hosts`]). `base` is the URL
/// before its query, `query` its parameters, `env` reads an environment
/// variable (`std::env::var` but in tests); the answer is the whole URL.
///
/// From the environment, as libpq takes it (an empty value counts as
/// unset), each only where neither the URL nor a parameter says it:
/// `PGHOST` (a list; a directory is a Unix socket's) where the URL names
/// no host; `PGHOSTADDR` (the address dialed, one per host); `PGPORT` (one
/// port for all hosts, or one each) where the port is unset as libpq reads
/// the URL (one host with no port or an empty one; never for a host list,
/// whose ports libpq reads comma for comma); `PGUSER`; `PGDATABASE`;
/// `PGTARGETSESSIONATTRS`. So
/// `postgres:///db` goes where `psql` goes in the same environment: the
/// lock is on the server every other job of the host takes it on. A port
/// or address count that matches neither one (ports) nor the hosts is
/// refused, as libpq refuses it.
pub(crate) fn pg_locate(
    base: &str,
    query: &[&str],
    env: impl Fn(&str) -> Option<String>,
) -> std::result::Result<String, String> {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    let named = |k: &str| count_of(query, k) > 0;
    let encode = |v: &str| utf8_percent_encode(v, NON_ALPHANUMERIC).to_string();
    let mut extra: Vec<String> = Vec::new();
    let mut located: Cow<'_, str> = base.into();
    if let Some((scheme, rest)) = base.split_once("://") {
        let (user, hosts, path) = url_parts(rest);
        let user_name = user.trim_end_matches('@').split(':').next().unwrap_or("");
        if user_name.is_empty() && !named("user") {
            if let Some(u) = env("PGUSER") {
                extra.push(format!("user={}", encode(&u)));
            }
        }
        if path.trim_start_matches('/').is_empty() && !named("dbname") {
            if let Some(d) = env("PGDATABASE") {
                extra.push(format!("dbname={}", encode(&d)));
            }
        }
        // The ports of `n` hosts: one for all, or one each (as libpq pairs
        // them); anything else is refused, as libpq refuses it.
        let ports_fit = |n: usize, ports: &str| -> std::result::Result<(), String> {
            match ports.split(',').count() {
                m if m == 1 || m == n || n == 0 => Ok(()),
                m => Err(format!("{m} port numbers for {n} hosts (PGPORT)")),
            }
        };
        let env_port = if named("port") { None } else { env("PGPORT") };
        // libpq reads a URL's host list into its host option and, comma
        // for comma, its port option: the port is unset (and PGPORT used)
        // only for a single host with no port, or an empty one (`h:`).
        let single = !hosts.contains(',');
        let (host_part, port_part) = match hosts.strip_prefix('[') {
            Some(v6) => match v6.split_once("]:") {
                Some((_, p)) => (&hosts[..hosts.len() - p.len() - 1], Some(p)),
                None => (hosts, None),
            },
            None => match hosts.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hosts, None),
            },
        };
        let url_port = port_part.filter(|p| single && !p.is_empty());
        let unnamed = single && host_part.is_empty() && !named("host") && !named("hostaddr");
        // How many hosts the connection will have (for PGPORT's and
        // PGHOSTADDR's counts).
        let param_hosts = count_of(query, "host");
        let mut host_count = if hosts.is_empty() {
            param_hosts
        } else {
            hosts.split(',').count() + param_hosts
        };
        let new_hosts = if unnamed {
            if let Some(h) = env("PGHOST") {
                // As parameters, one `host=` each (a directory is a
                // socket's), and the port as one: the URL's own port, else
                // PGPORT. Written in the URL's host list instead, each host
                // would get a port of its own (5432 where none is given),
                // and a `port` parameter would no longer match them.
                let entries: Vec<&str> = h.split(',').collect();
                host_count = entries.len();
                for e in &entries {
                    let e = if e.is_empty() { pg_default_server() } else { e };
                    extra.push(format!("host={}", encode(e)));
                }
                match (url_port, &env_port) {
                    (Some(p), _) => extra.push(format!("port={}", encode(p))),
                    (None, Some(p)) => {
                        ports_fit(entries.len(), p)?;
                        extra.push(format!("port={}", encode(p)));
                    }
                    (None, None) => {}
                }
                Some(String::new())
            } else {
                // No host anywhere (libpq's socket, or PGHOSTADDR below):
                // the port as a parameter, so that no empty host is made.
                host_count = 0;
                match (url_port, &env_port) {
                    (Some(p), _) if env("PGHOSTADDR").is_some() => {
                        extra.push(format!("port={}", encode(p)));
                        Some(String::new())
                    }
                    (None, Some(p)) => {
                        extra.push(format!("port={}", encode(p)));
                        (!hosts.is_empty()).then(String::new)
                    }
                    _ => None,
                }
            }
        } else {
            match &env_port {
                // The host named by a parameter (`?host=`, `?hostaddr=`):
                // PGPORT as a parameter.
                Some(p) if hosts.is_empty() => {
                    ports_fit(host_count, p)?;
                    extra.push(format!("port={}", encode(p)));
                    None
                }
                // One host in the URL with no port, or an empty one.
                Some(p) if single && url_port.is_none() => {
                    ports_fit(1, p)?;
                    Some(format!("{host_part}:{p}"))
                }
                _ => None,
            }
        };
        if !named("target_session_attrs") {
            if let Some(t) = env("PGTARGETSESSIONATTRS") {
                extra.push(format!("target_session_attrs={}", encode(&t)));
            }
        }
        // PGHOSTADDR wherever no hostaddr is named, as libpq takes it: the
        // address dialed for each host (one each), or the server itself.
        if !named("hostaddr") {
            if let Some(a) = env("PGHOSTADDR") {
                let m = a.split(',').count();
                if host_count > 0 && m != host_count {
                    return Err(format!("{m} addresses for {host_count} hosts (PGHOSTADDR)"));
                }
                extra.push(format!("hostaddr={}", encode(&a)));
            }
        }
        if let Some(h) = new_hosts {
            located = format!("{scheme}://{user}{h}{path}").into();
        }
    }
    let params: Vec<&str> = query
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .collect();
    let filled = pg_fill_empty_hosts(&located, &params);
    Ok(format!("{filled}?{}", params.join("&")))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use tokio_postgres::config::Host;

    fn hosts(url: &str) -> Vec<Host> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let query: Vec<&str> = query.split('&').filter(|kv| !kv.is_empty()).collect();
        let mut c: tokio_postgres::Config = pg_locate(base, &query, |_| None).unwrap().parse().unwrap();
        pg_default_host(&mut c);
        c.get_hosts().to_vec()
    }

    #[test]
    fn a_url_without_a_host_gets_libpqs_socket_directory() {
        let dir = if std::path::Path::new("/var/run/postgresql").is_dir() {
            "/var/run/postgresql"
        } else {
            "/tmp"
        };
        let unix = || Host::Unix(dir.into());
        for url in [
            "postgres://postgres@/test",
            "postgres:///test?sslmode=disable",
            "postgres://postgres@:6543/test",
            // A password may hold a '/' (the user part ends at the '@').
            "postgres://u:pa/ss@:6543/test",
        ] {
            assert_eq!(hosts(url), vec![unix()], "{url}");
        }
        // Each empty host of a list.
        assert_eq!(
            hosts("postgres://u:p@:6543,127.0.0.1:5433/test"),
            vec![unix(), Host::Tcp("127.0.0.1".into())]
        );
        assert_eq!(
            pg_fill_empty_hosts("postgres://u@,h/x", &[]),
            format!("postgres://u@{},h/x", dir.replace('/', "%2F"))
        );
        // A host or a hostaddr named, in the URL or its parameters, is
        // kept as it is, with nothing added.
        assert_eq!(
            hosts("postgres://postgres@127.0.0.1/test"),
            vec![Host::Tcp("127.0.0.1".into())]
        );
        assert_eq!(
            pg_fill_empty_hosts("postgres://u@:5432/db", &["host=/tmp"]),
            "postgres://u@:5432/db"
        );
        assert_eq!(hosts("postgres:///db?host=/tmp"), vec![Host::Unix("/tmp".into())]);
        assert!(hosts("postgres://postgres@/test?hostaddr=127.0.0.1").is_empty());
        assert_eq!(
            pg_fill_empty_hosts("postgres://u@:6543/db", &["hostaddr=127.0.0.1"]),
            "postgres://u@:6543/db"
        );
    }

    /// The configuration a URL gives with the environment `vars`
    /// (`pg_locate`, then libpq's socket where no host is left).
    fn located(url: &str, vars: &[(&str, &str)]) -> std::result::Result<tokio_postgres::Config, String> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let query: Vec<&str> = query.split('&').filter(|kv| !kv.is_empty()).collect();
        let env = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let mut c: tokio_postgres::Config = pg_locate(base, &query, env)?
            .parse()
            .map_err(|e| format!("{e}"))?;
        pg_default_host(&mut c);
        Ok(c)
    }

    #[test]
    fn what_a_url_leaves_out_comes_from_libpqs_environment() {
        let env = [
            ("PGHOST", "db.example"),
            ("PGPORT", "5444"),
            ("PGUSER", "cron"),
            ("PGDATABASE", "jobs"),
        ];
        // Nothing in the URL: all four.
        let c = located("postgres://", &env).unwrap();
        assert_eq!(c.get_hosts(), [Host::Tcp("db.example".into())]);
        assert_eq!(c.get_ports(), [5444]);
        assert_eq!(c.get_user(), Some("cron"));
        assert_eq!(c.get_dbname(), Some("jobs"));
        let c = located("postgres:///", &env).unwrap();
        assert_eq!(
            (c.get_hosts()[0].clone(), c.get_dbname()),
            (Host::Tcp("db.example".into()), Some("jobs"))
        );
        // What the URL says wins, each part on its own.
        let c = located("postgres://me@h:6000/mine", &env).unwrap();
        assert_eq!(c.get_hosts(), [Host::Tcp("h".into())]);
        assert_eq!(c.get_ports(), [6000]);
        assert_eq!((c.get_user(), c.get_dbname()), (Some("me"), Some("mine")));
        let c = located("postgres://me@h/mine", &env).unwrap();
        assert_eq!(c.get_ports(), [5444], "PGPORT where no host names a port");
        let c = located("postgres://@:6000/", &env).unwrap();
        assert_eq!(c.get_hosts(), [Host::Tcp("db.example".into())]);
        assert_eq!(c.get_ports(), [6000], "the URL's port with PGHOST");
        assert_eq!(c.get_user(), Some("cron"));
        let c = located("postgres:///x?host=other&port=7&user=u&dbname=d", &env).unwrap();
        assert_eq!(c.get_hosts(), [Host::Tcp("other".into())]);
        assert_eq!(c.get_ports(), [7]);
        assert_eq!((c.get_user(), c.get_dbname()), (Some("u"), Some("d")));
        // A host list with one port named: the others keep the default.
        let c = located("postgres://a,b:6000/x", &env).unwrap();
        assert_eq!(c.get_ports(), [5432, 6000]);
        // Lists: one port for all hosts, or one each; else refused.
        let c = located("postgres:///x", &[("PGHOST", "a,b"), ("PGPORT", "1")]).unwrap();
        assert_eq!(c.get_hosts().len(), 2);
        assert_eq!(c.get_ports(), [1], "one port, for every host");
        let c = located("postgres:///x", &[("PGHOST", "a,b"), ("PGPORT", "1,2")]).unwrap();
        assert_eq!(c.get_ports(), [1, 2]);
        let e = located("postgres:///x", &[("PGHOST", "a,b"), ("PGPORT", "1,2,3")]).unwrap_err();
        assert!(e.contains("3 port numbers for 2 hosts"), "{e}");
        // A host list in the URL: libpq reads its ports comma for comma,
        // an empty one is 5432, and PGPORT is not used.
        let c = located("postgres://a,b,c/x", &[("PGPORT", "1,2")]).unwrap();
        assert_eq!(c.get_ports(), [5432, 5432, 5432]);
        // One host with an empty port: unset, so PGPORT.
        let c = located("postgres://h:/x", &[("PGPORT", "6001")]).unwrap();
        assert_eq!(c.get_ports(), [6001]);
        let c = located("postgres://[::1]/x", &[("PGPORT", "6001")]).unwrap();
        assert_eq!(
            (c.get_hosts(), c.get_ports()),
            (&[Host::Tcp("::1".into())][..], &[6001][..])
        );
        // The host named by a parameter: PGPORT as a parameter too.
        let c = located("postgres:///x?host=/var/run/postgresql", &[("PGPORT", "5433")]).unwrap();
        assert_eq!(c.get_ports(), [5433]);
        let c = located("postgres:///x?hostaddr=10.0.0.5", &[("PGPORT", "5433")]).unwrap();
        assert_eq!(c.get_ports(), [5433]);
        // PGHOSTADDR beside a host, from the URL or PGHOST: the address
        // dialed; counts must match.
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let c = located("postgres://db2/x", &[("PGHOSTADDR", "10.0.0.7")]).unwrap();
        assert_eq!(c.get_hosts(), [Host::Tcp("db2".into())]);
        assert_eq!(c.get_hostaddrs(), [ip("10.0.0.7")]);
        let c = located(
            "postgres:///x",
            &[("PGHOST", "db.internal"), ("PGHOSTADDR", "10.0.0.7")],
        )
        .unwrap();
        assert_eq!(c.get_hosts(), [Host::Tcp("db.internal".into())]);
        assert_eq!(c.get_hostaddrs(), [ip("10.0.0.7")]);
        let e = located("postgres://a,b/x", &[("PGHOSTADDR", "10.0.0.7")]).unwrap_err();
        assert!(e.contains("1 addresses for 2 hosts"), "{e}");
        let c = located("postgres:///x?hostaddr=10.0.0.1", &[("PGHOSTADDR", "10.0.0.7")]).unwrap();
        assert_eq!(c.get_hostaddrs(), [ip("10.0.0.1")], "a hostaddr named wins");
        // PGTARGETSESSIONATTRS.
        let c = located(
            "postgres:///x",
            &[("PGHOST", "a,b"), ("PGTARGETSESSIONATTRS", "read-write")],
        )
        .unwrap();
        assert_eq!(
            c.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        // A directory in PGHOST is a socket's; an IPv6 address, bracketed.
        let c = located(
            "postgres:///x",
            &[("PGHOST", "/run/pg sock,::1"), ("PGPORT", "5433")],
        )
        .unwrap();
        assert_eq!(
            c.get_hosts(),
            [Host::Unix("/run/pg sock".into()), Host::Tcp("::1".into())]
        );
        // PGHOSTADDR without PGHOST; with PGPORT, or the URL's port.
        let c = located(
            "postgres:///x",
            &[("PGHOSTADDR", "127.0.0.9"), ("PGPORT", "5555")],
        )
        .unwrap();
        assert!(c.get_hosts().is_empty());
        assert_eq!(
            c.get_hostaddrs(),
            ["127.0.0.9".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(c.get_ports(), [5555]);
        let c = located("postgres://@:6000/x", &[("PGHOSTADDR", "127.0.0.9")]).unwrap();
        assert!(c.get_hosts().is_empty());
        assert_eq!(c.get_ports(), [6000]);
        // No PGHOST: libpq's socket, on PGPORT's port.
        let c = located("postgres:///x", &[("PGPORT", "5999")]).unwrap();
        assert!(matches!(c.get_hosts(), [Host::Unix(_)]));
        assert_eq!(c.get_ports(), [5999]);
        // Empty values count as unset; values are escaped, not parsed.
        let c = located("postgres:///x", &[("PGHOST", ""), ("PGUSER", "a&dbname=evil")]).unwrap();
        assert!(matches!(c.get_hosts(), [Host::Unix(_)]));
        assert_eq!((c.get_user(), c.get_dbname()), (Some("a&dbname=evil"), Some("x")));
    }
}
