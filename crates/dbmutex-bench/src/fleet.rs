//! `fleet`: N separate *processes* (this binary, as `fleet-worker`), each
//! locking and unlocking in a loop on 1 or K names with its own locker, as
//! a fleet of hosts does — next to the raw floor with the same N processes
//! (`pg_advisory_lock` + `pg_advisory_unlock` on one connection each) in
//! the same run. Reports acquisitions/s, p99 wait, the server connections
//! at the peak, and the server's CPU per acquisition (the backends' own
//! `utime + stime` from `/proc`, so PostgreSQL on this machine only).
//!
//! A worker connects, says `ready`, starts at the shared start time, stops
//! at the shared end, prints its waits (µs) on one line, and keeps its
//! connection until its stdin closes, so the parent reads the backends' CPU
//! with every connection still there.
//!
//! On etcd the raw side is etcd's own `concurrency.Mutex` (see
//! [`crate::raw_etcd`]), one session per process, and the server's CPU is
//! that of the processes whose ids `DBMUTEX_BENCH_SERVER_PIDS` lists (the
//! members, as `scripts/etcd-bench.sh` starts them); without it, none is
//! reported.

use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use dbmutex::{LockName, Locker};

use crate::report::{round, Row};
use crate::scenarios::Env;
use crate::stats::Latencies;

/// Which side a worker measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Dbmutex,
    Raw,
    /// The raw floor again, in dbmutex's place (`--fleet-calibrate`).
    RawAgain,
}

impl Side {
    fn as_str(self) -> &'static str {
        match self {
            Side::Dbmutex => "dbmutex",
            Side::Raw => "raw",
            Side::RawAgain => "raw-b",
        }
    }
}

/// Milliseconds since the epoch: the one clock all workers share.
fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One worker process's loop (`--scenario fleet-worker`).
pub async fn worker(
    url: &str,
    side: Side,
    name: &str,
    start_ms: u64,
    end_ms: u64,
    app: &str,
    pad_lines: usize,
) -> anyhow::Result<()> {
    let mut waits = Latencies::default();
    let lock_name = LockName::from(name);
    let out = std::io::stdout();
    // Only the A/A run's second raw floor is given padding (`run_side`).
    let pad = match pad_lines {
        0 => None,
        n => Some(crate::pad::Pad::new(n)?),
    };
    let pad = || {
        if let Some(p) = &pad {
            p.run();
        }
    };
    match side {
        Side::Dbmutex => {
            let locker = Locker::builder(url).application_name(app).connect().await?;
            ready(&out, start_ms).await?;
            let cpu0 = Usage::now();
            while epoch_ms() < end_ms {
                let t = Instant::now();
                let g = locker.lock(lock_name.clone()).await?;
                waits.record(t.elapsed());
                g.release().await?;
            }
            report(&out, &waits, Usage::now().since(&cpu0))?;
            wait_for_eof();
            drop(locker);
        }
        #[cfg(feature = "etcd")]
        Side::Raw | Side::RawAgain if url.starts_with("etcd") => {
            let client = crate::raw_etcd::connect(url).await?;
            let mut m = crate::raw_etcd::EtcdMutex::new(client).await?;
            let prefix = crate::raw_etcd::queue(name);
            ready(&out, start_ms).await?;
            let cpu0 = Usage::now();
            while epoch_ms() < end_ms {
                let t = Instant::now();
                m.lock(&prefix).await?;
                waits.record(t.elapsed());
                m.unlock().await?;
                pad();
            }
            report(&out, &waits, Usage::now().since(&cpu0))?;
            wait_for_eof();
        }
        Side::Raw | Side::RawAgain => {
            let client = crate::raw::pg_connect(url, app).await?;
            let (k1, k2) = match dbmutex::key::pg_key(&lock_name, &dbmutex::Prefix::from_env()) {
                dbmutex::key::PgKey::Pair(a, b) => (a, b),
                _ => bail!("a string name maps to two int4 keys"),
            };
            let lock = client.prepare("SELECT pg_advisory_lock($1, $2)").await?;
            let unlock = client.prepare("SELECT pg_advisory_unlock($1, $2)").await?;
            ready(&out, start_ms).await?;
            let cpu0 = Usage::now();
            while epoch_ms() < end_ms {
                let t = Instant::now();
                client.execute(&lock, &[&k1, &k2]).await?;
                waits.record(t.elapsed());
                client.execute(&unlock, &[&k1, &k2]).await?;
                pad();
            }
            report(&out, &waits, Usage::now().since(&cpu0))?;
            wait_for_eof();
        }
    }
    Ok(())
}

