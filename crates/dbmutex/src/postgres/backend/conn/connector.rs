//! How to make connections: a parsed configuration and a TLS choice.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::{Client, Config};

use super::direct::{dial_one, Dialed, Ends};
use super::session::{Origin, PgConn};
use super::tls::{make_tls, Tls};
use crate::redact::{pg_reason, redact_url, with_scheme};
use crate::settings::Settings;
use crate::{Error, Result};

/// How to make connections: a parsed configuration and a TLS choice.
#[derive(Clone)]
pub(crate) struct Connector {
    config: Config,
    tls: Tls,
    /// Shared by every connection made here: set when one of them finds
    /// its statements running on another server session.
    pooler_seen: Arc<std::sync::atomic::AtomicBool>,
    /// Set when the locker's pooler check found no pooler: a connection
    /// that is not direct (a client behind NAT) then asks the server to
    /// watch it too (`claim.rs`, `check_direct`).
    cleared: Arc<std::sync::atomic::AtomicBool>,
    /// The server's side of liveness (see `liveness.rs`).
    dead_peer: Duration,
    /// The client's TCP keepalive period (idle and interval; the user
    /// timeout is twice it), as set on `config` for tokio-postgres's dials
    /// and applied to ours.
    keepalive: Duration,
    /// The URL named no password: each connect reads `PGPASSWORD` or the
    /// password file again, as libpq does, so a long-lived locker that
    /// reconnects after a rotation sends the new one.
    password_files: bool,
}

impl Connector {
    /// Parses a `postgres://` URL. `sslmode` follows libpq: `disable`;
    /// `prefer` (the default) and `require` encrypt without verifying the
    /// certificate; `verify-ca` and `verify-full` verify it (against
    /// `sslrootcert` if given, else the Mozilla roots) and the host name.
    /// What the URL leaves out comes from libpq's environment
    /// (`redact::pg_locate`; `PGSSLMODE`, `PGSSLROOTCERT` here).
    pub(crate) fn from_url(url: &str, settings: &Settings) -> Result<Self> {
        Self::from_url_in(url, settings, |k| std::env::var(k).ok())
    }

