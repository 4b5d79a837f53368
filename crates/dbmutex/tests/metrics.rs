//! Metrics (feature `metrics`), read back from an in-memory recorder, on
//! every backend against the real servers: each way an acquisition or a
//! hold ends is counted once, and `dbmutex_held` is back to 0 after each.
//!
//! The recorder is global (tokio may poll a lock's futures and its loss
//! watcher on other threads), so this binary's tests take turns (`SERIAL`)
//! and each compares totals before and after what it does. Each test awaits
//! every task it spawns, so nothing of one test records during the next.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{eventually, free_for, pg_raw, unique, Backend, CancelAfter};
use dbmutex::postgres::{lock_session, lock_xact};
use dbmutex::{Error, LockOptions, Mode, Outcome, Prefix, WaitStrategy};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const SETTLE: Duration = Duration::from_secs(10);
const STRATEGIES: [WaitStrategy; 2] = [WaitStrategy::Poll, WaitStrategy::Server];

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test's turn, with the recorder installed (before the first
/// acquisition of the process: the series are described then).
async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    let t = SERIAL.lock().await;
    snapshotter();
    t
}

/// A series: metric name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// Every series' value since the recorder was installed. The debugging
/// recorder's snapshots hand out what changed since the previous snapshot
/// (counters and gauges are reset to 0, histograms emptied), so each
/// snapshot is added to these running totals.
#[derive(Clone, Default, Debug)]
struct Totals {
    counters: HashMap<Series, u64>,
    gauges: HashMap<Series, f64>,
    histograms: HashMap<Series, Vec<f64>>,
    /// Each metric's unit and description, as described to the recorder.
    described: HashMap<String, (Option<metrics::Unit>, String)>,
}

fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let r = DebuggingRecorder::new();
        let s = r.snapshotter();
        r.install().expect("the only recorder of this test binary");
        s
    })
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut l: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    (name.to_owned(), l)
}

/// The totals now.
fn totals() -> Totals {
    static T: Mutex<Option<Totals>> = Mutex::new(None);
    let snap = snapshotter().snapshot();
    let mut t = T.lock().unwrap();
    let t = t.get_or_insert_with(Totals::default);
    for (ck, unit, description, value) in snap.into_vec() {
        let (_, key) = ck.into_parts();
        if let Some(d) = description {
            t.described.insert(key.name().to_owned(), (unit, d.to_string()));
        }
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let s = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => *t.counters.entry(s).or_default() += n,
            DebugValue::Gauge(g) => *t.gauges.entry(s).or_default() += g.into_inner(),
            DebugValue::Histogram(v) => t
                .histograms
                .entry(s)
                .or_default()
                .extend(v.into_iter().map(|x| x.into_inner())),
        }
    }
    t.clone()
}

