//! Refusing, before anything connects, a URL that the driver would read
//! differently from what its author meant (see the `redact` module docs).

use super::scheme::UNPARSEABLE;
use crate::types::{split_scheme, BackendKind};
use crate::{Error, Result};

/// Refuses, before anything connects, a database URL that the driver would
/// read differently from what its author meant (see the `redact` module
/// docs), so a misplaced password is never sent to a server as a host or
/// database name.
/// The error shows no part of the URL beyond its scheme.
pub(crate) fn check(url: &str) -> Result<()> {
    let Some((scheme, rest)) = split_scheme(url) else {
        return Ok(());
    };
    let why = match BackendKind::from_scheme(&scheme) {
        Some(BackendKind::Postgres) => pg_ambiguity(rest),
        Some(BackendKind::Mysql) => mysql_ambiguity(rest),
        _ => None,
    };
    match why {
        Some(why) => Err(Error::Config(format!("{scheme}://{UNPARSEABLE}: {why}"))),
        None => Ok(()),
    }
}

pub(super) fn pg_ambiguity(rest: &str) -> Option<&'static str> {
    // Parameter names as tokio-postgres reads them (percent-decoded), not
    // as dbmutex's own reading of the query string sees them (as
    // written): `?%68ost=h` would be a host to the one, not to the other.
    let from = rest.find('@').map_or(0, |i| i + 1);
    if let Some(q) = rest[from..].find('?') {
        let encoded = rest[from + q + 1..]
            .split('&')
            .any(|kv| kv.split('=').next().is_some_and(|k| k.contains('%')));
        if encoded {
            return Some("a parameter name is percent-encoded: write parameter names as plain text");
        }
    }
    let at = rest.find('@')?;
    if rest[at + 1..].contains('@') {
        return Some("more than one '@': percent-encode '@' in the user name, password or parameters as %40");
    }
    if rest[..at].contains('?') {
        return Some(
            "a '?' comes before the '@': percent-encode '?' in the user name or password as %3F \
             (and '@' in parameters as %40)",
        );
    }
    None
}

pub(super) fn mysql_ambiguity(rest: &str) -> Option<&'static str> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    rest[end..].contains('@').then_some(
        "an '@' follows a '/', '?' or '#': percent-encode '/', '?' and '#' in the user name or \
         password (%2F, %3F, %23), and '@' in the path or parameters (%40)",
    )
}

#[cfg(all(test, feature = "postgres", feature = "mysql"))]
mod tests {
    use super::*;

    #[test]
    fn ambiguous_urls_are_refused_without_echo() {
        for url in [
            "postgres://u:p@ss@h/db",
            "postgres://u:pa?sslmode=secret@h/db",
            "postgres://h/db?user=a@secret",
            "mysql://u:pa/secret@h/db",
            "mariadb://u:pa?secret@h/db",
            "mysql://u:pa#secret@h/db",
            "postgres://u:secret@h/db?%68ost=x",
            "postgres://h/db?sslmode=disable&%73slmode=secret",
        ] {
            let e = check(url).expect_err(url);
            let text = format!("{e} {e:?}");
            assert!(!text.contains("secret") && !text.contains("ss@"), "{text}");
            assert!(text.contains("percent-encode"), "{text}");
        }
        for url in [
            "postgres://u:secret@h/db?x=1",
            "postgres://u:p%25ss@h/db?application_name=a%20b",
        ] {
            check(url).expect(url);
        }
        for url in [
            "postgres://u:pa/se#cret@h/db",
            "postgres://u:secret@h/db?x=1",
            "mysql://u:p@ss@h/db",
            "mysql://u:pa%2Fss@h/db",
            "file:///x",
            "host=h password=x",
        ] {
            check(url).expect(url);
        }
    }
}
