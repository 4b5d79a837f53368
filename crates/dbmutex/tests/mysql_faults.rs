//! MySQL/MariaDB faults and their detection bounds, and lock-string interop
//! with what the Ruby gem sends, against the real server (env
//! `DBMUTEX_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`).
//!
//! The server is shared with other clients: every lock name is unique, only
//! this test's own sessions are killed, and nothing counts locks server-wide.
//! Timing figures are printed (`--nocapture`) as well as asserted.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{mysql_raw, mysql_url, unique};
use dbmutex::key::{mysql_lock_string_for, MysqlFlavour, Prefix};
use dbmutex::{Error, LockGuard, Locker, LockerBuilder};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

async fn connect(b: LockerBuilder) -> Locker {
    match b.connect().await {
        Ok(l) => l,
        Err(e) => panic!(
            "cannot reach the MySQL test server at {}: {e} (start it, or set DBMUTEX_TEST_MYSQL_URL)",
            dbmutex::redact_url(&mysql_url())
        ),
    }
}

async fn locker() -> Locker {
    connect(Locker::builder(&mysql_url())).await
}

/// The connection id holding `key`, as the server reports it.
async fn used_by(c: &mut Conn, key: &str) -> Option<i64> {
    let row: Option<(Option<i64>,)> = c.exec_first("SELECT IS_USED_LOCK(?)", (key,)).await.unwrap();
    row.and_then(|(v,)| v)
}

/// What `GET_LOCK(key, 0)` answers on a raw session (what the gem sends).
async fn raw_get_lock(c: &mut Conn, key: &str) -> Option<i64> {
    let row: Option<(Option<i64>,)> = c.exec_first("SELECT GET_LOCK(?, 0)", (key,)).await.unwrap();
    row.and_then(|(v,)| v)
}

async fn raw_release(c: &mut Conn, key: &str) -> Option<i64> {
    let row: Option<(Option<i64>,)> = c.exec_first("SELECT RELEASE_LOCK(?)", (key,)).await.unwrap();
    row.and_then(|(v,)| v)
}

async fn is_mariadb(c: &mut Conn) -> bool {
    let v: String = c.query_first("SELECT VERSION()").await.unwrap().unwrap();
    MysqlFlavour::from_version(&v) == MysqlFlavour::MariaDb
}

/// The `n`-th of `sorted` at quantile `q` (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Waits for `g.lost()`, at most `within`; the time it took from `since`.
async fn lost_after(g: &LockGuard, since: Instant, within: Duration) -> Duration {
    tokio::time::timeout(within, g.lost())
        .await
        .unwrap_or_else(|_| panic!("loss not reported within {within:?}"));
    let took = since.elapsed();
    assert!(!g.is_held(), "lost() fired but is_held() is still true");
    took
}

const KILL_TRIALS: usize = 30;

/// A `KILL` of the holder's session is reported within 150 ms (issue 9,
/// item 3): at the default keepalive (1 s) the ping alone took ≈0.7–1 s.
///
/// Timing assertion with a margin for a loaded 2-core machine: every trial
/// within 400 ms and the median within 150 ms; the p50/p99/max measured are
/// printed. Also measured: how long after the KILL a waiting contender took
/// the lock, and so how long the two overlapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_of_the_holder_is_reported_within_150ms() {
    let a = locker().await;
    let b = locker().await;
    let mut raw = mysql_raw().await;
    let mut lost = Vec::new();
    let mut overlap = Vec::new();
    for _ in 0..KILL_TRIALS {
        let name = unique("kill");
        let g = a.lock(name.as_str()).await.unwrap();
        let key = a.key_of(name.as_str()).unwrap();
        let pid = used_by(&mut raw, &key).await.expect("held");
        let waiter = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move {
                let g = b.lock(name.as_str()).await.unwrap();
                (Instant::now(), g)
            }
        });
        // Let the contender's GET_LOCK start waiting.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        raw.query_drop(format!("KILL {pid}")).await.unwrap();
        let took = lost_after(&g, t, Duration::from_secs(3)).await;
        let (acquired_at, g2) = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the contender got the lock")
            .unwrap();
        lost.push(took);
        overlap.push((t + took).saturating_duration_since(acquired_at));
        match g.release().await {
            Err(Error::LockLost { .. }) => {}
            other => panic!("release after a KILL: {other:?}"),
        }
        g2.release().await.unwrap();
        // Spread the KILLs over the check's period.
        tokio::time::sleep(Duration::from_millis(fastrand_ms(100))).await;
    }
    lost.sort();
    overlap.sort();
    let (p50, p99, max) = (quantile(&lost, 0.5), quantile(&lost, 0.99), lost[lost.len() - 1]);
    eprintln!(
        "KILL → lost(), {KILL_TRIALS} trials: p50 {p50:?}, p99 {p99:?}, max {max:?}; \
         contender held it while the holder still believed it held: p50 {:?}, max {:?}",
        quantile(&overlap, 0.5),
        overlap[overlap.len() - 1]
    );
    assert!(max <= Duration::from_millis(400), "{lost:?}");
    assert!(p50 <= Duration::from_millis(150), "{lost:?}");
}

