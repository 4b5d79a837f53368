//! PgBouncer between dbmutex and PostgreSQL (issue #6, the gem's issue #43).
//!
//! Each test starts its own `pgbouncer` on a free loopback port, in front of
//! the test database, with a pool of two server sessions so that clients
//! really share them; the process is killed when the test ends, pass or fail.
//!
//! - In transaction pooling, plain session locks do not exclude: two raw
//!   clients both "get" the same lock, and one can unlock the other's.
//! - dbmutex notices the pooler at connect and refuses session locks with
//!   `Error::Unsupported`; its transaction-level locks keep exclusion through
//!   the same pooler under real concurrency.
//! - A session-pooling PgBouncer is not flagged: session locks are safe there.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pgbouncer::PgBouncer;
use common::{pg_raw, unique};
use dbmutex::{Error, LockOptions, Locker, WaitStrategy};

/// The one value of a one-row, one-column simple query.
async fn one(c: &tokio_postgres::Client, sql: &str) -> String {
    let msgs = c.simple_query(sql).await.unwrap();
    msgs.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no row from {sql}"))
}

/// A bigint key no other test uses.
fn random_key() -> i64 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    n ^ (i64::from(std::process::id()) << 40)
}

/// The hazard: with transaction pooling, a session lock stays on a server
/// session that the next client's statements run on. Two unrelated clients
/// both get the "same" exclusive lock, one unlocks the other's, and the lock
/// outlives both clients on the pooler's server session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_session_locks_break_exclusion_through_a_transaction_pooler() {
    let bouncer = PgBouncer::start("transaction").await;
    let direct = pg_raw().await;
    let k = random_key();
    let (a, b) = (bouncer.raw().await, bouncer.raw().await);

    assert_eq!(one(&a, &format!("SELECT pg_try_advisory_lock({k})")).await, "t");
    // Directly on PostgreSQL, exclusion holds: a second session is refused.
    assert_eq!(
        one(&direct, &format!("SELECT pg_try_advisory_lock({k})")).await,
        "f"
    );
    // Through the pooler, client b's statement runs on the server session
    // that holds a's lock (PgBouncer reuses the last released one first):
    // re-entrant session locks say yes.
    let pid_b = one(&b, "SELECT pg_backend_pid()").await;
    assert_eq!(
        one(&b, &format!("SELECT pg_try_advisory_lock({k})")).await,
        "t",
        "b got a's lock: exclusion is broken"
    );
    // b can release a lock it never took, twice (a's and its own).
    assert_eq!(one(&b, &format!("SELECT pg_advisory_unlock({k})")).await, "t");
    assert_eq!(one(&a, &format!("SELECT pg_advisory_unlock({k})")).await, "t");
    // The lock's holder in pg_locks is a server session, not a client.
    assert_eq!(one(&a, &format!("SELECT pg_try_advisory_lock({k})")).await, "t");
    drop((a, b));
    let holder = one(
        &direct,
        &format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND classid = ({k} >> 32)::bigint::oid AND objid = ({k} & 4294967295)::oid"
        ),
    )
    .await;
    assert_eq!(
        holder, pid_b,
        "the lock outlives both clients on the pooled session"
    );
    // Only the end of that server session (here: stopping the pooler) frees it.
    drop(bouncer);
    let direct_ref = &direct;
    assert!(
        common::eventually(Duration::from_secs(5), || async move {
            one(direct_ref, &format!("SELECT pg_try_advisory_lock({k})")).await == "t"
        })
        .await,
        "the lock is freed when the pooler's server session ends"
    );
    one(&direct, &format!("SELECT pg_advisory_unlock({k})")).await;
}

/// dbmutex notices the transaction pooler when it connects and refuses
/// session locks with a typed error that names the fix; transaction-level
/// locks work through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_locks_are_refused_behind_a_transaction_pooler() {
    let bouncer = PgBouncer::start("transaction").await;
    let locker = Locker::connect(&bouncer.url())
        .await
        .expect("connect through pgbouncer");
    let name = unique("pgb-refuse");
    for opts in [
        LockOptions::try_once(),
        LockOptions::new().timeout(Duration::from_millis(200)),
        LockOptions::try_once().wait_strategy(WaitStrategy::Server),
        LockOptions::new().wait_strategy(WaitStrategy::Server),
    ] {
        match locker.acquire(name.as_str(), &opts).await {
            Err(Error::Unsupported(msg)) => {
                assert!(msg.contains("LockOptions::transaction(true)"), "{msg}")
            }
            other => panic!("session lock through a transaction pooler: {other:?}"),
        }
    }
    excludes_a_direct_client(xact_lock(&locker, &name).await, &name).await;
}

