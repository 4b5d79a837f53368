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
//! How it is stopped (`pg_ctl stop -m immediate`, directory removed),
//! whatever happens to the test process: `Drop` for a test's own instance,
//! an `atexit` hook for shared ones, and a watchdog plus a sweep of stale
//! directories for a test process that was killed (see `private.rs`).
//!
//! `pg.start_standby()` makes a streaming standby of a server started with
//! `PRIMARY` among its settings (`pg_basebackup -R`), for failover tests:
//! `promote()` it, `shut_down()` the primary or `restart_as_standby()`.
//!
//! `PrivatePg::start_tls(settings)` also turns TLS on (`ssl = on`, a
//! self-signed certificate for 127.0.0.1 made with `openssl`), for tests of
//! `sslmode`: the shared server need not offer TLS.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use super::private::{atexit, free_port, is_root, run, user_ids, Instance};

/// The settings of a primary that [`PrivatePg::start_standby`] can copy.
pub const PRIMARY: &[(&str, &str)] = &[("wal_level", "replica"), ("max_wal_senders", "4")];

/// The prefix of every private instance's directory under `$TMPDIR`
/// (`scripts/chaos.sh` uses it too, so the sweep covers its servers).
pub const DIR_PREFIX: &str = "dbmutex-private-pg-";

/// A PostgreSQL server of this test process, on 127.0.0.1.
pub struct PrivatePg {
    instance: Instance,
    port: u16,
    bindir: PathBuf,
    settings: Vec<(String, String)>,
    tls: bool,
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

/// Shell code that stops the server whose instance directory is `$1`.
fn stop_sh(bindir: &Path) -> String {
    let as_postgres = if is_root() { "runuser -u postgres -- " } else { "" };
    format!(
        "if [ -f \"$1/data/postmaster.pid\" ]; then {as_postgres}'{}' -D \"$1/data\" -m immediate -w -t 30 stop >/dev/null 2>&1; fi",
        bindir.join("pg_ctl").display()
    )
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
        Self::start_with(settings, false)
    }

    /// As [`PrivatePg::start`], with TLS on: `ssl = on` and a self-signed
    /// certificate for 127.0.0.1 (`openssl req -x509`), so `sslmode=require`
    /// connects encrypted and `verify-full` fails (unknown issuer).
    pub fn start_tls(settings: &[(&str, &str)]) -> PrivatePg {
        Self::start_with(settings, true)
    }

