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
//! and port we dialed. A proxy listens on an address or port of its own, and
//! the server then reports the one the proxy dialed. Anything less certain
//! (several hosts, a Unix socket, a name that does not resolve to the
//! server's address, a NAT'd port) keeps the `EXECUTE` form, which is safe
//! behind any pooler ([`Text::Executed`](super::Text::Executed)).

use std::net::IpAddr;

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
    /// what it resolves to (empty when it does not).
    pub(crate) async fn addresses(&self) -> Vec<IpAddr> {
        if let Ok(ip) = self.host.trim_matches(['[', ']']).parse::<IpAddr>() {
            return vec![ip];
        }
        match tokio::net::lookup_host((self.host.as_str(), self.port)).await {
            Ok(addrs) => addrs.map(|a| a.ip()).collect(),
            Err(_) => Vec::new(),
        }
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

    #[tokio::test]
    async fn addresses_of_a_literal_and_of_a_name() {
        let lit = Dialed {
            host: "::1".into(),
            port: 5432,
        };
        assert_eq!(lit.addresses().await, vec!["::1".parse::<IpAddr>().unwrap()]);
        let name = Dialed {
            host: "localhost".into(),
            port: 5432,
        };
        assert!(name.addresses().await.iter().any(|a| a.is_loopback()));
    }
}
