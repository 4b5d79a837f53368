//! libpq's connection service file (`pg_service.conf`): a URL's
//! `service=NAME`, else `PGSERVICE`, names a section whose parameters fill
//! in what the URL leaves out, ahead of libpq's environment (URL, then
//! service, then `PG*` variables, then defaults, as libpq's
//! `conninfo_add_defaults` has it).
//!
//! Read, not ignored: a cron job whose environment says `PGSERVICE=prod`
//! must lock on the server `psql` reaches in that environment, or the lock
//! excludes nobody (RELIABILITY.md, "One URL, one server"). A service named
//! but found nowhere is an error, as in libpq.
//!
//! Where libpq looks: the user's file (`PGSERVICEFILE`, else
//! `~/.pg_service.conf`); if the service is not there, the system's
//! `pg_service.conf` in `PGSYSCONFDIR`, else in the directory the
//! distributions' libpq is built with (`/etc/postgresql-common` on
//! Debian and Ubuntu, `/etc/sysconfig/pgsql` on Red Hat's PGDG packages).
//! The file is read as libpq reads it: `[name]` sections, `key=value`
//! lines with nothing trimmed around the `=`, `#` comments; a line without
//! `=`, an unknown keyword or a nested `service` is an error naming the
//! file and line; the first value of a keyword wins.

use std::path::{Path, PathBuf};

/// The section of a service file that a URL or `PGSERVICE` names.
pub(crate) struct Service {
    /// `(keyword, value)`, in the file's order, each keyword once.
    params: Vec<(String, String)>,
}

