//! The etcd backend on private 3-member etcd clusters (Debian's
//! `etcd-server`, started by the tests: see `common/private_etcd.rs`):
//! exclusion, try-once and timeouts, first-come-first-served hand-off,
//! release on drop, fencing tokens, loss when the lease is revoked or the
//! cluster loses its quorum, a leader kill under load, and cancellation at
//! each await point. Tests that leave the cluster whole share one; the
//! destructive ones start their own.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::private_etcd::PrivateEtcd;
use common::{cancel_at_each_await_point, eventually, unique, CancelAfter};
use dbmutex::{LockOptions, Locker, LockerBuilder};

async fn connect(builder: LockerBuilder, etcd: &PrivateEtcd) -> Locker {
    builder
        .connect()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the private etcd cluster {}: {e}", etcd.url()))
}

/// `locker` gets `name` within 15 s (`why` says why it must), and lets it go.
async fn comes_free(locker: Locker, name: &str, why: &str) {
    let opts = LockOptions::new().timeout(Duration::from_secs(15));
    let g = locker.acquire(name, &opts).await.unwrap();
    g.unwrap_or_else(|| panic!("{why}")).release().await.unwrap();
}

async fn locker(etcd: &PrivateEtcd) -> Locker {
    connect(Locker::builder(&etcd.url()), etcd).await
}

/// The keys under `prefix` now (every queued acquisition has one).
async fn keys_under(etcd: &PrivateEtcd, prefix: &str) -> Vec<String> {
    let mut raw = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .expect("raw etcd client");
    let opts = etcd_client::GetOptions::new().with_prefix().with_keys_only();
    let got = raw.get(prefix, Some(opts)).await.expect("raw etcd get");
    got.kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect()
}

