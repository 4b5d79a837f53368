//! Upgrade inside one task (issue #13, item 5): a nested scoped exclusive
//! call inside a scoped shared one for the same name, on the same locker.
//! PostgreSQL upgrades (wherever the outer shared lock lives); the local
//! backend and MySQL refuse with `Unsupported`; nothing hangs.

mod common;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Barrier};
use tokio::time::Instant;

use common::{eventually, free_for, pg_raw, unique, Backend, CancelAfter};
use dbmutex::key::{pg_key, PgKey, Prefix};
use dbmutex::{Error, LockName, LockOptions, Locker, Outcome, WaitStrategy};

const SETTLE: Duration = Duration::from_secs(10);
/// How soon a deadlock must be reported ("at once": well under the
/// server's own 1 s deadlock_timeout).
const FAST: Duration = Duration::from_millis(900);

/// Where the outer shared lock lives on PostgreSQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outer {
    /// On the lock session (default strategy, uncontended).
    LockSession,
    /// On the lock session, polling strategy.
    Poll,
    /// On a dedicated connection, with an in-process hold (the default
    /// strategy after waiting in the server behind an exclusive holder).
    AfterServerWait,
    /// On a dedicated connection without an in-process hold.
    Server,
}

const OUTERS: [Outer; 4] = [
    Outer::LockSession,
    Outer::Poll,
    Outer::AfterServerWait,
    Outer::Server,
];

impl Outer {
    fn opts(self) -> LockOptions {
        let o = LockOptions::new().shared(true);
        match self {
            Outer::Poll => o.wait_strategy(WaitStrategy::Poll),
            Outer::Server => o.wait_strategy(WaitStrategy::Server),
            Outer::LockSession | Outer::AfterServerWait => o,
        }
    }

    /// Whether the outer lock has an in-process hold (then other tasks of
    /// the locker queue behind a waiting upgrade).
    fn in_process(self) -> bool {
        self != Outer::Server
    }

    /// Runs `f` in a scoped shared call of `a` placed as `self`.
    async fn run<T, Fut: Future<Output = T>>(self, a: &Locker, name: &str, f: impl FnOnce() -> Fut) -> T {
        let blocker = if self == Outer::AfterServerWait {
            let x = Backend::Postgres.locker().await;
            let g = x.lock(name).await.unwrap();
            Some(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                g.release().await.unwrap();
                x
            }))
        } else {
            None
        };
        let out = a.with_lock(name, &self.opts(), f).await.unwrap();
        if let Some(b) = blocker {
            b.await.unwrap();
        }
        match out {
            Outcome::Acquired(v) => v,
            Outcome::NotAcquired => panic!("{self:?}: the outer shared call was not acquired"),
        }
    }
}

fn exclusive() -> LockOptions {
    LockOptions::new()
}

fn key(name: &str) -> PgKey {
    pg_key(&LockName::from(name), &Prefix::none())
}

/// The key a waiting upgrader of `key` holds (a copy of the library's
/// mapping: a change there is a change of what other processes see).
fn intent_key(key: PgKey) -> PgKey {
    let mut x = match key {
        PgKey::Pair(a, b) => (u64::from(a as u32) << 32 | u64::from(b as u32)) ^ 0x6462_6d75_7465_7821,
        PgKey::Big(v) => v as u64 ^ 0x7570_6772_6164_6521,
        k => panic!("a new kind of key: {k:?}"),
    };
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    PgKey::Big((x | 1 << 63) as i64)
}

