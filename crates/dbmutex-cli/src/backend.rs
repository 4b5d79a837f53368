//! Which backend to use, and connecting to it.

use std::time::Duration;

use dbmutex::{redact_url, BackendKind, Locker, LockerBuilder, Prefix};

use crate::cli::Global;
use crate::exit::{Failure, CONFIG, UNAVAILABLE};

/// How long connecting may take, unless a wait allows longer (the
/// library's default).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a connect may take for a command that waits for ever: an
/// hour in a pooler's queue is a pooler that is not coming back.
pub const CONNECT_FOREVER: Duration = Duration::from_secs(3600);

/// How long a connection besides the lock session stays open unused.
const IDLE_TIMEOUT: Duration = Duration::from_millis(250);

/// The `application_name` our connections show in `pg_stat_activity`, so
/// `dbmutex list` and the waiting notice can tell CLI holders apart.
const APPLICATION_NAME: &str = "dbmutex-cli";

/// The backend chosen from the flags and the environment.
pub struct Target {
    /// `None`: the local backend (the library reads `DBMUTEX_LOCK_DIR`).
    url: Option<String>,
    pub kind: BackendKind,
    prefix: Option<Prefix>,
}

impl Target {
    /// `--database-url`, else env `DBMUTEX_DATABASE_URL`, else env
    /// `DATABASE_URL` (empty variables count as unset), else local.
    pub fn choose(global: &Global) -> Result<Target, Failure> {
        let from_env = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
        let url = global
            .database_url
            .clone()
            .or_else(|| from_env("DBMUTEX_DATABASE_URL"))
            .or_else(|| from_env("DATABASE_URL"));
        let kind = match &url {
            None => BackendKind::Local,
            Some(u) => kind_of(u)?,
        };
        if kind == BackendKind::Local && require_database(global)? {
            let what = if url.is_some() {
                "a file:// URL names the local backend"
            } else {
                "no database URL is set (--database-url, env DBMUTEX_DATABASE_URL or DATABASE_URL)"
            };
            return Err(Failure::new(
                CONFIG,
                format!(
                    "{what}, and --require-database (or DBMUTEX_REQUIRE_DATABASE) forbids the \
                     local backend, whose locks exclude only on this host"
                ),
            ));
        }
        Ok(Target {
            url,
            kind,
            prefix: global.prefix.clone().map(Prefix::new),
        })
    }

    /// Where the locks live, for messages (no password).
    pub fn describe(&self) -> String {
        match &self.url {
            Some(u) => redact_url(u),
            None => "the local backend".into(),
        }
    }

    /// Connects (database backends) or opens the lock directory (local).
    pub async fn connect(&self) -> Result<Locker, Failure> {
        self.connect_within(None).await
    }

    /// [`connect`](Self::connect) for a command that will wait up to `wait`
    /// for its lock (`None`: for ever): a pooler that queues new
    /// connections (PgBouncer with every server session busy) is waited
    /// for within that bound, at least [`CONNECT_TIMEOUT`], at most
    /// [`CONNECT_FOREVER`], instead of failing at the connect timeout long
    /// before the wait's own end. A server that refuses the connection
    /// still fails at once.
    pub async fn connect_for_wait(&self, wait: Option<Duration>) -> Result<Locker, Failure> {
        let bound = wait.map_or(CONNECT_FOREVER, |w| w.clamp(CONNECT_TIMEOUT, CONNECT_FOREVER));
        self.connect_within(Some(bound)).await
    }

    async fn connect_within(&self, bound: Option<Duration>) -> Result<Locker, Failure> {
        let builder: LockerBuilder = match &self.url {
            Some(u) => Locker::builder(u),
            None => Locker::local_builder(None),
        };
        let builder = builder.application_name(APPLICATION_NAME);
        let builder = match &self.prefix {
            Some(p) => builder.prefix(p.clone()),
            None => builder,
        };
        let builder = builder
            .connect_timeout(bound.unwrap_or(CONNECT_TIMEOUT))
            // One lock per process: an idle extra connection (the side one
            // `-v`'s repeated "held by" opens) serves nobody later, and a
            // fleet of waiters must not keep one each.
            .idle_timeout(IDLE_TIMEOUT);
        builder.connect().await.map_err(|e| {
            let mut f = Failure::from(e);
            if f.code == UNAVAILABLE {
                f.message = format!("{}: {}", self.describe(), f.message);
            }
            f
        })
    }
}

/// `--require-database`, else env `DBMUTEX_REQUIRE_DATABASE`: `1`, `true`,
/// `yes`, `on` turn it on; `0`, `false`, `no`, `off` and empty leave it off;
/// anything else is a usage error (a typo must not silently mean "off").
fn require_database(global: &Global) -> Result<bool, Failure> {
    if global.require_database {
        return Ok(true);
    }
    let Some(v) = std::env::var_os(REQUIRE_ENV) else {
        return Ok(false);
    };
    match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        other => Err(Failure::usage(format!(
            "{REQUIRE_ENV}={other:?}: use 1 (require a database URL) or 0"
        ))),
    }
}

const REQUIRE_ENV: &str = "DBMUTEX_REQUIRE_DATABASE";

/// The backend a URL names, from its scheme (checked before connecting, so
/// an unsupported option is a usage error even when the server is down).
pub fn kind_of(url: &str) -> Result<BackendKind, Failure> {
    BackendKind::from_url(url).ok_or_else(|| {
        Failure::usage(format!(
            "{}: not a database URL (use postgres://, postgresql://, mysql://, mariadb:// or etcd://)",
            redact_url(url)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(kind_of("postgres://h/db").unwrap(), BackendKind::Postgres);
        assert_eq!(kind_of("postgresql://h/db").unwrap(), BackendKind::Postgres);
        assert_eq!(kind_of("mysql://h/db").unwrap(), BackendKind::Mysql);
        assert_eq!(kind_of("mariadb://h/db").unwrap(), BackendKind::Mysql);
        assert_eq!(kind_of("file:///tmp/locks").unwrap(), BackendKind::Local);
        assert_eq!(kind_of("etcd://h:2379,h2/root").unwrap(), BackendKind::Etcd);
        let bad = kind_of("redis://u:secret@h").unwrap_err();
        assert_eq!(bad.code, crate::exit::USAGE);
        assert!(!bad.message.contains("secret"), "{}", bad.message);
        assert!(kind_of("nonsense").is_err());
    }
}
