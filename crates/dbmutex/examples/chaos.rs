//! Mutual exclusion under chaos (issue #6): `scripts/chaos.sh` runs this.
//!
//! `chaos run [--short|--long] [--secs N] [--restarts N]` starts several
//! worker processes (`chaos worker ...`, this same binary), each with several
//! tasks that take a few lock names through one `Locker` (session locks on
//! the shared lock session, server-side waits and transaction locks on
//! dedicated connections, bounded waits, try-once) and run critical sections.
//! Meanwhile it injects faults: `pg_terminate_backend` of random lock-holding
//! backends, `kill -9` of random workers (replaced at once), restarts of the
//! PostgreSQL server; the workers cancel some of their own acquire futures at
//! random points.
//!
//! # The exclusion check
//!
//! Each section marks a row of `chaos_slots` "occupied by me since I asked
//! for the lock" on entry, in one statement that also records who occupied it
//! before (a *conflict*), and clears the mark on exit only if it is still its
//! own. The marks go through
//! a separate connection, so a lost lock cannot corrupt them, but a holder
//! can of course mark before it learns that its lock is gone, and a holder
//! killed with `kill -9` never clears its mark. So a conflict is excused when
//! the lock of the incumbent or of the intruder was lost: that holder
//! reported the loss (its guard's `lost()` fired or its release said so), or
//! a fault hit its worker (or the whole server) between its request for the
//! lock and the intruder's entry and the worker was killed before it could
//! report (see `excused_sql`). Faults are logged in `chaos_faults` just
//! before and just after they are injected, so the window covers the fault's
//! effect. A real overlap could hide behind this rule only if one of the two
//! holders also lost its lock at about that moment. Every other conflict is
//! a **violation**; the conflict row also records who held the lock in
//! `pg_locks` at the intruder's entry, for diagnosis. The marks compare the workers' wall
//! clock with the server's, so the server runs on the same host:
//! `scripts/chaos.sh` starts a private one on 127.0.0.1 (`DBMUTEX_CHAOS_PG_URL`,
//! restarted through `DBMUTEX_PG_RESTART_CMD`), never the shared test server.
//!
//! # Figures
//!
//! Sections, violations, excused conflicts, locks lost (the guard's `lost()`
//! fired while held, or the release reported the loss), detection latency
//! (wall clock from the fault's injection to `lost()` firing in the worker),
//! locks still held by the workers' sessions after they released everything
//! (leaks), advisory locks on the chaos keys after they exited, and faults by
//! kind. The run fails (exit 1) on any violation or leak.
//!
//! # On etcd
//!
//! With `DBMUTEX_CHAOS_LOCK_URL` (`scripts/chaos.sh --etcd`) the workers
//! lock on etcd (session locks; waits in etcd's queue), the marks stay in
//! PostgreSQL, and the server faults are lease revokes of random holders
//! and member kills with restarts instead of terminates and server
//! restarts; a member restart excuses no conflict. See `chaos/etcd.rs`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dbmutex::{Error, LockOptions, Locker, WaitStrategy};

#[path = "chaos/etcd.rs"]
mod etcd;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The server under chaos: `DBMUTEX_CHAOS_PG_URL`, which `scripts/chaos.sh`
/// sets to a private server it starts. Never a default: this program
/// terminates sessions and restarts the server it points at, so it must
/// not fall back to the shared test server.
fn pg_url() -> String {
    match std::env::var("DBMUTEX_CHAOS_PG_URL") {
        Ok(u) => u,
        Err(_) => {
            eprintln!(
                "chaos: set DBMUTEX_CHAOS_PG_URL (and DBMUTEX_PG_RESTART_CMD) to a server you may restart; \
                 scripts/chaos.sh starts a private one and sets both"
            );
            std::process::exit(2)
        }
    }
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

fn arg<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> T {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("bad value for {flag}: {v}")))
        .unwrap_or(default)
}

