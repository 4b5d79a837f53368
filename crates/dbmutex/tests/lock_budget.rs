//! No set of dbmutex clients can fill PostgreSQL's shared lock table (an
//! outage for every client of the server): each locker keeps to a budget
//! derived from the server's real capacity and from what the whole server
//! holds, and refuses with a typed error well before the edge.
//!
//! Destructive if it failed, so it runs on a private server (`PrivatePg`)
//! with a small table: `max_locks_per_transaction = 10`, `max_connections =
//! 20` make a capacity of 200 entries (the server can borrow some spare
//! shared memory beyond it).

mod common;

use std::time::Duration;

use common::{unique, PrivatePg};
use dbmutex::{Error, LockGuard, LockOptions, Locker, WaitStrategy};

/// Four lockers — four clients with their own server sessions, as four
/// processes would be — each take locks until refused, with every kind of
/// lock (polling session locks, server-side waits, transaction locks).
/// Every one is refused with `Error::ServerLockBudget`; the server still
/// accepts new connections and runs queries; dbmutex's locks never exceed
/// the table's capacity, and at least half of it was usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_lockers_cannot_fill_the_servers_lock_table() {
    let pg = PrivatePg::start(&[("max_locks_per_transaction", "10"), ("max_connections", "20")]);
    let capacity = 10 * 20;
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(
            Locker::builder(&pg.url())
                .connect()
                .await
                .unwrap_or_else(|e| panic!("connect to the private server: {e}\n{}", pg.log())),
        );
    }
    let kinds = [
        LockOptions::try_once(),
        LockOptions::new()
            .timeout(Duration::from_secs(1))
            .wait_strategy(WaitStrategy::Server),
        LockOptions::try_once().transaction(true),
    ];
    let mut guards: Vec<LockGuard> = Vec::new();
    let mut refused: Vec<Option<Error>> = lockers.iter().map(|_| None).collect();
    // Round robin, so the lockers fill the table together.
    for round in 0..capacity {
        for (i, l) in lockers.iter().enumerate() {
            if refused[i].is_some() {
                continue;
            }
            // Dedicated connections are few (max_connections): mostly
            // session locks, one of each other kind per locker.
            let opts = if round < 1 { &kinds[1 + i % 2] } else { &kinds[0] };
            match l.acquire(unique("budget").as_str(), opts).await {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => panic!("a fresh name is free"),
                Err(e @ Error::ServerLockBudget { .. }) => refused[i] = Some(e),
                Err(e) => panic!("locker {i}, round {round}: {e:?}\n{}", pg.log()),
            }
        }
        if refused.iter().all(Option::is_some) {
            break;
        }
    }
    let held = guards.len();
    println!("held {held} of a {capacity}-entry table when every locker was refused");
    for e in &refused {
        let e = e
            .as_ref()
            .expect("every locker is refused before the table fills");
        let msg = e.to_string();
        assert!(msg.contains("max_locks_per_transaction"), "{msg}");
    }
    assert!(
        held <= capacity,
        "dbmutex held {held} locks in a {capacity}-entry table"
    );
    assert!(
        held >= capacity / 2,
        "the budget leaves half the table usable: {held}"
    );

    // No outage: a new connection works, and so do ordinary queries that
    // take locks of their own.
    let other = pg.raw().await;
    other
        .batch_execute("CREATE TEMP TABLE t (x int); INSERT INTO t VALUES (1); SELECT * FROM t")
        .await
        .expect("the server serves other clients while dbmutex is at its budget");

    // Room comes back as locks are released.
    guards.truncate(held / 2);
    let g = lockers[0]
        .try_lock(unique("after").as_str())
        .await
        .expect("room again after releases")
        .expect("free");
    drop(g);
    drop(guards);
}

/// The attacks of the second reading: each locker alone fills to its
/// budget and lets go (room once granted must not be kept), then every
/// locker bursts 300 concurrent acquisitions at once (reservations waiting
/// for one count must all be counted). Twice. No acquisition ever meets a
/// full table (53200), the server keeps serving new connections, and
/// dbmutex never holds more than the table's nominal capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_and_released_room_cannot_fill_the_table() {
    let pg = PrivatePg::start(&[("max_locks_per_transaction", "10"), ("max_connections", "20")]);
    let capacity = 10 * 20;
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(Locker::connect(&pg.url()).await.unwrap());
    }
    for round in 0..2 {
        // Alone, one after another: fill, then release everything.
        for l in &lockers {
            let mut mine = Vec::new();
            loop {
                match l.try_lock(unique("alone").as_str()).await {
                    Ok(Some(g)) => mine.push(g),
                    Ok(None) => panic!("a fresh name is free"),
                    Err(Error::ServerLockBudget { .. }) => break,
                    Err(e) => panic!("round {round}, alone: {e:?}"),
                }
                assert!(mine.len() <= capacity, "one locker alone passed the table's size");
            }
            for g in mine {
                g.release().await.unwrap();
            }
        }
        // Then all at once, 300 concurrent acquisitions each.
        let mut tasks = Vec::new();
        for l in &lockers {
            for _ in 0..300 {
                let l = l.clone();
                tasks.push(tokio::spawn(
                    async move { l.try_lock(unique("burst").as_str()).await },
                ));
            }
        }
        let (mut held, mut refused) = (Vec::new(), 0);
        for t in tasks {
            match t.await.unwrap() {
                Ok(Some(g)) => held.push(g),
                Ok(None) => panic!("a fresh name is free"),
                Err(Error::ServerLockBudget { .. }) => refused += 1,
                Err(e) => panic!("round {round}, burst: {e:?}\n{}", pg.log()),
            }
        }
        println!(
            "round {round}: burst held {} and refused {refused} of 1200",
            held.len()
        );
        assert!(
            held.len() <= capacity,
            "{} locks in a {capacity}-entry table",
            held.len()
        );
        assert!(refused > 0);
        pg.raw()
            .await
            .batch_execute("SELECT count(*) FROM pg_class")
            .await
            .expect("the server serves new connections during the burst");
        drop(held);
    }
}
