//! Locks on the caller's own connections: an sqlx pool connection or
//! transaction, and a tokio-postgres client or transaction.

mod common;

use std::time::{Duration, Instant};

use common::{pg_raw, pg_url, unique};
use dbmutex::key::{pg_key, PgKey, Prefix};
use dbmutex::postgres::{lock_session, sqlx as dsqlx};
use dbmutex::{Error, LockName, LockOptions, WaitStrategy};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Connection, Row};

async fn pool(max: u32) -> PgPool {
    let url = pg_url();
    match PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
    {
        Ok(p) => p,
        Err(e) => panic!(
            "cannot reach the PostgreSQL test server at {}: {e}",
            dbmutex::redact_url(&url)
        ),
    }
}

/// Whether a raw client of its own can take `name`'s key (and gives it back).
async fn free(name: &str) -> bool {
    let c = pg_raw().await;
    let k = pg_key(&LockName::from(name), &Prefix::none());
    let (sql, unlock) = (
        format!("SELECT pg_try_advisory_lock({})", k.sql_args()),
        format!("SELECT pg_advisory_unlock({})", k.sql_args()),
    );
    let got: bool = c.query_one(sql.as_str(), &[]).await.unwrap().get(0);
    if got {
        c.batch_execute(&unlock).await.unwrap();
    }
    got
}

/// Advisory locks the connection's own session holds.
async fn own_locks(c: &mut sqlx::PgConnection) -> i64 {
    sqlx::query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        .fetch_one(c)
        .await
        .unwrap()
        .get(0)
}

async fn pid(c: &mut sqlx::PgConnection) -> i32 {
    sqlx::query("SELECT pg_backend_pid()")
        .fetch_one(c)
        .await
        .unwrap()
        .get(0)
}

/// A pool of one: a session lock's connection never goes back to the pool
/// while it holds the lock — after `release()` and after a plain drop.
#[tokio::test]
async fn sqlx_session_lock_on_a_pool_of_one() {
    let pool = pool(1).await;
    let name = unique("sx-session");
    let p = Prefix::none();

    let conn = pool.acquire().await.unwrap();
    let mut guard = dsqlx::lock_session(conn, name.as_str(), &LockOptions::try_once(), &p)
        .await
        .unwrap()
        .expect("free lock");
    // The app's own queries, on the locked connection.
    let one: i32 = sqlx::query("SELECT 1")
        .fetch_one(&mut *guard)
        .await
        .unwrap()
        .get(0);
    assert_eq!(one, 1);
    assert!(!free(&name).await, "another session took a held lock");
    let mut conn = guard.release().await.unwrap();
    assert_eq!(
        own_locks(&mut conn).await,
        0,
        "release left the lock on the connection"
    );
    assert!(free(&name).await);
    drop(conn);

    // Dropped without release: the pool hands the connection out again
    // only once the unlock is done.
    for round in 0..20 {
        let conn = pool.acquire().await.unwrap();
        let guard = dsqlx::lock_session(conn, name.as_str(), &LockOptions::try_once(), &p)
            .await
            .unwrap()
            .expect("free lock");
        drop(guard);
        let mut next = pool.acquire().await.unwrap();
        assert_eq!(
            own_locks(&mut next).await,
            0,
            "round {round}: pooled connection still held the lock"
        );
    }
    assert!(free(&name).await);
}

/// A refused name or option costs the pool nothing: the connection goes
/// back to it untouched (the same server session comes out next), not
/// closed as after a statement that may have locked.
#[tokio::test]
async fn sqlx_refused_names_leave_the_pooled_connection_open() {
    let pool = pool(1).await;
    let p = Prefix::none();
    let before = pid(&mut pool.acquire().await.unwrap()).await;
    let refusals = [
        ("", LockOptions::try_once()),
        ("a\0b", LockOptions::try_once()),
        ("fine", LockOptions::try_once().transaction(true)),
    ];
    for (name, opts) in refusals {
        let conn = pool.acquire().await.unwrap();
        let r = dsqlx::lock_session(conn, name, &opts, &p).await;
        assert!(
            matches!(r, Err(dbmutex::Error::InvalidName(_) | dbmutex::Error::Config(_))),
            "{name:?}: {r:?}"
        );
        let after = pid(&mut pool.acquire().await.unwrap()).await;
        assert_eq!(
            after, before,
            "{name:?}: the refusal closed the pooled connection"
        );
    }
}

