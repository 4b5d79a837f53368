//! Shared test support: the backends under test, unique lock names, and
//! helpers that talk to the servers directly (raw SQL, killing sessions).
//!
//! A test that needs a database and cannot reach it panics with the URL and
//! the error: a run that tested nothing must not look green.
#![allow(dead_code)]

pub mod hostile;
pub mod netns;
pub mod pgbouncer;
pub mod pgpool;
pub mod private;
#[cfg(feature = "etcd")]
pub mod private_etcd;
pub mod private_mariadb;
pub mod private_pg;
#[allow(unused_imports)]
pub use private_mariadb::PrivateMariaDb;
#[allow(unused_imports)]
pub use private_pg::PrivatePg;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use dbmutex::{Locker, LockerBuilder};

/// The PostgreSQL URL the tests use (env `DBMUTEX_TEST_PG_URL`).
pub fn pg_url() -> String {
    std::env::var("DBMUTEX_TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The MySQL/MariaDB URL the tests use (env `DBMUTEX_TEST_MYSQL_URL`).
pub fn mysql_url() -> String {
    std::env::var("DBMUTEX_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A backend under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Mysql,
    Local,
    /// The private 3-member cluster this test process shares
    /// ([`private_etcd::PrivateEtcd::shared`]).
    #[cfg(feature = "etcd")]
    Etcd,
}

/// One lock directory per test process, shared by all lockers of a test so
/// that they contend.
fn local_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("dbmutex-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the test lock directory");
        d
    })
    .clone()
}

impl Backend {
    /// The URL a locker for this backend connects to.
    pub fn url(self) -> String {
        match self {
            Backend::Postgres => pg_url(),
            Backend::Mysql => mysql_url(),
            Backend::Local => format!("file://{}", local_dir().display()),
            #[cfg(feature = "etcd")]
            Backend::Etcd => private_etcd::PrivateEtcd::shared().url(),
        }
    }

    /// A builder for this backend.
    pub fn builder(self) -> LockerBuilder {
        Locker::builder(&self.url())
    }

    /// A new locker: its own server session(s), so two lockers contend like
    /// two processes. Panics loudly when the server cannot be reached.
    pub async fn locker(self) -> Locker {
        self.connect(self.builder()).await
    }

    /// Connects `builder`, panicking loudly on failure.
    pub async fn connect(self, builder: LockerBuilder) -> Locker {
        match builder.connect().await {
            Ok(l) => l,
            Err(e) => panic!(
                "cannot reach the {self:?} test server at {}: {e} (start it, or set the URL variable)",
                dbmutex::redact_url(&self.url())
            ),
        }
    }

    /// The library's kind for this backend.
    pub fn kind(self) -> dbmutex::BackendKind {
        match self {
            Backend::Postgres => dbmutex::BackendKind::Postgres,
            Backend::Mysql => dbmutex::BackendKind::Mysql,
            Backend::Local => dbmutex::BackendKind::Local,
            #[cfg(feature = "etcd")]
            Backend::Etcd => dbmutex::BackendKind::Etcd,
        }
    }

    /// Shared locks exist on this backend.
    pub fn supports_shared(self) -> bool {
        self.kind().capabilities().shared
    }

    /// Transaction-level locks exist on this backend.
    pub fn supports_transaction(self) -> bool {
        self.kind().capabilities().transaction
    }

    /// A lock can be lost (its server connection can die).
    pub fn can_lose(self) -> bool {
        self.kind().capabilities().can_lose
    }

    /// Ends the server session with this id, as an operator would
    /// (`pg_terminate_backend`, `KILL`).
    pub async fn kill_session(self, pid: i64) {
        match self {
            Backend::Postgres => {
                let c = pg_raw().await;
                let pid = i32::try_from(pid).expect("PostgreSQL pids fit in int4");
                let row = c
                    .query_one("SELECT pg_terminate_backend($1)", &[&pid])
                    .await
                    .unwrap();
                assert!(
                    row.get::<_, bool>(0),
                    "pg_terminate_backend({pid}) found no such backend"
                );
            }
            Backend::Mysql => {
                use mysql_async::prelude::Queryable;
                let mut c = mysql_raw().await;
                c.query_drop(format!("KILL {pid}")).await.unwrap();
            }
            Backend::Local => panic!("the local backend has no sessions to kill"),
            #[cfg(feature = "etcd")]
            Backend::Etcd => panic!("etcd sessions are leases: revoke one (etcdctl lease revoke)"),
        }
    }
}

