//! Which backend to use, and connecting to it.

use dbmutex::{redact_url, BackendKind, Locker, LockerBuilder, Prefix};

use crate::cli::Global;
use crate::exit::{Failure, UNAVAILABLE};

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
        let builder: LockerBuilder = match &self.url {
            Some(u) => Locker::builder(u),
            None => Locker::local_builder(None),
        };
        let builder = builder.application_name(APPLICATION_NAME);
        let builder = match &self.prefix {
            Some(p) => builder.prefix(p.clone()),
            None => builder,
        };
        builder.connect().await.map_err(|e| {
            let mut f = Failure::from(e);
            if f.code == UNAVAILABLE {
                f.message = format!("{}: {}", self.describe(), f.message);
            }
            f
        })
    }
}

/// The backend a URL names, from its scheme (checked before connecting, so
/// an unsupported option is a usage error even when the server is down).
pub fn kind_of(url: &str) -> Result<BackendKind, Failure> {
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => Ok(BackendKind::Postgres),
        Some("mysql" | "mariadb") => Ok(BackendKind::Mysql),
        Some("file") => Ok(BackendKind::Local),
        _ => Err(Failure::usage(format!(
            "{}: not a database URL (use postgres://, postgresql://, mysql:// or mariadb://)",
            redact_url(url)
        ))),
    }
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
        let bad = kind_of("redis://u:secret@h").unwrap_err();
        assert_eq!(bad.code, crate::exit::USAGE);
        assert!(!bad.message.contains("secret"), "{}", bad.message);
        assert!(kind_of("nonsense").is_err());
    }
}
