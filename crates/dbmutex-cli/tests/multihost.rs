//! `dbmutex run` with a multi-host URL across a failover (issue #23, item
//! 3), on a private primary and streaming standby: the command runs
//! under a lock on the primary, whichever host the URL names first; when
//! the primary stops, the run ends with 70 (lock lost); after the standby
//! is promoted, the next run's lock is on the new primary.

#[path = "../../dbmutex/tests/common/private.rs"]
mod private;
#[path = "../../dbmutex/tests/common/private_pg.rs"]
mod private_pg;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use private_pg::{PrivatePg, PRIMARY};

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");

fn run(url: &str, name: &str, secs: u32) -> std::process::Child {
    Command::new(BIN)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DBMUTEX_DATABASE_URL", url)
        .args(["run", name, "--", "sleep", &secs.to_string()])
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// How many granted advisory locks `pg` has.
fn locks_on(pg: &PrivatePg) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(pg.granted_advisory_locks())
}

/// Polls until `pg` shows `want` locks (at most 10 s).
fn until_locks(pg: &PrivatePg, want: i64) {
    let until = Instant::now() + Duration::from_secs(10);
    while locks_on(pg) != want {
        assert!(Instant::now() < until, "expected {want} advisory locks");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn run_with_a_multi_host_url_follows_the_promotion() {
    let primary = PrivatePg::start(PRIMARY);
    let standby = primary.start_standby();
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/test?sslmode=disable&target_session_attrs=read-write",
        standby.port(),
        primary.port()
    );
    let mut holder = run(&url, "multi-host-cli", 60);
    until_locks(&primary, 1);
    assert_eq!(locks_on(&standby), 0, "the lock is on the primary");
    let stop = Instant::now();
    primary.shut_down();
    let status = holder.wait().unwrap();
    println!(
        "holder exited {:?} {:?} after the stop began",
        status.code(),
        stop.elapsed()
    );
    assert_eq!(status.code(), Some(70), "a lost lock is reported");
    standby.promote();
    let mut next = run(&url, "multi-host-cli", 1);
    until_locks(&standby, 1);
    assert_eq!(next.wait().unwrap().code(), Some(0));
}