/// A transaction lock on `name`, free, through `locker` (a pooler).
async fn xact_lock(locker: &Locker, name: &str) -> dbmutex::LockGuard {
    locker
        .acquire(name, &LockOptions::try_once().transaction(true))
        .await
        .unwrap()
        .expect("free")
}

/// `g`, taken through a pooler, is really held in the server: a direct
/// client's try is refused until `g` is released, then it is free.
async fn excludes_a_direct_client(g: dbmutex::LockGuard, name: &str) {
    let direct = Locker::connect(&common::pg_url()).await.unwrap();
    assert!(
        direct
            .acquire(name, &LockOptions::try_once().transaction(true))
            .await
            .unwrap()
            .is_none(),
        "held"
    );
    g.release().await.unwrap();
    assert!(common::free_for(&direct, name).await);
}

/// Session pooling gives each client a server session of its own: no false
/// alarm, session locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_pooler_is_not_flagged() {
    let bouncer = PgBouncer::start("session").await;
    let locker = Locker::connect(&bouncer.url())
        .await
        .expect("connect through pgbouncer");
    let name = unique("pgb-session");
    let g = locker.try_lock(name.as_str()).await.unwrap().expect("free");
    let direct = Locker::connect(&common::pg_url()).await.unwrap();
    assert!(direct.try_lock(name.as_str()).await.unwrap().is_none(), "held");
    g.release().await.unwrap();
    assert!(common::free_for(&direct, &name).await);
}

/// Once-per-window runs through a session pooler: the run's statements go
/// on the lock's own (pinned) session; a direct client then finds the run
/// recorded and not due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_window_through_a_session_pooler() {
    let bouncer = PgBouncer::start("session").await;
    let pooled = Locker::connect(&bouncer.url())
        .await
        .expect("connect through pgbouncer");
    let name = unique("pgb-once");
    let hour = Duration::from_secs(3600);
    let out = pooled
        .once_per(name.as_str(), hour, &LockOptions::new(), || async { 1 })
        .await
        .unwrap();
    assert_eq!(out, dbmutex::runs::OncePer::Ran(1));
    let direct = Locker::connect(&common::pg_url()).await.unwrap();
    let out = direct
        .once_per(name.as_str(), hour, &LockOptions::new(), || async { 2 })
        .await
        .unwrap();
    assert!(
        matches!(out, dbmutex::runs::OncePer::NotDue(ref l) if l.run == 1 && l.exit_code == Some(0)),
        "{out:?}"
    );
}

/// Transaction-level locks through the transaction pooler exclude each other
/// (and a direct client) under real concurrency: lockers × tasks contend for
/// one name, polling and waiting in the server, and a counter proves no two
/// sections overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_locks_keep_exclusion_through_a_transaction_pooler() {
    const SECTIONS: usize = 300;
    let bouncer = PgBouncer::start("transaction").await;
    let name = unique("pgb-xact");
    let inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut lockers = Vec::new();
    for _ in 0..2 {
        lockers.push(
            Locker::connect(&bouncer.url())
                .await
                .expect("connect through pgbouncer"),
        );
    }
    lockers.push(Locker::connect(&common::pg_url()).await.unwrap());
    let mut tasks = Vec::new();
    for (i, locker) in lockers.iter().enumerate() {
        for t in 0..3 {
            let (locker, name) = (locker.clone(), name.clone());
            let (inside, done, overlaps) = (inside.clone(), done.clone(), overlaps.clone());
            let strategy = if t % 2 == 0 {
                WaitStrategy::Poll
            } else {
                WaitStrategy::Server
            };
            let opts = LockOptions::new()
                .transaction(true)
                .timeout(Duration::from_secs(20))
                .wait_strategy(strategy)
                .max_backoff(Duration::from_millis(5));
            tasks.push(tokio::spawn(async move {
                let mut mine = 0;
                while done.load(Ordering::SeqCst) < SECTIONS {
                    let g = locker
                        .acquire(name.as_str(), &opts)
                        .await
                        .unwrap_or_else(|e| panic!("locker {i} task {t}: {e:?}"))
                        .expect("acquired within 20 s");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    mine += 1;
                    g.release().await.unwrap();
                }
                mine
            }));
        }
    }
    let mut per_task = Vec::new();
    for t in tasks {
        per_task.push(t.await.expect("task"));
    }
    let total: usize = per_task.iter().sum();
    println!("sections per task: {per_task:?} (total {total})");
    assert!(total >= SECTIONS, "{total}");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert!(
        per_task[..6].iter().sum::<usize>() > 0,
        "the pooled lockers took part"
    );
}

