//! Where a `mysql://` URL goes when it leaves the place out, as the MySQL
//! and MariaDB clients read the same gaps: a URL's own host, port and
//! `socket` parameter first, then the client groups of the option files
//! (`host`, `port`, `socket`; `option_file.rs`), then the environment (`MYSQL_HOST`,
//! `MYSQL_TCP_PORT`, `MYSQL_UNIX_PORT`), then the defaults (the host
//! `localhost`, which the clients reach through the local server's Unix
//! socket, and port 3306). Empty values count as unset.

use std::borrow::Cow;

use percent_encoding::{percent_decode_str, utf8_percent_encode};

use super::scheme::{FIELD, PATH};

/// Where the MySQL and MariaDB clients look for the local server's Unix
/// socket when nothing names one: Debian's and Ubuntu's
/// `/var/run/mysqld/mysqld.sock` (`/run/mysqld/mysqld.sock` where
/// `/var/run` is not there) wherever its directory exists (a socket missing
/// there, as while the server restarts, is not looked for in `/tmp`, where
/// any local user could put one), else upstream MySQL's `/tmp/mysql.sock`.
#[cfg(unix)]
const MYSQL_SOCKETS: [&str; 3] = [
    "/var/run/mysqld/mysqld.sock",
    "/run/mysqld/mysqld.sock",
    "/tmp/mysql.sock",
];

/// The local server's socket, as [`MYSQL_SOCKETS`] says.
#[cfg(unix)]
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

/// [`mysql_locate`] in this process's environment.
pub(crate) fn mysql_default_host(url: &str) -> Option<Cow<'_, str>> {
    mysql_locate(url, &|k| std::env::var(k).ok())
}

/// `url` (`mysql://…`) with what it leaves of the place filled in as the
/// clients fill it (see the module's text); `env` reads an environment
/// variable (`HOME` finds the option file).
///
/// - A URL that names a host, or a `socket` parameter, names the place:
///   nothing is filled in (a host with no port is mysql_async's port
///   3306, as it always was: an explicit URL does not move with the
///   environment).
/// - No host: the option file's `host`, else `MYSQL_HOST`, else
///   `localhost`. `localhost` goes to a Unix socket (off Unix: TCP): the
///   option file's `socket`, else `MYSQL_UNIX_PORT`, else the local
///   server's ([`MYSQL_SOCKETS`]), added as a `socket` parameter. Another
///   host goes over TCP, to the URL's port, else the option file's
///   `port`, else `MYSQL_TCP_PORT` (read as the clients read it, its
///   leading digits), else 3306.
///
/// `None` for a port with no host that would go to the socket
/// (`mysql://root@:3307/db` with no host named anywhere): the clients
/// would ignore the port, the server a TCP URL with that port reaches may
/// be another, and a lock taken on each would exclude nothing.
pub(crate) fn mysql_locate<'a>(url: &'a str, env: &dyn Fn(&str) -> Option<String>) -> Option<Cow<'a, str>> {
    let Some(at) = url.find("://").map(|i| i + 3) else {
        return Some(url.into());
    };
    let end = url[at..].find(['/', '?', '#']).map_or(url.len(), |i| at + i);
    let host_at = url[at..end].rfind('@').map_or(at, |i| at + i + 1);
    let authority = &url[host_at..end];
    // The port is what follows the last `:` outside an IPv6 literal's
    // brackets.
    let port_at = authority.rfind(':').filter(|&i| !authority[i..].contains(']'));
    let (host, port) = match port_at {
        Some(i) => (&authority[..i], Some(&authority[i + 1..])),
        None => (authority, None),
    };
    let port = port.filter(|p| !p.is_empty());
    let socket_named = mysql_socket_param(url).is_some();
    if !host.is_empty() {
        return Some(url.into());
    }
    if socket_named {
        // mysql_async goes to the socket whatever the host: `localhost`.
        return match port {
            Some(_) => None,
            None => Some(format!("{}localhost{}", &url[..host_at], &url[end..]).into()),
        };
    }
    let set = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let text = super::option_file(&env);
    let option = |name: &str| set(text.as_deref().and_then(|t| super::client_option(t, name)));
    let host = option("host")
        .or_else(|| set(env("MYSQL_HOST")))
        .unwrap_or_else(|| "localhost".into());
    let socket = cfg!(unix) && host == "localhost";
    if socket && port.is_some() {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.to_owned()),
        None if socket => None,
        None => option("port")
            .or_else(|| set(env("MYSQL_TCP_PORT")))
            .and_then(|p| leading_port(&p))
            .map(|p| p.to_string()),
    };
    let mut out = String::with_capacity(url.len() + 48);
    out.push_str(&url[..host_at]);
    match host.parse::<std::net::Ipv6Addr>() {
        Ok(v6) => out.push_str(&format!("[{v6}]")),
        // One name: a `/`, `@`, `]` or `?` in it cannot end the host and
        // move the rest into the database's name or a parameter.
        Err(_) => out.extend(utf8_percent_encode(&host, FIELD)),
    }
    if let Some(p) = &port {
        out.push(':');
        out.push_str(p);
    }
    out.push_str(&url[end..]);
    #[cfg(unix)]
    if socket {
        let path = option("socket")
            .or_else(|| set(env("MYSQL_UNIX_PORT")))
            .unwrap_or_else(|| mysql_socket().to_owned());
        let fragment = out.find('#').unwrap_or(out.len());
        let sep = if out[..fragment].contains('?') { "&" } else { "?" };
        out.insert_str(
            fragment,
            &format!("{sep}socket={}", utf8_percent_encode(&path, PATH)),
        );
    }
    Some(out.into())
}

