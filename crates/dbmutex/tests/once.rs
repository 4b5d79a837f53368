//! Once-per-window runs (`Locker::once_per`, `LockGuard::start_run`) on
//! every backend, against the real servers: one run per window across
//! lockers ("processes") racing on one tick; the record (start, host, pid,
//! end, exit status) read back without the lock; the window measured on
//! the server's clock; a lost lock keeps the start only; refusals.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{mysql_raw, pg_raw, unique, Backend};
use dbmutex::runs::{OncePer, RunStart};
use dbmutex::{Error, LockOptions};
use mysql_async::prelude::Queryable;

const HOUR: Duration = Duration::from_secs(3600);

fn opts() -> LockOptions {
    LockOptions::new().timeout(Duration::from_secs(20))
}

/// A run, then a second within the window from another locker: not due,
/// with the first run's record; a third locker reads the same record
/// without the lock; a zero window runs again (run 2).
async fn runs_once_and_keeps_the_record(backend: Backend) {
    let name = unique("once-record");
    let (a, b) = (backend.locker().await, backend.locker().await);
    let out = a
        .once_per(name.as_str(), HOUR, &opts(), || async { 7 })
        .await
        .unwrap();
    assert_eq!(out, OncePer::Ran(7), "{backend:?}: the first run is due");
    let out = b
        .once_per(name.as_str(), HOUR, &opts(), || async { 8 })
        .await
        .unwrap();
    let OncePer::NotDue(last) = out else {
        panic!("{backend:?}: a second run within the hour ran: {out:?}")
    };
    assert_eq!(
        (last.run, last.pid, last.exit_code),
        (1, std::process::id(), Some(0)),
        "{backend:?} {last:?}"
    );
    assert!(!last.host.is_empty() && last.finished_at.is_some(), "{last:?}");
    assert!(last.finished_at.unwrap() >= last.started_at, "{last:?}");
    assert!(last.ago < Duration::from_secs(30), "{last:?}");
    assert!(
        common::free_for(&a, &name).await,
        "{backend:?}: not due leaves the lock free"
    );

    let c = backend.locker().await;
    let read = c.last_run(name.as_str()).await.unwrap().expect("a record");
    assert_eq!(
        (read.run, read.started_at, &read.host),
        (1, last.started_at, &last.host)
    );
    assert_eq!(c.last_run(unique("once-never").as_str()).await.unwrap(), None);

    let out = c
        .once_per(name.as_str(), Duration::ZERO, &opts(), || async {})
        .await
        .unwrap();
    assert_eq!(out, OncePer::Ran(()), "{backend:?}: a zero window is always due");
    assert_eq!(c.last_run(name.as_str()).await.unwrap().unwrap().run, 2);
}

/// 8 lockers on one tick, each waiting for the lock: exactly one runs, the
/// other 7 find it done (none times out, none runs a second time).
async fn one_run_per_tick(backend: Backend) {
    let name = unique("once-tick");
    let mut lockers = Vec::new();
    for _ in 0..8 {
        lockers.push(backend.locker().await);
    }
    let ran = Arc::new(AtomicUsize::new(0));
    let tick = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = lockers
        .into_iter()
        .map(|l| {
            let (name, ran, tick) = (name.clone(), ran.clone(), tick.clone());
            tokio::spawn(async move {
                tick.wait().await;
                l.once_per(name.as_str(), HOUR, &opts(), || async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                })
                .await
                .unwrap()
            })
        })
        .collect();
    let mut ran_count = 0;
    let mut not_due = 0;
    for t in tasks {
        match t.await.unwrap() {
            OncePer::Ran(()) => ran_count += 1,
            OncePer::NotDue(last) => {
                assert_eq!(last.run, 1, "{last:?}");
                not_due += 1;
            }
            OncePer::NotAcquired => panic!("{backend:?}: a worker gave up waiting"),
        }
    }
    assert_eq!(
        (ran_count, not_due, ran.load(Ordering::SeqCst)),
        (1, 7, 1),
        "{backend:?}"
    );
}

/// The guard-level calls: a run started and finished with an exit status
/// by hand; a second start under the same hold is not due.
async fn guard_records_the_exit_status(backend: Backend) {
    let name = unique("once-guard");
    let l = backend.locker().await;
    let g = l.lock(name.as_str()).await.unwrap();
    let RunStart::Due(run) = g.start_run(HOUR).await.unwrap() else {
        panic!("{backend:?}: due")
    };
    assert_eq!(run.number(), 1);
    let before = l.last_run(name.as_str()).await.unwrap().unwrap();
    assert_eq!(
        (before.finished_at, before.exit_code),
        (None, None),
        "running: no end yet"
    );
    assert!(matches!(g.start_run(HOUR).await.unwrap(), RunStart::NotDue(_)));
    g.finish_run(&run, Some(3)).await.unwrap();
    g.release().await.unwrap();
    let after = l.last_run(name.as_str()).await.unwrap().unwrap();
    assert_eq!((after.run, after.exit_code), (1, Some(3)), "{backend:?}");
    assert!(after.finished_at.is_some());
}

