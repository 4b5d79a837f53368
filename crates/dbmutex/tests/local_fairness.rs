//! Turns between processes on the local backend (issue #11): real processes
//! (this test binary re-run as children) contending for one lock file take
//! turns first come, first served, and a waiter that stops, dies or gives up
//! blocks nobody. Structure, not speed: the figures are the bench's
//! (`dbmutex-bench --scenario fairness`).

#[path = "common/lines.rs"]
mod lines;
use lines::Child;
#[path = "common/tempdir.rs"]
mod tempdir;

use std::io::BufRead;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dbmutex::{LockOptions, Locker};
use tempdir::TempDir;

/// Set in a child: what it does (`loop` or `wait`) with the lock `fair`.
const CHILD_ENV: &str = "DBMUTEX_FAIR_CHILD";
const NAME: &str = "fair";
/// How long a `loop` child holds the lock each time.
const HOLD: Duration = Duration::from_millis(1);
/// How long the `loop` children contend.
const CONTEND: Duration = Duration::from_millis(1000);

/// The tickets of processes waiting now in `dir` (`<lock file>.q<n>`).
fn tickets(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.rsplit_once(".q")
                .is_some_and(|(_, n)| n.parse::<u64>().is_ok())
        })
        .count()
}

/// Waits until `n` tickets exist in `dir`.
async fn await_tickets(dir: &Path, n: usize) {
    let until = Instant::now() + Duration::from_secs(30);
    while tickets(dir) < n {
        assert!(Instant::now() < until, "never {n} waiters queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// This test binary, re-run as a child doing `what` in `dir`.
fn spawn_child(dir: &TempDir, what: &str) -> Child {
    Child::spawn(
        Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, what)
            .env("DBMUTEX_LOCK_DIR", dir.path()),
    )
}

/// The child's body runs before libtest's `main` (an ELF constructor), as in
/// `local_backend.rs`; in every other run of this binary it returns at once.
#[used]
#[link_section = ".init_array"]
static CHILD_MAIN: extern "C" fn() = child_main;

extern "C" fn child_main() {
    let Ok(what) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locker = Locker::local_builder(None).connect().await.unwrap();
        let opts = LockOptions::new().timeout(Duration::from_secs(60));
        let mut stdin = std::io::stdin().lock();
        if what == "wait" {
            println!("asking");
            let g = locker.acquire(NAME, &opts).await.unwrap().expect("acquired");
            println!("got");
            let _ = stdin.read_line(&mut String::new());
            drop(g);
            return;
        }
        // `loop`: hold 1 ms, ask again at once, for CONTEND; print each
        // acquisition as `<time it was granted, ns> <wait, µs>`.
        println!("ready");
        let _ = stdin.read_line(&mut String::new());
        let end = Instant::now() + CONTEND;
        while Instant::now() < end {
            let asked = Instant::now();
            let g = locker.acquire(NAME, &opts).await.unwrap().expect("acquired");
            let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
            println!("{at} {}", asked.elapsed().as_micros());
            std::thread::sleep(HOLD);
            g.release().await.unwrap();
        }
        println!("done");
    });
    std::process::exit(0);
}

/// Two processes, each holding 1 ms and asking again at once, alternate:
/// nearly every acquisition is a hand-off, both progress alike, and nobody
/// waits long. Without turns the releaser wins the file back nearly every
/// time; with round 4's yielding, about half the acquisitions were
/// hand-offs.
/// The tests of this binary one at a time: the alternation test measures a
/// share of hand-offs between two processes, which the other tests' own
/// processes (on 2 cores) would measure instead (0.79 in one full-suite run,
/// 0.98-1.00 alone).
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[test]
fn two_processes_alternate() {
    let _alone = ALONE.blocking_lock();
    let dir = TempDir::new("fair-alternate");
    let mut children = [spawn_child(&dir, "loop"), spawn_child(&dir, "loop")];
    for c in &children {
        assert_eq!(c.line(), "ready");
    }
    for c in &mut children {
        c.say("go");
    }
    let mut log = Vec::new();
    for (i, c) in children.iter().enumerate() {
        loop {
            let line = c.line();
            if line == "done" {
                break;
            }
            let (at, wait) = line.split_once(' ').unwrap();
            let (at, wait): (u128, u64) = (at.parse().unwrap(), wait.parse().unwrap());
            log.push((at, i, Duration::from_micros(wait)));
        }
    }
    log.sort();
    let per = [0, 1].map(|i| log.iter().filter(|(_, who, _)| *who == i).count());
    let total = log.len();
    let handoffs = log.windows(2).filter(|w| w[0].1 != w[1].1).count();
    let share = handoffs as f64 / (total.max(2) - 1) as f64;
    let max_wait = log.iter().map(|e| e.2).max().unwrap_or_default();
    let summary =
        format!("{total} acquisitions {per:?}, {handoffs} hand-offs ({share:.3}), longest wait {max_wait:?}");
    eprintln!("{summary}");
    assert!(
        per[0].min(per[1]) * 10 >= total * 4,
        "both progress alike: {summary}"
    );
    // 0.98-1.00 alone, 0.766 once in a full CI run on a busy 2-core
    // machine; what this guards against gives ~0.5 (yielding without
    // turns) or ~0 (no turns).
    assert!(share >= 0.7, "they alternate: {summary}");
    // 1 ms holds: a wait of 200 holds is starvation, not load.
    assert!(max_wait < HOLD * 200, "nobody waits long: {summary}");
}

