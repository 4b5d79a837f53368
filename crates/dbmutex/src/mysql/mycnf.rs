//! The MySQL and MariaDB clients' defaults for what a URL leaves out, as
//! the `mysql`/`mariadb` clients read them:
//!
//! - the password: the `MYSQL_PWD` environment variable, else the
//!   `password` option of the `[client]` group of the user's option file
//!   (`~/.my.cnf`). So a cron job keeps its password out of the URL (and
//!   out of `ps`) the way it already does for them;
//! - the user: the `user` option of that group, else the login's name
//!   (`root` for the superuser, else the password database's name for the
//!   effective uid, else `USER` or `LOGNAME`).

use std::path::Path;

/// The password the clients would send, where the URL names none. `env`
/// reads an environment variable (`std::env::var` but in tests).
pub(super) fn password(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(p) = env("MYSQL_PWD") {
        return Some(p);
    }
    client_password(&option_file(&env)?)
}

/// The user the clients would log in as, where the URL names none (see
/// the module's text).
pub(super) fn user(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(u) = option_file(&env).and_then(|t| client_option(&t, "user")) {
        return Some(u);
    }
    // As the clients' `read_user_name`: the superuser is `root` whatever
    // its entry's name (`sudo` keeps the caller's USER).
    if crate::redact::is_root() {
        return Some("root".into());
    }
    crate::redact::effective_user()
        .and_then(|e| e.name)
        .or_else(|| env("USER"))
        .or_else(|| env("LOGNAME"))
        .filter(|u| !u.is_empty())
}

/// The text of `~/.my.cnf` (`None` where there is none, or it is
/// world-writable: the clients ignore it then, and so do we, with a
/// warning).
fn option_file(env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let home = env("HOME").filter(|h| !h.is_empty())?;
    crate::redact::read_credentials_file(
        &Path::new(&home).join(".my.cnf"),
        0o002,
        "the option file is world-writable and is ignored, as the MySQL clients ignore it",
    )
}

/// The last `password` of the `[client]` groups of an option file's text.
fn client_password(text: &str) -> Option<String> {
    client_option(text, "password")
}

/// The last option `name` of the `[client]` groups of an option file's text
/// (the last one read wins, as in the clients). Lines starting with `#` or
/// `;` are comments, as is an unquoted value's tail from a `#`; a value may
/// be quoted (`'…'` or `"…"`) and holds the escapes `\n`, `\t`, `\r`, `\b`,
/// `\s` (a space), `\\`, `\'` and `\"`. `!include` directives are not
/// followed.
fn client_option(text: &str, name: &str) -> Option<String> {
    let mut in_client = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';', '!']) {
            continue;
        }
        if let Some(group) = line.strip_prefix('[') {
            in_client = group.split(']').next().map(str::trim) == Some("client");
            continue;
        }
        if !in_client {
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        // Option names may spell `_` as `-`.
        if key.trim().replace('-', "_") == name {
            found = Some(value_of(value.trim()));
        }
    }
    found
}

/// An option's value as the clients read it (see [`client_option`]).
fn value_of(raw: &str) -> String {
    let quote = raw.chars().next().filter(|c| *c == '\'' || *c == '"');
    let body = match quote {
        Some(_) => &raw[1..],
        None => raw,
    };
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match (c, quote) {
            ('\\', _) => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some('b') => out.push('\u{8}'),
                Some('s') => out.push(' '),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, Some(q)) if c == q => break,
            ('#', None) => break,
            (c, _) => out.push(c),
        }
    }
    match quote {
        Some(_) => out,
        None => out.trim_end().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_groups_password_is_read_as_the_clients_read_it() {
        let text = "# ~/.my.cnf\n\
                    [mysqld]\n\
                    password = not-this\n\
                    [client]\n\
                    user = cron\n\
                    password = first\n\
                    [mysql]\n\
                    password = nor-this\n\
                    [ client ]\n\
                    password = s3cret # a comment\n";
        assert_eq!(client_password(text).as_deref(), Some("s3cret"));
        for (line, want) in [
            ("password=plain", "plain"),
            ("password = \"with # and space\"  # c", "with # and space"),
            ("password='it\\'s'", "it's"),
            ("password=a\\sb\\\\c", "a b\\c"),
            ("password=", ""),
        ] {
            assert_eq!(
                client_password(&format!("[client]\n{line}\n")).as_deref(),
                Some(want),
                "{line}"
            );
        }
        assert_eq!(client_password("[mysqld]\npassword=x\n"), None);
        assert_eq!(client_password("password=outside-a-group\n"), None);
    }

    #[test]
    fn the_user_is_the_option_files_else_the_logins() {
        let dir = std::env::temp_dir().join(format!("dbmutex-mycnf-user-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(".my.cnf"),
            "[client]\nuser = cron\n[mysql]\nuser = not-this\n",
        )
        .unwrap();
        let home = dir.to_str().unwrap().to_owned();
        let with_home = |k: &str| (k == "HOME").then(|| home.clone());
        assert_eq!(user(with_home).as_deref(), Some("cron"));
        let login = match crate::redact::is_root() {
            true => Some("root".to_owned()),
            false => crate::redact::effective_user().and_then(|e| e.name),
        };
        assert!(login.is_some(), "this user has a name");
        assert_eq!(user(|_| None), login, "no option file: the login's name");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mysql_pwd_then_the_option_file() {
        let dir = std::env::temp_dir().join(format!("dbmutex-mycnf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(".my.cnf"), "[client]\npassword=from-file\n").unwrap();
        let home = dir.to_str().unwrap().to_owned();
        let env = |vars: Vec<(&'static str, String)>| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        assert_eq!(
            password(env(vec![("MYSQL_PWD", "env".into()), ("HOME", home.clone())])).as_deref(),
            Some("env")
        );
        assert_eq!(
            password(env(vec![("HOME", home.clone())])).as_deref(),
            Some("from-file")
        );
        assert_eq!(password(env(vec![])), None);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(".my.cnf"), std::fs::Permissions::from_mode(0o666)).unwrap();
            assert_eq!(
                password(env(vec![("HOME", home)])),
                None,
                "world-writable: ignored"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