/// Granted (shared, exclusive) holds of `key` in the server, any session.
async fn modes(c: &tokio_postgres::Client, key: PgKey) -> (i64, i64) {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let row = c
        .query_one(
            "SELECT count(*) FILTER (WHERE mode = 'ShareLock'), count(*) FILTER (WHERE mode = 'ExclusiveLock') \
             FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = $1 AND objid = $2 AND objsubid = $3",
            &[&classid, &objid, &objsubid],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Until the server shows `want` for `name` (and no intent key held).
async fn settles(c: &tokio_postgres::Client, name: &str, want: (i64, i64)) -> bool {
    eventually(SETTLE, || async {
        modes(c, key(name)).await == want && modes(c, intent_key(key(name))).await == (0, 0)
    })
    .await
}

/// `l`'s guard on `name`, shared (free or shared elsewhere: taken at once).
async fn shared_guard(l: &Locker, name: &str) -> dbmutex::LockGuard {
    l.acquire(name, &LockOptions::new().shared(true))
        .await
        .unwrap()
        .expect("shared beside shared holders")
}

/// `f`, which must not hang.
async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("hung")
}

/// An outer scoped call that ran.
fn acquired(o: Outcome<()>) {
    assert_eq!(o, Outcome::Acquired(()));
}

/// Whether `l` can take `name` in `opts`'s mode at once (released again).
async fn can_take(l: &Locker, name: &str, shared: bool) -> bool {
    let opts = LockOptions::try_once().shared(shared);
    match l.acquire(name, &opts).await.unwrap() {
        Some(g) => {
            g.release().await.unwrap();
            true
        }
        None => false,
    }
}

/// Whether another task of `l` can take `name` shared at once.
async fn other_task_can_share(l: &Locker, name: &str) -> bool {
    let (l, name) = (l.clone(), name.to_owned());
    tokio::spawn(async move { can_take(&l, &name, true).await })
        .await
        .unwrap()
}

/// The upgrade waits for every other holder (another task of the locker,
/// another locker), keeps the shared lock throughout, excludes everyone
/// while upgraded, and the lock is back to shared after the nested call.
/// Shared requests of the locker made while it waits go after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_waits_for_the_other_holders_and_ends_shared() {
    let obs = pg_raw().await;
    for outer in OUTERS {
        let (a, b) = (Backend::Postgres.locker().await, Backend::Postgres.locker().await);
        let name = unique("up-wait");
        let n = name.as_str();
        let events = Arc::new(Mutex::new(Vec::<&'static str>::new()));
        outer
            .run(&a, n, || async {
                // Another locker holds it shared (taken inside: the outer
                // call may first wait behind an exclusive holder).
                let b_guard = shared_guard(&b, n).await;
                // Another task of the locker holds it shared until told.
                let (leave, left) = oneshot::channel::<()>();
                let (inside, is_inside) = oneshot::channel();
                let (a2, n2) = (a.clone(), name.clone());
                let t2 = tokio::spawn(async move {
                    a2.with_lock(n2.as_str(), &outer.opts(), || async {
                        inside.send(()).unwrap();
                        let _ = left.await;
                    })
                    .await
                });
                is_inside.await.unwrap();
                // Releases: the other locker at 100 ms, a newcomer of the
                // locker asks at 150 ms, the other task leaves at 250 ms.
                let (ev, a3, n3) = (events.clone(), a.clone(), name.clone());
                let script = tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    ev.lock().unwrap().push("b released");
                    b_guard.release().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let ev2 = ev.clone();
                    let newcomer = tokio::spawn(async move {
                        let opts = outer.opts().timeout(SETTLE);
                        let r = a3.with_lock(n3.as_str(), &opts, || async {
                            ev2.lock().unwrap().push("newcomer in");
                        });
                        r.await.unwrap()
                    });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    ev.lock().unwrap().push("task left");
                    leave.send(()).unwrap();
                    newcomer.await.unwrap()
                });
                let got = a
                    .with_lock(n, &exclusive(), || async {
                        events.lock().unwrap().push("upgraded");
                        assert_eq!(
                            modes(&obs, key(n)).await,
                            (1, 1),
                            "{outer:?}: shared and exclusive, one session"
                        );
                        assert!(
                            !can_take(&b, n, true).await,
                            "{outer:?}: shared for another locker"
                        );
                        assert!(
                            !can_take(&b, n, false).await,
                            "{outer:?}: exclusive for another locker"
                        );
                        assert!(
                            !other_task_can_share(&a, n).await,
                            "{outer:?}: shared for another task"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        events.lock().unwrap().push("nested done");
                        7
                    })
                    .await
                    .unwrap();
                assert_eq!(got, Outcome::Acquired(7));
                // Back to shared, still held by the outer call.
                assert_eq!(
                    modes(&obs, key(n)).await.1,
                    0,
                    "{outer:?}: exclusive after the nested call"
                );
                assert!(
                    !can_take(&b, n, false).await,
                    "{outer:?}: the outer's shared lock is gone"
                );
                assert!(
                    can_take(&b, n, true).await,
                    "{outer:?}: no shared holder may join"
                );
                assert!(
                    other_task_can_share(&a, n).await,
                    "{outer:?}: no shared task may join"
                );
                assert_eq!(script.await.unwrap(), Outcome::Acquired(()));
                assert!(matches!(t2.await.unwrap(), Ok(Outcome::Acquired(()))));
            })
            .await;
        let ev = events.lock().unwrap().clone();
        let at = |e: &str| {
            ev.iter()
                .position(|x| *x == e)
                .unwrap_or_else(|| panic!("{outer:?}: no {e:?} in {ev:?}"))
        };
        assert!(
            at("upgraded") > at("b released") && at("upgraded") > at("task left"),
            "{outer:?}: {ev:?}"
        );
        if outer.in_process() {
            assert!(
                at("newcomer in") > at("nested done"),
                "{outer:?}: a newcomer overtook the upgrade: {ev:?}"
            );
        }
        assert!(
            settles(&obs, n, (0, 0)).await,
            "{outer:?}: held after the outer call"
        );
        assert_eq!(a.held_count(), 0);
    }
}

/// A try-once or a timeout while another locker stays shared ends
/// `NotAcquired`, with the shared lock intact and nothing left behind: a
/// later upgrade works once the other has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_not_acquired_in_time_keeps_the_shared_lock() {
    let obs = pg_raw().await;
    for outer in OUTERS {
        let (a, b) = (Backend::Postgres.locker().await, Backend::Postgres.locker().await);
        let name = unique("up-timeout");
        let n = name.as_str();
        outer
            .run(&a, n, || async {
                let b_guard = shared_guard(&b, n).await;
                let ran = || async { panic!("{outer:?}: ran without the exclusive lock") };
                let t0 = Instant::now();
                let r = a.with_lock(n, &LockOptions::try_once(), ran).await.unwrap();
                assert_eq!(r, Outcome::NotAcquired);
                assert!(
                    t0.elapsed() < Duration::from_millis(500),
                    "{outer:?}: a try-once waited"
                );
                let t0 = Instant::now();
                let opts = exclusive().timeout(Duration::from_millis(300));
                assert_eq!(a.with_lock(n, &opts, ran).await.unwrap(), Outcome::NotAcquired);
                assert!(
                    t0.elapsed() >= Duration::from_millis(300),
                    "{outer:?}: gave up early"
                );
                assert!(
                    settles(&obs, n, (2, 0)).await,
                    "{outer:?}: both shared, nothing more"
                );
                assert!(other_task_can_share(&a, n).await, "{outer:?}: a task is kept out");
                b_guard.release().await.unwrap();
                assert!(!can_take(&b, n, false).await, "{outer:?}: the shared lock went");
                let opts = exclusive().timeout(SETTLE);
                let r = a
                    .with_lock(n, &opts, || async { modes(&obs, key(n)).await })
                    .await;
                assert_eq!(r.unwrap(), Outcome::Acquired((1, 1)));
            })
            .await;
        assert!(
            settles(&obs, n, (0, 0)).await,
            "{outer:?}: held after the outer call"
        );
    }
}

