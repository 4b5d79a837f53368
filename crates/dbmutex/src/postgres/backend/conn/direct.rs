//! Whether a connection reaches PostgreSQL itself, with nothing in between:
//! then its lock statements can be protocol-level prepared statements
//! ([`Text::Prepared`](super::Text::Prepared)), parsed once per connection.
//!
//! tokio-postgres names prepared statements `s0`, `s1`, … in every process.
//! Behind a pooler that hands a client's next statement to another server
//! session and passes statement names through (PgBouncer `pool_mode =
//! transaction` before 1.21 or with `max_prepared_statements = 0`), one of
//! ours could meet another client's statement of the same name and run it
//! with our parameters, before any claim check of ours could refuse. So the
//! prepared form is used only where no pooler can be: the server's own
//! address and port for this session (`inet_server_addr()`,
//! `inet_server_port()`, asked in the claim's round trip) are the address
//! and port we dialed, and, where we dialed the socket ourselves (one TCP
//! host by name: `connector.rs`), the server's client for the session
//! (`inet_client_addr()`, `inet_client_port()`) is our own end of it. A
//! proxy listens on an address or port of its own, and the server then
//! reports the one the proxy dialed; a proxy put in front of the server by
//! a port redirect dials the very address and port the client did, but
//! from an end of its own. On one Unix socket, dialed ourselves too, the
//! kernel names the process listening on it (`SO_PEERCRED`): when that is
//! the postmaster, parent of the backend that serves the session
//! ([`is_postmasters_own`]), nothing is in between. Anything less certain
//! (several hosts, a pooler's socket, a name that does not resolve to the
//! server's address, a NAT'd port or address on either side) keeps the
//! `EXECUTE` form, which is safe behind any pooler
//! ([`Text::Executed`](super::Text::Executed)).
//!
//! A session at the other end of our own socket cannot be moved to another
//! at all: its prepared statements also go without the claim check
//! (`prepared.rs`), which is their costliest part in the server.

use std::net::IpAddr;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// The one TCP host and port a configuration dials, if it names exactly one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dialed {
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Dialed {
    /// From a tokio-postgres configuration: `None` for several hosts or a
    /// Unix socket (`hostaddr`, when given, is what is dialed).
    pub(crate) fn of(config: &Config) -> Option<Dialed> {
        let port = match config.get_ports() {
            [] => 5432,
            [p] => *p,
            _ => return None,
        };
        if let [addr] = config.get_hostaddrs() {
            return Some(Dialed {
                host: addr.to_string(),
                port,
            });
        }
        match config.get_hosts() {
            [Host::Tcp(h)] => Some(Dialed {
                host: h.clone(),
                port,
            }),
            _ => None,
        }
    }

    /// The addresses the dialed host stands for: itself if it is one, else
    /// what it resolves to.
    pub(crate) async fn addresses(&self) -> std::io::Result<Vec<IpAddr>> {
        if let Ok(ip) = self.host.trim_matches(['[', ']']).parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        Ok(tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .map(|a| a.ip())
            .collect())
    }
}

/// The Unix socket a configuration dials, when we dial it ourselves: one
/// socket directory and one port (or none: 5432), no `hostaddr` (which
/// libpq and tokio-postgres dial instead of the host), nothing asked of
/// the session at connect (`target_session_attrs`), and Linux, whose
/// `/proc` can prove the listener the postmaster ([`is_postmasters_own`]).
/// The path is the one tokio-postgres would dial.
#[cfg(unix)]
pub(crate) fn unix_socket_of(config: &Config) -> Option<std::path::PathBuf> {
    if !cfg!(target_os = "linux")
        || config.get_target_session_attrs() != tokio_postgres::config::TargetSessionAttrs::Any
        || !config.get_hostaddrs().is_empty()
    {
        return None;
    }
    let [Host::Unix(dir)] = config.get_hosts() else {
        return None;
    };
    let port = match config.get_ports() {
        [] => 5432,
        [p] => *p,
        _ => return None,
    };
    Some(dir.join(format!(".s.PGSQL.{port}")))
}