/// A port as the clients read `MYSQL_TCP_PORT` and an option file's
/// `port` (`atoi`: the leading digits, after blanks); `None` where that
/// is no port (none, 0, past 65535), so the next source counts.
fn leading_port(s: &str) -> Option<u16> {
    let s = s.trim_start();
    let digits = &s[..s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len())];
    digits.parse::<u16>().ok().filter(|&p| p != 0)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn default_socket() -> &'static str {
        if std::path::Path::new("/var/run/mysqld").is_dir() {
            "/var/run/mysqld/mysqld.sock"
        } else if std::path::Path::new("/run/mysqld").is_dir() {
            "/run/mysqld/mysqld.sock"
        } else {
            "/tmp/mysql.sock"
        }
    }

    #[test]
    fn a_mysql_url_without_a_host_goes_to_the_local_socket() {
        let socket = default_socket();
        assert_eq!(mysql_socket(), socket);
        let none = |_: &str| None;
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
            ("mysql://root@[::1]/test", "mysql://root@[::1]/test".into()),
            (
                "mysql://root@localhost/test",
                "mysql://root@localhost/test".into(),
            ),
        ] {
            assert_eq!(mysql_locate(url, &none).as_deref(), Some(want.as_str()), "{url}");
        }
        // A port with no host is refused, not sent to the socket.
        assert_eq!(mysql_locate("mysql://root@:3307/test", &none), None);
        assert_eq!(mysql_locate("mysql://:3307", &none), None);
    }

    /// `~/.my.cnf`'s `[client]` group, then `MYSQL_HOST`, `MYSQL_TCP_PORT`
    /// and `MYSQL_UNIX_PORT`; a URL that names a host or a socket is left
    /// as it is.
    #[test]
    fn the_option_file_then_the_environment_fill_the_place() {
        let dir = std::env::temp_dir().join(format!("dbmutex-mysql-locate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let home = dir.to_str().unwrap().to_owned();
        let env = |vars: &[(&'static str, &str)]| {
            let mut vars: Vec<(&'static str, String)> =
                vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
            vars.push(("HOME", home.clone()));
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let locate =
            |url: &str, vars: &[(&'static str, &str)]| mysql_locate(url, &env(vars)).map(Cow::into_owned);
        let tcp = [("MYSQL_HOST", "db.example"), ("MYSQL_TCP_PORT", "3310")];
        // No option file: the environment.
        assert_eq!(
            locate("mysql://u@/db", &tcp).as_deref(),
            Some("mysql://u@db.example:3310/db")
        );
        assert_eq!(
            locate("mysql:///db", &[("MYSQL_HOST", "::1")]).as_deref(),
            Some("mysql://[::1]/db")
        );
        assert_eq!(
            locate("mysql://u@:1/db", &tcp).as_deref(),
            Some("mysql://u@db.example:1/db"),
            "the URL's port"
        );
        // A URL that names the place does not move with the environment.
        for url in ["mysql://u@h/db", "mysql://u@h:1/db", "mysql://u@localhost/db"] {
            assert_eq!(locate(url, &tcp).as_deref(), Some(url));
        }
        assert_eq!(
            locate("mysql://u@/db?socket=/s", &tcp).as_deref(),
            Some("mysql://u@localhost/db?socket=/s"),
            "a socket named: the socket, not MYSQL_HOST"
        );
        assert_eq!(locate("mysql://u@:3307/db?socket=/s", &tcp), None);
        // Ports as the clients read them: leading digits, else the next
        // source.
        for (value, want) in [
            (" 3311", ":3311"),
            ("3312x", ":3312"),
            ("x", ""),
            ("0", ""),
            ("70000", ""),
        ] {
            assert_eq!(
                locate("mysql://u@/db", &[("MYSQL_HOST", "h"), ("MYSQL_TCP_PORT", value)]).as_deref(),
                Some(&*format!("mysql://u@h{want}/db")),
                "{value:?}"
            );
        }
        assert_eq!(
            locate(
                "mysql://u@/db",
                &[
                    ("MYSQL_UNIX_PORT", "/srv/my sql.sock"),
                    ("MYSQL_TCP_PORT", "3310")
                ]
            )
            .as_deref(),
            Some("mysql://u@localhost/db?socket=/srv/my%20sql.sock"),
            "localhost is the socket, whatever the TCP port"
        );
        // A filled-in host is one name, whatever it holds.
        assert_eq!(
            locate("mysql://u@/db", &[("MYSQL_HOST", "h/x?y")]).as_deref(),
            Some("mysql://u@h%2Fx%3Fy/db")
        );
        assert_eq!(
            locate("mysql://u@/db", &[("MYSQL_HOST", "::1]/other?socket=/tmp/x#")]).as_deref(),
            Some("mysql://u@%3A%3A1%5D%2Fother%3Fsocket%3D%2Ftmp%2Fx%23/db")
        );
        assert_eq!(
            locate("mysql://u@/db", &[("MYSQL_HOST", " ")]).as_deref(),
            Some(&*format!("mysql://u@localhost/db?socket={}", default_socket())),
            "blank is unset"
        );
        // The option file before the environment.
        std::fs::write(
            dir.join(".my.cnf"),
            "[client]\nhost = 127.0.0.2\nport = 3320\n[mysql]\nhost = not-this\n",
        )
        .unwrap();
        assert_eq!(
            locate("mysql://u@/db", &tcp).as_deref(),
            Some("mysql://u@127.0.0.2:3320/db")
        );
        std::fs::write(dir.join(".my.cnf"), "[client]\nsocket = /srv/file.sock\n").unwrap();
        assert_eq!(
            locate("mysql://u@/db", &[("MYSQL_UNIX_PORT", "/srv/env.sock")]).as_deref(),
            Some("mysql://u@localhost/db?socket=/srv/file.sock")
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
