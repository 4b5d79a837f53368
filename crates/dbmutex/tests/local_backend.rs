//! Local-backend specifics through the public API: lock files shared with
//! other processes (util-linux `flock(1)`, and this test binary re-run as a
//! child that holds a lock), holders per guard, synchronous release, file
//! URLs and directories. Behaviour shared with the other backends
//! (exclusion, timeouts, hand-off, cancellation, unsupported options) is in
//! `behaviour.rs`.

#[path = "common/lines.rs"]
mod lines;
use lines::Child;
#[path = "common/tempdir.rs"]
mod tempdir;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dbmutex::{BackendKind, Error, LockOptions, Locker, Mode};
use tempdir::TempDir;

/// Set in a child process: the name of the lock it holds.
const CHILD_ENV: &str = "DBMUTEX_TEST_CHILD_LOCK";
/// Set to `shared` in a child process that holds its lock shared.
const CHILD_MODE_ENV: &str = "DBMUTEX_TEST_CHILD_MODE";
const FLOCK: &str = "/usr/bin/flock";

/// A locker on `dir`. Two lockers on one directory have separate in-process
/// arbitration, so only the file lock keeps them apart, as for two processes.
async fn local(dir: &TempDir) -> Locker {
    Locker::local_builder(Some(dir.path().to_owned()))
        .connect()
        .await
        .unwrap()
}

/// This test binary, re-run as a child that holds `name` in `dir` (found
/// through `DBMUTEX_LOCK_DIR`) until its stdin closes.
fn dbmutex_child(dir: &TempDir, name: &str, mode: Mode) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.env(CHILD_ENV, name)
        .env(CHILD_MODE_ENV, mode.as_str())
        .env("DBMUTEX_LOCK_DIR", dir.path());
    Child::spawn(&mut cmd)
}

/// The child's body runs before libtest's `main` (an ELF constructor, as the
/// `ctor` crate makes them), so it is not a test: it does not show in the
/// test list, and cannot pass by doing nothing. In every other run of this
/// binary it returns at once.
#[used]
#[link_section = ".init_array"]
static CHILD_MAIN: extern "C" fn() = child_main;

extern "C" fn child_main() {
    let Ok(name) = std::env::var(CHILD_ENV) else {
        return;
    };
    let shared = std::env::var(CHILD_MODE_ENV).is_ok_and(|m| m == "shared");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locker = Locker::local_builder(None).connect().await.unwrap();
        let opts = LockOptions::try_once().shared(shared);
        let guard = locker
            .acquire(name.as_str(), &opts)
            .await
            .unwrap()
            .expect("the parent left the lock free");
        println!("ready");
        let _ = std::io::stdin().read_line(&mut String::new());
        guard.release().await.unwrap();
        println!("released");
    });
    std::process::exit(0);
}

/// Shared holders are listed one per guard, with this process's pid (the
/// exclusion itself is tested in `behaviour.rs`).
#[tokio::test]
async fn shared_holders_are_listed_per_guard() {
    let dir = TempDir::new("local-shared");
    let (a, b) = (local(&dir).await, local(&dir).await);
    let shared = LockOptions::try_once().shared(true);
    let s1 = a.acquire("doc", &shared).await.unwrap().expect("first reader");
    let s2 = a
        .acquire("doc", &shared)
        .await
        .unwrap()
        .expect("reader, same locker");
    let s3 = b
        .acquire("doc", &shared)
        .await
        .unwrap()
        .expect("reader, other locker");
    assert_eq!(s3.mode(), Mode::Shared);
    assert!(
        a.try_lock("doc").await.unwrap().is_none(),
        "writer refused in process"
    );
    assert!(b.try_lock("doc").await.unwrap().is_none(), "writer refused");
    let holders = b.holders("doc").await.unwrap();
    let me = i64::from(std::process::id());
    assert_eq!(holders.len(), 3, "one per guard: {holders:?}");
    assert!(
        holders.iter().all(|h| (h.mode, h.pid) == (Mode::Shared, me)),
        "{holders:?}"
    );
    drop((s1, s2));
    assert!(b.try_lock("doc").await.unwrap().is_none(), "one reader is left");
    s3.release().await.unwrap();
    let w = b
        .try_lock("doc")
        .await
        .unwrap()
        .expect("writer once readers are gone");
    assert!(
        a.acquire("doc", &shared).await.unwrap().is_none(),
        "reader refused"
    );
    assert!(
        b.acquire("doc", &shared).await.unwrap().is_none(),
        "reader refused in process"
    );
    w.release().await.unwrap();
}

