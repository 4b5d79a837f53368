//! pgpool-II load balancing in front of a primary and its streaming
//! standby (issue #23, item 4b), all private and on loopback: pgpool
//! sends read-only-looking statements to a standby, where no lock is, so
//! a connection whose reads go there is refused at connect, naming the
//! setting; the keepalive probe itself is routed to the primary (it calls
//! a volatile function), so a holder is never falsely lost.

mod common;

use std::time::{Duration, Instant};

use common::pgpool::PgPool;
use common::private_pg::PRIMARY;
use common::{unique, PrivatePg};
use dbmutex::{LockOptions, Locker};

/// Statement-level load balancing, every read weighted to the standby.
const STATEMENT_LEVEL: &str = "statement_level_load_balance = on";

/// A primary, its standby, and pgpool in front with `extra` settings.
async fn topology(extra: &str) -> (PrivatePg, PrivatePg, PgPool) {
    let primary = PrivatePg::start(PRIMARY);
    let standby = tokio::task::block_in_place(|| primary.start_standby());
    let pool = PgPool::start(&primary, &standby, (0.0, 1.0), extra).await;
    // The set-up does what it says: a stable read goes to the standby.
    let port: i32 = pool
        .raw()
        .await
        .query_one("SELECT inet_server_port()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        port,
        i32::from(standby.port()),
        "pgpool load-balances reads to the standby"
    );
    (primary, standby, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_level_load_balancing_is_refused_naming_the_setting() {
    let (_primary, _standby, pool) = topology(STATEMENT_LEVEL).await;
    for run in 1..=3 {
        let t = Instant::now();
        match Locker::builder(&pool.url()).connect().await {
            Err(dbmutex::Error::Unsupported(m)) => {
                println!("run {run}: refused after {:?}: {m}", t.elapsed());
                assert!(m.contains("statement_level_load_balance = on"), "{m}");
                assert!(m.contains("app_name_redirect_preference_list"), "{m}");
            }
            Err(e) => panic!("refused, but not as load balancing: {e}"),
            Ok(_) => panic!("a connection whose reads go to a standby must be refused"),
        }
    }
}

/// Past the connect check (skipped, as a slipped-through hint would be),
/// holders through statement-level load balancing keep their locks: the
/// keepalive probe goes to the primary. Three holders, 30 probes each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_statement_level_load_balancing_no_holder_is_falsely_lost() {
    let (primary, _standby, pool) = topology(STATEMENT_LEVEL).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let l = Locker::builder(&pool.url())
            .keepalive(Duration::from_millis(100))
            .skip_pooler_check_for_tests()
            .connect()
            .await
            .unwrap();
        let g = l
            .acquire(
                &unique("pgpool-holder"),
                &LockOptions::new().timeout(Duration::from_secs(5)),
            )
            .await
            .unwrap()
            .expect("acquired");
        held.push((l, g));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lost = held.iter().filter(|(_, g)| !g.is_held()).count();
    let on_primary = primary.granted_advisory_locks().await;
    println!("statement-level load balancing: {lost} of 3 holders lost after 3 s; {on_primary} locks on the primary");
    assert_eq!(lost, 0, "no false loss");
    assert_eq!(on_primary, 3, "the locks are on the primary");
    for (_, g) in held {
        g.release().await.unwrap();
    }
}

/// Routed instead of refused: pgpool sends the application `dbmutex` to
/// the primary (`app_name_redirect_preference_list`), and the connect is
/// accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancing_routed_to_the_primary_for_dbmutex_is_accepted() {
    let (_primary, _standby, pool) = topology(&format!(
        "{STATEMENT_LEVEL}\napp_name_redirect_preference_list = 'dbmutex:primary'"
    ))
    .await;
    let l = Locker::builder(&pool.url()).connect().await.unwrap();
    let name = unique("pgpool-routed");
    let g = l.lock(name.as_str()).await.unwrap();
    let other = Locker::builder(&pool.url()).connect().await.unwrap();
    assert!(other.try_lock(name.as_str()).await.unwrap().is_none(), "excluded");
    g.release().await.unwrap();
    assert!(other.try_lock(name.as_str()).await.unwrap().is_some());
}

/// Reads weighted to both nodes (0.5 : 0.5), statement-level: each
/// connect is either refused, naming the setting, or (when every
/// question of the connect check happened to reach the primary) accepted,
/// and then its holder is not falsely lost. Ten connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_weighted_to_both_nodes_give_a_refusal_or_a_safe_holder() {
    let primary = PrivatePg::start(PRIMARY);
    let standby = tokio::task::block_in_place(|| primary.start_standby());
    let pool = PgPool::start(&primary, &standby, (0.5, 0.5), STATEMENT_LEVEL).await;
    let (mut refused, mut accepted) = (0, Vec::new());
    for _ in 0..10 {
        match Locker::builder(&pool.url())
            .keepalive(Duration::from_millis(100))
            .connect()
            .await
        {
            Err(dbmutex::Error::Unsupported(m)) => {
                assert!(m.contains("statement_level_load_balance = on"), "{m}");
                refused += 1;
            }
            Err(e) => panic!("refused, but not as load balancing: {e}"),
            Ok(l) => {
                let g = l.lock(unique("pgpool-both").as_str()).await.unwrap();
                accepted.push((l, g));
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lost = accepted.iter().filter(|(_, g)| !g.is_held()).count();
    println!(
        "reads to both nodes: {refused} of 10 connects refused, {} accepted, {lost} of them lost after 2 s",
        accepted.len()
    );
    assert_eq!(lost, 0, "no false loss");
}