/// Keywords that take the place of a libpq environment variable: the
/// service's value is read wherever the variable would be (so it fills in
/// exactly where the variable would, and beats it).
const AS_ENV: [(&str, &str); 8] = [
    ("PGHOST", "host"),
    ("PGHOSTADDR", "hostaddr"),
    ("PGPORT", "port"),
    ("PGUSER", "user"),
    ("PGDATABASE", "dbname"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
];

/// Keywords passed on as URL parameters where the URL names none.
/// dbmutex sets the connection's own keepalives and TCP user timeout from
/// its dead-peer bound, over these as over a URL's.
const AS_PARAM: [&str; 11] = [
    "password",
    "application_name",
    "connect_timeout",
    "options",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "channel_binding",
    "load_balance_hosts",
];

/// libpq's other connection keywords: valid in a service file, not
/// supported by dbmutex (refused with their name, never ignored: some of
/// them change how or where the connection goes).
const LIBPQ_OTHERS: [&str; 30] = [
    "passfile",
    "fallback_application_name",
    "client_encoding",
    "replication",
    "gssencmode",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "require_auth",
    "sslnegotiation",
    "sslkeylogfile",
    "servicefile",
    "min_protocol_version",
    "max_protocol_version",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

impl Service {
    /// The service's value in place of the libpq environment variable
    /// `var` (`PGHOST`: its `host`), if it gives one.
    pub(crate) fn env(&self, var: &str) -> Option<String> {
        let (_, key) = AS_ENV.iter().find(|(v, _)| *v == var)?;
        self.value(key).map(str::to_owned)
    }

    fn value(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The service's parameters for the URL's query (`key=value`,
    /// percent-encoded), each only where `query` does not name it; the
    /// password only where the URL's user part gives none or an empty one
    /// (`user_part`: what is before the '@', with it, if any).
    pub(crate) fn params(&self, query: &[&str], user_part: &str) -> Vec<String> {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        let named = |k: &str| query.iter().any(|kv| kv.split('=').next() == Some(k));
        // An empty one counts as none, as libpq stores only a non-empty
        // password from a URL.
        let url_password = user_part
            .trim_end_matches('@')
            .split_once(':')
            .is_some_and(|(_, p)| !p.is_empty());
        self.params
            .iter()
            .filter(|(k, _)| AS_PARAM.contains(&k.as_str()) && !named(k))
            .filter(|(k, _)| k != "password" || !url_password)
            .map(|(k, v)| {
                // tokio-postgres's name for libpq's keyword.
                let k = if k == "keepalives_count" {
                    "keepalives_retries"
                } else {
                    k
                };
                format!("{k}={}", utf8_percent_encode(v, NON_ALPHANUMERIC))
            })
            .collect()
    }
}

/// `env` with the service's values in place of the variables they stand
/// for ([`Service::env`]): URL, then service, then environment.
pub(crate) fn layered<'a>(
    service: &'a Option<Service>,
    env: impl Fn(&str) -> Option<String> + 'a,
) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| service.as_ref().and_then(|s| s.env(k)).or_else(|| env(k))
}

/// The service `query` (`service=NAME`, percent-decoded; the last one, as
/// libpq keeps the last) or, failing that, `env("PGSERVICE")` names, read
/// from libpq's service files; `None` when no service is named. `env`
/// reads an environment variable as libpq does: set but empty is set
/// (`PGSERVICE=` names the service "", which no file defines), except
/// `HOME`, whose empty value libpq passes over.
pub(crate) fn pg_service(
    query: &[&str],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Service>, String> {
    let from_url = query.iter().rev().find_map(|kv| kv.strip_prefix("service="));
    let name = match from_url {
        Some(v) => percent_encoding::percent_decode_str(v)
            .decode_utf8()
            .map_err(|_| "the service name is not UTF-8".to_owned())?
            .into_owned(),
        None => match env("PGSERVICE") {
            Some(n) => n,
            None => return Ok(None),
        },
    };
    let user_file = match env("PGSERVICEFILE") {
        Some(f) => Some(PathBuf::from(f)),
        None => env("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .or_else(|| super::effective_user().and_then(|e| e.home.clone()))
            .map(|h| h.join(".pg_service.conf")),
    };
    let system_file = match env("PGSYSCONFDIR") {
        Some(d) => PathBuf::from(d).join("pg_service.conf"),
        None => SYSCONFDIRS
            .iter()
            .map(|d| Path::new(d).join("pg_service.conf"))
            .find(|f| f.exists())
            .unwrap_or_else(|| Path::new(SYSCONFDIRS[0]).join("pg_service.conf")),
    };
    let files: Vec<&PathBuf> = user_file.iter().chain([&system_file]).collect();
    for file in &files {
        // A file that does not exist is passed over, as libpq passes it
        // over; one that exists but cannot be read is an error, as in
        // libpq (never passed over for the next file, which psql would not
        // read). Bytes, not UTF-8: libpq reads a Latin-1 comment too.
        if std::fs::metadata(file).is_err() {
            continue;
        }
        let bytes = std::fs::read(file)
            .map_err(|e| format!("service file \"{}\" not found ({e})", file.display()))?;
        if let Some(params) = section(&String::from_utf8_lossy(&bytes), &name, file)? {
            return Ok(Some(Service { params }));
        }
    }
    let looked: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    Err(format!(
        "definition of service \"{name}\" not found (looked in {})",
        looked.join(", ")
    ))
}

/// Where the distributions' libpq looks for the system's service file
/// without `PGSYSCONFDIR`: Debian's and Ubuntu's, then Red Hat's (PGDG).
const SYSCONFDIRS: [&str; 2] = ["/etc/postgresql-common", "/etc/sysconfig/pgsql"];

/// The `(keyword, value)` pairs of section `[name]` of service file
/// `text` (read from `file`, for errors), `None` if it has no such section.
fn section(text: &str, name: &str, file: &Path) -> Result<Option<Vec<(String, String)>>, String> {
    let syntax = |n: usize| format!("syntax error in service file \"{}\", line {n}", file.display());
    let mut found = false;
    let mut params: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(group) = line.strip_prefix('[') {
            if found {
                break;
            }
            // libpq compares the name, then wants a ']' right after it.
            found = group.strip_prefix(name).is_some_and(|r| r.starts_with(']'));
            continue;
        }
        if !found {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(syntax(i + 1));
        };
        if key == "service" {
            return Err(format!(
                "nested service specifications not supported in service file \"{}\", line {}",
                file.display(),
                i + 1
            ));
        }
        let known = AS_ENV.iter().any(|(_, k)| *k == key) || AS_PARAM.contains(&key);
        if !known {
            if LIBPQ_OTHERS.contains(&key) {
                return Err(format!(
                    "service file \"{}\", line {}: `{key}` is not supported by dbmutex",
                    file.display(),
                    i + 1
                ));
            }
            return Err(syntax(i + 1));
        }
        if !params.iter().any(|(k, _)| k == key) {
            params.push((key.to_owned(), value.to_owned()));
        }
    }
    Ok(found.then_some(params))
}

/// `pg_locate`'s error `message` naming where a count came from: it
/// names the variable (`… (PGPORT)`), which a service's value stands in
/// for ([`layered`]); where the service gave the value, the message says
/// so instead of sending the reader to a variable that may not be set.
pub(crate) fn from_service(service: &Option<Service>, message: String) -> String {
    let Some(service) = service else {
        return message;
    };
    AS_ENV
        .iter()
        .filter(|(var, _)| service.env(var).is_some())
        .fold(message, |m, (var, key)| {
            m.replace(&format!("({var})"), &format!("(the service's {key})"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    use crate::local::tests::TempDir;

    fn file_with(text: &str) -> (TempDir, String) {
        let dir = TempDir::new("svc");
        let f = dir.path().join("svc.conf");
        std::fs::write(&f, text).unwrap();
        let path = f.to_str().unwrap().to_owned();
        (dir, path)
    }

    #[test]
    fn a_count_the_service_gave_is_named_as_the_services() {
        let (_d, f) = file_with("[prod]\nhost=a,b\nport=1,2,3\n");
        let vars = [("PGSERVICEFILE", f.as_str()), ("PGSERVICE", "prod")];
        let service = pg_service(&[], &env_of(&vars)).unwrap();
        let e = crate::redact::pg_locate("postgres:///x", &[], layered(&service, env_of(&vars))).unwrap_err();
        assert_eq!(
            from_service(&service, e),
            "3 port numbers for 2 hosts (the service's port)"
        );
        // A variable the service does not stand in for keeps its name.
        let plain = [("PGHOST", "a,b"), ("PGPORT", "1,2,3")];
        let e = crate::redact::pg_locate("postgres:///x", &[], layered(&None, env_of(&plain))).unwrap_err();
        assert_eq!(from_service(&None, e), "3 port numbers for 2 hosts (PGPORT)");
    }

    #[test]
    fn a_named_section_is_read_as_libpq_reads_it() {
        let (_d, f) = file_with(
            "# comment\n[other]\nhost=wrong\n\n  [prod]  \nhost=db1,db2\nport=6432\nuser=cron\n\
             # inside\nhost=second-ignored\npassword=p@ss word\napplication_name=job\n[next]\nport=1\n",
        );
        let vars = [("PGSERVICEFILE", f.as_str()), ("PGSERVICE", "prod")];
        let s = pg_service(&[], &env_of(&vars)).unwrap().unwrap();
        assert_eq!(s.env("PGHOST").as_deref(), Some("db1,db2"));
        assert_eq!(s.env("PGPORT").as_deref(), Some("6432"));
        assert_eq!(s.env("PGUSER").as_deref(), Some("cron"));
        assert_eq!(s.env("PGDATABASE"), None);
        assert_eq!(
            s.params(&[], ""),
            ["password=p%40ss%20word", "application_name=job"]
        );
        // The URL's own parameters and password win.
        assert_eq!(
            s.params(&["application_name=x"], "u:secret@"),
            Vec::<String>::new()
        );
        // `service=` in the URL beats PGSERVICE.
        let (_d2, f2) = file_with("[a]\nport=1\n[b]\nport=2\n");
        let vars = [("PGSERVICEFILE", f2.as_str()), ("PGSERVICE", "a")];
        let s = pg_service(&["service=b"], &env_of(&vars)).unwrap().unwrap();
        assert_eq!(s.env("PGPORT").as_deref(), Some("2"));
        // A section whose name only starts with the service's is another.
        let vars = [("PGSERVICEFILE", f2.as_str())];
        let e = pg_service(&["service=b%5D"], &env_of(&vars)).err().unwrap();
        assert!(e.contains("not found"), "{e}");
    }

    #[test]
    fn names_passwords_and_keywords_as_libpq_has_them() {
        // A percent-encoded name; the last `service=` wins; a Latin-1
        // comment does not spoil the file.
        let text = b"# caf\xe9\n[my svc]\nport=7\nkeepalives_count=4\npassword=pw\n[b]\nport=8\n";
        let dir = TempDir::new("svc-bytes");
        let f = dir.path().join("svc.conf");
        std::fs::write(&f, text).unwrap();
        let vars = [("PGSERVICEFILE", f.to_str().unwrap())];
        let s = pg_service(&["service=b", "service=my%20svc"], &env_of(&vars))
            .unwrap()
            .unwrap();
        assert_eq!(s.env("PGPORT").as_deref(), Some("7"));
        // libpq's keepalives_count is tokio-postgres's keepalives_retries.
        assert_eq!(s.params(&[], ""), ["keepalives_retries=4", "password=pw"]);
        // An empty URL password is none: the service's is sent.
        assert_eq!(s.params(&[], "u:@").len(), 2);
        assert_eq!(s.params(&[], "u:x@"), ["keepalives_retries=4"]);
    }

    #[test]
    fn no_service_named_reads_nothing() {
        let vars = [("PGSERVICEFILE", "/nonexistent/x")];
        assert!(pg_service(&["sslmode=disable"], &env_of(&vars))
            .unwrap()
            .is_none());
        // An empty PGSERVICE names the service "", as in libpq: none has it.
        let vars = [
            ("PGSERVICE", ""),
            ("PGSERVICEFILE", "/nonexistent/x"),
            ("PGSYSCONFDIR", "/nonexistent"),
        ];
        let e = pg_service(&[], &env_of(&vars)).err().unwrap();
        assert!(e.starts_with("definition of service \"\" not found"), "{e}");
    }

    #[test]
    fn the_system_file_serves_a_service_the_users_file_lacks() {
        let (_u, user) = file_with("[mine]\nport=1\n");
        let sys = TempDir::new("svc-sys");
        std::fs::write(
            sys.path().join("pg_service.conf"),
            "[shared]\nport=2\n[mine]\nport=3\n",
        )
        .unwrap();
        let sys_dir = sys.path().to_str().unwrap();
        let vars = [("PGSERVICEFILE", user.as_str()), ("PGSYSCONFDIR", sys_dir)];
        let port = |svc: &str| {
            pg_service(&[&format!("service={svc}")], &env_of(&vars))
                .unwrap()
                .unwrap()
                .env("PGPORT")
        };
        assert_eq!(port("mine").as_deref(), Some("1"), "the user's file first");
        assert_eq!(port("shared").as_deref(), Some("2"));
        let e = pg_service(&["service=absent"], &env_of(&vars)).err().unwrap();
        assert!(
            e.starts_with("definition of service \"absent\" not found (looked in "),
            "{e}"
        );
        assert!(e.contains(&user) && e.contains(sys_dir), "{e}");
        // A user's file that does not exist is passed over; one that
        // exists but cannot be read is an error, not passed over.
        let vars = [
            ("PGSERVICEFILE", "/nonexistent/svc.conf"),
            ("PGSYSCONFDIR", sys_dir),
        ];
        let s = pg_service(&["service=mine"], &env_of(&vars)).unwrap().unwrap();
        assert_eq!(s.env("PGPORT").as_deref(), Some("3"));
        let vars = [("PGSERVICEFILE", sys_dir), ("PGSYSCONFDIR", sys_dir)];
        let e = pg_service(&["service=mine"], &env_of(&vars)).err().unwrap();
        assert!(
            e.starts_with(&format!("service file \"{sys_dir}\" not found")),
            "{e}"
        );
    }

    #[test]
    fn bad_lines_are_errors_naming_file_and_line() {
        for (text, want) in [
            ("[s]\nhost db\n", "syntax error in service file"),
            ("[s]\nhost = db\n", "syntax error in service file"),
            ("[s]\nbogus=1\n", "syntax error in service file"),
            ("[s]\nservice=t\n", "nested service specifications"),
            ("[s]\nsslcert=/x\n", "`sslcert` is not supported by dbmutex"),
        ] {
            let (_d, f) = file_with(text);
            let vars = [("PGSERVICEFILE", f.as_str()), ("PGSERVICE", "s")];
            let e = pg_service(&[], &env_of(&vars)).err().unwrap();
            assert!(
                e.contains(want) && e.contains(&f) && e.contains("line 2"),
                "{text:?}: {e}"
            );
        }
        // Lines of other sections are not checked, as in libpq.
        let (_d, f) = file_with("[other]\nnonsense\n[s]\nport=5\n");
        let vars = [("PGSERVICEFILE", f.as_str()), ("PGSERVICE", "s")];
        assert!(pg_service(&[], &env_of(&vars)).is_ok());
    }
}
