//! A private 3-member etcd cluster (Debian's `etcd-server`, 3.4), for the
//! etcd backend's tests.
//!
//! ```ignore
//! let etcd = PrivateEtcd::start();
//! let locker = Locker::builder(&etcd.url()).connect().await?;
//! etcd.kill(etcd.leader().await);      // SIGKILL one member
//! etcd.etcdctl(&["lease", "revoke", "694d..."]);
//! ```
//!
//! `start` runs three `etcd` members in a fresh
//! `$TMPDIR/dbmutex-private-etcd-<pid>-<n>/` (one data directory each),
//! client and peer URLs on free 127.0.0.1 ports only, with short
//! heartbeats (50 ms) and elections (500 ms) so a leader kill is over in
//! about a second; waits until the cluster answers a write. Members are
//! stopped with `kill -9` and the directory removed on drop, at exit of
//! the test process, or by the watchdog if the test process is killed (see
//! `private.rs`). Programs come from `DBMUTEX_ETCD_BINDIR`, else `PATH`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::private::{atexit, free_port, Instance};

/// The prefix of every private cluster's directory under `$TMPDIR`.
pub const DIR_PREFIX: &str = "dbmutex-private-etcd-";

/// Shell code that stops the members whose instance directory is `$1`.
const STOP_SH: &str =
    "for f in \"$1\"/*.pid; do [ -f \"$f\" ] && kill -9 \"$(cat \"$f\")\" 2>/dev/null; done";

/// The cluster's size.
pub const MEMBERS: usize = 3;

/// One member's ports.
#[derive(Clone, Copy, Debug)]
struct Ports {
    client: u16,
    peer: u16,
}

/// A 3-member etcd cluster of this test process, on 127.0.0.1.
pub struct PrivateEtcd {
    instance: Instance,
    ports: Vec<Ports>,
    members: Mutex<Vec<Option<Child>>>,
    /// Member `i` runs as group `base + i` and also takes clients on
    /// 127.0.0.2 (see [`PrivateEtcd::start_partitionable`]).
    gid_base: Option<u32>,
}

fn program(name: &str) -> PathBuf {
    match std::env::var("DBMUTEX_ETCD_BINDIR") {
        Ok(d) => PathBuf::from(d).join(name),
        Err(_) => PathBuf::from(name),
    }
}

/// The cluster shared by the tests of this process that leave it whole.
static SHARED: OnceLock<PrivateEtcd> = OnceLock::new();

extern "C" fn stop_shared_at_exit() {
    if let Some(etcd) = SHARED.get() {
        for i in 0..MEMBERS {
            etcd.kill(i);
        }
        etcd.instance.stop();
    }
}

