//! The `dbmutex` binary as scripts use it: real processes, real servers.
//!
//! Every test takes a [`Backend`] and is stamped out once per backend by
//! `backend_tests!` at the bottom. Database URLs come from
//! `DBMUTEX_TEST_PG_URL` and `DBMUTEX_TEST_MYSQL_URL` (defaults: the local
//! servers); a server that does not answer makes its tests fail, never skip.
//! Every test uses lock names of its own, so tests run in parallel.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");

// ---------------------------------------------------------------------------
// Harness

/// One backend the binary can use, with the environment that selects it.
struct Backend {
    kind: &'static str,
    /// `None` for the local backend.
    url: Option<String>,
    /// A fresh directory per test: lock files (local), markers (all).
    dir: PathBuf,
}

impl Backend {
    fn new(kind: &'static str) -> Backend {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dbmutex-cli-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        let url = match kind {
            "postgres" => Some(
                std::env::var("DBMUTEX_TEST_PG_URL")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            ),
            "mysql" => Some(
                std::env::var("DBMUTEX_TEST_MYSQL_URL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
            ),
            "local" => None,
            other => panic!("unknown backend {other}"),
        };
        Backend { kind, url, dir }
    }

    /// A unique lock name for this test.
    fn name(&self, tag: &str) -> String {
        format!(
            "cli-{tag}-{}-{}",
            std::process::id(),
            self.dir.file_name().unwrap().to_string_lossy()
        )
    }

    /// A path for a marker file in this test's directory.
    fn marker(&self, tag: &str) -> PathBuf {
        self.dir.join(tag)
    }

