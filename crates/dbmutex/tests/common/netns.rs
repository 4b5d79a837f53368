//! Silent partitions on loopback: a test re-runs itself inside a private
//! network namespace (`ip netns`, as root) and drops packets there — no
//! reset, no error for the sender — with either of two cuts:
//!
//! - [`partition`]: every packet to or from 127.0.0.2 (blackhole routing
//!   rules), for a client that reaches its server through that address;
//! - [`Cut`]: every connection a process of one group id takes part in
//!   (nftables: the group's sockets mark their connections, and marked
//!   packets are dropped on arrival), for one server among several on
//!   127.0.0.1; connections through 127.0.0.2 are spared, so a client
//!   there stays on the cut side with its server.
//!
//! ```ignore
//! #[test]
//! fn a_partition() {
//!     if !netns::inside() {
//!         return netns::in_netns("a_partition");
//!     }
//!     // … in the namespace, on its own loopback
//! }
//! ```
#![allow(dead_code)]

use std::process::Command;

/// Whether this process runs inside the namespace [`in_netns`] made.
pub fn inside() -> bool {
    std::env::var_os("DBMUTEX_TEST_IN_NETNS").is_some()
}

fn sh(cmd: &str) {
    let s = Command::new("sh").arg("-c").arg(cmd).status().unwrap();
    assert!(s.success(), "{cmd}: {s}");
}

/// Runs this test binary's test `name` again inside a fresh network
/// namespace (`ip netns`), with 127.0.0.2 on its loopback and the local
/// routing table moved behind room for blackhole rules, and fails unless
/// it passed there. The namespace is removed afterwards.
pub fn in_netns(name: &str) {
    // One namespace per call: partition tests may run at once.
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = format!("dbmutex-{}-{n}", std::process::id());
    sh(&format!("ip netns add {ns}"));
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _gone = Gone(ns.clone());
    let x = |cmd: &str| sh(&format!("ip netns exec {ns} {cmd}"));
    x("ip link set lo up");
    x("ip addr add 127.0.0.2/8 dev lo");
    x("ip rule add prio 1000 lookup local");
    x("ip rule del prio 0");
    let out = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads", "1"])
        .env("DBMUTEX_TEST_IN_NETNS", &ns)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains("1 passed"),
        "inside the namespace:\n{text}"
    );
}

/// Cuts 127.0.0.2 off, in both directions, with no reset: a silent partition.
pub fn partition() {
    for rule in ["prio 1 to 127.0.0.2 blackhole", "prio 2 from 127.0.0.2 blackhole"] {
        sh(&format!("ip rule add {rule}"));
    }
}

/// A silent cut around the processes of one group id (in the namespace).
pub struct Cut {
    gid: u32,
}

const TABLE: &str = "inet dbmutex_cut";

impl Cut {
    /// Marks, from now on, every connection on which a process of group
    /// `gid` sends a packet; nothing is dropped until [`Cut::cut`]. Call it
    /// before the processes start, so no packet of theirs goes unmarked.
    pub fn prepare(gid: u32) -> Cut {
        assert!(inside(), "a Cut only inside the test's network namespace");
        sh(&format!("nft add table {TABLE}"));
        sh(&format!(
            "nft add chain {TABLE} out '{{ type filter hook output priority 0; }}'"
        ));
        sh(&format!(
            "nft add chain {TABLE} in '{{ type filter hook input priority 0; }}'"
        ));
        sh(&format!(
            "nft add rule {TABLE} out meta skgid {gid} ct mark set {gid}"
        ));
        Cut { gid }
    }

    /// Drops every packet of the group's connections on arrival, both
    /// ways, except those to 127.0.0.2.
    pub fn cut(&self) {
        sh(&format!(
            "nft add rule {TABLE} in ct mark {} ip daddr != 127.0.0.2 drop",
            self.gid
        ));
    }

    /// Lets every packet through again.
    pub fn heal(&self) {
        sh(&format!("nft flush chain {TABLE} in"));
    }
}

/// Drops, silently, the packets a server sends from 127.0.0.2:`port` (its
/// answers and acknowledgements to clients that reach it there), while
/// letting everything sent to it through: requests arrive and take effect,
/// their answers are lost until [`Silence::off`].
pub struct Silence {
    port: u16,
}

const SILENCE: &str = "inet dbmutex_silence";

impl Silence {
    pub fn new(port: u16) -> Silence {
        assert!(inside(), "a Silence only inside the test's network namespace");
        sh(&format!("nft add table {SILENCE}"));
        sh(&format!(
            "nft add chain {SILENCE} in '{{ type filter hook input priority 0; }}'"
        ));
        Silence { port }
    }

    pub fn on(&self) {
        sh(&format!(
            "nft add rule {SILENCE} in ip saddr 127.0.0.2 tcp sport {} drop",
            self.port
        ));
    }

    pub fn off(&self) {
        sh(&format!("nft flush chain {SILENCE} in"));
    }
}

/// Sends every new connection root opens to `to` (host and port) on to
/// local port `port` instead (nftables `redirect`): a proxy put in front
/// of a server without its clients knowing. Connections already open, and
/// those of other users (a proxy running as `postgres`), go where they
/// were dialed. A later call replaces the earlier one's redirect.
pub fn redirect(to: (&str, u16), port: u16) {
    assert!(inside(), "a redirect only inside the test's network namespace");
    sh("nft add table ip dbmutex_redirect");
    sh("nft add chain ip dbmutex_redirect out '{ type nat hook output priority -100; }'");
    sh("nft flush chain ip dbmutex_redirect out");
    sh(&format!(
        "nft add rule ip dbmutex_redirect out meta skuid 0 ip daddr {} tcp dport {} redirect to :{port}",
        to.0, to.1
    ));
}

/// Rewrites the source of every new connection to `to` (host and port) to
/// `source` (nftables `snat`: an address, and a port range if given): a
/// client behind NAT, whose server sees another end than the client's own.
pub fn snat(to: (&str, u16), source: &str) {
    assert!(inside(), "a NAT only inside the test's network namespace");
    sh("nft add table ip dbmutex_snat");
    sh("nft add chain ip dbmutex_snat post '{ type nat hook postrouting priority 100; }'");
    sh(&format!(
        "nft add rule ip dbmutex_snat post ip daddr {} tcp dport {} snat to {source}",
        to.0, to.1
    ));
}
