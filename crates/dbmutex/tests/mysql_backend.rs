//! MySQL/MariaDB-specific behaviour, against the real server
//! (env `DBMUTEX_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`).
//! Behaviour shared with the other backends (exclusion, timeouts, hand-off,
//! drops, cancellation, loss, unsupported options) is in `behaviour.rs`.
//!
//! Two lockers stand for two processes: each has its own connections.
//! "Raw" connections are plain mysql_async sessions with no dbmutex logic,
//! as another program (the Ruby gem, an operator's client) would be.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{mysql_raw, mysql_url, unique, Backend, CancelAfter, PrivateMariaDb};
use dbmutex::{Error, LockOptions, Locker};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

/// The bound for background effects (a queued unlock, a killed session).
const SETTLE: Duration = Duration::from_secs(10);

async fn locker() -> Locker {
    Backend::Mysql.locker().await
}

async fn connect(b: dbmutex::LockerBuilder) -> Locker {
    Backend::Mysql.connect(b).await
}

/// Waits until server session `id` runs a `GET_LOCK` that waits (state
/// `User lock`): the event a test needs before it closes a cycle or lets
/// go. Looks at that one session only; other clients may be waiting too.
async fn wait_until_waiting(c: &mut Conn, id: i64) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let state: Option<(Option<String>,)> = c
            .exec_first(
                "SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = ?",
                (id,),
            )
            .await
            .unwrap();
        if matches!(state, Some((Some(s),)) if s == "User lock") {
            return;
        }
        assert!(Instant::now() < deadline, "session {id} never waited for a lock");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The connection id holding `key`, as the server reports it.
async fn used_by(c: &mut Conn, key: &str) -> Option<i64> {
    let row: Option<(Option<i64>,)> = c.exec_first("SELECT IS_USED_LOCK(?)", (key,)).await.unwrap();
    row.and_then(|(id,)| id)
}