    /// `dbmutex ARGS` with this backend selected through the environment.
    fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_under(&[], args)
    }

    /// As [`Backend::cmd`], started by `wrapper` (e.g. `faketime -f +2s`).
    fn cmd_under(&self, wrapper: &[&str], args: &[&str]) -> Command {
        let mut c = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        c.args(args)
            .env_remove("DBMUTEX_DATABASE_URL")
            .env_remove("DATABASE_URL")
            .env_remove("WITH_ADVISORY_LOCK_PREFIX")
            .env("DBMUTEX_LOCK_DIR", self.dir.join("locks"))
            .stdin(Stdio::null());
        if let Some(u) = &self.url {
            c.env("DBMUTEX_DATABASE_URL", u);
        }
        c
    }

    /// Runs `dbmutex ARGS` to completion.
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("start dbmutex")
    }

    /// Starts `dbmutex run NAME -- sh -c SCRIPT` (plus `opts` before NAME)
    /// and waits until the script has started, i.e. the lock is held.
    fn hold(&self, name: &str, opts: &[&str], script: &str) -> Proc {
        self.hold_with(name, opts, "", script)
    }

    /// As [`Backend::hold`], running `setup` (e.g. a `trap`) before the
    /// command counts as started.
    fn hold_with(&self, name: &str, opts: &[&str], setup: &str, script: &str) -> Proc {
        let started = self.marker(&format!("started-{}", unique()));
        let script = format!("{setup} touch '{}'; {script}", started.display());
        let mut args = vec!["run"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&[name, "--", "sh", "-c", &script]);
        let child = self
            .cmd(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dbmutex");
        let mut p = Proc(Some(child));
        if !eventually(Duration::from_secs(15), || started.exists()) {
            let out = p.finish();
            panic!(
                "[{}] the holder's command never started: {}",
                self.kind,
                describe(&out.status, &out.stderr)
            );
        }
        p
    }

    /// As [`Backend::hold`], with a command that, on SIGTERM, creates the
    /// returned marker file and exits with `code`.
    fn hold_until_term(&self, name: &str, opts: &[&str], code: u8) -> (Proc, PathBuf) {
        let got = self.marker(&format!("got-term-{}", unique()));
        let trap = format!("trap 'touch \"{}\"; kill $!; exit {code}' TERM;", got.display());
        (self.hold_with(name, opts, &trap, "sleep 30 & wait"), got)
    }

    /// Runs SQL on the test server with its command-line client.
    fn sql(&self, query: &str) -> String {
        let url = self.url.as_deref().expect("a database backend");
        let out = match self.kind {
            "postgres" => Command::new("psql").args([url, "-Atqc", query]).output(),
            _ => {
                let u = MysqlUrl::parse(url);
                let mut c = Command::new("mariadb");
                c.args(["-h", &u.host, "-P", &u.port, "-u", &u.user, &u.db, "-Nse", query]);
                if let Some(p) = &u.password {
                    c.env("MYSQL_PWD", p);
                }
                c.output()
            }
        }
        .unwrap_or_else(|e| panic!("[{}] cannot start the SQL client: {e}", self.kind));
        assert!(
            out.status.success(),
            "[{}] {query}: {}",
            self.kind,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Ends the server session that holds `name` (the lock is then lost).
    fn kill_holder_session(&self, name: &str) {
        let key = self.key_json(name);
        match self.kind {
            "postgres" => {
                let k1 = key["postgres"]["k1"].as_i64().unwrap();
                let k2 = key["postgres"]["k2"].as_i64().unwrap();
                let killed = self.sql(&format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' \
                     AND classid = {k1} AND objid = {k2} AND objsubid = 2 AND granted \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ));
                assert_eq!(killed, "1", "one backend held {name}");
            }
            _ => {
                let s = key["mysql"].as_str().unwrap().replace('\'', "''");
                let id = self.sql(&format!("SELECT IS_USED_LOCK('{s}')"));
                assert!(id.parse::<u64>().is_ok(), "no holder of {name}: {id}");
                self.sql(&format!("KILL {id}"));
            }
        }
    }

    fn key_json(&self, name: &str) -> serde_json::Value {
        self.key_json_args(&["key", "--json", name])
    }

    fn key_json_args(&self, args: &[&str]) -> serde_json::Value {
        let out = self.run(args);
        assert_eq!(code(&out), 0, "{}", describe(&out.status, &out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// This backend's URL with a closed port on 127.0.0.1 (and a password,
    /// which no message may show).
    fn dead_url(&self) -> String {
        let url = self.url.as_deref().expect("a database backend");
        let (scheme, rest) = url.split_once("://").unwrap();
        let db = rest.rsplit_once('/').map_or("test", |(_, db)| db);
        format!("{scheme}://root:s3cret@127.0.0.1:1/{db}")
    }

    /// Asserts that `name` can be taken right now (`run -n` succeeds).
    fn assert_free(&self, name: &str) {
        let out = self.run(&["run", "-n", name, "--", "true"]);
        assert_eq!(
            code(&out),
            0,
            "[{}] {name} should be free: {}",
            self.kind,
            describe(&out.status, &out.stderr)
        );
    }

    /// Asserts that `name` is held by someone else right now.
    fn assert_held(&self, name: &str) {
        let out = self.run(&["run", "-n", name, "--", "true"]);
        assert_eq!(
            code(&out),
            75,
            "[{}] {name} should be held: {}",
            self.kind,
            describe(&out.status, &out.stderr)
        );
    }
}

impl Backend {
    /// Starts `dbmutex run NAME` (plus `opts`) with a command that starts
    /// `grandchild` in the background, writes its pid to a file and waits.
    /// In `grandchild`, `READY` stands for a file it must create once it is
    /// set up (signal handlers installed). Returns once that file exists,
    /// with the grandchild's pid.
    fn hold_tree(&self, name: &str, opts: &[&str], grandchild: &str) -> (Proc, i32) {
        let n = unique();
        let pidfile = self.marker(&format!("grandchild-{n}"));
        let ready = self.marker(&format!("grandchild-ready-{n}"));
        let grandchild = grandchild.replace("READY", &ready.display().to_string());
        let script = format!("{grandchild} & echo $! > '{}'; wait", pidfile.display());
        let p = self.hold(name, opts, &script);
        let mut pid = None;
        let started = eventually(Duration::from_secs(15), || {
            pid = std::fs::read_to_string(&pidfile)
                .ok()
                .filter(|s| s.ends_with('\n'))
                .and_then(|s| s.trim().parse::<i32>().ok());
            pid.is_some() && ready.exists()
        });
        assert!(started, "[{}] the grandchild never got ready", self.kind);
        let pid = pid.unwrap();
        assert!(alive(pid), "[{}] the grandchild {pid} is not running", self.kind);
        (p, pid)
    }
}

/// A grandchild for [`Backend::hold_tree`] that sleeps.
const SLEEPER: &str = "sh -c \"touch 'READY'; exec sleep 1000\"";
/// A grandchild that ignores SIGTERM (SIG_IGN survives the exec).
const TERM_IGNORING_SLEEPER: &str = "sh -c \"trap '' TERM; touch 'READY'; exec sleep 1000\"";

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running dbmutex; killed (SIGKILL) if the test ends without waiting for it.
struct Proc(Option<Child>);

impl Proc {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    fn pid(&self) -> i32 {
        self.0.as_ref().unwrap().id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own unreaped child.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// Waits for the process (at most 30 s) and returns its output.
    fn finish(&mut self) -> Output {
        let mut child = self.0.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("dbmutex did not finish within 30 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait_with_output().unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct MysqlUrl {
    host: String,
    port: String,
    user: String,
    password: Option<String>,
    db: String,
}

impl MysqlUrl {
    fn parse(url: &str) -> MysqlUrl {
        let rest = url.split_once("://").unwrap().1;
        let (auth, hostpath) = rest.rsplit_once('@').unwrap_or(("root", rest));
        let (user, password) = match auth.split_once(':') {
            Some((u, p)) => (u.to_owned(), Some(p.to_owned())),
            None => (auth.to_owned(), None),
        };
        let (hostport, db) = hostpath.split_once('/').unwrap_or((hostpath, "test"));
        let db = db.split('?').next().unwrap().to_owned();
        let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
        MysqlUrl {
            host: host.into(),
            port: port.into(),
            user,
            password,
            db,
        }
    }
}

/// Running a [`Command`] with its stdin given, or in the background.
trait CommandExt {
    /// Runs to completion with `input` on stdin.
    fn stdin_bytes(&mut self, input: &[u8]) -> Output;
    /// Starts it with stdout and stderr captured, collected on a thread.
    fn spawn_output(&mut self) -> std::thread::JoinHandle<Output>;
}

impl CommandExt for Command {
    fn stdin_bytes(&mut self, input: &[u8]) -> Output {
        let mut child = self
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the command");
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    }

    fn spawn_output(&mut self) -> std::thread::JoinHandle<Output> {
        let child = self
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dbmutex");
        let mut p = Proc(Some(child));
        std::thread::spawn(move || p.finish())
    }
}

fn unique() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The exit code, or -N when dbmutex itself died of signal N.
fn code(out: &Output) -> i32 {
    status_code(&out.status)
}

fn status_code(s: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| -s.signal().unwrap_or(0))
}

fn describe(status: &ExitStatus, stderr: &[u8]) -> String {
    format!("status {status}, stderr: {}", String::from_utf8_lossy(stderr))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether process `pid` can still run: false once it is gone or a zombie
/// (a zombie is dead; only its parent's wait is missing, and a container's
/// init may never do that wait).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X') | None
        ),
        Err(_) => false,
    }
}

/// How long until `pid` is no longer alive, polled every 5 ms from `since`;
/// `None` if it still lives after `limit`.
fn gone_within(pid: i32, since: Instant, limit: Duration) -> Option<Duration> {
    while alive(pid) {
        if since.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Some(since.elapsed())
}

/// The children of process `pid`, from /proc.
fn children_of(pid: i32) -> Vec<i32> {
    let mut kids = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
                kids.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    kids
}

/// A child's stderr, read line by line on a thread, so a test can wait for
/// a message (an event) instead of sleeping.
struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn of(child: &mut Child) -> Lines {
        use std::io::BufRead;
        let err = child.stderr.take().expect("stderr piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// Waits (at most `limit`) for a line containing `needle`.
    fn wait_for(&mut self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        if self.seen.iter().any(|l| l.contains(needle)) {
            return true;
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Everything read so far and up to end-of-file, one string.
    fn all(mut self) -> String {
        while let Ok(line) = self.rx.recv_timeout(Duration::from_secs(30)) {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}

/// Starts `dbmutex ARGS` with its stderr read line by line, and waits
/// until it says that it is waiting for its lock.
fn start_waiting(b: &Backend, args: &[&str]) -> (Proc, Lines) {
    start_waiting_cmd(b, b.cmd(args))
}

/// As [`start_waiting`], for a command already set up (its environment,
/// its stdout).
fn start_waiting_cmd(b: &Backend, mut cmd: Command) -> (Proc, Lines) {
    let mut waiter = Proc(Some(cmd.stderr(Stdio::piped()).spawn().unwrap()));
    let mut lines = Lines::of(waiter.child());
    assert!(
        lines.wait_for("waiting for lock", Duration::from_secs(15)),
        "[{}] the waiter never said it was waiting",
        b.kind
    );
    (waiter, lines)
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Tests, run on every backend

/// Row "the command's status": exit codes and 128+N pass through.
fn child_status_passes_through(b: &Backend) {
    let name = b.name("status");
    for (args, want) in [
        (vec!["run", &name, "--", "true"], 0),
        (vec!["run", &name, "--", "false"], 1),
        (vec!["run", &name, "-c", "exit 7"], 7),
        (vec!["run", &name, "--", "sh", "-c", "exit 255"], 255),
        (vec!["run", &name, "--", "sh", "-c", "kill -TERM $$"], 143),
        (vec!["run", &name, "--", "sh", "-c", "kill -KILL $$"], 137),
    ] {
        let out = b.run(&args);
        assert_eq!(code(&out), want, "{args:?}: {}", stderr(&out));
    }
    b.assert_free(&name);
}

/// Row 75: `-n` conflict, `-w 0`, `-E N`; the command does not run.
fn conflict_exits_75_or_e(b: &Backend) {
    let name = b.name("conflict");
    let mut holder = b.hold(&name, &[], "exec sleep 30");
    let ran = b.marker("ran");
    let touch = format!("touch '{}'", ran.display());
    for (args, want) in [
        (vec!["run", "-n", &name, "-c", &touch], 75),
        (vec!["run", "--no-wait", &name, "-c", &touch], 75),
        (vec!["run", "-w", "0", &name, "-c", &touch], 75),
        (vec!["run", "-n", "-E", "3", &name, "-c", &touch], 3),
        (
            vec!["run", "-n", "--conflict-exit-code", "0", &name, "-c", &touch],
            0,
        ),
    ] {
        let out = b.run(&args);
        assert_eq!(code(&out), want, "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty());
    }
    let quiet = b.run(&["run", "-q", "-n", &name, "-c", &touch]);
    assert_eq!(code(&quiet), 75);
    assert!(quiet.stderr.is_empty(), "-q: {}", stderr(&quiet));
    assert!(!ran.exists(), "the command ran without the lock");
    holder.signal(libc::SIGTERM);
    assert_eq!(code(&holder.finish()), 143);
    b.assert_free(&name);
}

/// `-w 0.3`: gives up after 0.3 s (not before, not much later).
fn timeout_takes_fractions(b: &Backend) {
    let name = b.name("timeout");
    let _holder = b.hold(&name, &[], "exec sleep 30");
    let start = Instant::now();
    let out = b.run(&["run", "-w", "0.3", &name, "--", "true"]);
    let took = start.elapsed();
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    assert!(took >= Duration::from_millis(300), "gave up after {took:?}");
    assert!(took < Duration::from_millis(1500), "gave up after {took:?}");
}

/// A waiter says once what it waits for, then gets the lock within a moment
/// of its release.
fn waiter_takes_over_at_release(b: &Backend) {
    let name = b.name("handoff");
    let go = b.marker("go");
    let released = b.marker("released");
    let ran = b.marker("waiter-ran");
    // The holder's command ends when the test says so (no timed sleep).
    let mut holder = b.hold(
        &name,
        &[],
        &format!(
            "while [ ! -e '{}' ]; do sleep 0.01; done; touch '{}'",
            go.display(),
            released.display()
        ),
    );
    let (mut waiter, lines) = start_waiting(b, &["run", "-v", &name, "--", "touch", ran.to_str().unwrap()]);
    assert!(!ran.exists(), "the waiter ran while the holder held the lock");
    std::fs::write(&go, b"").unwrap();
    let out = waiter.finish();
    let err = lines.all();
    assert_eq!(code(&out), 0, "{err}");
    let mtime = |p: &PathBuf| p.metadata().unwrap().modified().unwrap();
    let handoff = mtime(&ran)
        .duration_since(mtime(&released))
        .expect("the waiter ran before the holder's command ended");
    assert_eq!(err.matches("waiting for lock").count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "dbmutex: waiting for lock {name} (held by {} ",
            holder_label(b).replace('_', " ")
        )),
        "{err}"
    );
    assert!(err.contains("acquired lock"), "{err}");
    assert!(err.contains("released lock"), "{err}");
    assert!(err.lines().all(|l| l.starts_with("dbmutex: ")), "{err}");
    // The bound is the feature (a wait in the server, or a 20 ms poll of
    // the lock file), with a margin for a loaded machine.
    assert!(handoff < Duration::from_millis(1000), "hand-off took {handoff:?}");
    assert_eq!(code(&holder.finish()), 0);
}

/// Row 64: usage errors, before any connection.
fn usage_errors_exit_64(b: &Backend) {
    let name = b.name("usage");
    for args in [
        vec!["run", "", "--", "true"],
        vec!["run", &name],
        vec!["run", "-w", "-1", &name, "--", "true"],
        vec!["run", "-w", "nan", &name, "--", "true"],
        vec!["run", "-w", "inf", &name, "--", "true"],
        vec!["run", "-w", "1e12", &name, "--", "true"],
        vec!["run", "-w", "soon", &name, "--", "true"],
        vec!["run", "-n", "-w", "1", &name, "--", "true"],
        vec!["run", "-E", "256", &name, "--", "true"],
        vec!["run", "-c", "true", &name, "--", "true"],
        vec!["run", "--bogus", &name, "--", "true"],
        vec!["run", "-v", "-q", &name, "--", "true"],
        vec!["status", ""],
        vec!["key", ""],
        vec!["frobnicate"],
        vec![],
    ] {
        let out = b.run(&args);
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?} wrote to stdout");
        assert!(
            stderr(&out).starts_with("dbmutex: ") || args.is_empty(),
            "{}",
            stderr(&out)
        );
    }
    for args in [vec!["--help"], vec!["run", "--help"], vec!["--version"]] {
        let out = b.run(&args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    }
    let help = String::from_utf8(b.run(&["--help"]).stdout).unwrap();
    for needle in [
        "Exit status",
        "75 (or -E N)",
        "64",
        "69",
        "70",
        "78",
        "Examples:",
        "process group",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}");
    }
}

/// 126 for a command that cannot be executed, 127 for one not found; the
/// lock is released either way.
fn unrunnable_commands_exit_126_127(b: &Backend) {
    let name = b.name("exec");
    let out = b.run(&["run", &name, "--", "/nonexistent/command"]);
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot run /nonexistent/command"),
        "{}",
        stderr(&out)
    );
    let not_exec = b.marker("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    let out = b.run(&["run", &name, "--", not_exec.to_str().unwrap()]);
    assert_eq!(code(&out), 126, "{}", stderr(&out));
    b.assert_free(&name);
}

/// The command runs as found in `$PATH` when the run was checked (the
/// spawn does not search again), with its `argv[0]` as given; a file found
/// then and gone by the time the lock is taken is looked up again.
fn path_lookup_keeps_argv0_and_looks_again(b: &Backend) {
    use std::os::unix::fs::PermissionsExt;
    let name = b.name("path");
    // A binary's argv[0] (sh's own command line): the name, not the path.
    let out = b.run(&["run", &name, "--", "sh", "-c", "tr '\\0' ' ' < /proc/$$/cmdline"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(line.split(' ').next(), Some("sh"), "{line:?}");
    let dirs = ["path-first", "path-second"].map(|d| b.marker(d));
    for dir in &dirs {
        std::fs::create_dir_all(dir).unwrap();
        let tool = dir.join("dbmutex-path-tool");
        let said = dir.file_name().unwrap().to_str().unwrap();
        std::fs::write(&tool, format!("#!/bin/sh\necho {said}\n")).unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}:{}",
        dirs[0].display(),
        dirs[1].display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = b
        .cmd(&["run", &name, "--", "dbmutex-path-tool"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "path-first");
    // Found in the first directory, then removed from it or made
    // unexecutable while the run waits: the second's runs, as execvp would.
    for (i, what) in ["removed", "made unexecutable"].into_iter().enumerate() {
        let first = dirs[0].join("dbmutex-path-tool");
        std::fs::write(&first, "#!/bin/sh\necho path-first\n").unwrap();
        std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o755)).unwrap();
        let go = b.marker(&format!("path-go-{i}"));
        let mut holder = b.hold(
            &name,
            &[],
            &format!("while [ ! -e '{}' ]; do sleep 0.01; done", go.display()),
        );
        let mut cmd = b.cmd(&["run", &name, "--", "dbmutex-path-tool"]);
        cmd.env("PATH", &path).stdout(Stdio::piped());
        let (mut waiter, lines) = start_waiting_cmd(b, cmd);
        match i {
            0 => std::fs::remove_file(&first).unwrap(),
            _ => std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o644)).unwrap(),
        }
        std::fs::write(&go, b"").unwrap();
        let out = waiter.finish();
        assert_eq!(code(&out), 0, "{what}: {}", lines.all());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "path-second",
            "{what}"
        );
        assert_eq!(code(&holder.finish()), 0);
    }
    // An empty entry is the current directory.
    let out = b
        .cmd(&["run", &name, "--", "dbmutex-path-tool"])
        .env(
            "PATH",
            format!("/nonexistent::{}", std::env::var("PATH").unwrap_or_default()),
        )
        .current_dir(&dirs[1])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "path-second");
}

/// SIGTERM, SIGINT and SIGHUP to dbmutex reach the command; dbmutex waits
/// for it, releases, and exits with its status.
fn signals_are_forwarded(b: &Backend) {
    for (sig, want) in [(libc::SIGTERM, 143), (libc::SIGINT, 130), (libc::SIGHUP, 129)] {
        let name = b.name(&format!("forward{sig}"));
        let mut p = b.hold(&name, &[], "exec sleep 30");
        p.signal(sig);
        let out = p.finish();
        assert_eq!(code(&out), want, "signal {sig}: {}", stderr(&out));
        b.assert_free(&name);
    }
    // A command that handles the signal decides the status.
    let name = b.name("forward-trap");
    let (mut p, got) = b.hold_until_term(&name, &[], 5);
    p.signal(libc::SIGTERM);
    assert_eq!(code(&p.finish()), 5);
    assert!(got.exists(), "the command did not get SIGTERM");
    b.assert_free(&name);
}

/// A signal while waiting ends the wait: exit 128+N, the command never runs.
fn signal_while_waiting_exits_128_plus_n(b: &Backend) {
    let name = b.name("waitsig");
    let _holder = b.hold(&name, &[], "exec sleep 30");
    let ran = b.marker("ran");
    // The notice says the wait is on (and the handlers are in place).
    let (mut waiter, lines) = start_waiting(b, &["run", &name, "-c", &format!("touch '{}'", ran.display())]);
    waiter.signal(libc::SIGTERM);
    let start = Instant::now();
    let out = waiter.finish();
    let err = lines.all();
    assert_eq!(code(&out), 143, "{err}");
    assert!(err.contains("got SIGTERM while waiting"), "{err}");
    // Ending the wait promptly is the feature; margin for a loaded machine.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert!(!ran.exists(), "the command ran");
    b.assert_held(&name);
}

/// The guardian is forked as dbmutex starts, before it connects: a waiter
/// has it as its one child, and a waiter that gives up
/// (SIGTERM) or dies (kill -9) before its command starts leaves no
/// guardian behind.
fn waiting_guardian_ends_with_the_wait(b: &Backend) {
    let name = b.name("waitguard");
    let _holder = b.hold(&name, &[], "exec sleep 30");
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        let (mut waiter, _lines) = start_waiting(b, &["run", &name, "--", "true"]);
        let kids = children_of(waiter.pid());
        assert_eq!(
            kids.len(),
            1,
            "[{}] a waiting dbmutex should have its guardian only: {kids:?}",
            b.kind
        );
        waiter.signal(sig);
        let stopped = Instant::now();
        waiter.finish();
        assert!(
            gone_within(kids[0], stopped, Duration::from_secs(3)).is_some(),
            "[{}] the guardian of a waiter outlived it (signal {sig})",
            b.kind
        );
    }
    b.assert_held(&name);
}

/// kill -9 of dbmutex: the lock is freed and the command gets SIGTERM.
fn kill_9_frees_lock_and_stops_command(b: &Backend) {
    let name = b.name("kill9");
    let (mut p, got) = b.hold_until_term(&name, &[], 0);
    p.signal(libc::SIGKILL);
    assert_eq!(code(&p.finish()), -libc::SIGKILL);
    assert!(
        eventually(Duration::from_secs(3), || got.exists()),
        "the command did not get SIGTERM when dbmutex died"
    );
    let start = Instant::now();
    let freed = eventually(Duration::from_secs(3), || {
        code(&b.run(&["run", "-n", &name, "--", "true"])) == 0
    });
    assert!(freed, "the lock was not freed within 3 s of kill -9");
    eprintln!("[{}] lock free {:?} after kill -9", b.kind, start.elapsed());
}

/// Stdout and stdin belong to the command: bytes pass untouched, and
/// dbmutex writes nothing to stdout, even with -v.
fn stdio_belongs_to_the_command(b: &Backend) {
    let name = b.name("stdio");
    let out = b.run(&["run", "-v", &name, "--", "printf", "a\\000b\\n\\377"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(out.stdout, b"a\0b\n\xff");
    assert!(stderr(&out).contains("acquired lock"), "{}", stderr(&out));

    let mut p = b
        .cmd(&["run", &name, "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin
        .take()
        .unwrap()
        .write_all(b"line one\nline two\n")
        .unwrap();
    let mut got = Vec::new();
    p.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    assert!(p.wait().unwrap().success());
    assert_eq!(got, b"line one\nline two\n");
}

/// Names with quotes, comment markers, unicode, 300 characters: each is a
/// real lock (held → others refused; released → free).
fn odd_names_are_locks(b: &Backend) {
    let long = format!("{}-{}", b.name("long"), "x".repeat(300));
    for (i, odd) in [
        "it's a \"quoted\" name; DROP TABLE x; --".to_owned(),
        "a */ b /* c */".to_owned(),
        "ünïcødé 🔒 名前".to_owned(),
        long,
    ]
    .iter()
    .enumerate()
    {
        let name = format!("{odd} {}", b.name(&i.to_string()));
        let mut holder = b.hold(&name, &[], "exec sleep 30");
        b.assert_held(&name);
        let status = b.run(&["status", &name]);
        assert_eq!(code(&status), 1, "{name}: {}", stderr(&status));
        holder.signal(libc::SIGTERM);
        assert_eq!(code(&holder.finish()), 143);
        b.assert_free(&name);
    }
}

/// The label of a holder's number on each backend: what it is.
fn holder_label(b: &Backend) -> &'static str {
    match b.kind {
        "postgres" => "backend_pid",
        "mysql" => "connection_id",
        _ => "client_pid",
    }
}

/// `status`: free → 0, held → 1 with the holder, whose number says what
/// it is (PostgreSQL's backend pid, MySQL's connection id, the local
/// holder's own pid); `--json` agrees.
fn status_reports_holders(b: &Backend) {
    let name = b.name("stat");
    let out = b.run(&["status", &name]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "free\n");

    let holder = b.hold(&name, &[], "exec sleep 30");
    let out = b.run(&["status", &name]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let label = holder_label(b);
    let prefix = format!("held\nexclusive: {} ", label.replace('_', " "));
    assert!(text.starts_with(&prefix), "[{}] {text}", b.kind);

    let out = b.run(&["status", "--json", &name]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "held");
    assert_eq!(v["held"], true);
    assert_eq!(v["name"], name.as_str());
    assert_eq!(v["backend"], b.kind);
    let holders = v["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{v}");
    assert_eq!(holders[0]["mode"], "exclusive");
    assert!(holders[0][label].as_i64().is_some(), "{v}");
    assert!(holders[0].get("pid").is_none(), "no unlabelled pid: {v}");
    if b.kind == "local" {
        assert_eq!(holders[0][label].as_i64(), Some(i64::from(holder.pid())), "{v}");
    }
}

/// MySQL's `list` needs the `metadata_lock_info` plugin, which the shared
/// test server need not have: the test starts a private MariaDB with it.
/// There `status` finds slot holders in that list too.
fn list_shows_held_locks_on_a_private_server(b: &Backend) {
    assert_eq!(b.kind, "mysql");
    let my = servers::private_mariadb::PrivateMariaDb::start(&["--plugin-load-add=metadata_lock_info"]);
    let private = Backend {
        kind: b.kind,
        url: Some(my.url()),
        dir: b.dir.clone(),
    };
    list_shows_held_locks(&private);
    // Slot holders found in the server's list (one query), not slot by slot.
    let started = Instant::now();
    slots_refuse_another_count(&private);
    eprintln!(
        "slots_refuse_another_count on the listing server: {:?}",
        started.elapsed()
    );
}

/// The library tests' private servers (a server started for one test),
/// included by path.
#[path = "support/servers.rs"]
mod servers;

/// `list` and `list --json` show a held lock under its key (and name where
/// the backend can tell it).
fn list_shows_held_locks(b: &Backend) {
    let name = b.name("list");
    let key = b.key_json(&name);
    let key = match b.kind {
        "postgres" => format!("{} {}", key["postgres"]["k1"], key["postgres"]["k2"]),
        "mysql" => key["mysql"].as_str().unwrap().to_owned(),
        _ => key["local"].as_str().unwrap().to_owned(),
    };
    let _holder = b.hold(&name, &[], "exec sleep 30");
    let out = b.run(&["list", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mine: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["key"] == key.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{key} not in {v}");
    assert_eq!(mine[0]["mode"], "exclusive");
    // MySQL and local holders have no application name to show.
    if b.kind == "postgres" {
        assert_eq!(mine[0]["application"], "dbmutex-cli", "{v}");
    }
    if let Some(n) = mine[0]["name"].as_str() {
        assert_eq!(n, name);
    }
    let out = b.run(&["list"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines().any(|l| l.contains(&key) && l.contains("exclusive")),
        "{text}"
    );
}

/// `--prefix` (and env WITH_ADVISORY_LOCK_PREFIX) separate key spaces.
fn prefix_separates_locks(b: &Backend) {
    let name = b.name("prefix");
    let _holder = b.hold(&name, &["--prefix", "11"], "exec sleep 30");
    let out = b.run(&["--prefix", "12", "run", "-n", &name, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = b.run(&["run", "--prefix", "11", "-n", &name, "--", "true"]);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    let out = b
        .cmd(&["run", "-n", &name, "--", "true"])
        .env("WITH_ADVISORY_LOCK_PREFIX", "11")
        .output()
        .unwrap();
    assert_eq!(code(&out), 75, "{}", stderr(&out));
}

/// A signal to dbmutex reaches the command's whole process group: here a
/// grandchild that handles SIGTERM; dbmutex exits only once it is gone.
fn sigterm_reaches_the_grandchild(b: &Backend) {
    let name = b.name("tree-term");
    let got = b.marker("grandchild-got-term");
    let grandchild = format!(
        "sh -c \"trap 'touch {}; exit 0' TERM; touch 'READY'; sleep 1000 & wait\"",
        got.display()
    );
    let (mut p, gpid) = b.hold_tree(&name, &[], &grandchild);
    p.signal(libc::SIGTERM);
    let out = p.finish();
    assert_eq!(code(&out), 143, "{}", stderr(&out));
    assert!(got.exists(), "[{}] the grandchild did not get SIGTERM", b.kind);
    assert!(!alive(gpid), "[{}] the grandchild outlived dbmutex", b.kind);
    b.assert_free(&name);
}

/// kill -9 of dbmutex: the guardian stops the whole tree, grandchildren
/// included (one that ignores SIGTERM gets SIGKILL after --kill-after, 1 s
/// by default), and then exits itself. Bound: 1 s (+ kill-after for a
/// SIGTERM-ignoring tree); asserted with a margin for a loaded machine.
fn kill_9_stops_the_whole_tree(b: &Backend) {
    for (tag, grandchild, bound) in [
        ("tree-kill9", SLEEPER, Duration::from_secs(1)),
        ("tree-kill9-ignore", TERM_IGNORING_SLEEPER, Duration::from_secs(2)),
    ] {
        let name = b.name(tag);
        let (mut p, gpid) = b.hold_tree(&name, &[], grandchild);
        let kids = children_of(p.pid());
        assert_eq!(
            kids.len(),
            2,
            "[{}] dbmutex should have the command and its guardian: {kids:?}",
            b.kind
        );
        p.signal(libc::SIGKILL);
        let killed = Instant::now();
        assert_eq!(code(&p.finish()), -libc::SIGKILL);
        let margin = Duration::from_secs(2);
        let took = gone_within(gpid, killed, bound + margin);
        eprintln!(
            "[{}] {tag}: grandchild gone {took:?} after kill -9 of dbmutex (bound {bound:?})",
            b.kind
        );
        assert!(
            took.is_some(),
            "[{}] {tag}: the grandchild still runs {:?} after kill -9 of dbmutex",
            b.kind,
            bound + margin
        );
        for kid in kids {
            let took = gone_within(kid, killed, bound + margin);
            assert!(
                took.is_some(),
                "[{}] {tag}: dbmutex's child {kid} still runs",
                b.kind
            );
        }
        b.assert_free(&name);
    }
}

/// The command exits but leaves a process in its group: dbmutex stops it
/// before releasing the lock, and passes the command's status on.
fn leftovers_stopped_before_release(b: &Backend) {
    let name = b.name("tree-leftover");
    for grandchild in [SLEEPER, TERM_IGNORING_SLEEPER] {
        let n = unique();
        let pidfile = b.marker(&format!("leftover-pid-{n}"));
        let ready = b.marker(&format!("leftover-ready-{n}"));
        let grandchild = grandchild.replace("READY", &ready.display().to_string());
        // The command waits for its grandchild to be set up, then exits 3.
        let script = format!(
            "{grandchild} & echo $! > '{}'; while [ ! -e '{}' ]; do sleep 0.01; done; exit 3",
            pidfile.display(),
            ready.display()
        );
        let out = b.run(&["run", "--kill-after", "0.3", &name, "--", "sh", "-c", &script]);
        assert_eq!(code(&out), 3, "{}", stderr(&out));
        let gpid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(!alive(gpid), "[{}] {grandchild:?} outlived the lock", b.kind);
        assert!(stderr(&out).contains("left processes"), "{}", stderr(&out));
        b.assert_free(&name);
    }
}

/// `dbmutex run ARGS` on a fresh pseudo-terminal (util-linux `script`), as
/// from an interactive shell: stdin and stdout are the terminal.
fn on_a_terminal(b: &Backend, args: &str) -> Child {
    let line = format!("'{BIN}' {args}");
    let mut c = b.cmd(&[]);
    let envs: Vec<_> = c
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
        .collect();
    c = Command::new("script");
    c.args(["-qec", &line, "/dev/null"]);
    for (k, v) in envs {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.env("SHELL", "/bin/sh")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start script(1) (util-linux) for a pseudo-terminal")
}

/// A terminal's output, read on a thread so that waiting for text has a
/// real time limit (a blocking read would not).
struct Screen {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    text: String,
}

impl Screen {
    fn of(child: &mut Child) -> Screen {
        let mut out = child.stdout.take().expect("stdout piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Screen {
            rx,
            text: String::new(),
        }
    }

    /// Waits (at most `limit`) for `needle`, and forgets the output up to
    /// and including it, so the next wait looks at what came after.
    fn until(&mut self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(at) = self.text.find(needle) {
                self.text.drain(..at + needle.len());
                return;
            }
            let left = deadline.checked_duration_since(Instant::now());
            match left.map(|l| self.rx.recv_timeout(l)) {
                Some(Ok(bytes)) => self.text.push_str(&String::from_utf8_lossy(&bytes)),
                _ => panic!(
                    "no {needle:?} within {limit:?}; the terminal shows: {:?}",
                    self.text
                ),
            }
        }
    }
}

/// Waits for a raw child (at most 30 s).
fn finish_child(mut c: Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let id = c.id().to_string();
            let tree = Command::new("ps")
                .args(["-eo", "pid,ppid,pgid,sid,tpgid,stat,wchan:20,args", "--forest"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(&id) || l.contains(BIN) || l.contains("sleep 1000"))
                .collect::<Vec<_>>()
                .join("\n");
            let _ = c.kill();
            panic!("did not finish within 30 s; its session:\n{tree}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// On a terminal the command's group gets the terminal: it can read from it
/// (a background group would be stopped by SIGTTIN) and a Ctrl-C typed on it
/// reaches the command once (exit 130).
fn terminal_belongs_to_the_command(b: &Backend) {
    let name = b.name("tty");
    let mut t = on_a_terminal(
        b,
        &format!("run '{name}' -- sh -c 'echo ready; read line; echo got-$line'"),
    );
    let mut screen = Screen::of(&mut t);
    screen.until("ready", Duration::from_secs(15));
    t.stdin.as_mut().unwrap().write_all(b"hello\n").unwrap();
    screen.until("got-hello", Duration::from_secs(15));
    assert!(finish_child(t).success());

    let name = b.name("tty-intr");
    let ran = b.marker("tty-after-intr");
    let mut t = on_a_terminal(
        b,
        &format!(
            "run '{name}' -- sh -c 'echo ready; sleep 1000; touch {}'",
            ran.display()
        ),
    );
    let mut screen = Screen::of(&mut t);
    screen.until("ready", Duration::from_secs(15));
    // Type Ctrl-C. Rarely (about 1 run in 8 here) script(1) forwards a
    // byte typed right after the output without the terminal raising
    // SIGINT (the command group, verified as the terminal's foreground
    // group, got nothing), so type it again until the job ends.
    let deadline = Instant::now() + Duration::from_secs(15);
    while t.try_wait().unwrap().is_none() && Instant::now() < deadline {
        let _ = t.stdin.as_mut().unwrap().write_all(b"\x03");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = finish_child(t);
    assert_eq!(status_code(&status), 130, "Ctrl-C: {status}");
    assert!(!ran.exists());
    b.assert_free(&name);
}

/// Job control from an interactive bash on a pseudo-terminal: Ctrl-Z stops
/// the whole job (dbmutex and the command's group) and the shell says so;
/// `fg` continues it with the terminal; a background job that reads the
/// terminal is reported stopped and `fg` lets it read.
fn job_control_works(b: &Backend) {
    let mut c = b.cmd(&[]);
    let envs: Vec<_> = c
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
        .collect();
    c = Command::new("script");
    c.args(["-qec", "bash --norc --noprofile -i", "/dev/null"]);
    for (k, v) in envs {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let mut t = c
        .env("TERM", "dumb")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start script(1) (util-linux) for a pseudo-terminal");
    let mut out = Screen::of(&mut t);
    let mut input = t.stdin.take().unwrap();
    let limit = Duration::from_secs(15);
    // Quoted so that the echo of this line does not match the prompt.
    input.write_all(b"PS1='PROMPT''> '; set -b\n").unwrap();
    out.until("PROMPT> ", limit);

    // Foreground: Ctrl-Z, fg, then the command reads the terminal.
    let name = b.name("jobs-fg");
    let line = format!("'{BIN}' run '{name}' -- sh -c 'echo rea\"\"dy; read x; echo got-$x'\n");
    input.write_all(line.as_bytes()).unwrap();
    out.until("ready", limit);
    input.write_all(b"\x1a").unwrap();
    out.until("Stopped", limit);
    b.assert_held(&name);
    input.write_all(b"fg\n").unwrap();
    input.write_all(b"hello\n").unwrap();
    out.until("got-hello", limit);
    out.until("PROMPT> ", limit);
    b.assert_free(&name);

    // Background: reading the terminal stops the job; fg lets it read.
    let name = b.name("jobs-bg");
    let line = format!("'{BIN}' run '{name}' -- sh -c 'read x; echo got-$x' &\n");
    input.write_all(line.as_bytes()).unwrap();
    out.until("Stopped", limit);
    input.write_all(b"fg\n").unwrap();
    input.write_all(b"again\n").unwrap();
    out.until("got-again", limit);
    out.until("PROMPT> ", limit);
    input.write_all(b"exit\n").unwrap();
    assert!(finish_child(t).success());
    b.assert_free(&name);
}

// ---------------------------------------------------------------------------
// Tests for some backends

/// Row 70: the holder's server session ends → the command gets SIGTERM,
/// dbmutex exits 70.
fn lock_loss_stops_command_exit_70(b: &Backend) {
    let name = b.name("loss");
    let (mut p, got) = b.hold_until_term(&name, &[], 0);
    b.kill_holder_session(&name);
    let start = Instant::now();
    let out = p.finish();
    assert_eq!(code(&out), 70, "{}", stderr(&out));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "noticed after {:?}",
        start.elapsed()
    );
    assert!(got.exists(), "the command did not get SIGTERM");
    assert!(stderr(&out).contains("was lost"), "{}", stderr(&out));
    // Why, in the server's words (not the driver's bare "db error"); and a
    // release of the lost lock is not reported as a second failure.
    if b.kind == "postgres" {
        assert!(
            stderr(&out).contains("FATAL: terminating connection due to administrator command"),
            "{}",
            stderr(&out)
        );
    }
    assert!(!stderr(&out).contains("release failed"), "{}", stderr(&out));
    b.assert_free(&name);

    // A command that ignores SIGTERM gets SIGKILL after --kill-after.
    let name = b.name("loss-kill");
    let mut p = b.hold_with(&name, &["--kill-after", "0.5"], "trap '' TERM;", "exec sleep 30");
    b.kill_holder_session(&name);
    let out = p.finish();
    assert_eq!(code(&out), 70, "{}", stderr(&out));
    assert!(stderr(&out).contains("SIGKILL"), "{}", stderr(&out));
}

/// --max-hold: a command still running past it is stopped like a lost
/// lock's (SIGTERM, then SIGKILL after --kill-after), dbmutex exits 124 and
/// the lock is free; a command that ends in time is not touched.
fn max_hold_stops_the_command_exit_124(b: &Backend) {
    let name = b.name("max-hold");
    let (mut p, got) = b.hold_until_term(&name, &["--max-hold", "0.5"], 0);
    let out = p.finish();
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(got.exists(), "the command did not get SIGTERM");
    assert!(stderr(&out).contains("--max-hold"), "{}", stderr(&out));
    b.assert_free(&name);

    let name = b.name("max-hold-kill");
    let mut p = b.hold_with(
        &name,
        &["--max-hold", "0.3", "--kill-after", "0.3"],
        "trap '' TERM;",
        "exec sleep 30",
    );
    let start = Instant::now();
    let out = p.finish();
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(stderr(&out).contains("SIGKILL"), "{}", stderr(&out));
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    b.assert_free(&name);

    let out = b.run(&["run", "--max-hold", "30", &name, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// --slots N: at most N commands hold NAME at once; each learns its slot
/// (DBMUTEX_SLOT); `status --slots` says who holds which and exits 1 only
/// when every slot is held; the plain lock NAME is another lock.
fn slots_cap_concurrent_runs(b: &Backend) {
    let name = b.name("slots");
    let slot_file = |i: usize| b.marker(&format!("slot-{i}-{}", unique()));
    let files = [slot_file(0), slot_file(1)];
    let mut holders = Vec::new();
    for f in &files {
        let script = format!("echo $DBMUTEX_SLOT > '{}'; exec sleep 30", f.display());
        holders.push(b.hold(&name, &["--slots", "2"], &script));
    }
    // Written just after the command counts as started: wait for it.
    let read = |f: &PathBuf| std::fs::read_to_string(f).ok().filter(|s| s.ends_with('\n'));
    assert!(
        eventually(Duration::from_secs(15), || files
            .iter()
            .all(|f| read(f).is_some())),
        "the commands did not report their slots"
    );
    let mut slots: Vec<String> = files.iter().map(|f| read(f).unwrap().trim().to_owned()).collect();
    slots.sort();
    assert_eq!(slots, ["0", "1"], "each run its own slot");
    let out = b.run(&["run", "-n", "--slots", "2", &name, "--", "true"]);
    assert_eq!(code(&out), 75, "a third holder of 2 slots: {}", stderr(&out));
    b.assert_free(&name);
    let out = b.run(&["status", "--slots", "2", &name]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("0 of 2 slots free"),
        "{out:?}"
    );
    let out = b.run(&["status", "--slots", "3", "--json", &name]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["free"], 1, "{v}");
    let held: Vec<bool> = v["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["held"].as_bool().unwrap())
        .collect();
    assert_eq!(held, [true, true, false], "{v}");
    drop(holders);
    let out = b.run(&["run", "-w", "10", "--slots", "2", &name, "--", "true"]);
    assert_eq!(
        code(&out),
        0,
        "slots free once the holders are gone: {}",
        stderr(&out)
    );
}

/// Every holder of NAME's slots must give the same N: a `--slots 5`
/// holder beside three `--slots 3` holders is refused (exit 69) instead of
/// making 4 at once; `status NAME` (no `--slots`) says the slots are held
/// (exit 1), with the count where the backend can tell it.
fn slots_refuse_another_count(b: &Backend) {
    let name = b.name("slot-count");
    let three: Vec<Proc> = (0..3)
        .map(|_| b.hold(&name, &["--slots", "3"], "exec sleep 30"))
        .collect();
    let ran = b.marker("five-ran");
    let touch = format!("touch '{}'", ran.display());
    let out = b.run(&["run", "-n", "--slots", "5", &name, "-c", &touch]);
    assert_eq!(code(&out), 69, "[{}] {}", b.kind, stderr(&out));
    assert!(
        stderr(&out).contains("another number of slots than 5"),
        "{}",
        stderr(&out)
    );
    assert!(!ran.exists(), "[{}] the --slots 5 command ran: 4 at once", b.kind);
    let out = b.run(&["status", &name]);
    assert_eq!(code(&out), 1, "[{}] {}", b.kind, stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.starts_with("slots held\nslots: 3 processes hold some of its slots"),
        "[{}] {text}",
        b.kind
    );
    let out = b.run(&["status", "--json", &name]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["held"].as_bool()),
        (Some("slots held"), Some(true)),
        "{v}"
    );
    assert_eq!(v["slot_holders"], 3, "{v}");
    if b.kind != "mysql" {
        assert_eq!(
            v["slot_counts"],
            serde_json::json!([{ "slots": 3, "holders": 3 }]),
            "{v}"
        );
    }
    if b.kind == "local" {
        // A holder that gives 5 beside them (its count marker, held shared by
        // flock(1)): `status --slots 3` warns, naming both counts.
        let marker = dbmutex::LockName::Slot(name.clone(), dbmutex::SLOT_MARKERS + 5);
        let file = dbmutex::key::local_file_name(&marker, &dbmutex::Prefix::none()).unwrap();
        let mut other = Command::new("flock")
            .arg("-s")
            .arg(b.dir.join("locks").join(file))
            .args(["sleep", "30"])
            .spawn()
            .expect("start flock(1)");
        let mut said = String::new();
        let warned = eventually(Duration::from_secs(10), || {
            let out = b.run(&["status", "--slots", "3", &name]);
            said = String::from_utf8_lossy(&out.stdout).into_owned();
            said.contains("warning: holders are counting 3 slots (3), 5 slots (1): holders disagree")
        });
        let _ = other.kill();
        let _ = other.wait();
        assert!(warned, "{said}");
    }
    drop(three);
    // Their markers go with their sessions: a moment after their end.
    assert!(
        eventually(Duration::from_secs(10), || code(&b.run(&["status", &name])) == 0),
        "[{}] the slots stay held after their holders ended",
        b.kind
    );
    // The other way round (where the backend has shared count markers: on
    // MySQL a holder counting more in a slot beyond 3 is not seen).
    if b.kind != "mysql" {
        let _five = b.hold(&name, &["-w", "10", "--slots", "5"], "exec sleep 30");
        let out = b.run(&["run", "-n", "--slots", "3", &name, "-c", &touch]);
        assert_eq!(code(&out), 69, "[{}] {}", b.kind, stderr(&out));
        assert!(!ran.exists());
        let out = b.run(&["run", "-n", "--slots", "5", &name, "-c", &touch]);
        assert_eq!(code(&out), 0, "[{}] the same count: {}", b.kind, stderr(&out));
    }
}

/// Lock loss stops the whole tree, grandchildren included, before dbmutex
/// exits 70; a grandchild that ignores SIGTERM gets SIGKILL after
/// --kill-after. Bound: the backend's loss detection plus --kill-after.
fn lock_loss_stops_the_whole_tree(b: &Backend) {
    for (tag, grandchild, kill_after) in [
        ("tree-loss", SLEEPER, "1"),
        ("tree-loss-ignore", TERM_IGNORING_SLEEPER, "0.5"),
    ] {
        let name = b.name(tag);
        let (mut p, gpid) = b.hold_tree(&name, &["--kill-after", kill_after], grandchild);
        b.kill_holder_session(&name);
        let killed = Instant::now();
        let out = p.finish();
        let exited = killed.elapsed();
        assert_eq!(code(&out), 70, "{}", stderr(&out));
        assert!(
            !alive(gpid),
            "[{}] {tag}: the grandchild still runs after dbmutex exited 70",
            b.kind
        );
        eprintln!(
            "[{}] {tag}: dbmutex exited 70 with the tree gone {exited:?} after the session was killed (--kill-after {kill_after})",
            b.kind
        );
        // Loss detection (about 1 s at worst today) + kill-after + margin.
        assert!(
            exited < Duration::from_secs(5),
            "[{}] {tag}: took {exited:?}",
            b.kind
        );
        b.assert_free(&name);
    }
}

/// Row 69: an unreachable server fails fast, and the command does not run.
fn unreachable_server_exits_69(b: &Backend) {
    let url = b.url.as_deref().unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let db = rest.rsplit_once('/').map_or("test", |(_, db)| db);
    let dead = format!("{scheme}://root:s3cret@127.0.0.1:1/{db}");
    let ran = b.marker("ran");
    let start = Instant::now();
    let out = b.run(&[
        "--database-url",
        &dead,
        "run",
        &b.name("dead"),
        "-c",
        &format!("touch '{}'", ran.display()),
    ]);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert!(!ran.exists());
    let err = stderr(&out);
    assert!(
        err.starts_with("dbmutex: ") && err.contains("127.0.0.1:1"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "password in message: {err}");
    for args in [vec!["status", "x"], vec!["list"]] {
        let mut full = vec!["--database-url", &dead];
        full.extend(args);
        assert_eq!(code(&b.run(&full)), 69);
    }
}

/// `-s`: shared holders coexist; an exclusive request is refused meanwhile.
fn shared_and_exclusive(b: &Backend) {
    let name = b.name("shared");
    let _a = b.hold(&name, &["-s"], "exec sleep 30");
    let _c = b.hold(&name, &["--shared"], "exec sleep 30");
    let out = b.run(&["status", "--json", &name]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let holders = v["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{v}");
    assert!(holders.iter().all(|h| h["mode"] == "shared"), "{v}");
    b.assert_held(&name);
    let out = b.run(&["run", "-n", "-x", &name, "--", "true"]);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    let out = b.run(&["run", "-n", "-s", &name, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // -x after -s wins, as in flock(1).
    let out = b.run(&["run", "-n", "-s", "-x", &name, "--", "true"]);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
}

/// An option the backend lacks is a usage error, even with the server down.
fn unsupported_options_exit_64(b: &Backend) {
    let name = b.name("unsupported");
    let mut cases = vec![vec!["run", "--transaction", &name, "--", "true"]];
    if b.kind == "mysql" {
        cases.push(vec!["run", "-s", &name, "--", "true"]);
        cases.push(vec![
            "--database-url",
            "mysql://root@127.0.0.1:1/test",
            "run",
            "-s",
            &name,
            "--",
            "true",
        ]);
    }
    for args in cases {
        let out = b.run(&args);
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
}

/// `--transaction` (PostgreSQL): a transaction-level lock, held in an open
/// transaction while the command runs.
fn transaction_lock(b: &Backend) {
    let name = b.name("xact");
    let mut holder = b.hold(&name, &["--transaction"], "exec sleep 30");
    b.assert_held(&name);
    let key = b.key_json(&name);
    let state = b.sql(&format!(
        "SELECT a.state FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND l.classid = {} AND l.objsubid = 2",
        key["postgres"]["k1"]
    ));
    assert_eq!(state, "idle in transaction");
    // Held past a few keepalive probes (1 s each): the probe of a
    // transaction lock's connection was invalid SQL, so the lock was
    // reported lost and the command stopped (exit 70) after ~1 s.
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    b.assert_held(&name);
    let out = b.run(&["run", "--transaction", "-w", "0.2", &name, "--", "true"]);
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    holder.signal(libc::SIGTERM);
    assert_eq!(code(&holder.finish()), 143);
    let out = b.run(&["run", "--transaction", "-n", &name, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// `dbmutex run NAME -- CMD` holds one server connection while the command
/// runs (PostgreSQL: the pooler check's second connection is closed once
/// the check is done), and none after.
fn run_uses_one_connection(b: &Backend) {
    let name = b.name("one-conn");
    let app = format!("dbmutex-one-conn-{}", unique());
    let url = b.url.as_deref().expect("postgres");
    let sep = if url.contains('?') { '&' } else { '?' };
    let count = || {
        b.sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'"
        ))
    };
    let mut holder = b
        .cmd(&["run", &name, "--", "sleep", "30"])
        .env(
            "DBMUTEX_DATABASE_URL",
            format!("{url}{sep}application_name={app}"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map(|c| Proc(Some(c)))
        .expect("start dbmutex");
    assert!(
        eventually(Duration::from_secs(15), || b
            .run(&["status", &name])
            .status
            .code()
            == Some(1)),
        "the lock is held"
    );
    // Let the connect-time check's second connection go away, then look
    // twice: the count must stay at one.
    assert!(
        eventually(Duration::from_secs(5), || count() == "1"),
        "one connection while the command runs, found {}",
        count()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(count(), "1", "still one");
    holder.signal(libc::SIGTERM);
    holder.finish();
    assert!(
        eventually(Duration::from_secs(5), || count() == "0"),
        "none after"
    );
}

/// A lock directory that cannot be created is an error before the command.
fn unusable_lock_dir_exits_69(b: &Backend) {
    let out = b
        .cmd(&["run", &b.name("nodir"), "--", "true"])
        .env("DBMUTEX_LOCK_DIR", "/proc/self/status/locks")
        .output()
        .unwrap();
    assert_eq!(code(&out), 69, "{}", stderr(&out));
}

/// `-v`: the waiting line comes back every 5 s while the wait lasts, each
/// time with the holder as the server reports it then; without `-v` it is
/// said once.
fn verbose_repeats_the_waiting_line(b: &Backend) {
    let name = b.name("verbose-wait");
    let _holder = b.hold(&name, &[], "exec sleep 30");
    // Both waiters at once: the test lasts one wait (8 s), not two. The
    // second line is due at 6 s; 2 s of margin for a loaded machine.
    let verbose = b
        .cmd(&["run", "-v", "-w", "8", &name, "--", "true"])
        .spawn_output();
    let plain = b.cmd(&["run", "-w", "8", &name, "--", "true"]).spawn_output();
    for (out, lines_wanted) in [(verbose.join().unwrap(), 2), (plain.join().unwrap(), 1)] {
        let err = stderr(&out);
        assert_eq!(code(&out), 75, "[{}] {err}", b.kind);
        let waiting: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("waiting for lock") && !l.contains("gave up"))
            .collect();
        assert_eq!(waiting.len(), lines_wanted, "[{}] {err}", b.kind);
        assert!(
            waiting[0].starts_with(&format!(
                "dbmutex: waiting for lock {name} (held by {} ",
                holder_label(b).replace('_', " ")
            )),
            "[{}] {err}",
            b.kind
        );
        if let Some(again) = waiting.get(1) {
            let after = again
                .strip_prefix(&format!("dbmutex: still waiting for lock {name} after "))
                .and_then(|rest| rest.split_once(" s"))
                .and_then(|(secs, _)| secs.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("[{}] {err}", b.kind));
            assert!((6.0..8.0).contains(&after), "[{}] {err}", b.kind);
            let held_by = format!(" (held by {} ", holder_label(b).replace('_', " "));
            assert!(again.contains(&held_by), "[{}] {err}", b.kind);
        }
        assert!(err.contains("gave up waiting"), "[{}] {err}", b.kind);
    }
}

/// `-v`: each repeated notice re-reads the holders. On the local backend a
/// second shared holder can join while an exclusive waiter waits (flock
/// queues no writer ahead of readers), so the holders change mid-wait.
fn verbose_notice_rereads_the_holders(b: &Backend) {
    let name = b.name("reread");
    let first = b.hold(&name, &["-s"], "exec sleep 30");
    let (mut waiter, lines) = start_waiting(b, &["run", "-v", "-w", "8", &name, "--", "true"]);
    let second = b.hold(&name, &["-s", "-n"], "exec sleep 30");
    let out = waiter.finish();
    let err = lines.all();
    assert_eq!(code(&out), 75, "{err}");
    let notices: Vec<&str> = err.lines().filter(|l| l.contains("(held by ")).collect();
    assert_eq!(notices.len(), 2, "{err}");
    let (one, two) = (format!("pid {}", first.pid()), format!("pid {}", second.pid()));
    assert!(notices[0].contains(&one) && !notices[0].contains(&two), "{err}");
    assert!(notices[1].contains(&one) && notices[1].contains(&two), "{err}");
}

/// `-E 0` (the help's "skip quietly"): a busy lock prints nothing, waiting
/// or not, and the command does not run; `-v` still tells.
fn conflict_exit_0_is_silent(b: &Backend) {
    let name = b.name("e0");
    let _holder = b.hold(&name, &[], "exec sleep 30");
    let ran = b.marker("ran");
    let touch = format!("touch '{}'", ran.display());
    // 1.5 s: past the moment (1 s) the waiting notice would be printed.
    for args in [
        vec!["run", "-w", "1.5", "-E", "0", &name, "-c", &touch],
        vec!["run", "-n", "-E", "0", &name, "-c", &touch],
    ] {
        let out = b.run(&args);
        assert_eq!(code(&out), 0, "[{}] {args:?}: {}", b.kind, stderr(&out));
        assert!(out.stderr.is_empty(), "[{}] {args:?}: {}", b.kind, stderr(&out));
    }
    let out = b.run(&["run", "-v", "-w", "1.5", "-E", "0", &name, "-c", &touch]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("waiting for lock") && err.contains("gave up"),
        "{err}"
    );
    // Not every exit code is silent: the default one says why.
    let out = b.run(&["run", "-w", "1.5", "-E", "3", &name, "-c", &touch]);
    assert_eq!(code(&out), 3);
    assert!(stderr(&out).contains("gave up waiting"), "{}", stderr(&out));
    assert!(!ran.exists(), "the command ran without the lock");
}

/// A closed port on 127.0.0.1: for `status` and `run`, the OS's reason is
/// printed once (the library's message already includes its causes).
fn connect_error_says_its_cause_once(b: &Backend) {
    let dead = b.dead_url();
    for args in [vec!["status", "x"], vec!["run", "x", "--", "true"]] {
        let mut full = vec!["--database-url", &dead];
        full.extend(args);
        let out = b.run(&full);
        let err = stderr(&out);
        assert_eq!(code(&out), 69, "{err}");
        assert_eq!(err.matches("Connection refused").count(), 1, "[{}] {err}", b.kind);
        assert_eq!(err.lines().count(), 1, "[{}] {err}", b.kind);
        assert!(
            err.starts_with("dbmutex: ") && err.contains("127.0.0.1:1"),
            "{err}"
        );
    }
}

/// `status --json`: errors are JSON on stdout, with the exit status of the
/// table in `status --help`.
fn status_json_errors(b: &Backend) {
    let dead = b.dead_url();
    let out = b.run(&["--database-url", &dead, "status", "--json", "x"]);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["error"]["kind"], "connect", "{v}");
    assert_eq!(v["error"]["exit"], 69, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("127.0.0.1:1") && msg.contains("Connection refused"),
        "{v}"
    );
    assert!(!msg.contains("s3cret"), "password in message: {v}");
    // A URL the driver cannot use: a usage error, still JSON.
    let url = b.url.as_deref().unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    let bad = match b.kind {
        "postgres" => format!("{url}{sep}sslmode=sometimes"),
        _ => format!("{url}{sep}pool_min=x"),
    };
    let out = b.run(&["--database-url", &bad, "status", "--json", "x"]);
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["error"]["kind"], "config", "{v}");
    assert_eq!(v["error"]["exit"], 64, "{v}");
}

/// `dbmutex init` creates the fencing table (or says the local backend
/// needs none) and prints the grants an application role needs.
fn init_prepares_fencing(b: &Backend) {
    let out = b.run(&["init"]);
    assert_eq!(code(&out), 0, "[{}] {}", b.kind, stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    if b.url.is_none() {
        assert!(text.contains("nothing to create"), "{text}");
        return;
    }
    assert!(
        text.contains("GRANT SELECT, INSERT, UPDATE ON"),
        "[{}] {text}",
        b.kind
    );
    let columns = match b.kind {
        "postgres" => "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_name = 'dbmutex_fence' AND table_schema = current_schema()",
        _ => "SELECT group_concat(column_name ORDER BY ordinal_position) FROM information_schema.columns WHERE table_name = 'dbmutex_fence' AND table_schema = database()",
    };
    assert_eq!(b.sql(columns), "lock_key,token", "[{}]", b.kind);
    assert_eq!(
        b.sql(&columns.replace("dbmutex_fence", "dbmutex_runs")),
        "lock_key,lock_name,run,started_at,host,pid,finished_at,exit_code",
        "[{}]",
        b.kind
    );
    assert_eq!(
        b.sql(&columns.replace("dbmutex_fence", "dbmutex_delay")),
        "lock_key,closed_until",
        "[{}]",
        b.kind
    );
}

/// `--lock-delay`: a clean end opens the lock at once; kill -9 of a holder
/// keeps it closed for the delay after the holder's last renewal (2 s, a
/// renewal every 0.5 s): a try meanwhile exits 75, a waiter gets in once
/// it has passed.
fn lock_delay_closes_after_a_kill_9(b: &Backend) {
    let name = b.name("lockdelay");
    let delay = ["--lock-delay", "2s"];
    let run = |extra: &[&str]| {
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&delay);
        args.extend_from_slice(&[&name, "--", "true"]);
        b.run(&args)
    };
    let out = run(&[]);
    assert_eq!(code(&out), 0, "[{}] {}", b.kind, stderr(&out));
    let out = run(&["-n"]);
    assert_eq!(
        code(&out),
        0,
        "[{}] a clean end left the lock closed: {}",
        b.kind,
        stderr(&out)
    );

    let (mut p, _got) = b.hold_until_term(&name, &delay, 0);
    // A few renewals.
    std::thread::sleep(Duration::from_millis(1200));
    p.signal(libc::SIGKILL);
    let killed = Instant::now();
    assert_eq!(code(&p.finish()), -libc::SIGKILL);
    let out = run(&["-n"]);
    assert_eq!(
        code(&out),
        75,
        "[{}] a try got the lock during its delay: {}",
        b.kind,
        stderr(&out)
    );
    let out = run(&["-w", "10"]);
    let closed = killed.elapsed();
    assert_eq!(code(&out), 0, "[{}] {}", b.kind, stderr(&out));
    eprintln!("[{}] closed {closed:?} after kill -9 (--lock-delay 2s)", b.kind);
    assert!(
        closed >= Duration::from_millis(1400) && closed <= Duration::from_millis(4500),
        "[{}] closed {closed:?} after kill -9, not 2 s (less a renewal, plus the machine's slack)",
        b.kind
    );
}

/// A user that may not create the fencing table (a database of its own
/// where it may only read its application's table) gets exit 69, as `run
/// --help`'s table says, and the message names the flag that exists:
/// `dbmutex init --database-url URL` (it said `--url`).
fn missing_fence_table_exits_69(b: &Backend) {
    let tag = unique();
    let (db, user) = (format!("dbmutex_nofence_{tag}"), format!("nofence{tag}"));
    b.sql(&format!(
        "CREATE DATABASE {db}; CREATE TABLE {db}.app_data (id INT); \
         CREATE USER '{user}'@'%'; GRANT SELECT ON {db}.app_data TO '{user}'@'%'"
    ));
    let u = MysqlUrl::parse(b.url.as_deref().unwrap());
    let url = format!("mysql://{user}@{}:{}/{db}", u.host, u.port);
    let out = b.run(&[
        "--database-url",
        &url,
        "run",
        "--fence",
        &b.name("nofence"),
        "--",
        "true",
    ]);
    b.sql(&format!("DROP DATABASE {db}; DROP USER '{user}'@'%'"));
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("run `dbmutex init --database-url URL`"),
        "{}",
        stderr(&out)
    );
}

/// `--once-per`: 8 processes on one "cron tick" (started within 1 s) run
/// the command exactly once; the other 7 exit 75 saying when and where it
/// last ran; `status` shows the run and its exit status; `-E 0` skips
/// quietly; a window of 0 always runs, and a failed run's status is kept.
fn once_per_runs_once_per_tick(b: &Backend) {
    let name = b.name("once");
    let ran = b.marker(&format!("ran-{}", unique()));
    let script = format!("echo $$ >> '{}'; sleep 0.3", ran.display());
    let first = Instant::now();
    let procs: Vec<Child> = (0..8)
        .map(|_| {
            b.cmd(&["run", "--once-per", "1h", &name, "--", "sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start dbmutex")
        })
        .collect();
    let tick = first.elapsed();
    assert!(tick < Duration::from_secs(1), "8 starts took {tick:?}");
    let outs: Vec<Output> = procs.into_iter().map(|p| p.wait_with_output().unwrap()).collect();
    let mut codes: Vec<i32> = outs.iter().map(code).collect();
    codes.sort();
    assert_eq!(codes, [0, 75, 75, 75, 75, 75, 75, 75], "[{}] {outs:?}", b.kind);
    let lines = std::fs::read_to_string(&ran).unwrap();
    assert_eq!(lines.lines().count(), 1, "[{}] ran {lines:?}", b.kind);
    let skipped = outs.iter().find(|o| code(o) == 75).unwrap();
    let said = stderr(skipped);
    assert!(
        said.contains("last started at") && said.contains("once per 1 h") && said.contains("not running"),
        "[{}] {said}",
        b.kind
    );

    let out = b.run(&["status", "--json", &name]);
    assert_eq!(code(&out), 0, "[{}] {}", b.kind, stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let last = &v["last_run"];
    assert_eq!(
        (last["run"].as_u64(), last["exit_code"].as_i64()),
        (Some(1), Some(0)),
        "[{}] {v}",
        b.kind
    );
    assert!(
        last["finished_at"].is_string() && !last["host"].as_str().unwrap().is_empty(),
        "{v}"
    );
    assert!(last["ago_seconds"].as_f64().unwrap() < 60.0, "{v}");
    let out = b.run(&["status", &name]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("with exit status 0"),
        "{out:?}"
    );

    let out = b.run(&[
        "run",
        "-E",
        "0",
        "--once-per",
        "30m",
        &name,
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(
        (code(&out), stderr(&out).as_str()),
        (0, ""),
        "[{}] -E 0 skips quietly",
        b.kind
    );
    let out = b.run(&["run", "--once-per", "0", &name, "--", "sh", "-c", "exit 5"]);
    assert_eq!(
        code(&out),
        64,
        "[{}] a window of 0 is refused: {}",
        b.kind,
        stderr(&out)
    );
    assert!(stderr(&out).contains("limits nothing"), "{}", stderr(&out));
    let out = b.run(&[
        "run",
        "--once-per",
        "1h",
        "--reset-window",
        &name,
        "--",
        "sh",
        "-c",
        "exit 5",
    ]);
    assert_eq!(
        code(&out),
        5,
        "[{}] --reset-window runs: {}",
        b.kind,
        stderr(&out)
    );
    let out = b.run(&["status", "--json", &name]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["last_run"]["run"].as_u64(), v["last_run"]["exit_code"].as_i64()),
        (Some(2), Some(5)),
        "{v}"
    );
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 1);
    for bad in [&["--once-per", "1x"][..], &["--once-per", "1h", "--slots", "2"]] {
        let mut args = vec!["run"];
        args.extend_from_slice(bad);
        args.extend_from_slice(&[&name, "--", "true"]);
        assert_eq!(code(&b.run(&args)), 64, "[{}] {bad:?}", b.kind);
    }
}

/// Three processes play three hosts whose clocks differ by up to 4 s
/// (`faketime` offsets of -2 s, 0 and +2 s) and whose cron fires every 2 s
/// with up to 0.5 s of jitter each, all running the cron recipe with
/// `--once-per` equal to the period: every tick runs the command exactly
/// once (none skipped, none twice).
fn once_per_is_once_per_cron_tick(b: &Backend) {
    const TICKS: u32 = 20;
    const PERIOD: Duration = Duration::from_secs(2);
    let name = b.name("cron");
    let ran = b.marker("cron-ran");
    let mut seed = u64::from(std::process::id()) ^ u64::from(unique()) << 32 | 1;
    eprintln!("[{}] jitter seed {seed}", b.kind);
    let mut jitter = move || {
        // xorshift: enough for jitter, and the seed is printed.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        Duration::from_millis(seed % 501)
    };
    let t0 = Instant::now() + Duration::from_millis(500);
    let mut fires: Vec<(Instant, &str, u32)> = Vec::new();
    for tick in 0..TICKS {
        for offset in ["-2s", "+0s", "+2s"] {
            fires.push((t0 + PERIOD * tick + jitter(), offset, tick));
        }
    }
    fires.sort_by_key(|f| f.0);
    let mut procs = Vec::new();
    for (at, offset, tick) in fires {
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let script = format!("echo {tick} >> '{}'", ran.display());
        let mut host = b.cmd_under(
            &["faketime", "-f", offset],
            &[
                "run",
                "-n",
                "-E",
                "0",
                "--once-per",
                "2s",
                &name,
                "--",
                "sh",
                "-c",
                &script,
            ],
        );
        host.stdout(Stdio::null()).stderr(Stdio::piped());
        procs.push((
            tick,
            offset,
            host.spawn().expect("start faketime (Debian package faketime)"),
        ));
    }
    for (tick, offset, p) in procs {
        let out = p.wait_with_output().unwrap();
        assert_eq!(
            code(&out),
            0,
            "[{}] tick {tick}, host {offset}: {}",
            b.kind,
            stderr(&out)
        );
    }
    let text = std::fs::read_to_string(&ran).unwrap_or_default();
    let mut ticks: Vec<u32> = text.lines().map(|l| l.parse().unwrap()).collect();
    ticks.sort();
    assert_eq!(
        ticks,
        (0..TICKS).collect::<Vec<_>>(),
        "[{}] each tick must run once (runs listed by tick)",
        b.kind
    );
}

/// [`once_per_is_once_per_cron_tick`] on the three backends at once: each
/// takes 40 s of cron ticks, mostly asleep; three tests of their own held
/// two of the harness's test threads for 80 s of the binary's run.
#[test]
fn once_per_is_once_per_cron_tick_on_every_backend() {
    std::thread::scope(|s| {
        let runs: Vec<_> = ["local", "postgres", "mysql"]
            .into_iter()
            .map(|kind| {
                (
                    kind,
                    s.spawn(move || once_per_is_once_per_cron_tick(&Backend::new(kind))),
                )
            })
            .collect();
        let failed: Vec<_> = runs
            .into_iter()
            .filter_map(|(kind, run)| run.join().is_err().then_some(kind))
            .collect();
        assert!(
            failed.is_empty(),
            "the cron ticks failed on {failed:?} (their panics above)"
        );
    });
}

/// A command that cannot start takes no lock and records no run: the next
/// host runs. A failed run is recorded with its status and fills its
/// window; `--reset-window` runs it again at once.
fn once_per_records_failures_truthfully(b: &Backend) {
    let name = b.name("once-fail");
    let once = |cmd: &[&str]| {
        let mut args = vec!["run", "--once-per", "1h", &name, "--"];
        args.extend_from_slice(cmd);
        b.run(&args)
    };
    let out = once(&["/nonexistent/command"]);
    assert_eq!(code(&out), 127, "[{}] {}", b.kind, stderr(&out));
    let last = |b: &Backend| {
        let out = b.run(&["status", "--json", &name]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["last_run"].clone()
    };
    assert!(
        last(b).is_null(),
        "[{}] a command never started is no run: {}",
        b.kind,
        last(b)
    );
    let out = once(&["sh", "-c", "exit 3"]);
    assert_eq!(code(&out), 3, "[{}] {}", b.kind, stderr(&out));
    let l = last(b);
    assert_eq!(
        (l["run"].as_u64(), l["exit_code"].as_i64()),
        (Some(1), Some(3)),
        "{l}"
    );
    assert!(l["finished_at"].is_string(), "{l}");
    let out = b.run(&["status", &name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("with exit status 3") && !text.contains("still running"),
        "{text}"
    );
    let out = once(&["true"]);
    assert_eq!(
        code(&out),
        75,
        "[{}] a failed run fills its window: {}",
        b.kind,
        stderr(&out)
    );
    let out = b.run(&["run", "--reset-window", &name, "--", "true"]);
    assert_eq!(
        code(&out),
        64,
        "--reset-window needs --once-per: {}",
        stderr(&out)
    );
    let out = b.run(&["run", "--once-per", "1h", "--reset-window", &name, "--", "true"]);
    assert_eq!(code(&out), 0, "[{}] {}", b.kind, stderr(&out));
    assert_eq!(last(b)["run"].as_u64(), Some(2));
    assert_eq!(
        code(&once(&["true"])),
        75,
        "[{}] the window counts from the reset",
        b.kind
    );
}

/// `--fence` exports `DBMUTEX_FENCE`, greater on each run; every run
/// exports `DBMUTEX_LOCK_NAME`, and an inherited `DBMUTEX_FENCE` does not
/// reach an unfenced command.
fn fence_is_exported(b: &Backend) {
    let name = b.name("fence");
    let show = "echo \"${DBMUTEX_FENCE-unset} $DBMUTEX_LOCK_NAME\"";
    let fenced = || {
        let out = b.run(&["run", "--fence", &name, "--", "sh", "-c", show]);
        assert_eq!(code(&out), 0, "[{}] {}", b.kind, stderr(&out));
        let text = String::from_utf8(out.stdout).unwrap();
        let (token, lock) = text.trim().split_once(' ').expect("token and name");
        assert_eq!(lock, name, "[{}] DBMUTEX_LOCK_NAME", b.kind);
        token
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("[{}] DBMUTEX_FENCE is not a token: {text:?}", b.kind))
    };
    let (first, second) = (fenced(), fenced());
    let out = b.run(&["run", "-v", "--fence", &name, "--", "true"]);
    assert!(
        stderr(&out).contains(&format!("(exclusive, fence {})", second + 1)),
        "[{}] -v names the token: {}",
        b.kind,
        stderr(&out)
    );
    assert!(
        second > first,
        "[{}] second run's token {second} > first's {first}",
        b.kind
    );
    let out = b
        .cmd(&["run", &name, "--", "sh", "-c", show])
        .env("DBMUTEX_FENCE", "999")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "[{}] {}", b.kind, stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        format!("unset {name}")
    );
    let out = b.run(&["run", "--fence", "-s", &name, "--", "true"]);
    assert_eq!(
        code(&out),
        64,
        "[{}] --fence with -s is a usage error: {}",
        b.kind,
        stderr(&out)
    );
}

/// `--int N` is the gem's `with_advisory_lock(N)`: a raw SQL lock on the key
/// the gem computes for N (PostgreSQL: `N & 0x7fffffff, prefix`; MySQL: the
/// decimal string) is refused while a CLI holder has `--int N`, and taken
/// once it is gone.
fn int_names_are_the_gems(b: &Backend) {
    // Above 2^31, so that the mask matters; unique to this test run.
    let n: i64 = (1 << 40) + i64::from(std::process::id()) * 1000 + i64::from(unique());
    let n_text = n.to_string();
    let gem_sql = |lock: &str| match b.kind {
        // The gem: pg_try_advisory_lock(stable_hashcode(n) & 0x7fffffff, prefix & 0x7fffffff).
        "postgres" => format!("SELECT pg_try_advisory_lock({}, 0)", n & 0x7fff_ffff),
        // The gem: GET_LOCK("#{prefix}#{n}", 0).
        _ => format!("SELECT GET_LOCK('{lock}', 0)"),
    };
    let (taken, refused) = match b.kind {
        "postgres" => ("t", "f"),
        _ => ("1", "0"),
    };
    // The sanity check first: free, the gem's lock is taken (and freed as
    // the SQL client's session ends).
    assert_eq!(b.sql(&gem_sql(&n_text)), taken);
    let mut holder = b.hold(&n_text, &["--int"], "exec sleep 30");
    assert_eq!(
        b.sql(&gem_sql(&n_text)),
        refused,
        "[{}] --int {n} is not the gem's lock",
        b.kind
    );
    let out = b.run(&["status", "--int", "--json", &n_text]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], n, "{v}");
    if b.kind == "postgres" {
        // The string name "N" is another lock (crc32 of its text).
        assert_eq!(code(&b.run(&["status", &n_text])), 0);
    }
    holder.signal(libc::SIGTERM);
    assert_eq!(code(&holder.finish()), 143);
    assert_eq!(b.sql(&gem_sql(&n_text)), taken);
}

// ---------------------------------------------------------------------------
// Backend-independent

#[test]
fn key_maps_names_on_each_backend() {
    let b = Backend::new("local");
    let out = b.run(&["key", "test"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The gem's vector: crc32("test") & 0x7fffffff = 1484750348.
    assert_eq!(lines[0], "postgres 1484750348 0");
    assert_eq!(lines[1], "mysql test");
    assert!(
        lines[2].starts_with("local test-") && lines[2].ends_with(".lock"),
        "{text}"
    );

    let v: serde_json::Value =
        serde_json::from_slice(&b.run(&["key", "--json", "--prefix", "7", "test"]).stdout).unwrap();
    assert_eq!(v["postgres"]["k1"], 1484750348);
    assert_eq!(v["postgres"]["k2"], 7);
    assert_eq!(v["mysql"], "7test");
    assert_eq!(v["prefix"], "7");

    let out = b
        .cmd(&["key", "--json", "test"])
        .env("WITH_ADVISORY_LOCK_PREFIX", "42")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["postgres"]["k2"], 42);
    assert_eq!(v["mysql"], "42test");

    let long = "n".repeat(300);
    let v: serde_json::Value = serde_json::from_slice(&b.run(&["key", "--json", &long]).stdout).unwrap();
    assert_eq!(v["mysql"].as_str().unwrap().chars().count(), 64);
}

#[test]
fn exit_table_is_in_help() {
    let out = Command::new(BIN).arg("run").arg("--help").output().unwrap();
    assert_eq!(code(&out), 0);
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--no-wait",
        "--timeout",
        "--shared",
        "--exclusive",
        "--conflict-exit-code",
        "--transaction",
        "--prefix",
        "--verbose",
        "--quiet",
        "--database-url",
        "--kill-after",
        "--require-database",
    ] {
        assert!(help.contains(flag), "run --help lacks {flag}");
    }
}

/// `dbmutex completions SHELL` for every shell clap_complete knows; bash's
/// script is valid bash and completes every subcommand.
#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(BIN).args(["completions", shell]).output().unwrap();
        assert_eq!(code(&out), 0, "{shell}: {}", stderr(&out));
        assert!(out.stderr.is_empty(), "{shell}: {}", stderr(&out));
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains("dbmutex"), "{shell}: {script}");
        for word in ["no-wait", "conflict-exit-code", "require-database"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let script = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap()
        .stdout;
    let path = std::env::temp_dir().join(format!("dbmutex-completion-{}.bash", std::process::id()));
    std::fs::write(&path, &script).unwrap();
    let check = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("run bash -n");
    let _ = std::fs::remove_file(&path);
    assert!(check.status.success(), "bash -n: {}", stderr(&check));
    // Sourced, it completes `dbmutex <TAB>` to the subcommands and
    // `dbmutex run --no<TAB>` to the flag.
    let complete = |words: &str, cword: u32| {
        let script_then = format!(
            "source /dev/stdin && COMP_WORDS=({words}) && COMP_CWORD={cword} && \
             _dbmutex dbmutex \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\" && \
             printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        let out = Command::new("bash")
            .args(["-c", &script_then])
            .stdin_bytes(&script);
        assert!(out.status.success(), "{words}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let subs = complete("dbmutex ''", 1);
    for sub in ["run", "status", "list", "key", "completions", "man", "help"] {
        assert!(
            subs.lines().any(|l| l == sub),
            "dbmutex <TAB> lacks {sub}: {subs}"
        );
    }
    assert_eq!(complete("dbmutex run --no", 2).trim(), "--no-wait");
    let bad = Command::new(BIN).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(code(&bad), 64, "{}", stderr(&bad));
}

/// `dbmutex man [COMMAND]`: roff that groff formats without a warning, with
/// the sections and subcommands, and the exit table in columns.
#[test]
fn man_pages_are_valid_roff() {
    for page in [None, Some("run"), Some("status"), Some("list"), Some("key")] {
        let mut args = vec!["man"];
        args.extend(page);
        let out = Command::new(BIN).args(&args).output().unwrap();
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        let roff = String::from_utf8(out.stdout).unwrap();
        let title = page.map_or("dbmutex".to_owned(), |p| format!("dbmutex-{p}"));
        assert!(roff.contains(&format!(".TH {title} 1 ")), "{args:?}: {roff}");
        for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS"] {
            assert!(roff.contains(section), "{args:?} lacks {section}");
        }
        assert!(roff.is_ascii(), "{args:?}: not ASCII");
        // -ww: all warnings; -z: no output, only the diagnostics.
        let groff = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .stdin_bytes(roff.as_bytes());
        assert!(groff.status.success(), "groff on {args:?}: {}", stderr(&groff));
        assert!(groff.stderr.is_empty(), "groff on {args:?}: {}", stderr(&groff));
    }
    let main = String::from_utf8(Command::new(BIN).arg("man").output().unwrap().stdout).unwrap();
    for sub in ["run", "status", "list", "key", "completions", "man"] {
        assert!(
            main.contains(&format!("dbmutex\\-{sub}(1)")),
            "dbmutex(1) lacks {sub}"
        );
    }
    let shown = Command::new("groff")
        .args(["-man", "-Tutf8", "-rLL=100n"])
        .stdin_bytes(main.as_bytes());
    let text = String::from_utf8_lossy(&shown.stdout).replace(['\u{2010}', '\u{2212}'], "-");
    assert!(
        text.contains("  75 (or -E N)   not acquired: -n conflict or -w timeout, or --once-per and not due;"),
        "{text}"
    );
    let run = String::from_utf8(Command::new(BIN).args(["man", "run"]).output().unwrap().stdout).unwrap();
    for flag in ["conflict\\-exit\\-code", "\\-\\-int", "\\-\\-timeout"] {
        assert!(run.contains(flag), "dbmutex-run(1) lacks {flag}");
    }
    let bad = Command::new(BIN).args(["man", "nosuch"]).output().unwrap();
    assert_eq!(code(&bad), 64, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("run, status"), "{}", stderr(&bad));
}

/// `help --help` is the help subcommand's help; `help CMD` is `CMD --help`.
#[test]
fn help_subcommand() {
    let out = Command::new(BIN).args(["help", "--help"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: dbmutex help"));
    for sub in [vec!["run"], vec!["status"], vec![]] {
        let mut help = vec!["help"];
        help.extend(&sub);
        let mut flag = sub.clone();
        flag.push("--help");
        let a = Command::new(BIN).args(&help).output().unwrap();
        let b = Command::new(BIN).args(&flag).output().unwrap();
        assert_eq!(code(&a), 0, "{help:?}: {}", stderr(&a));
        assert!(!a.stdout.is_empty());
        assert_eq!(a.stdout, b.stdout, "{help:?} differs from {flag:?}");
    }
    let out = Command::new(BIN).args(["help", "nosuch"]).output().unwrap();
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    let status = Command::new(BIN).args(["status", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    for row in ["  69 ", "  64 ", "  78 ", "{\"error\":{\"kind\""] {
        assert!(text.contains(row), "status --help lacks {row:?}: {text}");
    }
}

/// Each subcommand's own help and man page begin with the description
/// `dbmutex --help` lists for it. (Its arguments are built only when it is
/// used, clap's `defer`: a doc comment on a struct it flattens would then
/// replace that description.)
#[test]
fn each_subcommand_keeps_its_description() {
    let top = Command::new(BIN).arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    let listed: Vec<(&str, &str)> = top
        .split("Commands:\n")
        .nth(1)
        .expect("--help lists the commands")
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.trim_start().split_once(char::is_whitespace))
        .map(|(name, about)| (name, about.trim()))
        .collect();
    assert!(listed.len() >= 8, "commands listed: {listed:?}");
    for (name, about) in listed {
        let out = Command::new(BIN).args([name, "--help"]).output().unwrap();
        assert_eq!(code(&out), 0, "{name} --help: {}", stderr(&out));
        let first = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned();
        assert_eq!(first, about, "the first line of `{name} --help`");
        if name != "help" {
            let man = Command::new(BIN).args(["man", name]).output().unwrap();
            // roff writes each `-` as `\-`.
            let man = String::from_utf8_lossy(&man.stdout).replace("\\-", "-");
            assert!(
                man.contains(&format!("dbmutex-{name} - {about}")),
                "the man page of {name} names it {about:?}:\n{}",
                man.lines().take(12).collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// `key --int`: the gem's Integer mapping, negative numbers included; a
/// NAME that is not an integer is a usage error.
#[test]
fn key_takes_integer_names() {
    let b = Backend::new("local");
    let n: i64 = (1 << 40) | 42;
    let v = b.key_json_args(&["key", "--json", "--int", &n.to_string()]);
    assert_eq!(v["name"], n);
    assert_eq!(v["postgres"]["k1"], 42, "{v}");
    assert_eq!(v["postgres"]["k2"], 0, "{v}");
    assert_eq!(v["mysql"], n.to_string());
    let v = b.key_json_args(&["key", "--json", "--prefix", "7", "--int", "-1"]);
    assert_eq!(v["postgres"]["k1"], 0x7fff_ffff, "{v}");
    assert_eq!(v["postgres"]["k2"], 7, "{v}");
    assert_eq!(v["mysql"], "7-1");
    // Without --int, "42" is a string: crc32("42") & 0x7fffffff.
    let v = b.key_json_args(&["key", "--json", "42"]);
    assert_eq!(v["name"], "42");
    assert_eq!(v["postgres"]["k1"], 0x3224_b088_u32 & 0x7fff_ffff, "{v}");
    for bad in ["x", "1.5", "", "99999999999999999999"] {
        let out = b.run(&["key", "--int", bad]);
        assert_eq!(code(&out), 64, "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--int"), "{bad:?}: {}", stderr(&out));
    }
}

/// `status --json` with a URL that names no database: JSON error, exit 64.
#[test]
fn status_json_bad_url() {
    let b = Backend::new("local");
    let out = b.run(&[
        "--database-url",
        "redis://u:s3cret@127.0.0.1/0",
        "status",
        "--json",
        "x",
    ]);
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["error"]["kind"], "usage", "{v}");
    assert_eq!(v["error"]["exit"], 64, "{v}");
    assert!(!v.to_string().contains("s3cret"), "{v}");
    // Without --json, the same error is text on stderr, stdout untouched.
    let out = b.run(&["--database-url", "redis://u:s3cret@127.0.0.1/0", "status", "x"]);
    assert_eq!(code(&out), 64);
    assert!(out.stdout.is_empty());
    assert!(stderr(&out).starts_with("dbmutex: "), "{}", stderr(&out));
}

/// The binary where every user may run it: a copy in a world-readable
/// directory (the build's may be in a 0700 checkout, e.g. under /root),
/// removed on drop.
struct WorldBin(PathBuf);

impl WorldBin {
    fn new() -> WorldBin {
        use std::os::unix::fs::PermissionsExt;
        let dir = PathBuf::from(format!(
            "/tmp/dbmutex-cli-bin-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::copy(BIN, dir.join("dbmutex")).unwrap();
        std::fs::set_permissions(dir.join("dbmutex"), std::fs::Permissions::from_mode(0o755)).unwrap();
        WorldBin(dir)
    }
}

impl Drop for WorldBin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `dbmutex ARGS` as user `nobody` (`setpriv`, root only), in the
/// environment cron gives (`env -i`), with the default lock directory.
fn as_nobody(bin: &WorldBin, args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
    ])
    .arg(bin.0.join("dbmutex"))
    .args(args)
    .current_dir("/")
    .stdin(Stdio::null());
    c
}

/// Whether the tests run as root.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The local backend's default directory, as a test process can see it.
const DEFAULT_LOCK_DIR: &str = "/run/lock/dbmutex";

/// `dbmutex ARGS` with no lock directory or database chosen: the local
/// backend's host-wide default.
fn default_local(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("DBMUTEX_DATABASE_URL")
        .env_remove("DATABASE_URL")
        .env_remove("DBMUTEX_LOCK_DIR")
        .env_remove("DBMUTEX_REQUIRE_DATABASE")
        .env_remove("WITH_ADVISORY_LOCK_PREFIX")
        .stdin(Stdio::null());
    c
}

/// Removes this test's lock file from the shared default directory (unique
/// names: nobody else uses it), leaving the directory as it was.
struct RemoveDefaultLockFile(PathBuf);

impl Drop for RemoveDefaultLockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Without DBMUTEX_LOCK_DIR the local backend locks in one directory per
/// host: a holder started with one environment excludes `env -i` (as cron
/// runs jobs), other XDG_RUNTIME_DIR/HOME/TMPDIR values, and (when the
/// tests run as root) another user.
#[test]
fn default_lock_dir_is_one_per_host() {
    assert!(
        std::path::Path::new("/run/lock").is_dir(),
        "this test expects /run/lock (Debian); elsewhere the default differs"
    );
    let b = Backend::new("local");
    let name = b.name("default-dir");
    let key = b.key_json(&name);
    let file = PathBuf::from(DEFAULT_LOCK_DIR).join(key["local"].as_str().unwrap());
    let _cleanup = RemoveDefaultLockFile(file.clone());
    let started = b.marker("started");
    let a_env = b.marker("env-a");
    std::fs::create_dir_all(&a_env).unwrap();
    let holder = default_local(&[
        "run",
        &name,
        "--",
        "sh",
        "-c",
        &format!("touch '{}'; exec sleep 30", started.display()),
    ])
    .env("XDG_RUNTIME_DIR", &a_env)
    .env("HOME", &a_env)
    .env("TMPDIR", &a_env)
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut holder = Proc(Some(holder));
    assert!(
        eventually(Duration::from_secs(15), || started.exists()),
        "the holder never ran"
    );
    assert!(
        file.exists(),
        "the lock file is not in {DEFAULT_LOCK_DIR}: {}",
        file.display()
    );
    let mode = std::fs::symlink_metadata(DEFAULT_LOCK_DIR).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        mode.mode() & 0o7777,
        0o1777,
        "{DEFAULT_LOCK_DIR} is not sticky and shared"
    );

    let try_once = ["run", "-n", &name, "--", "true"];
    let world_bin = WorldBin::new();
    let mut cron_like = Command::new("env");
    cron_like.args(["-i", "PATH=/usr/bin:/bin", BIN]).args(try_once);
    let mut other_env = default_local(&try_once);
    other_env
        .env("XDG_RUNTIME_DIR", "/run/user/4242")
        .env("HOME", "/nonexistent")
        .env("TMPDIR", "/var/tmp");
    let mut cases = vec![
        ("env -i", cron_like),
        ("other XDG_RUNTIME_DIR/HOME/TMPDIR", other_env),
    ];
    if is_root() {
        cases.push(("another user (nobody)", as_nobody(&world_bin, &try_once)));
    } else {
        eprintln!("not root: the other-user case needs root to switch users");
    }
    for (what, mut c) in cases {
        let out = c.stdin(Stdio::null()).output().unwrap();
        assert_eq!(code(&out), 75, "{what} did not contend: {}", stderr(&out));
    }
    holder.signal(libc::SIGTERM);
    assert_eq!(code(&holder.finish()), 143);
    let out = Command::new("env")
        .args(["-i", "PATH=/usr/bin:/bin", BIN])
        .args(try_once)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "free after the release: {}", stderr(&out));
}

/// The host-wide directory serves every user: after root (umask 077, as
/// a strict cron might have) ran a name with `--once-per` and `--fence`,
/// `nobody` runs it too (it got exit 69, "cannot write ….lock.run"), and
/// root again after `nobody`.
#[test]
fn local_records_serve_every_user() {
    if !is_root() {
        eprintln!("not root: switching users needs root");
        return;
    }
    let b = Backend::new("local");
    let name = b.name("users");
    let key = b.key_json(&name);
    let file = PathBuf::from(DEFAULT_LOCK_DIR).join(key["local"].as_str().unwrap());
    let _cleanup: Vec<RemoveDefaultLockFile> = ["", ".run", ".fence", ".queue", ".run.tmp", ".fence.tmp"]
        .iter()
        .map(|s| RemoveDefaultLockFile(PathBuf::from(format!("{}{s}", file.display()))))
        .collect();
    let args = ["run", "--once-per", "1s", "--fence", &name, "--", "true"];
    let bin = WorldBin::new();
    let root_run = |mut c: Command| {
        let out = c
            .env_remove("DBMUTEX_DATABASE_URL")
            .env_remove("DATABASE_URL")
            .env_remove("DBMUTEX_LOCK_DIR")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "root: {}", stderr(&out));
    };
    let mut strict = Command::new("sh");
    strict
        .args(["-c", "umask 077; exec \"$@\"", "sh", BIN])
        .args(args);
    root_run(strict);
    std::thread::sleep(Duration::from_millis(1100));
    let out = as_nobody(&bin, &args).output().unwrap();
    assert_eq!(code(&out), 0, "nobody after root: {}", stderr(&out));
    let out = as_nobody(&bin, &["status", "--json", &name]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["last_run"]["run"].as_u64(),
        Some(2),
        "nobody's run is recorded: {v}"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let mut again = Command::new(BIN);
    again.args(args);
    root_run(again);
}

/// Every time option takes one grammar (`1.5`, `250ms`, `2s`, `1m`, `1h`);
/// `run --help` has the exit-status table and the cron recipe.
#[test]
fn time_options_share_one_grammar() {
    let b = Backend::new("local");
    let name = b.name("durations");
    for opts in [
        &["-w", "250ms", "--kill-after", "1.5", "--max-hold", "1m"][..],
        &["-w", "1.5", "--kill-after", "250ms", "--max-hold", "1h"],
        &[
            "-w",
            "2s",
            "--kill-after",
            "1m",
            "--max-hold",
            "2s",
            "--once-per",
            "250ms",
        ],
    ] {
        let mut args = vec!["run"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&[&name, "--", "true"]);
        let out = b.run(&args);
        assert_eq!(code(&out), 0, "{opts:?}: {}", stderr(&out));
    }
    for bad in ["-w", "--kill-after", "--max-hold", "--once-per"] {
        let out = b.run(&["run", bad, "1x", &name, "--", "true"]);
        assert_eq!(code(&out), 64, "{bad} 1x: {}", stderr(&out));
        assert!(
            stderr(&out).contains("250ms, 2s, 1m, 1h"),
            "{bad}: {}",
            stderr(&out)
        );
    }
    let out = b.run(&["run", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Exit status of `dbmutex run`",
        "75 (or -E N)",
        "69",
        "dbmutex init --database-url URL",
        "-n -E 0 --require-database --once-per",
    ] {
        assert!(help.contains(needle), "run --help lacks {needle:?}:\n{help}");
    }
}

/// `--json` errors are JSON on stdout for `key` and `list` too, with the
/// exit status of the text form; the command never sees the database URL.
#[test]
fn json_errors_and_the_childs_environment() {
    let b = Backend::new("postgres");
    let out = b.run(&["key", "--json", ""]);
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(
        (v["error"]["kind"].as_str(), v["error"]["exit"].as_i64()),
        (Some("invalid_name"), Some(64)),
        "{v}"
    );
    let out = b.run(&["--database-url", &b.dead_url(), "list", "--json"]);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["error"]["kind"], "connect", "{v}");
    assert!(!v.to_string().contains("s3cret"), "{v}");
    let out = b.run(&[
        "run",
        &b.name("env"),
        "--",
        "sh",
        "-c",
        "echo ${DBMUTEX_DATABASE_URL-unset}",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "unset");
}

/// `--require-database` / DBMUTEX_REQUIRE_DATABASE=1: no database URL is a
/// configuration error (78), and the command does not run.
#[test]
fn require_database_refuses_the_local_fallback() {
    let b = Backend::new("local");
    let name = b.name("require");
    let ran = b.marker("ran");
    let touch = format!("touch '{}'", ran.display());
    for (what, mut c) in [
        ("flag", b.cmd(&["--require-database", "run", &name, "-c", &touch])),
        (
            "flag after run",
            b.cmd(&["run", "--require-database", &name, "-c", &touch]),
        ),
        ("env", b.cmd(&["run", &name, "-c", &touch])),
        (
            "file:// URL",
            b.cmd(&["--database-url", "file:///tmp", "run", &name, "-c", &touch]),
        ),
    ] {
        if what != "flag" && what != "flag after run" {
            c.env("DBMUTEX_REQUIRE_DATABASE", "1");
        }
        let out = c.output().unwrap();
        assert_eq!(code(&out), 78, "{what}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("require-database"),
            "{what}: {}",
            stderr(&out)
        );
        assert!(!ran.exists(), "{what}: the command ran");
    }
    let for_status = b
        .cmd(&["status", &name])
        .env("DBMUTEX_REQUIRE_DATABASE", "yes")
        .output()
        .unwrap();
    assert_eq!(code(&for_status), 78, "{}", stderr(&for_status));
    let typo = b
        .cmd(&["run", &name, "--", "true"])
        .env("DBMUTEX_REQUIRE_DATABASE", "maybe")
        .output()
        .unwrap();
    assert_eq!(code(&typo), 64, "{}", stderr(&typo));
    let off = b
        .cmd(&["run", &name, "--", "true"])
        .env("DBMUTEX_REQUIRE_DATABASE", "0")
        .output()
        .unwrap();
    assert_eq!(code(&off), 0, "{}", stderr(&off));
    // With a database URL it runs.
    let pg = Backend::new("postgres");
    let out = pg
        .cmd(&["--require-database", "run", &pg.name("require"), "-c", &touch])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(ran.exists());
}

// ---------------------------------------------------------------------------
// One #[test] per backend and test

/// `backend_tests!([common tests...] backend: [extra tests...], ...)`
/// stamps out `backend::test` for every common and extra test.
macro_rules! backend_tests {
    (@one $kind:ident [$($common:ident),* $(,)?] [$($extra:ident),*]) => {
        mod $kind {
            $(
                #[test]
                fn $common() {
                    super::$common(&super::Backend::new(stringify!($kind)));
                }
            )*
            $(
                #[test]
                fn $extra() {
                    super::$extra(&super::Backend::new(stringify!($kind)));
                }
            )*
        }
    };
    ($common:tt $($kind:ident: [$($extra:ident),* $(,)?]),* $(,)?) => {
        $( backend_tests!(@one $kind $common [$($extra),*]); )*
    };
}

backend_tests! {
    [
        child_status_passes_through,
        conflict_exits_75_or_e,
        timeout_takes_fractions,
        waiter_takes_over_at_release,
        usage_errors_exit_64,
        unrunnable_commands_exit_126_127,
        signals_are_forwarded,
        signal_while_waiting_exits_128_plus_n,
        waiting_guardian_ends_with_the_wait,
        kill_9_frees_lock_and_stops_command,
        stdio_belongs_to_the_command,
        odd_names_are_locks,
        status_reports_holders,
        prefix_separates_locks,
        sigterm_reaches_the_grandchild,
        kill_9_stops_the_whole_tree,
        leftovers_stopped_before_release,
        verbose_repeats_the_waiting_line,
        conflict_exit_0_is_silent,
        fence_is_exported,
        init_prepares_fencing,
        lock_delay_closes_after_a_kill_9,
        max_hold_stops_the_command_exit_124,
        slots_cap_concurrent_runs,
        slots_refuse_another_count,
        once_per_runs_once_per_tick,
        once_per_records_failures_truthfully,
    ]
    postgres: [list_shows_held_locks, lock_loss_stops_command_exit_70, lock_loss_stops_the_whole_tree, unreachable_server_exits_69, shared_and_exclusive, transaction_lock, run_uses_one_connection, connect_error_says_its_cause_once, status_json_errors, int_names_are_the_gems],
    mysql: [missing_fence_table_exits_69, list_shows_held_locks_on_a_private_server, lock_loss_stops_command_exit_70, lock_loss_stops_the_whole_tree, unreachable_server_exits_69, unsupported_options_exit_64, connect_error_says_its_cause_once, status_json_errors, int_names_are_the_gems],
    local: [path_lookup_keeps_argv0_and_looks_again, list_shows_held_locks, terminal_belongs_to_the_command, job_control_works, shared_and_exclusive, unusable_lock_dir_exits_69, unsupported_options_exit_64, verbose_notice_rereads_the_holders],
}
