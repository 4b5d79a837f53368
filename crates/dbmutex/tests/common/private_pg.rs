//! Private PostgreSQL servers for destructive tests (issue 14).
//!
//! A test that fills the lock table, restarts or kills the server, or needs
//! special settings must never do so on the shared test server
//! (`DBMUTEX_TEST_PG_URL`): other clients may be there. It starts its own:
//!
//! ```ignore
//! // One instance per test, stopped when `pg` is dropped (pass or panic):
//! let pg = PrivatePg::start(&[("max_locks_per_transaction", "10"), ("max_connections", "10")]);
//! let locker = Locker::builder(&pg.url()).connect().await?;
//! let raw = pg.raw().await;             // tokio-postgres client, no dbmutex logic
//! pg.restart();                          // pg_ctl restart -m fast
//!
//! // Or one instance shared by every test of the binary that asks for the
//! // same settings, stopped when the test process exits:
//! let pg: &'static PrivatePg = PrivatePg::shared(&[("max_connections", "20")]);
//! ```
//!
//! What `start` does: `initdb` (trust auth, no fsync) into a fresh
//! `$TMPDIR/dbmutex-private-pg-<pid>-<n>/`, settings appended to
//! `postgresql.conf` (listen on 127.0.0.1 only, on a free port, the unix
//! socket inside that directory, fsync/full_page_writes off, 16 MB of shared
//! buffers, then the caller's settings, which win), `pg_ctl start -w`,
//! `CREATE DATABASE test`. As root (CI) the server programs run as the
//! `postgres` OS user through `runuser`; the directory is chowned to it.
//! Binaries come from `DBMUTEX_PG_BINDIR`, else the newest
//! `/usr/lib/postgresql/*/bin`, else `PATH`.
//!
//! How it is stopped, whatever happens to the test process:
//! - `Drop` (a test's own instance) and an `atexit` hook (shared instances)
//!   run `pg_ctl stop -m immediate` and remove the directory;
//! - a watchdog (`sh`, signals ignored) holds a pipe from the test process
//!   and does the same when the pipe closes, so a test binary killed with
//!   SIGKILL or Ctrl-C leaves no server behind;
//! - and `start` first sweeps stale `dbmutex-private-pg-*` directories whose
//!   owning process is gone (in case the watchdog was killed too).
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The prefix of every private instance's directory under `$TMPDIR`.
pub const DIR_PREFIX: &str = "dbmutex-private-pg-";

/// A PostgreSQL server of this test process, on 127.0.0.1.
pub struct PrivatePg {
    dir: PathBuf,
    port: u16,
    bindir: PathBuf,
    settings: Vec<(String, String)>,
    /// The watchdog and the write end of its pipe; `None` once stopped.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

extern "C" {
    fn geteuid() -> u32;
    fn atexit(cb: extern "C" fn()) -> i32;
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { geteuid() == 0 }
}

/// The directory of `initdb`, `pg_ctl`, `postgres`.
fn bindir() -> PathBuf {
    if let Ok(d) = std::env::var("DBMUTEX_PG_BINDIR") {
        return PathBuf::from(d);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    // Empty: rely on PATH.
    versions.pop().map(|(_, b)| b).unwrap_or_default()
}

/// A command for a PostgreSQL server program, run as `postgres` when we are root.
fn pg_command(bindir: &Path, program: &str) -> Command {
    let exe = bindir.join(program);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    }
}

/// Runs `cmd` to completion, panicking with its output (and `context`) on failure.
fn run(mut cmd: Command, what: &str, context: impl FnOnce() -> String) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("private PostgreSQL: cannot run {what} ({cmd:?}): {e}"));
    if !out.status.success() {
        panic!(
            "private PostgreSQL: {what} failed ({}):\n{}{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            context()
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .unwrap()
        .port()
}

/// `pid starttime` of a process, which together identify it across pid reuse.
fn process_identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); fields after the parenthesised command name.
    let rest = &stat[stat.rfind(')')? + 2..];
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid} {start}"))
}

