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

/// What the fairness log keeps per acquisition: which contender, how long
/// it waited.
type Log = Arc<Mutex<Vec<(usize, Duration)>>>;

/// One of `fairness`'s two contenders: a dbmutex locker with the run's
/// strategy, or (the floor) a raw server session blocking in the server's
/// own queue, as raw `pg_advisory_lock` / `GET_LOCK` code would.
enum Contender {
    Locker(dbmutex::Locker, LockOptions, String),
    Pg(tokio_postgres::Client, [tokio_postgres::Statement; 2], (i32, i32)),
    My(mysql_async::Conn, String),
    /// etcd's own `concurrency.Mutex` on its queue prefix.
    #[cfg(feature = "etcd")]
    Etcd(Box<crate::raw_etcd::EtcdMutex>, String),
}

impl Contender {
    /// Waits for the lock; the guard when dbmutex holds it.
    async fn lock(&mut self) -> anyhow::Result<Option<dbmutex::LockGuard>> {
        match self {
            Contender::Locker(l, opts, name) => Ok(Some(
                l.acquire(name.as_str(), opts).await?.context("not acquired")?,
            )),
            Contender::Pg(c, [lock, _], (k1, k2)) => {
                c.execute(&*lock, &[&*k1, &*k2]).await?;
                Ok(None)
            }
            Contender::My(c, name) => {
                let got: Option<i64> = mysql_async::prelude::Queryable::exec_first(
                    c,
                    "SELECT GET_LOCK(?, 3600)",
                    (name.as_str(),),
                )
                .await?;
                anyhow::ensure!(got == Some(1), "GET_LOCK answered {got:?}");
                Ok(None)
            }
            #[cfg(feature = "etcd")]
            Contender::Etcd(m, prefix) => {
                m.lock(prefix).await?;
                Ok(None)
            }
        }
    }

    /// Releases what [`Contender::lock`] took.
    async fn unlock(&mut self, guard: Option<dbmutex::LockGuard>) -> anyhow::Result<()> {
        match self {
            Contender::Locker(..) => {
                guard.context("a locker holds a guard")?.release().await?;
            }
            Contender::Pg(c, [_, unlock], (k1, k2)) => {
                c.execute(&*unlock, &[&*k1, &*k2]).await?;
            }
            Contender::My(c, name) => {
                mysql_async::prelude::Queryable::exec_drop(c, "DO RELEASE_LOCK(?)", (name.as_str(),)).await?;
            }
            #[cfg(feature = "etcd")]
            Contender::Etcd(m, _) => m.unlock().await?,
        }
        Ok(())
    }
}

/// Two contenders (two server sessions, as two processes), one task each,
/// each re-requesting the lock at once after holding it 1 ms. Fair: about
/// every other acquisition is a hand-off to the other contender, and nobody
/// waits much longer than a hold. Reports the share of hand-offs, each
/// contender's acquisitions, the longest wait and the mean hold as measured
/// (the 1 ms timer sleeps longer), for dbmutex lockers with the run's
/// strategy and, on a server, for two raw sessions in the same run: the
/// floor the longest wait is judged beside.
pub async fn fairness(env: &Env) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    if env.kind != BackendKind::Local {
        rows.push(fairness_of(env, true).await?);
    }
    rows.push(fairness_of(env, false).await?);
    Ok(rows)
}

