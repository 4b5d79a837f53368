//! The dbmutex scenarios, and what they share.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use dbmutex::{BackendKind, LockGuard, LockOptions, Locker, WaitStrategy};
use tokio::task::JoinSet;

use crate::clients;
use crate::probe::{Probe, Sampler};
use crate::report::{round, Row};
use crate::stats::{Latencies, Timer};

/// Names the uncontended task cycles through, so consecutive cycles use
/// distinct names while MySQL's probe still has a short list to watch.
const UNCONTENDED_NAMES: usize = 64;

/// MySQL holds each lock on a connection of its own, and MariaDB allows 151
/// connections by default: more would refuse every other client of the
/// server, so `hold-many` on MySQL stops here.
const MYSQL_HOLD_CAP: usize = 100;

/// Settings from the command line.
#[derive(Clone, Debug)]
pub struct Params {
    /// How long each timed scenario runs.
    pub duration: Duration,
    /// Concurrent tasks (contended, many-keys) or floor connections.
    pub clients: usize,
    /// Locks for hold-many.
    pub locks: usize,
    /// How long hold-many holds them.
    pub hold: Duration,
    /// How contended waiters wait.
    pub strategy: WaitStrategy,
    /// Lockers (server sessions) the tasks of contended and many-keys share.
    pub lockers: usize,
    /// The PostgreSQL floor sends unnamed statements with a name comment.
    pub floor_unnamed: bool,
    /// Lockers carry the lock name in an SQL comment (the library default).
    pub name_comments: bool,
    /// `paired` drops guards instead of awaiting `release()`.
    pub drop_release: bool,
    /// `fleet`: worker processes.
    pub procs: usize,
    /// `fleet`: names they spread over.
    pub names: usize,
    /// `fleet`: the second side is a second raw floor, not dbmutex (the
    /// harness's own bias between its two sides, an A/A run).
    pub calibrate: bool,
    /// `fleet`: the second side runs first.
    pub ours_first: bool,
    /// `fleet`, calibrating: lines of code the second raw floor runs per
    /// acquisition besides its statements (`pad.rs`).
    pub pad_lines: usize,
}

/// What every scenario of a run shares.
pub struct Env {
    /// The backend.
    pub kind: BackendKind,
    /// The URL for every connection (see [`crate::backend::run_url`]).
    pub url: String,
    /// Counts connections from the server's side.
    pub probe: Arc<Probe>,
    /// Command-line settings.
    pub p: Params,
    /// `uncontended` also runs fenced.
    pub fenced: bool,
}

impl Env {
    /// The `application_name` of one scenario's connections, unique per run
    /// so the server-side count sees only them.
    pub fn app(&self, scenario: &str) -> String {
        format!("dbmutex-bench-{}-{scenario}", std::process::id())
    }

    /// A lock name unique to this run.
    pub fn name(&self, what: &str, i: usize) -> String {
        format!("dbmutex-bench-{}-{what}-{i}", std::process::id())
    }

    /// Starts counting the connections of `app` / owners of `lock_strings`.
    pub fn sampler(&self, app: &str, lock_strings: Vec<String>) -> Sampler {
        Sampler::start(self.probe.clone(), app.to_owned(), lock_strings)
    }

    /// `n` lockers (separate server sessions, like `n` processes).
    pub async fn lockers(&self, app: &str, n: usize, max_locks: usize) -> anyhow::Result<Vec<Locker>> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            v.push(self.connect(self.builder(app, max_locks)).await?);
        }
        Ok(v)
    }

    /// A locker's builder with the run's settings.
    pub fn builder(&self, app: &str, max_locks: usize) -> dbmutex::LockerBuilder {
        Locker::builder(&self.url)
            .application_name(app)
            .name_comments(self.p.name_comments)
            .max_locks(max_locks)
    }

    /// Connects `builder`'s locker, the URL redacted from any error.
    pub async fn connect(&self, builder: dbmutex::LockerBuilder) -> anyhow::Result<Locker> {
        builder
            .connect()
            .await
            .with_context(|| format!("connecting to {}", dbmutex::redact_url(&self.url)))
    }

    /// The database lock strings of `names` (MySQL only; the probe watches
    /// them).
    fn lock_strings(&self, locker: &Locker, names: &[String]) -> anyhow::Result<Vec<String>> {
        if self.kind != BackendKind::Mysql {
            return Ok(vec![]);
        }
        names.iter().map(|n| Ok(locker.key_of(n.as_str())?)).collect()
    }

    pub fn row(&self, scenario: &'static str, clients: usize, lat: Latencies, seconds: f64) -> Row {
        let mut row = Row::new(scenario, self.kind.as_str(), clients, lat, seconds);
        if !self.p.name_comments && self.kind == BackendKind::Postgres {
            row.set("name_comments", false);
        }
        row
    }
}