/// Stops and removes every private instance whose owning process is gone.
fn sweep_stale(bindir: &Path) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(DIR_PREFIX) {
            continue;
        }
        let dir = e.path();
        let Ok(owner) = std::fs::read_to_string(dir.join("owner")) else {
            continue; // being created right now, or not ours
        };
        let owner = owner.trim();
        let alive = owner
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .and_then(process_identity)
            .is_some_and(|id| id == owner);
        if !alive {
            stop_and_remove(bindir, &dir);
        }
    }
}

fn stop_and_remove(bindir: &Path, dir: &Path) {
    if dir.join("data/postmaster.pid").exists() {
        let _ = pg_command(bindir, "pg_ctl")
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The shared instances of this process, stopped by the atexit hook.
static SHARED: Mutex<Vec<&'static PrivatePg>> = Mutex::new(Vec::new());

extern "C" fn stop_shared_at_exit() {
    let shared = match SHARED.lock() {
        Ok(s) => s.clone(),
        Err(p) => p.into_inner().clone(),
    };
    for pg in shared {
        pg.stop();
    }
}

impl PrivatePg {
    /// Starts a new private server with `settings` (`postgresql.conf`
    /// name/value pairs, values as PostgreSQL writes them: `"10"`, `"64kB"`,
    /// `"'quoted string'"`), waits until it answers and has a database
    /// `test`. Stopped (and its directory removed) on drop. Panics with the
    /// server log when it cannot start.
    pub fn start(settings: &[(&str, &str)]) -> PrivatePg {
        static N: AtomicU64 = AtomicU64::new(0);
        let bindir = bindir();
        sweep_stale(&bindir);
        let dir = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the private PostgreSQL directory");
        std::fs::write(
            dir.join("owner"),
            process_identity(std::process::id()).expect("/proc/self/stat"),
        )
        .unwrap();
        if is_root() {
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .expect("chown the private PostgreSQL directory");
        }
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // The watchdog first: from here on the directory goes away with us.
        let watchdog = spawn_watchdog(&bindir, &dir);
        let mut pg = PrivatePg {
            dir,
            port: 0,
            bindir,
            settings,
            watchdog: Mutex::new(Some(watchdog)),
        };
        let mut init = pg_command(&pg.bindir, "initdb");
        init.arg("-D").arg(pg.data()).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]);
        run(init, "initdb", String::new);
        // A free port can be taken by someone else before the server binds
        // it: try a few.
        let conf = std::fs::read_to_string(pg.data().join("postgresql.conf")).unwrap();
        for attempt in 1..=5 {
            pg.port = free_port();
            let mut text = conf.clone();
            text.push_str(&format!(
                "\n# dbmutex private test server\n\
                 listen_addresses = '127.0.0.1'\n\
                 port = {}\n\
                 unix_socket_directories = '{}'\n\
                 fsync = off\n\
                 synchronous_commit = off\n\
                 full_page_writes = off\n\
                 shared_buffers = 16MB\n\
                 max_wal_senders = 0\n\
                 wal_level = minimal\n\
                 logging_collector = off\n",
                pg.port,
                pg.dir.display()
            ));
            for (k, v) in &pg.settings {
                text.push_str(&format!("{k} = {v}\n"));
            }
            std::fs::write(pg.data().join("postgresql.conf"), text).unwrap();
            let out = pg
                .pg_ctl()
                .args(["-w", "-t", "120", "start"])
                .stdin(Stdio::null())
                .output()
                .expect("run pg_ctl start");
            if out.status.success() {
                break;
            }
            let log = pg.log();
            let port_taken = log.contains("could not bind") || log.contains("Address already in use");
            assert!(
                port_taken && attempt < 5,
                "private PostgreSQL did not start ({}): {}{}\nserver log:\n{log}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
        }
        let mut create = Command::new(pg.bindir.join("psql"));
        create
            .args([
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .arg("-p")
            .arg(pg.port.to_string())
            .args(["-c", "CREATE DATABASE test"])
            .env("PGSSLMODE", "disable");
        run(create, "CREATE DATABASE test", || pg.log());
        pg
    }

    /// A private server with `settings` shared by every caller in this test
    /// process that asks for the same settings (started by the first),
    /// stopped when the process exits. For tests that can share a server;
    /// a test that breaks it for the others must `start` its own.
    pub fn shared(settings: &[(&str, &str)]) -> &'static PrivatePg {
        static STARTING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|p| p.into_inner());
        let want: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pg) = shared.iter().find(|pg| pg.settings == want) {
            return pg;
        }
        static HOOK: OnceLock<()> = OnceLock::new();
        HOOK.get_or_init(|| {
            // SAFETY: registers a plain extern "C" fn with no arguments.
            let rc = unsafe { atexit(stop_shared_at_exit) };
            assert_eq!(rc, 0, "atexit");
        });
        drop(shared);
        let pg: &'static PrivatePg = Box::leak(Box::new(PrivatePg::start(settings)));
        SHARED.lock().unwrap_or_else(|p| p.into_inner()).push(pg);
        pg
    }

    /// `postgres://postgres@127.0.0.1:<port>/test?sslmode=disable`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test?sslmode=disable", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The instance's directory (data directory in `data/`, log in `log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn pg_ctl(&self) -> Command {
        let mut c = pg_command(&self.bindir, "pg_ctl");
        c.arg("-D").arg(self.data()).arg("-l").arg(self.dir.join("log"));
        c
    }

    /// A raw tokio-postgres client (no dbmutex logic) to database `test`.
    pub async fn raw(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "connect to the private PostgreSQL: {e}\nserver log:\n{}",
                    self.log()
                )
            });
        tokio::spawn(conn);
        client
    }

    /// Restarts the server (`pg_ctl restart -m fast`: sessions are ended)
    /// and waits until it answers again. Blocking.
    pub fn restart(&self) {
        let mut c = self.pg_ctl();
        c.args(["-m", "fast", "-w", "-t", "120", "restart"]);
        run(c, "pg_ctl restart", || self.log());
    }

    /// Stops the server at once (`-m immediate`, as a crash would) and
    /// removes its directory. Idempotent; also what drop does.
    pub fn stop(&self) {
        let taken = self.watchdog.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((mut child, stdin)) = taken {
            // Closing the pipe tells the watchdog to stop the server and
            // remove the directory; wait for it (bounded).
            drop(stdin);
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => return,
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            // The watchdog is stuck: do it here.
            let _ = child.kill();
            stop_and_remove(&self.bindir, &self.dir);
        }
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The uid and gid of the `postgres` OS user.
fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 3 && f[0] == "postgres" {
            return (f[2].parse().unwrap(), f[3].parse().unwrap());
        }
    }
    panic!("running as root, but there is no `postgres` OS user to run a private PostgreSQL as");
}

/// A shell that waits for its stdin to close (we exited or dropped the
/// instance), then stops the server and removes the directory. It ignores
/// SIGINT/SIGTERM/SIGHUP and runs in a process group of its own, so a
/// Ctrl-C or a timeout that kills the test's process group still gets
/// cleaned up.
fn spawn_watchdog(bindir: &Path, dir: &Path) -> (Child, ChildStdin) {
    let pg_ctl = bindir.join("pg_ctl");
    let as_postgres = if is_root() { "runuser -u postgres -- " } else { "" };
    let script = format!(
        "trap '' INT TERM HUP; cat >/dev/null; \
         if [ -f \"$1/data/postmaster.pid\" ]; then {as_postgres}\"$2\" -D \"$1/data\" -m immediate -w -t 30 stop >/dev/null 2>&1; fi; \
         rm -rf \"$1\""
    );
    let mut child = Command::new("sh")
        // A process group of its own: a signal to the test's group (a
        // runner's timeout) does not reach it.
        .process_group(0)
        .args(["-c", &script, "dbmutex-private-pg-watchdog"])
        .arg(dir)
        .arg(pg_ctl)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the private PostgreSQL watchdog (sh)");
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.flush();
    (child, stdin)
}
