//! Private MariaDB servers, for tests that need special settings on MySQL
//! (a plugin installed or not, say) or would disturb the shared server.
//!
//! ```ignore
//! let my = PrivateMariaDb::start(&["--plugin-load-add=metadata_lock_info"]);
//! let locker = Locker::builder(&my.url()).connect().await?;
//! let raw = my.raw().await;            // mysql_async connection, database `test`
//! ```
//!
//! `start` runs `mariadb-install-db` into a fresh
//! `$TMPDIR/dbmutex-private-mariadb-<pid>-<n>/` (grant tables with a
//! password-less root, as the shared test server has), then `mariadbd` on a
//! free 127.0.0.1 port with its socket in that directory, small buffers, no
//! binary log, name resolution off, and the caller's options (which win);
//! waits until it answers and creates database `test`. As root the server
//! runs as the `mysql` OS user (`--user=mysql`). Stopped with `kill -9` and
//! its directory removed on drop, at exit of the test process, or by the
//! watchdog if the test process is killed (see `private.rs`). Programs
//! come from `DBMUTEX_MARIADB_BINDIR`, else `PATH` and `/usr/sbin`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::private::{free_port, is_root, run, user_ids, Instance};

/// The prefix of every private instance's directory under `$TMPDIR`.
pub const DIR_PREFIX: &str = "dbmutex-private-mariadb-";

/// A MariaDB server of this test process, on 127.0.0.1.
pub struct PrivateMariaDb {
    instance: Instance,
    port: u16,
    server: Mutex<Option<Child>>,
    /// The extra `mariadbd` options, for a restart.
    options: Vec<String>,
}

fn program(name: &str) -> PathBuf {
    if let Ok(d) = std::env::var("DBMUTEX_MARIADB_BINDIR") {
        return PathBuf::from(d).join(name);
    }
    let sbin = PathBuf::from("/usr/sbin").join(name);
    if sbin.exists() {
        sbin
    } else {
        PathBuf::from(name)
    }
}

/// Shell code that stops the server whose instance directory is `$1`.
const STOP_SH: &str = "if [ -f \"$1/pid\" ]; then kill -9 \"$(cat \"$1/pid\")\" 2>/dev/null; fi";

impl PrivateMariaDb {
    /// Starts a private server with extra `mariadbd` options (e.g.
    /// `"--plugin-load-add=metadata_lock_info"`), waits until it answers and
    /// has a database `test`. Panics with the server log when it cannot.
    pub fn start(options: &[&str]) -> PrivateMariaDb {
        let instance = Instance::create(DIR_PREFIX, STOP_SH.to_owned(), "mysql");
        let dir = instance.dir().to_owned();
        let mut my = PrivateMariaDb {
            instance,
            port: 0,
            server: Mutex::new(None),
            options: options.iter().map(|o| o.to_string()).collect(),
        };
        // A temporary directory of its own: two servers bootstrapping at
        // once in one `/tmp` failed now and then ("Could not remove
        // temporary table '/tmp/#sql-temptable-…'", then "Installation of
        // system tables failed"), twice in six runs of tests/passwords.rs.
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).expect("create the private server's tmpdir");
        if is_root() {
            let (uid, gid) = user_ids("mysql");
            std::os::unix::fs::chown(&tmp, Some(uid), Some(gid)).expect("chown the private server's tmpdir");
        }
        let mut install = Command::new(program("mariadb-install-db"));
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if is_root() {
            install.arg("--user=mysql");
        }
        run(install, "mariadb-install-db", String::new);
        for attempt in 1..=5 {
            my.port = free_port();
            match my.spawn_server() {
                Ok(()) => break,
                Err(status) => {
                    let log = my.log();
                    let port_taken =
                        log.contains("Address already in use") || log.contains("Can't start server");
                    assert!(
                        port_taken && attempt < 5,
                        "private MariaDB did not start ({status}); its log:\n{log}"
                    );
                }
            }
        }
        let mut create = my.client();
        create.args(["-e", "CREATE DATABASE test"]);
        run(create, "CREATE DATABASE test", || my.log());
        my
    }

    /// Starts `mariadbd` on `self.port` and waits until it answers (Ok) or
    /// exits (Err, its status).
    fn spawn_server(&self) -> Result<(), String> {
        let dir = self.instance.dir();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log"))
            .unwrap();
        let mut cmd = Command::new(program("mariadbd"));
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
                "--innodb-log-file-size=4M",
                "--max-connections=200",
            ])
            .args(&self.options);
        if is_root() {
            cmd.arg("--user=mysql");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start mariadbd ({cmd:?}): {e}"));
        *self.server.lock().unwrap() = Some(child);
        self.wait_until_up()
    }

    /// Stops the server cleanly (SIGTERM: every session ends, as in a
    /// restart by the service manager) and starts it again on the same
    /// port, with the same options. Panics when it does not come back.
    pub fn restart(&self) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
        if let Err(status) = self.spawn_server() {
            panic!(
                "private MariaDB did not restart ({status}); its log:\n{}",
                self.log()
            );
        }
    }

    /// The `mariadb` client, as root, through this server's own Unix
    /// socket: never through the TCP port, which was only free when
    /// [`free_port`] looked. Another test's server that won the port would
    /// answer `SELECT 1` there while ours exits on "Address already in
    /// use", and `CREATE DATABASE test` would then fail on it ("database
    /// exists"). MariaDB binds its TCP port before it creates the socket
    /// and stops if the bind fails, so the socket answering means the port
    /// is ours as well.
    fn client(&self) -> Command {
        let mut cmd = Command::new("mariadb");
        cmd.args(["--no-defaults", "-u", "root"])
            .arg(format!("--socket={}", self.socket().display()));
        cmd
    }

    /// Polls with the `mariadb` client until the server answers (Ok), or
    /// the server process exits (Err, its status) or 120 s pass (panic).
    fn wait_until_up(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ok = self
                .client()
                .args(["-e", "SELECT 1"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if let Some(child) = self.server.lock().unwrap().as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(status.to_string());
                }
            }
            assert!(
                Instant::now() < deadline,
                "private MariaDB did not answer within 120 s; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `mysql://root@127.0.0.1:<port>/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's Unix socket.
    pub fn socket(&self) -> std::path::PathBuf {
        self.instance.dir().join("sock")
    }

    /// The server log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.instance.dir().join("log")).unwrap_or_default()
    }

    /// A raw mysql_async connection (no dbmutex logic) to database `test`.
    pub async fn raw(&self) -> mysql_async::Conn {
        let opts = mysql_async::Opts::from_url(&self.url()).unwrap();
        mysql_async::Conn::new(opts)
            .await
            .unwrap_or_else(|e| panic!("connect to the private MariaDB: {e}\nits log:\n{}", self.log()))
    }

    /// Kills the server (`kill -9`) and removes its directory. Idempotent;
    /// also what drop does.
    pub fn stop(&self) {
        self.instance.stop();
        if let Some(mut child) = self.server.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.stop();
    }
}