/// A pseudo-random number of milliseconds below `n` (no RNG dependency).
fn fastrand_ms(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    u64::from(nanos) % n
}

/// With many locks held by one locker (each on its own session), a KILL of
/// one session reports exactly that lock lost, within the same bound, and
/// no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_among_many_held_locks_reports_only_that_one() {
    const HELD: usize = 24;
    let a = locker().await;
    let mut raw = mysql_raw().await;
    let names: Vec<String> = (0..HELD).map(|i| unique(&format!("many{i}"))).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(a.lock(n.as_str()).await.unwrap());
    }
    let mut took = Vec::new();
    for victim in [3, 11, 20] {
        let key = a.key_of(names[victim].as_str()).unwrap();
        let pid = used_by(&mut raw, &key).await.expect("held");
        let t = Instant::now();
        raw.query_drop(format!("KILL {pid}")).await.unwrap();
        took.push(lost_after(&guards[victim], t, Duration::from_secs(3)).await);
        // Two more checks: nobody else is reported lost.
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (i, g) in guards.iter().enumerate() {
            let killed = [3, 11, 20].iter().take_while(|&&v| v != victim).any(|&v| v == i) || i == victim;
            assert_eq!(g.is_held(), !killed, "guard {i} after killing {victim}");
        }
    }
    eprintln!("KILL → lost() with {HELD} locks held: {took:?}");
    assert!(took.iter().all(|d| *d <= Duration::from_millis(400)), "{took:?}");
    for (i, g) in guards.into_iter().enumerate() {
        let r = g.release().await;
        if [3, 11, 20].contains(&i) {
            assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
        } else {
            r.unwrap();
        }
    }
}

/// A session holding a lock and a nested one (taken inside a scoped call,
/// on the same session, so both guards share the session's one loss
/// signal): a `KILL` is reported within the bound, and the scoped call
/// stops its closure. (A dropped guard's `lost()` never completes, so the
/// nested guard's own view cannot be observed after the closure stops.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_of_a_session_with_nested_locks_reports_both() {
    let a = locker().await;
    let (outer, inner) = (unique("outer"), unique("inner"));
    let killed_at: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let r = a
        .with_lock_or_err(outer.as_str(), &dbmutex::LockOptions::new(), || async {
            let g = a.lock(inner.as_str()).await.unwrap();
            let mut raw = mysql_raw().await;
            let outer_pid = used_by(&mut raw, &a.key_of(outer.as_str()).unwrap()).await;
            let inner_pid = used_by(&mut raw, &a.key_of(inner.as_str()).unwrap()).await;
            assert_eq!(outer_pid, inner_pid, "nested on the enclosing session");
            *killed_at.lock().unwrap() = Some(Instant::now());
            raw.query_drop(format!("KILL {}", inner_pid.unwrap()))
                .await
                .unwrap();
            std::future::pending::<()>().await;
            drop(g);
        })
        .await;
    let took = killed_at.lock().unwrap().expect("killed").elapsed();
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
    eprintln!("KILL → scoped call with a nested lock stopped after {took:?}");
    assert!(took <= Duration::from_millis(400), "{took:?}");
}