/// Cancelled at each await point of the upgrade (contended and not), and
/// inside its closure: the outer shared lock stays, nothing exclusive (nor
/// the intent key) is left, and the next upgrade works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_upgrade_leaves_the_shared_lock_only() {
    let obs = pg_raw().await;
    for outer in OUTERS {
        let (a, b) = (Backend::Postgres.locker().await, Backend::Postgres.locker().await);
        let name = unique("up-cancel");
        let n = name.as_str();
        outer
            .run(&a, n, || async {
                let b_guard = shared_guard(&b, n).await;
                // Contended: past the try, the intent claim, the pause.
                let x = exclusive();
                for k in 0..8 {
                    let nested = a.with_lock(n, &x, || async {});
                    let r =
                        tokio::time::timeout(Duration::from_millis(200), CancelAfter::new(nested, k)).await;
                    assert!(
                        !matches!(r, Ok(Some(Ok(Outcome::Acquired(()))))),
                        "{outer:?}: upgraded past a holder"
                    );
                    assert!(
                        settles(&obs, n, (2, 0)).await,
                        "{outer:?}: after a cancellation at {k}"
                    );
                    assert!(
                        other_task_can_share(&a, n).await,
                        "{outer:?}: left queued after {k}"
                    );
                }
                b_guard.release().await.unwrap();
                // Uncontended: cancel at each await point until one completes.
                let mut k = 0;
                loop {
                    let nested = a.with_lock(n, &x, || async {});
                    if let Some(r) = CancelAfter::new(nested, k).await {
                        assert_eq!(r.unwrap(), Outcome::Acquired(()));
                        break;
                    }
                    assert!(
                        settles(&obs, n, (1, 0)).await,
                        "{outer:?}: after a cancellation at {k}"
                    );
                    k += 1;
                    assert!(k < 50, "{outer:?}: the upgrade never completed");
                }
                // Inside the closure.
                let stuck = a.with_lock(n, &x, std::future::pending::<()>);
                assert!(tokio::time::timeout(Duration::from_millis(200), stuck)
                    .await
                    .is_err());
                assert!(
                    settles(&obs, n, (1, 0)).await,
                    "{outer:?}: after a cancellation in the closure"
                );
                assert!(can_take(&b, n, true).await && !can_take(&b, n, false).await);
                let opts = exclusive().timeout(SETTLE);
                let r = a.with_lock(n, &opts, || async { modes(&obs, key(n)).await });
                assert_eq!(r.await.unwrap(), Outcome::Acquired((1, 1)), "{outer:?}");
            })
            .await;
        assert!(
            settles(&obs, n, (0, 0)).await,
            "{outer:?}: held after the outer call"
        );
        // The outer call cancelled while its nested upgrade waits, then
        // while upgraded: everything goes.
        let (opts, x) = (outer.opts(), exclusive());
        let b_guard = shared_guard(&b, n).await;
        let (tx, rx) = oneshot::channel();
        let waiting = a.with_lock(n, &opts, || async {
            tx.send(()).unwrap();
            a.with_lock(n, &x, || async {}).await
        });
        assert!(tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err());
        rx.await.expect("the outer call ran");
        b_guard.release().await.unwrap();
        let (tx, rx) = oneshot::channel();
        let upgraded = a.with_lock(n, &opts, || async {
            a.with_lock(n, &x, || async {
                tx.send(()).unwrap();
                std::future::pending::<()>().await
            })
            .await
        });
        assert!(tokio::time::timeout(Duration::from_millis(300), upgraded)
            .await
            .is_err());
        rx.await.expect("the nested call ran");
        assert!(
            settles(&obs, n, (0, 0)).await,
            "{outer:?}: held after cancelled outer calls"
        );
        assert!(eventually(SETTLE, || free_for(&b, n)).await);
    }
}

