//! Fencing tokens across a PostgreSQL failover (issue #23, item 1), on a
//! real topology each test starts itself: a private primary and an
//! asynchronous streaming standby (`pg_basebackup -R`), promoted with
//! `pg_ctl promote`. Advisory locks are not replicated and an async
//! standby may miss the last token rows; tokens must still only go up:
//! every token a promoted standby issues is greater than every token any
//! former primary issued, with replication lag and in split brain.

mod common;

use std::time::Duration;

use common::private_pg::PRIMARY;
use common::{unique, Backend, PrivatePg};
use dbmutex::{LockOptions, Locker};

async fn locker(pg: &PrivatePg) -> Locker {
    Backend::Postgres.connect(Locker::builder(&pg.url())).await
}

/// Takes `name` fenced, and releases it: the token it got.
async fn token(l: &Locker, name: &str) -> u64 {
    let opts = LockOptions::new().fenced(true).timeout(Duration::from_secs(10));
    let g = l.acquire(name, &opts).await.unwrap().expect("acquired");
    let t = g.fence().expect("a fenced guard carries a token");
    g.release().await.unwrap();
    t
}

async fn tokens(l: &Locker, name: &str, n: usize) -> Vec<u64> {
    let mut seen = Vec::new();
    for _ in 0..n {
        seen.push(token(l, name).await);
    }
    seen
}

/// The highest token row on `pg` (0 when the table is not there yet).
async fn row(pg: &PrivatePg) -> i64 {
    let raw = pg.raw().await;
    match raw
        .query_one("SELECT coalesce(max(token), 0) FROM dbmutex_fence", &[])
        .await
    {
        Ok(r) => r.get(0),
        Err(_) => 0,
    }
}

/// Waits until the standby has replayed the token row `want`.
async fn replayed(standby: &PrivatePg, want: u64) {
    let want = want as i64;
    assert!(
        common::eventually(
            Duration::from_secs(20),
            || async move { row(standby).await == want }
        )
        .await,
        "the standby did not replay token {want}: it has {}",
        row(standby).await
    );
}

/// Stops the standby's WAL receiver: no more WAL from the primary.
async fn stop_receiver(standby: &PrivatePg) {
    let raw = standby.raw().await;
    // Two statements: ALTER SYSTEM refuses a multi-statement string.
    raw.batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
        .await
        .unwrap();
    raw.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let raw = &raw;
    assert!(
        common::eventually(Duration::from_secs(20), || async move {
            let r = raw
                .query_one("SELECT count(*) FROM pg_stat_wal_receiver", &[])
                .await
                .unwrap();
            r.get::<_, i64>(0) == 0
        })
        .await,
        "the standby's WAL receiver did not stop"
    );
}

/// The server's timeline as the last checkpoint records it, and as the
/// current WAL file's name has it (its first 8 hex digits).
async fn timelines(pg: &PrivatePg) -> (u32, u32) {
    let raw = pg.raw().await;
    let r = raw
        .query_one(
            "SELECT (SELECT timeline_id FROM pg_control_checkpoint())::bigint, \
             substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
            &[],
        )
        .await
        .unwrap();
    let wal: String = r.get(1);
    (
        u32::try_from(r.get::<_, i64>(0)).unwrap(),
        u32::from_str_radix(&wal, 16).unwrap(),
    )
}

/// Promotes `standby`, and reads its timelines at once.
async fn promote(standby: &PrivatePg) -> (u32, u32) {
    tokio::task::block_in_place(|| standby.promote());
    let seen = timelines(standby).await;
    println!(
        "timelines right after pg_ctl promote: checkpoint {}, WAL file {}",
        seen.0, seen.1
    );
    assert_eq!(seen.1, 2, "the WAL file's timeline is the new one at once");
    seen
}

fn increasing(seen: &[u64]) -> bool {
    seen.windows(2).all(|w| w[1] > w[0])
}

