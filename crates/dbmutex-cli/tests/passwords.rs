#![cfg(unix)]
//! Where `dbmutex run` finds a password the URL does not carry, as the
//! databases' own clients do — so a cron job keeps it out of the URL and
//! out of `ps`: on PostgreSQL `PGPASSWORD`, else the password file
//! (`PGPASSFILE`, else `~/.pgpass`); on MySQL/MariaDB `~/.my.cnf`'s
//! `[client]` password, else `MYSQL_PWD`. Real processes against private
//! servers that ask user `cron` for its password over TCP.

#[path = "../../dbmutex/tests/common/private.rs"]
mod private;
#[path = "../../dbmutex/tests/common/private_mariadb.rs"]
mod private_mariadb;
#[path = "../../dbmutex/tests/common/private_pg.rs"]
mod private_pg;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use private_mariadb::PrivateMariaDb;
use private_pg::PrivatePg;

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");
const PASSWORD: &str = "Cr0n-pw-7d1e";

/// A private server where `postgres` is trusted and `cron` must give its
/// password, and a temp directory for password files (removed on drop),
/// of this test's own (`tag`): the tests of this file run at once.
struct Setup {
    pg: PrivatePg,
    dir: std::path::PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn setup(tag: &str) -> Setup {
    let pg = PrivatePg::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let raw = rt.block_on(pg.raw());
    rt.block_on(raw.batch_execute(&format!("CREATE ROLE cron LOGIN PASSWORD '{PASSWORD}'")))
        .unwrap();
    pg.set_hba(
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         host all all 127.0.0.1/32 scram-sha-256\n",
    );
    // Until the server follows the new rules: cron without a password is refused.
    let url = format!("postgres://cron@127.0.0.1:{}/test", pg.port());
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt
        .block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls))
        .is_ok()
    {
        assert!(Instant::now() < deadline, "pg_hba.conf not in force after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = std::env::temp_dir().join(format!("dbmutex-passwords-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Setup { pg, dir }
}

/// `file` with `text`, readable by its owner only unless `mode` says else.
fn write(file: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(file, text).unwrap();
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `dbmutex run pw -- true` as `cron` with the URL `url` and only the
/// environment `env` (beside PATH and HOME): its exit code and what it
/// printed.
fn run(url: &str, env: &[(&str, &Path)], home: &Path, pgpassword: Option<&str>) -> (i32, String) {
    run_with(url, env, home, pgpassword.map(|p| ("PGPASSWORD", p)))
}

fn run_with(url: &str, env: &[(&str, &Path)], home: &Path, var: Option<(&str, &str)>) -> (i32, String) {
    let vars: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (*k, v.as_os_str()))
        .chain(var.map(|(k, v)| (k, std::ffi::OsStr::new(v))))
        .collect();
    dbmutex_in_env(home, url, &["run", "pw"], &vars)
}

/// `dbmutex ARGS -- true` with only `PATH`, `HOME` (`home`),
/// `DBMUTEX_DATABASE_URL` (`url`) and `vars` in its environment: its exit
/// status and output, which must not hold the password.
fn dbmutex_in_env(home: &Path, url: &str, args: &[&str], vars: &[(&str, &std::ffi::OsStr)]) -> (i32, String) {
    let mut c = Command::new(BIN);
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("DBMUTEX_DATABASE_URL", url)
        .args(args)
        .args(["--", "true"]);
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains(PASSWORD), "the password was printed: {text}");
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn a_password_comes_from_pgpassword_or_the_password_file() {
    let s = setup("sources");
    let port = s.pg.port();
    let url = format!("postgres://cron@127.0.0.1:{port}/test?sslmode=disable");
    let empty_home = s.dir.join("empty-home");
    std::fs::create_dir_all(&empty_home).unwrap();

    // Nowhere: the server refuses, exit 69.
    let (code, text) = run(&url, &[], &empty_home, None);
    assert_eq!(code, 69, "{text}");
    assert!(text.contains("password"), "{text}");

    // PGPASSWORD.
    let (code, text) = run(&url, &[], &empty_home, Some(PASSWORD));
    assert_eq!(code, 0, "{text}");

    // PGPASSFILE, its matching line (the first lines do not match).
    let file = s.dir.join("pgpass");
    write(
        &file,
        &format!(
            "# cron's\n127.0.0.1:{port}:other:cron:wrong\nelsewhere:*:*:*:wrong\n127.0.0.1:{port}:test:cron:{PASSWORD}\n"
        ),
        0o600,
    );
    let (code, text) = run(&url, &[("PGPASSFILE", &file)], &empty_home, None);
    assert_eq!(code, 0, "{text}");

    // ~/.pgpass, with wildcards.
    let home = s.dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    write(&home.join(".pgpass"), &format!("*:*:*:cron:{PASSWORD}\n"), 0o600);
    let (code, text) = run(&url, &[], &home, None);
    assert_eq!(code, 0, "{text}");

    // PGPASSWORD before the file; the URL's own password before both.
    let (code, text) = run(&url, &[], &home, Some("wrong"));
    assert_eq!(code, 69, "PGPASSWORD comes first: {text}");
    assert!(text.contains("password authentication failed"), "{text}");
    let with_password = format!("postgres://cron:{PASSWORD}@127.0.0.1:{port}/test?sslmode=disable");
    let (code, text) = run(&with_password, &[], &empty_home, Some("wrong"));
    assert_eq!(code, 0, "{text}");

    // A password file others may read is ignored, as libpq ignores it.
    // The library's warning says why, on stderr, as one `dbmutex:` line.
    write(&home.join(".pgpass"), &format!("*:*:*:cron:{PASSWORD}\n"), 0o644);
    let (code, text) = run(&url, &[], &home, None);
    assert_eq!(code, 69, "{text}");
    let pgpass = home.join(".pgpass");
    let warning = format!(
        "dbmutex: the password file has group or world access and is ignored; permissions should be u=rw (0600) or less (file={})",
        pgpass.display()
    );
    assert!(text.lines().any(|l| l == warning), "{text}");
}

/// A private MariaDB where user `cron` must give [`PASSWORD`], with a
/// runtime and a raw root connection to it.
fn mariadb_with_cron() -> (PrivateMariaDb, tokio::runtime::Runtime, mysql_async::Conn) {
    let my = PrivateMariaDb::start(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut raw = rt.block_on(my.raw());
    rt.block_on(raw.query_drop(format!(
        "CREATE USER 'cron'@'%' IDENTIFIED BY '{PASSWORD}'; GRANT SELECT ON test.* TO 'cron'@'%'"
    )))
    .unwrap();
    (my, rt, raw)
}

#[test]
fn a_mysql_password_comes_from_mysql_pwd_or_my_cnf() {
    let (my, _rt, _raw) = mariadb_with_cron();
    let dir = std::env::temp_dir().join(format!("dbmutex-passwords-my-{}", std::process::id()));
    let (empty_home, home) = (dir.join("empty-home"), dir.join("home"));
    std::fs::create_dir_all(&empty_home).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let url = format!("mysql://cron@127.0.0.1:{}/test", my.port());

    // Nowhere: the server refuses, exit 69.
    let (code, text) = run_with(&url, &[], &empty_home, None);
    assert_eq!(code, 69, "{text}");
    assert!(text.contains("using password: NO"), "{text}");

    // MYSQL_PWD.
    let (code, text) = run_with(&url, &[], &empty_home, Some(("MYSQL_PWD", PASSWORD)));
    assert_eq!(code, 0, "{text}");

    // ~/.my.cnf's [client] group (not another group's).
    let cnf = home.join(".my.cnf");
    write(
        &cnf,
        &format!("[mysqld]\npassword = wrong\n[client]\nuser = cron\npassword = \"{PASSWORD}\"\n"),
        0o600,
    );
    let (code, text) = run_with(&url, &[], &home, None);
    assert_eq!(code, 0, "{text}");

    // A URL that names no user logs in as the clients would: the option
    // file's `user`, else the login's name (before: as '', refused).
    let no_user = format!("mysql://127.0.0.1:{}/test", my.port());
    let (code, text) = run_with(&no_user, &[], &home, None);
    assert_eq!(code, 0, "user = cron from ~/.my.cnf: {text}");
    let login = Command::new("id").arg("-un").output().unwrap();
    let login = String::from_utf8(login.stdout).unwrap().trim().to_owned();
    let (code, text) = run_with(&no_user, &[], &empty_home, Some(("MYSQL_PWD", "wrong")));
    assert_eq!(code, 69, "{text}");
    assert!(
        text.contains(&format!("user '{login}'@")),
        "the login's name: {text}"
    );

    // A URL that names no host goes where the clients go: the option
    // file's host and port, else MYSQL_HOST and MYSQL_TCP_PORT (not the
    // local socket, where this test's server does not listen).
    let port = my.port().to_string();
    let place: [(&str, &Path); 2] = [
        ("MYSQL_HOST", Path::new("127.0.0.1")),
        ("MYSQL_TCP_PORT", Path::new(&port)),
    ];
    let (code, text) = run_with("mysql:///test", &place, &home, None);
    assert_eq!(code, 0, "MYSQL_HOST and MYSQL_TCP_PORT: {text}");
    let (code, text) = run_with(
        "mysql://cron@/test",
        &[("MYSQL_UNIX_PORT", Path::new("/nonexistent/dbmutex-test.sock"))],
        &empty_home,
        None,
    );
    assert_eq!(code, 69, "{text}");
    // The option files' socket, where the system's name one (Debian's
    // MariaDB does, in `[client-server]`): the one `mariadb` itself would
    // use in this environment; else MYSQL_UNIX_PORT's.
    let unix_port = "/nonexistent/dbmutex-test.sock";
    let want = client_socket_from_option_files(&empty_home).unwrap_or_else(|| unix_port.to_owned());
    assert!(
        text.contains(&format!("socket={want}:")) && (want == unix_port || !text.contains(unix_port)),
        "no host named anywhere: the socket the option files, else MYSQL_UNIX_PORT, name ({want}): {text}"
    );
    // The option file's host and port, before the environment's; then the
    // same by unique prefixes of the names, as the `mariadb` client reads
    // them (`pass` is `password`, `ho` is `host`, `po` is `port`). `cron`
    // is only the private server's: passed over, they would send dbmutex
    // to the local socket's server, which refuses it.
    for (file, url, what) in [
        (
            format!("user = cron\npassword = \"{PASSWORD}\"\nhost = 127.0.0.1\nport = {port}"),
            "mysql:///test",
            "the option file's host and port, before the environment's",
        ),
        (
            format!("pass = \"{PASSWORD}\"\nho = 127.0.0.1\npo = {port}"),
            "mysql://cron@/test",
            "unique prefixes of password, host and port",
        ),
    ] {
        write(&cnf, &format!("[client]\n{file}\n"), 0o600);
        let (code, text) = run_with(url, &[("MYSQL_TCP_PORT", Path::new("1"))], &home, None);
        assert_eq!(code, 0, "{what}: {text}");
    }
    write(
        &cnf,
        &format!("[mysqld]\npassword = wrong\n[client]\nuser = cron\npassword = \"{PASSWORD}\"\n"),
        0o600,
    );

    // The file before MYSQL_PWD, as the clients' libraries take them;
    // the URL's own password before both.
    let (code, text) = run_with(&url, &[], &home, Some(("MYSQL_PWD", "wrong")));
    assert_eq!(code, 0, "the option file comes first: {text}");
    let (code, text) = run_with(&url, &[], &empty_home, Some(("MYSQL_PWD", "wrong")));
    assert_eq!(code, 69, "MYSQL_PWD where the file has none: {text}");
    assert!(text.contains("using password: YES"), "{text}");
    let with_password = format!("mysql://cron:{PASSWORD}@127.0.0.1:{}/test", my.port());
    let (code, text) = run_with(&with_password, &[], &empty_home, Some(("MYSQL_PWD", "wrong")));
    assert_eq!(code, 0, "{text}");

    // A world-writable option file is ignored, as the clients ignore it.
    write(&cnf, &format!("[client]\npassword = {PASSWORD}\n"), 0o666);
    let (code, text) = run_with(&url, &[], &home, None);
    assert_eq!(code, 69, "{text}");
    assert!(text.contains("using password: NO"), "{text}");
    assert!(
        text.contains("dbmutex: the option file is world-writable and is ignored"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dbmutex run -w 20 NAME -- true` as `cron` with `url` and `home`, its
/// stderr piped: the waiter of the rotation tests.
fn spawn_waiter(url: &str, home: &Path, name: &str) -> std::process::Child {
    Command::new(BIN)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("DBMUTEX_DATABASE_URL", url)
        .args(["run", "-w", "20", name, "--", "true"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Until `waiting()` says the waiter waits in the server (`what`: at first,
/// or again after the rotation), within 20 s.
fn until_waiting(waiter: &mut std::process::Child, what: &str, mut waiting: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !waiting() {
        assert!(
            Instant::now() < until,
            "the waiter did not {what} (exited: {:?})",
            waiter.try_wait().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The waiter's exit, which must be a success within 15 s that printed
/// neither password.
fn finishes(mut waiter: std::process::Child, new: &str) {
    let until = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = waiter.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < until, "the waiter did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        !err.contains(PASSWORD) && !err.contains(new),
        "a password was printed: {err}"
    );
    assert!(status.success(), "{status}: {err}");
}

/// A password rotated while `dbmutex run` waits: the waiter's session is
/// ended, it reconnects, and it reads the password file again (as libpq
/// does at each connect), so it gets in with the new password and gets the
/// lock once the holder lets go. Read once at the start, it would send the
/// old one until its bound and fail.
#[test]
fn a_waiter_that_reconnects_reads_the_rotated_password() {
    let s = setup("rotation");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let raw = rt.block_on(s.pg.raw());
    let name = "pw-rotate";
    let (k1, k2) = match dbmutex::key::pg_key(&name.into(), &dbmutex::Prefix::from_env()) {
        dbmutex::key::PgKey::Pair(a, b) => (a, b),
        other => panic!("{other:?}"),
    };
    rt.block_on(raw.execute("SELECT pg_advisory_lock($1, $2)", &[&k1, &k2]))
        .unwrap();
    let home = s.dir.join("rotate-home");
    std::fs::create_dir_all(&home).unwrap();
    write(&home.join(".pgpass"), &format!("*:*:*:cron:{PASSWORD}\n"), 0o600);
    let url = format!("postgres://cron@127.0.0.1:{}/test?sslmode=disable", s.pg.port());
    let mut waiter = spawn_waiter(&url, &home, name);
    let count = |sql: &str| -> i64 { rt.block_on(raw.query_one(sql, &[])).unwrap().get(0) };
    let waiting = || {
        count("SELECT count(*) FROM pg_stat_activity WHERE usename = 'cron' AND wait_event = 'advisory'") > 0
    };
    until_waiting(&mut waiter, "queue", waiting);
    // The rotation: a new password on the server and in the file, and the
    // waiter's sessions ended.
    const NEW: &str = "Cr0n-pw-rotated-2b9f";
    rt.block_on(raw.batch_execute(&format!("ALTER ROLE cron PASSWORD '{NEW}'")))
        .unwrap();
    write(&home.join(".pgpass"), &format!("*:*:*:cron:{NEW}\n"), 0o600);
    let ended = count("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'cron'");
    assert!(ended >= 1, "no session of the waiter to end");
    // Back, with the new password, and waiting again.
    until_waiting(&mut waiter, "come back", waiting);
    rt.block_on(raw.execute("SELECT pg_advisory_unlock($1, $2)", &[&k1, &k2]))
        .unwrap();
    finishes(waiter, NEW);
}

/// The same on MySQL/MariaDB: a waiter whose connection is killed after
/// the password changed (server and `~/.my.cnf`) reconnects with the new
/// one, waits on and gets the lock.
#[test]
fn a_mysql_waiter_that_reconnects_reads_the_rotated_password() {
    let (my, rt, mut raw) = mariadb_with_cron();
    let name = "pw-rotate-my";
    let lock = dbmutex::key::mysql_lock_string(&name.into(), &dbmutex::Prefix::from_env()).unwrap();
    let got: Option<i64> = rt
        .block_on(raw.query_first(format!("SELECT GET_LOCK('{lock}', 0)")))
        .unwrap();
    assert_eq!(got, Some(1));
    let home = std::env::temp_dir().join(format!("dbmutex-passwords-rotate-my-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let cnf = home.join(".my.cnf");
    write(&cnf, &format!("[client]\npassword = {PASSWORD}\n"), 0o600);
    let mut waiter = spawn_waiter(&format!("mysql://cron@127.0.0.1:{}/test", my.port()), &home, name);
    let waiting_sql =
        "SELECT count(*) FROM information_schema.processlist WHERE user = 'cron' AND state = 'User lock'";
    let waiting = |raw: &mut mysql_async::Conn| {
        rt.block_on(raw.query_first::<i64, _>(waiting_sql))
            .unwrap()
            .unwrap_or(0)
            > 0
    };
    until_waiting(&mut waiter, "queue", || waiting(&mut raw));
    const NEW: &str = "Cr0n-pw-rotated-my-5c";
    rt.block_on(raw.query_drop(format!("ALTER USER 'cron'@'%' IDENTIFIED BY '{NEW}'")))
        .unwrap();
    write(&cnf, &format!("[client]\npassword = {NEW}\n"), 0o600);
    let ids: Vec<u64> = rt
        .block_on(raw.query("SELECT id FROM information_schema.processlist WHERE user = 'cron'"))
        .unwrap();
    assert!(!ids.is_empty(), "no connection of the waiter to kill");
    for id in ids {
        let _ = rt.block_on(raw.query_drop(format!("KILL {id}")));
    }
    until_waiting(&mut waiter, "come back", || waiting(&mut raw));
    let released: Option<i64> = rt
        .block_on(raw.query_first(format!("SELECT RELEASE_LOCK('{lock}')")))
        .unwrap();
    assert_eq!(released, Some(1));
    finishes(waiter, NEW);
    let _ = std::fs::remove_dir_all(&home);
}

/// A URL that names only the database (`postgres:///test`) goes where psql
/// goes in the same environment: the host (an address, or a socket's
/// directory), the port and the user from libpq's `PGHOST`, `PGPORT` and
/// `PGUSER`, and that user's password from `PGPASSWORD`. `-v` says where
/// the lock was taken; a port count that fits no host list is refused.
#[test]
fn a_url_with_only_a_database_takes_the_rest_from_libpqs_environment() {
    let s = setup("environment");
    let port = s.pg.port().to_string();
    let home = s.dir.join("env-home");
    std::fs::create_dir_all(&home).unwrap();
    let run =
        |vars: &[(&str, &str)]| run_in_env(&home, "postgres:///test?sslmode=disable", &["pw-env"], vars);
    // Over TCP, as cron, with its password.
    let (code, err) = run(&[
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", &port),
        ("PGUSER", "cron"),
        ("PGPASSWORD", PASSWORD),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!(
            "acquired lock pw-env (exclusive) on postgres://cron@127.0.0.1:{port}/test"
        )),
        "{err}"
    );
    // Through the server's socket, in its own directory, as postgres.
    let dir = s.pg.dir().display().to_string();
    let (code, err) = run(&[("PGHOST", &dir), ("PGPORT", &port), ("PGUSER", "postgres")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!(":{port}/test")) && err.contains("postgres@"),
        "{err}"
    );
    // Three ports for two hosts: refused before connecting, as libpq does.
    let (code, err) = run(&[("PGHOST", "127.0.0.1,127.0.0.2"), ("PGPORT", "1,2,3")]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("3 port numbers for 2 hosts"), "{err}");
}

/// libpq's service file: `service=` in the URL, else `PGSERVICE`, fills in
/// what the URL leaves out, ahead of the environment; a service found
/// nowhere is refused, never passed over (the lock would be on another
/// server than psql's).
#[test]
fn a_service_names_the_server_as_in_libpq() {
    let s = setup("service");
    let port = s.pg.port().to_string();
    let home = s.dir.join("svc-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join(".pg_service.conf"),
        format!(
            "# the cron jobs' server\n[locks]\nhost=127.0.0.1\nport={port}\nuser=cron\n\
             password={PASSWORD}\ndbname=test\nsslmode=disable\n[closed]\nhost=127.0.0.1\nport=1\ndbname=test\n"
        ),
    )
    .unwrap();
    let run = |url: &str, vars: &[(&str, &str)]| run_in_env(&home, url, &["-w", "5", "pw-svc"], vars);
    let there = format!("acquired lock pw-svc (exclusive) on postgres://cron@127.0.0.1:{port}/test");
    // Named in the URL; the service's port beats PGPORT's, its password
    // a wrong PGPASSWORD, its sslmode PGSSLMODE's.
    let wrong = [
        ("PGPORT", "1"),
        ("PGPASSWORD", "wrong"),
        ("PGSSLMODE", "verify-full"),
    ];
    let (code, err) = run("postgres://?service=locks", &wrong);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&there), "{err}");
    // Named by PGSERVICE.
    let (code, err) = run("postgres:///", &[("PGSERVICE", "locks")]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&there), "{err}");
    // The URL's own host and port beat the service's.
    let url = format!("postgres://127.0.0.1:{port}/?service=closed");
    let (code, err) = run(&url, &[("PGUSER", "cron"), ("PGPASSWORD", PASSWORD)]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = run("postgres:///test?service=closed&sslmode=disable", &[]);
    assert_eq!(code, 69, "the service's closed port was not dialed: {err}");
    assert!(err.contains("127.0.0.1:1/test"), "{err}");
    // A service found nowhere: refused before connecting.
    let (code, err) = run(
        "postgres:///test",
        &[("PGSERVICE", "absent"), ("PGSYSCONFDIR", "/nonexistent")],
    );
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("definition of service \"absent\" not found"),
        "{err}"
    );
}

/// `dbmutex -v run LOCK_ARGS -- true` in the environment `vars` (see
/// [`dbmutex_in_env`]).
fn run_in_env(home: &Path, url: &str, lock_args: &[&str], vars: &[(&str, &str)]) -> (i32, String) {
    let args: Vec<&str> = ["-v", "run"].iter().chain(lock_args).copied().collect();
    let vars: Vec<(&str, &std::ffi::OsStr)> =
        vars.iter().map(|(k, v)| (*k, std::ffi::OsStr::new(*v))).collect();
    dbmutex_in_env(home, url, &args, &vars)
}

/// The socket `mariadb --print-defaults` gives with `HOME` at `home` and
/// nothing else in the environment: the option files' `socket`, as the
/// client reads them.
fn client_socket_from_option_files(home: &Path) -> Option<String> {
    let out = Command::new("mariadb")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .arg("--print-defaults")
        .output()
        .expect("run mariadb --print-defaults");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .rev()
        .find_map(|arg| arg.strip_prefix("--socket="))
        .map(str::to_owned)
}
