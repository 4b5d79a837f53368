//! `dbmutex-bench`: dbmutex measured against the raw-SQL floor, on the same
//! server, in the same run. See BENCHMARKS.md for the scenarios and figures.

mod backend;
mod clients;
mod cycles;
mod fairness;
mod fleet;
mod floor;
mod pad;
mod paired;
mod probe;
mod raw;
#[cfg(feature = "etcd")]
mod raw_etcd;
mod report;
mod scenarios;
mod stats;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use dbmutex::{BackendKind, WaitStrategy};

use probe::Probe;
use report::{round, Row};
use scenarios::{Env, Params};

/// Benchmarks dbmutex against the raw SQL lock cycle on the same server.
#[derive(Parser, Debug)]
#[command(name = "dbmutex-bench", version)]
struct Cli {
    /// postgres://…, mysql://…, etcd://host:port[,host:port…] (feature
    /// `etcd`) or file:///lock/dir. A PostgreSQL URL without
    /// sslmode is used with sslmode=disable (the floor is plaintext).
    #[arg(long)]
    database_url: String,
    /// What to measure; `all` runs every scenario that applies, floor first.
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// Seconds each timed scenario runs (fractions allowed).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Concurrent tasks (contended, many-keys) or floor connections.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Locks hold-many acquires at once.
    #[arg(long, default_value_t = 5000)]
    locks: usize,
    /// Seconds hold-many holds them.
    #[arg(long, default_value_t = 2.0)]
    hold_secs: f64,
    /// How waiters wait: the library's default (one try on the shared
    /// session, then a wait in the server), client-side polling on the
    /// shared session, or blocking in the server on a dedicated connection
    /// each.
    #[arg(long, value_enum, default_value_t = Strategy::Default)]
    strategy: Strategy,
    /// Lockers (separate server sessions, like separate processes) that the
    /// tasks of contended and many-keys are spread over.
    #[arg(long, default_value_t = 1)]
    lockers: usize,
    /// PostgreSQL floor: send the statements as dbmutex does (unnamed, with
    /// the lock name in a comment) instead of prepared, to see what that costs.
    #[arg(long)]
    floor_unnamed: bool,
    /// Lockers without the lock-name SQL comment
    /// (`LockerBuilder::name_comments(false)`: statements prepared once per
    /// connection), to see what the comment costs.
    #[arg(long)]
    no_comment: bool,
    /// `paired`: dbmutex drops each guard instead of awaiting
    /// `release()` (the unlock is sent at once and answered in the
    /// background).
    #[arg(long)]
    drop_release: bool,
    /// `uncontended` also runs with fenced acquisitions
    /// (`LockOptions::fenced`), after the unfenced run, and reports the ratio.
    #[arg(long)]
    fenced: bool,
    /// `fleet`: worker processes (each a locker of its own, like a host).
    #[arg(long, default_value_t = 50)]
    procs: usize,
    /// `fleet`: names the workers spread over (worker i locks name i mod K).
    #[arg(long, default_value_t = 1)]
    names: usize,
    /// `fleet`: run a second raw floor where dbmutex would run (an A/A run:
    /// how far apart the harness puts two identical sides).
    #[arg(long)]
    fleet_calibrate: bool,
    /// `fleet`: run dbmutex's side (or the A/A run's second raw floor)
    /// before the raw floor. `scripts/fleet.sh` alternates the order from
    /// round to round, so that whatever the side that runs second meets (the
    /// first side's backends exiting, the server's caches) weighs on both.
    #[arg(long)]
    fleet_ours_first: bool,
    /// `fleet` with `--fleet-calibrate`: the second raw floor also runs this
    /// many cache lines of code of its own per acquisition (an experiment:
    /// does code touched cost a fleet worker what dbmutex's extra costs?).
    #[arg(long, default_value_t = 0)]
    fleet_pad_lines: usize,
    /// `fleet-worker` only (set by `fleet`): which side, name, start and
    /// end (ms since the epoch) and application_name.
    #[arg(long, hide = true, default_value = "dbmutex")]
    fleet_side: String,
    #[arg(long, hide = true, default_value = "")]
    fleet_name: String,
    #[arg(long, hide = true, default_value_t = 0)]
    fleet_start_ms: u64,
    #[arg(long, hide = true, default_value_t = 0)]
    fleet_end_ms: u64,
    #[arg(long, hide = true, default_value = "")]
    fleet_app: String,
    /// `cycles`: how many lock cycles.
    #[arg(long, default_value_t = 2000)]
    cycles: u64,
    /// `cycles`: which client.
    #[arg(long, value_enum, default_value_t = cycles::Side::Dbmutex)]
    cycle_side: cycles::Side,
    /// One JSON object per line per scenario instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    All,
    /// Round trip of a prepared `SELECT 1`.
    Rtt,
    /// Raw prepared try-lock + unlock, on 1 and on --clients connections.
    Floor,
    Uncontended,
    Contended,
    ManyKeys,
    HoldMany,
    /// Two lockers re-requesting one lock after 1 ms holds: share of
    /// hand-offs between them, longest wait.
    Fairness,
    /// A raw-SQL holder (as the gem or psql): hand-off to a dbmutex waiter,
    /// and to a raw `pg_advisory_lock` waiter (PostgreSQL).
    Foreign,
    /// One client's cycle, dbmutex (defaults) and the raw driver taking
    /// turns in 100 ms slices of one process: the median ratio of
    /// adjacent slices (not part of `all`).
    Paired,
    /// `--procs` separate processes locking in a loop on `--names` names,
    /// beside the raw floor with as many processes: acquisitions/s, p99
    /// wait, peak connections, server CPU per acquisition (PostgreSQL on
    /// this machine; not part of `all`).
    Fleet,
    /// One process of `fleet` (started by it).
    #[value(hide = true)]
    FleetWorker,
    /// `--cycles` lock cycles of one `--cycle-side` client in a runtime of
    /// one thread, printing nothing: what `scripts/callgrind.sh` counts
    /// instructions of (not part of `all`).
    Cycles,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Strategy {
    /// `WaitStrategy::TryThenServer`, the library's default.
    Default,
    Poll,
    Server,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.scenario == Scenario::FleetWorker {
        return fleet_worker(&cli);
    }
    if cli.scenario == Scenario::Cycles {
        return cycles_run(&cli);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dbmutex-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("dbmutex-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One `fleet` worker: a runtime of one thread, as a small process has.
fn fleet_worker(cli: &Cli) -> ExitCode {
    let side = match cli.fleet_side.as_str() {
        "raw" => fleet::Side::Raw,
        "raw-b" => fleet::Side::RawAgain,
        _ => fleet::Side::Dbmutex,
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dbmutex-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let url = match backend::kind_of(&cli.database_url) {
        Ok(kind) => backend::run_url(&cli.database_url, kind),
        Err(e) => {
            eprintln!("dbmutex-bench: fleet worker: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fleet::worker(
        &url,
        side,
        &cli.fleet_name,
        cli.fleet_start_ms,
        cli.fleet_end_ms,
        &cli.fleet_app,
        cli.fleet_pad_lines,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dbmutex-bench: fleet worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cycles`: one client, one thread, no output but errors.
fn cycles_run(cli: &Cli) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dbmutex-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = async {
        let kind = backend::kind_of(&cli.database_url)?;
        let url = backend::run_url(&cli.database_url, kind);
        cycles::cycles(kind, &url, cli.cycle_side, cli.cycles).await
    };
    match rt.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dbmutex-bench: cycles: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the plan; `Ok(false)` when some scenario of `all` failed (the
/// others still ran).
async fn run(cli: Cli) -> anyhow::Result<bool> {
    let kind = backend::kind_of(&cli.database_url)?;
    anyhow::ensure!(cli.clients >= 1, "--clients must be at least 1");
    anyhow::ensure!(
        cli.duration > 0.0 && cli.hold_secs >= 0.0,
        "durations must be positive"
    );
    let url = backend::run_url(&cli.database_url, kind);
    let env = Env {
        kind,
        probe: Arc::new(Probe::connect(kind, &url).await?),
        url,
        p: Params {
            duration: Duration::from_secs_f64(cli.duration),
            clients: cli.clients,
            locks: cli.locks,
            hold: Duration::from_secs_f64(cli.hold_secs),
            strategy: match cli.strategy {
                Strategy::Default => WaitStrategy::default(),
                Strategy::Poll => WaitStrategy::Poll,
                Strategy::Server => WaitStrategy::Server,
            },
            lockers: cli.lockers,
            floor_unnamed: cli.floor_unnamed,
            name_comments: !cli.no_comment,
            drop_release: cli.drop_release,
            procs: cli.procs,
            names: cli.names,
            calibrate: cli.fleet_calibrate,
            ours_first: cli.fleet_ours_first,
            pad_lines: cli.fleet_pad_lines,
        },
        fenced: cli.fenced,
    };
    let plan = match cli.scenario {
        Scenario::All => [
            Scenario::Rtt,
            Scenario::Floor,
            Scenario::Uncontended,
            Scenario::Contended,
            Scenario::ManyKeys,
            Scenario::HoldMany,
            Scenario::Fairness,
            Scenario::Foreign,
        ]
        .into_iter()
        .filter(|s| applies(*s, kind))
        .collect(),
        s if applies(s, kind) => vec![s],
        s => anyhow::bail!(
            "{s:?} does not apply to the {} backend (local: uncontended, contended and fairness, \
             with no server to measure; foreign: PostgreSQL only)",
            kind.as_str()
        ),
    };
    let mut out = Output::new(cli.json);
    let mut ok = true;
    for s in plan {
        match run_one(&env, s).await {
            Ok(rows) => rows.into_iter().for_each(|r| out.emit(r)),
            Err(e) if cli.scenario == Scenario::All => {
                eprintln!("dbmutex-bench: {s:?}: {e:#}");
                ok = false;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(ok)
}

/// Whether scenario `s` measures something on backend `kind`.
fn applies(s: Scenario, kind: BackendKind) -> bool {
    match kind {
        BackendKind::Local => matches!(
            s,
            Scenario::Uncontended | Scenario::Contended | Scenario::Fairness
        ),
        BackendKind::Postgres => true,
        // Many-keys and hold-many would measure etcd's write rate, not the
        // lock; the fleet reads the members' CPU from the pids it is given.
        BackendKind::Etcd => !matches!(s, Scenario::Foreign | Scenario::ManyKeys | Scenario::HoldMany),
        _ => !matches!(s, Scenario::Foreign | Scenario::Fleet),
    }
}

async fn run_one(env: &Env, s: Scenario) -> anyhow::Result<Vec<Row>> {
    Ok(match s {
        Scenario::Rtt => vec![floor::rtt(env).await?],
        Scenario::Floor => {
            let mut rows = vec![floor::floor(env, 1).await?];
            if env.p.clients > 1 {
                rows.push(floor::floor(env, env.p.clients).await?);
            }
            rows
        }
        Scenario::Uncontended => {
            let plain = scenarios::uncontended(env, false).await?;
            let mut rows = vec![];
            if env.fenced {
                let mut fenced = scenarios::uncontended(env, true).await?;
                fenced.set(
                    "ratio_to_unfenced",
                    round(fenced.ops_per_s() / plain.ops_per_s(), 3),
                );
                rows.push(fenced);
            }
            rows.insert(0, plain);
            rows
        }
        #[cfg(feature = "etcd")]
        Scenario::Contended if env.kind == BackendKind::Etcd => vec![
            floor::floor_contended(env, env.p.clients).await?,
            scenarios::contended(env).await?,
        ],
        Scenario::Contended => vec![scenarios::contended(env).await?],
        Scenario::ManyKeys => vec![scenarios::many_keys(env).await?],
        Scenario::HoldMany => vec![scenarios::hold_many(env).await?],
        Scenario::Fairness => fairness::fairness(env).await?,
        Scenario::Foreign => fairness::foreign(env).await?,
        Scenario::Paired => vec![paired::paired(env, env.p.drop_release).await?],
        Scenario::Fleet => fleet::fleet(env, env.p.procs, env.p.names).await?,
        Scenario::FleetWorker | Scenario::Cycles => unreachable!("run by main"),
        Scenario::All => unreachable!("expanded into a plan"),
    })
}

/// Prints rows as they come, adding the ratios to the floor and round trip
/// measured earlier in the same run.
struct Output {
    json: bool,
    header_done: bool,
    rtt_us: Option<u32>,
    floor_1: Option<f64>,
    floor_n: Option<f64>,
    floor_contended: Option<f64>,
}

impl Output {
    fn new(json: bool) -> Self {
        Output {
            json,
            header_done: false,
            rtt_us: None,
            floor_1: None,
            floor_n: None,
            floor_contended: None,
        }
    }

    fn emit(&mut self, mut row: Row) {
        self.annotate(&mut row);
        let line = if self.json {
            row.to_json().to_string()
        } else if !self.header_done {
            self.header_done = true;
            format!("{}\n{}", Row::table_header(), row.table_line())
        } else {
            row.table_line()
        };
        let mut stdout = std::io::stdout().lock();
        // Rows go out as they are measured, for a reader watching a long run.
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }

    fn annotate(&mut self, row: &mut Row) {
        let ratio = |x: f64, floor: Option<f64>| floor.map(|f| round(x / f, 3));
        match row.scenario {
            "rtt" => self.rtt_us = row.p50_us,
            "floor" if row.clients == 1 => self.floor_1 = Some(row.ops_per_s()),
            "floor" => {
                self.floor_n = Some(row.ops_per_s());
                if let Some(r) = ratio(row.ops_per_s(), self.floor_1) {
                    row.set("ratio_to_floor", r);
                }
            }
            "floor-contended" => self.floor_contended = Some(row.ops_per_s()),
            "uncontended" | "contended" => {
                if let Some(r) = ratio(row.ops_per_s(), self.floor_1) {
                    row.set("ratio_to_floor", r);
                }
                if let (Some(r), "contended") = (ratio(row.ops_per_s(), self.floor_contended), row.scenario) {
                    row.set("ratio_to_contended_floor", r);
                }
            }
            "many-keys" => {
                if let Some(r) = ratio(row.ops_per_s(), self.floor_1) {
                    row.set("ratio_to_floor", r);
                }
                if let Some(r) = ratio(row.ops_per_s(), self.floor_n) {
                    row.set("ratio_to_floor_n", r);
                }
            }
            _ => {}
        }
        if let (Some(rtt), Some(h)) = (
            self.rtt_us,
            row.extra.get("handoff_p50_us").and_then(|v| v.as_f64()),
        ) {
            row.set("rtt_us", rtt);
            row.set("handoff_rtts", round(h / f64::from(rtt.max(1)), 2));
        }
    }
}