/// Whether `key` becomes free within `within` (for unlocks queued in the background).
async fn freed_within(c: &mut Conn, key: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if used_by(c, key).await.is_none() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One scalar from a statement with parameters.
async fn scalar(c: &mut Conn, sql: &str, params: impl Into<mysql_async::Params> + Send) -> Option<i64> {
    let row: Option<(Option<i64>,)> = c.exec_first(sql, params).await.unwrap();
    row.and_then(|(v,)| v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lockers_exclude_each_other_and_raw_sessions() {
    let (a, b) = (locker().await, locker().await);
    let name = unique("excl");
    let key = a.key_of(name.as_str()).unwrap();
    let g = a.lock(name.as_str()).await.unwrap();
    assert!(b.try_lock(name.as_str()).await.unwrap().is_none());
    assert!(b.is_locked(name.as_str()).await.unwrap());
    let mut raw = mysql_raw().await;
    assert_eq!(
        scalar(&mut raw, "SELECT GET_LOCK(?, 0)", (key.as_str(),)).await,
        Some(0),
        "a raw session is refused"
    );
    g.release().await.unwrap();

    // The other way round: a raw GET_LOCK of the same string (as the Ruby gem
    // issues it) keeps dbmutex out.
    assert_eq!(
        scalar(&mut raw, "SELECT GET_LOCK(?, 0)", (key.as_str(),)).await,
        Some(1)
    );
    assert!(a.try_lock(name.as_str()).await.unwrap().is_none());
    let holders = a.holders(name.as_str()).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].pid, i64::from(raw.id()));
    scalar(&mut raw, "SELECT RELEASE_LOCK(?)", (key.as_str(),)).await;
    a.try_lock(name.as_str())
        .await
        .unwrap()
        .expect("free after the raw release")
        .release()
        .await
        .unwrap();
}

/// Two workers take two locks in opposite orders, each in a scoped call
/// nested in the other's: the server sees the cycle (nested acquisitions run
/// on the enclosing lock's session) and tells the one that closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_is_reported_to_the_requester_that_closes_the_cycle() {
    let (a, b) = (locker().await, locker().await);
    let (n1, n2) = (unique("dl1"), unique("dl2"));
    let both_in = Arc::new(tokio::sync::Barrier::new(2));
    let mut raw = mysql_raw().await;
    let first = tokio::spawn({
        let (a, n1, n2, both_in) = (a.clone(), n1.clone(), n2.clone(), both_in.clone());
        async move {
            a.with_lock(n1.as_str(), &LockOptions::new(), || async {
                both_in.wait().await;
                a.with_lock(n2.as_str(), &LockOptions::new(), || async { "both" })
                    .await
            })
            .await
        }
    });
    let (n1b, n2b) = (n1.clone(), n2.clone());
    let second = b
        .with_lock(n2b.as_str(), &LockOptions::new(), || async {
            both_in.wait().await;
            // The first worker's nested GET_LOCK(n2) runs on the session
            // that holds n1: wait until it waits in the server, so that
            // this request is the one that closes the cycle.
            let first_session = used_by(&mut raw, &a.key_of(n1b.as_str()).unwrap()).await.unwrap();
            wait_until_waiting(&mut raw, first_session).await;
            assert!(!first.is_finished());
            let start = Instant::now();
            let inner = b.with_lock(n1b.as_str(), &LockOptions::new(), || async {}).await;
            let took = start.elapsed();
            // The victim keeps what it held (n2, on its own session), so the
            // first worker still waits for it in the server.
            let k2 = b.key_of(n2b.as_str()).unwrap();
            let second_session = b.holders(n2b.as_str()).await.unwrap()[0].pid;
            assert_eq!(used_by(&mut raw, &k2).await, Some(second_session));
            wait_until_waiting(&mut raw, first_session).await;
            assert!(!first.is_finished());
            (inner, took)
        })
        .await
        .unwrap();
    let (inner, took) = second.acquired().expect("outer lock acquired");
    let err = inner.unwrap_err();
    assert!(err.is_deadlock(), "{err:?}");
    assert_eq!(err.sqlstate().as_deref(), Some("40001"));
    // At once (no deadlock_timeout on MariaDB); without detection this
    // wait would never end. Slack for a loaded machine.
    assert!(took < Duration::from_secs(3), "deadlock reported after {took:?}");
    let got = tokio::time::timeout(SETTLE, first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.acquired().and_then(|r| r.unwrap().acquired()), Some("both"));
    assert_eq!((a.held_count(), b.held_count()), (0, 0));
    for n in [&n1, &n2] {
        assert!(freed_within(&mut raw, &a.key_of(n.as_str()).unwrap(), SETTLE).await);
    }
}

/// Nested scoped calls share the enclosing lock's session; their locks are
/// released one by one, and the session is reused only once it holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_scoped_locks_share_a_session() {
    let a = locker().await;
    let (n1, n2) = (unique("outer"), unique("inner"));
    let (k1, k2) = (a.key_of(n1.as_str()).unwrap(), a.key_of(n2.as_str()).unwrap());
    let mut raw = mysql_raw().await;
    let out = a
        .with_lock(n1.as_str(), &LockOptions::new(), || async {
            let outer = used_by(&mut raw, &k1).await.unwrap();
            let g = a.lock(n2.as_str()).await.unwrap();
            assert_eq!(used_by(&mut raw, &k2).await, Some(outer), "same session");
            // A guard of the same name is still refused in-process.
            assert!(a.try_lock(n2.as_str()).await.unwrap().is_none());
            g.release().await.unwrap();
            assert_eq!(used_by(&mut raw, &k2).await, None);
            assert_eq!(used_by(&mut raw, &k1).await, Some(outer), "outer still held");
            let inner = a
                .with_lock(n2.as_str(), &LockOptions::try_once(), || async {})
                .await
                .unwrap();
            assert!(inner.was_acquired());
            outer
        })
        .await
        .unwrap()
        .acquired()
        .unwrap();
    assert_eq!(used_by(&mut raw, &k1).await, None);
    assert_eq!(used_by(&mut raw, &k2).await, None);
    // The session came back clean and serves the next lock.
    let g = a.lock(n2.as_str()).await.unwrap();
    assert_eq!(used_by(&mut raw, &k2).await, Some(out));
    assert_eq!(used_by(&mut raw, &k1).await, None);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_nothing_held() {
    let a = locker().await;
    let mut raw = mysql_raw().await;
    // Uncontended, a fresh locker each time (so connecting is an await point
    // too): cancel at every await point in turn.
    let name = unique("cancel");
    let key = a.key_of(name.as_str()).unwrap();
    for n in 0.. {
        let fresh = locker().await;
        let idle = n % 2 == 0;
        let l = if idle { &a } else { &fresh };
        match CancelAfter::new(l.acquire(name.as_str(), &LockOptions::new()), n / 2).await {
            Some(g) => {
                g.unwrap().unwrap().release().await.unwrap();
                if !idle {
                    break;
                }
            }
            None => assert!(
                freed_within(&mut raw, &key, SETTLE).await,
                "held after a cancellation at await point {}",
                n / 2
            ),
        }
        assert!(n < 400, "never completed");
    }
}