    /// [`from_url`](Self::from_url) in the environment `env` (the
    /// process's but in tests).
    fn from_url_in(url: &str, settings: &Settings, env: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let lower = with_scheme(url, "postgres");
        let (base, query) = lower.split_once('?').unwrap_or((&lower, ""));
        let bad = |e: String| Error::Config(format!("bad PostgreSQL URL {}: {e}", redact_url(url)));
        let params: Vec<&str> = query.split('&').filter(|kv| !kv.is_empty()).collect();
        // The service file's section the URL or PGSERVICE names fills in
        // what the URL leaves out, ahead of the environment (which it
        // reads as libpq does: an empty PGSERVICE is set).
        let service = crate::redact::pg_service(&params, &env).map_err(bad)?;
        let env = |k: &str| env(k).filter(|v| !v.is_empty());
        let env = crate::redact::layered(&service, env);
        let user_part = base
            .split_once("://")
            .map_or("", |(_, rest)| &rest[..rest.find('@').map_or(0, |i| i + 1)]);
        let from_service = service.as_ref().map(|s| s.params(&params, user_part));
        let mut kept = Vec::new();
        // libpq's default (below), unless its environment says another.
        let mut sslmode = env("PGSSLMODE");
        let mut rootcert = env("PGSSLROOTCERT");
        for kv in params
            .iter()
            .copied()
            .chain(from_service.iter().flatten().map(String::as_str))
        {
            match kv.split_once('=') {
                Some(("sslmode", v)) => sslmode = Some(v.to_owned()),
                Some(("sslrootcert", v)) => rootcert = Some(v.to_owned()),
                Some(("service", _)) => {}
                _ => kept.push(kv),
            }
        }
        // `sslrootcert=system` with no sslmode anywhere means verify-full,
        // as in libpq (16 and later): the system's roots are asked for, so
        // the certificate must be checked against them.
        let sslmode = sslmode.unwrap_or_else(|| match rootcert.as_deref() {
            Some("system") => "verify-full".to_owned(),
            _ => "prefer".to_owned(),
        });
        let verify = match sslmode.as_str() {
            "disable" | "allow" => None,
            "prefer" | "require" => Some(false),
            "verify-ca" | "verify-full" => Some(true),
            // The value is not quoted: it may be the tail of a password.
            _ => {
                return Err(Error::Config(
                    "sslmode (or PGSSLMODE) is not one of disable, allow, prefer, require, verify-ca, verify-full".into(),
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
        // What the URL leaves out: libpq's environment, its socket for no host.
        let rebuilt = crate::redact::pg_locate(base, &kept, env)
            .map_err(|e| bad(crate::redact::from_service(&service, e)))?;
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
        let mut c = Self::with_config(config, tls, settings);
        // No password given: PGPASSWORD or the password file, as libpq
        // reads a URL, at each connect (`config_now`). (Not for a `Config`
        // the application built: it said what to send.)
        c.password_files = c.config.get_password().is_none_or(<[u8]>::is_empty);
        Ok(c)
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
        crate::redact::pg_default_host(&mut config);
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
            cleared: Arc::default(),
            dead_peer: settings.server_dead_peer_bound(),
            keepalive: ka,
            password_files: false,
        }
    }

    /// Whether no connection made here can be found direct (several hosts,
    /// a Unix socket we do not dial ourselves or that is not PostgreSQL's:
    /// `direct.rs`'s [`Dialed::of`] names no one TCP host, and
    /// [`own_unix`](Self::own_unix) no socket with PostgreSQL's lock file):
    /// the locker's pooler check then always runs, on a second connection.
    pub(crate) fn never_direct(&self) -> bool {
        Dialed::of(&self.config).is_none()
            && !self
                .own_unix()
                .is_some_and(|p| super::direct::looks_like_postmasters(&p))
    }

    /// Opens a connection. With `claim`, it claims its server session (see
    /// [`Claim`](super::session::Claim)) before it is returned; a connection
    /// for transaction locks needs no claim (and behind a busy pooler, a
    /// claim would wait for a free server session).
    pub(crate) async fn connect(&self, settings: &Settings, claim: bool) -> Result<Arc<PgConn>> {
        bounded(settings, async {
            let conn = self.open().await?;
            if claim {
                conn.claim().await?;
            }
            Ok(conn)
        })
        .await
    }

    /// [`connect`](Self::connect) with a claim whose last step, where there
    /// is one, is left to the caller ([`PgConn::claim_start_later`]).
    pub(crate) async fn connect_start_later(
        &self,
        settings: &Settings,
    ) -> Result<(Arc<PgConn>, Option<super::StartLater>)> {
        bounded(settings, async {
            let conn = self.open().await?;
            let later = conn.claim_start_later().await?;
            Ok((conn, later))
        })
        .await
    }

    /// The configuration to connect with now: the parsed one, with the
    /// password libpq would send read again where the URL named none.
    fn config_now(&self) -> std::borrow::Cow<'_, Config> {
        if !self.password_files {
            return std::borrow::Cow::Borrowed(&self.config);
        }
        let mut config = self.config.clone();
        super::pgpass::fill_password(&mut config, |k| std::env::var(k).ok());
        std::borrow::Cow::Owned(config)
    }

    /// A new connection, not claimed.
    async fn open(&self) -> Result<Arc<PgConn>> {
        let config = self.config_now();
        if let Some(own) = self.own_dial() {
            return self.connect_own(own, &config).await;
        }
        #[cfg(unix)]
        if let Some(path) = self.own_unix() {
            return self.connect_unix(path, &config).await;
        }
        match &self.tls {
            Tls::Off => {
                let (client, conn) = config.connect(tokio_postgres::NoTls).await.map_err(connect_err)?;
                Ok::<_, Error>(self.start(client, conn, None, None))
            }
            #[cfg(feature = "tls")]
            Tls::Rustls(t) => {
                let (client, conn) = config.connect(t.clone()).await.map_err(connect_err)?;
                Ok::<_, Error>(self.start(client, conn, None, None))
            }
        }
    }

    /// The host name and the host to dial when we dial ourselves: the
    /// configuration names one TCP host by name (`hostaddr`, if given, is
    /// what is dialed) and asks nothing of the session at connect
    /// (`target_session_attrs`). Anything else (several hosts, a Unix
    /// socket, an address with no name for TLS) is tokio-postgres's dial.
    fn own_dial(&self) -> Option<(&str, Dialed)> {
        let [Host::Tcp(name)] = self.config.get_hosts() else {
            return None;
        };
        if self.config.get_target_session_attrs() != TargetSessionAttrs::Any {
            return None;
        }
        Some((name.as_str(), Dialed::of(&self.config)?))
    }

    /// The Unix socket we dial ourselves, if any (`direct.rs`,
    /// [`unix_socket_of`](super::direct::unix_socket_of)); we then learn who
    /// listens on it (see [`connect_unix`](Self::connect_unix)).
    fn own_unix(&self) -> Option<std::path::PathBuf> {
        super::direct::unix_socket_of(&self.config)
    }

    /// Dials the Unix socket at `path` ourselves, within the connect
    /// timeout, and starts the session over it, with what the kernel tells
    /// of the process listening there (`SO_PEERCRED`): the claim then knows
    /// whether that is the postmaster itself (`direct.rs`,
    /// [`is_postmasters_own`](super::direct::is_postmasters_own)). No TLS
    /// with `sslmode=prefer`: PostgreSQL refuses it on a Unix socket (as
    /// libpq, which does not ask there, we save the round trip of asking);
    /// `require` asks, as tokio-postgres does, and fails.
    #[cfg(unix)]
    async fn connect_unix(&self, path: std::path::PathBuf, config: &Config) -> Result<Arc<PgConn>> {
        let connect = tokio::net::UnixStream::connect(&path);
        let stream = super::direct::within(self.config.get_connect_timeout(), connect)
            .await
            // Named: a default chosen for a URL without a host
            // (`default_host`) is not in what the user wrote.
            .map_err(|e| {
                let named = std::io::Error::new(e.kind(), format!("socket {}: {e}", path.display()));
                Error::Connect(Box::new(named))
            })?;
        let listener =
            super::direct::postmaster_listener(stream.peer_cred().ok().and_then(|c| c.pid()), &path);
        let unix = super::direct::UnixEnds { path, listener };
        #[cfg(feature = "tls")]
        if let Tls::Rustls(t) = &self.tls {
            if self.config.get_ssl_mode() != tokio_postgres::config::SslMode::Prefer {
                use tokio_postgres::tls::MakeTlsConnect;
                let tls = <_ as MakeTlsConnect<tokio::net::UnixStream>>::make_tls_connect(&mut t.clone(), "")
                    .map_err(|e| Error::Connect(Box::new(e)))?;
                let (client, conn) = config.connect_raw(stream, tls).await.map_err(connect_err)?;
                return Ok(self.start(client, conn, None, Some(unix)));
            }
        }
        let (client, conn) = config
            .connect_raw(stream, tokio_postgres::NoTls)
            .await
            .map_err(connect_err)?;
        Ok(self.start(client, conn, None, Some(unix)))
    }

    /// Dials `dialed` ourselves, as tokio-postgres would (each address the
    /// host resolves to in turn, the connect timeout each, no delay, the
    /// TCP keepalive and user timeout), and starts the session over that
    /// socket: the connection then knows its own end of it (see
    /// `direct.rs`), which tokio-postgres's socket does not tell.
    async fn connect_own(&self, (name, dialed): (&str, Dialed), config: &Config) -> Result<Arc<PgConn>> {
        let mut addresses = dialed
            .addresses()
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
        if self.config.get_load_balance_hosts() == LoadBalanceHosts::Random {
            fastrand::shuffle(&mut addresses);
        }
        // As tokio-postgres: any failure (no TCP connection, TLS, the
        // server refusing the start) moves on to the next address.
        let mut last = None;
        for ip in addresses {
            match self.connect_at((ip, dialed.port).into(), name, config).await {
                Ok(conn) => return Ok(conn),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Connect("could not resolve any addresses".into())))
    }

    /// [`connect_own`](Self::connect_own) at one address.
    async fn connect_at(
        &self,
        addr: std::net::SocketAddr,
        name: &str,
        config: &Config,
    ) -> Result<Arc<PgConn>> {
        let stream = dial_one(addr, self.config.get_connect_timeout(), self.keepalive)
            .await
            .map_err(|e| Error::Connect(Box::new(e)))?;
        let ends = Ends {
            local: stream.local_addr().map_err(|e| Error::Connect(Box::new(e)))?,
            peer: stream.peer_addr().map_err(|e| Error::Connect(Box::new(e)))?,
            name: name.to_owned(),
        };
        match &self.tls {
            Tls::Off => {
                let (client, conn) = config
                    .connect_raw(stream, tokio_postgres::NoTls)
                    .await
                    .map_err(connect_err)?;
                Ok(self.start(client, conn, Some(ends), None))
            }
            #[cfg(feature = "tls")]
            Tls::Rustls(t) => {
                use tokio_postgres::tls::MakeTlsConnect;
                let tls =
                    <_ as MakeTlsConnect<tokio::net::TcpStream>>::make_tls_connect(&mut t.clone(), name)
                        .map_err(|e| Error::Connect(Box::new(e)))?;
                let (client, conn) = config.connect_raw(stream, tls).await.map_err(connect_err)?;
                Ok(self.start(client, conn, Some(ends), None))
            }
        }
    }

    /// Wraps a connected client in a [`PgConn`] of this connector (`ends`,
    /// `unix`: of the TCP or Unix socket, when we dialed it).
    fn start<S, T>(
        &self,
        client: Client,
        conn: tokio_postgres::Connection<S, T>,
        ends: Option<Ends>,
        unix: Option<super::direct::UnixEnds>,
    ) -> Arc<PgConn>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        PgConn::start(
            client,
            conn,
            Origin {
                tls: self.tls.clone(),
                pooler_seen: self.pooler_seen.clone(),
                cleared: self.cleared.clone(),
                dialed: Dialed::of(&self.config),
                ends,
                unix,
                dead_peer: self.dead_peer,
            },
        )
    }

    /// Records that the locker's pooler check found no pooler in front of
    /// this connector's server sessions.
    pub(crate) fn clear(&self) {
        self.cleared.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// True once any connection of this connector has seen its statements
    /// run on a server session other than its own (a pooler shares them).
    pub(crate) fn pooler_seen(&self) -> bool {
        self.pooler_seen.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// `fut`, a step of connecting, within the settings' connect timeout.
pub(crate) async fn bounded<T>(
    settings: &Settings,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(settings.connect_timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Connect(
            format!("no answer from the server within {:?}", settings.connect_timeout).into(),
        )),
    }
}

fn connect_err(e: tokio_postgres::Error) -> Error {
    Error::Connect(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `from_url_in` with the environment `vars`.
    fn parsed(url: &str, vars: &[(&str, &str)]) -> Result<Connector> {
        let env = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        Connector::from_url_in(url, &Settings::for_tests(), env)
    }

    /// libpq's environment reaches the connection: the location
    /// (`pg_locate`), the default sslmode and the CA file; the URL's own
    /// parameters win.
    #[test]
    fn libpqs_environment_reaches_the_connection() {
        let c = parsed(
            "postgres:///jobs",
            &[("PGHOST", "db.example"), ("PGPORT", "6432"), ("PGUSER", "cron")],
        )
        .unwrap();
        assert_eq!(c.config.get_hosts(), [Host::Tcp("db.example".into())]);
        assert_eq!(c.config.get_ports(), [6432]);
        assert_eq!(c.config.get_user(), Some("cron"));
        assert_eq!(c.config.get_dbname(), Some("jobs"));

        let c = parsed("postgres://h/db", &[("PGSSLMODE", "disable")]).unwrap();
        assert!(matches!(c.tls, Tls::Off), "PGSSLMODE=disable");
        let c = parsed("postgres://h/db", &[("PGSSLMODE", "")]).unwrap();
        assert_eq!(
            matches!(c.tls, Tls::Off),
            !cfg!(feature = "tls"),
            "empty: libpq's default, prefer"
        );
        let c = parsed("postgres://h/db?sslmode=disable", &[("PGSSLMODE", "require")]).unwrap();
        assert!(matches!(c.tls, Tls::Off), "the URL's sslmode wins");
        let Err(Error::Config(e)) = parsed("postgres://h/db", &[("PGSSLMODE", "bogus")]) else {
            panic!("a bad PGSSLMODE was taken");
        };
        assert!(e.contains("PGSSLMODE"), "{e}");
        let Err(Error::Config(e)) = parsed("postgres:///db", &[("PGHOST", "a,b"), ("PGPORT", "1,2,3")])
        else {
            panic!("three ports for two hosts were taken");
        };
        assert!(e.contains("3 port numbers for 2 hosts"), "{e}");
    }

    /// PGSSLROOTCERT is the CA file of a verifying sslmode: one that is not
    /// there fails the parse, as the URL's `sslrootcert` does.
    #[cfg(feature = "tls")]
    #[test]
    fn pgsslrootcert_is_the_ca_file() {
        let missing = "/nonexistent/dbmutex-root.crt";
        let vars = [("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", missing)];
        let Err(Error::Config(e)) = parsed("postgres://h/db", &vars) else {
            panic!("a missing PGSSLROOTCERT was not read");
        };
        assert!(e.contains("sslrootcert file"), "{e}");
        assert!(parsed("postgres://h/db", &[("PGSSLMODE", "verify-full")]).is_ok());
        // libpq's `system`: the carried roots, and verify-full unless an
        // sslmode is given.
        use tokio_postgres::config::SslMode;
        let c = parsed("postgres://h/db", &[("PGSSLROOTCERT", "system")]).unwrap();
        assert_eq!(
            c.config.get_ssl_mode(),
            SslMode::Require,
            "sslrootcert=system: verify-full"
        );
        let c = parsed("postgres://h/db", &[]).unwrap();
        assert_eq!(c.config.get_ssl_mode(), SslMode::Prefer, "else libpq's prefer");
        let c = parsed("postgres://h/db?sslmode=disable", &[("PGSSLROOTCERT", "system")]).unwrap();
        assert!(matches!(c.tls, Tls::Off), "an sslmode given wins");
    }
}
