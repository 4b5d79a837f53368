//! PostgreSQL's shared lock table, full: a typed error naming the setting,
//! and the locks already held stay held.
//!
//! While the table is full every session's queries on that server fail, so
//! this runs on a private server of its own (`PrivatePg`), never on the
//! shared test server. Small settings keep the table small: it fills after a
//! few hundred locks.

mod common;

use common::{unique, PrivatePg};
use dbmutex::{Error, Locker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_lock_table_is_a_typed_error_and_held_locks_stay() {
    let pg = PrivatePg::start(&[("max_locks_per_transaction", "10"), ("max_connections", "10")]);
    let connect = || async {
        Locker::builder(&pg.url())
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to the private server: {e}\n{}", pg.log()))
    };
    let l = connect().await;
    let other = connect().await;
    let kept = unique("kept");
    let g = l.lock(kept.as_str()).await.unwrap();

    // Fill the server's lock table from a raw session: the statement fails
    // once it is full, and the locks it took stay held (session locks).
    let filler = pg.raw().await;
    let err = filler
        .query(
            "SELECT pg_advisory_lock(424242, g) FROM generate_series(1, 100000) g",
            &[],
        )
        .await
        .expect_err("the table fills up before 100,000 locks");
    assert_eq!(err.code().map(|c| c.code()), Some("53200"), "{err}");

    let err = l.try_lock(unique("one-too-many").as_str()).await.unwrap_err();
    assert!(matches!(err, Error::LockTableFull(_)), "{err:?}");
    assert!(err.to_string().contains("max_locks_per_transaction"), "{err}");
    assert_eq!(err.sqlstate().as_deref(), Some("53200"));
    assert!(g.is_held(), "the locks held before stay held");

    // Free the table, then check the kept lock is still ours.
    filler
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    assert!(
        other.try_lock(kept.as_str()).await.unwrap().is_none(),
        "still held after the error"
    );
    g.release().await.unwrap();
    assert!(common::free_for(&other, &kept).await);
}
