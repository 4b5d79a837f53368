//! Which server a URL names, and the URL every connection of a run uses.

use anyhow::anyhow;
use dbmutex::BackendKind;

/// The backend `url` names ([`BackendKind::from_url`], any case of the
/// scheme); an error naming the schemes the bench runs on otherwise.
pub fn kind_of(url: &str) -> anyhow::Result<BackendKind> {
    let kind = BackendKind::from_url(url).ok_or_else(|| {
        anyhow!(
            "unsupported URL {}: use postgres://, mysql://, mariadb://, etcd:// or file://",
            dbmutex::redact_url(url)
        )
    })?;
    if kind == BackendKind::Etcd && !cfg!(feature = "etcd") {
        anyhow::bail!("etcd:// URLs need the bench built with `--features etcd`");
    }
    Ok(kind)
}

/// The URL to use for every connection of the run. A PostgreSQL URL without
/// `sslmode` gets `sslmode=disable`: the library would otherwise negotiate
/// TLS (libpq's `prefer`) while the raw floor could not, and TLS costs about
/// 60 µs per lock cycle on loopback, which would make the ratios meaningless.
///
/// The scheme is given in the drivers' own spelling (`postgres://`,
/// `mysql://`), since the raw floors connect with the drivers directly and
/// they accept no other.
pub fn run_url(url: &str, kind: BackendKind) -> String {
    let url = match (url.split_once("://"), kind) {
        (Some((_, rest)), BackendKind::Postgres) => format!("postgres://{rest}"),
        (Some((_, rest)), BackendKind::Mysql) => format!("mysql://{rest}"),
        _ => url.to_owned(),
    };
    if kind != BackendKind::Postgres || url.contains("sslmode=") {
        return url;
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}sslmode=disable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_get_their_own_scheme() {
        assert_eq!(
            run_url("POSTGRESQL://p@h/db?sslmode=require", BackendKind::Postgres),
            "postgres://p@h/db?sslmode=require"
        );
        assert_eq!(run_url("MariaDB://r@h/db", BackendKind::Mysql), "mysql://r@h/db");
        assert_eq!(run_url("FILE:///tmp/x", BackendKind::Local), "FILE:///tmp/x");
    }

    #[test]
    fn plaintext_unless_asked() {
        assert_eq!(
            run_url("postgres://p@h/db", BackendKind::Postgres),
            "postgres://p@h/db?sslmode=disable"
        );
        assert_eq!(
            run_url("postgres://p@h/db?x=1", BackendKind::Postgres),
            "postgres://p@h/db?x=1&sslmode=disable"
        );
        assert_eq!(
            run_url("postgres://h/db?sslmode=require", BackendKind::Postgres),
            "postgres://h/db?sslmode=require"
        );
        assert_eq!(run_url("mysql://r@h/t", BackendKind::Mysql), "mysql://r@h/t");
        assert!(kind_of("redis://x").is_err());
        assert_eq!(kind_of("MariaDB://r@h/t").unwrap(), BackendKind::Mysql);
    }
}