/// A GET_LOCK is running in the server when its acquisition is dropped.
/// The abandoned session must never get the lock, not even for a moment
/// after the holder lets go (the module docs: "so the abandoned wait can
/// never take the lock later").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_wait_does_not_keep_the_lock() {
    let a = locker().await;
    let holder = locker().await;
    let mut raw = mysql_raw().await;
    let name = unique("cancel-busy");
    let key = a.key_of(name.as_str()).unwrap();
    let g = holder.lock(name.as_str()).await.unwrap();
    let holder_pid = used_by(&mut raw, &key).await.unwrap();
    let waiting = tokio::spawn({
        let (a, name) = (a.clone(), name.clone());
        async move { a.lock(name.as_str()).await }
    });
    // Usually the waiter is in GET_LOCK by now; if this machine is slow it
    // is still connecting, an earlier await point, and the claim is the same.
    tokio::time::sleep(Duration::from_millis(200)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // No pause for the background KILL of the abandoned session. If the
    // release below beats it, the abandoned GET_LOCK may take the lock for
    // that moment (documented in src/mysql); the KILL then frees it. The
    // claim: it is free again within a bound, and stays free.
    g.release().await.unwrap();
    let released = Instant::now();
    let mut last_held = None;
    while released.elapsed() < Duration::from_millis(1500) {
        if let Some(by) = used_by(&mut raw, &key).await {
            assert_ne!(by, holder_pid, "the holder released");
            last_held = Some(released.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("abandoned session held the lock until {last_held:?} after the release");
    assert!(
        last_held.is_none_or(|t| t < Duration::from_millis(1000)),
        "the abandoned session kept the lock {last_held:?} after the release"
    );
    assert_eq!(used_by(&mut raw, &key).await, None, "free for good");
    assert_eq!(a.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_connections_are_reused_clean() {
    let a = locker().await;
    let mut raw = mysql_raw().await;
    let (n1, n2) = (unique("reuse1"), unique("reuse2"));
    let (k1, k2) = (a.key_of(n1.as_str()).unwrap(), a.key_of(n2.as_str()).unwrap());
    let g1 = a.lock(n1.as_str()).await.unwrap();
    let conn1 = used_by(&mut raw, &k1).await.unwrap();
    g1.release().await.unwrap();
    assert_eq!(
        used_by(&mut raw, &k1).await,
        None,
        "IS_USED_LOCK is NULL after release"
    );
    let g2 = a.lock(n2.as_str()).await.unwrap();
    assert_eq!(
        used_by(&mut raw, &k2).await,
        Some(conn1),
        "the released connection is reused"
    );
    assert_eq!(used_by(&mut raw, &k1).await, None, "and holds nothing else");
    drop(g2);
    assert!(freed_within(&mut raw, &k2, SETTLE).await);
    // A dropped guard's connection goes back to the idle pool in the
    // background, after its release answered: allow it a moment. Guards on
    // other connections are kept meanwhile, so they don't go back on top.
    let mut reused = false;
    let mut others = Vec::new();
    let deadline = Instant::now() + SETTLE;
    for i in 0.. {
        let name = format!("{n1}-{i}");
        let g = a.lock(name.as_str()).await.unwrap();
        reused = used_by(&mut raw, &a.key_of(name.as_str()).unwrap()).await == Some(conn1);
        assert_eq!(
            used_by(&mut raw, &k2).await,
            None,
            "the reused connection holds nothing else"
        );
        others.push(g);
        if reused || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for g in others {
        g.release().await.unwrap();
    }
    assert!(reused, "reused after a drop too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_and_long_names() {
    let (a, b) = (locker().await, locker().await);
    let mut raw = mysql_raw().await;
    let long_ascii = format!("{}-{}", unique("long"), "x".repeat(300));
    let long_wide = format!("{}-{}", unique("wide"), "ünïcødé 😀 ".repeat(30));
    let quotes = format!("{}-it's \"quoted\" `back` \\ ; --", unique("q"));
    for name in [long_ascii.as_str(), long_wide.as_str(), quotes.as_str()] {
        let key = a.key_of(name).unwrap();
        assert!(key.chars().count() <= 64 && key.len() <= 192, "{key:?}");
        let g = a.try_lock(name).await.unwrap().expect("free");
        assert!(used_by(&mut raw, &key).await.is_some(), "{key:?}");
        assert!(b.try_lock(name).await.unwrap().is_none());
        g.release().await.unwrap();
        assert_eq!(used_by(&mut raw, &key).await, None);
    }
    // Two long names with one head are two locks.
    let head = unique("head").repeat(5);
    let (x, y) = (format!("{head}-x"), format!("{head}-y"));
    let gx = a.try_lock(x.as_str()).await.unwrap().unwrap();
    let gy = b.try_lock(y.as_str()).await.unwrap().expect("distinct lock");
    drop((gx, gy));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_and_is_locked() {
    let (a, b) = (locker().await, locker().await);
    let name = unique("holders");
    assert!(!b.is_locked(name.as_str()).await.unwrap());
    assert!(b.holders(name.as_str()).await.unwrap().is_empty());
    let g = a.lock(name.as_str()).await.unwrap();
    let key = a.key_of(name.as_str()).unwrap();
    let mut raw = mysql_raw().await;
    let pid = used_by(&mut raw, &key).await.unwrap();
    let hs = b.holders(name.as_str()).await.unwrap();
    assert_eq!(hs.len(), 1, "{hs:?}");
    let h = &hs[0];
    assert_eq!(h.pid, pid);
    assert_eq!(h.user.as_deref(), Some("root"));
    // Host and port of the client as the server shows it: `127.0.0.1:port`,
    // or `localhost:port` on a server that resolves names
    // (skip_name_resolve off). Either is the loopback client.
    assert!(
        h.client
            .as_deref()
            .and_then(|c| c.rsplit_once(':'))
            .is_some_and(
                |(host, port)| ["127.0.0.1", "localhost"].contains(&host) && port.parse::<u16>().is_ok()
            ),
        "{h:?}"
    );
    assert!(h.since.is_some(), "{h:?}");
    assert!(b.is_locked(name.as_str()).await.unwrap());
    g.release().await.unwrap();
    assert!(!b.is_locked(name.as_str()).await.unwrap());
}

/// `list` needs the metadata_lock_info plugin: without it, a typed error
/// that says how to install it; once installed (as that error says), the
/// held lock is listed with its name and holder. On a private server: the
/// tests never change the shared server's configuration, and there every
/// lock listed is this test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_needs_the_metadata_lock_info_plugin() {
    let my = PrivateMariaDb::start(&[]);
    let a = Locker::builder(&my.url())
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to the private MariaDB: {e}\n{}", my.log()));
    let name = unique("list");
    let g = a.lock(name.as_str()).await.unwrap();
    match a.list().await {
        Err(Error::Unsupported(m)) => assert!(m.contains("INSTALL SONAME 'metadata_lock_info'"), "{m}"),
        other => panic!("without the plugin: {other:?}"),
    }
    // The library never installs it; an operator does.
    my.raw()
        .await
        .query_drop("INSTALL SONAME 'metadata_lock_info'")
        .await
        .unwrap();
    let listed = a.list().await.unwrap();
    let key = a.key_of(name.as_str()).unwrap();
    assert_eq!(listed.len(), 1, "only this test's lock is held here: {listed:?}");
    assert_eq!(listed[0].key, key);
    assert_eq!(listed[0].name.as_deref(), Some(name.as_str()));
    assert_eq!(
        listed[0].holder.pid,
        a.holders(name.as_str()).await.unwrap()[0].pid
    );
    g.release().await.unwrap();
    assert!(a.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_are_typed_and_redacted() {
    let t = Instant::now();
    let err = Locker::connect("mysql://root:s3cr3t-pw@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    // Refused at once; seconds would mean a retry loop or a hang.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let bad_pw = mysql_url().replacen("root@", "root:s3cr3t-pw@", 1);
    let err = Locker::connect(&bad_pw).await.unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert_eq!(err.sqlstate().as_deref(), Some("28000"), "{err}");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains("s3cr3t"), "{text}");
    }
    let err = Locker::connect("mysql://root:s3cr3t-pw@127.0.0.1:3306/test?bogus=1")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(!err.to_string().contains("s3cr3t"), "{err}");
    // A connect that gets no answer ends at the connect timeout: a loopback
    // listener that accepts and never sends the server's greeting.
    let silent = common::silent_server().await;
    let t = Instant::now();
    let err = Locker::builder(&format!("mysql://root@127.0.0.1:{silent}/test"))
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    // It waited for the server (the bound), and not much longer.
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(2500),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_scheme_is_accepted() {
    let url = mysql_url().replacen("mysql://", "mariadb://", 1);
    let a = connect(Locker::builder(&url)).await;
    assert_eq!(a.backend(), dbmutex::BackendKind::Mysql);
    let b = locker().await;
    let name = unique("scheme");
    let g = a.lock(name.as_str()).await.unwrap();
    assert!(b.try_lock(name.as_str()).await.unwrap().is_none());
    g.release().await.unwrap();
}

/// What the server does, as the module docs describe it (MariaDB 10.11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_semantics_as_documented() {
    let mut s1 = mysql_raw().await;
    let mut s2 = mysql_raw().await;
    let key = unique("Sem");
    // Counted re-entrancy on one session.
    for _ in 0..2 {
        assert_eq!(
            scalar(&mut s1, "SELECT GET_LOCK(?, 0)", (key.as_str(),)).await,
            Some(1)
        );
    }
    assert_eq!(
        scalar(&mut s1, "SELECT RELEASE_LOCK(?)", (key.as_str(),)).await,
        Some(1)
    );
    assert_eq!(
        scalar(&mut s2, "SELECT IS_FREE_LOCK(?)", (key.as_str(),)).await,
        Some(0),
        "still held once"
    );
    assert_eq!(
        scalar(&mut s1, "SELECT RELEASE_LOCK(?)", (key.as_str(),)).await,
        Some(1)
    );
    assert_eq!(
        scalar(&mut s1, "SELECT RELEASE_LOCK(?)", (key.as_str(),)).await,
        None
    );
    // Case-sensitive names on MariaDB.
    scalar(&mut s1, "SELECT GET_LOCK(?, 0)", (key.as_str(),)).await;
    assert_eq!(
        scalar(&mut s2, "SELECT IS_FREE_LOCK(?)", (key.to_lowercase(),)).await,
        Some(1)
    );
    // Fractional timeouts are honoured; negative ones are rejected (NULL).
    let t = Instant::now();
    assert_eq!(
        scalar(&mut s2, "SELECT GET_LOCK(?, ?)", (key.as_str(), 0.25f64)).await,
        Some(0)
    );
    let waited = t.elapsed();
    // 0.25 s, not rounded to 0 or 1 s (slack for a loaded machine).
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(900),
        "{waited:?}"
    );
    assert_eq!(
        scalar(&mut s2, "SELECT GET_LOCK(?, ?)", (key.as_str(), -1f64)).await,
        None
    );
    // RELEASE_LOCK of another session's lock: 0, and the lock stays.
    assert_eq!(
        scalar(&mut s2, "SELECT RELEASE_LOCK(?)", (key.as_str(),)).await,
        Some(0)
    );
    // The release statement dbmutex uses: ours first, then proof of nothing else.
    let row: Option<(Option<i64>, Option<i64>)> = s1
        .exec_first("SELECT RELEASE_LOCK(?), RELEASE_ALL_LOCKS()", (key.as_str(),))
        .await
        .unwrap();
    assert_eq!(row, Some((Some(1), Some(0))));
    // A reset connection has lost its user locks: why dbmutex never uses a
    // resetting pool for lock connections.
    scalar(&mut s1, "SELECT GET_LOCK(?, 0)", (key.as_str(),)).await;
    assert!(s1.reset().await.unwrap());
    assert_eq!(used_by(&mut s2, &key).await, None);
}

/// A cancelled nested acquisition (its `GET_LOCK` running on the enclosing
/// scoped call's session) must not end that session: the outer lock stays
/// held for the rest of the scope, and the abandoned wait never takes the
/// inner lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_nested_acquisition_keeps_the_outer_lock() {
    let (a, other) = (locker().await, locker().await);
    let (outer, inner, spare) = (unique("nc-outer"), unique("nc-inner"), unique("nc-spare"));
    let inner_key = a.key_of(inner.as_str()).unwrap();
    let mut raw = mysql_raw().await;
    let g = other.lock(inner.as_str()).await.unwrap();
    let out = a
        .with_lock(outer.as_str(), &LockOptions::new(), || async {
            let r = tokio::time::timeout(Duration::from_millis(300), a.lock(inner.as_str())).await;
            assert!(r.is_err(), "the inner lock is busy");
            // During the cleanup of the abandoned wait, and after it.
            for i in 0..8 {
                assert!(
                    other.try_lock(outer.as_str()).await.unwrap().is_none(),
                    "the outer lock was freed inside its scope ({} ms after the cancel)",
                    i * 100
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // The session still serves nested acquisitions.
            let s = a.try_lock(spare.as_str()).await.unwrap().expect("spare is free");
            s.release().await.unwrap();
            7
        })
        .await
        .unwrap();
    assert_eq!(out, dbmutex::Outcome::Acquired(7));
    g.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        used_by(&mut raw, &inner_key).await,
        None,
        "the abandoned wait took the lock"
    );
    assert!(other.try_lock(outer.as_str()).await.unwrap().is_some());
    assert_eq!(a.held_count(), 0);
}

/// The scope ends right after a cancelled nested acquisition: the outer
/// release waits for the cleanup to give the session back, and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_ending_during_nested_cleanup_releases_normally() {
    let (a, other) = (locker().await, locker().await);
    let (outer, inner) = (unique("ncr-outer"), unique("ncr-inner"));
    let mut raw = mysql_raw().await;
    let g = other.lock(inner.as_str()).await.unwrap();
    for _ in 0..5 {
        let out = a
            .with_lock(outer.as_str(), &LockOptions::new(), || async {
                let r = tokio::time::timeout(Duration::from_millis(50), a.lock(inner.as_str())).await;
                assert!(r.is_err());
            })
            .await;
        assert_eq!(out.unwrap(), dbmutex::Outcome::Acquired(()));
        let key = a.key_of(outer.as_str()).unwrap();
        assert!(freed_within(&mut raw, &key, SETTLE).await);
    }
    g.release().await.unwrap();
    assert_eq!(a.held_count(), 0);
}

/// A nested acquisition of one locker must never borrow the session of a
/// lock held by another locker (here: one whose prefixed key happens to
/// match the enclosing scope's name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_acquisition_stays_within_its_locker() {
    let with_prefix = |p: &str| Locker::builder(&mysql_url()).prefix(dbmutex::Prefix::new(p));
    let l1 = connect(with_prefix("dbmx-a:")).await;
    let l2 = connect(with_prefix("dbmx-b:")).await;
    let l3 = connect(with_prefix("dbmx-b:")).await;
    let (x, busy) = (unique("xl-x"), unique("xl-busy"));
    let other_guard = tokio::spawn({
        let (l2, x) = (l2.clone(), x.clone());
        async move { l2.lock(x.as_str()).await.unwrap() }
    })
    .await
    .unwrap();
    let b = l3.lock(busy.as_str()).await.unwrap();
    l1.with_lock(x.as_str(), &LockOptions::new(), || async {
        let r = tokio::time::timeout(Duration::from_millis(300), l2.lock(busy.as_str())).await;
        assert!(r.is_err());
    })
    .await
    .unwrap()
    .acquired()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(other_guard.is_held(), "another locker's guard was lost");
    assert!(
        l3.try_lock(x.as_str()).await.unwrap().is_none(),
        "its lock was freed"
    );
    other_guard.release().await.unwrap();
    b.release().await.unwrap();
}

/// A finite timeout beyond what `GET_LOCK` accepts still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_finite_timeout_waits() {
    let (a, other) = (locker().await, locker().await);
    let name = unique("huge");
    let g = other.lock(name.as_str()).await.unwrap();
    let waiting = tokio::spawn({
        let (a, name) = (a.clone(), name.clone());
        async move {
            a.acquire(
                name.as_str(),
                &LockOptions::new().timeout(Duration::from_secs(1 << 40)),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "gave up at once: {:?}", waiting.await);
    g.release().await.unwrap();
    let got = tokio::time::timeout(SETTLE, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    got.expect("acquired after the holder let go")
        .release()
        .await
        .unwrap();
}

/// Releasing a nested guard is not held up for the whole of another nested
/// wait on the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_release_is_not_blocked_by_a_nested_wait() {
    let (a, other) = (locker().await, locker().await);
    let (outer, n1, busy) = (unique("nr-outer"), unique("nr-n1"), unique("nr-busy"));
    let b = other.lock(busy.as_str()).await.unwrap();
    a.with_lock(outer.as_str(), &LockOptions::new(), || async {
        let g1 = a.lock(n1.as_str()).await.unwrap();
        let opts = LockOptions::new().timeout(Duration::from_secs(5));
        let wait = a.acquire(busy.as_str(), &opts);
        let release = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t = Instant::now();
            g1.release().await.unwrap();
            let took = t.elapsed();
            assert!(
                other.try_lock(n1.as_str()).await.unwrap().is_some(),
                "released in the server"
            );
            took
        };
        let (w, took) = tokio::join!(wait, release);
        assert!(took < Duration::from_millis(2500), "the release waited {took:?}");
        assert!(w.unwrap().is_none(), "busy stays held");
    })
    .await
    .unwrap()
    .acquired()
    .unwrap();
    b.release().await.unwrap();
}

/// The test server's URL, reached through a proxy that can go silent.
async fn freezable_proxy() -> (String, Arc<AtomicBool>) {
    common::proxied(&mysql_url(), 3306).await
}

/// In a silent partition, a bounded wait ends with an error within its
/// bound plus the keepalive margin, instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_does_not_outlast_the_bound() {
    let (url, frozen) = freezable_proxy().await;
    let cut_off = connect(
        Locker::builder(&url)
            .keepalive(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(500)),
    )
    .await;
    let other = locker().await;
    let name = unique("partition");
    let g = other.lock(name.as_str()).await.unwrap();
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let t = Instant::now();
            let r = cut_off
                .acquire(name.as_str(), &LockOptions::new().timeout(Duration::from_secs(1)))
                .await;
            (r.map(|g| g.is_some()), t.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    frozen.store(true, Ordering::Relaxed);
    // 1 s bound + 2 × 200 ms + 2 s margin = 3.4 s.
    let (r, took) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the acquisition hung in the partition")
        .unwrap();
    assert!(matches!(r, Err(Error::Connect(_))), "{r:?}");
    assert!(took < Duration::from_millis(3400 + 700), "took {took:?}");
    g.release().await.unwrap();
}

/// The scheme's case does not matter, nor `mariadb://` vs `mysql://`: the
/// driver gets its own spelling.
#[tokio::test]
async fn schemes_in_any_case_connect() {
    let url = mysql_url();
    let rest = url.split_once("://").unwrap().1;
    for scheme in ["MySQL", "MARIADB", "mariadb"] {
        let l = Locker::connect(&format!("{scheme}://{rest}")).await.unwrap();
        let name = unique("scheme-case");
        let g = l.try_lock(name.as_str()).await.unwrap().expect("free");
        g.release().await.unwrap();
    }
}

/// A clean connection kept for the next lock is closed once unused for the
/// locker's `idle_timeout`: a quiet locker keeps no connection open.
#[tokio::test]
async fn idle_connections_are_closed_once_quiet() {
    // Connected first, and a limit of 1 s: the check right after the
    // release must not race the limit on a loaded machine.
    let mut raw = mysql_raw().await;
    let a = Backend::Mysql
        .connect(Locker::builder(&mysql_url()).idle_timeout(Duration::from_secs(1)))
        .await;
    let name = unique("idle-close");
    let g = a.lock(name.as_str()).await.unwrap();
    let id = a.holders(name.as_str()).await.unwrap()[0].pid;
    g.release().await.unwrap();
    async fn open(raw: &mut Conn, id: i64) -> bool {
        let n: Option<i64> = raw
            .exec_first(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
                (id,),
            )
            .await
            .unwrap();
        n == Some(1)
    }
    assert!(open(&mut raw, id).await, "kept for reuse right after the release");
    let deadline = Instant::now() + SETTLE;
    while open(&mut raw, id).await {
        assert!(
            Instant::now() < deadline,
            "connection {id} still open after {SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The locker works on, on a new connection.
    let g = a.lock(name.as_str()).await.unwrap();
    assert_ne!(a.holders(name.as_str()).await.unwrap()[0].pid, id);
    g.release().await.unwrap();
}

/// Every kind of lock MySQL/MariaDB takes outlives its connection's
/// keepalive probes (as on PostgreSQL, whose transaction locks once did not).
#[tokio::test]
async fn each_kind_of_lock_outlives_its_keepalive_probes() {
    common::each_kind_outlives_its_probes(
        Backend::Mysql,
        &[
            LockOptions::new(),
            LockOptions::try_once(),
            LockOptions::new().fenced(true),
            LockOptions::new().max_hold(Duration::from_secs(30)),
            LockOptions::new().lock_delay(Duration::from_secs(5)),
        ],
    )
    .await;
}

/// A URL that names no host (`mysql://root@/test`) goes where the MySQL
/// clients go: a Unix socket, the local server's by default (which one is
/// the unit tests' business: `redact::scheme`), here a private server's,
/// named by `socket=`; the lock is held on that server. A socket that
/// cannot be reached is named in the error, and a port with no host is
/// refused (the clients would ignore it).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_without_a_host_goes_to_a_socket() {
    let my = PrivateMariaDb::start(&[]);
    let tcp = Locker::connect(&my.url()).await.unwrap();
    let url = format!("mysql://root@/test?socket={}", my.socket().display());
    let via_socket = Locker::connect(&url).await.expect("connect through the socket");
    let name = unique("no-host");
    let g = via_socket.lock(name.as_str()).await.unwrap();
    assert!(
        tcp.is_locked(name.as_str()).await.unwrap(),
        "the lock taken through the socket is held on the server behind it"
    );
    g.release().await.unwrap();
    assert!(!tcp.is_locked(name.as_str()).await.unwrap());

    let Err(err) = Locker::connect("mysql://root@/test?socket=/nonexistent/mysqld.sock").await else {
        panic!("connected through a socket that does not exist");
    };
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert!(
        err.to_string().contains("socket /nonexistent/mysqld.sock"),
        "{err}"
    );

    let Err(err) = Locker::connect(&format!("mysql://root@:{}/test", my.port())).await else {
        panic!("a port with no host was taken");
    };
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("a port with no host"), "{err}");
}