/// Whether the keys under `prefix` come down to `n` within 5 s.
async fn keys_become(etcd: &PrivateEtcd, prefix: &str, n: usize) -> bool {
    eventually(Duration::from_secs(5), || async {
        keys_under(etcd, prefix).await.len() == n
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockers_exclude_each_other_try_once_and_timeout_leave_no_key() {
    let etcd = PrivateEtcd::shared();
    let (a, b) = (locker(etcd).await, locker(etcd).await);
    let name = unique("excl");
    let prefix = a.key_of(name.as_str()).unwrap();
    assert_eq!(prefix, format!("dbmutex/{name}/"));
    let g = a.lock(name.as_str()).await.unwrap();
    assert!(
        b.try_lock(name.as_str()).await.unwrap().is_none(),
        "try-once got a held lock"
    );
    let t = Instant::now();
    let timed = b
        .acquire(
            name.as_str(),
            &LockOptions::new().timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let waited = t.elapsed();
    assert!(timed.is_none(), "a timed wait got a held lock");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // The busy try and the timed-out wait took their keys back.
    assert_eq!(keys_under(etcd, &prefix).await.len(), 1);
    let holders = b.holders(name.as_str()).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].pid, std::process::id() as i64);
    assert_eq!(holders[0].application.as_deref(), Some("dbmutex"));
    let listed = b.list().await.unwrap();
    assert!(
        listed
            .iter()
            .any(|l| l.name.as_deref() == Some(name.as_str()) && l.key == prefix),
        "{listed:?}"
    );
    g.release().await.unwrap();
    let g = b
        .try_lock(name.as_str())
        .await
        .unwrap()
        .expect("free once released");
    g.release().await.unwrap();
    assert_eq!(keys_under(etcd, &prefix).await.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_first_come_first_served() {
    let etcd = PrivateEtcd::shared();
    let name = unique("fifo");
    let holder = locker(etcd).await;
    let prefix = holder.key_of(name.as_str()).unwrap();
    let g = holder.lock(name.as_str()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let l = locker(etcd).await;
        let (name, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.lock(name.as_str()).await.unwrap();
            order.lock().unwrap().push((i, Instant::now()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
        }));
        // Queued before the next one starts.
        assert!(keys_become(etcd, &prefix, i + 2).await, "waiter {i} never queued");
    }
    let released = Instant::now();
    g.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let ids: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, [0, 1, 2], "not first come, first served");
    let hand_off = order[0].1 - released;
    eprintln!("etcd hand-off (release awaited → next waiter holds): {hand_off:?}");
    assert!(hand_off < Duration::from_secs(1), "hand-off took {hand_off:?}");
    assert!(keys_become(etcd, &prefix, 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_releases_in_the_background() {
    let etcd = PrivateEtcd::shared();
    let (a, b) = (locker(etcd).await, locker(etcd).await);
    let name = unique("drop");
    let prefix = a.key_of(name.as_str()).unwrap();
    drop(a.lock(name.as_str()).await.unwrap());
    assert!(
        keys_become(etcd, &prefix, 0).await,
        "the dropped guard's key stayed"
    );
    let g = b
        .try_lock(name.as_str())
        .await
        .unwrap()
        .expect("free after the drop");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_strictly_under_contention() {
    let etcd = PrivateEtcd::shared();
    let name = unique("fence");
    let seen = Arc::new(Mutex::new(Vec::<u64>::new()));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let l = locker(etcd).await;
        let (name, seen, inside) = (name.clone(), seen.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let g = l
                    .acquire(name.as_str(), &LockOptions::new().fenced(true))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                seen.lock().unwrap().push(g.fence().expect("a token"));
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 20);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {seen:?}"
    );
}

/// The lease id in one of a locker's keys (`<prefix><lease hex>-<n>`).
fn lease_of(key: &str) -> String {
    let last = key.rsplit('/').next().unwrap();
    last.split('-').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_reported_lost_within_a_keepalive() {
    let etcd = PrivateEtcd::shared();
    let (a, b) = (locker(etcd).await, locker(etcd).await);
    let name = unique("revoke");
    let prefix = a.key_of(name.as_str()).unwrap();
    let g = a.lock(name.as_str()).await.unwrap();
    let keys = keys_under(etcd, &prefix).await;
    etcd.etcdctl(&["lease", "revoke", &lease_of(&keys[0])]);
    let revoked = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("a revoked lease must be reported lost");
    let told = revoked.elapsed();
    eprintln!("etcd: revoked lease reported lost after {told:?}");
    // One keep-alive period (1 s by default) plus a round trip.
    assert!(told < Duration::from_millis(1500), "{told:?}");
    assert!(!g.is_held());
    drop(g);
    let other = b
        .try_lock(name.as_str())
        .await
        .unwrap()
        .expect("the revoke freed the lock");
    other.release().await.unwrap();
    // The locker goes on with a new lease.
    let again = a.lock(name.as_str()).await.unwrap();
    assert_ne!(lease_of(&keys_under(etcd, &prefix).await[0]), lease_of(&keys[0]));
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_quorum_is_reported_before_the_lease_can_expire() {
    let etcd = PrivateEtcd::start();
    // TTL 4 s: the holder must be told within half of it (plus a keep-alive period).
    let builder = || Locker::builder(&etcd.url()).dead_peer_timeout(Duration::from_secs(4));
    let a = connect(builder(), &etcd).await;
    let name = unique("quorum");
    let g = a.lock(name.as_str()).await.unwrap();
    let leader = etcd.leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    etcd.kill(others[0]);
    etcd.kill(others[1]);
    let cut = Instant::now();
    tokio::time::timeout(Duration::from_secs(8), g.lost())
        .await
        .expect("a holder without a quorum must be told");
    let told = cut.elapsed();
    eprintln!("etcd: quorum lost, holder told after {told:?} (lease TTL 4 s)");
    assert!(told < Duration::from_secs(3), "{told:?}");
    drop(g);
    etcd.restart(others[0]);
    etcd.restart(others[1]);
    // With the quorum back, the lock is free again (deleted or expired).
    comes_free(
        connect(builder(), &etcd).await,
        &name,
        "the lock comes free once the quorum is back",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_quorum_loss_is_reported_before_the_lease_can_expire() {
    let etcd = PrivateEtcd::start();
    let builder = || Locker::builder(&etcd.url()).dead_peer_timeout(Duration::from_secs(4));
    let a = connect(builder(), &etcd).await;
    let name = unique("frozen");
    let g = a.lock(name.as_str()).await.unwrap();
    // Two members frozen (SIGSTOP): their connections stay open and
    // answer nothing, as behind a partition that drops packets.
    let leader = etcd.leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    etcd.freeze(others[0], true);
    etcd.freeze(others[1], true);
    let cut = Instant::now();
    let told = tokio::time::timeout(Duration::from_secs(8), g.lost()).await;
    let after = cut.elapsed();
    etcd.freeze(others[0], false);
    etcd.freeze(others[1], false);
    told.expect("a holder cut off from the quorum must be told");
    eprintln!("etcd: quorum frozen, holder told after {after:?} (lease TTL 4 s)");
    assert!(after < Duration::from_secs(3), "{after:?}");
    drop(g);
    comes_free(
        connect(builder(), &etcd).await,
        &name,
        "the lock comes free once the members answer again",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_kill_under_load_keeps_exclusion_and_token_order() {
    let etcd = PrivateEtcd::start();
    let name = unique("leader");
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(Mutex::new(0u64));
    let out_of_order = Arc::new(AtomicUsize::new(0));
    let (grants, lost) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let l = locker(&etcd).await;
        let name = name.clone();
        let (stop, inside, overlaps, last, out_of_order, grants, lost) = (
            stop.clone(),
            inside.clone(),
            overlaps.clone(),
            last.clone(),
            out_of_order.clone(),
            grants.clone(),
            lost.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new().fenced(true).timeout(Duration::from_secs(10));
            while !stop.load(Ordering::SeqCst) {
                let g = l
                    .acquire(name.as_str(), &opts)
                    .await
                    .unwrap()
                    .expect("within 10 s");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                {
                    let mut last = last.lock().unwrap();
                    if g.fence().unwrap() <= *last {
                        out_of_order.fetch_add(1, Ordering::SeqCst);
                    }
                    *last = g.fence().unwrap();
                }
                grants.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                if !g.is_held() {
                    lost.fetch_add(1, Ordering::SeqCst);
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                drop(g.release().await);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = grants.load(Ordering::SeqCst);
    let leader = etcd.leader();
    etcd.kill(leader);
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let after = grants.load(Ordering::SeqCst) - before;
    eprintln!(
        "etcd leader kill: {before} grants before, {after} in the {:?} after; {} lost",
        killed.elapsed(),
        lost.load(Ordering::SeqCst)
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(out_of_order.load(Ordering::SeqCst), 0, "a token did not increase");
    assert!(
        before > 10 && after > 10,
        "too few grants: {before} before, {after} after"
    );
    assert_eq!(
        lost.load(Ordering::SeqCst),
        0,
        "a leader change must not end a lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_leaves_no_key_behind() {
    let etcd = PrivateEtcd::shared();
    let (a, b) = (locker(etcd).await, locker(etcd).await);
    // Uncontended: cancelled at each await point in turn.
    let name = unique("cancel-free");
    let prefix = a.key_of(name.as_str()).unwrap();
    let g = cancel_at_each_await_point(&b, &name, || a.lock(name.as_str()))
        .await
        .unwrap();
    g.release().await.unwrap();
    assert!(
        keys_become(etcd, &prefix, 0).await,
        "{:?}",
        keys_under(etcd, &prefix).await
    );
    // Contended: a waiter cancelled at each of its first await points (or,
    // once it only waits for the holder's key to go, after 300 ms) leaves
    // no key queued behind the holder.
    let name = unique("cancel-busy");
    let prefix = a.key_of(name.as_str()).unwrap();
    let held = b.lock(name.as_str()).await.unwrap();
    let mut queued = 0;
    for n in 1..12 {
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            CancelAfter::new(a.lock(name.as_str()), n),
        )
        .await;
        assert!(!matches!(cancelled, Ok(Some(_))), "a waiter got a held lock");
        queued += usize::from(cancelled.is_err());
        assert!(
            keys_become(etcd, &prefix, 1).await,
            "a key left after a cancellation at await point {n}"
        );
    }
    assert!(queued > 0, "never cancelled while queued");
    held.release().await.unwrap();
    assert!(keys_become(etcd, &prefix, 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_bad_urls_are_clear() {
    let etcd = PrivateEtcd::shared();
    let a = locker(etcd).await;
    let e = a
        .acquire("x", &LockOptions::new().shared(true))
        .await
        .unwrap_err();
    assert!(
        matches!(e, dbmutex::Error::Unsupported(_)) && e.to_string().contains("etcd"),
        "{e}"
    );
    let e = Locker::connect("etcd://user:secret@127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(
        matches!(e, dbmutex::Error::Config(_)) && !e.to_string().contains("secret"),
        "{e}"
    );
    // Nobody there: a connect error within the connect timeout.
    let t = Instant::now();
    let e = Locker::builder(&format!("etcd://127.0.0.1:{}", common::private::free_port()))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await;
    assert!(matches!(e, Err(dbmutex::Error::Connect(_))), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
}