async fn ready(out: &std::io::Stdout, start_ms: u64) -> anyhow::Result<()> {
    writeln!(out.lock(), "ready")?;
    out.lock().flush()?;
    let now = epoch_ms();
    if start_ms > now {
        tokio::time::sleep(Duration::from_millis(start_ms - now)).await;
    }
    Ok(())
}

/// This process's use of the machine so far: CPU time in user space and in
/// the kernel (µs), and context switches, voluntary (it waited: a socket,
/// a futex) and not (the scheduler took the core away).
#[derive(Clone, Copy, Default)]
struct Usage([u64; 4]);

impl Usage {
    fn now() -> Self {
        // SAFETY: getrusage writes into the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
            return Self::default();
        }
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        Self([
            us(u.ru_utime),
            us(u.ru_stime),
            u.ru_nvcsw as u64,
            u.ru_nivcsw as u64,
        ])
    }

    fn since(&self, before: &Self) -> Self {
        Self(std::array::from_fn(|i| self.0[i].saturating_sub(before.0[i])))
    }

    fn add(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

/// The worker's last words: its use of the machine in the loop (user µs,
/// kernel µs, voluntary and involuntary switches), then its waits.
fn report(out: &std::io::Stdout, waits: &Latencies, used: Usage) -> anyhow::Result<()> {
    let line: Vec<String> = waits.micros().iter().map(u32::to_string).collect();
    let [u, k, v, i] = used.0;
    let mut o = out.lock();
    writeln!(o, "waits {u} {k} {v} {i} {}", line.join(" "))?;
    o.flush()?;
    Ok(())
}

fn wait_for_eof() {
    let mut sink = String::new();
    while std::io::stdin().lock().read_line(&mut sink).is_ok_and(|n| n > 0) {}
}

/// The CPU time (ms) of the server backends of `app` (PostgreSQL), or of
/// the processes `DBMUTEX_BENCH_SERVER_PIDS` lists (else none), read from
/// `/proc`.
async fn backends_cpu_ms(env: &Env, app: &str) -> anyhow::Result<(f64, usize)> {
    let pids: Vec<i32> = match env.kind {
        dbmutex::BackendKind::Postgres => env.probe.pg_backend_pids(app).await?,
        _ => std::env::var("DBMUTEX_BENCH_SERVER_PIDS")
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
    };
    // SAFETY: sysconf has no preconditions.
    let tick = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    let mut ms = 0.0;
    for pid in &pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces) end with ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat; `rest` starts at 3.
        let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        ms += ticks as f64 * 1000.0 / tick;
    }
    Ok((ms, pids.len()))
}