async fn raw(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

fn name_of(run: i64, i: usize) -> String {
    format!("chaos-{run}-{i}")
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match args.first().map(String::as_str) {
        Some("run") => rt.block_on(orchestrate(&args[1..])),
        Some("worker") => rt.block_on(worker(&args[1..])),
        _ => {
            eprintln!("usage: chaos run [--short|--long] [--secs N] [--restarts N] [--workers N] [--tasks N] [--names N]");
            std::process::exit(2)
        }
    }
}

// ---------------------------------------------------------------- worker --

#[derive(Default)]
struct Stats {
    sections: AtomicU64,
    not_acquired: AtomicU64,
    cancelled: AtomicU64,
    errors: AtomicU64,
    lost: AtomicU64,
    lost_at_release: AtomicU64,
    conflicts: AtomicU64,
    /// The longest acquire that ended in an error (server down, session
    /// killed), in ms: it must stay within the connect timeout plus the
    /// acquire's own bound.
    error_max_ms: AtomicU64,
}

impl Stats {
    fn line(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "progress sections={} not_acquired={} cancelled={} errors={} lost={} lost_at_release={} conflicts={} error_max_ms={}",
            g(&self.sections),
            g(&self.not_acquired),
            g(&self.cancelled),
            g(&self.errors),
            g(&self.lost),
            g(&self.lost_at_release),
            g(&self.conflicts),
            g(&self.error_max_ms)
        )
    }
}

const ENTER: &str =
    "WITH old AS (SELECT holder, since FROM chaos_slots WHERE run = $1 AND name = $2 FOR UPDATE), \
     upd AS (UPDATE chaos_slots SET holder = $3, since = $4 WHERE run = $1 AND name = $2 RETURNING 1), \
     conf AS (INSERT INTO chaos_conflicts (run, name, intruder, incumbent, incumbent_since, at, holders, \
                intruder_since) \
              SELECT $1, $2, $3, holder, since, clock_timestamp(), \
                (SELECT string_agg(a.application_name || '/' || l.pid, ',') FROM pg_locks l \
                 JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted \
                 AND l.classid = $5 AND l.objid = $6 AND l.objsubid = 2), $4 \
              FROM old WHERE holder IS NOT NULL RETURNING 1) \
     SELECT (SELECT holder FROM old), (SELECT count(*) FROM upd)";
const LEAVE: &str =
    "UPDATE chaos_slots SET holder = NULL, since = NULL WHERE run = $1 AND name = $2 AND holder = $3";