/// Two tasks of one locker that both hold the name shared and both
/// upgrade: the second fails with `Deadlock` at once; when its outer call
/// ends, the first upgrade goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upgraders_of_one_locker_deadlock_fast() {
    for outer in OUTERS {
        let a = Backend::Postgres.locker().await;
        two_upgraders(outer, a.clone(), a).await;
    }
}

/// The same between two lockers (two processes): the second to wait
/// finds the first's intent key and fails with `Deadlock` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upgraders_of_two_lockers_deadlock_fast() {
    for outer in OUTERS {
        let (a, b) = (Backend::Postgres.locker().await, Backend::Postgres.locker().await);
        two_upgraders(outer, a, b).await;
    }
}

async fn two_upgraders(outer: Outer, a: Locker, b: Locker) {
    let obs = pg_raw().await;
    let name = unique("up-deadlock");
    // Both hold it shared before either upgrades.
    let both = Arc::new(Barrier::new(2));
    let upgrade = |l: Locker, first: bool| {
        let (name, both) = (name.clone(), both.clone());
        let opts = if outer == Outer::AfterServerWait {
            LockOptions::new().shared(true)
        } else {
            outer.opts()
        };
        tokio::spawn(async move {
            let n = name.as_str();
            l.with_lock(n, &opts.timeout(SETTLE), || async {
                both.wait().await;
                if !first {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                let t0 = Instant::now();
                let r = l.with_lock(n, &exclusive().timeout(SETTLE), || async {}).await;
                (r, t0.elapsed())
            })
            .await
        })
    };
    let (first, second) = (upgrade(a, true), upgrade(b, false));
    let (r2, took) = match second.await.unwrap().unwrap() {
        Outcome::Acquired(v) => v,
        Outcome::NotAcquired => panic!("{outer:?}: outer not acquired"),
    };
    assert!(matches!(r2, Err(Error::Deadlock { .. })), "{outer:?}: {r2:?}");
    assert!(took < FAST, "{outer:?}: the deadlock took {took:?}");
    let (r1, _) = match first.await.unwrap().unwrap() {
        Outcome::Acquired(v) => v,
        Outcome::NotAcquired => panic!("{outer:?}: outer not acquired"),
    };
    assert_eq!(
        r1.unwrap(),
        Outcome::Acquired(()),
        "{outer:?}: the first upgrader"
    );
    assert!(settles(&obs, &name, (0, 0)).await, "{outer:?}");
}

/// Started together, exactly one of two upgraders in two lockers loses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_upgraders_exactly_one_loses() {
    let obs = pg_raw().await;
    for round in 0..5 {
        let (a, b) = (Backend::Postgres.locker().await, Backend::Postgres.locker().await);
        let name = unique("up-race");
        let both = Arc::new(Barrier::new(2));
        let go = |l: Locker| {
            let (name, both) = (name.clone(), both.clone());
            tokio::spawn(async move {
                let n = name.as_str();
                let shared = LockOptions::new().shared(true);
                let outer = l.with_lock(n, &shared, || async {
                    both.wait().await;
                    l.with_lock(n, &exclusive().timeout(SETTLE), || async {}).await
                });
                match outer.await.unwrap() {
                    Outcome::Acquired(r) => r,
                    Outcome::NotAcquired => panic!("outer not acquired"),
                }
            })
        };
        let (ra, rb) = (go(a), go(b));
        let rs = [ra.await.unwrap(), rb.await.unwrap()];
        let lost = rs
            .iter()
            .filter(|r| matches!(r, Err(Error::Deadlock { .. })))
            .count();
        let won = rs
            .iter()
            .filter(|r| matches!(r, Ok(Outcome::Acquired(()))))
            .count();
        assert_eq!((lost, won), (1, 1), "round {round}: {rs:?}");
        assert!(settles(&obs, &name, (0, 0)).await);
    }
}