/// Many locks on one session (nested in a scoped call), more than one
/// check statement asks about (512): they stay on that one session, no
/// false loss while they are held, and a `KILL` reports every one of them
/// lost within the bound. On a private server: a mistake here opens a
/// connection per lock, and the shared server must not run out of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_of_a_session_with_600_nested_locks_reports_all() {
    const NESTED: usize = 600;
    let server = PrivateServer::start();
    server.wait_ready().await;
    let a = connect(Locker::builder(&server.url())).await;
    let url = server.url();
    let outer = unique("outer600");
    let base = unique("n600");
    // Set just before the KILL: the loss must not come earlier.
    let killed_at: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let r = a
        .with_lock_or_err(outer.as_str(), &dbmutex::LockOptions::new(), || async {
            let mut guards = Vec::new();
            for i in 0..NESTED {
                guards.push(a.lock(format!("{base}-{i}").as_str()).await.unwrap());
            }
            let mut raw = Conn::new(mysql_async::Opts::from_url(&url).unwrap())
                .await
                .unwrap();
            let sessions: Option<i64> = raw
                .query_first("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND <> 'Daemon'")
                .await
                .unwrap();
            // The lock session, the check's connection, an idle one or two,
            // and this one.
            assert!(
                sessions.unwrap() <= 5,
                "{sessions:?} sessions for {NESTED} nested locks"
            );
            let pid = used_by(&mut raw, &a.key_of(outer.as_str()).unwrap())
                .await
                .unwrap();
            let last = used_by(
                &mut raw,
                &a.key_of(format!("{base}-{}", NESTED - 1).as_str()).unwrap(),
            )
            .await;
            assert_eq!(last, Some(pid), "nested on the enclosing session");
            // Several checks of all 601 locks (two statements each): no false loss.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(guards.iter().all(LockGuard::is_held));
            *killed_at.lock().unwrap() = Some(Instant::now());
            raw.query_drop(format!("KILL {pid}")).await.unwrap();
            // The scoped call stops this closure when its lock is lost; all
            // 601 locks share the session's one loss signal.
            std::future::pending::<()>().await;
            drop(guards);
        })
        .await;
    let t = killed_at
        .lock()
        .unwrap()
        .unwrap_or_else(|| panic!("a loss was reported before the KILL: {r:?}"));
    let took = t.elapsed();
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
    eprintln!("KILL → the scoped call holding {NESTED} nested locks stopped after {took:?}");
    assert!(took <= Duration::from_millis(400), "{took:?}");
}

/// The loss check never reports a lock lost that was only released:
/// several tasks take and release locks (plain and nested) as fast as they
/// can while the check runs every 50 ms; no guard may see a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_gives_no_false_loss() {
    let a = locker().await;
    let base = unique("churn");
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (a, base) = (a.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let mut cycles = 0u32;
            while Instant::now() < deadline {
                let name = format!("{base}-{t}-{}", cycles % 3);
                let g = a.lock(name.as_str()).await.unwrap();
                assert!(g.is_held());
                g.release().await.unwrap();
                // Nested: a second lock on the first one's session, released
                // and taken again on the same session.
                let inner = format!("{base}-{t}-inner");
                a.with_lock_or_err(name.as_str(), &dbmutex::LockOptions::new(), || async {
                    for _ in 0..3 {
                        let g = a.lock(inner.as_str()).await.unwrap();
                        assert!(g.is_held());
                        g.release().await.unwrap();
                    }
                })
                .await
                .unwrap();
                cycles += 1;
            }
            cycles
        }));
    }
    // A long-held lock alongside, checked throughout.
    let steady = a.lock(format!("{base}-steady").as_str()).await.unwrap();
    let mut cycles = 0;
    for t in tasks {
        cycles += t.await.unwrap();
    }
    assert!(steady.is_held());
    steady.release().await.unwrap();
    eprintln!("churn: {cycles} cycles, no false loss");
    assert!(cycles > 10, "the churn barely ran: {cycles}");
}

