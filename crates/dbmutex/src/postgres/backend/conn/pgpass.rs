//! libpq's password sources, for a configuration that carries none: the
//! `PGPASSWORD` environment variable, else the password file
//! (`PGPASSFILE`, else `~/.pgpass`), as psql reads them. So a cron job
//! keeps its password out of the URL (and out of `ps`) the way it already
//! does for psql.

use std::path::PathBuf;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// Gives `config` the password libpq would send, where it names none.
/// `env` reads an environment variable (`std::env::var_os` but in tests).
pub(super) fn fill_password(config: &mut Config, env: impl Fn(&str) -> Option<String>) {
    if config.get_password().is_some() {
        return;
    }
    if let Some(p) = env("PGPASSWORD").filter(|p| !p.is_empty()) {
        config.password(p);
        return;
    }
    let file = match env("PGPASSFILE").filter(|f| !f.is_empty()) {
        Some(f) => PathBuf::from(f),
        None => match env("HOME").filter(|h| !h.is_empty()) {
            Some(home) => PathBuf::from(home).join(".pgpass"),
            None => return,
        },
    };
    let Some(text) = read_private(&file) else {
        return;
    };
    // libpq's defaults for what the URL leaves out: the user is the
    // login's, the database the user's name, a socket matches `localhost`.
    let Some(user) = config
        .get_user()
        .map(str::to_owned)
        .or_else(|| env("USER").or_else(|| env("LOGNAME")))
    else {
        return;
    };
    let host = match (config.get_hosts().first(), config.get_hostaddrs().first()) {
        (Some(Host::Tcp(h)), _) if !h.is_empty() => h.clone(),
        (None, Some(addr)) => addr.to_string(),
        _ => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let db = config.get_dbname().unwrap_or(&user).to_owned();
    if let Some(p) = lookup(&text, [&host, &port, &db, &user]) {
        config.password(p);
    }
}

/// The password file's text, if it is a regular file that only its owner
/// may read or write (libpq ignores one that others can, with a warning:
/// so do we).
fn read_private(file: &std::path::Path) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                file = %file.display(),
                "dbmutex: the password file has group or world access and is ignored; permissions should be u=rw (0600) or less"
            );
            return None;
        }
    }
    std::fs::read_to_string(file).ok()
}

/// The password of the first line of a password file whose
/// `hostname:port:database:username` match `want` (a field of `*` matches
/// anything; `\:` and `\\` stand for `:` and `\`). Lines that begin with
/// `#`, and lines with fewer than five fields, are skipped.
fn lookup(text: &str, want: [&str; 4]) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with('#') {
            return None;
        }
        let fields = split(line);
        let [host, port, db, user, password] = fields.as_slice() else {
            return None;
        };
        let matches = [host, port, db, user]
            .iter()
            .zip(want)
            .all(|((raw, value), want)| raw == "*" || value == want);
        matches.then(|| password.1.clone())
    })
}

/// The first five `:`-separated fields of `line`, each as written and
/// unescaped; the fifth (the password) ends at an unescaped `:` too, as
/// libpq reads it. Fewer than five: what there is.
fn split(line: &str) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    let (mut raw, mut value) = (String::new(), String::new());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                raw.push(c);
                if let Some(next) = chars.next() {
                    raw.push(next);
                    value.push(next);
                }
            }
            ':' => {
                fields.push((std::mem::take(&mut raw), std::mem::take(&mut value)));
                if fields.len() == 5 {
                    return fields;
                }
            }
            c => {
                raw.push(c);
                value.push(c);
            }
        }
    }
    fields.push((raw, value));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# comment:a:b:c:d\n\
                        db.example:5432:prod:app:s3cret\n\
                        db.example:*:*:app:other\n\
                        *:*:*:ops:co\\:lon\\\\pw:ignored\n\
                        too:few:fields\n\
                        localhost:5433:*:*:socketpw\r\n\
                        we\\:ird:1:d:u:p\n";

    #[test]
    fn the_first_matching_line_gives_the_password() {
        let l = |h, p, d, u| lookup(FILE, [h, p, d, u]);
        assert_eq!(l("db.example", "5432", "prod", "app").as_deref(), Some("s3cret"));
        assert_eq!(l("db.example", "6432", "prod", "app").as_deref(), Some("other"));
        assert_eq!(l("db.example", "5432", "other", "app").as_deref(), Some("other"));
        assert_eq!(l("anywhere", "1", "x", "ops").as_deref(), Some("co:lon\\pw"));
        assert_eq!(l("localhost", "5433", "x", "y").as_deref(), Some("socketpw"));
        assert_eq!(l("we:ird", "1", "d", "u").as_deref(), Some("p"));
        assert_eq!(l("db.example", "5432", "prod", "nobody"), None);
        assert_eq!(l("comment", "a", "b", "c"), None);
        assert_eq!(l("too", "few", "fields", ""), None);
    }

    fn filled(url: &str, vars: &[(&str, &str)]) -> Option<Vec<u8>> {
        let mut c: Config = url.parse().unwrap();
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        fill_password(&mut c, |k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        });
        c.get_password().map(<[u8]>::to_vec)
    }

    #[test]
    fn pgpassword_then_the_file_fill_a_missing_password() {
        let dir = std::env::temp_dir().join(format!("dbmutex-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(&file, FILE).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let f = file.to_str().unwrap();
        // The URL's own password wins, then PGPASSWORD, then the file.
        assert_eq!(
            filled("postgres://app:url@db.example/prod", &[("PGPASSWORD", "env")]),
            Some(b"url".to_vec())
        );
        assert_eq!(
            filled(
                "postgres://app@db.example/prod",
                &[("PGPASSWORD", "env"), ("PGPASSFILE", f)]
            ),
            Some(b"env".to_vec())
        );
        assert_eq!(
            filled("postgres://app@db.example/prod", &[("PGPASSFILE", f)]),
            Some(b"s3cret".to_vec())
        );
        // No database: the user's name; no user: the login's.
        assert_eq!(
            filled("postgres://ops@h", &[("PGPASSFILE", f)]),
            Some(b"co:lon\\pw".to_vec())
        );
        assert_eq!(
            filled(
                "postgres://db.example:1/prod",
                &[("PGPASSFILE", f), ("USER", "app")]
            ),
            Some(b"other".to_vec())
        );
        // A socket matches `localhost`; ~/.pgpass when PGPASSFILE is unset.
        std::fs::copy(&file, dir.join(".pgpass")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(".pgpass"), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let home = dir.to_str().unwrap();
        assert_eq!(
            filled("postgres://u@%2Fvar%2Frun%2Fpostgresql:5433/d", &[("HOME", home)]),
            Some(b"socketpw".to_vec())
        );
        assert_eq!(filled("postgres://nobody@h/d", &[("HOME", home)]), None);
        // A file others may read is ignored.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            assert_eq!(
                filled("postgres://app@db.example/prod", &[("PGPASSFILE", f)]),
                None
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