/// A dropped guard frees its file lock synchronously (closing the file),
/// not in the background as the server backends do.
#[tokio::test]
async fn dropped_guard_frees_at_once() {
    let dir = TempDir::new("local-try");
    let (a, b) = (local(&dir).await, local(&dir).await);
    assert!(!b.is_locked("job").await.unwrap());
    let g = a.try_lock("job").await.unwrap().expect("free");
    assert!(a.try_lock("job").await.unwrap().is_none(), "same locker");
    assert!(b.try_lock("job").await.unwrap().is_none(), "other locker");
    assert!(b.is_locked("job").await.unwrap());
    assert_eq!(a.held_count(), 1);
    drop(g);
    assert_eq!(a.held_count(), 0);
    assert!(!b.is_locked("job").await.unwrap(), "dropping frees at once");
    let g = b.try_lock("job").await.unwrap().expect("free after the drop");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_1_and_dbmutex_exclude_each_other() {
    assert!(
        Path::new(FLOCK).exists(),
        "{FLOCK} (util-linux) is needed for this test"
    );
    let dir = TempDir::new("local-flock");
    let l = local(&dir).await;
    let path = dir.path().join(l.key_of("shell").unwrap());
    let flock_now = |mode: &str| {
        let status = Command::new(FLOCK)
            .args(["-n", "-E", "3", mode])
            .arg(&path)
            .arg("true")
            .status()
            .unwrap();
        status.code()
    };

    let g = l.lock("shell").await.unwrap();
    assert_eq!(flock_now("-x"), Some(3), "flock -x refused while we hold");
    assert_eq!(flock_now("-s"), Some(3), "flock -s refused while we hold");
    drop(g);
    assert_eq!(flock_now("-x"), Some(0), "free after our release");
    let s = l
        .acquire("shell", &LockOptions::new().shared(true))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(flock_now("-s"), Some(0), "shared with our shared lock");
    assert_eq!(
        flock_now("-x"),
        Some(3),
        "exclusive refused under our shared lock"
    );
    drop(s);

    // flock(1) holds until its stdin closes.
    let mut child =
        Child::spawn(
            Command::new(FLOCK)
                .arg("-x")
                .arg(&path)
                .args(["sh", "-c", "echo held; read _; true"]),
        );
    child.expect_line("held");
    assert!(
        l.try_lock("shell").await.unwrap().is_none(),
        "refused while flock(1) holds"
    );
    assert!(l.is_locked("shell").await.unwrap());
    let holders = l.holders("shell").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!((holders[0].pid, holders[0].mode), (child.pid(), Mode::Exclusive));
    assert_eq!(holders[0].application, None, "our stale note is not flock(1)'s");
    let l2 = l.clone();
    let waiter = tokio::spawn(async move {
        let g = l2
            .acquire("shell", &LockOptions::new().timeout(Duration::from_secs(10)))
            .await;
        (Instant::now(), g.unwrap().expect("acquired after flock(1) exits"))
    });
    // Lets the waiter start polling (no assertion depends on it).
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!waiter.is_finished(), "the waiter waits while flock(1) holds");
    let told = Instant::now();
    child.close_stdin();
    let status = child.child.wait().unwrap();
    let exited = Instant::now();
    assert!(status.success(), "flock(1): {status}");
    let (at, g) = waiter.await.unwrap();
    assert!(at >= told, "took the lock while flock(1) held it");
    // Polls are at most 20 ms apart; slack for a loaded machine.
    let late = at.saturating_duration_since(exited);
    assert!(
        late < Duration::from_millis(1000),
        "took the lock {late:?} after flock(1) exited"
    );
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_dbmutex_process_contends_and_is_reported() {
    let dir = TempDir::new("local-process");
    let l = local(&dir).await;

    let child = dbmutex_child(&dir, "xproc", Mode::Exclusive);
    child.expect_line("ready");
    assert!(
        l.try_lock("xproc").await.unwrap().is_none(),
        "refused while the child holds"
    );
    let bounded = LockOptions::new().timeout(Duration::from_millis(200));
    assert!(l.acquire("xproc", &bounded).await.unwrap().is_none());
    let holders = l.holders("xproc").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!((holders[0].pid, holders[0].mode), (child.pid(), Mode::Exclusive));
    assert_eq!(holders[0].application.as_deref(), Some("dbmutex"));
    let listed = l.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name.as_deref(), Some("xproc"));
    assert_eq!(listed[0].key, l.key_of("xproc").unwrap());
    assert_eq!(listed[0].holder.pid, child.pid());

    // A holder that dies (here: killed) frees its lock; its stale note is
    // replaced by the next holder's.
    drop(child);
    let g = l
        .acquire("xproc", &LockOptions::new().timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("freed when its holder died");
    assert_eq!(
        l.holders("xproc").await.unwrap()[0].pid,
        i64::from(std::process::id())
    );
    drop(g);

    // A shared holder elsewhere: readers share, a writer waits for it.
    let mut child = dbmutex_child(&dir, "xproc", Mode::Shared);
    child.expect_line("ready");
    let shared = LockOptions::try_once().shared(true);
    let r = l.acquire("xproc", &shared).await.unwrap().expect("readers share");
    let mut pids: Vec<i64> = l.holders("xproc").await.unwrap().iter().map(|h| h.pid).collect();
    pids.sort();
    let mut want = vec![child.pid(), i64::from(std::process::id())];
    want.sort();
    assert_eq!(pids, want, "both readers are listed");
    drop(r);
    let l2 = l.clone();
    let writer = tokio::spawn(async move {
        let g = l2.lock("xproc").await.unwrap();
        (Instant::now(), g)
    });
    // Lets the writer start waiting (no assertion depends on it).
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!writer.is_finished(), "the writer waits for the other process");
    let told = Instant::now();
    child.close_stdin();
    child.expect_line("released");
    let (at, g) = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer gets the lock once the child released it")
        .unwrap();
    assert!(at >= told, "the writer took the lock while the child held it");
    g.release().await.unwrap();
}