/// A silent partition (no packet passes, no socket closes) of the holder's
/// connection: the guard reports the loss within `keepalive +
/// max(2 × keepalive, 2 s)`, at the default keepalive 1 s: 3 s. Measured on
/// several holders at once, each behind its own proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_is_reported_within_its_bound() {
    const TRIALS: usize = 4;
    let mut runs = Vec::new();
    for _ in 0..TRIALS {
        runs.push(tokio::spawn(async {
            let (url, frozen) = proxied_url().await;
            let cut_off = connect(Locker::builder(&url)).await;
            let name = unique("partition");
            let g = cut_off.lock(name.as_str()).await.unwrap();
            // Somewhere in the ping period.
            tokio::time::sleep(Duration::from_millis(100 + fastrand_ms(900))).await;
            frozen.store(true, Ordering::Relaxed);
            let t = Instant::now();
            let took = lost_after(&g, t, Duration::from_secs(8)).await;
            // Once the partition heals, the closed lock session ends and
            // the server frees the lock: nothing is left held.
            frozen.store(false, Ordering::Relaxed);
            drop(g);
            let key = cut_off.key_of(name.as_str()).unwrap();
            let freed = common::eventually(Duration::from_secs(20), || {
                let key = key.clone();
                async move { used_by(&mut mysql_raw().await, &key).await.is_none() }
            })
            .await;
            assert!(freed, "the partitioned session still holds {key:?}");
            took
        }));
    }
    let mut took = Vec::new();
    for r in runs {
        took.push(r.await.unwrap());
    }
    took.sort();
    eprintln!(
        "silent partition → lost(), keepalive 1 s, {TRIALS} trials: min {:?}, max {:?}",
        took[0],
        took[took.len() - 1]
    );
    assert!(
        took.iter().all(|d| *d <= Duration::from_millis(3000 + 700)),
        "{took:?}"
    );
}

/// The test server's URL, reached through a proxy that can go silent.
async fn proxied_url() -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    common::proxied(&mysql_url(), 3306).await
}

/// Gem interop (issue 9, item 9): on MariaDB the gem sends
/// `GET_LOCK('<prefix><name>', 0)` unchanged for names up to 192 bytes; a
/// raw session sending exactly that and dbmutex exclude each other, both
/// ways, for names of 65–192 bytes, ASCII and multi-byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gem_lock_strings_exclude_dbmutex_on_mariadb() {
    let mut raw = mysql_raw().await;
    if !is_mariadb(&mut raw).await {
        eprintln!("not MariaDB: the 65–192-byte case does not exist on MySQL 8");
        return;
    }
    let prefix = "gem:";
    let a = connect(Locker::builder(&mysql_url()).prefix(Prefix::new(prefix))).await;
    let ascii = format!("{}-", unique("gem100"))
        .chars()
        .chain(std::iter::repeat('x'))
        .take(100)
        .collect::<String>();
    let wide = format!("{}-{}", unique("gemwide"), "ü".repeat(60));
    let edge = format!("{}-", unique("gem192"))
        .chars()
        .chain(std::iter::repeat('y'))
        .take(192 - prefix.len())
        .collect::<String>();
    for name in [&ascii, &wide, &edge] {
        let gem = format!("{prefix}{name}");
        assert!(gem.len() > 64 && gem.len() <= 192, "{}", gem.len());
        assert_eq!(
            a.key_of(name.as_str()).unwrap(),
            gem,
            "the key is what the gem sends"
        );
        // The gem holds it: dbmutex cannot take it.
        assert_eq!(raw_get_lock(&mut raw, &gem).await, Some(1));
        assert!(a.try_lock(name.as_str()).await.unwrap().is_none(), "{name}");
        assert!(a.is_locked(name.as_str()).await.unwrap());
        assert_eq!(raw_release(&mut raw, &gem).await, Some(1));
        // dbmutex holds it: the gem cannot take it, and the server names it.
        let g = a.try_lock(name.as_str()).await.unwrap().expect("free");
        let mut gem_side = mysql_raw().await;
        assert_eq!(raw_get_lock(&mut gem_side, &gem).await, Some(0), "{name}");
        let holder = a.holders(name.as_str()).await.unwrap();
        assert_eq!(holder.len(), 1);
        assert_eq!(Some(holder[0].pid), used_by(&mut raw, &gem).await);
        g.release().await.unwrap();
        assert_eq!(used_by(&mut raw, &gem).await, None);
    }
}

