//! A PgBouncer of the test's own (issue #6): `pgbouncer` on a free loopback
//! port in front of the shared test database, started by the test and
//! killed when it ends, pass or fail (`tests/pgbouncer.rs`,
//! `tests/pooler_reset.rs`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::private::is_root;
use super::unique;

/// A pgbouncer process of this test; killed on drop.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Starts pgbouncer with `pool_mode` and two server sessions per pool,
    /// and waits until it answers. Panics (with its log) when it cannot.
    pub async fn start(pool_mode: &str) -> PgBouncer {
        Self::start_with(pool_mode, 2, false).await
    }

    /// Starts pgbouncer with `pool_mode`, `pool` server sessions per pool
    /// and, with `round_robin`, `server_round_robin = 1` (else PgBouncer
    /// reuses the most recently released server session first).
    pub async fn start_with(pool_mode: &str, pool: usize, round_robin: bool) -> PgBouncer {
        Self::start_configured(pool_mode, pool, round_robin, "").await
    }

    /// As [`PgBouncer::start_with`], with `extra` (lines of `key = value`)
    /// appended to the `[pgbouncer]` section, e.g. a `server_reset_query`.
    pub async fn start_configured(pool_mode: &str, pool: usize, round_robin: bool, extra: &str) -> PgBouncer {
        Self::start_in_front_of(("127.0.0.1", 5432), pool_mode, pool, round_robin, extra).await
    }

    /// As [`PgBouncer::start_configured`], in front of the server at
    /// `server` (host and port) in place of the shared test server.
    pub async fn start_in_front_of(
        server: (&str, u16),
        pool_mode: &str,
        pool: usize,
        round_robin: bool,
        extra: &str,
    ) -> PgBouncer {
        let dir = std::env::temp_dir().join(unique("pgbouncer"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let users = dir.join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").unwrap();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 test = host={} port={} dbname=test\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir = {}\n\
                 auth_type = trust\n\
                 auth_file = {}\n\
                 pool_mode = {pool_mode}\n\
                 default_pool_size = {pool}\n\
                 server_round_robin = {rr}\n\
                 max_client_conn = 200\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 {extra}\n",
                server.0,
                server.1,
                dir.display(),
                users.display(),
                rr = u8::from(round_robin),
            ),
        )
        .unwrap();
        // pgbouncer refuses to run as root; it can drop to another user,
        // which makes its Unix socket here.
        let open_to_all = std::os::unix::fs::PermissionsExt::from_mode(0o1777);
        std::fs::set_permissions(&dir, open_to_all).unwrap();
        let log = std::fs::File::create(dir.join("pgbouncer.log")).unwrap();
        let mut cmd = Command::new(std::env::var("DBMUTEX_PGBOUNCER").unwrap_or_else(|_| "pgbouncer".into()));
        if is_root() {
            cmd.args(["-u", "postgres"]);
        }
        let child = match cmd
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => panic!("cannot start pgbouncer (install the Debian package `pgbouncer`): {e}"),
        };
        let bouncer = PgBouncer { child, dir, port };
        let what = format!("pgbouncer on port {port}");
        super::private::until_answers(&bouncer.url(), Duration::from_secs(10), &what, || bouncer.log()).await;
        bouncer
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test?sslmode=disable", self.port)
    }

    /// The same pooler through its Unix socket (a connection there is
    /// never found direct: no address to compare).
    pub fn unix_url(&self) -> String {
        let dir = self.dir.display().to_string().replace('/', "%2F");
        format!("postgres://postgres@{dir}:{}/test?sslmode=disable", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// A raw client through the pooler (no dbmutex logic).
    pub async fn raw(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect through pgbouncer: {e}\n{}", self.log()));
        tokio::spawn(conn);
        client
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