/// After the nested call, shared holders (another task of the locker,
/// another locker) join again while an exclusive waiter that came during
/// the upgrade still waits for the outer call; it gets the lock once
/// everyone leaves. (The waiter polls: one queued in the server would, by
/// PostgreSQL's first-come-first-served queue, also hold back new shared
/// requests of other sessions.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_upgrade_shared_joins_and_exclusive_still_waits() {
    for outer in OUTERS {
        let (a, b, c) = (
            Backend::Postgres.locker().await,
            Backend::Postgres.locker().await,
            Backend::Postgres.locker().await,
        );
        let name = unique("up-after");
        let n = name.as_str();
        let mut waiter = None;
        outer
            .run(&a, n, || async {
                let x = exclusive();
                let r = a.with_lock(n, &x, || async {
                    let (b, n2) = (b.clone(), name.clone());
                    waiter = Some(tokio::spawn(async move {
                        let opts = LockOptions::new()
                            .timeout(SETTLE)
                            .wait_strategy(WaitStrategy::Poll);
                        b.acquire(n2.as_str(), &opts).await
                    }));
                    assert!(!can_take(&c, n, true).await, "{outer:?}: shared while upgraded");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                });
                assert_eq!(r.await.unwrap(), Outcome::Acquired(()));
                assert!(
                    can_take(&c, n, true).await,
                    "{outer:?}: another locker cannot join after the upgrade"
                );
                assert!(
                    other_task_can_share(&a, n).await,
                    "{outer:?}: a task cannot join after the upgrade"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(
                    !waiter.as_ref().expect("spawned").is_finished(),
                    "{outer:?}: an exclusive waiter got in beside the outer call"
                );
            })
            .await;
        let g = waiter
            .expect("spawned")
            .await
            .unwrap()
            .unwrap()
            .expect("the exclusive waiter gets it at last");
        g.release().await.unwrap();
    }
}