/// Tokens 1 and 2 replicated, then the standby stops receiving (its WAL
/// receiver off, or its replay paused), tokens 3..5 on the primary only,
/// the primary stops and the standby is promoted: its row says 2, yet
/// every token it issues is greater than 5.
async fn promotion_after_lag(cut: &str) {
    let primary = PrivatePg::start(PRIMARY);
    let standby = tokio::task::block_in_place(|| primary.start_standby());
    let name = unique("failover-lag");
    let old = locker(&primary).await;
    let mut before = tokens(&old, &name, 2).await;
    replayed(&standby, before[1]).await;
    if cut == "receiver" {
        stop_receiver(&standby).await;
    } else {
        standby
            .raw()
            .await
            .batch_execute("SELECT pg_wal_replay_pause()")
            .await
            .unwrap();
    }
    before.extend(tokens(&old, &name, 3).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lagging = row(&standby).await;
    assert_eq!(lagging, before[1] as i64, "the standby missed the last tokens");
    drop(old);
    tokio::task::block_in_place(|| primary.shut_down());
    let t = std::time::Instant::now();
    promote(&standby).await;
    let new = locker(&standby).await;
    let after = tokens(&new, &name, 3).await;
    println!(
        "{cut} cut: before {before:?}, standby's row {lagging}, after promotion {after:?} \
         (first token {:?} after pg_ctl promote returned)",
        t.elapsed()
    );
    let last = *before.last().unwrap();
    assert!(
        after.iter().all(|&t| t > last),
        "after {after:?} must exceed {before:?}"
    );
    assert!(increasing(&before) && increasing(&after), "{before:?} {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_whose_receiver_stopped_issues_greater_tokens() {
    promotion_after_lag("receiver").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_whose_replay_was_paused_issues_greater_tokens() {
    promotion_after_lag("replay").await;
}

/// Split brain: the standby is promoted while the old primary keeps
/// serving. Both issue tokens for one name, interleaved: every token of
/// the new primary is greater than every token of the old one, even those
/// the old one issues after the promotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_split_brain_the_new_primarys_tokens_are_greater() {
    let primary = PrivatePg::start(PRIMARY);
    let standby = tokio::task::block_in_place(|| primary.start_standby());
    let name = unique("failover-split");
    let old = locker(&primary).await;
    let mut from_old = tokens(&old, &name, 2).await;
    replayed(&standby, from_old[1]).await;
    promote(&standby).await;
    let new = locker(&standby).await;
    let mut from_new = Vec::new();
    for _ in 0..3 {
        from_old.extend(tokens(&old, &name, 2).await);
        from_new.push(token(&new, &name).await);
    }
    println!("split brain: old primary {from_old:?}, new primary {from_new:?}");
    let (old_max, new_min) = (*from_old.iter().max().unwrap(), *from_new.iter().min().unwrap());
    assert!(new_min > old_max, "old {from_old:?} new {from_new:?}");
    assert!(
        increasing(&from_old) && increasing(&from_new),
        "{from_old:?} {from_new:?}"
    );
}

/// When `guard` reports its loss: how long from now, and the instant
/// (panics past `within`).
async fn told_within(guard: &dbmutex::LockGuard, within: Duration) -> (Duration, std::time::Instant) {
    let t = std::time::Instant::now();
    tokio::time::timeout(within, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("the holder was not told within {within:?}"));
    (t.elapsed(), std::time::Instant::now())
}

/// Sets (or resets) `default_transaction_read_only` server-wide and
/// reloads, as a failover manager fences an old primary; `raw` keeps
/// writing (its own session setting wins over the file).
async fn read_only(raw: &tokio_postgres::Client, on: bool) {
    let set = if on {
        "ALTER SYSTEM SET default_transaction_read_only = on"
    } else {
        "ALTER SYSTEM RESET default_transaction_read_only"
    };
    raw.batch_execute(set).await.unwrap();
    raw.batch_execute("SELECT pg_reload_conf()").await.unwrap();
}

/// Split brain ended by fencing the old primary read-only: the holder on
/// it is told within the keepalive bound (1 s at the default, plus the
/// probe's round trip), and its session lets the lock go. Three runs on one topology; the split-brain
/// window is the time both holders held the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_primary_made_read_only_is_told() {
    let primary = PrivatePg::start(PRIMARY);
    let standby = tokio::task::block_in_place(|| primary.start_standby());
    promote(&standby).await;
    let admin = primary.raw().await;
    admin
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    let new = locker(&standby).await;
    let opts = LockOptions::new().timeout(Duration::from_secs(10));
    for run in 1..=3 {
        let name = unique("failover-read-only");
        let old = locker(&primary).await;
        let held = old
            .acquire(&name, &opts)
            .await
            .unwrap()
            .expect("acquired on the old primary");
        let both = std::time::Instant::now();
        let second = new
            .acquire(&name, &opts)
            .await
            .unwrap()
            .expect("acquired on the new primary");
        // Let the old holder's probe settle into its rhythm first.
        tokio::time::sleep(Duration::from_millis(300 * run)).await;
        read_only(&admin, true).await;
        let (told, at) = told_within(&held, Duration::from_secs(3)).await;
        let window = at - both;
        assert!(!held.is_held(), "told, and no longer held");
        assert!(second.is_held(), "the new primary's holder is unaffected");
        println!(
            "read-only run {run}: old holder told {told:?} after the reload; two holders for {window:?}"
        );
        assert!(
            told < Duration::from_millis(2000),
            "within the keepalive bound: {told:?}"
        );
        // Its session was closed: the old primary lets the lock go (its
        // backend ends when it sees the closed socket, a few ms later).
        let raw = &admin;
        assert!(
            common::eventually(Duration::from_secs(2), || async move {
                let left: i64 = raw
                    .query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'", &[])
                    .await
                    .unwrap()
                    .get(0);
                left == 0
            })
            .await,
            "the old holder's session let the lock go"
        );
        read_only(&admin, false).await;
        second.release().await.unwrap();
    }
    // A transaction lock's holder (its connection takes no claim, and its
    // open transaction keeps the read-only flag its BEGIN got) is told the
    // same way.
    let old = locker(&primary).await;
    let xact = LockOptions::new()
        .timeout(Duration::from_secs(10))
        .transaction(true);
    let held = old
        .acquire(&unique("failover-read-only-xact"), &xact)
        .await
        .unwrap()
        .expect("acquired on the old primary");
    tokio::time::sleep(Duration::from_millis(300)).await;
    read_only(&admin, true).await;
    let (told, _) = told_within(&held, Duration::from_secs(3)).await;
    println!("read-only, transaction lock: old holder told {told:?} after the reload");
    assert!(
        told < Duration::from_millis(2000),
        "within the keepalive bound: {told:?}"
    );
    read_only(&admin, false).await;
    // A server read-only from the start (a read-only role, say) is not a
    // failover: only a change is told.
    read_only(&admin, true).await;
    let steady = locker(&primary).await;
    let held = steady
        .acquire(&unique("read-only-from-the-start"), &opts)
        .await
        .unwrap()
        .expect("acquired");
    let held_xact = steady
        .acquire(&unique("read-only-from-the-start-xact"), &xact)
        .await
        .unwrap()
        .expect("acquired");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(held.is_held(), "a lock taken on a read-only server stays held");
    assert!(
        held_xact.is_held(),
        "a transaction lock taken on a read-only server stays held"
    );
}

/// The old primary demoted (stopped, then started again as a standby):
/// its holder is told at once (its session ends), and a locker cannot
/// take locks on the demoted server (a typed refusal, not a lock that
/// excludes only that standby's clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_primary_restarted_as_a_standby_is_told() {
    let primary = PrivatePg::start(PRIMARY);
    let standby = tokio::task::block_in_place(|| primary.start_standby());
    let name = unique("failover-demoted");
    let opts = LockOptions::new().timeout(Duration::from_secs(10));
    let old = locker(&primary).await;
    let held = old.acquire(&name, &opts).await.unwrap().expect("acquired");
    promote(&standby).await;
    let new = locker(&standby).await;
    let both = std::time::Instant::now();
    let second = new
        .acquire(&name, &opts)
        .await
        .unwrap()
        .expect("acquired on the new primary");
    // Watched from a task of its own: the demotion below blocks this one.
    let lost = held.lost();
    let watcher = tokio::spawn(async move {
        lost.await;
        std::time::Instant::now()
    });
    let stop = std::time::Instant::now();
    tokio::task::block_in_place(|| primary.restart_as_standby());
    let demoted = stop.elapsed();
    let at = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the holder was told")
        .unwrap();
    let told = at - stop;
    println!(
        "demotion: old holder told {told:?} after the stop began (restart as a standby took {demoted:?}); \
         two holders for {:?}",
        at - both
    );
    assert!(told < Duration::from_secs(2), "told at once: {told:?}");
    assert!(second.is_held());
    let in_recovery: bool = primary
        .raw()
        .await
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(in_recovery, "the old primary is a standby now");
    match Locker::builder(&primary.url()).connect().await {
        Err(e @ dbmutex::Error::Connect(_)) => {
            let m = e.to_string();
            assert!(m.contains("pg_is_in_recovery()"), "{m}");
            println!("a locker on the demoted server: {m}");
        }
        Err(e) => panic!("refused, but not as a standby: {e}"),
        Ok(_) => panic!("a locker on a hot standby must be refused"),
    }
    // A transaction lock takes no claim: its own connection, which the
    // old locker now opens on the demoted server, is refused there too
    // (retried as a connect error until the bound), never granted.
    let xact = LockOptions::new()
        .transaction(true)
        .timeout(Duration::from_secs(2));
    match old.acquire(&name, &xact).await {
        Ok(Some(_)) => panic!("a transaction lock was granted on a hot standby"),
        Ok(None) => println!("a transaction lock on the demoted server: not acquired within 2 s"),
        Err(e) => {
            println!("a transaction lock on the demoted server: {e}");
            assert!(matches!(e, dbmutex::Error::Connect(_)), "{e}");
        }
    }
}