impl Totals {
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters.get(&series(name, labels)).copied().unwrap_or(0)
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.histograms
            .get(&series(name, labels))
            .map_or(&[], Vec::as_slice)
    }

    /// `dbmutex_acquisitions_total` for one backend, mode and outcome.
    fn acquisitions(&self, b: Backend, mode: Mode, outcome: &str) -> u64 {
        self.counter(
            "dbmutex_acquisitions_total",
            &[
                ("backend", b.kind().as_str()),
                ("mode", mode.as_str()),
                ("outcome", outcome),
            ],
        )
    }

    /// `dbmutex_wait_seconds` for one backend, mode and outcome.
    fn waits(&self, b: Backend, mode: Mode, outcome: &str) -> &[f64] {
        self.histogram(
            "dbmutex_wait_seconds",
            &[
                ("backend", b.kind().as_str()),
                ("mode", mode.as_str()),
                ("outcome", outcome),
            ],
        )
    }

    fn holds(&self, b: Backend, mode: Mode) -> &[f64] {
        self.histogram(
            "dbmutex_hold_seconds",
            &[("backend", b.kind().as_str()), ("mode", mode.as_str())],
        )
    }

    fn losses(&self, b: Backend) -> u64 {
        self.counter(
            "dbmutex_losses_total",
            &[("backend", b.kind().as_str()), ("mode", "exclusive")],
        )
    }

    /// `dbmutex_held` summed over every series of backend `b` (both modes,
    /// any name).
    fn held(&self, b: Backend) -> f64 {
        self.gauges
            .iter()
            .filter(|((n, l), _)| {
                n == "dbmutex_held" && l.iter().any(|(k, v)| k == "backend" && v == b.kind().as_str())
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// How much each outcome's count grew from `before` to `after` (exclusive
/// mode), in the order acquired, not_acquired, timed_out, deadlock, error,
/// cancelled.
fn outcomes(before: &Totals, after: &Totals, b: Backend, mode: Mode) -> [u64; 6] {
    [
        "acquired",
        "not_acquired",
        "timed_out",
        "deadlock",
        "error",
        "cancelled",
    ]
    .map(|o| after.acquisitions(b, mode, o) - before.acquisitions(b, mode, o))
}

/// `dbmutex_held` for `b` is 0, now or soon (a loss is counted by a task).
async fn held_back_to_zero(b: Backend) {
    assert!(
        eventually(SETTLE, || async { totals().held(b) == 0.0 }).await,
        "{b:?}: dbmutex_held stays at {}",
        totals().held(b)
    );
}

/// Acquired (lock, scoped call, shared), busy, timed out, released,
/// dropped: one count each, a wait and a hold time each, the gauge up while
/// held and back to 0.
async fn each_ending_counts_once(b: Backend) {
    let (a, other) = (b.locker().await, b.locker().await);
    let name = unique("m-end");
    let t0 = totals();
    assert_eq!(t0.held(b), 0.0, "{b:?}: nothing held before");

    let g = a.lock(name.as_str()).await.unwrap();
    assert_eq!(totals().held(b), 1.0, "{b:?}: one held");
    assert!(other.try_lock(name.as_str()).await.unwrap().is_none());
    let bounded = LockOptions::new().timeout(Duration::from_millis(150));
    assert!(other.acquire(name.as_str(), &bounded).await.unwrap().is_none());
    assert_eq!(
        totals().held(b),
        1.0,
        "{b:?}: a refused acquisition holds nothing"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    g.release().await.unwrap();
    assert_eq!(totals().held(b), 0.0, "{b:?}: released");

    let dropped = other.lock(name.as_str()).await.unwrap();
    assert_eq!(totals().held(b), 1.0);
    drop(dropped);
    assert_eq!(totals().held(b), 0.0, "{b:?}: dropped");

    // A scoped call, with a re-entrant call inside it (no acquisition: no
    // count).
    let got = eventually(SETTLE, || free_for(&a, &name)).await;
    assert!(got, "{b:?}: the dropped guard's unlock was queued");
    let t1 = totals();
    let inner = a
        .with_lock(name.as_str(), &LockOptions::new(), || async {
            assert_eq!(totals().held(b), 1.0);
            a.with_lock(name.as_str(), &LockOptions::new(), || async { totals().held(b) })
                .await
                .unwrap()
        })
        .await
        .unwrap();
    assert_eq!(
        inner,
        Outcome::Acquired(Outcome::Acquired(1.0)),
        "{b:?}: re-entrant call holds nothing more"
    );
    let t2 = totals();
    assert_eq!(t2.held(b), 0.0, "{b:?}: scoped call ended");
    assert_eq!(
        outcomes(&t1, &t2, b, Mode::Exclusive),
        [1, 0, 0, 0, 0, 0],
        "{b:?}: scoped call"
    );

    let x = Mode::Exclusive;
    // acquired: lock, lock (dropped), the probe of free_for (one or more
    // tries: its successes are acquisitions too), with_lock.
    let probes = t1.acquisitions(b, x, "acquired") - t0.acquisitions(b, x, "acquired") - 2;
    let busy_probes = t1.acquisitions(b, x, "not_acquired") - t0.acquisitions(b, x, "not_acquired") - 1;
    assert_eq!(probes, 1, "{b:?}: free_for succeeded once");
    assert_eq!(
        outcomes(&t0, &t2, b, x),
        [4, 1 + busy_probes, 1, 0, 0, 0],
        "{b:?}: acquired / not_acquired / timed_out / deadlock / error / cancelled"
    );
    let waits = |o| t2.waits(b, x, o).len() - t0.waits(b, x, o).len();
    assert_eq!(
        (waits("acquired"), waits("not_acquired"), waits("timed_out")),
        (4, 1 + busy_probes as usize, 1),
        "{b:?}: one wait time per acquisition"
    );
    let timed_out = *t2.waits(b, x, "timed_out").last().unwrap();
    assert!(
        (0.14..5.0).contains(&timed_out),
        "{b:?}: timed-out wait {timed_out}s"
    );
    let holds = &t2.holds(b, x)[t0.holds(b, x).len()..];
    assert_eq!(holds.len(), 4, "{b:?}: one hold time per guard: {holds:?}");
    assert!(
        holds[0] >= 0.05,
        "{b:?}: the first guard was held 50 ms: {holds:?}"
    );
    assert_eq!(t2.losses(b), t0.losses(b), "{b:?}: nothing lost");
    eprintln!(
        "{b:?}: outcomes {:?}, timed-out wait {timed_out:.3}s, hold times {holds:.3?}",
        outcomes(&t0, &t2, b, x)
    );

    if b.supports_shared() {
        let s = LockOptions::new().mode(Mode::Shared);
        let (s1, s2) = (
            a.acquire(name.as_str(), &s).await.unwrap().unwrap(),
            other.acquire(name.as_str(), &s).await.unwrap().unwrap(),
        );
        assert_eq!(
            totals().held(b),
            2.0,
            "{b:?}: two shared holders, counted once per guard"
        );
        drop((s1, s2));
        let t4 = totals();
        assert_eq!(
            outcomes(&t2, &t4, b, Mode::Shared),
            [2, 0, 0, 0, 0, 0],
            "{b:?}: shared"
        );
        assert_eq!(
            t4.holds(b, Mode::Shared).len() - t2.holds(b, Mode::Shared).len(),
            2
        );
    }
    held_back_to_zero(b).await;
}

/// An acquisition whose future is dropped mid-wait counts as `cancelled`
/// and leaves the gauge alone; so does one that fails (`error`).
async fn cancelled_and_failed_acquisitions(b: Backend) {
    let (a, other) = (b.locker().await, b.locker().await);
    let name = unique("m-cancel");
    let g = a.lock(name.as_str()).await.unwrap();
    let t0 = totals();
    for strategy in STRATEGIES {
        let opts = LockOptions::new().wait_strategy(strategy);
        let waiting =
            tokio::time::timeout(Duration::from_millis(200), other.acquire(name.as_str(), &opts)).await;
        assert!(waiting.is_err(), "{b:?} {strategy:?}: still waiting when dropped");
        // And dropped at its first await point.
        let early = CancelAfter::new(other.acquire(name.as_str(), &opts), 0).await;
        assert!(early.is_none(), "{b:?} {strategy:?}");
    }
    g.release().await.unwrap();
    let t1 = totals();
    assert_eq!(
        outcomes(&t0, &t1, b, Mode::Exclusive),
        [0, 0, 0, 0, 0, 4],
        "{b:?}: cancelled"
    );
    assert_eq!(t1.held(b), 0.0, "{b:?}: a cancelled acquisition holds nothing");
    assert!(
        eventually(SETTLE, || free_for(&a, &name)).await,
        "{b:?}: no cancelled waiter took the lock"
    );

    // Errors: past the cap, and an invalid name.
    let capped = b.connect(b.builder().max_locks(1)).await;
    let t2 = totals();
    let g = capped.lock(name.as_str()).await.unwrap();
    let err = capped.lock(unique("m-cap").as_str()).await.unwrap_err();
    assert!(matches!(err, Error::TooManyLocks { .. }), "{err:?}");
    assert!(matches!(capped.try_lock("").await, Err(Error::InvalidName(_))));
    drop(g);
    let t3 = totals();
    let [acquired, .., error, _] = outcomes(&t2, &t3, b, Mode::Exclusive);
    assert_eq!((acquired, error), (1, 2), "{b:?}: errors");
    held_back_to_zero(b).await;
}

/// A lost lock: the gauge goes down when the loss is known (before the
/// guard is dropped), once; one loss, one hold time.
async fn a_loss_counts_once(b: Backend) {
    let a = b.locker().await;
    let x = Mode::Exclusive;
    for strategy in STRATEGIES {
        let name = unique("m-lost");
        let t0 = totals();
        let g = a
            .acquire(name.as_str(), &LockOptions::new().wait_strategy(strategy))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(totals().held(b), 1.0);
        let holders = a.holders(name.as_str()).await.unwrap();
        let lost = g.lost();
        b.kill_session(holders[0].pid).await;
        tokio::time::timeout(SETTLE, lost).await.expect("loss reported");
        // The guard is still here: the gauge is down all the same.
        held_back_to_zero(b).await;
        let t1 = totals();
        assert_eq!(t1.losses(b) - t0.losses(b), 1, "{b:?} {strategy:?}: one loss");
        assert_eq!(
            t1.holds(b, x).len() - t0.holds(b, x).len(),
            1,
            "{b:?} {strategy:?}: one hold"
        );
        assert!(g.release().await.is_err(), "releasing a lost lock reports it");
        let t2 = totals();
        assert_eq!(t2.held(b), 0.0, "{b:?} {strategy:?}: not decremented twice");
        assert_eq!(
            t2.losses(b),
            t1.losses(b),
            "{b:?} {strategy:?}: not counted twice"
        );
        assert_eq!(
            t2.holds(b, x).len(),
            t1.holds(b, x).len(),
            "{b:?} {strategy:?}: one hold time"
        );
    }

    // A scoped call stopped by the loss: the call's drop and the watcher
    // race to record it; one wins.
    let name = unique("m-lost-scoped");
    let t0 = totals();
    let (a2, n2) = (a.clone(), name.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let work = tokio::spawn(async move {
        a2.with_lock(n2.as_str(), &LockOptions::new(), || async move {
            tx.send(()).unwrap();
            std::future::pending::<()>().await
        })
        .await
    });
    rx.await.unwrap();
    let holders = a.holders(name.as_str()).await.unwrap();
    b.kill_session(holders[0].pid).await;
    let r = tokio::time::timeout(SETTLE, work)
        .await
        .expect("the scoped call stops")
        .unwrap();
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
    held_back_to_zero(b).await;
    let t1 = totals();
    assert_eq!(t1.losses(b) - t0.losses(b), 1, "{b:?}: scoped call, one loss");
    assert_eq!(
        t1.holds(b, x).len() - t0.holds(b, x).len(),
        1,
        "{b:?}: scoped call, one hold"
    );
    assert_eq!(outcomes(&t0, &t1, b, x), [1, 0, 0, 0, 0, 0]);
}

/// The name label only when asked for, and then per name.
async fn name_label_is_opt_in(b: Backend) {
    let (plain, named) = (
        b.locker().await,
        b.connect(b.builder().metrics_name_label(true)).await,
    );
    let (n1, n2) = (unique("m-plain"), unique("m-named"));
    plain.lock(n1.as_str()).await.unwrap().release().await.unwrap();
    let g = named.lock(n2.as_str()).await.unwrap();
    let t = totals();
    let with_name = |n: &str| {
        t.counters
            .keys()
            .chain(t.gauges.keys())
            .chain(t.histograms.keys())
            .filter(|(_, l)| l.iter().any(|(k, v)| k == "name" && v == n))
            .count()
    };
    assert_eq!(with_name(&n1), 0, "{b:?}: no name label by default");
    // acquisitions, wait, hold, held.
    assert_eq!(with_name(&n2), 4, "{b:?}: name label on request: {t:#?}");
    let labels = [
        ("backend", b.kind().as_str()),
        ("mode", "exclusive"),
        ("name", n2.as_str()),
    ];
    assert_eq!(t.gauges.get(&series("dbmutex_held", &labels)), Some(&1.0));
    g.release().await.unwrap();
    assert_eq!(totals().gauges.get(&series("dbmutex_held", &labels)), Some(&0.0));
    held_back_to_zero(b).await;
}

macro_rules! for_each_backend {
    ($($body:ident),* $(,)?) => {
        mod local {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $body() {
                let _turn = super::turn().await;
                super::$body(super::Backend::Local).await;
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $body() {
                let _turn = super::turn().await;
                super::$body(super::Backend::Postgres).await;
            })*
        }
        mod mysql {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $body() {
                let _turn = super::turn().await;
                super::$body(super::Backend::Mysql).await;
            })*
        }
    };
}

for_each_backend!(
    each_ending_counts_once,
    cancelled_and_failed_acquisitions,
    name_label_is_opt_in
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_loss() {
    let _turn = turn().await;
    a_loss_counts_once(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_loss() {
    let _turn = turn().await;
    a_loss_counts_once(Backend::Mysql).await;
}

/// One side of a PostgreSQL deadlock in a caller's transaction
/// (`lock_xact`: a Locker's own locks sit on separate connections per
/// wait, which form no cycle the server sees).
async fn pg_deadlock_side(
    first: String,
    second: String,
    both_hold: Arc<tokio::sync::Barrier>,
) -> Result<bool, Error> {
    let mut c = pg_raw().await;
    let tx = c.transaction().await.unwrap();
    let p = Prefix::none();
    assert!(lock_xact(&tx, first.as_str(), &LockOptions::try_once(), &p)
        .await
        .unwrap()
        .is_ok());
    both_hold.wait().await;
    let wait = LockOptions::new()
        .timeout(Duration::from_secs(5))
        .wait_strategy(WaitStrategy::Server);
    let r = lock_xact(&tx, second.as_str(), &wait, &p).await;
    tx.rollback().await.unwrap();
    r.map(|got| got.is_ok())
}

/// PostgreSQL's deadlock victim (40P01) counts as `deadlock`; `lock_xact`
/// counts acquisitions but never the gauge (its release is the caller's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deadlock() {
    let _turn = turn().await;
    let b = Backend::Postgres;
    let (n1, n2) = (unique("m-dl1"), unique("m-dl2"));
    let t0 = totals();
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let s1 = tokio::spawn(pg_deadlock_side(n1.clone(), n2.clone(), barrier.clone()));
    let s2 = tokio::spawn(pg_deadlock_side(n2, n1, barrier));
    let (r1, r2) = (s1.await.unwrap(), s2.await.unwrap());
    match (&r1, &r2) {
        (Err(e), Ok(true)) | (Ok(true), Err(e)) => assert!(e.is_deadlock(), "{e:?}"),
        other => panic!("expected one deadlock victim, got {other:?}"),
    }
    let t1 = totals();
    assert_eq!(
        outcomes(&t0, &t1, b, Mode::Exclusive),
        [3, 0, 0, 1, 0, 0],
        "postgres deadlock"
    );
    assert_eq!(
        t1.waits(b, Mode::Exclusive, "deadlock").len() - t0.waits(b, Mode::Exclusive, "deadlock").len(),
        1
    );
    assert_eq!(
        t1.holds(b, Mode::Exclusive).len(),
        t0.holds(b, Mode::Exclusive).len(),
        "lock_xact: no hold time"
    );
    assert_eq!(t1.held(b), 0.0);
}

/// Waits until the session holding MySQL lock `key` waits for another
/// lock in the server (state `User lock`).
async fn mysql_holder_waits(key: &str) {
    use mysql_async::prelude::Queryable;
    let mut c = common::mysql_raw().await;
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let state: Option<(Option<String>,)> = c
            .exec_first(
                "SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(?)",
                (key,),
            )
            .await
            .unwrap();
        if matches!(state, Some((Some(s),)) if s == "User lock") {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the holder of {key} never waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// MySQL's deadlock victim (nested scoped calls in crossed order, on the
/// enclosing locks' sessions) counts as `deadlock`, and every hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_deadlock() {
    let _turn = turn().await;
    let b = Backend::Mysql;
    let (a, c) = (b.locker().await, b.locker().await);
    let (n1, n2) = (unique("m-dl1"), unique("m-dl2"));
    let t0 = totals();
    let both_in = Arc::new(tokio::sync::Barrier::new(2));
    let side = |l: dbmutex::Locker,
                first: String,
                second: String,
                both_in: Arc<tokio::sync::Barrier>,
                after_waiter_of: Option<String>| async move {
        l.with_lock(first.as_str(), &LockOptions::new(), || async {
            both_in.wait().await;
            if let Some(key) = after_waiter_of {
                mysql_holder_waits(&key).await;
            }
            l.with_lock(second.as_str(), &LockOptions::new(), || async {})
                .await
        })
        .await
    };
    // The second side closes the cycle once the first waits in the
    // server (as in mysql_backend.rs): requests crossing at the same
    // instant may both be refused.
    let key1 = a.key_of(n1.as_str()).unwrap();
    let s1 = tokio::spawn(side(a, n1.clone(), n2.clone(), both_in.clone(), None));
    let s2 = tokio::spawn(side(c, n2, n1, both_in, Some(key1)));
    let (r1, r2) = (s1.await.unwrap().unwrap(), s2.await.unwrap().unwrap());
    let (Outcome::Acquired(i1), Outcome::Acquired(i2)) = (r1, r2) else {
        panic!("both outer locks acquired");
    };
    match (&i1, &i2) {
        (Err(e), Ok(Outcome::Acquired(()))) | (Ok(Outcome::Acquired(())), Err(e)) => {
            assert!(e.is_deadlock(), "{e:?}")
        }
        other => panic!("expected one deadlock victim, got {other:?}"),
    }
    let t1 = totals();
    assert_eq!(
        outcomes(&t0, &t1, b, Mode::Exclusive),
        [3, 0, 0, 1, 0, 0],
        "mysql deadlock"
    );
    assert_eq!(
        t1.holds(b, Mode::Exclusive).len() - t0.holds(b, Mode::Exclusive).len(),
        3
    );
    held_back_to_zero(b).await;
}

/// Locks on the caller's own connection (`postgres::lock_session`) count as
/// any: acquisitions, and a hold from the guard to its release or drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_caller_connection() {
    let _turn = turn().await;
    let b = Backend::Postgres;
    let x = Mode::Exclusive;
    let (c1, c2) = (pg_raw().await, pg_raw().await);
    let (name, p) = (unique("m-caller"), Prefix::none());
    let once = LockOptions::try_once();
    let t0 = totals();
    let g = lock_session(&c1, name.as_str(), &once, &p)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(totals().held(b), 1.0, "a caller guard holds");
    assert!(lock_session(&c2, name.as_str(), &once, &p)
        .await
        .unwrap()
        .is_err());
    let bounded = LockOptions::new().timeout(Duration::from_millis(100));
    assert!(lock_session(&c2, name.as_str(), &bounded, &p)
        .await
        .unwrap()
        .is_err());
    g.release().await.unwrap();
    assert_eq!(totals().held(b), 0.0, "released");
    let g = lock_session(&c2, name.as_str(), &once, &p)
        .await
        .unwrap()
        .expect("free again");
    assert_eq!(totals().held(b), 1.0);
    drop(g);
    let t1 = totals();
    assert_eq!(t1.held(b), 0.0, "dropped");
    assert_eq!(outcomes(&t0, &t1, b, x), [2, 1, 1, 0, 0, 0], "caller connection");
    assert_eq!(
        t1.holds(b, x).len() - t0.holds(b, x).len(),
        2,
        "one hold time per guard"
    );
}

/// Every series has its unit and a description.
#[tokio::test]
async fn series_are_described() {
    let _turn = turn().await;
    let b = Backend::Local;
    let l = b.locker().await;
    let name = unique("m-describe");
    l.lock(name.as_str()).await.unwrap().release().await.unwrap();
    let t = totals();
    use metrics::Unit::{Count, Seconds};
    for (metric, unit) in [
        ("dbmutex_acquisitions_total", Count),
        ("dbmutex_wait_seconds", Seconds),
        ("dbmutex_held", Count),
        ("dbmutex_hold_seconds", Seconds),
    ] {
        let (u, d) = t
            .described
            .get(metric)
            .unwrap_or_else(|| panic!("{metric} not described: {t:#?}"));
        assert_eq!((*u, d.is_empty()), (Some(unit), false), "{metric}");
    }
}