/// No Unix sockets here.
#[cfg(not(unix))]
pub(crate) fn unix_socket_of(_: &Config) -> Option<std::path::PathBuf> {
    None
}

/// Both ends of a socket we dialed ourselves, and the host name dialed (for
/// TLS, also on a cancel request's socket).
pub(crate) struct Ends {
    pub(super) local: std::net::SocketAddr,
    pub(super) peer: std::net::SocketAddr,
    /// For TLS only (the server's name in the handshake).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(super) name: String,
}

/// A Unix socket we dialed ourselves: its path (a cancel request dials it
/// again) and, if it may be the postmaster, the process that listens on
/// it, as the kernel told at connect (`SO_PEERCRED`; see
/// [`postmaster_listener`]): `None` for a pooler's socket, or a listener
/// in a pid namespace we do not see (the kernel gives pid 0 then).
pub(crate) struct UnixEnds {
    pub(super) path: std::path::PathBuf,
    pub(super) listener: Option<i32>,
}

/// `listener` (the pid `SO_PEERCRED` gives for our Unix socket at
/// `socket`) if it may be the postmaster: a `postgres` process (`/proc`,
/// Linux), with PostgreSQL's lock file beside the socket
/// (`.s.PGSQL.PORT.lock`), which names it where we may read it (the
/// server's user and root may). The kernel's pid is the one of the process
/// that called `listen`: a pooler restarted online (`pgbouncer -R`) hands
/// its listening socket to a new process, and a postmaster started since
/// may have been given the old pid; a pooler's socket has no lock file, so
/// that pid is not taken for the postmaster. `None` anywhere else.
pub(crate) fn postmaster_listener(listener: Option<i32>, socket: &std::path::Path) -> Option<i32> {
    let pid = listener.filter(|p| *p > 0)?;
    if socket_lock(socket)?.is_some_and(|owner| owner != pid) {
        return None;
    }
    is_postgres(pid).then_some(pid)
}

/// True when the server process of the session (`backend_pid`, as
/// `pg_backend_pid()` tells) is a `postgres` process forked by the process
/// that listens on our Unix socket (`listener`, as
/// [`postmaster_listener`] vetted it), itself a `postgres`: the socket
/// leads to the postmaster, which hands each connection to a backend of
/// its own, so nothing is in between and the session is at the other end
/// of our very socket. A pooler listening there (PgBouncer, pgpool-II) is
/// not the parent of the server's backends. False wherever `/proc` does
/// not tell: the pooler check runs.
pub(crate) fn is_postmasters_own(listener: Option<i32>, backend_pid: Option<i32>) -> bool {
    let (Some(listener), Some(backend)) = (listener, backend_pid) else {
        return false;
    };
    listener > 0
        && backend > 0
        && is_postgres(listener)
        && process(backend).is_some_and(|(comm, parent)| comm == "postgres" && parent == listener)
}

/// Whether the Unix socket at `path` has the lock file PostgreSQL keeps
/// beside its own (`.s.PGSQL.PORT.lock`, which a pooler's socket lacks).
/// For the shape of a start (`PgBackend::with_connector` makes the pooler
/// check's connection at once where the socket is not PostgreSQL's); the
/// claim proves the rest.
pub(crate) fn looks_like_postmasters(path: &std::path::Path) -> bool {
    socket_lock(path).is_some()
}

