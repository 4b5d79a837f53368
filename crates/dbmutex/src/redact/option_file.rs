//! The MySQL and MariaDB clients' option file, `~/.my.cnf`, read as they
//! read it: its `[client]` group's options (the password and user a URL
//! leaves out, `crate::mysql`'s; the host, port and socket,
//! [`super::mysql_locate`]'s).

use std::path::Path;

/// The text of `~/.my.cnf` (`None` where there is none, or it is
/// world-writable: the clients ignore it then, and so do we, with a
/// warning).
pub(crate) fn option_file(env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let home = env("HOME").filter(|h| !h.is_empty())?;
    crate::redact::read_credentials_file(
        &Path::new(&home).join(".my.cnf"),
        0o002,
        "the option file is world-writable and is ignored, as the MySQL clients ignore it",
    )
}

/// The last `password` of the `[client]` groups of an option file's text.
#[cfg(test)]
fn client_password(text: &str) -> Option<String> {
    client_option(text, "password")
}

/// The last option `name` of the `[client]` groups of an option file's text
/// (the last one read wins, as in the clients). Lines starting with `#` or
/// `;` are comments, as is an unquoted value's tail from a `#`; a value may
/// be quoted (`'…'` or `"…"`) and holds the escapes `\n`, `\t`, `\r`, `\b`,
/// `\s` (a space), `\\`, `\'` and `\"`. `!include` directives are not
/// followed.
pub(crate) fn client_option(text: &str, name: &str) -> Option<String> {
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
}
