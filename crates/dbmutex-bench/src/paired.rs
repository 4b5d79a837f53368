//! `paired`: one client's lock cycle, dbmutex against the raw driver, in
//! short alternating slices of one process.
//!
//! On a shared 2-core machine one client's rate moves by ±20 % from one
//! run to the next (where the scheduler puts the client and the server
//! session), far more than what is being measured. Here both clients stay
//! connected in the same process and take turns: a slice of raw-driver
//! cycles, then a slice of dbmutex cycles (the order alternating from pair
//! to pair), each slice `SLICE` long. Each pair gives one ratio of rates,
//! measured a few hundred milliseconds apart; the row reports their median
//! and quartiles. dbmutex runs at its defaults (`Locker::connect`), one
//! `acquire` + `release().await` per cycle over 64 names; with
//! `drop_release`, the guard is dropped instead (the unlock goes out at
//! once and is answered in the background).

use std::time::{Duration, Instant};

use anyhow::Context;
use dbmutex::{LockOptions, Locker};

use crate::floor::RawCycle;
use crate::report::{round, Row};
use crate::scenarios::Env;
use crate::stats::Latencies;

/// How long each side runs before the other takes its turn.
const SLICE: Duration = Duration::from_millis(100);

/// Raw-driver cycles until `until`; how many.
async fn run_floor(floor: &mut RawCycle, until: Instant) -> anyhow::Result<u64> {
    let mut n = 0;
    while Instant::now() < until {
        floor.cycle().await?;
        n += 1;
    }
    Ok(n)
}

/// dbmutex's cycles until `until`; how many.
async fn run_dbmutex(
    locker: &Locker,
    names: &[String],
    drop_release: bool,
    until: Instant,
) -> anyhow::Result<u64> {
    let opts = LockOptions::new();
    let mut n = 0;
    while Instant::now() < until {
        let name = names[n as usize % names.len()].as_str();
        let g = locker.acquire(name, &opts).await?.context("not acquired")?;
        if drop_release {
            drop(g);
        } else {
            g.release().await?;
        }
        n += 1;
    }
    Ok(n)
}

/// The paired run: `env.p.duration` in all, half of it for each side.
pub async fn paired(env: &Env, drop_release: bool) -> anyhow::Result<Row> {
    let app = env.app("paired");
    let mut floor = RawCycle::connect(env.kind, &env.url, &app, 0, &env.name("paired-floor", 0)).await?;
    let locker = env.lockers(&app, 1, dbmutex::DEFAULT_MAX_LOCKS).await?.remove(0);
    let names: Vec<String> = (0..64).map(|i| env.name("paired", i)).collect();
    // Warm both (connections, prepared statements) outside the measure.
    run_floor(&mut floor, Instant::now() + SLICE).await?;
    run_dbmutex(&locker, &names, drop_release, Instant::now() + SLICE).await?;
    let pairs = (env.p.duration.as_secs_f64() / (2.0 * SLICE.as_secs_f64()))
        .ceil()
        .max(1.0) as usize;
    // On a worker thread of the runtime, as every other scenario's clients
    // and the connections' own tasks are: run from `block_on`'s thread,
    // each statement crossed threads twice, and the raw side ran at a
    // third of the standalone floor.
    let (mut ratios, ours, theirs, lat) = tokio::spawn(async move {
        let (mut ratios, mut ours, mut theirs) = (Vec::with_capacity(pairs), 0u64, 0u64);
        let mut lat = Latencies::default();
        for i in 0..pairs {
            let mut rate = [0.0f64; 2];
            for side in [i % 2, 1 - i % 2] {
                let t = Instant::now();
                let n = if side == 0 {
                    run_floor(&mut floor, t + SLICE).await?
                } else {
                    run_dbmutex(&locker, &names, drop_release, t + SLICE).await?
                };
                let secs = t.elapsed().as_secs_f64();
                rate[side] = n as f64 / secs;
                if side == 0 {
                    theirs += n;
                } else {
                    ours += n;
                    if n > 0 {
                        lat.record(t.elapsed() / n as u32);
                    }
                }
            }
            if rate[0] > 0.0 {
                ratios.push(rate[1] / rate[0]);
            }
        }
        anyhow::Ok((ratios, ours, theirs, lat))
    })
    .await??;
    ratios.sort_by(f64::total_cmp);
    let q = |p: f64| {
        ratios
            .get(((ratios.len() - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let half = pairs as f64 * SLICE.as_secs_f64();
    let mut row = Row::new("paired", env.kind.as_str(), 1, lat, half);
    row.ops = ours;
    row.set("release", if drop_release { "drop" } else { "await" });
    row.set("floor_ops_per_s", round(theirs as f64 / half, 0));
    row.set("pairs", ratios.len());
    row.set("ratio_median", round(q(0.5), 3));
    row.set("ratio_p25", round(q(0.25), 3));
    row.set("ratio_p75", round(q(0.75), 3));
    Ok(row)
}