/// A raw tokio-postgres connection to the test database (no dbmutex logic).
pub async fn pg_raw() -> tokio_postgres::Client {
    let url = pg_url();
    let (client, conn) = match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot reach the PostgreSQL test server at {}: {e}",
            dbmutex::redact_url(&url)
        ),
    };
    tokio::spawn(conn);
    client
}

/// A raw mysql_async connection to the test database.
pub async fn mysql_raw() -> mysql_async::Conn {
    let url = mysql_url().replacen("mariadb://", "mysql://", 1);
    let opts = mysql_async::Opts::from_url(&url).expect("test MySQL URL");
    match mysql_async::Conn::new(opts).await {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot reach the MySQL test server at {}: {e}",
            dbmutex::redact_url(&url)
        ),
    }
}

/// A lock name no other test (or earlier run) uses.
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "t-{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Retries `check` for up to `within` until it returns true. For effects
/// that happen in the background (an unlock queued by a drop).
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether another locker can take `name` now (and releases it again).
pub async fn free_for(other: &Locker, name: &str) -> bool {
    match other.try_lock(name).await.expect("probe try_lock") {
        Some(g) => {
            g.release().await.expect("probe release");
            true
        }
        None => false,
    }
}

/// Polls `fut` until it has suspended `n` times, then drops it: a
/// cancellation at its n-th await point that really waited. Returns the
/// output if the future finished first.
pub struct CancelAfter<F> {
    fut: Pin<Box<F>>,
    pendings_left: usize,
}

impl<F: Future> CancelAfter<F> {
    pub fn new(fut: F, n: usize) -> Self {
        CancelAfter {
            fut: Box::pin(fut),
            pendings_left: n,
        }
    }
}

impl<F: Future> Future for CancelAfter<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.fut.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending if self.pendings_left == 0 => Poll::Ready(None),
            Poll::Pending => {
                self.pendings_left -= 1;
                Poll::Pending
            }
        }
    }
}

/// A PostgreSQL schema of its own and a login role that may use it but
/// create nothing in it: the least-privilege deployment of `dbmutex init`.
pub struct PgSandbox {
    pub schema: String,
    pub role: String,
}

impl PgSandbox {
    /// Creates both (names unique to this test run, from `tag`).
    pub async fn new(tag: &str) -> PgSandbox {
        let schema = unique(tag).replace('-', "_");
        let role = format!("{schema}_app");
        pg_raw()
            .await
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA {schema} TO {role}"
            ))
            .await
            .unwrap();
        PgSandbox { schema, role }
    }

    /// A locker connected as `user` (the sandbox's role, or the test
    /// server's superuser `postgres`), with the schema as its search path.
    pub async fn locker_as(&self, user: &str) -> Locker {
        let rest = pg_url().split_once('@').unwrap().1.to_owned();
        let sep = if rest.contains('?') { '&' } else { '?' };
        let url = format!(
            "postgres://{user}@{rest}{sep}options=-csearch_path%3D{}",
            self.schema
        );
        Backend::Postgres.connect(Locker::builder(&url)).await
    }

    /// The documented grants on one of dbmutex's tables, to the role.
    pub async fn grant(&self, table: &str) {
        pg_raw()
            .await
            .batch_execute(&format!(
                "GRANT SELECT, INSERT, UPDATE ON {}.{table} TO {}",
                self.schema, self.role
            ))
            .await
            .unwrap();
    }

    /// Drops both.
    pub async fn remove(self) {
        pg_raw()
            .await
            .batch_execute(&format!(
                "DROP SCHEMA {} CASCADE; DROP OWNED BY {role}; DROP ROLE {role}",
                self.schema,
                role = self.role
            ))
            .await
            .unwrap();
    }
}

/// Runs `call()` again and again, cancelled at its first, second, …
/// await point, until a run completes (its output is returned); after each
/// cancellation `name` must come free for `other` within 10 s. Panics if
/// the call never suspends, or never completes within 200 cancellations.
pub async fn cancel_at_each_await_point<T, F, Fut>(other: &Locker, name: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    for n in 0..200 {
        if let Some(out) = CancelAfter::new(call(), n).await {
            assert!(n > 0, "{name}: the call never suspended");
            return out;
        }
        assert!(
            eventually(Duration::from_secs(10), || free_for(other, name)).await,
            "{name}: held after a cancellation at await point {n}"
        );
    }
    panic!("{name}: the call never completed")
}

/// `url` (`scheme://user@host[:port]/path`), reached through a
/// [`freezable_proxy`] on 127.0.0.1; `default_port` when the URL names none.
pub async fn proxied(
    url: &str,
    default_port: u16,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let (scheme_user, rest) = url.split_once('@').expect("a URL with a user");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let target = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    };
    let (port, frozen) = freezable_proxy(target).await;
    (format!("{scheme_user}@127.0.0.1:{port}/{path}"), frozen)
}