/// What cannot be upgraded is refused at once, with the shared lock kept:
/// a transaction lock on either side, a fenced nested call (PostgreSQL);
/// the local backend; MySQL has no shared lock to begin with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_upgrade_is_unsupported_not_a_hang() {
    let unsupported = |r: dbmutex::Result<Outcome<()>>, what: &str| {
        assert!(matches!(r, Err(Error::Unsupported(_))), "{what}: {r:?}");
    };
    let pg = Backend::Postgres.locker().await;
    let other = Backend::Postgres.locker().await;
    let name = unique("up-refused");
    let n = name.as_str();
    let xact = LockOptions::new().shared(true).transaction(true);
    acquired(
        bounded(pg.with_lock(n, &xact, || async {
            unsupported(
                pg.with_lock(n, &exclusive(), || async {}).await,
                "transaction outer",
            );
            assert!(!can_take(&other, n, false).await, "the transaction lock went");
        }))
        .await
        .unwrap(),
    );
    acquired(
        bounded(pg.with_lock(n, &LockOptions::new().shared(true), || async {
            let r = pg.with_lock(n, &exclusive().transaction(true), || async {}).await;
            unsupported(r, "transaction nested");
            unsupported(
                pg.with_lock(n, &exclusive().fenced(true), || async {}).await,
                "fenced nested",
            );
            assert!(!can_take(&other, n, false).await, "the shared lock went");
            assert!(can_take(&other, n, true).await, "an upgrade was left behind");
        }))
        .await
        .unwrap(),
    );

    let (l1, l2) = (Backend::Local.locker().await, Backend::Local.locker().await);
    acquired(
        bounded(l1.with_lock(n, &LockOptions::new().shared(true), || async {
            let r = l1.with_lock(n, &exclusive().timeout(SETTLE), || async {}).await;
            match &r {
                Err(Error::Unsupported(why)) => assert!(why.contains("flock"), "{why}"),
                r => panic!("local upgrade: {r:?}"),
            }
            assert!(!can_take(&l2, n, false).await, "the local shared lock went");
            assert!(can_take(&l2, n, true).await);
        }))
        .await
        .unwrap(),
    );

    let my = Backend::Mysql.locker().await;
    let r = bounded(my.with_lock(n, &LockOptions::new().shared(true), || async {
        panic!("MySQL ran a shared scoped call")
    }))
    .await;
    unsupported(r, "MySQL shared outer");
    // The capability table says the same.
    let can = |l: &Locker| l.capabilities().upgrade;
    assert_eq!((can(&pg), can(&l1), can(&my)), (true, false, false));
}