/// Runs `procs` workers of `side` on `names` names for the run's duration.
async fn run_side(env: &Env, side: Side, procs: usize, names: usize) -> anyhow::Result<Row> {
    let app = format!("{}-{}", env.app("fleet"), side.as_str());
    let exe = std::env::current_exe().context("finding this binary")?;
    // Connecting 200 processes takes a while on 2 cores: start once all
    // are ready, with time to spare.
    let start_ms = epoch_ms() + 2_000 + procs as u64 * 40;
    let end_ms = start_ms + env.p.duration.as_millis() as u64;
    let mut children: Vec<Child> = Vec::with_capacity(procs);
    for i in 0..procs {
        let name = env.name("fleet", i % names.max(1));
        let child = Command::new(&exe)
            .args(["--database-url", &env.url, "--scenario", "fleet-worker"])
            .args([
                "--fleet-side",
                side.as_str(),
                "--fleet-name",
                &name,
                "--fleet-app",
                &app,
            ])
            .args(match (side, env.p.pad_lines) {
                (Side::RawAgain, n) if n > 0 => vec!["--fleet-pad-lines".to_string(), n.to_string()],
                _ => Vec::new(),
            })
            .args([
                "--fleet-start-ms",
                &start_ms.to_string(),
                "--fleet-end-ms",
                &end_ms.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a fleet worker")?;
        children.push(child);
    }
    let mut readers: Vec<_> = children
        .iter_mut()
        .map(|c| std::io::BufReader::new(c.stdout.take().expect("piped")))
        .collect();
    for r in &mut readers {
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("a fleet worker did not start (said {line:?})");
        }
    }
    if epoch_ms() > start_ms {
        eprintln!(
            "dbmutex-bench: fleet: workers were ready after the start time; waits include late starters"
        );
    }
    let now = epoch_ms();
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(now))).await;
    let (cpu0, _) = backends_cpu_ms(env, &app).await?;
    let sampler = env.sampler(&app, Vec::new());
    tokio::time::sleep(Duration::from_millis(end_ms.saturating_sub(epoch_ms()))).await;
    let mut waits = Latencies::default();
    let (reads, used) = tokio::task::spawn_blocking(move || {
        let (mut all, mut used) = (Vec::new(), Usage::default());
        for mut r in readers {
            let mut line = String::new();
            r.read_line(&mut line)?;
            let Some(rest) = line.trim_end().strip_prefix("waits") else {
                bail!("a fleet worker failed (said {line:?})");
            };
            let mut words = rest.split_whitespace();
            let mut one = Usage::default();
            for v in &mut one.0 {
                *v = words.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
            used.add(&one);
            all.extend(words.filter_map(|v| v.parse::<u32>().ok()));
        }
        Ok((all, used))
    })
    .await??;
    let (cpu1, backends) = backends_cpu_ms(env, &app).await?;
    let peak = sampler.finish().await;
    for us in &reads {
        waits.record(Duration::from_micros(u64::from(*us)));
    }
    for mut c in children {
        drop(c.stdin.take());
        let status = c.wait()?;
        if !status.success() {
            bail!("a fleet worker exited with {status}");
        }
    }
    let seconds = env.p.duration.as_secs_f64();
    let ops = waits.len() as f64;
    let mut row = Row::new("fleet", env.kind.as_str(), procs, waits, seconds);
    row.connections = peak;
    row.set("side", side.as_str());
    row.set("names", names as u64);
    row.set("backends", backends as u64);
    if ops > 0.0 && backends > 0 {
        row.set("server_cpu_ms_per_acq", round((cpu1 - cpu0) / ops, 4));
        let [user, kernel, vcsw, ivcsw] = used.0.map(|v| v as f64);
        row.set("client_cpu_ms_per_acq", round((user + kernel) / 1000.0 / ops, 4));
        row.set("client_user_ms_per_acq", round(user / 1000.0 / ops, 4));
        row.set("client_kernel_ms_per_acq", round(kernel / 1000.0 / ops, 4));
        row.set("client_switches_per_acq", round(vcsw / ops, 3));
        row.set("client_preempted_per_acq", round(ivcsw / ops, 3));
    }
    Ok(row)
}

/// The fleet scenario: raw floor, then dbmutex (or, calibrating, the raw
/// floor again), same N and names; in the other order with `ours_first`.
/// The rows come raw first either way, and dbmutex's says which ran first.
pub async fn fleet(env: &Env, procs: usize, names: usize) -> anyhow::Result<Vec<Row>> {
    if !matches!(
        env.kind,
        dbmutex::BackendKind::Postgres | dbmutex::BackendKind::Etcd
    ) {
        bail!("fleet measures PostgreSQL and etcd");
    }
    if env.p.pad_lines > 0 && !env.p.calibrate {
        bail!("--fleet-pad-lines pads the A/A run's second raw floor: it needs --fleet-calibrate");
    }
    let second = match env.p.calibrate {
        true => Side::RawAgain,
        false => Side::Dbmutex,
    };
    let (raw, mut ours) = match env.p.ours_first {
        false => {
            let raw = run_side(env, Side::Raw, procs, names).await?;
            (raw, run_side(env, second, procs, names).await?)
        }
        true => {
            let ours = run_side(env, second, procs, names).await?;
            (run_side(env, Side::Raw, procs, names).await?, ours)
        }
    };
    ours.set("first", if env.p.ours_first { "ours" } else { "raw" });
    ours.set(
        "ratio_to_raw",
        round(ours.ops_per_s() / raw.ops_per_s().max(1e-9), 3),
    );
    for (per_acq, ratio) in [
        ("server_cpu_ms_per_acq", "cpu_ratio_to_raw"),
        ("client_cpu_ms_per_acq", "client_cpu_ratio_to_raw"),
        ("client_user_ms_per_acq", "client_user_ratio_to_raw"),
        ("client_kernel_ms_per_acq", "client_kernel_ratio_to_raw"),
    ] {
        let of = |row: &Row| row.extra.get(per_acq).and_then(|v| v.as_f64());
        if let (Some(a), Some(b)) = (of(&ours), of(&raw)) {
            ours.set(ratio, round(a / b.max(1e-9), 3));
        }
    }
    Ok(vec![raw, ours])
}