/// A waiter whose process is stopped (SIGSTOP) stays queued but is passed
/// over; one whose process is killed (SIGKILL) leaves the queue with its
/// process. Either way the next waiter gets the lock once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_or_killed_waiters_block_nobody() {
    let _alone = ALONE.lock().await;
    let dir = TempDir::new("fair-stuck");
    let holder = Locker::local_builder(Some(dir.path().to_owned()))
        .connect()
        .await
        .unwrap();
    let next = Locker::local_builder(Some(dir.path().to_owned()))
        .connect()
        .await
        .unwrap();
    for sig in ["-STOP", "-KILL"] {
        let held = holder
            .acquire(NAME, &LockOptions::try_once())
            .await
            .unwrap()
            .unwrap();
        let first = spawn_child(&dir, "wait");
        assert_eq!(first.line(), "asking");
        await_tickets(dir.path(), 1).await;
        let waiter = {
            let next = next.clone();
            tokio::spawn(async move {
                next.acquire(NAME, &LockOptions::new().timeout(Duration::from_secs(20)))
                    .await
                    .unwrap()
            })
        };
        await_tickets(dir.path(), 2).await;
        first.signal(sig);
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .unwrap_or_else(|_| panic!("a {sig} waiter blocked the next"))
            .unwrap();
        assert!(got.is_some(), "{sig}: the next waiter got the lock");
        assert_eq!(first.printed(), None, "{sig}: the first never got it");
        drop(got);
        first.signal("-KILL");
        drop(first);
    }
}

/// A waiter that gives up (its acquisition is dropped) leaves the queue at
/// once, and the next gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_queue() {
    let _alone = ALONE.lock().await;
    let dir = TempDir::new("fair-cancel");
    let lockers: Vec<Locker> = lockers_on(&dir, 3).await;
    let held = lockers[0]
        .acquire(NAME, &LockOptions::try_once())
        .await
        .unwrap()
        .unwrap();
    let wait = LockOptions::new().timeout(Duration::from_secs(20));
    let gives_up = {
        let (l, wait) = (lockers[1].clone(), wait.clone());
        tokio::spawn(async move { l.acquire(NAME, &wait).await })
    };
    await_tickets(dir.path(), 1).await;
    let next = {
        let l = lockers[2].clone();
        tokio::spawn(async move { l.acquire(NAME, &wait).await.unwrap() })
    };
    await_tickets(dir.path(), 2).await;
    gives_up.abort();
    assert!(gives_up.await.unwrap_err().is_cancelled());
    // A try in flight on the blocking pool when the task was aborted still
    // finishes there, and drops the ticket it carried then: within
    // moments, not at once.
    let until = Instant::now() + Duration::from_secs(2);
    while tickets(dir.path()) > 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(tickets(dir.path()), 1, "the cancelled waiter's ticket is gone");
    drop(held);
    let got = tokio::time::timeout(Duration::from_secs(15), next)
        .await
        .expect("the next waiter is not blocked")
        .unwrap();
    assert!(got.is_some());
    drop(got);
    assert_eq!(tickets(dir.path()), 0, "no ticket left");
}

async fn lockers_on(dir: &TempDir, n: usize) -> Vec<Locker> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(
            Locker::local_builder(Some(dir.path().to_owned()))
                .connect()
                .await
                .unwrap(),
        );
    }
    v
}
