//! libpq's password sources, for a configuration that carries none: the
//! `PGPASSWORD` environment variable, else the password file
//! (`PGPASSFILE`, else `~/.pgpass`), as psql reads them. So a cron job
//! keeps its password out of the URL (and out of `ps`) the way it already
//! does for psql.

use std::path::PathBuf;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// Gives `config` the password libpq would send, where it names none (or
/// an empty one). `env` reads an environment variable (`std::env::var` but
/// in tests).
///
/// libpq looks the file up for each host it tries; `config` carries one
/// password for all of them: it is filled from the file only where every
/// host and port of the URL finds the same one, so that no host is sent a
/// password the file keeps for another.
pub(super) fn fill_password(config: &mut Config, env: impl Fn(&str) -> Option<String>) {
    if config.get_password().is_some_and(|p| !p.is_empty()) {
        return;
    }
    if let Some(p) = env("PGPASSWORD").filter(|p| !p.is_empty()) {
        config.password(p);
        return;
    }
    let file = match env("PGPASSFILE").filter(|f| !f.is_empty()) {
        Some(f) => PathBuf::from(f),
        // libpq's home: `HOME`, else the user's entry in the password
        // database (cron's and `env -i`'s environment may have no HOME).
        None => match env("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .or_else(passwd_home)
        {
            Some(home) => home.join(".pgpass"),
            None => return,
        },
    };
    // Only its owner may read or write it: libpq ignores it otherwise.
    let Some(text) = crate::redact::read_credentials_file(
        &file,
        0o077,
        "the password file has group or world access and is ignored; permissions should be u=rw (0600) or less",
    ) else {
        return;
    };
    // libpq's defaults for what the URL leaves out: the user is the
    // login's (as tokio-postgres sends it), the database the user's name.
    let Some(user) = config
        .get_user()
        .map(str::to_owned)
        .or_else(|| whoami::username().ok())
    else {
        return;
    };
    let db = config.get_dbname().unwrap_or(&user).to_owned();
    let ports = config.get_ports();
    let port_of = |i: usize| {
        let p = match ports.len() {
            0 => 5432,
            1 => ports[0],
            _ => ports.get(i).copied().unwrap_or(5432),
        };
        p.to_string()
    };
    let hosts: Vec<String> = match (config.get_hosts(), config.get_hostaddrs()) {
        ([], []) => vec!["localhost".to_owned()],
        ([], addrs) => addrs.iter().map(ToString::to_string).collect(),
        (hosts, _) => hosts.iter().map(host_name).collect(),
    };
    let mut found = None;
    for (i, host) in hosts.iter().enumerate() {
        let p = lookup(&text, [host, &port_of(i), &db, &user]);
        match (&found, p) {
            (_, None) => return,
            (None, Some(p)) => found = Some(p),
            (Some(f), Some(p)) if *f == p => {}
            (Some(_), Some(_)) => return,
        }
    }
    if let Some(p) = found {
        config.password(p);
    }
}

/// The effective user's home directory in the password database
/// (`getpwuid_r`), as libpq finds it when `HOME` is unset.
fn passwd_home() -> Option<PathBuf> {
    crate::redact::effective_user().and_then(|e| e.home.clone())
}

/// How the password file names `host`: a Unix socket in libpq's default
/// directory as `localhost` (as libpq matches it), another socket
/// directory by its path.
fn host_name(host: &Host) -> String {
    match host {
        Host::Tcp(h) if h.is_empty() => "localhost".to_owned(),
        Host::Tcp(h) => h.clone(),
        #[cfg(unix)]
        Host::Unix(path) => {
            let path = path.to_string_lossy();
            if path == crate::redact::pg_default_server() {
                "localhost".to_owned()
            } else {
                path.into_owned()
            }
        }
    }
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
                match chars.next() {
                    Some(next) => {
                        raw.push(next);
                        value.push(next);
                    }
                    // A backslash at the end stays (as libpq keeps it).
                    None => value.push(c),
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
        // A backslash at the very end stays, as in libpq.
        assert_eq!(
            lookup("h:1:d:u:ends\\", ["h", "1", "d", "u"]).as_deref(),
            Some("ends\\")
        );
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
        // No database: the user's name.
        assert_eq!(
            filled("postgres://ops@h", &[("PGPASSFILE", f)]),
            Some(b"co:lon\\pw".to_vec())
        );
        // An empty password is none.
        assert_eq!(
            filled("postgres://ops:@h", &[("PGPASSFILE", f)]),
            Some(b"co:lon\\pw".to_vec())
        );
        // Several hosts: only where every one finds the same password.
        assert_eq!(
            filled(
                "postgres://app@db.example:6432,db.example:7432/prod",
                &[("PGPASSFILE", f)]
            ),
            Some(b"other".to_vec())
        );
        assert_eq!(
            filled(
                "postgres://app@db.example,db.example:6432/prod",
                &[("PGPASSFILE", f)]
            ),
            None
        );
        assert_eq!(
            filled("postgres://app@db.example,elsewhere/prod", &[("PGPASSFILE", f)]),
            None
        );
        // No user: the login's, as tokio-postgres sends it.
        let login = whoami::username().unwrap();
        let own = dir.join("own");
        std::fs::write(&own, format!("h:*:*:{login}:mine\n")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert_eq!(
            filled("postgres://h/d", &[("PGPASSFILE", own.to_str().unwrap())]),
            Some(b"mine".to_vec())
        );
        // The default socket directory matches `localhost`, another one its
        // path; ~/.pgpass when PGPASSFILE is unset.
        std::fs::copy(&file, dir.join(".pgpass")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(".pgpass"), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let home = dir.to_str().unwrap();
        let default = crate::redact::pg_default_server().replace('/', "%2F");
        assert_eq!(
            filled(&format!("postgres://u@{default}:5433/d"), &[("HOME", home)]),
            Some(b"socketpw".to_vec())
        );
        assert_eq!(
            filled("postgres://u@%2Fsomewhere%2Felse:5433/d", &[("HOME", home)]),
            None
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
