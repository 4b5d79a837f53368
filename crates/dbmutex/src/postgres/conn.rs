//! PostgreSQL connections: URL and TLS handling, and a connection whose end
//! is an immediate lock-loss signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config};

use super::sql::{self, Call};
use crate::key::PgKey;
use crate::redact::{pg_reason, redact_url};
use crate::settings::Settings;
use crate::{Error, Result};
use crate::{LockName, Mode};

/// What to do with `NOTIFY` messages arriving on a connection.
pub(crate) type NotifyHandler = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// How to make connections: a parsed configuration and a TLS choice.
#[derive(Clone)]
pub(crate) struct Connector {
    config: Config,
    tls: Tls,
    /// Shared by every connection made here: set when one of them finds
    /// its statements running on another server session.
    pooler_seen: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Clone)]
enum Tls {
    Off,
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    /// Parses a `postgres://` URL. `sslmode` follows libpq: `disable`;
    /// `prefer` (the default) and `require` encrypt without verifying the
    /// certificate; `verify-ca` and `verify-full` verify it (against
    /// `sslrootcert` if given, else the Mozilla roots) and the host name.
    pub(crate) fn from_url(url: &str, settings: &Settings) -> Result<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut sslmode = "prefer".to_owned();
        let mut rootcert = None;
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            match kv.split_once('=') {
                Some(("sslmode", v)) => sslmode = v.to_owned(),
                Some(("sslrootcert", v)) => rootcert = Some(v.to_owned()),
                _ => kept.push(kv),
            }
        }
        let verify = match sslmode.as_str() {
            "disable" | "allow" => None,
            "prefer" | "require" => Some(false),
            "verify-ca" | "verify-full" => Some(true),
            // The value is not quoted: it may be the tail of a password.
            _ => {
                return Err(Error::Config(
                    "sslmode is not one of disable, allow, prefer, require, verify-ca, verify-full".into(),
                ))
            }
        };
        let pg_mode = match sslmode.as_str() {
            "disable" | "allow" => "disable",
            "prefer" => "prefer",
            _ => "require",
        };
        kept.push(if pg_mode == "disable" {
            "sslmode=disable"
        } else if pg_mode == "prefer" {
            "sslmode=prefer"
        } else {
            "sslmode=require"
        });
        let rebuilt = format!("{base}?{}", kept.join("&"));
        let config: Config = rebuilt.parse().map_err(|e: tokio_postgres::Error| {
            Error::Config(format!(
                "bad PostgreSQL URL {}: {}",
                redact_url(url),
                pg_reason(&e)
            ))
        })?;
        let tls = match verify {
            None => Tls::Off,
            Some(verify) => make_tls(verify, rootcert.as_deref())?,
        };
        Ok(Self::with_config(config, tls, settings))
    }

    /// From a tokio-postgres `Config`: TLS as its `ssl_mode` says
    /// (`prefer`/`require` encrypt without verifying, as libpq does).
    pub(crate) fn from_config(config: Config, settings: &Settings) -> Result<Self> {
        let tls = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => Tls::Off,
            _ => make_tls(false, None)?,
        };
        Ok(Self::with_config(config, tls, settings))
    }

    fn with_config(mut config: Config, tls: Tls, settings: &Settings) -> Self {
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(settings.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name(&settings.application_name);
        }
        // The kernel notices a dead peer of an idle connection after about
        // idle + interval; TCP_USER_TIMEOUT bounds unacknowledged sends.
        let ka = settings.keepalive.max(Duration::from_secs(1));
        config
            .keepalives(true)
            .keepalives_idle(ka)
            .keepalives_interval(ka)
            .keepalives_retries(1)
            .tcp_user_timeout(ka * 2);
        Connector {
            config,
            tls,
            pooler_seen: Arc::default(),
        }
    }

    /// Opens a connection. `on_notify` receives `NOTIFY` messages. With
    /// `claim`, it claims its server session (see [`Claim`]) before it is
    /// returned; a connection for transaction locks needs no claim (and
    /// behind a busy pooler, a claim would wait for a free server session).
    pub(crate) async fn connect(
        &self,
        settings: &Settings,
        on_notify: Option<NotifyHandler>,
        claim: bool,
    ) -> Result<Arc<PgConn>> {
        let fut = async {
            match &self.tls {
                Tls::Off => {
                    let (client, conn) = self
                        .config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map_err(connect_err)?;
                    Ok::<_, Error>(self.start(client, conn, on_notify))
                }
                #[cfg(feature = "tls")]
                Tls::Rustls(t) => {
                    let (client, conn) = self.config.connect(t.clone()).await.map_err(connect_err)?;
                    Ok::<_, Error>(self.start(client, conn, on_notify))
                }
            }
        };
        let connect_and_claim = async {
            let conn = fut.await?;
            if claim {
                conn.claim().await?;
            }
            Ok::<_, Error>(conn)
        };
        match tokio::time::timeout(settings.connect_timeout, connect_and_claim).await {
            Ok(r) => r,
            Err(_) => Err(Error::Connect(
                format!("no answer from the server within {:?}", settings.connect_timeout).into(),
            )),
        }
    }

    /// Wraps a connected client in a [`PgConn`] of this connector.
    fn start<S, T>(
        &self,
        client: Client,
        conn: tokio_postgres::Connection<S, T>,
        on_notify: Option<NotifyHandler>,
    ) -> Arc<PgConn>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        PgConn::start(
            client,
            conn,
            self.tls.clone(),
            on_notify,
            self.pooler_seen.clone(),
        )
    }

    /// True once any connection of this connector has seen its statements
    /// run on a server session other than its own (a pooler shares them).
    pub(crate) fn pooler_seen(&self) -> bool {
        self.pooler_seen.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn connect_err(e: tokio_postgres::Error) -> Error {
    Error::Connect(Box::new(e))
}

#[cfg(feature = "tls")]
fn make_tls(verify: bool, rootcert: Option<&str>) -> Result<Tls> {
    use rustls::ClientConfig;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?;
    let config = if verify {
        let mut roots = rustls::RootCertStore::empty();
        match rootcert {
            Some(path) => {
                use rustls::pki_types::pem::PemObject;
                let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
                    .map_err(|e| Error::Config(format!("sslrootcert file: {e}")))?;
                for c in certs {
                    let c = c.map_err(|e| Error::Config(format!("sslrootcert file: {e}")))?;
                    roots
                        .add(c)
                        .map_err(|e| Error::Config(format!("sslrootcert file: {e}")))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth()
    };
    Ok(Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

#[cfg(not(feature = "tls"))]
fn make_tls(_verify: bool, _rootcert: Option<&str>) -> Result<Tls> {
    Err(Error::Config(
        "TLS requested (sslmode) but dbmutex was built without the `tls` feature; use sslmode=disable".into(),
    ))
}

/// libpq's `sslmode=prefer`/`require`: encrypt, but accept any certificate.
#[cfg(feature = "tls")]
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

#[cfg(feature = "tls")]
impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One server session. When its connection ends, for whatever reason, `lost`
/// turns true at once: every lock held on it is gone.
pub(crate) struct PgConn {
    /// Unique in the process, to tell sessions apart.
    pub(crate) id: u64,
    pub(crate) client: Client,
    lost: watch::Sender<bool>,
    cancel: CancelToken,
    tls: Tls,
    task: tokio::task::AbortHandle,
    /// Where to spawn unlocks queued by a drop on a thread with no runtime.
    pub(crate) runtime: tokio::runtime::Handle,
    /// The last lock name sent in a comment, so the keepalive query can
    /// carry it too (pg_stat_activity keeps showing it).
    last_comment: std::sync::Mutex<String>,
    /// When the session last heard from the server (ms since `born`).
    last_answer_ms: std::sync::atomic::AtomicU64,
    born: std::time::Instant,
    /// Prepared lock statements (used when name comments are off).
    /// Keyed by call, mode and key form (`true`: `bigint`), so the hot path
    /// builds no SQL text to find one.
    statements: std::sync::Mutex<std::collections::HashMap<(Call, Mode, bool), tokio_postgres::Statement>>,
    /// The server session this connection claimed when it connected; unset
    /// when that session was already claimed by another client.
    claim: std::sync::OnceLock<Claim>,
    claim_tried: std::sync::atomic::AtomicBool,
    /// The server's lock-table settings, read with the claim.
    pub(crate) lock_table: std::sync::OnceLock<super::budget::LockTable>,
    /// The connector's flag: a pooler moved one of its connections.
    pooler_seen: Arc<std::sync::atomic::AtomicBool>,
}

/// A server session marked as ours: a random token in the session-level
/// setting `dbmutex.owner`, which only this connection's statements can
/// have set on that session. Every lock statement and heartbeat checks it
/// in the same statement, so a pooler that hands our next statement to
/// another server session is caught before anything is locked there.
pub(crate) struct Claim {
    /// 32 hex digits.
    pub(crate) token: String,
    /// The claimed session's backend pid and start, to end it if we are
    /// ever moved away from it while it holds our locks.
    pid: i32,
    started: String,
}

impl PgConn {
    fn start<S, T>(
        client: Client,
        mut conn: tokio_postgres::Connection<S, T>,
        tls: Tls,
        on_notify: Option<NotifyHandler>,
        pooler_seen: Arc<std::sync::atomic::AtomicBool>,
    ) -> Arc<PgConn>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (lost, _) = watch::channel(false);
        let lost_tx = lost.clone();
        let task = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if let Some(h) = &on_notify {
                            h(n.channel(), n.payload());
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "dbmutex: PostgreSQL connection ended");
                        break;
                    }
                    None => break,
                }
            }
            lost_tx.send_replace(true);
        });
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Arc::new(PgConn {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cancel: client.cancel_token(),
            client,
            lost,
            tls,
            task: task.abort_handle(),
            runtime: tokio::runtime::Handle::current(),
            statements: Default::default(),
            last_comment: Default::default(),
            last_answer_ms: std::sync::atomic::AtomicU64::new(0),
            born: std::time::Instant::now(),
            claim: std::sync::OnceLock::new(),
            claim_tried: Default::default(),
            lock_table: Default::default(),
            pooler_seen,
        })
    }

    /// Marks the server session as this connection's (see [`Claim`]), if no
    /// other client did. A session that carries another client's token is
    /// shared: we are behind a pooler (or one that keeps session state
    /// between clients), and this connection stays unclaimed.
    ///
    /// Tried once per connection; later calls return at once.
    pub(crate) async fn claim(&self) -> Result<()> {
        if self.claim_tried.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let token = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let rows = self
            .client
            .query_typed(
                "SELECT CASE WHEN coalesce(current_setting('dbmutex.owner', true), '') = '' \
                 THEN set_config('dbmutex.owner', $1, false) \
                 ELSE current_setting('dbmutex.owner', true) END, pg_backend_pid(), \
                 (SELECT extract(epoch FROM backend_start)::text FROM pg_stat_get_activity(pg_backend_pid())), \
                 current_setting('max_locks_per_transaction'), current_setting('max_connections'), \
                 current_setting('max_prepared_transactions')",
                &[(&token, tokio_postgres::types::Type::TEXT)],
            )
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
        let row = rows
            .first()
            .ok_or_else(|| Error::Connect("the session claim returned no row".into()))?;
        let owner: Option<String> = row.get(0);
        // Read as text: casts and the pg_stat_activity view would cost a
        // fresh backend milliseconds of catalog lookups on every connect.
        let setting = |i: usize| -> u64 {
            row.get::<_, Option<String>>(i)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let _ = self.lock_table.set(super::budget::LockTable {
            per_transaction: setting(3).max(1),
            slots: (setting(4) + setting(5)).max(1),
        });
        if owner.as_deref() == Some(token.as_str()) {
            let _ = self.claim.set(Claim {
                token,
                pid: row.get(1),
                started: row.get::<_, Option<String>>(2).unwrap_or_default(),
            });
        } else {
            self.pooler_seen.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.heard_from_server();
        Ok(())
    }

    /// This connection's claim token, `""` when it has none.
    pub(crate) fn owner(&self) -> &str {
        self.claim.get().map_or("", |c| c.token.as_str())
    }

    /// Whether this connection owns its server session (session locks are
    /// safe on it).
    pub(crate) fn is_claimed(&self) -> bool {
        self.claim.get().is_some()
    }

    /// A guarded statement found itself on a server session that is not
    /// ours: a pooler moved us. Our own session may still hold our locks,
    /// out of reach of every later statement, so it is ended (the only way
    /// to free them from outside), and this connection is closed: every
    /// guard on it reports the loss.
    pub(crate) fn moved(self: &Arc<Self>) {
        self.pooler_seen.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(
            "dbmutex: a statement ran on another server session than the one this connection \
             claimed: a transaction-pooling proxy (e.g. PgBouncer pool_mode=transaction) is in \
             between. Its locks are lost; ending our former server session if it holds them"
        );
        let me = self.clone();
        drop(self.runtime.spawn(async move {
            if let Some(c) = me.claim.get() {
                // Only a session that holds advisory locks (ours) is ended:
                // behind a pooler it may be running another client's
                // transaction right now. Matched by pid and start time (as
                // epoch seconds: no TimeZone or DateStyle in the way), so a
                // reused pid is never hit.
                let ended = me
                    .client
                    .query_typed(
                        "SELECT pg_terminate_backend(a.pid) FROM pg_stat_get_activity($1) a \
                         WHERE extract(epoch FROM a.backend_start)::text = $2 \
                         AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory')",
                        &[
                            (&c.pid, tokio_postgres::types::Type::INT4),
                            (&c.started, tokio_postgres::types::Type::TEXT),
                        ],
                    )
                    .await;
                match ended {
                    Ok(rows) if rows.iter().all(|r| r.get::<_, bool>(0)) => {}
                    Ok(_) => tracing::warn!(
                        pid = c.pid,
                        "dbmutex: the server refused to end our former server session; its locks stay until the pooler closes it"
                    ),
                    // Ended itself: the statement landed on that very session.
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, pid = c.pid, "dbmutex: could not end our former server session; its locks stay until the pooler closes it")
                    }
                }
            }
            me.close();
        }));
        // Reported lost now, whatever the termination takes.
        self.lost.send_replace(true);
    }

    /// Runs one session-lock call and returns its boolean (`true` for the
    /// void-returning waits), or `None` when the statement ran on a server
    /// session that is not ours (see [`Claim`]; the connection is then
    /// [`moved`](Self::moved) and lost). With `name`, the statement carries
    /// it in a comment and runs unprepared (`query_typed`: one round trip);
    /// without, it runs as a statement prepared once per connection.
    pub(crate) async fn lock_call(
        self: &Arc<Self>,
        call: Call,
        mode: Mode,
        key: &PgKey,
        name: Option<&LockName>,
    ) -> std::result::Result<Option<bool>, tokio_postgres::Error> {
        let owner = self.owner();
        if owner.is_empty() {
            // Unclaimed: a session lock here could land anywhere.
            self.moved();
            return Ok(None);
        }
        let rows = match name {
            Some(name) => {
                let comment = crate::key::sql_comment(name);
                let (sql, params) = sql::bound_commented(call, false, mode, key, &comment, owner);
                *self.last_comment.lock().unwrap_or_else(|e| e.into_inner()) = comment;
                self.client.query_typed(&sql, &params.as_typed()).await?
            }
            None => {
                let stmt = self.prepared(call, mode, key).await?;
                let params = sql::Params::of(key, owner);
                let values: Vec<_> = params.as_typed().into_iter().map(|(v, _)| v).collect();
                self.client.query(&stmt, &values).await?
            }
        };
        self.heard_from_server();
        match rows.first() {
            Some(r) => Ok(Some(r.try_get::<_, bool>(0).unwrap_or(true))),
            None => {
                self.moved();
                Ok(None)
            }
        }
    }

    fn heard_from_server(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        self.last_answer_ms
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keeps checking that the server answers, for a connection that runs
    /// only statements that answer at once (the lock session; a dedicated
    /// connection while it holds its lock): when it
    /// has been quiet for `every`, it sends `SELECT 1` (carrying the last
    /// lock name's comment, so `pg_stat_activity` still shows it); no answer
    /// within `every` (at least 500 ms) closes it and reports it lost. So a
    /// silent failure — a partition, a hung server — is noticed within
    /// `every + max(every, 500 ms)` of the last answer, where TCP keepalive
    /// alone may take much longer (a middlebox or proxy that still
    /// acknowledges TCP hides it).
    ///
    /// Each probe of a session-lock connection also checks that it still
    /// runs on its claimed server session (see [`Claim`]); with `xact` (a
    /// connection whose open transaction pins its session) it need not.
    pub(crate) fn start_heartbeat(self: &Arc<Self>, every: Duration, xact: bool) -> tokio::task::AbortHandle {
        let weak = Arc::downgrade(self);
        let answer_within = every.max(Duration::from_millis(500));
        self.runtime.spawn(async move {
            let mut wait = every;
            loop {
                tokio::time::sleep(wait).await;
                let Some(conn) = weak.upgrade() else { return };
                if conn.is_lost() {
                    return;
                }
                // The probe goes out `every` after the last answer, not on a
                // fixed tick: a tick could add up to another `every`.
                let quiet = Duration::from_millis(
                    (conn.born.elapsed().as_millis() as u64)
                        .saturating_sub(conn.last_answer_ms.load(std::sync::atomic::Ordering::Relaxed)),
                );
                if quiet < every {
                    wait = every - quiet;
                    continue;
                }
                wait = every;
                let comment = conn
                    .last_comment
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                // Still on our own server session? (A connection without a
                // claim holds only transaction locks, pinned by their
                // transaction.) The token is hex: nothing to escape.
                let query = match (conn.claim.get().filter(|_| !xact), comment.is_empty()) {
                    (Some(c), true) => format!("SELECT current_setting('dbmutex.owner', true) = '{}'", c.token),
                    (Some(c), false) => format!(
                        "SELECT current_setting('dbmutex.owner', true) = '{}' /* {comment} */",
                        c.token
                    ),
                    (None, true) => "SELECT 't'".to_owned(),
                    (None, false) => format!("SELECT 't' /* {comment} */"),
                };
                let probe = conn.client.simple_query(&query);
                tokio::pin!(probe);
                loop {
                    let asked_ms = conn.born.elapsed().as_millis() as u64;
                    match tokio::time::timeout(answer_within, &mut probe).await {
                        Ok(Ok(msgs)) => {
                            conn.heard_from_server();
                            if super::first_text(&msgs).as_deref() != Some("t") {
                                conn.moved();
                                return;
                            }
                            break;
                        }
                        // Other answers came meanwhile: the server is alive,
                        // just busy (our probe waits its turn behind them).
                        Err(_) if conn.last_answer_ms.load(std::sync::atomic::Ordering::Relaxed) > asked_ms => {}
                        _ => {
                            tracing::warn!(
                                "dbmutex: the lock session did not answer its keepalive; closing it (its locks are lost)"
                            );
                            conn.close();
                            return;
                        }
                    }
                }
            }
        })
        .abort_handle()
    }

    /// Prepares every session lock statement this connection may run
    /// unnamed-comment-free, so no later lock call waits for a prepare (a
    /// release dropped mid-prepare would not know whether its unlock went out).
    pub(crate) async fn warm_statements(&self) -> std::result::Result<(), tokio_postgres::Error> {
        for call in [Call::Try, Call::Unlock] {
            for mode in [Mode::Exclusive, Mode::Shared] {
                for key in [PgKey::Pair(0, 0), PgKey::Big(0)] {
                    self.prepared(call, mode, &key).await?;
                }
            }
        }
        Ok(())
    }

    /// The lock statement for `call`, `mode` and `key`'s form, prepared on
    /// first use and cached for the connection.
    async fn prepared(
        &self,
        call: Call,
        mode: Mode,
        key: &PgKey,
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        let kind = (call, mode, matches!(key, PgKey::Big(_)));
        let cached = self
            .statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&kind)
            .cloned();
        if let Some(s) = cached {
            return Ok(s);
        }
        let (sql, params) = sql::bound_plain(call, false, mode, key, "");
        let types: Vec<_> = params.as_typed().into_iter().map(|(_, t)| t).collect();
        let s = self.client.prepare_typed(&sql, &types).await?;
        self.statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind, s.clone());
        Ok(s)
    }

    /// True once the connection is gone.
    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// A receiver that turns true when the connection is gone.
    pub(crate) fn lost_signal(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Closes the connection now (the server then frees its locks) and
    /// reports it lost. Needs no runtime.
    pub(crate) fn close(&self) {
        self.task.abort();
        self.lost.send_replace(true);
    }

    /// Asks the server to cancel the statement running on this session, in
    /// the background, then closes the connection. Used when a waiting
    /// statement is abandoned: without the cancel, a backend blocked in a
    /// lock wait would not notice the closed socket until it got the lock.
    pub(crate) fn cancel_and_close(self: &Arc<Self>) {
        let token = self.cancel.clone();
        let tls = self.tls.clone();
        let me = self.clone();
        // The close must follow the cancel: a cancel sent after the session
        // is gone is harmless, but a closed session cannot be cancelled.
        drop(self.runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                match tls {
                    Tls::Off => token.cancel_query(tokio_postgres::NoTls).await,
                    #[cfg(feature = "tls")]
                    Tls::Rustls(t) => token.cancel_query(t).await,
                }
            })
            .await;
            me.close();
        }));
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        self.task.abort();
    }
}