/// What one contention run through a pooler saw.
#[derive(Debug, Default)]
struct Seen {
    /// Lockers whose connect failed (statement pooling refuses them).
    connect_refused: usize,
    /// Sections run under the lock.
    sections: usize,
    /// Sections that began while another was still running.
    overlaps: usize,
    /// Acquisitions refused with `Error::Unsupported` (a pooler seen).
    refused: usize,
    /// Locks reported lost (a pooler moved the session under a holder).
    lost: usize,
    /// Anything else.
    other: Vec<String>,
}

/// Decrements on drop, so a section stopped at an await point still leaves.
struct Inside(Arc<AtomicUsize>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `clients` lockers connect through `bouncer` at once and contend for one
/// name `rounds` times each (scoped calls, so a lost lock stops its
/// section), session locks or (`xact`) transaction locks.
async fn contend(bouncer: &PgBouncer, name: &str, clients: usize, rounds: usize, xact: bool) -> Seen {
    contend_with(&bouncer.url(), name, clients, rounds, xact, false).await
}

/// As [`contend`], through `url`; with `unchecked`, the lockers skip the
/// connect-time pooler check, as if the pooler had slipped past it.
async fn contend_with(
    url: &str,
    name: &str,
    clients: usize,
    rounds: usize,
    xact: bool,
    unchecked: bool,
) -> Seen {
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, name) = (url.to_owned(), name.to_owned());
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            // 40 clients connect at once through 2 server sessions, and
            // each connect's pooler checks (pid questions, the reset-query
            // probe's watch of up to 2 s) wait their turn for one: on a
            // loaded machine that outlasts the default 5 s.
            let mut builder = Locker::builder(&url)
                .keepalive(Duration::from_millis(100))
                .connect_timeout(Duration::from_secs(30));
            if unchecked {
                builder = builder.skip_pooler_check_for_tests();
            }
            let locker = match builder.connect().await {
                Ok(l) => l,
                Err(Error::Unsupported(msg)) => {
                    assert!(msg.contains("PgBouncer"), "the message names the pooler: {msg}");
                    seen.connect_refused = 1;
                    return seen;
                }
                Err(e) => panic!("connect through pgbouncer: {e:?}"),
            };
            let opts = LockOptions::try_once().transaction(xact);
            for _ in 0..rounds {
                let section = || async {
                    let _in = Inside(inside.clone());
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                };
                match locker.with_lock(name.as_str(), &opts, section).await {
                    Ok(dbmutex::Outcome::Acquired(())) => seen.sections += 1,
                    Ok(dbmutex::Outcome::NotAcquired) => {}
                    Err(Error::Unsupported(_)) => seen.refused += 1,
                    Err(Error::LockLost { .. }) => seen.lost += 1,
                    Err(e) => seen.other.push(format!("{e:?}")),
                }
                tokio::task::yield_now().await;
            }
            seen
        }));
    }
    let mut all = Seen::default();
    for t in tasks {
        let s = t.await.expect("client task");
        all.connect_refused += s.connect_refused;
        all.sections += s.sections;
        all.refused += s.refused;
        all.lost += s.lost;
        all.other.extend(s.other);
    }
    all.overlaps = overlaps.load(Ordering::SeqCst);
    all
}

