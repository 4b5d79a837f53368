//! `dbmutex run` on a private 3-member etcd cluster (the library's test
//! harness, `common/private_etcd.rs`, started here; a cluster that cannot
//! start fails the test): exclusion, `-n` busy, a waiter that runs after
//! the holder, fencing tokens in the child's environment, and the refusal
//! of `-s`.

#[path = "../../dbmutex/tests/common/private.rs"]
mod private;
#[path = "../../dbmutex/tests/common/private_etcd.rs"]
mod private_etcd;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");

fn dbmutex(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--database-url").arg(url).args(args).stdin(Stdio::null());
    c
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn wait_for_file(p: &Path, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if p.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn run_excludes_waits_and_fences_on_etcd() {
    let etcd = private_etcd::PrivateEtcd::start();
    let url = etcd.url();
    let dir = std::env::temp_dir().join(format!("dbmutex-cli-etcd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("cli-etcd-{}", std::process::id());
    let started = dir.join("started");
    let tokens = dir.join("tokens");
    // The holder writes its token, says it started, holds for 2 s.
    let script = format!(
        "echo $DBMUTEX_FENCE >> {t}; touch {s}; sleep 2",
        t = tokens.display(),
        s = started.display()
    );
    let mut holder = dbmutex(&url, &["run", "--fence", &name, "--", "sh", "-c", &script])
        .spawn()
        .expect("start dbmutex");
    assert!(
        wait_for_file(&started, Duration::from_secs(20)),
        "the holder never started"
    );

    // Busy: -n exits 75 at once, without running its command.
    let busy = dbmutex(&url, &["run", "-n", &name, "--", "touch", "/nonexistent/never"])
        .output()
        .unwrap();
    assert_eq!(code(&busy), 75, "{}", String::from_utf8_lossy(&busy.stderr));

    // A waiter runs after the holder, with a greater token.
    let t = Instant::now();
    let after = format!("echo $DBMUTEX_FENCE >> {}", tokens.display());
    let waiter = dbmutex(
        &url,
        &["run", "--fence", "-w", "20", &name, "--", "sh", "-c", &after],
    )
    .output()
    .unwrap();
    assert_eq!(code(&waiter), 0, "{}", String::from_utf8_lossy(&waiter.stderr));
    assert!(
        t.elapsed() >= Duration::from_millis(1000),
        "the waiter did not wait: {:?}",
        t.elapsed()
    );
    assert!(holder.wait().unwrap().success());
    let seen: Vec<u64> = std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().expect("a numeric token"))
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0] < seen[1], "tokens not increasing: {seen:?}");

    // Shared locks: a usage error naming the backend, before connecting.
    let shared = dbmutex(&url, &["run", "-s", &name, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&shared), 64);
    assert!(String::from_utf8_lossy(&shared.stderr).contains("etcd backend"));

    // init: nothing to create, and it says why (not "beside the lock files").
    let init = dbmutex(&url, &["init"]).output().unwrap();
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));
    let said = String::from_utf8_lossy(&init.stdout);
    assert!(
        said.contains("revisions") && !said.contains("lock files"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
