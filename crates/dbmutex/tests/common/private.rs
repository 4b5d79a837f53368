//! What every private server of the tests shares (see `private_pg.rs`,
//! `private_mariadb.rs`): a directory of its own under `$TMPDIR`, owned by
//! this test process, and the guarantee that the server in it is stopped
//! and the directory removed however the test process ends.
//!
//! - [`Instance::stop`] (called by the servers' `Drop` and by the `atexit`
//!   hook for shared instances) stops the server and removes the directory;
//! - a watchdog (`sh`, in a process group of its own, SIGINT/SIGTERM/SIGHUP
//!   ignored) holds a pipe from the test process and does the same when the
//!   pipe closes, so a test binary killed by SIGKILL, Ctrl-C or a runner's
//!   timeout leaves no server behind;
//! - [`Instance::create`] first sweeps directories with the same prefix
//!   whose owning process (pid and start time, in `owner`) is gone, in case
//!   the watchdog was killed too.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

extern "C" {
    fn geteuid() -> u32;
    pub(crate) fn atexit(cb: extern "C" fn()) -> i32;
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { geteuid() == 0 }
}

/// The uid and gid of an OS user (`postgres`, `mysql`).
pub(crate) fn user_ids(user: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 3 && f[0] == user {
            return (f[2].parse().unwrap(), f[3].parse().unwrap());
        }
    }
    panic!("running as root, but there is no `{user}` OS user to run a private server as");
}

/// A free TCP port on 127.0.0.1 (free now: the caller retries if the
/// server loses a race for it).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .unwrap()
        .port()
}

/// `pid starttime` of a process, which together identify it across pid reuse.
fn process_identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); fields after the parenthesised command name.
    let rest = &stat[stat.rfind(')')? + 2..];
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid} {start}"))
}

/// Runs `cmd` to completion, panicking with its output (and `context`) on failure.
pub(crate) fn run(mut cmd: Command, what: &str, context: impl FnOnce() -> String) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("private server: cannot run {what} ({cmd:?}): {e}"));
    if !out.status.success() {
        panic!(
            "private server: {what} failed ({}):\n{}{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            context()
        );
    }
}

/// A private server's directory and its cleanup.
pub(crate) struct Instance {
    dir: PathBuf,
    /// Shell code that stops the server whose directory is `$1`.
    stop_sh: String,
    /// The watchdog and the write end of its pipe; `None` once stopped.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

/// `sh -c '<stop_sh>; rm -rf "$1"' _ dir`: stops a server, removes its directory.
fn stop_and_remove(stop_sh: &str, dir: &Path) {
    let _ = Command::new("sh")
        .args(["-c", &format!("{stop_sh}\nrm -rf \"$1\""), "dbmutex-private-stop"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Instance {
    /// Sweeps stale `$TMPDIR/<prefix>*` directories (stopping their servers
    /// with `stop_sh`), then creates `$TMPDIR/<prefix><pid>-<n>/`, owned by
    /// `os_user` when we are root, and its watchdog.
    pub(crate) fn create(prefix: &str, stop_sh: String, os_user: &str) -> Instance {
        static N: AtomicU64 = AtomicU64::new(0);
        sweep_stale(prefix, &stop_sh);
        let dir = std::env::temp_dir().join(format!(
            "{prefix}{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the private server's directory");
        std::fs::write(
            dir.join("owner"),
            process_identity(std::process::id()).expect("/proc/self/stat"),
        )
        .unwrap();
        if is_root() {
            let (uid, gid) = user_ids(os_user);
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .expect("chown the private server's directory");
        }
        // A shell that waits for its stdin to close (we exited, or stop()
        // dropped the pipe), then stops the server and removes the directory.
        let script = format!("trap '' INT TERM HUP\ncat >/dev/null\n{stop_sh}\nrm -rf \"$1\"");
        let mut child = Command::new("sh")
            // A process group of its own: a signal to the test's group (a
            // runner's timeout, Ctrl-C) does not reach it.
            .process_group(0)
            .args(["-c", &script, "dbmutex-private-watchdog"])
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the private server's watchdog (sh)");
        let stdin = child.stdin.take().unwrap();
        Instance {
            dir,
            stop_sh,
            watchdog: Mutex::new(Some((child, stdin))),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the server and removes the directory. Idempotent.
    pub(crate) fn stop(&self) {
        let taken = self.watchdog.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((mut child, stdin)) = taken {
            // Closing the pipe tells the watchdog to do it; wait for it (bounded).
            drop(stdin);
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => return,
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            // The watchdog is stuck: do it here.
            let _ = child.kill();
            stop_and_remove(&self.stop_sh, &self.dir);
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops and removes every `<prefix>*` directory whose owning process is gone.
fn sweep_stale(prefix: &str, stop_sh: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(prefix) {
            continue;
        }
        let dir = e.path();
        let Ok(owner) = std::fs::read_to_string(dir.join("owner")) else {
            continue; // being created right now, or not ours
        };
        let owner = owner.trim();
        let alive = owner
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .and_then(process_identity)
            .is_some_and(|id| id == owner);
        if !alive {
            stop_and_remove(stop_sh, &dir);
        }
    }
}

/// Polls until a PostgreSQL-protocol server (a pooler of the test's own)
/// at `url` answers `SELECT 1`, every 50 ms; panics after `within`, with
/// `what` and its log.
pub async fn until_answers(url: &str, within: Duration, what: &str, log: impl Fn() -> String) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok((c, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            tokio::spawn(conn);
            if c.simple_query("SELECT 1").await.is_ok() {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not answer within {within:?}; its log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