/// A transaction lock next to the app's own queries in their transaction
/// (the session lock beside them: the pool-of-one test); the commit
/// releases it, and outside a transaction it is refused.
#[tokio::test]
async fn sqlx_transaction_lock_beside_app_queries() {
    let pool = pool(2).await;
    let name = unique("sx-xact");
    let p = Prefix::none();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("CREATE TEMP TABLE dbmutex_caller_t (n int)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(dsqlx::lock_xact(&mut tx, name.as_str(), &LockOptions::new(), &p)
        .await
        .unwrap()
        .is_ok());
    sqlx::query("INSERT INTO dbmutex_caller_t VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(!free(&name).await);
    let n: i64 = sqlx::query("SELECT count(*) FROM dbmutex_caller_t")
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    tx.commit().await.unwrap();
    assert!(free(&name).await, "commit did not release the transaction lock");

    // Outside a transaction: refused, not a lock that ends with its statement.
    let mut c = pool.acquire().await.unwrap();
    match dsqlx::lock_xact(&mut c, name.as_str(), &LockOptions::new(), &p).await {
        Err(Error::Config(m)) => assert!(m.contains("transaction"), "{m}"),
        other => panic!("expected Error::Config, got {other:?}"),
    }
}

/// A bounded server wait gives up near its bound, and the connection's
/// settings read as before, in and out of a transaction.
#[tokio::test]
async fn sqlx_timeouts_are_bounded_and_settings_restored() {
    let pool = pool(2).await;
    let name = unique("sx-timeout");
    let p = Prefix::none();
    let holder = pg_raw().await;
    let k = pg_key(&LockName::from(name.as_str()), &p);
    let PgKey::Pair(a, b) = k else {
        panic!("string names map to pairs")
    };
    holder
        .batch_execute(&format!("SELECT pg_advisory_lock({a},{b})"))
        .await
        .unwrap();

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET lock_timeout = '7s'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let opts = LockOptions::new().timeout(Duration::from_millis(300));
    let t = Instant::now();
    let mut conn = match dsqlx::lock_session(conn, name.as_str(), &opts, &p).await.unwrap() {
        Ok(_) => panic!("took a held lock"),
        Err(conn) => conn,
    };
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let lt: String = sqlx::query("SHOW lock_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(lt, "7s");
    let st: String = sqlx::query("SHOW statement_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(st, "0");

    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '5s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(dsqlx::lock_xact(&mut tx, name.as_str(), &opts, &p)
        .await
        .unwrap()
        .is_err());
    let lt: String = sqlx::query("SHOW lock_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        .get(0);
    assert_eq!(lt, "5s", "the wait's lock_timeout leaked into the transaction");
    let one: i32 = sqlx::query("SELECT 1").fetch_one(&mut *tx).await.unwrap().get(0);
    assert_eq!(one, 1, "the transaction is still usable");
    // Acquired in the server once the holder lets go.
    let unlocker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder
            .batch_execute(&format!("SELECT pg_advisory_unlock({a},{b})"))
            .await
            .unwrap();
        holder
    });
    assert!(dsqlx::lock_xact(
        &mut tx,
        name.as_str(),
        &LockOptions::new().timeout(Duration::from_secs(5)),
        &p
    )
    .await
    .unwrap()
    .is_ok());
    let lt: String = sqlx::query("SHOW lock_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        .get(0);
    assert_eq!(lt, "5s");
    tx.rollback().await.unwrap();
    let holder = unlocker.await.unwrap();

    // A session lock acquired by a server wait: the wait's settings end with it.
    holder
        .batch_execute(&format!("SELECT pg_advisory_lock({a},{b})"))
        .await
        .unwrap();
    let unlocker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder
            .batch_execute(&format!("SELECT pg_advisory_unlock({a},{b})"))
            .await
            .unwrap();
    });
    let long = LockOptions::new().timeout(Duration::from_secs(5));
    let Ok(mut guard) = dsqlx::lock_session(conn, name.as_str(), &long, &p).await.unwrap() else {
        panic!("not acquired after the holder let go");
    };
    unlocker.await.unwrap();
    let lt: String = sqlx::query("SHOW lock_timeout")
        .fetch_one(&mut *guard)
        .await
        .unwrap()
        .get(0);
    assert_eq!(lt, "7s", "the wait's lock_timeout outlived the wait");
    drop(guard.release().await.unwrap());
    assert!(free(&name).await);
}

