//! The MySQL and MariaDB clients' option files, read as they read them:
//! the system's (`/etc/my.cnf`, `/etc/mysql/my.cnf`), `my.cnf` in
//! `MARIADB_HOME` or `MYSQL_HOME`, then the user's `~/.my.cnf`, with their
//! `!include` and `!includedir` directives followed, and of them the
//! groups every client reads: `[client]`, and MariaDB's `[client-server]`
//! and `[client-mariadb]` (the password and user a URL leaves out,
//! `crate::mysql`'s; the host, port and socket, [`super::mysql_locate`]'s).
//! A later value wins, as in the clients, so `~/.my.cnf` overrides the
//! system's files. Files are read as bytes (a Latin-1 comment does not
//! hide a file).
//!
//! Not read, and documented so: the `mysql`/`mariadb` programs' own groups
//! (`[mysql]`, `[mariadb-client]`), a group suffix
//! (`MYSQL_GROUP_SUFFIX`), Oracle MySQL's `~/.mylogin.cnf`; and where the
//! clients stop on a malformed file ("Fatal error in defaults handling")
//! or drop the rest of an included one, dbmutex reads on.

use std::path::{Path, PathBuf};

/// The system's option files, in the clients' order (Debian's MariaDB puts
/// its `[client-server]` socket in the second).
#[cfg(not(test))]
const SYSTEM_FILES: &[&str] = &["/etc/my.cnf", "/etc/mysql/my.cnf"];
/// Unit tests read none: what they assert must not depend on the machine's
/// files (`tests/passwords.rs` checks the system's against `mariadb
/// --print-defaults`).
#[cfg(test)]
const SYSTEM_FILES: &[&str] = &[];

/// How deep `!include`s may nest (the clients stop at 10).
const MAX_DEPTH: u32 = 10;

/// The text of the option files the clients read, one after the other in
/// their order, `!include`d files in their place (`None` where there is
/// none). A world-writable file is passed over, as the clients pass it
/// over, with a warning. Each file starts outside any group, and the
/// including file's group resumes after an include, as in the clients.
pub(crate) fn option_file(env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    // A set MARIADB_HOME, even empty, hides MYSQL_HOME, as in `mariadb`.
    let home_dir = match env("MARIADB_HOME") {
        Some(d) => Some(d).filter(|d| !d.is_empty()),
        None => set("MYSQL_HOME"),
    };
    let files = SYSTEM_FILES
        .iter()
        .map(PathBuf::from)
        .chain(home_dir.map(|d| Path::new(&d).join("my.cnf")))
        .chain(set("HOME").map(|h| Path::new(&h).join(".my.cnf")));
    let mut text = String::new();
    let mut any = false;
    for file in files {
        any |= read_into(&file, 0, &mut text);
    }
    any.then_some(text)
}

/// `!include PATH` (`(PATH, false)`) or `!includedir DIR` (`(DIR, true)`),
/// spaces allowed after the `!` as the clients allow them, and required
/// before the path (`!includefoo` is no directive).
fn directive(line: &str) -> Option<(&str, bool)> {
    let rest = line.strip_prefix('!')?.trim_start();
    let (rest, dir) = match rest.strip_prefix("includedir") {
        Some(r) => (r, true),
        None => (rest.strip_prefix("include")?, false),
    };
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    Some((rest.trim(), dir)).filter(|(p, _)| !p.is_empty())
}

/// Appends option file `file`'s lines to `out`, its includes followed
/// ([`option_file`]); whether it was read.
fn read_into(file: &Path, depth: u32, out: &mut String) -> bool {
    let Some(text) = crate::redact::read_credentials_file(
        file,
        0o002,
        "the option file is world-writable and is ignored, as the MySQL clients ignore it",
    ) else {
        return false;
    };
    // Outside any group until the file names one.
    out.push_str("[]\n");
    let mut group = "[]";
    for line in text.lines() {
        let trimmed = line.trim();
        let Some((path, dir)) = directive(trimmed) else {
            if trimmed.starts_with('[') {
                group = trimmed;
            }
            out.push_str(line);
            out.push('\n');
            continue;
        };
        if depth >= MAX_DEPTH {
            continue;
        }
        if dir {
            // Its `.cnf` files, in name order.
            let mut names: Vec<PathBuf> = std::fs::read_dir(path)
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            names.retain(|p| p.extension().is_some_and(|e| e == "cnf"));
            names.sort();
            for f in names {
                read_into(&f, depth + 1, out);
            }
        } else {
            read_into(Path::new(path), depth + 1, out);
        }
        out.push_str(group);
        out.push('\n');
    }
    true
}