async fn worker(args: &[String]) -> Result<(), BoxError> {
    let run: i64 = arg(args, "--run", 0);
    let id: u32 = arg(args, "--id", 0);
    let tasks: usize = arg(args, "--tasks", 4);
    let names: usize = arg(args, "--names", 3);
    let url = pg_url();
    let stop = Arc::new(AtomicBool::new(false));
    let (exit_tx, mut exit_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref() {
                    Ok("stop") => stop.store(true, Ordering::SeqCst),
                    Ok("exit") | Err(_) => break,
                    _ => {}
                }
            }
            stop.store(true, Ordering::SeqCst);
            let _ = exit_tx.send(());
        });
    }
    let app = format!("dbmutex-chaos-{run}-w{id}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let lock_url = etcd::lock_url().unwrap_or_else(|| url.clone());
    let locker = loop {
        match Locker::builder(&lock_url)
            .application_name(&app)
            .keepalive(Duration::from_millis(500))
            .connect()
            .await
        {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("chaos worker {id}: connect: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let stats = Arc::new(Stats::default());
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (locker, stats, stop, url) = (locker.clone(), stats.clone(), stop.clone(), url.clone());
        handles.push(tokio::spawn(async move {
            task(locker, stats, stop, url, run, id, t, names).await
        }));
    }
    let progress = {
        let stats = stats.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                println!("{}", stats.line());
            }
        })
    };
    for h in handles {
        h.await?;
    }
    progress.abort();
    // Unlocks queued by drops run in the background: give them a moment
    // before the orchestrator looks for leaks.
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("{}", stats.line());
    println!("idle");
    std::io::stdout().flush()?;
    let _ = exit_rx.recv().await;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn task(
    locker: Locker,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    url: String,
    run: i64,
    id: u32,
    t: usize,
    names: usize,
) {
    let mut rng = fastrand::Rng::with_seed((u64::from(id) << 16 | t as u64) ^ now_us());
    let mut mark: Option<(
        tokio_postgres::Client,
        tokio_postgres::Statement,
        tokio_postgres::Statement,
    )> = None;
    let mut seq = 0u64;
    let bump = |a: &AtomicU64| a.fetch_add(1, Ordering::Relaxed);
    while !stop.load(Ordering::SeqCst) {
        if mark.as_ref().is_none_or(|(c, ..)| c.is_closed()) {
            mark = match raw(&url).await {
                Ok(c) => match (c.prepare(ENTER).await, c.prepare(LEAVE).await) {
                    (Ok(e), Ok(l)) => Some((c, e, l)),
                    _ => None,
                },
                Err(_) => None,
            };
            if mark.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let (client, enter, leave) = mark.as_ref().expect("connected above");
        let name = name_of(run, rng.usize(0..names));
        let timeout = [0, 50, 200, 1000][rng.usize(0..4)];
        let mut opts = LockOptions::new()
            .timeout(Duration::from_millis(timeout))
            .max_backoff(Duration::from_millis(10));
        // The holder id says how the lock was taken: s(ession, the default:
        // a try, then a wait in the server), p(olling session lock),
        // w(ait in the server at once), x (transaction, polling),
        // X (transaction, server wait).
        // etcd has session locks only: no transaction locks there.
        let kinds = if etcd::lock_url().is_some() { 8 } else { 10 };
        let how = match rng.u8(0..kinds) {
            0..=3 => 's',
            4..=5 => 'p',
            6..=7 => 'w',
            8 => 'x',
            _ => 'X',
        };
        if matches!(how, 'w' | 'X') {
            opts = opts.wait_strategy(WaitStrategy::Server);
        }
        if matches!(how, 'p' | 'x') {
            opts = opts.wait_strategy(WaitStrategy::Poll);
        }
        if matches!(how, 'x' | 'X') {
            opts = opts.transaction(true);
        }
        // The incumbent's claim starts when it asks: a fault after that may
        // have freed its lock before it marked the row.
        let asked = SystemTime::now();
        let acquire = locker.acquire(name.as_str(), &opts);
        let got = if rng.u8(0..10) == 0 {
            // Cancel the acquire at a random point (dropping the future).
            match tokio::time::timeout(Duration::from_micros(rng.u64(0..3000)), acquire).await {
                Ok(r) => r,
                Err(_) => {
                    bump(&stats.cancelled);
                    continue;
                }
            }
        } else {
            acquire.await
        };
        let guard = match got {
            Ok(Some(g)) => g,
            Ok(None) => {
                bump(&stats.not_acquired);
                continue;
            }
            Err(e) => {
                let took = asked.elapsed().unwrap_or_default().as_millis() as u64;
                stats.error_max_ms.fetch_max(took, Ordering::Relaxed);
                if bump(&stats.errors) < 3 {
                    eprintln!("chaos worker {id}.{t}: acquire: {e}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        seq += 1;
        let me = format!("w{id}-t{t}-{seq}-{how}{timeout}");
        let (k1, k2, _) =
            dbmutex::key::pg_key(&name.as_str().into(), &dbmutex::Prefix::none()).pg_locks_ids();
        let entered = client
            .query_one(enter, &[&run, &name, &me, &asked, &k1, &k2])
            .await;
        let row = match entered {
            Ok(row) => row,
            Err(_) => {
                // The marker connection died (server restart): no section.
                drop(guard);
                continue;
            }
        };
        if row.get::<_, Option<String>>(0).is_some() {
            bump(&stats.conflicts);
        }
        bump(&stats.sections);
        let mut lost_seen = false;
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(rng.u64(1..15))) => {}
            () = guard.lost() => {
                lost_seen = true;
                bump(&stats.lost);
                println!("lost t={}", now_us());
            }
        }
        let _ = client.execute(leave, &[&run, &name, &me]).await;
        match guard.release().await {
            Ok(()) => {}
            Err(Error::LockLost { .. }) => {
                if !lost_seen {
                    lost_seen = true;
                    bump(&stats.lost_at_release);
                }
            }
            Err(e) => {
                let took = asked.elapsed().unwrap_or_default().as_millis() as u64;
                stats.error_max_ms.fetch_max(took, Ordering::Relaxed);
                if bump(&stats.errors) < 3 {
                    eprintln!("chaos worker {id}.{t}: release: {e}");
                }
            }
        }
        if lost_seen {
            let _ = client
                .execute(
                    "INSERT INTO chaos_lost (run, holder) VALUES ($1, $2)",
                    &[&run, &me],
                )
                .await;
        }
    }
}

// ----------------------------------------------------------- orchestrator --

struct Worker {
    id: u32,
    child: Child,
    stdin: Option<ChildStdin>,
}

#[derive(Default)]
struct Seen {
    progress: HashMap<u32, HashMap<String, u64>>,
    lost_at: Vec<(u32, u64)>,
    idle: Vec<u32>,
}

impl Seen {
    fn take(&mut self, events: &mpsc::Receiver<(u32, String)>) {
        while let Ok((id, line)) = events.try_recv() {
            if let Some(rest) = line.strip_prefix("progress ") {
                let m = rest
                    .split(' ')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(0)))
                    .collect();
                self.progress.insert(id, m);
            } else if let Some(t) = line.strip_prefix("lost t=") {
                self.lost_at.push((id, t.parse().unwrap_or(0)));
            } else if line == "idle" {
                self.idle.push(id);
            }
        }
    }

    fn max(&self, key: &str) -> u64 {
        self.progress
            .values()
            .map(|m| m.get(key).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    }

    fn total(&self, key: &str) -> u64 {
        self.progress
            .values()
            .map(|m| m.get(key).copied().unwrap_or(0))
            .sum()
    }
}

fn spawn_worker(
    id: u32,
    run: i64,
    tasks: usize,
    names: usize,
    events: &mpsc::Sender<(u32, String)>,
) -> Result<Worker, BoxError> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["worker", "--run", &run.to_string(), "--id", &id.to_string()])
        .args(["--tasks", &tasks.to_string(), "--names", &names.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().expect("piped");
    let events = events.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if events.send((id, line)).is_err() {
                break;
            }
        }
    });
    let stdin = child.stdin.take();
    Ok(Worker { id, child, stdin })
}