#[tokio::test]
async fn file_urls_and_directories() {
    let base = TempDir::new("local-url");
    let dir = base.path().join("nested/locks");
    let l = Locker::connect(&format!("file://{}", dir.display()))
        .await
        .unwrap();
    assert_eq!(l.backend(), BackendKind::Local);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "a directory we create is private");

    let g = l.lock("report").await.unwrap();
    let file = dir.join(l.key_of("report").unwrap());
    assert!(file.is_file());
    g.release().await.unwrap();
    assert!(file.is_file(), "lock files stay after release");
    assert!(l.list().await.unwrap().is_empty(), "nothing held, nothing listed");

    let not_a_dir = base.path().join("plain-file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let err = Locker::local_builder(Some(not_a_dir.clone()))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains(&*not_a_dir.to_string_lossy())),
        "{err}"
    );
}

/// `with_lock_result`: the closure's error and dbmutex's come out of one
/// `?`; "not acquired" stays an outcome, and the lock is released on error.
#[tokio::test]
async fn with_lock_result_unpacks_in_one_step() {
    #[derive(Debug, PartialEq)]
    enum AppError {
        Lock(String),
        Parse,
    }
    impl From<Error> for AppError {
        fn from(e: Error) -> Self {
            AppError::Lock(e.to_string())
        }
    }
    let dir = TempDir::new("local-result");
    let (a, b) = (local(&dir).await, local(&dir).await);
    let opts = LockOptions::try_once();
    let ok = a
        .with_lock_result("job", &opts, || async { Ok::<_, AppError>(7) })
        .await;
    assert_eq!(ok, Ok(dbmutex::Outcome::Acquired(7)));
    let failed = a
        .with_lock_result("job", &opts, || async { Err::<u8, _>(AppError::Parse) })
        .await;
    assert_eq!(failed, Err(AppError::Parse));
    assert!(
        b.try_lock("job").await.unwrap().is_some(),
        "an error left the lock held"
    );
    let held = b.lock("job").await.unwrap();
    let busy = a
        .with_lock_result("job", &opts, || async { Ok::<_, AppError>(1) })
        .await;
    assert_eq!(busy, Ok(dbmutex::Outcome::NotAcquired));
    drop(held);
    let invalid = a
        .with_lock_result("", &opts, || async { Ok::<_, AppError>(1) })
        .await;
    assert!(matches!(invalid, Err(AppError::Lock(m)) if m.contains("invalid lock name")));
}

/// Two lockers (two sets of descriptors, as two processes have), each
/// holding 1 ms and asking again at once: both get turns. Without turns the
/// releaser wins the file back nearly every time (5.5 % hand-offs measured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lockers_take_turns() {
    let dir = TempDir::new("local-turns");
    let lockers = [local(&dir).await, local(&dir).await];
    let last = std::sync::Arc::new(std::sync::Mutex::new((usize::MAX, 0u32, [0u32; 2])));
    let until = Instant::now() + Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for (i, l) in lockers.into_iter().enumerate() {
        let last = last.clone();
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new().timeout(Duration::from_secs(5));
            while Instant::now() < until {
                let g = l
                    .acquire("turns", &opts)
                    .await
                    .unwrap()
                    .expect("acquired within 5 s");
                {
                    let mut s = last.lock().unwrap();
                    if s.0 != usize::MAX && s.0 != i {
                        s.1 += 1;
                    }
                    s.0 = i;
                    s.2[i] += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, handoffs, per) = *last.lock().unwrap();
    let total = per[0] + per[1];
    let share = f64::from(handoffs) / f64::from(total.max(1));
    assert!(
        share >= 0.3 && per[0].min(per[1]) * 4 >= total,
        "hand-offs {handoffs} of {total} ({share:.2}), per locker {per:?}"
    );
}