/// Shared holders coexist; an exclusive one waits for them. Polling waits too.
#[tokio::test]
async fn sqlx_shared_mode_and_polling() {
    let pool = pool(3).await;
    let name = unique("sx-shared");
    let p = Prefix::none();
    let shared = LockOptions::try_once().shared(true);
    let g1 = dsqlx::lock_session(pool.acquire().await.unwrap(), name.as_str(), &shared, &p)
        .await
        .unwrap()
        .expect("first shared");
    let g2 = dsqlx::lock_session(pool.acquire().await.unwrap(), name.as_str(), &shared, &p)
        .await
        .unwrap()
        .expect("second shared");
    let poll = LockOptions::new()
        .timeout(Duration::from_secs(5))
        .wait_strategy(WaitStrategy::Poll)
        .max_backoff(Duration::from_millis(20));
    let waiter = {
        let pool = pool.clone();
        let (name, p) = (name.clone(), p.clone());
        tokio::spawn(async move {
            let conn = pool.acquire().await.unwrap();
            let t = Instant::now();
            let g = dsqlx::lock_session(conn, name.as_str(), &poll, &p).await.unwrap();
            (g.is_ok(), t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "exclusive taken beside shared holders");
    drop(g1.release().await.unwrap());
    drop(g2.release().await.unwrap());
    let (got, waited) = waiter.await.unwrap();
    assert!(got && waited >= Duration::from_millis(250), "{got} {waited:?}");
}

/// Crossed server waits on two sqlx transactions: one of them gets
/// `Error::Deadlock`, and its transaction is usable afterwards.
#[tokio::test]
async fn sqlx_deadlock_is_reported() {
    let pool = pool(2).await;
    let (x, y) = (unique("sx-dx"), unique("sx-dy"));
    let p = Prefix::none();
    let opts = LockOptions::new().timeout(Duration::from_secs(10));
    let mut t1 = pool.begin().await.unwrap();
    let mut t2 = pool.begin().await.unwrap();
    assert!(dsqlx::lock_xact(&mut t1, x.as_str(), &opts, &p)
        .await
        .unwrap()
        .is_ok());
    assert!(dsqlx::lock_xact(&mut t2, y.as_str(), &opts, &p)
        .await
        .unwrap()
        .is_ok());
    let (o1, o2, p1, p2) = (opts.clone(), opts.clone(), p.clone(), p.clone());
    let (y1, x2) = (y.clone(), x.clone());
    let a = tokio::spawn(async move {
        let r = dsqlx::lock_xact(&mut t1, y1.as_str(), &o1, &p1).await;
        (r, t1)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = tokio::spawn(async move {
        let r = dsqlx::lock_xact(&mut t2, x2.as_str(), &o2, &p2).await;
        (r, t2)
    });
    let (ra, mut t1) = a.await.unwrap();
    let (rb, mut t2) = b.await.unwrap();
    let deadlocks = [&ra, &rb]
        .iter()
        .filter(|r| matches!(r, Err(Error::Deadlock { .. })))
        .count();
    assert_eq!(deadlocks, 1, "{ra:?} {rb:?}");
    for tx in [&mut t1, &mut t2] {
        let one: i32 = sqlx::query("SELECT 1").fetch_one(&mut **tx).await.unwrap().get(0);
        assert_eq!(one, 1);
    }
}

/// A session lock whose acquisition is cancelled mid-wait: the connection
/// is closed, never pooled, and nothing stays locked.
#[tokio::test]
async fn sqlx_cancelled_wait_closes_the_connection() {
    let pool = pool(1).await;
    let name = unique("sx-cancel");
    let p = Prefix::none();
    let mut conn = pool.acquire().await.unwrap();
    let before = pid(&mut conn).await;
    let holder = dsqlx::lock_session(pg_sqlx_conn().await, name.as_str(), &LockOptions::try_once(), &p)
        .await
        .unwrap()
        .expect("free");
    let forever = LockOptions::new().wait_forever();
    let wait = dsqlx::lock_session(conn, name.as_str(), &forever, &p);
    assert!(tokio::time::timeout(Duration::from_millis(300), wait)
        .await
        .is_err());
    holder.release().await.unwrap();
    let mut next = pool.acquire().await.unwrap();
    assert_ne!(
        pid(&mut next).await,
        before,
        "the cancelled wait's connection went back to the pool"
    );
    assert_eq!(own_locks(&mut next).await, 0);
    assert!(
        common::eventually(Duration::from_secs(5), || free(&name)).await,
        "the cancelled wait left the lock taken"
    );
}

async fn pg_sqlx_conn() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&pg_url()).await.unwrap()
}

/// tokio-postgres: a session lock on the caller's client, the same key as a
/// `Locker`'s, and a drop that sends the unlock on the spot.
#[tokio::test]
async fn tokio_postgres_session_lock_on_callers_client() {
    let name = unique("tp-session");
    let p = Prefix::none();
    let client = pg_raw().await;
    let locker = common::Backend::Postgres
        .builder()
        .prefix(p.clone())
        .connect()
        .await
        .unwrap();

    let guard = lock_session(&client, name.as_str(), &LockOptions::try_once(), &p)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(guard.key(), pg_key(&LockName::from(name.as_str()), &p));
    assert!(
        locker.try_lock(name.as_str()).await.unwrap().is_none(),
        "a Locker took a held lock"
    );
    assert!(!free(&name).await);
    drop(guard); // no await: the unlock is queued on the client at once
    client.batch_execute("SELECT 1").await.unwrap(); // answered after the unlock
    assert!(free(&name).await, "drop did not unlock");

    // Held by a Locker: the caller's client waits, bounded.
    let held = locker.lock(name.as_str()).await.unwrap();
    let t = Instant::now();
    let r = lock_session(
        &client,
        name.as_str(),
        &LockOptions::new().timeout(Duration::from_millis(200)),
        &p,
    )
    .await
    .unwrap();
    assert!(r.is_err() && t.elapsed() >= Duration::from_millis(190));
    held.release().await.unwrap();

    // A lock that the session no longer holds reads as lost on release.
    let g = lock_session(&client, name.as_str(), &LockOptions::try_once(), &p)
        .await
        .unwrap()
        .expect("free");
    client
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })));

    // Refused: a transaction lock through the session-lock entry point.
    assert!(matches!(
        lock_session(&client, name.as_str(), &LockOptions::new().transaction(true), &p).await,
        Err(Error::Config(_))
    ));
}
