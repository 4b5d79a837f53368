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