/// A TCP proxy on 127.0.0.1 to `target` (`host:port`) that can go silent,
/// as a network partition does: once `frozen` is set nothing is forwarded
/// any more, yet no socket closes. Returns its port.
pub async fn freezable_proxy(target: String) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let frozen = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        frozen: Arc<AtomicBool>,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            while frozen.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Read before the freeze, held back after it.
            while frozen.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
    tokio::spawn({
        let frozen = frozen.clone();
        async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, frozen.clone()));
                tokio::spawn(pipe(sr, cw, frozen.clone()));
            }
        }
    });
    (port, frozen)
}

/// A TCP listener on 127.0.0.1 that accepts connections and never sends a
/// byte, as a stalled server (or one behind a silent partition) would: the
/// client waits for a greeting that never comes. Returns its port; it
/// listens for as long as the test's runtime lives.
pub async fn silent_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket); // held open, never written to
        }
    });
    port
}

/// Stamps out one `#[tokio::test]` per backend for each test function
/// `async fn name(b: Backend)` of the common list, plus each backend's own
/// extras (tests that only make sense there: a lock that can be lost needs
/// a server connection), as the CLI's `backend_tests!` does:
///
/// ```ignore
/// for_each_backend! {
///     [exclusive_excludes_another_session, bounded_wait_times_out]
///     postgres: [lost_connection_is_reported],
///     mysql: [lost_connection_is_reported, unsupported_options_are_typed_errors],
///     local: [unsupported_options_are_typed_errors],
/// }
/// ```
#[macro_export]
macro_rules! for_each_backend {
    (@one $(#[$attr:meta])* $module:ident $variant:ident [$($common:ident),*] [$($extra:ident),*]) => {
        $(#[$attr])*
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $common() {
                    super::$common($crate::common::Backend::$variant).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $extra() {
                    super::$extra($crate::common::Backend::$variant).await
                }
            )*
        }
    };
    (
        [$($common:ident),* $(,)?]
        postgres: [$($pg:ident),* $(,)?],
        mysql: [$($my:ident),* $(,)?],
        local: [$($lo:ident),* $(,)?] $(,)?
    ) => {
        $crate::for_each_backend!(@one postgres Postgres [$($common),*] [$($pg),*]);
        $crate::for_each_backend!(@one mysql Mysql [$($common),*] [$($my),*]);
        $crate::for_each_backend!(@one local Local [$($common),*] [$($lo),*]);
    };
    // With an `etcd:` list, the same tests run on etcd too (feature `etcd`).
    (
        [$($common:ident),* $(,)?]
        postgres: [$($pg:ident),* $(,)?],
        mysql: [$($my:ident),* $(,)?],
        local: [$($lo:ident),* $(,)?],
        etcd: [$($et:ident),* $(,)?] $(,)?
    ) => {
        $crate::for_each_backend!([$($common),*] postgres: [$($pg),*], mysql: [$($my),*], local: [$($lo),*]);
        $crate::for_each_backend!(@one #[cfg(feature = "etcd")] etcd Etcd [$($common),*] [$($et),*]);
    };
}

/// Each of `kinds` of lock, taken on `b` by a locker whose keepalive probe
/// runs every 200 ms, is still held after 1.5 s (some seven probes): not
/// reported lost, and an exclusive try of another locker is refused; then
/// its release succeeds and frees it. A probe that fails on a healthy
/// connection (once, a transaction lock's was invalid SQL) reports every
/// lock of that kind lost one keepalive period after its grant.
pub async fn each_kind_outlives_its_probes(b: Backend, kinds: &[dbmutex::LockOptions]) {
    let a = b.connect(b.builder().keepalive(Duration::from_millis(200))).await;
    let other = b.locker().await;
    for opts in kinds {
        let name = unique("probed");
        let g = a
            .acquire(name.as_str(), opts)
            .await
            .unwrap_or_else(|e| panic!("{opts:?}: {e}"))
            .unwrap_or_else(|| panic!("{opts:?}: a free lock not acquired"));
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert!(g.is_held(), "{opts:?}: reported lost while held");
        assert!(
            other.try_lock(name.as_str()).await.unwrap().is_none(),
            "{opts:?}: the server let it go"
        );
        g.release()
            .await
            .unwrap_or_else(|e| panic!("{opts:?}: release: {e}"));
        assert!(
            eventually(Duration::from_secs(3), || free_for(&other, &name)).await,
            "{opts:?}: not free after release"
        );
    }
}
