//! A fleet of real `dbmutex run` processes on private servers: waiting
//! costs the server one connection per process and leaves room for
//! everyone else; a holder that vanished behind a silent partition loses
//! its lock on the server within the documented bound (and learns of it
//! first); a waiter rides out a server restart.
//!
//! The partition tests run inside a private network namespace (`ip netns`,
//! loopback addresses only): the server listens on 127.0.0.1 and 127.0.0.2,
//! the holder connects through 127.0.0.2, and blackhole routing rules then
//! drop every packet to or from 127.0.0.2 without a reset, while the
//! contender reaches the server through 127.0.0.1.

#[path = "../../dbmutex/tests/common/netns.rs"]
mod netns;
#[path = "../../dbmutex/tests/common/pgbouncer.rs"]
mod pgbouncer;
#[path = "../../dbmutex/tests/common/private.rs"]
mod private;
#[path = "../../dbmutex/tests/common/private_mariadb.rs"]
mod private_mariadb;
#[path = "../../dbmutex/tests/common/private_pg.rs"]
mod private_pg;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use private_mariadb::PrivateMariaDb;
use private_pg::PrivatePg;

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");

fn dbmutex(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DBMUTEX_DATABASE_URL", url)
        .stdin(Stdio::null());
    c
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The two int4 keys of a string name (no prefix).
fn pg_keys(name: &str) -> (i32, i32) {
    match dbmutex::key::pg_key(&name.into(), &dbmutex::Prefix::from_env()) {
        dbmutex::key::PgKey::Pair(a, b) => (a, b),
        other => panic!("{other:?}"),
    }
}

async fn count(raw: &tokio_postgres::Client, sql: &str) -> i64 {
    raw.query_one(sql, &[]).await.unwrap().get(0)
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `WAITERS` `dbmutex run -w 240 NAME` processes waiting for one lock held
/// elsewhere, each running a command that fails if another is inside it.
struct Fleet {
    waiters: Vec<Child>,
    dir: std::path::PathBuf,
    name: &'static str,
}

const WAITERS: usize = 50;

/// One fleet at a time: two at once (PostgreSQL's and MariaDB's) would
/// put 100 processes on a 2-core machine and test its scheduler.
static ONE_FLEET: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Fleet {
    fn start(url: &str, name: &'static str) -> Fleet {
        let dir = tempfile_dir(name);
        let script = format!(
            "mkdir {d}/in || exit 99; sleep 0.02; rmdir {d}/in; echo x >> {d}/ran",
            d = dir.display()
        );
        let waiters = (0..WAITERS)
            .map(|_| {
                dbmutex(url)
                    .args(["run", "-w", "240", name, "--", "sh", "-c", &script])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        Fleet { waiters, dir, name }
    }

    /// The peak of `connections()`, sampled from the start until `queued()`
    /// says every waiter waits in the server and then on through the
    /// moment each says whom it waits for (1 s into its wait, plus margin).
    fn peak(&self, mut connections: impl FnMut() -> i64, mut queued: impl FnMut() -> bool) -> i64 {
        let until = Instant::now() + Duration::from_secs(90);
        let mut peak = 0;
        let mut queued_at = None;
        loop {
            peak = peak.max(connections());
            match queued_at {
                None if queued() => queued_at = Some(Instant::now()),
                None => assert!(Instant::now() < until, "not every waiter queued in the server"),
                Some(t) if t.elapsed() > Duration::from_millis(2500) => return peak,
                Some(_) => {}
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Once the lock is free: every waiter ran its command, one at a time,
    /// after a notice that named the holder.
    fn finish(mut self) {
        for (i, w) in self.waiters.iter_mut().enumerate() {
            let status =
                wait_exit(w, Duration::from_secs(120)).unwrap_or_else(|| panic!("waiter {i} never finished"));
            let mut err = String::new();
            if let Some(mut e) = w.stderr.take() {
                std::io::Read::read_to_string(&mut e, &mut err).unwrap();
            }
            assert!(status.success(), "waiter {i}: {status}, stderr: {err}");
            assert!(
                err.contains(&format!("dbmutex: waiting for lock {} (held by ", self.name)),
                "waiter {i}: {err}"
            );
        }
        let ran = std::fs::read_to_string(self.dir.join("ran")).unwrap();
        assert_eq!(
            ran.lines().count(),
            WAITERS,
            "every waiter ran its command once, never two at once"
        );
    }
}

/// 50 processes waiting for one name on a server with the default
/// `max_connections = 100` use at most 50 connections at any moment (one
/// each: the lock session waits in the server itself, and the waiting
/// notice's "held by" is read on it before the wait), an ordinary client
/// connects 10 of 10 times while they wait, and every waiter then gets the
/// lock in turn, one at a time.
#[test]
fn fifty_waiting_processes_leave_room_for_everyone_else() {
    fifty_waiters_on_postgres("fleet-fifty", PrivatePg::url);
}

/// The same through the server's Unix socket (cron on the database host):
/// the postmaster's socket is proven direct, so no start opens a second
/// connection for the pooler check (52–57 at peak when every start did).
#[cfg(target_os = "linux")]
#[test]
fn fifty_waiting_processes_over_a_unix_socket_keep_one_connection_each() {
    fifty_waiters_on_postgres("fleet-fifty-unix", |pg| pg.socket_url("dbmutex-cli"));
}

fn fifty_waiters_on_postgres(name: &'static str, url: impl Fn(&PrivatePg) -> String) {
    let _one = ONE_FLEET.lock().unwrap_or_else(|e| e.into_inner());
    let pg = PrivatePg::start(&[
        ("max_connections", "100"),
        ("superuser_reserved_connections", "3"),
    ]);
    let (k1, k2) = pg_keys(name);
    let rt = rt();
    let raw = rt.block_on(pg.raw());
    rt.block_on(raw.batch_execute("CREATE ROLE app LOGIN")).unwrap();
    rt.block_on(raw.execute("SELECT pg_advisory_lock($1, $2)", &[&k1, &k2]))
        .unwrap();
    let fleet = Fleet::start(&url(&pg), name);
    let waiting_sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'";
    let ours_sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dbmutex-cli'";
    let peak = fleet.peak(
        || rt.block_on(count(&raw, ours_sql)),
        || rt.block_on(count(&raw, waiting_sql)) >= WAITERS as i64,
    );
    println!("{WAITERS} waiting processes ({name}): at most {peak} server connections");
    assert!(
        peak <= WAITERS as i64,
        "{WAITERS} waiters took {peak} connections at once"
    );
    // An ordinary (non-superuser) client still gets in, every time.
    let app_url = pg.url().replace("postgres://postgres@", "postgres://app@");
    let mut connected = 0;
    for _ in 0..10 {
        if let Ok((c, conn)) = rt.block_on(tokio_postgres::connect(&app_url, tokio_postgres::NoTls)) {
            rt.spawn(conn);
            if rt.block_on(c.simple_query("SELECT 1")).is_ok() {
                connected += 1;
            }
        }
    }
    assert_eq!(
        connected, 10,
        "an ordinary client connects while {WAITERS} processes wait"
    );
    rt.block_on(raw.execute("SELECT pg_advisory_unlock($1, $2)", &[&k1, &k2]))
        .unwrap();
    fleet.finish();
}

/// The same fleet on MariaDB (`GET_LOCK` waits in the server too): at most
/// one connection per waiting process at any moment, notices included.
#[test]
fn fifty_waiting_processes_on_mariadb_keep_one_connection_each() {
    use mysql_async::prelude::Queryable;
    let _one = ONE_FLEET.lock().unwrap_or_else(|e| e.into_inner());
    let my = PrivateMariaDb::start(&[]);
    let name = "fleet-fifty-my";
    let rt = rt();
    let (raw, lock_name) = rt.block_on(hold_on_mariadb(&my, name));
    let fleet = Fleet::start(&my.url(), name);
    // Every client session but this one (the server's own threads show as
    // 'Daemon' or have no user session).
    let ours_sql = "SELECT count(*) FROM information_schema.processlist \
                    WHERE id <> CONNECTION_ID() AND command NOT IN ('Daemon', 'Binlog Dump') \
                    AND user <> 'system user'";
    let waiting_sql = "SELECT count(*) FROM information_schema.processlist WHERE state = 'User lock'";
    let raw = std::cell::RefCell::new(raw);
    let q = |sql: &str| -> i64 {
        rt.block_on(raw.borrow_mut().query_first::<i64, _>(sql))
            .unwrap()
            .unwrap_or(0)
    };
    let peak = fleet.peak(|| q(ours_sql), || q(waiting_sql) >= WAITERS as i64);
    println!("{WAITERS} waiting processes on MariaDB: at most {peak} server connections");
    assert!(
        peak <= WAITERS as i64,
        "{WAITERS} waiters took {peak} connections at once"
    );
    rt.block_on(
        raw.borrow_mut()
            .query_drop(format!("DO RELEASE_LOCK('{lock_name}')")),
    )
    .unwrap();
    fleet.finish();
}

/// A `dbmutex run -w WAIT NAME -- true` on a private PostgreSQL, started
/// while a raw client holds NAME: [`PgWaiter::start`] returns once it
/// waits in the server.
struct PgWaiter {
    rt: tokio::runtime::Runtime,
    raw: tokio_postgres::Client,
    keys: (i32, i32),
    child: Child,
}

impl PgWaiter {
    fn start(pg: &PrivatePg, name: &str, wait: &str) -> PgWaiter {
        let keys = pg_keys(name);
        let rt = rt();
        let raw = rt.block_on(pg.raw());
        rt.block_on(raw.execute("SELECT pg_advisory_lock($1, $2)", &[&keys.0, &keys.1]))
            .unwrap();
        let child = dbmutex(&pg.url())
            .args(["run", "-w", wait, name, "--", "true"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let waiting_sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'";
        let until = Instant::now() + Duration::from_secs(20);
        while rt.block_on(count(&raw, waiting_sql)) < 1 {
            assert!(Instant::now() < until, "the waiter never queued");
            std::thread::sleep(Duration::from_millis(20));
        }
        PgWaiter { rt, raw, keys, child }
    }

    /// The raw client lets the lock go.
    fn unlock(&self) {
        self.rt
            .block_on(
                self.raw
                    .execute("SELECT pg_advisory_unlock($1, $2)", &[&self.keys.0, &self.keys.1]),
            )
            .unwrap();
    }

    /// The waiter's exit, which must be a success within `within`, and its
    /// stderr.
    fn succeeds(mut self, within: Duration) -> String {
        let status = wait_exit(&mut self.child, within).expect("the waiter finishes");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(status.success(), "{status}: {err}");
        err
    }
}

/// A waiter whose server restarts keeps waiting (reconnecting) until its
/// own bound, and gets the lock once the server is back and the lock free.
#[test]
fn a_waiter_rides_out_a_server_restart() {
    let pg = PrivatePg::start(&[]);
    let waiter = PgWaiter::start(&pg, "fleet-restart", "60");
    // The restart ends every session: the raw holder's lock goes with it.
    pg.restart();
    waiter.succeeds(Duration::from_secs(30));
}

/// A contended `dbmutex run` with a notice to give reads who holds the
/// lock before it waits: it tries once, reads, and then waits in the
/// server at once, without a second try (the server's statement log, one
/// line per statement, says which statements its session ran).
#[test]
fn a_contended_run_tries_once_then_waits() {
    let pg = PrivatePg::start(&[("log_statement", "'all'"), ("log_line_prefix", "'%a|'")]);
    let name = "fleet-one-try";
    let waiter = PgWaiter::start(&pg, name, "30");
    // Past the first notice, which names the holder read before the wait.
    std::thread::sleep(Duration::from_millis(1300));
    waiter.unlock();
    let err = waiter.succeeds(Duration::from_secs(20));
    assert!(
        err.contains(&format!("waiting for lock {name} (held by ")),
        "{err}"
    );
    let log = pg.log();
    let ours: Vec<&str> = log.lines().filter(|l| l.starts_with("dbmutex-cli|")).collect();
    let tries = ours
        .iter()
        .filter(|l| l.contains("pg_try_advisory_lock("))
        .count();
    let waits = ours.iter().filter(|l| l.contains("pg_advisory_lock(")).count();
    assert_eq!(
        (tries, waits),
        (1, 1),
        "one try, then one wait; the session ran:\n{}",
        ours.join("\n")
    );
}

/// A MariaDB restart while a process waits: the waiter reconnects and
/// waits on until its own bound, and gets the lock once the server is back
/// (the restart ended the raw holder's session, and its lock).
#[test]
fn a_waiter_rides_out_a_mariadb_restart() {
    use mysql_async::prelude::Queryable;
    let my = PrivateMariaDb::start(&[]);
    let name = "fleet-restart-my";
    let rt = rt();
    let (mut raw, _) = rt.block_on(hold_on_mariadb(&my, name));
    let mut waiter = dbmutex(&my.url())
        .args(["run", "-w", "60", name, "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waiting_sql = "SELECT count(*) FROM information_schema.processlist WHERE state = 'User lock'";
    let until = Instant::now() + Duration::from_secs(20);
    while rt.block_on(raw.query_first::<i64, _>(waiting_sql)).unwrap() < Some(1) {
        assert!(Instant::now() < until, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The holder's session stays open until the restart ends it.
    let restarted = Instant::now();
    my.restart();
    drop(raw);
    let status =
        wait_exit(&mut waiter, Duration::from_secs(40)).expect("the waiter finishes after the restart");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err).unwrap();
    println!(
        "mariadb restart: the waiter got the lock {:?} after the restart began",
        restarted.elapsed()
    );
    assert!(status.success(), "{status}: {err}");
    // The library's warning reaches the user, once.
    assert_eq!(
        err.matches("dbmutex: lost the server while waiting; reconnecting until the wait's bound")
            .count(),
        1,
        "{err}"
    );
}

/// Behind a PgBouncer whose every server session is taken, a new
/// connection queues in the pooler. `run -w 30` waits there within its own
/// bound (not the 5 s connect timeout) and gets the lock once a session
/// frees; `-w` counts the connect too.
#[test]
fn a_waiter_queued_in_pgbouncer_waits_within_its_own_bound() {
    // Multi-threaded: the raw clients' connections must close when dropped
    // while the test thread sleeps.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bouncer = rt.block_on(pgbouncer::PgBouncer::start("session"));
    // Both server sessions of the pool, held for 8 s by raw clients.
    let a = rt.block_on(bouncer.raw());
    let b = rt.block_on(bouncer.raw());
    rt.block_on(a.simple_query("SELECT 1")).unwrap();
    rt.block_on(b.simple_query("SELECT 1")).unwrap();
    let started = Instant::now();
    let mut waiter = dbmutex(&bouncer.url())
        .args(["run", "-w", "30", "fleet-pooler-queue", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the waiter gave up while queued in the pooler"
    );
    drop((a, b));
    let status = wait_exit(&mut waiter, Duration::from_secs(30)).expect("the waiter finishes");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err).unwrap();
    println!(
        "pgbouncer queue: the waiter finished after {:?}",
        started.elapsed()
    );
    assert!(status.success(), "{status}: {err}\n{}", bouncer.log());
    // And -w still bounds it: with the pool taken for good, -w 6 gives up
    // within about its bound, not at an hour.
    let a = rt.block_on(bouncer.raw());
    let b = rt.block_on(bouncer.raw());
    rt.block_on(a.simple_query("SELECT 1")).unwrap();
    rt.block_on(b.simple_query("SELECT 1")).unwrap();
    let started = Instant::now();
    let out = dbmutex(&bouncer.url())
        .args(["run", "-w", "6", "fleet-pooler-queue", "--", "true"])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(12),
        "-w 6 took {took:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// For the PgBouncer helper: a name unique to this process and call.
fn unique(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t-{tag}-{}-{n}", std::process::id())
}

/// A raw session on `my` holding `name` (`GET_LOCK`), and the lock's
/// string there.
async fn hold_on_mariadb(my: &PrivateMariaDb, name: &str) -> (mysql_async::Conn, String) {
    use mysql_async::prelude::Queryable;
    let mut raw = my.raw().await;
    let lock_name = dbmutex::key::mysql_lock_string(&name.into(), &dbmutex::Prefix::from_env()).unwrap();
    let got: Option<i64> = raw
        .query_first(format!("SELECT GET_LOCK('{lock_name}', 0)"))
        .await
        .unwrap();
    assert_eq!(got, Some(1));
    (raw, lock_name)
}

fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dbmutex-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `dbmutex run` holding `name` for two minutes, returned once its
/// command has started.
fn start_holder(url: &str, name: &str, dir: &std::path::Path) -> Child {
    let marker = dir.join("holding");
    let holder = dbmutex(url)
        .args(["run", name, "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 120", marker.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(Instant::now() < until, "the holder never started its command");
        std::thread::sleep(Duration::from_millis(20));
    }
    holder
}

/// The partition scenario on one server: a holder through 127.0.0.2 is cut
/// off; it is told first (exit 70, its command stopped), then the server
/// frees the lock and a contender through 127.0.0.1 gets it — within the
/// default bound (10 s) of the cut, plus the contender's own start.
fn partitioned_holder(holder_url: &str, contender_url: &str, name: &str) {
    let dir = tempfile_dir("fleet-partition");
    let mut holder = start_holder(holder_url, name, &dir);
    // Let the holder settle into its keepalive rhythm.
    std::thread::sleep(Duration::from_millis(500));
    netns::partition();
    let cut = Instant::now();
    let got = dir.join("got");
    let mut contender = dbmutex(contender_url)
        .args(["run", "-w", "60", name, "--", "sh", "-c"])
        .arg(format!("touch {}", got.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let holder_status = wait_exit(&mut holder, Duration::from_secs(30)).expect("the holder is told");
    let told = cut.elapsed();
    let status = wait_exit(&mut contender, Duration::from_secs(60)).expect("the contender gets in");
    let freed = cut.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut contender.stderr.take().unwrap(), &mut err).unwrap();
    println!("holder told after {told:?} ({holder_status}); contender in after {freed:?}");
    assert_eq!(holder_status.code(), Some(70), "the holder reports the loss");
    assert!(status.success(), "contender: {status}: {err}");
    assert!(got.exists());
    assert!(
        told < freed,
        "the holder is told before the server frees the lock"
    );
    assert!(told < Duration::from_secs(5), "holder bound: {told:?}");
    assert!(freed < Duration::from_secs(20), "server bound: {freed:?}");
}

#[test]
fn a_partitioned_holder_loses_its_lock_on_the_postgres_server() {
    if !netns::inside() {
        return netns::in_netns("a_partitioned_holder_loses_its_lock_on_the_postgres_server");
    }
    let pg = PrivatePg::start(&[("listen_addresses", "'127.0.0.1,127.0.0.2'")]);
    let holder_url = pg.url().replace("@127.0.0.1:", "@127.0.0.2:");
    partitioned_holder(&holder_url, &pg.url(), "fleet-partition-pg");
}

/// The same behind NAT: the server sees the holder's connection come from
/// another port than its own (rewritten to 50000–50999, as a NAT does when
/// ports clash; the private server trusts only 127.0.0.1, so the address
/// stays), so the connection is not proven direct
/// (`direct.rs`); the locker's pooler check finds no pooler, and only then
/// is the server asked to watch the session. Without that, a NAT'd holder
/// cut off would keep its lock for the kernel's two hours.
#[test]
fn a_partitioned_holder_behind_nat_loses_its_lock_on_the_postgres_server() {
    if !netns::inside() {
        return netns::in_netns("a_partitioned_holder_behind_nat_loses_its_lock_on_the_postgres_server");
    }
    let pg = PrivatePg::start(&[("listen_addresses", "'127.0.0.1,127.0.0.2'")]);
    netns::snat(("127.0.0.2", pg.port()), "127.0.0.1:50000-50999");
    let holder_url = pg.url().replace("@127.0.0.1:", "@127.0.0.2:");
    partitioned_holder(&holder_url, &pg.url(), "fleet-partition-pg-nat");
}

#[test]
fn a_partitioned_holder_loses_its_lock_on_the_mariadb_server() {
    if !netns::inside() {
        return netns::in_netns("a_partitioned_holder_loses_its_lock_on_the_mariadb_server");
    }
    let my = PrivateMariaDb::start(&["--bind-address=0.0.0.0"]);
    let holder_url = my.url().replace("@127.0.0.1:", "@127.0.0.2:");
    partitioned_holder(&holder_url, &my.url(), "fleet-partition-my");
}

/// A frozen holder (SIGSTOP: its kernel still answers TCP, so keepalives
/// alone never fire) loses its lock on the server within the bound, a
/// contender gets in, and once thawed the holder reports the loss (exit 70)
/// instead of going on as if it held the lock.
fn frozen_holder(url: &str, name: &str) {
    let dir = tempfile_dir(&format!("fleet-frozen-{name}"));
    let mut holder = start_holder(url, name, &dir);
    let pid = holder.id() as i32;
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let frozen = Instant::now();
    let mut contender = dbmutex(url)
        .args(["run", "-w", "60", name, "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut contender, Duration::from_secs(60)).expect("the contender gets in");
    let freed = frozen.elapsed();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let holder_status = wait_exit(&mut holder, Duration::from_secs(30)).expect("the thawed holder stops");
    println!("{name}: contender in {freed:?} after the freeze; thawed holder: {holder_status}");
    assert!(status.success(), "contender: {status}");
    assert!(freed < Duration::from_secs(20), "server bound: {freed:?}");
    assert_eq!(
        holder_status.code(),
        Some(70),
        "the thawed holder reports the loss"
    );
}

#[test]
fn a_frozen_holder_loses_its_lock_on_the_postgres_server() {
    let pg = PrivatePg::start(&[]);
    frozen_holder(&pg.url(), "fleet-frozen-pg");
}

#[test]
fn a_frozen_holder_loses_its_lock_on_the_mariadb_server() {
    let my = PrivateMariaDb::start(&[]);
    frozen_holder(&my.url(), "fleet-frozen-my");
}
