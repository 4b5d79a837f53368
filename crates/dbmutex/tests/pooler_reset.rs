//! PgBouncer session pooling whose `server_reset_query` is not `DISCARD
//! ALL` (issue #23, item 4): a client that goes away holding an advisory
//! lock leaves it on the server session the pool hands to the next client.
//! Each test starts its own pgbouncer (session mode, two server sessions)
//! in front of the shared test database: with `RESET ALL`, `DEALLOCATE
//! ALL` or an empty reset query the connect is refused, naming the
//! setting, and leaves no lock behind; with `DISCARD ALL` it is accepted
//! and a holder that dies leaves no lock.

mod common;

use std::time::{Duration, Instant};

use common::pgbouncer::PgBouncer;
use common::{pg_raw, unique};
use dbmutex::{Error, Locker};

/// The server pid that holds bigint advisory lock `k`, if any.
async fn holder_of(direct: &tokio_postgres::Client, k: i64) -> Option<i32> {
    direct
        .query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid",
            &[&k],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Advisory locks held by server sessions whose last statement was the
/// connect check's probe or a reset query that keeps locks.
async fn probe_leftovers(direct: &tokio_postgres::Client) -> i64 {
    direct
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND a.state = 'idle' AND a.query IN \
             ('SELECT pg_backend_pid(), pg_try_advisory_lock($1)', 'RESET ALL', 'DEALLOCATE ALL')",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn session_pool(reset: &str) -> PgBouncer {
    PgBouncer::start_configured("session", 2, false, &format!("server_reset_query = {reset}")).await
}

/// The hazard, then dbmutex's answer: a raw client takes a lock through the
/// pool and goes away; with a reset query that keeps locks the lock stays
/// held (an orphan, freed here by stopping that pgbouncer). On a fresh
/// pool `Locker::connect` is then refused with a message naming
/// `server_reset_query`, and its probe leaves no lock.
async fn refused(reset: &str) {
    let direct = pg_raw().await;
    let bouncer = session_pool(reset).await;
    let k = fastrand::i64(1..);
    let raw = bouncer.raw().await;
    raw.batch_execute(&format!("SELECT pg_advisory_lock({k})"))
        .await
        .unwrap();
    drop(raw);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        holder_of(&direct, k).await.is_some(),
        "{reset:?}: the gone client's lock was freed"
    );
    drop(bouncer);
    let d = &direct;
    assert!(
        common::eventually(Duration::from_secs(5), || async move {
            holder_of(d, k).await.is_none()
        })
        .await,
        "{reset:?}: the orphan outlived its pgbouncer"
    );
    let bouncer = session_pool(reset).await;
    let t = Instant::now();
    let err = Locker::connect(&bouncer.url()).await.err();
    let took = t.elapsed();
    println!("server_reset_query = {reset:?}: connect refused after {took:?}");
    assert!(
        matches!(&err, Some(Error::Unsupported(m)) if m.contains("server_reset_query") && m.contains("DISCARD ALL")),
        "{reset:?}: {err:?}\npgbouncer's log:\n{}",
        bouncer.log()
    );
    let d = &direct;
    assert!(
        common::eventually(
            Duration::from_secs(5),
            || async move { probe_leftovers(d).await == 0 }
        )
        .await,
        "{reset:?}: the connect check left its probe lock held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_is_refused() {
    refused("RESET ALL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocate_all_is_refused() {
    refused("DEALLOCATE ALL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_reset_query_is_refused() {
    refused("").await;
}

/// `DISCARD ALL`: accepted, and a holder that dies (its runtime dropped
/// with a lock held and nothing released: its sockets close as under `kill
/// -9`) leaves no lock: a direct locker gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_all_is_accepted_and_a_dead_holder_leaves_nothing() {
    let bouncer = session_pool("DISCARD ALL").await;
    let name = unique("pgb-reset");
    let url = bouncer.url();
    let n = name.clone();
    let took = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let took = rt.block_on(async {
            let t = Instant::now();
            let l = Locker::connect(&url).await.expect("DISCARD ALL is accepted");
            let took = t.elapsed();
            let g = l.try_lock(n.as_str()).await.unwrap().expect("free");
            std::mem::forget(g);
            std::mem::forget(l);
            took
        });
        drop(rt);
        took
    })
    .join()
    .unwrap();
    println!("server_reset_query = DISCARD ALL: connect took {took:?}");
    let direct = Locker::connect(&common::pg_url()).await.unwrap();
    let (d, n) = (&direct, name.as_str());
    assert!(
        common::eventually(
            Duration::from_secs(5),
            || async move { common::free_for(d, n).await }
        )
        .await,
        "the dead holder's lock stayed held"
    );
}

/// The check on a direct connection: accepted, and what it costs at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_connection_passes_the_check() {
    let mut took = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let l = Locker::connect(&common::pg_url()).await.expect("direct");
        took.push(t.elapsed());
        drop(l);
    }
    println!("direct connects: {took:?}");
}
