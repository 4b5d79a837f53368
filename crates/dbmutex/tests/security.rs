//! Security (issues #6 and #9 item 8): passwords never reach errors, logs or
//! `Debug`, whatever characters they hold; introspection shows only what the
//! connecting role may see.
//!
//! The log check installs a small capturing `tracing` subscriber for this
//! test binary (no extra dependency) that records every event and span field.

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::hostile::{connection_strings, host_port, hostile_passwords, pct, Secret};
use common::{unique, Backend};
use dbmutex::{LockOptions, Locker};

const SECRET: &str = "hunter2-dbmutex-secret";

/// Every event and span field seen by the process, as text.
#[derive(Default)]
struct Capture(Mutex<String>);

struct Visit<'a>(&'a mut String);

impl tracing::field::Visit for Visit<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push_str(&format!(" {}={}", field.name(), value));
    }
}

struct Subscriber(Arc<Capture>);

impl tracing::Subscriber for Subscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut s = self.0 .0.lock().unwrap();
        s.push_str(span.metadata().name());
        span.record(&mut Visit(&mut s));
        s.push('\n');
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut Visit(&mut self.0 .0.lock().unwrap()));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut s = self.0 .0.lock().unwrap();
        s.push_str(event.metadata().level().as_str());
        event.record(&mut Visit(&mut s));
        s.push('\n');
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The process-wide capture (installed once; tasks on any thread log to it).
fn capture() -> Arc<Capture> {
    static CAP: OnceLock<Arc<Capture>> = OnceLock::new();
    CAP.get_or_init(|| {
        let cap = Arc::new(Capture::default());
        tracing::subscriber::set_global_default(Subscriber(cap.clone())).expect("the only global subscriber");
        cap
    })
    .clone()
}