/// One `fairness` row: raw sessions or dbmutex lockers.
async fn fairness_of(env: &Env, raw: bool) -> anyhow::Result<Row> {
    let app = env.app("fairness");
    let name = env.name(if raw { "fair-raw" } else { "fair" }, 0);
    let mut contenders = Vec::new();
    if raw {
        for _ in 0..2 {
            contenders.push(raw_contender(env, &app, &name).await?);
        }
    } else {
        for locker in env.lockers(&app, 2, dbmutex::DEFAULT_MAX_LOCKS).await? {
            let opts = LockOptions::new().wait_strategy(env.p.strategy);
            contenders.push(Contender::Locker(locker, opts, name.clone()));
        }
    }
    let contenders: Vec<_> = contenders
        .into_iter()
        .map(|c| Arc::new(tokio::sync::Mutex::new(c)))
        .collect();
    let log: Log = Arc::default();
    let holds: Arc<Mutex<Duration>> = Arc::default();
    let dur = env.p.duration;
    let (l2, h2) = (log.clone(), holds.clone());
    let s = clients::run(2, move |i, barrier| {
        let (c, log, holds) = (contenders[i].clone(), l2.clone(), h2.clone());
        async move {
            let mut c = c.lock().await;
            barrier.wait().await;
            let mut t = Timer::run_for(dur);
            while t.start() {
                let asked = Instant::now();
                let g = c.lock().await?;
                t.stop();
                let held = Instant::now();
                // Only the holder writes: the log is in acquisition order.
                log.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, asked.elapsed()));
                tokio::time::sleep(FAIR_HOLD).await;
                *holds.lock().unwrap_or_else(|e| e.into_inner()) += held.elapsed();
                c.unlock(g).await?;
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
    let mean_hold = *holds.lock().unwrap_or_else(|e| e.into_inner()) / (log.len().max(1) as u32);
    row.set("handoff_share", (share * 1000.0).round() / 1000.0);
    row.set("acquisitions", per.to_vec());
    row.set("max_wait_ms", (max_wait.as_secs_f64() * 1e4).round() / 10.0);
    row.set("hold_ms", (mean_hold.as_secs_f64() * 1e5).round() / 100.0);
    row.set(
        "max_wait_holds",
        (max_wait.as_secs_f64() / mean_hold.as_secs_f64().max(1e-9) * 10.0).round() / 10.0,
    );
    if raw {
        row.set(
            "waiter",
            match env.kind {
                BackendKind::Postgres => "raw pg_advisory_lock",
                BackendKind::Etcd => "raw etcd concurrency.Mutex",
                _ => "raw GET_LOCK",
            },
        );
    } else {
        row.set("strategy", strategy_name(env.p.strategy));
    }
    Ok(row)
}

/// A raw session that blocks in the server for `name`'s lock.
async fn raw_contender(env: &Env, app: &str, name: &str) -> anyhow::Result<Contender> {
    #[cfg(feature = "etcd")]
    if env.kind == BackendKind::Etcd {
        let m = crate::raw_etcd::EtcdMutex::new(crate::raw_etcd::connect(&env.url).await?).await?;
        return Ok(Contender::Etcd(Box::new(m), crate::raw_etcd::queue(name)));
    }
    if env.kind == BackendKind::Mysql {
        return Ok(Contender::My(raw::my_connect(&env.url).await?, name.to_owned()));
    }
    let c = raw::pg_connect(&env.url, app).await?;
    let lock = c.prepare("SELECT pg_advisory_lock($1, $2)").await?;
    let unlock = c.prepare("SELECT pg_advisory_unlock($1, $2)").await?;
    Ok(Contender::Pg(c, [lock, unlock], pg_pair(name)))
}

/// The gem's key pair for a string name, with no prefix.
fn pg_pair(name: &str) -> (i32, i32) {
    match dbmutex::key::pg_key(&name.into(), &dbmutex::Prefix::none()) {
        dbmutex::key::PgKey::Pair(a, b) => (a, b),
        _ => unreachable!("a string name maps to a pair"),
    }
}

/// How long the foreign holder keeps the lock, and pauses between holds.
const FOREIGN_HOLD: Duration = Duration::from_millis(2);
const FOREIGN_PAUSE: Duration = Duration::from_millis(1);

/// A holder and a waiter taking turns on one key: the holder holds 2 ms,
/// unlocks, pauses 1 ms, again; the waiter takes the lock each time it is
/// free. Reports the hand-off (the holder's unlock sent → the waiter holds,
/// as `contended` measures it) for four pairs in the same run: a raw
/// `pg_advisory_lock` holder (as the gem or psql would be) and a raw waiter
/// (the floor); the raw holder and a dbmutex waiter with the given
/// strategy; a dbmutex holder (`release().await`) and a raw waiter; and
/// two dbmutex lockers (two sessions, as two processes would be).
/// The run's time is cut into [`FOREIGN_ROUNDS`] rounds, each pair taking
/// its slice of every round (in rotated order), so a change of the
/// machine's load during the run falls on all pairs alike; each row pools
/// its pair's hand-offs of every round. PostgreSQL only.
pub async fn foreign(env: &Env) -> anyhow::Result<Vec<Row>> {
    if env.kind != BackendKind::Postgres {
        anyhow::bail!("foreign-holder hand-off is measured on PostgreSQL");
    }
    // (dbmutex holder, dbmutex waiter)
    const PAIRS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];
    let slice = env.p.duration / FOREIGN_ROUNDS as u32;
    let mut pooled: [Latencies; 4] = Default::default();
    for round in 0..FOREIGN_ROUNDS {
        for i in 0..PAIRS.len() {
            let p = (i + round) % PAIRS.len();
            let (h, w) = PAIRS[p];
            let lat = foreign_pair(env, h, w, slice).await?;
            pooled[p].merge(lat);
        }
    }
    let mut rows = Vec::new();
    for ((dbmutex_holder, dbmutex_waiter), lat) in PAIRS.into_iter().zip(pooled) {
        let mut row = Row::new("foreign", env.kind.as_str(), 1, lat, env.p.duration.as_secs_f64());
        let who = |dbmutex: bool| {
            if dbmutex {
                "dbmutex"
            } else {
                "raw pg_advisory_lock"
            }
        };
        row.set("holder", who(dbmutex_holder));
        row.set("waiter", who(dbmutex_waiter));
        row.set("rounds", FOREIGN_ROUNDS);
        if dbmutex_holder || dbmutex_waiter {
            row.set("strategy", strategy_name(env.p.strategy));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Rounds of [`foreign`].
const FOREIGN_ROUNDS: usize = 5;

/// One pair of [`foreign`] for `duration`: its hand-offs.
async fn foreign_pair(
    env: &Env,
    dbmutex_holder: bool,
    dbmutex_waiter: bool,
    duration: Duration,
) -> anyhow::Result<Latencies> {
    let app = env.app("foreign");
    let tag = match (dbmutex_holder, dbmutex_waiter) {
        (false, false) => "foreign-raw",
        (false, true) => "foreign",
        (true, false) => "foreign-rev",
        (true, true) => "foreign-both",
    };
    let name = env.name(tag, 0);
    let (k1, k2) = pg_pair(&name);
    let opts = LockOptions::new().wait_strategy(env.p.strategy);
    let locker = |app: String| async move {
        dbmutex::Locker::builder(&env.url)
            .application_name(&app)
            .prefix(dbmutex::Prefix::none())
            .connect()
            .await
    };
    let holder = raw::pg_connect(&env.url, &app).await?;
    let holder_locker = if dbmutex_holder {
        Some(locker(app.clone()).await?)
    } else {
        None
    };
    let released: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs: Arc<Mutex<Latencies>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The waiter.
    let waiter = {
        let (released, handoffs, stop) = (released.clone(), handoffs.clone(), stop.clone());
        let waiter_locker = if dbmutex_waiter {
            Some(locker(app.clone()).await?)
        } else {
            None
        };
        let raw_conn = if dbmutex_waiter {
            None
        } else {
            Some(raw::pg_connect(&env.url, &app).await?)
        };
        let name = name.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(c) = &raw_conn {
                    c.execute("SELECT pg_advisory_lock($1, $2)", &[&k1, &k2]).await?;
                    record(&released, &handoffs);
                    c.execute("SELECT pg_advisory_unlock($1, $2)", &[&k1, &k2])
                        .await?;
                } else {
                    let g = waiter_locker
                        .as_ref()
                        .expect("one of the two")
                        .acquire(name.as_str(), &opts)
                        .await?
                        .context("not acquired")?;
                    record(&released, &handoffs);
                    g.release().await?;
                }
                // Gives the holder its turn.
                tokio::time::sleep(FOREIGN_PAUSE / 2).await;
            }
            anyhow::Ok(())
        })
    };
    let lock = holder.prepare("SELECT pg_advisory_lock($1, $2)").await?;
    let unlock = holder.prepare("SELECT pg_advisory_unlock($1, $2)").await?;
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let guard = match &holder_locker {
            Some(l) => Some(
                l.acquire(name.as_str(), &LockOptions::new())
                    .await?
                    .context("not acquired")?,
            ),
            None => {
                holder.execute(&lock, &[&k1, &k2]).await?;
                None
            }
        };
        tokio::time::sleep(FOREIGN_HOLD).await;
        // Stamped before the unlock goes out: the waiter's grant and the
        // holder's answer leave the server together, and a stamp taken
        // on the answer raced the waiter's task (then that hand-off was
        // recorded one pause late: raw waiters measured 1.25 ms).
        *released.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        match guard {
            Some(g) => g.release().await?,
            None => drop(holder.execute(&unlock, &[&k1, &k2]).await?),
        }
        tokio::time::sleep(FOREIGN_PAUSE).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // The waiter may be blocked in the server: let it through.
    drop((holder, holder_locker));
    waiter.await??;
    let lat = std::mem::take(&mut *handoffs.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(lat)
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
