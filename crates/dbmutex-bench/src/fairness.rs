//! Fairness between processes, and the hand-off behind a holder that is not
//! dbmutex.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use dbmutex::{BackendKind, LockOptions};

use crate::clients;
use crate::raw;
use crate::report::Row;
use crate::scenarios::{strategy_name, Env};
use crate::stats::{Latencies, Timer};

/// How long each holder of `fairness` keeps the lock.
const FAIR_HOLD: Duration = Duration::from_millis(1);

/// What the fairness log keeps per acquisition: which locker, how long it
/// waited.
type Log = Arc<Mutex<Vec<(usize, Duration)>>>;

/// Two lockers (two server sessions, as two processes), one task each, each
/// re-requesting the lock at once after holding it 1 ms. Fair: about every
/// other acquisition is a hand-off to the other locker, and nobody waits
/// much longer than a hold. Reports the share of hand-offs, each locker's
/// acquisitions and the longest wait.
pub async fn fairness(env: &Env) -> anyhow::Result<Row> {
    let app = env.app("fairness");
    let lockers = env.lockers(&app, 2, dbmutex::DEFAULT_MAX_LOCKS).await?;
    let name = env.name("fair", 0);
    let log: Log = Arc::default();
    let (dur, strategy) = (env.p.duration, env.p.strategy);
    let l2 = log.clone();
    let s = clients::run(2, move |i, barrier| {
        let (locker, name, log) = (lockers[i].clone(), name.clone(), l2.clone());
        async move {
            barrier.wait().await;
            let opts = LockOptions::new().wait_strategy(strategy);
            let mut t = Timer::run_for(dur);
            while t.start() {
                let asked = Instant::now();
                let g = locker
                    .acquire(name.as_str(), &opts)
                    .await?
                    .context("not acquired")?;
                t.stop();
                // Only the holder writes: the log is in acquisition order.
                log.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, asked.elapsed()));
                tokio::time::sleep(FAIR_HOLD).await;
                g.release().await?;
            }
            Ok(t.finish())
        }
    })
    .await?;
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()));
    let mut row = env.row("fairness", 2, s.lat, s.seconds);
    let per: [usize; 2] = [0, 1].map(|i| log.iter().filter(|(who, _)| *who == i).count());
    let handoffs = log.windows(2).filter(|w| w[0].0 != w[1].0).count();
    let share = handoffs as f64 / (log.len().saturating_sub(1).max(1)) as f64;
    let max_wait = log.iter().map(|(_, w)| *w).max().unwrap_or_default();
    row.set("handoff_share", (share * 1000.0).round() / 1000.0);
    row.set("acquisitions", per.to_vec());
    row.set("max_wait_ms", (max_wait.as_secs_f64() * 1e4).round() / 10.0);
    row.set("hold_ms", FAIR_HOLD.as_millis() as u64);
    row.set("strategy", strategy_name(strategy));
    Ok(row)
}

/// How long the foreign holder keeps the lock, and pauses between holds.
const FOREIGN_HOLD: Duration = Duration::from_millis(2);
const FOREIGN_PAUSE: Duration = Duration::from_millis(1);

/// A holder that is not dbmutex (a raw `pg_advisory_lock` session, as the
/// gem or psql would be) holds 2 ms, unlocks, pauses 1 ms, again; one waiter
/// takes the lock each time it is free. Reports the hand-off (the raw
/// holder's unlock answered → the waiter holds) for a dbmutex waiter with
/// the given strategy and, in the same run, for a raw `pg_advisory_lock`
/// waiter (the floor). PostgreSQL only.
pub async fn foreign(env: &Env) -> anyhow::Result<Vec<Row>> {
    if env.kind != BackendKind::Postgres {
        anyhow::bail!("foreign-holder hand-off is measured on PostgreSQL");
    }
    let app = env.app("foreign");
    let mut rows = Vec::new();
    for raw_waiter in [true, false] {
        let name = env.name(if raw_waiter { "foreign-raw" } else { "foreign" }, 0);
        let key = dbmutex::key::pg_key(&name.as_str().into(), &dbmutex::Prefix::none());
        let (k1, k2) = match key {
            dbmutex::key::PgKey::Pair(a, b) => (a, b),
            _ => unreachable!("a string name maps to a pair"),
        };
        let holder = raw::pg_connect(&env.url, &app).await?;
        let released: Arc<Mutex<Option<Instant>>> = Arc::default();
        let handoffs: Arc<Mutex<Latencies>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The waiter.
        let waiter = {
            let (released, handoffs, stop) = (released.clone(), handoffs.clone(), stop.clone());
            let locker = if raw_waiter {
                None
            } else {
                Some(
                    dbmutex::Locker::builder(&env.url)
                        .application_name(&app)
                        .prefix(dbmutex::Prefix::none())
                        .connect()
                        .await?,
                )
            };
            let raw_conn = if raw_waiter {
                Some(raw::pg_connect(&env.url, &app).await?)
            } else {
                None
            };
            let opts = LockOptions::new().wait_strategy(env.p.strategy);
            let name = name.clone();
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(c) = &raw_conn {
                        c.execute("SELECT pg_advisory_lock($1, $2)", &[&k1, &k2]).await?;
                    } else {
                        let g = locker
                            .as_ref()
                            .expect("one of the two")
                            .acquire(name.as_str(), &opts)
                            .await?
                            .context("not acquired")?;
                        record(&released, &handoffs);
                        g.release().await?;
                        // Gives the holder its turn.
                        tokio::time::sleep(FOREIGN_PAUSE / 2).await;
                        continue;
                    }
                    record(&released, &handoffs);
                    if let Some(c) = &raw_conn {
                        c.execute("SELECT pg_advisory_unlock($1, $2)", &[&k1, &k2])
                            .await?;
                    }
                    tokio::time::sleep(FOREIGN_PAUSE / 2).await;
                }
                anyhow::Ok(())
            })
        };
        let lock = holder.prepare("SELECT pg_advisory_lock($1, $2)").await?;
        let unlock = holder.prepare("SELECT pg_advisory_unlock($1, $2)").await?;
        let end = Instant::now() + env.p.duration;
        while Instant::now() < end {
            holder.execute(&lock, &[&k1, &k2]).await?;
            tokio::time::sleep(FOREIGN_HOLD).await;
            holder.execute(&unlock, &[&k1, &k2]).await?;
            *released.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            tokio::time::sleep(FOREIGN_PAUSE).await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // The waiter may be blocked in the server: let it through.
        drop(holder);
        waiter.await??;
        let lat = std::mem::take(&mut *handoffs.lock().unwrap_or_else(|e| e.into_inner()));
        let mut row = Row::new("foreign", env.kind.as_str(), 1, lat, env.p.duration.as_secs_f64());
        row.set(
            "waiter",
            if raw_waiter {
                "raw pg_advisory_lock"
            } else {
                "dbmutex"
            },
        );
        if !raw_waiter {
            row.set("strategy", strategy_name(env.p.strategy));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Records the hand-off since the foreign holder's last unlock, once per unlock.
fn record(released: &Mutex<Option<Instant>>, handoffs: &Mutex<Latencies>) {
    if let Some(at) = released.lock().unwrap_or_else(|e| e.into_inner()).take() {
        handoffs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(at.elapsed());
    }
}