/// Names the server would reject (here over 192 bytes, where the gem itself
/// fails with error 1059) still work through dbmutex, mapped; `holders`
/// finds them and `list` shows the real name — the holder's locker from what
/// it holds, others without inventing one (a mapped string is never shown
/// as a name). Names of 65–192 bytes show their real name to every lister.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_names_work_and_list_shows_real_names() {
    let mut raw = mysql_raw().await;
    let maria = is_mariadb(&mut raw).await;
    let a = locker().await;
    let other = locker().await;
    let over = format!("{}-", unique("over"))
        .chars()
        .chain(std::iter::repeat('z'))
        .take(193)
        .collect::<String>();
    let over_wide = format!("{}-{}", unique("overwide"), "😀".repeat(50));
    let mid = format!("{}-", unique("mid"))
        .chars()
        .chain(std::iter::repeat('m'))
        .take(100)
        .collect::<String>();
    // The gem's own fate with the over-long one: the server refuses it.
    let refused = raw
        .exec_first::<(Option<i64>,), _, _>("SELECT GET_LOCK(?, 0)", (over.as_str(),))
        .await;
    assert!(
        matches!(&refused, Err(mysql_async::Error::Server(e)) if e.code == 1059 || e.code == 3057),
        "{refused:?}"
    );
    let mut guards = Vec::new();
    for name in [&over, &over_wide, &mid] {
        let key = a.key_of(name.as_str()).unwrap();
        let flavour = if maria {
            MysqlFlavour::MariaDb
        } else {
            MysqlFlavour::Mysql
        };
        assert_eq!(
            key,
            mysql_lock_string_for(&name.as_str().into(), &Prefix::none(), flavour).unwrap()
        );
        let g = a.try_lock(name.as_str()).await.unwrap().expect("free");
        assert!(other.try_lock(name.as_str()).await.unwrap().is_none());
        let holders = other.holders(name.as_str()).await.unwrap();
        assert_eq!(holders.len(), 1, "{name}");
        assert_eq!(Some(holders[0].pid), used_by(&mut raw, &key).await);
        guards.push(g);
    }
    let listed_by_holder = list_installing_plugin(&a).await;
    let listed_by_other = other.list().await.unwrap();
    for name in [&over, &over_wide, &mid] {
        let key = a.key_of(name.as_str()).unwrap();
        let mapped = key != *name;
        let mine: Vec<_> = listed_by_holder.iter().filter(|l| l.key == key).collect();
        assert_eq!(mine.len(), 1, "{key:?} in {listed_by_holder:?}");
        assert_eq!(
            mine[0].name.as_deref(),
            Some(name.as_str()),
            "holder's list, {key:?}"
        );
        // Another process sees what the server shows: on MariaDB at most 64
        // characters, 4-byte characters as `?`. It never passes a mapped or
        // cut string off as a name.
        let pid = used_by(&mut raw, &key).await.expect("held");
        let theirs: Vec<_> = listed_by_other.iter().filter(|l| l.holder.pid == pid).collect();
        assert_eq!(theirs.len(), 1, "{listed_by_other:?}");
        if mapped || theirs[0].key != key {
            assert_eq!(theirs[0].name, None, "not a name: {:?}", theirs[0].key);
        } else {
            assert_eq!(theirs[0].name.as_deref(), Some(name.as_str()));
        }
        eprintln!(
            "listed by another locker: {:?} → name {:?}",
            theirs[0].key, theirs[0].name
        );
    }
    if maria {
        assert_eq!(
            a.key_of(mid.as_str()).unwrap(),
            mid,
            "MariaDB takes 100 bytes as they are"
        );
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

async fn list_installing_plugin(l: &Locker) -> Vec<dbmutex::ListedLock> {
    match l.list().await {
        Ok(v) => v,
        Err(Error::Unsupported(_)) => {
            // The library never installs it; the test server may (as
            // mysql_backend.rs does).
            let mut raw = mysql_raw().await;
            if let Err(e) = raw.query_drop("INSTALL SONAME 'metadata_lock_info'").await {
                assert!(
                    matches!(&e, mysql_async::Error::Server(s) if s.code == 1968),
                    "{e}"
                );
            }
            l.list().await.unwrap()
        }
        Err(e) => panic!("{e:?}"),
    }
}

/// A private MariaDB server in a temporary directory on a free loopback
/// port, for faults the shared server must never see (a restart). Panics
/// loudly when the server binaries are missing.
struct PrivateServer {
    dir: std::path::PathBuf,
    port: u16,
    child: Option<std::process::Child>,
}

fn find_binary(names: &[&str]) -> std::path::PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path
        .split(':')
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]);
    for d in dirs {
        for n in names {
            let p = std::path::Path::new(d).join(n);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("{names:?} not found: install the MariaDB server (Debian: mariadb-server) to run this test");
}

impl PrivateServer {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("dbmutex-private-mariadb-{}", unique("srv")));
        std::fs::create_dir_all(&dir).unwrap();
        let install = find_binary(&["mariadb-install-db", "mysql_install_db"]);
        let out = std::process::Command::new(install)
            .args([
                "--no-defaults",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .arg(format!("--datadir={}", dir.join("data").display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut s = PrivateServer {
            dir,
            port,
            child: None,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.join("server.log")).unwrap();
        let child = std::process::Command::new(find_binary(&["mariadbd", "mysqld"]))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .args(["--user=root", "--bind-address=127.0.0.1", "--skip-name-resolve"])
            .arg(format!("--port={}", self.port))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.port)
    }

    async fn wait_ready(&self) {
        let opts = mysql_async::Opts::from_url(&self.url()).unwrap();
        for _ in 0..300 {
            if let Ok(c) = Conn::new(opts.clone()).await {
                drop(c.disconnect().await);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the private MariaDB on port {} did not start: {}",
            self.port,
            std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
        );
    }

    /// Stops the server: `graceful` with SIGTERM (a shutdown), else SIGKILL
    /// (a crash). Waits until the process is gone.
    fn stop(&mut self, graceful: bool) {
        let mut child = self.child.take().expect("running");
        if graceful {
            let st = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(st.success());
        } else {
            child.kill().unwrap();
        }
        child.wait().unwrap();
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server restart — a shutdown or a crash of the server process — is
/// reported within the same bound as a `KILL`: the loss check cannot reach
/// the server and has every lock session ping at once; their sockets are
/// closed, so the pings fail at once. After the restart the same locker
/// takes locks again. On a private server (the shared one is never
/// restarted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_is_reported_quickly() {
    const TRIALS: usize = 6;
    let mut server = PrivateServer::start();
    server.wait_ready().await;
    let a = connect(Locker::builder(&server.url())).await;
    let mut took = Vec::new();
    for i in 0..TRIALS {
        let guards = [
            a.lock(unique("restart-a").as_str()).await.unwrap(),
            a.lock(unique("restart-b").as_str()).await.unwrap(),
        ];
        tokio::time::sleep(Duration::from_millis(fastrand_ms(300))).await;
        let t = Instant::now();
        server.stop(i % 2 == 0);
        for g in &guards {
            took.push(lost_after(g, t, Duration::from_secs(5)).await);
        }
        server.spawn();
        server.wait_ready().await;
        for g in guards {
            assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        }
    }
    // The same locker works again after the restarts.
    let name = unique("after-restart");
    let g = a.lock(name.as_str()).await.unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
    took.sort();
    eprintln!(
        "server restart → lost(), {} locks over {TRIALS} restarts (shutdown and crash alternating): p50 {:?}, max {:?}",
        took.len(),
        quantile(&took, 0.5),
        took[took.len() - 1]
    );
    assert!(took.iter().all(|d| *d <= Duration::from_millis(400)), "{took:?}");
    assert!(quantile(&took, 0.5) <= Duration::from_millis(150), "{took:?}");
}
