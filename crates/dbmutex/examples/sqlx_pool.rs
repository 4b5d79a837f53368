//! Locks on an sqlx pool's connections, next to the app's own queries.
//!
//! ```sh
//! cargo run -p dbmutex --features sqlx --example sqlx_pool -- postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! Four workers share a pool of two connections and each adds to a
//! counter 25 times: read, think, write back. Without a lock they would
//! lose updates; under a transaction lock (first half) or a session lock
//! (second half) the counter ends at exactly 100.

use std::time::Duration;

use dbmutex::postgres::sqlx::{lock_session, lock_xact};
use dbmutex::{LockOptions, Prefix};
use sqlx::postgres::PgPoolOptions;
use sqlx::Row;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = PgPoolOptions::new().max_connections(2).connect(&url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS dbmutex_example_counter (id int PRIMARY KEY, n int NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO dbmutex_example_counter VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET n = 0")
        .execute(&pool)
        .await?;

    let mut workers = Vec::new();
    for w in 0..4 {
        let pool = pool.clone();
        workers.push(tokio::spawn(async move {
            let opts = LockOptions::new().timeout(Duration::from_secs(30));
            let prefix = Prefix::from_env();
            for i in 0..25 {
                if (w + i) % 2 == 0 {
                    // A transaction lock: the commit releases it.
                    let mut tx = pool.begin().await?;
                    let Ok(_lock) = lock_xact(&mut tx, "example-counter", &opts, &prefix).await? else {
                        panic!("not acquired within 30 s");
                    };
                    bump(&mut tx).await?;
                    tx.commit().await?;
                } else {
                    // A session lock: the guard keeps the pool connection
                    // until it is released.
                    let conn = pool.acquire().await?;
                    let Ok(mut guard) = lock_session(conn, "example-counter", &opts, &prefix).await? else {
                        panic!("not acquired within 30 s");
                    };
                    bump(&mut guard).await?;
                    guard.release().await?; // unlocked; the connection goes back to the pool
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for w in workers {
        w.await?.map_err(|e| e as Box<dyn std::error::Error>)?;
    }
    let n: i32 = sqlx::query("SELECT n FROM dbmutex_example_counter WHERE id = 1")
        .fetch_one(&pool)
        .await?
        .get(0);
    println!("counter = {n} (expected 100)");
    sqlx::query("DROP TABLE dbmutex_example_counter")
        .execute(&pool)
        .await?;
    if n != 100 {
        return Err(format!("lost updates: counter = {n}").into());
    }
    Ok(())
}

/// Read, think, write back: loses updates unless the caller holds the lock.
async fn bump(c: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    let n: i32 = sqlx::query("SELECT n FROM dbmutex_example_counter WHERE id = 1")
        .fetch_one(&mut *c)
        .await?
        .get(0);
    tokio::time::sleep(Duration::from_millis(2)).await;
    sqlx::query("UPDATE dbmutex_example_counter SET n = $1 WHERE id = 1")
        .bind(n + 1)
        .execute(&mut *c)
        .await?;
    Ok(())
}
