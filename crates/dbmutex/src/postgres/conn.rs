//! PostgreSQL connections: URL and TLS handling, and a connection whose end
//! is an immediate lock-loss signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config};

use super::sql::{self, Call};
use crate::key::PgKey;
use crate::locker::Settings;
use crate::redact::{pg_reason, redact_url};
use crate::{Error, Result};
use crate::{LockName, Mode};

/// What to do with `NOTIFY` messages arriving on a connection.
pub(crate) type NotifyHandler = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// How to make connections: a parsed configuration and a TLS choice.
#[derive(Clone)]
pub(crate) struct Connector {
    config: Config,
    tls: Tls,
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
        Connector { config, tls }
    }

    /// Opens a connection. `on_notify` receives `NOTIFY` messages.
    pub(crate) async fn connect(
        &self,
        settings: &Settings,
        on_notify: Option<NotifyHandler>,
    ) -> Result<Arc<PgConn>> {
        let fut = async {
            match &self.tls {
                Tls::Off => {
                    let (client, conn) = self
                        .config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map_err(connect_err)?;
                    Ok::<_, Error>(PgConn::start(client, conn, self.tls.clone(), on_notify))
                }
                #[cfg(feature = "tls")]
                Tls::Rustls(t) => {
                    let (client, conn) = self.config.connect(t.clone()).await.map_err(connect_err)?;
                    Ok::<_, Error>(PgConn::start(client, conn, self.tls.clone(), on_notify))
                }
            }
        };
        let conn = match tokio::time::timeout(settings.connect_timeout, fut).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::Connect(
                    format!("no answer from the server within {:?}", settings.connect_timeout).into(),
                ))
            }
        };
        Ok(conn)
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
}

impl PgConn {
    fn start<S, T>(
        client: Client,
        mut conn: tokio_postgres::Connection<S, T>,
        tls: Tls,
        on_notify: Option<NotifyHandler>,
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
        })
    }

    /// Runs one advisory-lock call and returns its boolean (`true` for the
    /// void-returning waits). With `name`, the statement carries it in a
    /// comment and runs unprepared (`query_typed`: one round trip); without,
    /// it runs as a statement prepared once per connection.
    pub(crate) async fn lock_call(
        &self,
        call: Call,
        mode: Mode,
        key: &PgKey,
        name: Option<&LockName>,
    ) -> std::result::Result<bool, tokio_postgres::Error> {
        let rows = match name {
            Some(name) => {
                let comment = crate::key::sql_comment(name);
                let (sql, params) = sql::bound_commented(call, false, mode, key, &comment);
                *self.last_comment.lock().unwrap_or_else(|e| e.into_inner()) = comment;
                self.client.query_typed(&sql, &params.as_typed()).await?
            }
            None => {
                let stmt = self.prepared(call, mode, key).await?;
                let params = sql::Params::of(key);
                let values: Vec<_> = params.as_typed().into_iter().map(|(v, _)| v).collect();
                self.client.query(&stmt, &values).await?
            }
        };
        self.heard_from_server();
        Ok(rows
            .first()
            .and_then(|r| r.try_get::<_, bool>(0).ok())
            .unwrap_or(false))
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
    /// silent failure — a partition, a hung server — is noticed within about
    /// twice `every`, where TCP keepalive alone may take much longer (a
    /// middlebox or proxy that still acknowledges TCP hides it).
    pub(crate) fn start_heartbeat(self: &Arc<Self>, every: Duration) -> tokio::task::AbortHandle {
        let weak = Arc::downgrade(self);
        let answer_within = every.max(Duration::from_millis(500));
        self.runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(conn) = weak.upgrade() else { return };
                if conn.is_lost() {
                    return;
                }
                let quiet_ms = (conn.born.elapsed().as_millis() as u64)
                    .saturating_sub(conn.last_answer_ms.load(std::sync::atomic::Ordering::Relaxed));
                if quiet_ms < every.as_millis() as u64 {
                    continue;
                }
                let comment = conn
                    .last_comment
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                let query = if comment.is_empty() {
                    "SELECT 1".to_owned()
                } else {
                    format!("SELECT 1 /* {comment} */")
                };
                let probe = conn.client.simple_query(&query);
                tokio::pin!(probe);
                loop {
                    let asked_ms = conn.born.elapsed().as_millis() as u64;
                    match tokio::time::timeout(answer_within, &mut probe).await {
                        Ok(Ok(_)) => {
                            conn.heard_from_server();
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
        let (sql, params) = sql::bound_plain(call, false, mode, key);
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