/// One task: acquire + release, one name after another; `fenced`: each
/// acquisition with a fencing token.
pub async fn uncontended(env: &Env, fenced: bool) -> anyhow::Result<Row> {
    let app = env.app("uncontended");
    let locker = env.lockers(&app, 1, dbmutex::DEFAULT_MAX_LOCKS).await?.remove(0);
    let names: Arc<Vec<String>> = Arc::new((0..UNCONTENDED_NAMES).map(|i| env.name("u", i)).collect());
    let sampler = env.sampler(&app, env.lock_strings(&locker, &names)?);
    let dur = env.p.duration;
    let s = clients::run(1, move |_, barrier| {
        let (locker, names) = (locker.clone(), names.clone());
        async move {
            barrier.wait().await;
            let opts = LockOptions::new().fenced(fenced);
            let mut t = Timer::run_for(dur);
            let mut i = 0;
            while t.start() {
                let name = names[i % names.len()].as_str();
                let g = locker.acquire(name, &opts).await?.context("not acquired")?;
                g.release().await?;
                t.stop();
                i += 1;
            }
            Ok(t.finish())
        }
    })
    .await?;
    let mut row = env.row("uncontended", 1, s.lat, s.seconds);
    row.connections = sampler.finish().await;
    if fenced {
        row.set("fenced", true);
    }
    Ok(row)
}

/// The last release: when it was called, and by which task.
type LastRelease = Arc<Mutex<Option<(Instant, usize)>>>;

/// `clients` tasks, spread over `lockers` lockers, all on one name.
/// Latency = request → acquisition; hand-off = the holder's `release()`
/// call → another task's acquisition.
pub async fn contended(env: &Env) -> anyhow::Result<Row> {
    let app = env.app("contended");
    let lockers = env
        .lockers(&app, env.p.lockers, dbmutex::DEFAULT_MAX_LOCKS)
        .await?;
    let name = env.name("c", 0);
    let sampler = env.sampler(&app, env.lock_strings(&lockers[0], std::slice::from_ref(&name))?);
    let last: LastRelease = Arc::default();
    let handoffs: Arc<Mutex<Latencies>> = Arc::default();
    let (dur, strategy) = (env.p.duration, env.p.strategy);
    let h = handoffs.clone();
    let s = clients::run(env.p.clients, move |i, barrier| {
        let (locker, name) = (lockers[i % lockers.len()].clone(), name.clone());
        let (last, handoffs) = (last.clone(), h.clone());
        async move {
            barrier.wait().await;
            let opts = LockOptions::new().wait_strategy(strategy);
            let mut t = Timer::run_for(dur);
            while t.start() {
                let g = locker
                    .acquire(name.as_str(), &opts)
                    .await?
                    .context("not acquired")?;
                t.stop();
                let previous = last.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some((at, who)) = previous {
                    if who != i {
                        handoffs
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .record(at.elapsed());
                    }
                }
                // Only the holder writes here, so nothing races this store.
                *last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), i));
                g.release().await?;
            }
            Ok(t.finish())
        }
    })
    .await?;
    let mut row = env.row("contended", env.p.clients, s.lat, s.seconds);
    row.connections = sampler.finish().await;
    let mut handoffs = std::mem::take(&mut *handoffs.lock().unwrap_or_else(|e| e.into_inner()));
    row.set("handoffs", handoffs.len());
    let (p50, p99) = handoffs.p50_p99().unzip();
    row.set("handoff_p50_us", p50);
    row.set("handoff_p99_us", p99);
    row.set("strategy", strategy_name(strategy));
    row.set("lockers", env.p.lockers.max(1));
    Ok(row)
}