/// Advisory locks any server session holds on `name`'s key (directly on
/// PostgreSQL, pooler or not): after every client has gone, anything here
/// is an orphan on a pooled server session.
async fn held_anywhere(direct: &tokio_postgres::Client, name: &str) -> i64 {
    let key = dbmutex::key::pg_key(&name.into(), &dbmutex::Prefix::none());
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let rows = direct
        .query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND classid = $1 AND objid = $2 AND objsubid = $3",
            &[&classid, &objid, &objsubid],
        )
        .await
        .unwrap();
    rows[0].get(0)
}

/// Both server sessions of the pool opened, as on a pooler that has served
/// traffic: two clients hold a transaction open at once.
async fn warm(bouncer: &PgBouncer, sessions: usize) {
    let clients: Vec<_> = raw_clients(sessions, bouncer).await;
    for c in &clients {
        c.batch_execute("BEGIN; SELECT 1").await.unwrap();
    }
    for c in &clients {
        c.batch_execute("COMMIT").await.unwrap();
    }
}

async fn raw_clients(n: usize, bouncer: &PgBouncer) -> Vec<tokio_postgres::Client> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(bouncer.raw().await);
    }
    v
}

/// One pooler configuration under attack: 2 clients on warm sessions (two
/// `dbmutex run -n` on cron), then 40 at once, with session locks and with
/// transaction locks. Never two holders; never a lock left on a pooled
/// server session once the clients are gone.
async fn attack(pool_mode: &str, pool: usize, round_robin: bool) {
    let bouncer = PgBouncer::start_with(pool_mode, pool, round_robin).await;
    let direct = pg_raw().await;
    if pool_mode != "statement" {
        warm(&bouncer, pool).await;
    }
    let label = format!("{pool_mode}, pool {pool}, round robin {round_robin}");
    for (clients, xact) in [(2, false), (40, false), (40, true)] {
        let name = unique("pgb-attack");
        let seen = contend(&bouncer, &name, clients, 20, xact).await;
        println!("{label}: {clients} clients, xact {xact}: {seen:?}");
        assert_eq!(seen.overlaps, 0, "{label}: two holders at once: {seen:?}");
        assert!(seen.other.is_empty(), "{label}: unexpected errors: {seen:?}");
        let direct_ref = &direct;
        let name_ref = name.as_str();
        assert!(
            common::eventually(Duration::from_secs(5), || async move {
                held_anywhere(direct_ref, name_ref).await == 0
            })
            .await,
            "{label}: a lock stayed on a pooled server session after every client left"
        );
        if pool_mode == "statement" {
            assert_eq!(
                seen.connect_refused, clients,
                "{label}: statement pooling is refused at connect"
            );
        } else if xact {
            // Transaction locks are safe through a transaction pooler: they
            // run, and nothing refuses them when no session lock is held.
            assert!(seen.sections > 0, "{label}: {seen:?}");
            assert_eq!(seen.refused + seen.lost, 0, "{label}: {seen:?}");
        }
    }
    // The pooler's log has no notification for an unlinked client: nothing
    // ran LISTEN through it.
    assert!(
        !bouncer.log().contains("when not linked"),
        "{label}: LISTEN went through the pooler:\n{}",
        bouncer.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_transaction_pool_of_two_round_robin() {
    attack("transaction", 2, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_transaction_pool_of_two_lifo() {
    attack("transaction", 2, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_transaction_pool_of_one() {
    attack("transaction", 1, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_statement_pool_of_two_round_robin() {
    attack("statement", 2, true).await;
}

/// The connect-time check is a hint; the guarantee is the check every lock
/// statement, unlock and heartbeat carries. With the connect-time check
/// skipped, 40 clients take session locks through a transaction pooler of
/// two server sessions: statements that land on another client's server
/// session lock nothing, the moved client ends its own server session (so
/// nothing stays orphaned) and reports the loss — and never two holders.
async fn per_statement_checks_alone(round_robin: bool) {
    let bouncer = PgBouncer::start_with("transaction", 2, round_robin).await;
    let direct = pg_raw().await;
    warm(&bouncer, 2).await;
    for clients in [2, 40] {
        let name = unique("pgb-unchecked");
        let seen = contend_with(&bouncer.url(), &name, clients, 50, false, true).await;
        println!("unchecked, round robin {round_robin}, {clients} clients: {seen:?}");
        assert_eq!(seen.overlaps, 0, "two holders at once: {seen:?}");
        assert!(
            seen.refused + seen.lost > 0,
            "40 clients on 2 server sessions: some statement must have met another's session: {seen:?}"
        );
        let other_ok = seen
            .other
            .iter()
            .all(|e| e.contains("Connect") || e.contains("transaction-pooling"));
        assert!(other_ok, "unexpected errors: {seen:?}");
        let (direct_ref, name_ref) = (&direct, name.as_str());
        assert!(
            common::eventually(Duration::from_secs(5), || async move {
                held_anywhere(direct_ref, name_ref).await == 0
            })
            .await,
            "a lock stayed on a pooled server session after every client left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_statement_checks_alone_round_robin() {
    per_statement_checks_alone(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_statement_checks_alone_lifo() {
    per_statement_checks_alone(false).await;
}

/// A transaction pooler put in front of the server by a port redirect
/// (nftables, in a private network namespace): clients dial the server's
/// own address and port, and so does the pooler, so the server's end of
/// every session is what the client dialed. The session is not at the other
/// end of the client's own socket, though (the server sees the pooler's
/// port as its client's), and that is what tells:
/// - a default locker runs the connect-time pooler check and refuses
///   session locks (also where tokio-postgres dials, its socket's ends
///   unknown to us);
/// - with that check skipped, lock statements never go protocol-prepared,
///   the claim check stays in each, a holder the pooler moves is told and
///   its former server session ended (its lock not left there), and 2 and
///   then 40 clients on 2 server sessions never hold at once.
#[test]
fn a_pooler_behind_a_port_redirect_keeps_the_claim_check() {
    if !common::netns::inside() {
        return common::netns::in_netns("a_pooler_behind_a_port_redirect_keeps_the_claim_check");
    }
    let pg = common::private_pg::PrivatePg::start(&[("listen_addresses", "'127.0.0.1,127.0.0.2'")]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let bouncer = PgBouncer::start_in_front_of(("127.0.0.2", pg.port()), "transaction", 2, false, "").await;
        // Over 127.0.0.1, opened before the redirect: the server itself.
        let watcher = pg.raw().await;
        common::netns::redirect(("127.0.0.2", pg.port()), bouncer.port());
        let url = pg.url().replace("@127.0.0.1:", "@127.0.0.2:");
        // One client alone on the pooler, its statements all on one server
        // session: its second lock of a kind would go protocol-prepared on
        // a direct connection.
        let app = unique("redirect");
        let alone = Locker::builder(&format!("{url}&application_name={app}"))
            .skip_pooler_check_for_tests()
            .connect()
            .await
            .unwrap();
        for _ in 0..2 {
            let g = alone.try_lock("redirect-alone").await.unwrap().expect("free");
            let text = last_lock_statement(&watcher, &app).await;
            g.release().await.unwrap();
            assert!(
                text.starts_with("PREPARE dbmutex_") || text.starts_with("EXECUTE dbmutex_"),
                "behind the redirect: {text:?}"
            );
        }
        // Moved while it holds a lock: another client's transaction takes
        // its server session, its next statement goes to another one. It is
        // told, and its former session is ended (found by the start the
        // claim read), so the lock is not left there.
        let held = alone.try_lock("redirect-held").await.unwrap().expect("free");
        let pin = bouncer.raw().await;
        pin.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let moved = alone.try_lock("redirect-other").await;
        assert!(!matches!(moved, Ok(Some(_))), "a lock granted on another client's session: {moved:?}");
        tokio::time::timeout(Duration::from_secs(5), held.lost())
            .await
            .expect("the move is reported");
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                held_anywhere(&watcher, "redirect-held").await == 0
            })
            .await,
            "the moved holder's lock stayed on its former server session"
        );
        drop((pin, alone));
        warm(&bouncer, 2).await;
        for clients in [2, 40] {
            let name = unique("pgb-redirect");
            let seen = contend_with(&url, &name, clients, 50, false, true).await;
            println!("behind a redirect, {clients} clients: {seen:?}");
            assert_eq!(seen.overlaps, 0, "two holders at once: {seen:?}");
            // Also what shows the pooler is there: a direct connection is
            // never moved.
            assert!(
                seen.refused + seen.lost > 0,
                "{clients} clients on 2 server sessions: some statement must have met another's session: {seen:?}"
            );
            let (w, n) = (&watcher, name.as_str());
            assert!(
                common::eventually(Duration::from_secs(5), || async move { held_anywhere(w, n).await == 0 }).await,
                "a lock stayed on a pooled server session after every client left"
            );
        }
        // A default locker runs the connect-time check and is refused, on
        // a socket we dial and on one tokio-postgres dials (a URL asking
        // for a writable server). Claims stay on pooled sessions, and a
        // later client there is refused whatever it checks: a fresh pooler
        // for each.
        for url in [url.clone(), format!("{url}&target_session_attrs=read-write")] {
            let fresh = PgBouncer::start_in_front_of(("127.0.0.2", pg.port()), "transaction", 2, false, "").await;
            common::netns::redirect(("127.0.0.2", pg.port()), fresh.port());
            let default = Locker::connect(&url).await.unwrap();
            let refused = default.try_lock("redirect-default").await;
            assert!(matches!(refused, Err(Error::Unsupported(_))), "{url}: {refused:?}");
            drop(default);
        }
    });
}

/// The text of the last lock statement the server session of the client
/// named `app` ran (its try, prepared or `EXECUTE`d).
async fn last_lock_statement(watcher: &tokio_postgres::Client, app: &str) -> String {
    watcher
        .query_one(
            "SELECT query FROM pg_stat_activity WHERE application_name = $1 \
             AND (query LIKE '%advisory_lock%' OR query LIKE 'EXECUTE dbmutex_%')",
            &[&app],
        )
        .await
        .unwrap()
        .get(0)
}

/// A holder the pooler moves to another server session while it holds a
/// lock (connect-time check skipped, a LIFO pool of two sessions): once the
/// lock is held, a raw client through the same pooler opens a transaction,
/// which takes the holder's server session (the most recently used); the
/// holder's next heartbeat lands on the other session, the guard reports the
/// loss, and its own server session is ended, so the lock is not orphaned.
/// Ten trials, each on a fresh pooler (claims stay on pooled server
/// sessions, so later clients on the same pooler are refused at once);
/// prints how long the loss took to be reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_moved_by_the_pooler_is_told_and_its_lock_freed() {
    let direct = Locker::connect(&common::pg_url()).await.unwrap();
    let keepalive = Duration::from_millis(100);
    let mut told = Vec::new();
    let mut attempts = 0;
    while told.len() < 10 {
        attempts += 1;
        assert!(
            attempts <= 60,
            "only {} of 60 attempts held a lock: {told:?}",
            told.len()
        );
        let bouncer = PgBouncer::start_with("transaction", 2, false).await;
        warm(&bouncer, 2).await;
        let name = unique("pgb-moved");
        let locker = Locker::builder(&bouncer.url())
            .keepalive(keepalive)
            .skip_pooler_check_for_tests()
            .connect()
            .await
            .expect("connect through pgbouncer");
        // The lock statement itself may land on the other session (then it
        // locks nothing and says so): try again on a fresh pooler.
        let g = match locker.try_lock(name.as_str()).await {
            Ok(Some(g)) => g,
            Ok(None) => panic!("a fresh name is free"),
            Err(Error::Unsupported(_)) => continue,
            Err(e) => panic!("{e:?}"),
        };
        // Pins the holder's server session in a transaction of another
        // client: the holder's next statement goes to the other session.
        let pin = bouncer.raw().await;
        pin.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let t = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("the move is noticed by the next heartbeat");
        told.push(t.elapsed());
        assert!(!g.is_held());
        // The guard is told first; the server session is ended just after.
        let (d, n) = (&direct, name.as_str());
        assert!(
            common::eventually(
                Duration::from_secs(3),
                || async move { common::free_for(d, n).await }
            )
            .await,
            "the moved holder's server session was ended: its lock is free"
        );
        drop(pin);
    }
    println!("moved holders told after {told:?} ({attempts} attempts)");
}

/// The connect-time hint on the pooler the second reading found it missed
/// every time: a fresh round-robin pool of two warm server sessions. A few
/// more `pg_backend_pid()` questions once both sessions are idle catch it;
/// 20 fresh poolers, each must be detected (session locks refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_check_catches_a_fresh_round_robin_pool() {
    let mut missed = 0;
    for _ in 0..40 {
        let bouncer = PgBouncer::start_with("transaction", 2, true).await;
        warm(&bouncer, 2).await;
        let locker = Locker::connect(&bouncer.url()).await.expect("connect");
        // A refusal says the pooler was seen; anything else is a miss.
        match locker.try_lock(unique("pgb-fresh").as_str()).await {
            Err(Error::Unsupported(_)) => {}
            other => {
                missed += 1;
                println!("missed: {other:?}");
            }
        }
    }
    assert_eq!(
        missed, 0,
        "the connect-time check missed {missed} of 20 fresh round-robin pools"
    );
}

/// Over PgBouncer's Unix socket the connection is not found direct (the
/// socket's listener is PgBouncer, not the parent of the server's
/// backends), so the connect check runs, on a second connection once the
/// claim has shown it: the check must stay as strong as over TCP. A transaction pooler (20 fresh round-robin pools of two warm
/// server sessions, and a LIFO one) is caught and session locks refused,
/// transaction locks work; a statement pooler is refused at connect; a
/// session pooler that resets with `DISCARD ALL` passes and its session
/// locks exclude a direct client; one whose reset keeps locks is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connect_check_holds_over_a_unix_socket() {
    let mut missed = 0;
    for round_robin in std::iter::repeat_n(true, 20).chain([false]) {
        let bouncer = PgBouncer::start_with("transaction", 2, round_robin).await;
        warm(&bouncer, 2).await;
        let locker = Locker::connect(&bouncer.unix_url())
            .await
            .unwrap_or_else(|e| panic!("connect through pgbouncer's socket: {e}\n{}", bouncer.log()));
        let name = unique("pgb-unix");
        match locker.try_lock(name.as_str()).await {
            Err(Error::Unsupported(msg)) => assert!(msg.contains("LockOptions::transaction(true)"), "{msg}"),
            other => {
                missed += 1;
                println!("missed (round robin {round_robin}): {other:?}");
            }
        }
        if !round_robin {
            excludes_a_direct_client(xact_lock(&locker, &name).await, &name).await;
        }
    }
    assert_eq!(
        missed, 0,
        "the check missed {missed} of 21 transaction pools over a Unix socket"
    );

    let bouncer = PgBouncer::start("statement").await;
    match Locker::connect(&bouncer.unix_url()).await {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("statement-pooling"), "{msg}"),
        other => panic!("a statement pooler over a Unix socket: {:?}", other.map(|_| ())),
    }

    let bouncer = PgBouncer::start("session").await;
    let locker = Locker::connect(&bouncer.unix_url()).await.expect("session pool");
    let name = unique("pgb-unix-session");
    let g = locker.try_lock(name.as_str()).await.unwrap().expect("free");
    excludes_a_direct_client(g, &name).await;

    let bouncer = PgBouncer::start_configured("session", 2, false, "server_reset_query = RESET ALL").await;
    match Locker::connect(&bouncer.unix_url()).await {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("DISCARD ALL"), "{msg}"),
        other => panic!(
            "a reset that keeps locks, over a Unix socket: {:?}",
            other.map(|_| ())
        ),
    }
}

/// Fenced session locks through a transaction pooler that slipped past the
/// connect check (1 or 2 lockers on a round-robin pool of two server
/// sessions, 40 fresh poolers: claims stay on pooled sessions, so later lockers on one
/// pooler are refused at once): the lock statements and the fence
/// statements land on sessions the pooler picks. Whatever is refused or
/// lost, no two holders overlap and the tokens the holders saw, in the
/// order they held the lock, strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_locks_through_a_pooler_keep_token_order() {
    let name = unique("pgb-fenced");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut counts = std::collections::BTreeMap::new();
    for trial in 0..40 {
        let bouncer = PgBouncer::start_with("transaction", 2, true).await;
        warm(&bouncer, 2).await;
        let mut tasks = Vec::new();
        // Alone, a locker's fence lands on the other session about every
        // other pooler (round robin); two contend and hand tokens over.
        for _ in 0..1 + trial % 2 {
            let (url, name) = (bouncer.url(), name.clone());
            let (inside, overlaps, tokens) = (inside.clone(), overlaps.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                let locker = Locker::builder(&url)
                    .keepalive(Duration::from_millis(100))
                    .skip_pooler_check_for_tests()
                    .connect()
                    .await
                    .expect("connect through pgbouncer");
                let opts = LockOptions::try_once().fenced(true);
                let mut outcomes = Vec::new();
                for _ in 0..30 {
                    match locker.acquire(name.as_str(), &opts).await {
                        Ok(Some(g)) => {
                            let _in = Inside(inside.clone());
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            tokens.lock().unwrap().push(g.fence().expect("fenced"));
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            drop(_in);
                            outcomes.push(if g.release().await.is_ok() {
                                "held"
                            } else {
                                "lost while held"
                            });
                        }
                        Ok(None) => outcomes.push("busy"),
                        Err(Error::Unsupported(_)) => outcomes.push("refused"),
                        // The lock statement ran on our session, the fence
                        // statement on another: no token, the lock is lost.
                        Err(Error::LockLost { .. }) => outcomes.push("fence moved"),
                        Err(Error::Connect(_)) => outcomes.push("connect"),
                        Err(e) => panic!("unexpected: {e:?}"),
                    }
                    tokio::task::yield_now().await;
                }
                outcomes
            }));
        }
        for t in tasks {
            for o in t.await.expect("client task") {
                *counts.entry(o).or_insert(0) += 1;
            }
        }
    }
    let tokens = tokens.lock().unwrap().clone();
    println!("fenced through a pooler: {counts:?}, {} tokens", tokens.len());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    // Fence statements the pooler sent elsewhere were caught (without the
    // claim check in the statement, none is, and those holders get tokens
    // for locks they cannot keep).
    assert!(
        counts.get("fence moved").is_some_and(|&n| n > 0),
        "no moved fence statement was caught: {counts:?}"
    );
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "tokens out of lock order: {tokens:?}"
    );
}

