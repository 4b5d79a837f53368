//! Which server a URL names, and the URL every connection of a run uses.

use anyhow::bail;

/// The backend a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://`.
    Mysql,
    /// `file:///lock/dir`: the local backend, no server.
    Local,
}

impl Kind {
    /// Recognises the URL's scheme.
    pub fn of(url: &str) -> anyhow::Result<Kind> {
        Ok(match url.split_once("://").map(|(s, _)| s) {
            Some("postgres" | "postgresql") => Kind::Postgres,
            Some("mysql" | "mariadb") => Kind::Mysql,
            Some("file") => Kind::Local,
            _ => bail!(
                "unsupported URL {}: use postgres://, mysql://, mariadb:// or file://",
                dbmutex::redact_url(url)
            ),
        })
    }

    /// `postgres`, `mysql` or `local`, as in the JSON `backend` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
            Kind::Local => "local",
        }
    }
}

/// The URL to use for every connection of the run. A PostgreSQL URL without
/// `sslmode` gets `sslmode=disable`: the library would otherwise negotiate
/// TLS (libpq's `prefer`) while the raw floor could not, and TLS costs about
/// 60 µs per lock cycle on loopback, which would make the ratios meaningless.
pub fn run_url(url: &str, kind: Kind) -> String {
    if kind != Kind::Postgres || url.contains("sslmode=") {
        return url.to_owned();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}sslmode=disable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_unless_asked() {
        assert_eq!(
            run_url("postgres://p@h/db", Kind::Postgres),
            "postgres://p@h/db?sslmode=disable"
        );
        assert_eq!(
            run_url("postgres://p@h/db?x=1", Kind::Postgres),
            "postgres://p@h/db?x=1&sslmode=disable"
        );
        assert_eq!(
            run_url("postgres://h/db?sslmode=require", Kind::Postgres),
            "postgres://h/db?sslmode=require"
        );
        assert_eq!(run_url("mysql://r@h/t", Kind::Mysql), "mysql://r@h/t");
        assert!(Kind::of("redis://x").is_err());
    }
}