/// Dropping the call mid-run releases the lock; the start stays recorded
/// (the window is used) with no end.
async fn a_cancelled_run_keeps_its_start(backend: Backend) {
    let name = unique("once-cancel");
    let l = backend.locker().await;
    let o = opts();
    let call = l.once_per(name.as_str(), HOUR, &o, std::future::pending::<()>);
    assert!(tokio::time::timeout(Duration::from_millis(500), call)
        .await
        .is_err());
    assert!(
        common::free_for(&backend.locker().await, &name).await,
        "{backend:?}: released"
    );
    let last = l
        .last_run(name.as_str())
        .await
        .unwrap()
        .expect("the start is recorded");
    assert_eq!((last.run, last.finished_at), (1, None));
    let again = l
        .once_per(name.as_str(), HOUR, &opts(), || async {})
        .await
        .unwrap();
    assert!(matches!(again, OncePer::NotDue(_)), "{again:?}");
}

/// Cancelled at each await point of the call (the run statements'
/// included) until it completes: never a lock left held, and the closure
/// never run twice.
async fn cancelled_at_each_await_point(backend: Backend) {
    let (l, other) = (backend.locker().await, backend.locker().await);
    let name = unique("once-cut");
    let ran = AtomicUsize::new(0);
    let o = opts();
    let out = common::cancel_at_each_await_point(&other, &name, || {
        l.once_per(name.as_str(), HOUR, &o, || async {
            ran.fetch_add(1, Ordering::SeqCst);
        })
    })
    .await
    .unwrap();
    assert!(matches!(out, OncePer::Ran(()) | OncePer::NotDue(_)), "{out:?}");
    assert!(ran.load(Ordering::SeqCst) <= 1);
    assert_eq!(l.held_count(), 0);
}

/// Shared and transaction locks exclude no other starter: refused before
/// anything is taken. Inside the closure, the same lock is re-entrant.
async fn refusals_and_reentry(backend: Backend) {
    let l = backend.locker().await;
    let name = unique("once-refuse");
    for o in [
        LockOptions::new().shared(true),
        LockOptions::new().transaction(true),
    ] {
        let e = l
            .once_per(name.as_str(), HOUR, &o, || async {})
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{backend:?} {o:?}: {e:?}");
    }
    let inner = l.clone();
    let n = name.clone();
    let out = l
        .once_per(name.as_str(), HOUR, &opts(), || async move {
            inner
                .with_lock(n.as_str(), &LockOptions::try_once(), || async { 1 })
                .await
        })
        .await
        .unwrap();
    assert!(
        matches!(out, OncePer::Ran(Ok(dbmutex::Outcome::Acquired(1)))),
        "{out:?}"
    );
    let (inner, n) = (l.clone(), name.clone());
    let nested = tokio::time::timeout(
        Duration::from_secs(10),
        l.with_lock(name.as_str(), &opts(), || async move {
            inner
                .once_per(n.as_str(), Duration::ZERO, &opts(), || async {})
                .await
        }),
    )
    .await
    .expect("a nested once_per does not wait for its own task's hold")
    .unwrap();
    assert!(
        matches!(nested, dbmutex::Outcome::Acquired(Err(Error::Unsupported(_)))),
        "{backend:?}: {nested:?}"
    );
}

for_each_backend! {
    [
        runs_once_and_keeps_the_record,
        one_run_per_tick,
        guard_records_the_exit_status,
        a_cancelled_run_keeps_its_start,
        cancelled_at_each_await_point,
        refusals_and_reentry,
    ]
    postgres: [lost_lock_keeps_the_start_only],
    mysql: [lost_lock_keeps_the_start_only],
    local: [],
}

/// A transaction-level lock's record would roll back with its transaction:
/// the guard-level start is refused with `Unsupported`, like `once_per`.
#[tokio::test]
async fn postgres_transaction_lock_cannot_start_a_run() {
    let l = Backend::Postgres.locker().await;
    let name = unique("once-xact");
    let g = l
        .acquire(name.as_str(), &LockOptions::new().transaction(true))
        .await
        .unwrap()
        .unwrap();
    let e = g.start_run(HOUR).await.unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    g.release().await.unwrap();
    assert_eq!(l.last_run(name.as_str()).await.unwrap(), None);
}

/// A holder whose session is killed after its start was recorded cannot
/// record an end (nor could it start another); the next worker finds the
/// window used.
async fn lost_lock_keeps_the_start_only(backend: Backend) {
    let name = unique("once-lost");
    let a = backend.locker().await;
    let g = a.lock(name.as_str()).await.unwrap();
    let RunStart::Due(run) = g.start_run(HOUR).await.unwrap() else {
        panic!("due")
    };
    let pid = a.holders(name.as_str()).await.unwrap()[0].pid;
    backend.kill_session(pid).await;
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("the loss is noticed");
    let e = g.finish_run(&run, Some(0)).await.unwrap_err();
    assert!(matches!(e, Error::LockLost { .. }), "{backend:?}: {e:?}");
    let b = backend.locker().await;
    let last = b.last_run(name.as_str()).await.unwrap().unwrap();
    assert_eq!((last.run, last.finished_at), (1, None), "{backend:?}");
    let out = b
        .once_per(name.as_str(), HOUR, &opts(), || async {})
        .await
        .unwrap();
    assert!(matches!(out, OncePer::NotDue(_)), "{out:?}");
}