/// The lock session's try and unlock are protocol-level prepared statements
/// (parsed once per connection) only where no pooler can be in between: on
/// a direct connection, from its second lock of a kind, `pg_stat_activity`
/// shows the prepared statement's own text; through PgBouncer (even in session mode, which keeps exclusion) it
/// shows `EXECUTE` of a statement under the connection's own name, which no
/// other client can know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_protocol_prepared_only_on_a_direct_connection() {
    let bouncer = PgBouncer::start("session").await;
    let watcher = pg_raw().await;
    for (base, want) in [
        (common::pg_url(), "SELECT pg_try_advisory_lock($1"),
        (bouncer.url(), "EXECUTE dbmutex_"),
    ] {
        let app = unique("stmt-form");
        let sep = if base.contains('?') { '&' } else { '?' };
        let locker = Locker::connect(&format!("{base}{sep}application_name={app}"))
            .await
            .unwrap();
        let name = unique("stmt-form");
        // The first lock of a kind on a connection goes as `EXECUTE` even
        // directly (one round trip to prepare and run); the second is where
        // the forms part.
        let first = locker.try_lock(name.as_str()).await.unwrap().expect("free");
        first.release().await.unwrap();
        let g = locker.try_lock(name.as_str()).await.unwrap().expect("free");
        let last = last_lock_statement(&watcher, &app).await;
        let prepared = !last.contains("EXECUTE");
        assert!(
            last.contains(want) && prepared == want.starts_with("SELECT"),
            "through {base}: the lock session last ran {last:?}"
        );
        // Directly, the session is at the other end of our own socket:
        // nothing can move it, and the statement is the raw one, with no
        // claim check. Through the pooler the check stays.
        assert_eq!(
            last == "SELECT pg_try_advisory_lock($1, $2)",
            base == common::pg_url(),
            "through {base}: {last:?}"
        );
        g.release().await.unwrap();
        assert!(common::free_for(&locker, &name).await);
    }
}