/// An acquisition that would wait for the task's own scoped hold fails
/// with `Deadlock` at once: a guard taken exclusive inside a scoped shared
/// call (no upgrade: it may outlive the call), any guard inside a scoped
/// exclusive call, a nested shared call inside an exclusive one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_ones_own_scoped_hold_is_a_deadlock() {
    for b in [Backend::Postgres, Backend::Local] {
        let l = b.locker().await;
        let name = unique("up-self");
        let n = name.as_str();
        let deadlock = |r: Result<(), Error>, what: &str| {
            assert!(matches!(r, Err(Error::Deadlock { .. })), "{b:?} {what}: {r:?}");
        };
        acquired(
            bounded(l.with_lock(n, &LockOptions::new().shared(true), || async {
                deadlock(
                    l.acquire(n, &exclusive().timeout(SETTLE)).await.map(drop),
                    "exclusive guard in shared",
                );
                let tried = l.try_lock(n).await.unwrap();
                assert!(
                    tried.is_none(),
                    "{b:?}: a try against the task's own hold is busy"
                );
                let g = l.acquire(n, &LockOptions::try_once().shared(true)).await.unwrap();
                g.expect("a shared guard in a shared call is fine")
                    .release()
                    .await
                    .unwrap();
            }))
            .await
            .unwrap(),
        );
        acquired(
            bounded(l.with_lock(n, &exclusive(), || async {
                deadlock(
                    l.acquire(n, &LockOptions::new().shared(true)).await.map(drop),
                    "shared guard in exclusive",
                );
                let r = l
                    .with_lock(n, &LockOptions::new().shared(true), || async { 5 })
                    .await;
                assert!(
                    matches!(r, Ok(dbmutex::Outcome::Acquired(5))),
                    "{b:?}: a nested shared call in an exclusive one is re-entrant: {r:?}"
                );
            }))
            .await
            .unwrap(),
        );
        assert_eq!(l.held_count(), 0);
    }
}

/// Another session waiting in the server for the name (a dbmutex waiter
/// with the default strategy, or a raw `pg_advisory_lock` as the gem and
/// psql send) waits for the upgrader's shared lock. The server refuses the
/// upgrader's exclusive *try* while that waiter is queued, but grants its
/// blocking request at once, so this is no deadlock: the upgrade runs at
/// once (not `Deadlock`, not its timeout), ends shared, and the waiter gets
/// the lock once the outer call ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_behind_a_server_waiter_goes_ahead_of_it() {
    let obs = pg_raw().await;
    let (a, b) = (Backend::Postgres.locker().await, Backend::Postgres.locker().await);
    for raw in [false, true] {
        let name = unique("up-server-waiter");
        let n = name.as_str();
        let mut waiter = None;
        let mut raw_wait = None;
        let r = bounded(a.with_lock(n, &LockOptions::new().shared(true), || async {
            if raw {
                let sql = format!("SELECT pg_advisory_lock({})", key(n).sql_args());
                raw_wait = Some(tokio::spawn(async move {
                    let c = pg_raw().await;
                    c.batch_execute(&sql).await.map(|()| c)
                }));
            } else {
                waiter = Some(acquired_later(&b, n));
            }
            let waiting = eventually(SETTLE, || async {
                let (c, o, s) = key(n).pg_locks_ids();
                obs.query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                     AND classid = $1 AND objid = $2 AND objsubid = $3",
                    &[&c, &o, &s],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                    == 1
            })
            .await;
            assert!(waiting, "raw {raw}: the other session waits in the server");
            let t0 = Instant::now();
            let r = a
                .with_lock(n, &exclusive().timeout(Duration::from_secs(20)), || async {
                    modes(&obs, key(n)).await
                })
                .await;
            assert!(
                matches!(r, Ok(Outcome::Acquired((1, 1)))),
                "raw {raw}: the upgrade holds shared and exclusive: {r:?}"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "raw {raw}: upgraded after {:?}",
                t0.elapsed()
            );
            assert!(
                settles(&obs, n, (1, 0)).await,
                "raw {raw}: back to the shared lock, nothing more"
            );
        }))
        .await;
        acquired(r.unwrap());
        if let Some(w) = raw_wait {
            tokio::time::timeout(Duration::from_secs(10), w)
                .await
                .expect("the raw waiter gets the lock once the outer call ends")
                .unwrap()
                .unwrap();
        } else {
            let g = waiter
                .expect("started")
                .await
                .unwrap()
                .unwrap()
                .expect("the waiter gets the lock once the outer call ends");
            g.release().await.unwrap();
        }
    }
}

/// `l` waiting for `name` exclusive, with the default strategy (try, then
/// wait in the server), for up to 30 s.
fn acquired_later(
    l: &Locker,
    name: &str,
) -> tokio::task::JoinHandle<dbmutex::Result<Option<dbmutex::LockGuard>>> {
    let (l, name) = (l.clone(), name.to_owned());
    tokio::spawn(async move {
        l.acquire(name.as_str(), &exclusive().timeout(Duration::from_secs(30)))
            .await
    })
}