/// PostgreSQL's lock file beside the socket at `socket`: `None` if there
/// is none; else the postmaster's pid on its first line, `None` inside
/// where it cannot be read (it is the server's user's alone) or parsed.
fn socket_lock(socket: &std::path::Path) -> Option<Option<i32>> {
    let mut lock = socket.as_os_str().to_owned();
    lock.push(".lock");
    let lock = std::path::PathBuf::from(lock);
    match std::fs::read_to_string(&lock) {
        Ok(text) => Some(text.lines().next().and_then(|l| l.trim().parse().ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => lock.exists().then_some(None),
    }
}

/// Whether process `pid` is a `postgres` (`/proc`, Linux).
fn is_postgres(pid: i32) -> bool {
    process(pid).is_some_and(|(comm, _)| comm == "postgres")
}

/// Process `pid`'s name and parent pid, from `/proc/PID/stat` (Linux).
fn process(pid: i32) -> Option<(String, i32)> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    comm_and_parent(&stat).map(|(comm, parent)| (comm.to_owned(), parent))
}

/// A process's name and its parent's pid, from its `/proc/PID/stat` line
/// (`PID (COMM) STATE PPID ...`; the name may hold spaces and parentheses,
/// so it ends at the last `)`).
fn comm_and_parent(stat: &str) -> Option<(&str, i32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_ascii_whitespace();
    let _state = rest.next()?;
    Some((comm, rest.next()?.parse().ok()?))
}

/// One TCP connection to `addr` with tokio-postgres's socket options:
/// no delay, keepalive probes after `keepalive` idle and every `keepalive`
/// (one unanswered is enough), unacknowledged sends given up after twice it.
pub(crate) async fn dial_one(
    addr: std::net::SocketAddr,
    timeout: Option<&Duration>,
    keepalive: Duration,
) -> std::io::Result<tokio::net::TcpStream> {
    let stream = within(timeout, tokio::net::TcpStream::connect(addr)).await?;
    stream.set_nodelay(true)?;
    let sock = socket2::SockRef::from(&stream);
    #[cfg(target_os = "linux")]
    sock.set_tcp_user_timeout(Some(keepalive * 2))?;
    let probes = socket2::TcpKeepalive::new()
        .with_time(keepalive)
        .with_interval(keepalive);
    #[cfg(not(any(target_os = "windows", target_os = "openbsd", target_os = "haiku")))]
    let probes = probes.with_retries(1);
    sock.set_tcp_keepalive(&probes)?;
    Ok(stream)
}

/// A socket's connect, within the connect timeout if there is one.
pub(crate) async fn within<S>(
    timeout: Option<&Duration>,
    connect: impl std::future::Future<Output = std::io::Result<S>>,
) -> std::io::Result<S> {
    match timeout {
        Some(t) => tokio::time::timeout(*t, connect)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connection timed out"))?,
        None => connect.await,
    }
}

/// True when the server's own end of the session (`server_addr` as
/// `host(inet_server_addr())`, `server_port` as `inet_server_port()`; both
/// NULL over a Unix socket) is the port we dialed, on one of the addresses
/// the dialed host stands for.
pub(crate) fn is_direct(
    dialed: &Dialed,
    addresses: &[IpAddr],
    server_addr: Option<&str>,
    server_port: Option<i32>,
) -> bool {
    let (Some(addr), Some(port)) = (server_addr, server_port) else {
        return false;
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    i32::from(dialed.port) == port && addresses.iter().any(|a| a.to_canonical() == addr.to_canonical())
}

/// True when the server's own end of the session (as for [`is_direct`]) is
/// `peer`, the address and port our socket reached: not another address
/// the dialed name also stands for.
pub(crate) fn is_peer(
    peer: std::net::SocketAddr,
    server_addr: Option<&str>,
    server_port: Option<i32>,
) -> bool {
    server_port == Some(i32::from(peer.port()))
        && server_addr
            .and_then(|a| a.parse::<IpAddr>().ok())
            .is_some_and(|a| a.to_canonical() == peer.ip().to_canonical())
}

/// True when the server's client for this session (`client_addr` as
/// `inet_client_addr()`, `client_port` as `inet_client_port()`) is our own
/// end of the socket we dialed (`local`): the session is at the other end of
/// that very socket. A server that answers where we dialed
/// ([`is_direct`]) may still be reached through a proxy that dials it at
/// that address and port (a pooler put in front of the server by a port
/// redirect, say); that proxy's own socket has another address or port
/// than ours.
pub(crate) fn is_own_socket(
    local: std::net::SocketAddr,
    client_addr: Option<IpAddr>,
    client_port: Option<i32>,
) -> bool {
    client_port == Some(i32::from(local.port()))
        && client_addr.is_some_and(|a| a.to_canonical() == local.ip().to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dialed(url: &str) -> Option<Dialed> {
        Dialed::of(&url.parse::<Config>().unwrap())
    }

    #[test]
    fn one_tcp_host_is_dialed() {
        let d = dialed("postgres://u@127.0.0.1:6432/db").unwrap();
        assert_eq!((d.host.as_str(), d.port), ("127.0.0.1", 6432));
        assert_eq!(dialed("postgres://u@db.example/db").unwrap().port, 5432);
        assert_eq!(
            dialed("host=db.example hostaddr=10.0.0.7 port=5433 user=u").unwrap(),
            Dialed {
                host: "10.0.0.7".into(),
                port: 5433
            }
        );
    }

    #[test]
    fn several_hosts_or_a_socket_are_not() {
        assert_eq!(dialed("postgres://u@a:5432,b:5432/db"), None);
        assert_eq!(dialed("host=/var/run/postgresql user=u"), None);
        assert_eq!(dialed("host=a port=5432,5433 user=u"), None);
    }

    #[test]
    fn direct_only_when_the_server_answers_on_what_we_dialed() {
        let d = Dialed {
            host: "127.0.0.1".into(),
            port: 5432,
        };
        let here = ["127.0.0.1".parse().unwrap()];
        assert!(is_direct(&d, &here, Some("127.0.0.1"), Some(5432)));
        // A dual-stack server reports an IPv4 client's address mapped.
        assert!(is_direct(&d, &here, Some("::ffff:127.0.0.1"), Some(5432)));
        // A proxy on another port (PgBouncer on 6432 in front of 5432).
        let bouncer = Dialed {
            host: "127.0.0.1".into(),
            port: 6432,
        };
        assert!(!is_direct(&bouncer, &here, Some("127.0.0.1"), Some(5432)));
        // A proxy on another host, same port.
        assert!(!is_direct(&d, &here, Some("10.1.2.3"), Some(5432)));
        // A Unix socket on the server side, or nothing resolved.
        assert!(!is_direct(&d, &here, None, None));
        assert!(!is_direct(&d, &[], Some("127.0.0.1"), Some(5432)));
        assert!(!is_direct(&d, &here, Some("not an address"), Some(5432)));
    }

    #[test]
    fn the_peer_is_the_address_and_port_our_socket_reached() {
        let peer: std::net::SocketAddr = "127.0.0.1:5432".parse().unwrap();
        assert!(is_peer(peer, Some("127.0.0.1"), Some(5432)));
        assert!(is_peer(peer, Some("::ffff:127.0.0.1"), Some(5432)));
        // Another address of the same name (a pooler on one, the server on
        // the other), or another port.
        assert!(!is_peer(peer, Some("127.0.0.2"), Some(5432)));
        assert!(!is_peer(peer, Some("127.0.0.1"), Some(6432)));
        assert!(!is_peer(peer, None, None));
    }

    #[test]
    fn own_socket_only_when_the_server_sees_our_own_end() {
        let ours: std::net::SocketAddr = "127.0.0.1:40001".parse().unwrap();
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert!(is_own_socket(ours, ip("127.0.0.1"), Some(40001)));
        assert!(is_own_socket(ours, ip("::ffff:127.0.0.1"), Some(40001)));
        // A proxy on our host dials the server from a port of its own.
        assert!(!is_own_socket(ours, ip("127.0.0.1"), Some(40002)));
        // One on another host, by chance from the same port number.
        assert!(!is_own_socket(ours, ip("127.0.0.2"), Some(40001)));
        // A Unix socket on the server side.
        assert!(!is_own_socket(ours, None, None));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn one_unix_socket_is_dialed_ourselves() {
        let socket = |url: &str| unix_socket_of(&url.parse::<Config>().unwrap());
        assert_eq!(
            socket("host=/var/run/postgresql user=u"),
            Some("/var/run/postgresql/.s.PGSQL.5432".into())
        );
        assert_eq!(
            socket("host=/tmp port=6432 user=u"),
            Some("/tmp/.s.PGSQL.6432".into())
        );
        // A hostaddr is dialed instead of the socket; several hosts or
        // ports, a session asked for, or TCP are tokio-postgres's (or ours
        // over TCP).
        assert_eq!(socket("host=/tmp hostaddr=127.0.0.1 user=u"), None);
        assert_eq!(socket("host=/tmp,/var/run/postgresql user=u"), None);
        assert_eq!(socket("host=/tmp port=5432,5433 user=u"), None);
        assert_eq!(socket("host=/tmp target_session_attrs=read-write user=u"), None);
        assert_eq!(socket("postgres://u@127.0.0.1/db"), None);
    }

    #[test]
    fn a_stat_line_gives_the_name_and_the_parent() {
        assert_eq!(
            comm_and_parent("4242 (postgres) S 901 4242 4242 0 -1 4194560 ..."),
            Some(("postgres", 901))
        );
        // A name with spaces and a parenthesis of its own.
        assert_eq!(comm_and_parent("77 (a (b) c) R 1 77 77 0"), Some(("a (b) c", 1)));
        assert_eq!(comm_and_parent("77 (postgres"), None);
        assert_eq!(comm_and_parent("77 (postgres) S x"), None);
        assert_eq!(comm_and_parent(""), None);
    }

    #[cfg(unix)]
    #[test]
    fn not_the_postmasters_own_without_both_pids_or_their_processes() {
        let me = std::process::id() as i32;
        assert!(!is_postmasters_own(None, Some(me)));
        assert!(!is_postmasters_own(Some(1), None));
        assert!(!is_postmasters_own(Some(0), Some(me)));
        // Neither this test process nor its parent is a `postgres`.
        let parent = std::os::unix::process::parent_id() as i32;
        assert!(!is_postmasters_own(Some(parent), Some(me)));
    }

    #[test]
    fn the_lock_file_beside_a_socket_names_its_postmaster() {
        let dir = std::env::temp_dir().join(format!("dbmutex-lockfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join(".s.PGSQL.5432");
        let me = std::process::id() as i32;
        // A pooler's socket: no lock file, no postmaster.
        assert!(!looks_like_postmasters(&socket));
        assert_eq!(socket_lock(&socket), None);
        assert_eq!(postmaster_listener(Some(me), &socket), None);
        // PostgreSQL's: its pid first, then the data directory and more.
        std::fs::write(
            dir.join(".s.PGSQL.5432.lock"),
            "4242\n/var/lib/postgresql/15/main\n",
        )
        .unwrap();
        assert!(looks_like_postmasters(&socket));
        assert_eq!(socket_lock(&socket), Some(Some(4242)));
        // A listener the lock file does not name is not its postmaster (nor
        // is this test process, named or not, a `postgres`).
        assert_eq!(postmaster_listener(Some(me), &socket), None);
        std::fs::write(dir.join(".s.PGSQL.5432.lock"), format!("{me}\n")).unwrap();
        assert_eq!(postmaster_listener(Some(me), &socket), None);
        assert_eq!(postmaster_listener(Some(0), &socket), None);
        assert_eq!(postmaster_listener(None, &socket), None);
        std::fs::write(dir.join(".s.PGSQL.5432.lock"), "not a pid\n").unwrap();
        assert_eq!(socket_lock(&socket), Some(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn addresses_of_a_literal_and_of_a_name() {
        let lit = Dialed {
            host: "::1".into(),
            port: 5432,
        };
        assert_eq!(
            lit.addresses().await.unwrap(),
            vec!["::1".parse::<IpAddr>().unwrap()]
        );
        let name = Dialed {
            host: "localhost".into(),
            port: 5432,
        };
        assert!(name.addresses().await.unwrap().iter().any(|a| a.is_loopback()));
    }
}