/// `clients` tasks, spread over `lockers` lockers, each cycling on a name
/// of its own.
pub async fn many_keys(env: &Env) -> anyhow::Result<Row> {
    let app = env.app("many-keys");
    let lockers = env
        .lockers(&app, env.p.lockers, dbmutex::DEFAULT_MAX_LOCKS)
        .await?;
    let names: Vec<String> = (0..env.p.clients).map(|i| env.name("mk", i)).collect();
    let sampler = env.sampler(&app, env.lock_strings(&lockers[0], &names)?);
    let dur = env.p.duration;
    let s = clients::run(env.p.clients, move |i, barrier| {
        let (locker, name) = (lockers[i % lockers.len()].clone(), names[i].clone());
        async move {
            barrier.wait().await;
            let opts = LockOptions::new();
            let mut t = Timer::run_for(dur);
            while t.start() {
                let g = locker
                    .acquire(name.as_str(), &opts)
                    .await?
                    .context("not acquired")?;
                g.release().await?;
                t.stop();
            }
            Ok(t.finish())
        }
    })
    .await?;
    let mut row = env.row("many-keys", env.p.clients, s.lat, s.seconds);
    row.connections = sampler.finish().await;
    row.set("lockers", env.p.lockers.max(1));
    Ok(row)
}

/// Acquires `locks` distinct locks at once, holds them all, releases them.
/// `seconds` and ops/s are for acquiring all; latency is per acquisition.
/// On any error (cap, server lock table full) everything acquired is
/// released at once instead of held, since a full server lock table fails
/// every session's queries.
pub async fn hold_many(env: &Env) -> anyhow::Result<Row> {
    let app = env.app("hold-many");
    let k = match env.kind {
        BackendKind::Mysql => env.p.locks.min(MYSQL_HOLD_CAP),
        _ => env.p.locks,
    };
    // Quiet for half the hold, the locker is down to its lock session
    // (counted at the end of the hold: `connections_quiet`, PostgreSQL).
    let locker = env
        .connect(env.builder(&app, k).idle_timeout(env.p.hold / 2))
        .await?;
    let names: Vec<String> = (0..k).map(|i| env.name("h", i)).collect();
    let lock_strings = env.lock_strings(&locker, &names)?;
    // MySQL's count watches every name at the peak only (below).
    let sampler = env.sampler(&app, vec![]);
    let start = Instant::now();
    let mut set = JoinSet::new();
    for name in names {
        let l = locker.clone();
        set.spawn(async move {
            let t = Instant::now();
            let r = l.acquire(name.as_str(), &LockOptions::new()).await;
            (r, t.elapsed())
        });
    }
    let mut guards: Vec<LockGuard> = Vec::with_capacity(k);
    let mut lat = Latencies::default();
    let (mut errors, mut first_error) = (0usize, None);
    while let Some(joined) = set.join_next().await {
        match joined? {
            (Ok(Some(g)), d) => {
                guards.push(g);
                lat.record(d);
            }
            (Ok(None), _) => errors += 1,
            (Err(e), _) => {
                errors += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let acquire_s = start.elapsed().as_secs_f64();
    let mut seen = Default::default();
    let at_peak = env
        .probe
        .count(&app, &lock_strings, &mut seen)
        .await
        .ok()
        .flatten();
    let held = guards.len();
    let mut quiet = None;
    if errors == 0 {
        tokio::time::sleep(env.p.hold).await;
        if env.kind == BackendKind::Postgres {
            quiet = env.probe.count(&app, &[], &mut seen).await.ok().flatten();
        }
    }
    let released = Instant::now();
    let mut set = JoinSet::new();
    for g in guards {
        set.spawn(g.release());
    }
    let mut release_errors = 0;
    while let Some(r) = set.join_next().await {
        if !matches!(r, Ok(Ok(()))) {
            release_errors += 1;
        }
    }
    let release_s = released.elapsed().as_secs_f64();
    let mut row = env.row("hold-many", k, lat, acquire_s);
    row.connections = match (sampler.finish().await, at_peak) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    row.set("held", held);
    row.set(
        "hold_s",
        round(
            if errors == 0 {
                env.p.hold.as_secs_f64()
            } else {
                0.0
            },
            3,
        ),
    );
    row.set("release_s", round(release_s, 4));
    if let Some(n) = quiet {
        row.set("connections_quiet", n);
    }
    if errors > 0 || release_errors > 0 {
        row.set("errors", errors + release_errors);
        row.set(
            "first_error",
            first_error.unwrap_or_else(|| "release failed".into()),
        );
    }
    if k < env.p.locks {
        row.set("capped_from", env.p.locks);
    }
    Ok(row)
}

/// `try-then-server` (the default), `poll` or `server`.
pub fn strategy_name(s: WaitStrategy) -> &'static str {
    match s {
        WaitStrategy::Server => "server",
        WaitStrategy::Poll => "poll",
        _ => "try-then-server",
    }
}