/// The test URL with a password in it (the test server trusts loopback, so
/// the password is accepted and ignored).
fn url_with_password() -> String {
    common::pg_url().replacen("://postgres@", &format!("://postgres:{SECRET}@"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_reach_errors_logs_or_debug() {
    let cap = capture();
    let url = url_with_password();
    assert!(url.contains(SECRET), "the test URL carries the password: {url}");
    let mut texts = Vec::new();

    let builder = Locker::builder(&url).application_name("dbmutex-security");
    texts.push(format!("{builder:?}"));
    let locker = Backend::Postgres.connect(builder).await;
    texts.push(format!("{locker:?}"));

    // Errors: unreachable, refused login, malformed URL, bad sslmode.
    for bad in [
        format!("postgres://postgres:{SECRET}@127.0.0.1:1/test"),
        format!("postgres://no_such_role_dbmutex:{SECRET}@127.0.0.1:5432/test"),
        format!("postgres://postgres:{SECRET}@127.0.0.1:5432/test?bogus=1"),
        format!("postgres://postgres:{SECRET}@127.0.0.1:5432/test?sslmode=bogus"),
        format!("postgres://127.0.0.1:5432/test?password={SECRET}&bogus=1"),
        format!("postgres://postgres:{SECRET}@[::1"),
        format!("nosuch://u:{SECRET}@h/db"),
        format!("u:{SECRET}@h/db"),
        format!("host=127.0.0.1 port=5432 user=postgres password={SECRET} dbname=test"),
    ] {
        let b = Locker::builder(&bad).connect_timeout(Duration::from_secs(2));
        texts.push(format!("{b:?}"));
        let err = b.connect().await.expect_err(&dbmutex::redact_url(&bad));
        texts.push(err.to_string());
        texts.push(format!("{err:?}"));
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            texts.push(s.to_string());
            source = s.source();
        }
    }

    // Logs: a lock, its loss (the connection-ended warning), a scoped call
    // stopped by the loss, releases.
    let name = unique("sec");
    let g = locker.lock(name.as_str()).await.unwrap();
    texts.push(format!("{g:?}"));
    let pid = locker.holders(name.as_str()).await.unwrap()[0].pid;
    Backend::Postgres.kill_session(pid).await;
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("loss seen");
    let err = g.release().await.unwrap_err();
    texts.push(format!("{err} {err:?}"));
    let xact = locker
        .acquire(name.as_str(), &LockOptions::new().transaction(true))
        .await
        .unwrap()
        .expect("free");
    xact.release().await.unwrap();
    for l in locker.list().await.unwrap() {
        texts.push(format!("{l:?}"));
    }

    let logs = cap.0.lock().unwrap().clone();
    assert!(
        logs.contains("dbmutex"),
        "the capture saw dbmutex's events:\n{logs}"
    );
    texts.push(logs);
    for t in &texts {
        assert!(!t.contains(SECRET), "password leaked in: {t}");
    }
}

/// `list()` and `holders()` show what PostgreSQL lets the role see: an
/// unprivileged role sees every advisory lock's key and holder pid (pg_locks
/// is public), but not the query text of other roles' sessions
/// (pg_stat_activity hides it unless the role is a superuser or has
/// pg_read_all_stats), so the lock names dbmutex reads from that text stay
/// hidden. Its own locks' names it sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_shows_only_what_the_role_may_see() {
    // Roles are server-wide: on a private server, not the shared one.
    let pg = common::PrivatePg::start(&[]);
    let admin = pg.raw().await;
    admin
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE dbmutex_viewer LOGIN; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
        )
        .await
        .unwrap();
    let viewer_url = pg.url().replacen("://postgres@", "://dbmutex_viewer@", 1);
    assert!(viewer_url.contains("dbmutex_viewer"), "{viewer_url}");
    let viewer = match Locker::connect(&viewer_url).await {
        Ok(l) => l,
        Err(e) => panic!(
            "cannot connect as dbmutex_viewer ({}): {e}",
            dbmutex::redact_url(&viewer_url)
        ),
    };
    let owner = Locker::connect(&pg.url()).await.unwrap();
    let (theirs, mine) = (unique("sec-theirs"), unique("sec-mine"));
    let g1 = owner.lock(theirs.as_str()).await.unwrap();
    let g2 = viewer.lock(mine.as_str()).await.unwrap();

    let key_theirs = owner.key_of(theirs.as_str()).unwrap();
    let key_mine = viewer.key_of(mine.as_str()).unwrap();
    // Lock statements are prepared and carry no name; a lock session's
    // keepalive probe carries its last lock's name once the session has been
    // quiet for the keepalive period (1 s here).
    let named = |l: &Locker, key: String| {
        let l = l.clone();
        async move {
            common::eventually(Duration::from_secs(5), || {
                let (l, key) = (l.clone(), key.clone());
                async move {
                    l.list()
                        .await
                        .unwrap()
                        .iter()
                        .any(|x| x.key == key && x.name.is_some())
                }
            })
            .await
        }
    };
    assert!(
        named(&owner, key_mine.clone()).await,
        "the viewer's lock is named in time"
    );
    assert!(
        named(&owner, key_theirs.clone()).await,
        "the owner's lock is named in time"
    );
    let seen = viewer.list().await.unwrap();
    let t = seen
        .iter()
        .find(|l| l.key == key_theirs)
        .expect("the viewer sees the other role's lock key");
    assert_eq!(
        t.name, None,
        "another role's query text (and so the name) is hidden: {t:?}"
    );
    let m = seen.iter().find(|l| l.key == key_mine).expect("own lock listed");
    assert_eq!(
        m.name.as_deref(),
        Some(mine.as_str()),
        "own lock's name is visible"
    );
    let h = viewer.holders(theirs.as_str()).await.unwrap();
    assert_eq!(h.len(), 1, "{h:?}");

    // The superuser sees both names (the viewer's once its session has been
    // quiet again for the keepalive period: its own list just ran there).
    for (k, n) in [(&key_theirs, &theirs), (&key_mine, &mine)] {
        assert!(named(&owner, k.clone()).await, "{n} named in time");
        let all = owner.list().await.unwrap();
        let l = all.iter().find(|l| &l.key == k).expect("listed");
        assert_eq!(l.name.as_deref(), Some(n.as_str()));
    }
    g1.release().await.unwrap();
    g2.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// Hostile passwords (issue 9, item 8)

/// Everything a caller can print about an error: Display, Debug (both
/// forms), and each source's Display and Debug.
fn error_texts(err: &dbmutex::Error) -> Vec<String> {
    let mut texts = vec![err.to_string(), format!("{err:?}"), format!("{err:#?}")];
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        texts.push(s.to_string());
        texts.push(format!("{s:?}"));
        source = s.source();
    }
    texts
}