fn send(w: &mut Worker, line: &str) {
    if let Some(s) = w.stdin.as_mut() {
        let _ = writeln!(s, "{line}");
        let _ = s.flush();
    }
}

/// The orchestrator's connection, re-made after a server restart.
struct Db {
    url: String,
    client: Option<tokio_postgres::Client>,
}

impl Db {
    async fn get(&mut self) -> Result<&tokio_postgres::Client, BoxError> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            let deadline = Instant::now() + Duration::from_secs(30);
            self.client = loop {
                match raw(&self.url).await {
                    Ok(c) => break Some(c),
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(e) => return Err(format!("PostgreSQL does not answer: {e}").into()),
                }
            };
        }
        Ok(self.client.as_ref().expect("connected above"))
    }

    /// Logs a fault (database clock) before it is injected; returns its id.
    async fn fault(&mut self, run: i64, kind: &str, worker: Option<u32>) -> Result<i64, BoxError> {
        let w = worker.map(|w| w as i32);
        let row = self
            .get()
            .await?
            .query_one(
                "INSERT INTO chaos_faults (run, kind, worker, at) VALUES ($1, $2, $3, clock_timestamp()) \
                 RETURNING id",
                &[&run, &kind, &w],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Logs that fault `id` has been injected.
    async fn done(&mut self, id: i64) -> Result<(), BoxError> {
        self.get()
            .await?
            .execute(
                "UPDATE chaos_faults SET done = clock_timestamp() WHERE id = $1",
                &[&id],
            )
            .await?;
        Ok(())
    }
}

fn restart_command() -> Result<Command, BoxError> {
    // No default: restarting "the" PostgreSQL cluster of the machine would
    // disturb every other client of it.
    let cmd = std::env::var("DBMUTEX_PG_RESTART_CMD").map_err(|_| {
        "set DBMUTEX_PG_RESTART_CMD to restart the server under chaos (scripts/chaos.sh does), or pass --restarts 0"
    })?;
    let mut c = Command::new("sh");
    c.args(["-c", &cmd]);
    Ok(c)
}

/// When a conflict (an intruder finding the incumbent's mark) is excused:
/// the lock of one of the two was lost, so the server had rightly let the
/// other in. Either that party reported the loss (`lost()` fired or the
/// release said so), or its worker was killed (or the server restarted)
/// after it asked for the lock and before the intruder entered, or a
/// terminate hit its worker in that window and the worker was killed before
/// it could report. An etcd member restart excuses nothing: it must cost
/// no lock.
fn excused_sql() -> String {
    let side = |who: &str, since: &str| {
        format!(
            "EXISTS (SELECT 1 FROM chaos_lost l WHERE l.run = c.run AND l.holder = c.{who}) \
             OR EXISTS (SELECT 1 FROM chaos_faults f WHERE f.run = c.run \
               AND (f.worker IS NULL OR f.worker = split_part(substr(c.{who}, 2), '-', 1)::int) \
               AND f.at <= c.at AND f.done >= c.{since} AND f.kind <> 'member' \
               AND (f.kind NOT IN ('terminate', 'revoke') OR EXISTS (SELECT 1 FROM chaos_faults k \
                 WHERE k.run = c.run AND k.kind = 'kill9' AND k.worker = f.worker)))"
        )
    };
    format!(
        "({} OR {})",
        side("incumbent", "incumbent_since"),
        side("intruder", "intruder_since")
    )
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn orchestrate(args: &[String]) -> Result<(), BoxError> {
    let long = args.iter().any(|a| a == "--long");
    let secs: u64 = arg(args, "--secs", if long { 600 } else { 60 });
    let on_etcd = etcd::lock_url().is_some();
    // On etcd a "restart" kills and restarts one member (the leader every
    // other time): one every 10 s of the run.
    let every = if on_etcd { 10 } else { 120 };
    let restarts: u32 = arg(
        args,
        "--restarts",
        if long || on_etcd { (secs / every) as u32 } else { 1 },
    );
    let workers_n: u32 = arg(args, "--workers", 4);
    let tasks: usize = arg(args, "--tasks", 4);
    let names: usize = arg(args, "--names", 3);
    if restarts > 0 && on_etcd {
        etcd::member_command("leader")?; // fail now, not after half the run
    } else if restarts > 0 {
        restart_command()?;
    }
    let run = now_us() as i64;
    let mut db = Db {
        url: pg_url(),
        client: None,
    };
    let c = db.get().await?;
    c.batch_execute(
        "CREATE TABLE IF NOT EXISTS chaos_slots (run bigint, name text, holder text, since timestamptz, \
             PRIMARY KEY (run, name));
         CREATE TABLE IF NOT EXISTS chaos_conflicts (run bigint, name text, intruder text, incumbent text, \
             incumbent_since timestamptz, at timestamptz);
         ALTER TABLE chaos_conflicts ADD COLUMN IF NOT EXISTS holders text, \
             ADD COLUMN IF NOT EXISTS intruder_since timestamptz;
         CREATE TABLE IF NOT EXISTS chaos_faults (run bigint, kind text, worker int, at timestamptz);
         ALTER TABLE chaos_faults ADD COLUMN IF NOT EXISTS id bigserial, \
             ADD COLUMN IF NOT EXISTS done timestamptz;
         CREATE TABLE IF NOT EXISTS chaos_lost (run bigint, holder text);",
    )
    .await?;
    for t in ["chaos_slots", "chaos_conflicts", "chaos_faults", "chaos_lost"] {
        c.execute(&format!("DELETE FROM {t} WHERE run < $1 - 86400000000"), &[&run])
            .await?;
    }
    for i in 0..names {
        c.execute(
            "INSERT INTO chaos_slots (run, name) VALUES ($1, $2)",
            &[&run, &name_of(run, i)],
        )
        .await?;
    }
    let app_like = format!("dbmutex-chaos-{run}-w%");
    eprintln!(
        "chaos: run {run}: {workers_n} workers x {tasks} tasks, {names} names, {secs} s, {restarts} server restart(s)"
    );

    let (events_tx, events) = mpsc::channel();
    let mut workers = Vec::new();
    let mut next_id = 1;
    for _ in 0..workers_n {
        workers.push(spawn_worker(next_id, run, tasks, names, &events_tx)?);
        next_id += 1;
    }
    let mut seen = Seen::default();
    let mut faults: Vec<(&str, Option<u32>, u64)> = Vec::new();
    let mut rng = fastrand::Rng::new();
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut next_terminate = start + Duration::from_millis(500);
    let mut next_kill = start + Duration::from_secs(5);
    let restart_at: Vec<Instant> = (1..=restarts)
        .map(|i| start + Duration::from_secs(secs) * i / (restarts + 1))
        .collect();
    let mut restarts_done = 0usize;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen.take(&events);
        let now = Instant::now();
        if on_etcd && restarts_done < restart_at.len() && now >= restart_at[restarts_done] {
            restarts_done += 1;
            let which = if restarts_done % 2 == 1 {
                "leader"
            } else {
                "random"
            };
            let mut cmd = etcd::member_command(which)?;
            let f = db.fault(run, "member", None).await?;
            faults.push(("member", None, now_us()));
            eprintln!("chaos: killing and restarting the {which} etcd member");
            let status = tokio::task::spawn_blocking(move || cmd.status()).await??;
            if !status.success() {
                return Err(format!("the etcd member restart failed: {status}").into());
            }
            db.done(f).await?;
        }
        if on_etcd && now >= next_terminate {
            // A holder's lease revoked: etcd's pg_terminate_backend.
            let heads: Vec<etcd::Key> = tokio::task::spawn_blocking(move || etcd::keys(run))
                .await?
                .unwrap_or_default()
                .into_iter()
                .filter(|k| k.head && k.worker > 0)
                .collect();
            if heads.is_empty() {
                next_terminate = now + Duration::from_millis(50);
            } else {
                let k = &heads[rng.usize(0..heads.len())];
                let f = db.fault(run, "revoke", Some(k.worker)).await?;
                faults.push(("revoke", Some(k.worker), now_us()));
                let lease = k.lease.clone();
                let _ = tokio::task::spawn_blocking(move || etcd::revoke(&lease)).await?;
                db.done(f).await?;
                next_terminate = now + Duration::from_millis(rng.u64(300..900));
            }
        }
        if !on_etcd && restarts_done < restart_at.len() && now >= restart_at[restarts_done] {
            restarts_done += 1;
            let mut cmd = restart_command()?;
            let f = db.fault(run, "restart", None).await?;
            faults.push(("restart", None, now_us()));
            eprintln!("chaos: restarting PostgreSQL");
            let status = tokio::task::spawn_blocking(move || cmd.status()).await??;
            if !status.success() {
                return Err(format!("the PostgreSQL restart command failed: {status}").into());
            }
            db.client = None;
            db.done(f).await?;
        }
        if !on_etcd && now >= next_terminate {
            let victim = db
                .get()
                .await?
                .query_opt(
                    "SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                     WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE $1 \
                     ORDER BY random() LIMIT 1",
                    &[&app_like],
                )
                .await;
            if let Ok(Some(row)) = victim {
                let pid: i32 = row.get(0);
                let app: String = row.get(1);
                let w: u32 = app
                    .rsplit_once("-w")
                    .and_then(|(_, w)| w.parse().ok())
                    .unwrap_or(0);
                let f = db.fault(run, "terminate", Some(w)).await?;
                faults.push(("terminate", Some(w), now_us()));
                let _ = db
                    .get()
                    .await?
                    .execute("SELECT pg_terminate_backend($1)", &[&pid])
                    .await;
                db.done(f).await?;
                next_terminate = now + Duration::from_millis(rng.u64(300..900));
            } else {
                next_terminate = now + Duration::from_millis(50);
            }
        }
        if now >= next_kill {
            let i = rng.usize(0..workers.len());
            let mut w = workers.swap_remove(i);
            let f = db.fault(run, "kill9", Some(w.id)).await?;
            faults.push(("kill9", Some(w.id), now_us()));
            w.child.kill()?; // SIGKILL
            w.child.wait()?;
            db.done(f).await?;
            workers.push(spawn_worker(next_id, run, tasks, names, &events_tx)?);
            next_id += 1;
            next_kill = now + Duration::from_millis(rng.u64(6000..12000));
        }
    }

    // Stop: every worker releases everything and reports idle, still connected.
    for w in workers.iter_mut() {
        send(w, "stop");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.idle.len() < workers.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen.take(&events);
    }
    let idle = seen.idle.len();
    let live: Vec<u32> = workers.iter().map(|w| w.id).collect();
    let leaks_live: i64 = if on_etcd {
        let keys = tokio::task::spawn_blocking(move || etcd::keys(run)).await??;
        keys.iter().filter(|k| live.contains(&k.worker)).count() as i64
    } else {
        db.get()
            .await?
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND a.application_name LIKE $1",
                &[&app_like],
            )
            .await?
            .get(0)
    };
    for w in workers.iter_mut() {
        send(w, "exit");
        w.stdin = None;
    }
    for w in workers.iter_mut() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.child.try_wait()?.is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if w.child.try_wait()?.is_none() {
            eprintln!("chaos: worker {} did not exit; killing it", w.id);
            w.child.kill()?;
            w.child.wait()?;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    seen.take(&events);
    let prefix = dbmutex::Prefix::none();
    let mut leaks_after = 0i64;
    // etcd: the keys of killed workers go with their leases, within the
    // TTL (10 s) of their last keep-alive.
    let gone = Instant::now();
    if on_etcd {
        loop {
            leaks_after = tokio::task::spawn_blocking(move || etcd::keys(run)).await??.len() as i64;
            if leaks_after == 0 || gone.elapsed() > Duration::from_secs(15) {
                eprintln!(
                    "chaos: {leaks_after} etcd keys of the run left after {:?}",
                    gone.elapsed()
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    for i in (0..names).filter(|_| !on_etcd) {
        let (k1, k2, sub) = dbmutex::key::pg_key(&name_of(run, i).into(), &prefix).pg_locks_ids();
        let n: i64 = db
            .get()
            .await?
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND classid = $1 AND objid = $2 AND objsubid = $3",
                &[&k1, &k2, &sub],
            )
            .await?
            .get(0);
        leaks_after += n;
    }

    let c = db.get().await?;
    let excused_rule = excused_sql();
    let verdict = c
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE NOT ({excused_rule})), count(*) FILTER (WHERE {excused_rule}) \
                 FROM chaos_conflicts c WHERE c.run = $1"
            ),
            &[&run],
        )
        .await?;
    let (violations, excused): (i64, i64) = (verdict.get(0), verdict.get(1));
    for r in c
        .query(
            &format!(
                "SELECT name, intruder, incumbent, incumbent_since::text, at::text FROM chaos_conflicts c \
                 WHERE c.run = $1 AND NOT ({excused_rule}) LIMIT 10"
            ),
            &[&run],
        )
        .await?
    {
        let cols: Vec<String> = (0..5).map(|i| r.get::<_, String>(i)).collect();
        eprintln!("chaos: VIOLATION {cols:?}");
    }

    // Detection latency: each lost() to the latest fault on its worker before it.
    let mut latencies: Vec<u64> = Vec::new();
    let mut unexplained = 0;
    for &(w, t) in &seen.lost_at {
        let fault = faults
            .iter()
            .filter(|(_, fw, ft)| fw.is_none_or(|fw| fw == w) && *ft <= t)
            .map(|(_, _, ft)| *ft)
            .max();
        match fault {
            Some(ft) if t - ft < 10_000_000 => latencies.push(t - ft),
            _ => unexplained += 1,
        }
    }
    latencies.sort_unstable();
    let count = |k: &str| faults.iter().filter(|(kind, ..)| *kind == k).count();
    let ms = |us: u64| us as f64 / 1000.0;
    let sections = seen.total("sections");
    let report = [
        format!("duration_s={}", start.elapsed().as_secs()),
        format!(
            "workers={workers_n} tasks_per_worker={tasks} names={names} worker_processes={}",
            next_id - 1
        ),
        format!("sections={sections}"),
        format!("violations={violations}"),
        format!("conflicts_excused_by_faults={excused}"),
        format!(
            "faults: terminate={} revoke={} kill9={} restart={} member_restart={} cancelled_acquires={}",
            count("terminate"),
            count("revoke"),
            count("kill9"),
            count("restart"),
            count("member"),
            seen.total("cancelled")
        ),
        format!(
            "locks_lost_detected_by_lost()={} lost_reported_at_release={} unexplained_losses={unexplained}",
            seen.lost_at.len(),
            seen.total("lost_at_release")
        ),
        format!(
            "detection_latency_ms: n={} p50={:.1} p99={:.1} max={:.1}",
            latencies.len(),
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.99)),
            ms(latencies.last().copied().unwrap_or(0))
        ),
        format!(
            "not_acquired={} acquire_errors={} longest_failed_acquire_ms={}",
            seen.total("not_acquired"),
            seen.total("errors"),
            seen.max("error_max_ms")
        ),
        format!("workers_idle_at_stop={idle}/{}", workers.len()),
        format!("locks_held_by_workers_after_release={leaks_live}"),
        format!(
            "{}={leaks_after}",
            if on_etcd {
                "etcd_keys_on_chaos_names_after_exit"
            } else {
                "advisory_locks_on_chaos_keys_after_exit"
            }
        ),
    ];
    for line in &report {
        println!("chaos: {line}");
    }
    let mut failed = Vec::new();
    if violations > 0 {
        failed.push("mutual exclusion violated");
    }
    if leaks_live > 0 || leaks_after > 0 {
        failed.push("locks leaked");
    }
    if idle < workers.len() {
        failed.push("a worker did not stop");
    }
    // Connect timeout (5 s) + the longest lock wait asked for (1 s) + slack.
    if seen.max("error_max_ms") > 7_500 {
        failed.push("a failed acquire overran its bound (connect timeout + wait)");
    }
    if sections < 1000 {
        failed.push("fewer than 1000 sections ran");
    }
    // On etcd a revoked holder with a short hold usually hears of it at
    // release (its keep-alive comes later): that counts there.
    let heard = seen.lost_at.len() as u64 + if on_etcd { seen.total("lost_at_release") } else { 0 };
    if count("terminate") + count("revoke") == 0 || heard == 0 {
        failed.push("no lock was lost: the fault injection did not work");
    }
    if failed.is_empty() {
        println!("chaos: PASS");
        Ok(())
    } else {
        println!("chaos: FAIL: {}", failed.join(", "));
        std::process::exit(1)
    }
}
