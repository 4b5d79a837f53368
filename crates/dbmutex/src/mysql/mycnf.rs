//! The MySQL and MariaDB clients' defaults for what a URL leaves out, as
//! the `mysql`/`mariadb` clients read them:
//!
//! - the password: the `password` option of the client groups of the
//!   option files (`redact/option_file.rs`: the system's, then the user's
//!   `~/.my.cnf`), else the `MYSQL_PWD` environment
//!   variable (the option file first, as both clients' libraries take it:
//!   checked with Debian's `mariadb` 10.11, which logs in with the file's
//!   password while `MYSQL_PWD` holds a wrong one). So a cron job keeps
//!   its password out of the URL (and out of `ps`) the way it already
//!   does for them;
//! - the user: the `user` option of those groups (an empty one counts as
//!   none), else the login's name (`root` for the superuser, else the
//!   password database's name for the effective uid, else `USER` or
//!   `LOGNAME`; looked up once per process).
//!
//! The `[mysql]` and `[mariadb-client]` groups are the `mysql` program's
//! own, not every client's: not read.

use crate::redact::client_option;
pub(super) use crate::redact::option_file;

/// The password the clients would send, where the URL names none, from
/// the option file's text `file` (read once per connect, by the caller,
/// for the user and the password alike) and the environment `env`
/// (`std::env::var` but in tests).
pub(super) fn password(file: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    file.and_then(|t| client_option(t, "password"))
        .or_else(|| env("MYSQL_PWD"))
}

/// The user the clients would log in as, where the URL names none (see
/// the module's text; `file` and `env` as for [`password`]).
pub(super) fn user(file: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let named = file.and_then(|t| client_option(t, "user"));
    if let Some(u) = named.filter(|u| !u.is_empty()) {
        return Some(u);
    }
    // As the clients' `read_user_name`: the superuser is `root` whatever
    // its entry's name (`sudo` keeps the caller's USER).
    if crate::redact::is_root() {
        return Some("root".into());
    }
    crate::redact::effective_user()
        .and_then(|e| e.name.clone())
        .or_else(|| env("USER"))
        .or_else(|| env("LOGNAME"))
        .filter(|u| !u.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            user(option_file(&with_home).as_deref(), with_home).as_deref(),
            Some("cron")
        );
        // The login's name as id(1) tells it (`root` for uid 0).
        let id = std::process::Command::new("id").arg("-un").output().unwrap();
        let login = String::from_utf8(id.stdout).unwrap().trim().to_owned();
        assert_eq!(
            user(None, |_| None).as_deref(),
            Some(&*login),
            "no option file: the login's name"
        );
        std::fs::write(dir.join(".my.cnf"), "[client]\nuser =\n").unwrap();
        assert_eq!(
            user(option_file(&with_home).as_deref(), with_home).as_deref(),
            Some(&*login),
            "an empty user is none"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// [`password`] as a connect calls it.
    fn of_file(env: impl Fn(&str) -> Option<String>) -> Option<String> {
        password(option_file(&env).as_deref(), env)
    }

    #[test]
    fn the_option_file_then_mysql_pwd() {
        let dir = std::env::temp_dir().join(format!("dbmutex-mycnf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(".my.cnf"), "[client]\npassword=from-file\n").unwrap();
        let home = dir.to_str().unwrap().to_owned();
        let env = |vars: Vec<(&'static str, String)>| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        assert_eq!(
            of_file(env(vec![("MYSQL_PWD", "env".into()), ("HOME", home.clone())])).as_deref(),
            Some("from-file"),
            "the file first, as the clients"
        );
        assert_eq!(
            of_file(env(vec![("MYSQL_PWD", "env".into())])).as_deref(),
            Some("env")
        );
        assert_eq!(
            of_file(env(vec![("HOME", home.clone())])).as_deref(),
            Some("from-file")
        );
        assert_eq!(of_file(env(vec![])), None);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(".my.cnf"), std::fs::Permissions::from_mode(0o666)).unwrap();
            assert_eq!(
                of_file(env(vec![("HOME", home)])),
                None,
                "world-writable: ignored"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