/// The last `password` of the `[client]` groups of an option file's text.
#[cfg(test)]
fn client_password(text: &str) -> Option<String> {
    client_option(text, "password")
}

/// The last option `name` of the client groups (`[client]`,
/// `[client-server]`, `[client-mariadb]`) of an option file's text (the
/// last one read wins, as in the clients). Lines starting with `#` or
/// `;` are comments, as is a line's tail from a `#` outside quotes
/// ([`uncommented`]); the value is read by [`value_of`]. `!include`
/// directives are not followed.
///
/// A bare `name` (no `=`) gives none, and hides an earlier value: for
/// `password` the clients then prompt for one, which dbmutex cannot do,
/// and the password of an earlier line or file (or an empty one) would be
/// a wrong one, sent without a word (`MYSQL_PWD`, if set, is then taken,
/// as where the files name none); for the options dbmutex reads that take
/// a value (`user`, `host`, `port`, `socket`) the clients stop with
/// "requires an argument", and dbmutex reads on with the default.
///
/// A name is matched whole or by a unique prefix ([`option_named`]), after
/// one `loose-`. Not read, where the client reads them: the `skip-`,
/// `disable-`, `enable-`, `maximum-` and `autoset-` prefixes (`skip-port`
/// after `port=1` sends the client to its default port), a repeated
/// `loose-`, and `group.option` names.
pub(crate) fn client_option(text: &str, name: &str) -> Option<String> {
    // Only the client's own options can ever match (`option_named`).
    debug_assert!(
        CLIENT_OPTIONS.contains(&name),
        "not a mariadb client option: {name}"
    );
    let mut in_client = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim_matches(is_space);
        if line.is_empty() || line.starts_with(['#', ';', '!']) {
            continue;
        }
        if let Some(group) = line.strip_prefix('[') {
            // As the clients read a group's name: spaces before the `]`
            // dropped, not after the `[`, and any case (`[CLIENT]`).
            let name = group.split(']').next().unwrap_or("").trim_end_matches(is_space);
            in_client = ["client", "client-server", "client-mariadb"]
                .iter()
                .any(|g| name.eq_ignore_ascii_case(g));
            continue;
        }
        if !in_client {
            continue;
        }
        let line = uncommented(line);
        let (key, value) = match line.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (line, None),
        };
        // Option names may spell `_` as `-`, in any case, and carry the
        // `loose-` prefix (an option a program does not know is then
        // passed over, not an error): `PORT=3307` and `loose-host=db2`
        // move the `mariadb` client, so they move dbmutex too.
        let key = key.trim_matches(is_space).replace('-', "_").to_ascii_lowercase();
        if option_named(key.strip_prefix("loose_").unwrap_or(&key)) == Some(name) {
            found = value.map(|v| value_of(v.trim_matches(is_space)));
        }
    }
    found
}