impl PrivateEtcd {
    /// A cluster shared by every caller in this test process (started by
    /// the first), stopped when the process exits. A test that kills or
    /// revokes what others use must `start` its own.
    pub fn shared() -> &'static PrivateEtcd {
        SHARED.get_or_init(|| {
            // SAFETY: registers a plain extern "C" fn with no arguments.
            let rc = unsafe { atexit(stop_shared_at_exit) };
            assert_eq!(rc, 0, "atexit");
            PrivateEtcd::start()
        })
    }

    /// Starts the cluster and waits until it takes a write. Panics with the
    /// members' logs when it cannot.
    pub fn start() -> PrivateEtcd {
        Self::start_with(None)
    }

    /// As [`PrivateEtcd::start`], with member `i` running as group
    /// `gid_base + i` (so that `netns::Cut` can cut it off) and taking
    /// clients on 127.0.0.2 too ([`PrivateEtcd::member_url_via_2`]).
    pub fn start_partitionable(gid_base: u32) -> PrivateEtcd {
        Self::start_with(Some(gid_base))
    }

    fn start_with(gid_base: Option<u32>) -> PrivateEtcd {
        for attempt in 1..=3 {
            let instance = Instance::create(DIR_PREFIX, STOP_SH.to_owned(), "root");
            let ports = (0..MEMBERS)
                .map(|_| Ports {
                    client: free_port(),
                    peer: free_port(),
                })
                .collect();
            let etcd = PrivateEtcd {
                instance,
                ports,
                members: Mutex::new((0..MEMBERS).map(|_| None).collect()),
                gid_base,
            };
            for i in 0..MEMBERS {
                etcd.spawn_member(i, "new");
            }
            if etcd.wait_healthy(Duration::from_secs(30)) {
                return etcd;
            }
            // A port taken between choosing and binding: try new ports.
            eprintln!(
                "private etcd: cluster did not come up (attempt {attempt}):\n{}",
                etcd.logs()
            );
        }
        panic!("private etcd: cannot start a 3-member cluster (is etcd-server installed? scripts/test.sh installs it)");
    }

    fn initial_cluster(&self) -> String {
        self.ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://127.0.0.1:{}", p.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn_member(&self, i: usize, state: &str) {
        let dir = self.instance.dir();
        let p = self.ports[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("m{i}.log")))
            .unwrap();
        let mut cmd = Command::new(program("etcd"));
        let mut listen = format!("http://127.0.0.1:{}", p.client);
        if let Some(base) = self.gid_base {
            std::os::unix::process::CommandExt::gid(&mut cmd, base + i as u32);
            listen.push_str(&format!(",http://127.0.0.2:{}", p.client));
        }
        let child = cmd
            .arg(format!("--name=m{i}"))
            .arg(format!("--data-dir={}", dir.join(format!("m{i}")).display()))
            .arg(format!("--listen-client-urls={listen}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{}", p.client))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{}", p.peer))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                p.peer
            ))
            .arg(format!("--initial-cluster={}", self.initial_cluster()))
            .arg(format!("--initial-cluster-state={state}"))
            .arg(format!("--initial-cluster-token=dbmutex-{}", std::process::id()))
            .args(["--heartbeat-interval=50", "--election-timeout=500"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("private etcd: cannot run etcd: {e} (is etcd-server installed?)"));
        std::fs::write(dir.join(format!("m{i}.pid")), child.id().to_string()).unwrap();
        self.members.lock().unwrap()[i] = Some(child);
    }

    /// Whether `etcdctl endpoint health` passes on every live member within `within`.
    fn wait_healthy(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let live = self.live_endpoints();
            let ok = Command::new(program("etcdctl"))
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={live}"))
                .args(["--command-timeout=2s", "endpoint", "health"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn live_endpoints(&self) -> String {
        let members = self.members.lock().unwrap();
        (0..MEMBERS)
            .filter(|&i| members[i].is_some())
            .map(|i| format!("http://127.0.0.1:{}", self.ports[i].client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The members' logs, for a failure message.
    pub fn logs(&self) -> String {
        (0..MEMBERS)
            .map(|i| {
                let log = std::fs::read_to_string(self.instance.dir().join(format!("m{i}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                format!(
                    "--- m{i}:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `etcd://` with every member's client address.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.client))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// `etcd://` with member `i` only.
    pub fn member_url(&self, i: usize) -> String {
        format!("etcd://127.0.0.1:{}", self.ports[i].client)
    }

    /// `etcd://` with member `i` only, through 127.0.0.2 (a cluster from
    /// [`PrivateEtcd::start_partitionable`]).
    pub fn member_url_via_2(&self, i: usize) -> String {
        format!("etcd://127.0.0.2:{}", self.ports[i].client)
    }

    /// `http://127.0.0.1:port` of every member, for a raw client.
    pub fn endpoints(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{}", p.client))
            .collect()
    }

    /// Runs `etcdctl` (v3 API) against the live members; its stdout.
    /// Panics with its output on failure.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = Command::new(program("etcdctl"))
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.live_endpoints()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The index of the current leader (asks each live member).
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let out = Command::new(program("etcdctl"))
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={}", self.live_endpoints()))
                .args(["--command-timeout=2s", "endpoint", "status"])
                .stdin(Stdio::null())
                .output()
                .expect("run etcdctl");
            // One line per endpoint: `endpoint, id, version, size, is leader, …`.
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let f: Vec<&str> = line.split(", ").collect();
                if f.len() > 4 && f[4] == "true" {
                    if let Some(i) = self
                        .ports
                        .iter()
                        .position(|p| f[0].ends_with(&format!(":{}", p.client)))
                    {
                        return i;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("private etcd: no leader within 10 s:\n{}", self.logs());
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&self, i: usize) {
        if let Some(mut child) = self.members.lock().unwrap()[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops member `i` with SIGSTOP (or resumes it with SIGCONT): a member
    /// that holds its connections open and answers nothing, as behind a
    /// silent partition.
    pub fn freeze(&self, i: usize, frozen: bool) {
        let members = self.members.lock().unwrap();
        let pid = members[i].as_ref().expect("a live member").id();
        let sig = if frozen { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// Starts member `i` again on its data, and waits until the cluster is healthy.
    pub fn restart(&self, i: usize) {
        self.kill(i);
        self.spawn_member(i, "existing");
        assert!(
            self.wait_healthy(Duration::from_secs(30)),
            "member m{i} did not rejoin:\n{}",
            self.logs()
        );
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        for i in 0..MEMBERS {
            self.kill(i);
        }
        self.instance.stop();
    }
}