/// Whether a run is due is the server's judgement: a record whose start
/// the server's clock puts 2 h back is due under a 1 h window; one it puts
/// 10 min in the future (a clock set back) is not, and reads as 0 s ago.
async fn window_is_on_the_servers_clock(backend: Backend, shift: impl AsyncFn(&str, i64)) {
    let name = unique("once-clock");
    let l = backend.locker().await;
    assert_eq!(
        l.once_per(name.as_str(), HOUR, &opts(), || async {})
            .await
            .unwrap(),
        OncePer::Ran(())
    );
    let key = l.key_of(name.as_str()).unwrap();
    shift(&key, -7200).await;
    let out = l
        .once_per(name.as_str(), HOUR, &opts(), || async {})
        .await
        .unwrap();
    assert_eq!(
        out,
        OncePer::Ran(()),
        "{backend:?}: started 2 h ago by the server's clock"
    );
    shift(&key, 600).await;
    let out = l
        .once_per(name.as_str(), HOUR, &opts(), || async {})
        .await
        .unwrap();
    let OncePer::NotDue(last) = out else {
        panic!("{backend:?}: a start in the future ran: {out:?}")
    };
    assert_eq!(last.ago, Duration::ZERO, "{last:?}");
}

#[tokio::test]
async fn postgres_window_is_on_the_servers_clock() {
    window_is_on_the_servers_clock(Backend::Postgres, async |key: &str, secs: i64| {
        let sql = format!(
            "UPDATE dbmutex_runs SET started_at = clock_timestamp() + make_interval(secs => {secs}) \
             WHERE lock_key = $1"
        );
        assert_eq!(pg_raw().await.execute(&sql, &[&key]).await.unwrap(), 1);
    })
    .await;
}

#[tokio::test]
async fn mysql_window_is_on_the_servers_clock() {
    window_is_on_the_servers_clock(Backend::Mysql, async |key: &str, secs: i64| {
        let mut c = mysql_raw().await;
        c.exec_drop(
            "UPDATE dbmutex_runs SET started_at = UTC_TIMESTAMP(6) + INTERVAL ? SECOND WHERE lock_key = ?",
            (secs, key.as_bytes()),
        )
        .await
        .unwrap();
        assert_eq!(c.affected_rows(), 1);
    })
    .await;
}

/// Least privilege on PostgreSQL: a role that may not create the table is
/// told to run `dbmutex init` and the call takes nothing; with the table
/// made by `create_tables` and the documented grants, it runs.
#[tokio::test]
async fn postgres_least_privilege_needs_init_and_the_documented_grants() {
    let sandbox = common::PgSandbox::new("once_priv").await;
    let app = sandbox.locker_as(&sandbox.role).await;
    let name = unique("once-priv");
    let e = app
        .once_per(name.as_str(), HOUR, &opts(), || async {})
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("dbmutex_runs") && m.contains("dbmutex init")),
        "{e:?}"
    );
    assert!(common::free_for(&Backend::Postgres.locker().await, &name).await);
    assert_eq!(
        app.last_run(name.as_str()).await.unwrap(),
        None,
        "no table: no run"
    );
    let admin = sandbox.locker_as("postgres").await;
    admin.create_tables().await.unwrap();
    sandbox.grant("dbmutex_runs").await;
    let out = app
        .once_per(name.as_str(), HOUR, &opts(), || async { 1 })
        .await
        .unwrap();
    assert_eq!(out, OncePer::Ran(1));
    drop((app, admin));
    sandbox.remove().await;
}

#[tokio::test]
async fn local_window_is_on_the_hosts_clock() {
    let dir = Backend::Local.url().trim_start_matches("file://").to_owned();
    window_is_on_the_servers_clock(Backend::Local, async |key: &str, secs: i64| {
        let path = std::path::Path::new(&dir).join(format!("{key}.run"));
        let text = std::fs::read_to_string(&path).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        // The local backend's clock is the boot clock (`boot_us`), the
        // wall-clock start (`started_us`) only for show: both move.
        let shifted: String = text
            .lines()
            .map(|l| {
                if l.starts_with("started_us=") {
                    format!("started_us={}\n", now + secs * 1_000_000)
                } else if let Some(at) = l.strip_prefix("boot_us=") {
                    format!("boot_us={}\n", at.parse::<i64>().unwrap() + secs * 1_000_000)
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        assert_ne!(text, shifted);
        std::fs::write(&path, shifted).unwrap();
    })
    .await;
}