    fn start_with(settings: &[(&str, &str)], tls: bool) -> PrivatePg {
        let bindir = bindir();
        // The watchdog first: from here on the directory goes away with us.
        let instance = Instance::create(DIR_PREFIX, stop_sh(&bindir), "postgres");
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut pg = PrivatePg {
            instance,
            port: 0,
            bindir,
            settings,
            tls,
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
        let mut extra = String::new();
        if tls {
            let (crt, key) = (pg.dir().join("server.crt"), pg.dir().join("server.key"));
            let mut req = Command::new("openssl");
            req.args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"])
                .args(["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&crt);
            run(req, "openssl req (a self-signed certificate)", String::new);
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            if is_root() {
                let (uid, gid) = user_ids("postgres");
                for f in [&crt, &key] {
                    std::os::unix::fs::chown(f, Some(uid), Some(gid)).unwrap();
                }
            }
            extra = format!(
                "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                crt.display(),
                key.display()
            );
        }
        pg.start_on_a_free_port(&extra);
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

    /// Appends the harness's settings (a free port, then the caller's) to
    /// the data directory's `postgresql.conf` and starts the server. A free
    /// port can be taken by someone else before the server binds it: tries a
    /// few.
    fn start_on_a_free_port(&mut self, extra: &str) {
        let conf = std::fs::read_to_string(self.data().join("postgresql.conf")).unwrap();
        for attempt in 1..=5 {
            self.port = free_port();
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
                     logging_collector = off\n\
                     {extra}",
                self.port,
                self.dir().display()
            ));
            for (k, v) in &self.settings {
                text.push_str(&format!("{k} = {v}\n"));
            }
            std::fs::write(self.data().join("postgresql.conf"), text).unwrap();
            let out = self
                .pg_ctl()
                .args(["-w", "-t", "120", "start"])
                .stdin(Stdio::null())
                .output()
                .expect("run pg_ctl start");
            if out.status.success() {
                break;
            }
            let log = self.log();
            let port_taken = log.contains("could not bind") || log.contains("Address already in use");
            assert!(
                port_taken && attempt < 5,
                "private PostgreSQL did not start ({}): {}{}\nserver log:\n{log}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
        }
    }

    /// Starts a streaming standby of this server, which must have been
    /// started with [`PRIMARY`] among its settings: `pg_basebackup -R -X
    /// stream` (asynchronous replication, `primary_conninfo` in the copy's
    /// `postgresql.auto.conf`) into a directory of its own, then a hot
    /// standby on a free port, with this server's settings. Stopped (and
    /// its directory removed) on drop, like any private server. Blocking.
    pub fn start_standby(&self) -> PrivatePg {
        let instance = Instance::create(DIR_PREFIX, stop_sh(&self.bindir), "postgres");
        let mut standby = PrivatePg {
            instance,
            port: 0,
            bindir: self.bindir.clone(),
            settings: self.settings.clone(),
            tls: self.tls,
        };
        let mut copy = pg_command(&self.bindir, "pg_basebackup");
        copy.arg("-D")
            .arg(standby.data())
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ])
            .arg("-p")
            .arg(self.port.to_string())
            .env("PGSSLMODE", "disable");
        run(copy, "pg_basebackup", || self.log());
        standby.start_on_a_free_port("");
        standby
    }

    /// Promotes this standby (`pg_ctl promote`, which waits until the
    /// server leaves recovery). Blocking.
    pub fn promote(&self) {
        let mut c = self.pg_ctl();
        c.args(["-w", "-t", "120", "promote"]);
        run(c, "pg_ctl promote", || self.log());
    }

    /// Replaces the server's `pg_hba.conf` with `rules` and has it reload
    /// (`pg_ctl reload`: new connections follow the rules a moment later).
    pub fn set_hba(&self, rules: &str) {
        std::fs::write(self.data().join("pg_hba.conf"), rules).unwrap();
        let mut c = self.pg_ctl();
        c.arg("reload");
        run(c, "pg_ctl reload", || self.log());
    }

    /// Stops the server cleanly (`pg_ctl stop -m fast`), keeping its
    /// directory (removed on drop). Blocking.
    pub fn shut_down(&self) {
        let mut c = self.pg_ctl();
        c.args(["-m", "fast", "-w", "-t", "120", "stop"]);
        run(c, "pg_ctl stop", || self.log());
    }

    /// Demotes this server as a failover manager does an old primary:
    /// stops it (`-m fast`: its sessions are ended), adds `standby.signal`
    /// and starts it again, a hot standby (of no one). Blocking.
    pub fn restart_as_standby(&self) {
        self.shut_down();
        let signal = self.data().join("standby.signal");
        std::fs::write(&signal, "").unwrap();
        if is_root() {
            let (uid, gid) = user_ids("postgres");
            std::os::unix::fs::chown(&signal, Some(uid), Some(gid)).unwrap();
        }
        let mut c = self.pg_ctl();
        c.args(["-w", "-t", "120", "start"]);
        run(c, "pg_ctl start (as a standby)", || self.log());
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
        if let Some(pg) = shared.iter().find(|pg| pg.settings == want && !pg.tls) {
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

    /// `postgres://postgres@127.0.0.1:<port>/test?sslmode=disable`
    /// (`sslmode=prefer` for a TLS instance; set another `sslmode` by
    /// replacing it).
    /// The URL of database `test` through the server's Unix socket (in
    /// its own directory), with `application_name` = `app`.
    pub fn socket_url(&self, app: &str) -> String {
        let dir = self.dir().display().to_string().replace('/', "%2F");
        format!(
            "postgres://postgres@{dir}:{}/test?application_name={app}",
            self.port
        )
    }

    pub fn url(&self) -> String {
        let mode = if self.tls { "prefer" } else { "disable" };
        format!("postgres://postgres@127.0.0.1:{}/test?sslmode={mode}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The instance's directory (data directory in `data/`, log in `log`).
    pub fn dir(&self) -> &Path {
        self.instance.dir()
    }

    fn data(&self) -> PathBuf {
        self.dir().join("data")
    }

    /// The server log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("log")).unwrap_or_default()
    }

    fn pg_ctl(&self) -> Command {
        let mut c = pg_command(&self.bindir, "pg_ctl");
        c.arg("-D").arg(self.data()).arg("-l").arg(self.dir().join("log"));
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

    /// How many advisory locks this server has granted, to anyone.
    pub async fn granted_advisory_locks(&self) -> i64 {
        self.raw()
            .await
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Restarts the server (`pg_ctl restart -m fast`: sessions are ended)
    /// and waits until it answers again. Blocking.
    pub fn restart(&self) {
        let mut c = self.pg_ctl();
        c.args(["-m", "fast", "-w", "-t", "120", "restart"]);
        run(c, "pg_ctl restart", || self.log());
    }

    /// Restarts the server as after a crash (`pg_ctl restart -m
    /// immediate`: no checkpoint, recovery from the WAL on start) and waits
    /// until it answers again. Blocking.
    pub fn crash_restart(&self) {
        let mut c = self.pg_ctl();
        c.args(["-m", "immediate", "-w", "-t", "120", "restart"]);
        run(c, "pg_ctl restart -m immediate", || self.log());
    }

    /// Stops the server at once (`-m immediate`, as a crash would) and
    /// removes its directory. Idempotent; also what drop does.
    pub fn stop(&self) {
        self.instance.stop();
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        self.stop();
    }
}