fn assert_no_leak(secret: &Secret, what: &str, texts: &[String]) -> usize {
    for t in texts {
        for n in &secret.needles {
            assert!(
                !t.contains(n.as_str()),
                "{what}: the password {:?} leaked ({n:?}) in:\n{t}",
                secret.text
            );
        }
    }
    texts.len()
}

/// Hostile passwords through every library output path, against a closed
/// port (connection refused) and the real servers (PostgreSQL trusts
/// loopback, so a password is ignored and the locker connects; MariaDB
/// refuses root with a wrong password).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passwords_never_leak() {
    let cap = capture();
    let secrets = hostile_passwords(40);
    let real_pg = host_port(&common::pg_url());
    let real_my = host_port(&common::mysql_url());
    let targets = [
        ("closed ports", "127.0.0.1:1".to_owned(), "127.0.0.1:1".to_owned()),
        ("real servers", real_pg, real_my),
    ];
    let (mut strings, mut checked, mut connected, mut refused_config) = (0, 0, 0, 0);
    for (label, pg, my) in &targets {
        for (i, s) in secrets.iter().enumerate() {
            for url in connection_strings(&s.text, pg, my) {
                strings += 1;
                let what = format!("{label}, {url:?}");
                let mut texts = vec![dbmutex::redact_url(&url)];
                let builder = Locker::builder(&url).connect_timeout(Duration::from_secs(3));
                texts.push(format!("{builder:?}"));
                texts.push(format!("{builder:#?}"));
                match builder.connect().await {
                    Err(err) => {
                        if matches!(err, dbmutex::Error::Config(_)) {
                            refused_config += 1;
                        }
                        texts.extend(error_texts(&err));
                    }
                    Ok(locker) => {
                        connected += 1;
                        texts.push(format!("{locker:?}"));
                        // A few full cycles (lock, introspect, release) with
                        // each kind of string that connects.
                        if i % 8 == 0 {
                            let name = unique("sec-hostile");
                            let g = locker.lock(name.as_str()).await.expect("lock");
                            texts.push(format!("{g:?}"));
                            texts.push(format!(
                                "{:?}",
                                locker.holders(name.as_str()).await.expect("holders")
                            ));
                            for l in locker.list().await.expect("list") {
                                texts.push(format!("{l:?}"));
                            }
                            g.release().await.expect("release");
                        }
                    }
                }
                checked += assert_no_leak(s, &what, &texts);
            }
            // A tokio-postgres Config handed over as is.
            let mut config = tokio_postgres::Config::new();
            config
                .user("postgres")
                .password(s.text.as_bytes())
                .host("127.0.0.1")
                .port(1)
                .dbname("test")
                .options(format!("-c application_name={}", pct(&s.text)));
            let builder = Locker::pg_config_builder(config).connect_timeout(Duration::from_secs(3));
            let mut texts = vec![format!("{builder:?}"), format!("{builder:#?}")];
            if let Err(err) = builder.connect().await {
                texts.extend(error_texts(&err));
            }
            strings += 1;
            checked += assert_no_leak(s, "pg_config_builder", &texts);
            if label == &"real servers" && i % 10 == 0 {
                // Keep MariaDB's failed-connection counter for 127.0.0.1
                // far from max_connect_errors: a good login resets it.
                drop(Backend::Mysql.locker().await);
            }
        }
    }
    // Give dropped lockers' background tasks a moment to log their ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let logs = cap.0.lock().unwrap().clone();
    for s in &secrets {
        assert_no_leak(s, "tracing output", std::slice::from_ref(&logs));
    }
    assert!(
        logs.contains("dbmutex: connecting") && logs.contains("dbmutex: connect failed"),
        "the capture saw the connect events"
    );
    assert!(connected > 0, "some strings reached the real PostgreSQL server");
    assert!(refused_config > 0, "some strings were refused as malformed");
    eprintln!(
        "hostile passwords: {} passwords, {strings} connection strings, {checked} texts checked \
         ({connected} connected, {refused_config} refused as malformed), plus {} bytes of tracing output",
        secrets.len(),
        logs.len()
    );
}
