//! `cycles`: one client's lock cycles and nothing else, in a runtime of one
//! thread, for counting the client's instructions per cycle:
//! `scripts/callgrind.sh` runs it under callgrind with `--cycles 0` and
//! `--cycles 2000` for each side and divides the difference, so connecting
//! and start-up cancel out.
//!
//! Sides: the raw driver (prepared try-lock + unlock, the floor), dbmutex
//! at its defaults with `release().await`, and dbmutex dropping the guard
//! (the unlock goes out at once and is answered in the background). Each
//! dbmutex cycle takes one of 64 names in turn, as `paired` does.

use std::time::Duration;

use anyhow::Context;
use dbmutex::{BackendKind, LockOptions, Locker};

use crate::floor::RawCycle;

/// Which client `cycles` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    /// The raw driver: the floor.
    Raw,
    /// dbmutex, `acquire` + `release().await`.
    Dbmutex,
    /// dbmutex, `acquire` + `drop(guard)`.
    DbmutexDrop,
}

/// How long the run idles after its last cycle, so that a dropped guard's
/// unlock is answered inside the count (both counts idle alike).
const SETTLE: Duration = Duration::from_millis(200);

/// Connects, runs `n` cycles on `side`, settles.
pub async fn cycles(kind: BackendKind, url: &str, side: Side, n: u64) -> anyhow::Result<()> {
    match side {
        Side::Raw => {
            let mut raw = RawCycle::connect(kind, url, "dbmutex-bench-cycles", 0, "bench-cycles").await?;
            for _ in 0..n {
                raw.cycle().await?;
            }
        }
        Side::Dbmutex | Side::DbmutexDrop => {
            let locker = Locker::connect(url).await?;
            let names: Vec<String> = (0..64).map(|i| format!("bench-cycles-{i}")).collect();
            let opts = LockOptions::new();
            for i in 0..n {
                let name = names[i as usize % names.len()].as_str();
                let g = locker.acquire(name, &opts).await?.context("not acquired")?;
                if side == Side::DbmutexDrop {
                    drop(g);
                } else {
                    g.release().await?;
                }
            }
        }
    }
    tokio::time::sleep(SETTLE).await;
    Ok(())
}
