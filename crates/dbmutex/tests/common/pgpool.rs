//! A pgpool-II of the test's own (issue #23): `pgpool` (Debian package
//! `pgpool2`) on free loopback ports in front of a private primary and its
//! streaming standby, in `streaming_replication` mode, started by the test
//! and stopped however the test process ends (a private instance
//! directory with its watchdog, see `private.rs`).
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::private::{free_port, is_root, user_ids, Instance};
use super::PrivatePg;

/// A pgpool process of this test; stopped (`-m immediate`) on drop.
pub struct PgPool {
    instance: Instance,
    child: Child,
    port: u16,
}

/// `pgpool`, as `postgres` when we are root.
fn pgpool() -> Command {
    let exe = std::env::var("DBMUTEX_PGPOOL").unwrap_or_else(|_| "pgpool".into());
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &exe]);
        c
    } else {
        Command::new(exe)
    }
}

impl PgPool {
    /// Starts pgpool with `primary` as node 0 and `standby` as node 1,
    /// `load_balance_mode = on` with the read weights given (`weights.0`
    /// for the primary), and `extra` lines (`key = value`) appended, e.g.
    /// `statement_level_load_balance = on`. Waits until it answers; panics
    /// with its log when it cannot start.
    pub async fn start(primary: &PrivatePg, standby: &PrivatePg, weights: (f32, f32), extra: &str) -> PgPool {
        let as_postgres = if is_root() { "runuser -u postgres -- " } else { "" };
        let stop_sh = format!(
            "if [ -f \"$1/pgpool.pid\" ]; then {as_postgres}pgpool -f \"$1/pgpool.conf\" -m immediate stop >/dev/null 2>&1; fi"
        );
        let instance = Instance::create("dbmutex-private-pgpool-", stop_sh, "postgres");
        let dir = instance.dir().to_owned();
        let port = free_port();
        let conf = format!(
            "backend_clustering_mode = 'streaming_replication'\n\
             listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{d}'\n\
             pcp_listen_addresses = ''\n\
             pcp_port = {pcp}\n\
             pcp_socket_dir = '{d}'\n\
             backend_hostname0 = '127.0.0.1'\n\
             backend_port0 = {p0}\n\
             backend_weight0 = {w0}\n\
             backend_hostname1 = '127.0.0.1'\n\
             backend_port1 = {p1}\n\
             backend_weight1 = {w1}\n\
             enable_pool_hba = off\n\
             num_init_children = 16\n\
             max_pool = 2\n\
             pid_file_name = '{d}/pgpool.pid'\n\
             logdir = '{d}'\n\
             load_balance_mode = on\n\
             sr_check_period = 0\n\
             sr_check_user = 'postgres'\n\
             health_check_period = 0\n\
             failover_on_backend_error = off\n\
             {extra}\n",
            d = dir.display(),
            pcp = free_port(),
            p0 = primary.port(),
            p1 = standby.port(),
            w0 = weights.0,
            w1 = weights.1,
        );
        for (file, text) in [
            ("pgpool.conf", conf.as_str()),
            ("pcp.conf", ""),
            ("pool_hba.conf", ""),
        ] {
            let path = dir.join(file);
            std::fs::write(&path, text).unwrap();
            if is_root() {
                let (uid, gid) = user_ids("postgres");
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            }
        }
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = match pgpool()
            .arg("-n")
            .arg("-f")
            .arg(dir.join("pgpool.conf"))
            .arg("-F")
            .arg(dir.join("pcp.conf"))
            .arg("-a")
            .arg(dir.join("pool_hba.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => panic!("cannot start pgpool (install the Debian package `pgpool2`): {e}"),
        };
        let pool = PgPool {
            instance,
            child,
            port,
        };
        let what = format!("pgpool on port {port}");
        super::private::until_answers(&pool.url(), Duration::from_secs(20), &what, || pool.log()).await;
        pool
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test?sslmode=disable", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.instance.dir().join("log")).unwrap_or_default()
    }

    /// A raw client through pgpool (no dbmutex logic).
    pub async fn raw(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect through pgpool: {e}\n{}", self.log()));
        tokio::spawn(conn);
        client
    }
}

impl Drop for PgPool {
    fn drop(&mut self) {
        self.instance.stop();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
