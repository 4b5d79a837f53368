//! Security (issue #6): passwords never reach errors, logs or `Debug`;
//! introspection shows only what the connecting role may see.
//!
//! The log check installs a small capturing `tracing` subscriber for this
//! test binary (no extra dependency) that records every event and span field.

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{pg_raw, unique, Backend};
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
        // Not covered: a URL without `scheme://` ("u:secret@h/db") is shown
        // unredacted by `LockerBuilder`'s Debug and the "not a URL" error
        // (RELIABILITY.md, open defects).
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
    let admin = pg_raw().await;
    admin
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE dbmutex_viewer LOGIN; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
        )
        .await
        .unwrap();
    let viewer_url = common::pg_url().replacen("://postgres@", "://dbmutex_viewer@", 1);
    assert!(viewer_url.contains("dbmutex_viewer"), "{viewer_url}");
    let viewer = match Locker::connect(&viewer_url).await {
        Ok(l) => l,
        Err(e) => panic!(
            "cannot connect as dbmutex_viewer ({}): {e}",
            dbmutex::redact_url(&viewer_url)
        ),
    };
    let owner = Backend::Postgres.locker().await;
    let (theirs, mine) = (unique("sec-theirs"), unique("sec-mine"));
    let g1 = owner.lock(theirs.as_str()).await.unwrap();
    let g2 = viewer.lock(mine.as_str()).await.unwrap();

    let key_theirs = owner.key_of(theirs.as_str()).unwrap();
    let key_mine = viewer.key_of(mine.as_str()).unwrap();
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

    // The superuser sees both names.
    let all = owner.list().await.unwrap();
    for (k, n) in [(&key_theirs, &theirs), (&key_mine, &mine)] {
        let l = all.iter().find(|l| &l.key == k).expect("listed");
        assert_eq!(l.name.as_deref(), Some(n.as_str()));
    }
    g1.release().await.unwrap();
    g2.release().await.unwrap();
}