/// The long options of the `mariadb` client of MariaDB 10.11 (`mariadb
/// --help`), `-` spelled `_`: what a name in an option file is matched
/// against, whole or by a unique prefix.
const CLIENT_OPTIONS: &[&str] = &[
    "abort_source_on_error",
    "auto_rehash",
    "auto_vertical_output",
    "batch",
    "binary_as_hex",
    "binary_mode",
    "character_sets_dir",
    "column_names",
    "column_type_info",
    "comments",
    "compress",
    "connect_expired_password",
    "connect_timeout",
    "database",
    "debug",
    "debug_check",
    "debug_info",
    "default_auth",
    "default_character_set",
    "delimiter",
    "enable_cleartext_plugin",
    "execute",
    "force",
    "help",
    "host",
    "html",
    "i_am_a_dummy",
    "ignore_spaces",
    "init_command",
    "line_numbers",
    "local_infile",
    "max_allowed_packet",
    "max_join_size",
    "named_commands",
    "net_buffer_length",
    "no_auto_rehash",
    "no_beep",
    "one_database",
    "pager",
    "password",
    "plugin_dir",
    "port",
    "print_query_on_error",
    "progress_reports",
    "prompt",
    "protocol",
    "quick",
    "quick_max_column_width",
    "raw",
    "reconnect",
    "safe_updates",
    "sandbox",
    "secure_auth",
    "select_limit",
    "server_arg",
    "show_warnings",
    "sigint_ignore",
    "silent",
    "skip_column_names",
    "skip_line_numbers",
    "socket",
    "ssl",
    "ssl_ca",
    "ssl_capath",
    "ssl_cert",
    "ssl_cipher",
    "ssl_crl",
    "ssl_crlpath",
    "ssl_key",
    "ssl_verify_server_cert",
    "table",
    "tee",
    "tls_version",
    "unbuffered",
    "user",
    "verbose",
    "version",
    "vertical",
    "wait",
    "xml",
];

/// The client option an option file's `name` (lowercase, `-` spelled
/// `_`) sets, as the client's `my_getopt` finds it: the option of that
/// name, else the one option it is a prefix of (`pass=x` sets the
/// password, with an "error-prone" note from the client); `None` for an
/// unknown name or a prefix of several (`pa`: `pager` and `password`, where
/// the client stops with "ambiguous option" and dbmutex passes the line
/// over).
fn option_named(name: &str) -> Option<&'static str> {
    let mut of = CLIENT_OPTIONS.iter().filter(|o| o.starts_with(name));
    let first = of.next()?;
    if *first == name {
        return Some(first);
    }
    // Longer names sort after their prefixes: an exact match comes first
    // among those that start with it.
    match of.next() {
        None if !name.is_empty() => Some(first),
        _ => None,
    }
}

/// The spaces the clients trim around names and values (`my_isspace` of
/// Latin-1's ASCII half), `\v` and `\f` among them; not Unicode's others,
/// which Rust's `trim` would take too.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// A line without its end comment, which starts at the first `#` outside
/// quotes, as the clients' `remove_end_comment` cuts it. A quote opens
/// anywhere in the line, not only at the value's start, and stays open to
/// its match or the line's end: `password=it's#x` is `it's#x`; in quotes a
/// `\` escapes the next character (`"a\"#b"` is one quoted string). A
/// `;` cuts nothing: it starts a comment only at a line's start.
fn uncommented(line: &str) -> &str {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if matches!(c, '\'' | '"') && !escaped {
            quote = match quote {
                None => Some(c),
                Some(q) if q == c => None,
                open => open,
            };
        }
        if c == '#' && quote.is_none() {
            return &line[..i];
        }
        escaped = quote.is_some() && c == '\\' && !escaped;
    }
    line
}

/// An option's value as the clients read it (`search_default_file_with_ext`),
/// from `raw`, what follows the `=`, comment cut and spaces trimmed. Quotes
/// are dropped only where the same one opens and ends the whole value, so
/// `"abc"def`, `"abc` and a lone `"` keep theirs. Then, quoted or not, the
/// escapes `\n`, `\t`, `\r`, `\b`, `\s` (a space: the one way to end a
/// value with a space unquoted), `\\`, `\'` and `\"` are decoded; any other
/// (`\q`) and a final `\` are kept as written, backslash and all.
fn value_of(raw: &str) -> String {
    let body = ['"', '\'']
        .into_iter()
        .find_map(|q| raw.strip_prefix(q)?.strip_suffix(q))
        .unwrap_or(raw);
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('s') => out.push(' '),
            Some(c @ ('\\' | '\'' | '"')) => out.push(c),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests;
