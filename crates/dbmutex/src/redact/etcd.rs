//! `etcd://host:2379[,host:2379…][/root]`: the endpoints and the key root
//! an etcd URL names, and its description.

use percent_encoding::{percent_decode_str, utf8_percent_encode};

use super::scheme::PATH;
use crate::key::ETCD_DEFAULT_ROOT;
use crate::{Error, Result};

/// The etcd client port, when a host names none.
const DEFAULT_PORT: u16 = 2379;

/// What an `etcd://` URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EtcdUrl {
    /// `host:port` of each member, in the URL's order (IPv6 in brackets).
    pub(crate) hosts: Vec<String>,
    /// The key root, without leading or trailing `/`.
    pub(crate) root: String,
}

/// Parses what follows `etcd://`. Credentials, parameters and fragments
/// are refused (this backend sends none); errors quote no part of it.
pub(crate) fn parse_etcd(rest: &str) -> Result<EtcdUrl> {
    let bad = |why: &str| Error::Config(format!("etcd://{}: {why}", super::UNPARSEABLE));
    if rest.contains(['@', '?', '#']) {
        return Err(bad(
            "an etcd URL names hosts and a key root only (no user, password, parameters or fragment)",
        ));
    }
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let hosts = hosts
        .split(',')
        .map(host_port)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("expected etcd://host:port[,host:port...][/root]"))?;
    let root = percent_decode_str(path.trim_matches('/'))
        .decode_utf8()
        .map_err(|_| bad("the key root is not UTF-8 once decoded"))?;
    Ok(EtcdUrl {
        hosts,
        root: match root.as_ref() {
            "" => ETCD_DEFAULT_ROOT.to_owned(),
            r => r.to_owned(),
        },
    })
}

/// `host[:port]` as `host:port`; `None` if it is not one.
fn host_port(hp: &str) -> Option<String> {
    let (host, port) = match hp.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, p.parse::<u16>().ok()?),
        _ => (hp, DEFAULT_PORT),
    };
    let name_ok = |h: &str| {
        !h.is_empty()
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    let ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => name_ok(host),
    };
    ok.then(|| format!("{host}:{port}"))
}

/// `host:port,host:port/root`, from the parsed fields; `None` if it does
/// not parse.
pub(super) fn describe_etcd_url(rest: &str) -> Option<String> {
    let url = parse_etcd(rest).ok()?;
    // Hosts hold only letters, digits, `.-_:[]` (checked by the parse).
    Some(format!(
        "{}/{}",
        url.hosts.join(","),
        utf8_percent_encode(&url.root, PATH)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls() {
        let u = parse_etcd("127.0.0.1:2379,h2,[::1]:23790/team/locks/").unwrap();
        assert_eq!(u.hosts, ["127.0.0.1:2379", "h2:2379", "[::1]:23790"]);
        assert_eq!(u.root, "team/locks");
        assert_eq!(parse_etcd("h:1").unwrap().root, "dbmutex");
        assert_eq!(parse_etcd("h:1/a%20b").unwrap().root, "a b");
        for bad in [
            "",
            "h:1,",
            "u:secret@h:1",
            "h:1?password=secret",
            "h:notaport",
            "h x:1",
            "[zz]:1",
        ] {
            let e = parse_etcd(bad).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
        }
        assert_eq!(describe_etcd_url("a:1,b:2/x").unwrap(), "a:1,b:2/x");
        assert_eq!(describe_etcd_url("u:secret@a:1"), None);
    }
}
