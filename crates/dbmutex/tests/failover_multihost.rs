//! Multi-host URLs across a failover (issue #23, item 3), on a private
//! primary and streaming standby: `postgres://a,b/db?target_session_attrs
//! =read-write` finds the primary whichever host comes first; after the
//! primary stops and the standby is promoted, the holder is told, and the
//! same locker's next lock (asked for before the promotion) goes to the new
//! primary, with a greater token.

mod common;

use std::time::{Duration, Instant};

use common::private_pg::PRIMARY;
use common::{unique, PrivatePg};
use dbmutex::{LockOptions, Locker};

/// Both servers, the standby first: only `target_session_attrs` can
/// make a connection land on the primary.
fn multi_host_url(standby: &PrivatePg, primary: &PrivatePg) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/test?sslmode=disable&target_session_attrs=read-write",
        standby.port(),
        primary.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_url_follows_the_promotion() {
    let primary = PrivatePg::start(PRIMARY);
    let standby = tokio::task::block_in_place(|| primary.start_standby());
    let url = multi_host_url(&standby, &primary);
    let t = Instant::now();
    let locker = Locker::builder(&url).connect().await.unwrap();
    println!("connected through the multi-host URL in {:?}", t.elapsed());
    let name = unique("multi-host");
    let opts = LockOptions::new().fenced(true).timeout(Duration::from_secs(10));
    let g = locker.acquire(&name, &opts).await.unwrap().expect("acquired");
    let before = g.fence().unwrap();
    assert_eq!(
        primary.granted_advisory_locks().await,
        1,
        "the lock is on the primary"
    );
    assert_eq!(standby.granted_advisory_locks().await, 0);

    // Failover: the primary stops, the standby is promoted.
    let lost = g.lost();
    let watcher = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });
    let stop = Instant::now();
    tokio::task::block_in_place(|| primary.shut_down());
    let told = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the holder was told")
        .unwrap()
        - stop;
    assert!(!g.is_held());
    drop(g);

    // The same locker: a lock asked for while no host is a primary waits
    // (reconnecting) and is granted on the new primary once promoted.
    let waiter = tokio::spawn({
        let (locker, name, opts) = (locker.clone(), name.clone(), opts.clone());
        async move { locker.acquire(&name, &opts).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "no primary: the lock waits");
    tokio::task::block_in_place(|| standby.promote());
    let promoted = Instant::now();
    let g = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("acquired after the promotion");
    let after = g.fence().unwrap();
    println!(
        "holder told {told:?} after the stop began; next lock {:?} after the promotion; tokens {before} -> {after}",
        promoted.elapsed()
    );
    assert_eq!(
        standby.granted_advisory_locks().await,
        1,
        "the lock is on the new primary"
    );
    assert!(after > before, "{before} -> {after}");
    let other = Locker::builder(&url).connect().await.unwrap();
    assert!(
        other.try_lock(name.as_str()).await.unwrap().is_none(),
        "excluded on the new primary"
    );
    g.release().await.unwrap();
    assert!(other.try_lock(name.as_str()).await.unwrap().is_some());
}
