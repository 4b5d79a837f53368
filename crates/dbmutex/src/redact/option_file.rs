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
pub(crate) fn client_option(text: &str, name: &str) -> Option<String> {
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
        if key.strip_prefix("loose_").unwrap_or(&key) == name {
            found = value.map(|v| value_of(v.trim_matches(is_space)));
        }
    }
    found
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
                    [Client ]\n\
                    password = s3cret # a comment\n";
        assert_eq!(client_password(text).as_deref(), Some("s3cret"));
        for (line, want) in [
            ("password=plain", "plain"),
            ("password = \"with # and space\"  # c", "with # and space"),
            ("password='it\\'s'", "it's"),
            ("password=a\\sb\\\\c", "a b\\c"),
            ("password=", ""),
        ] {
            assert_eq!(in_client(line).as_deref(), Some(want), "{line}");
        }
        assert_eq!(client_password("[mysqld]\npassword=x\n"), None);
        assert_eq!(client_password("password=outside-a-group\n"), None);
    }

    /// The password of a file of `[client]` and `line`.
    fn in_client(line: &str) -> Option<String> {
        client_password(&format!("[client]\n{line}\n"))
    }

    /// Each line's value as `my_print_defaults --defaults-file=F client`
    /// of MariaDB 10.11 (Debian's 1:10.11) printed it for the file
    /// `[client]\nLINE\n` (`None`: it printed no `--password`).
    #[test]
    fn values_are_read_as_my_print_defaults_of_mariadb_10_11_reads_them() {
        for (line, want) in [
            // Escapes: the known ones decoded, quoted or not; an unknown
            // one, and a final backslash, kept as written.
            (r"password=a\qb", Some(r"a\qb")),
            (r"password=a\nb\tc\rd\be", Some("a\nb\tc\rd\u{8}e")),
            (r"password=a\\b\sc", Some(r"a\b c")),
            (r"password=abc\s", Some("abc ")),
            (r"password=abc\", Some(r"abc\")),
            (r#"password=\"abc\""#, Some(r#""abc""#)),
            (r#"password="a\""#, Some(r"a\")),
            // `#` ends the value outside quotes, wherever they opened;
            // `;` never does.
            ("password=abc #x", Some("abc")),
            ("password=it's#x", Some("it's#x")),
            (r"password=a\'#b", Some("a'#b")),
            (r#"password=a\"b#c"#, Some(r#"a"b#c"#)),
            (r##"password=a"#"b"##, Some(r##"a"#"b"##)),
            ("password=abc ;x", Some("abc ;x")),
            (r#"password="a#b;c" #d"#, Some("a#b;c")),
            ("password='a#b' #c", Some("a#b")),
            (r##"password="a\"#b""##, Some(r##"a"#b"##)),
            (r"password='a\'#b'", Some("a'#b")),
            // Quotes dropped only around the whole value.
            (r#"password="abc"def"#, Some(r#""abc"def"#)),
            ("password='abc'def", Some("'abc'def")),
            (r#"password="abc";c"#, Some(r#""abc";c"#)),
            (r#"password="abc"def""#, Some(r#"abc"def"#)),
            (r#"password="a#b"#, Some(r#""a#b"#)),
            (r#"password="abc'"#, Some(r#""abc'"#)),
            (r#"password=""#, Some(r#"""#)),
            ("password=''", Some("")),
            (r#"password="abc"  ""#, Some(r#"abc"  "#)),
            // Spaces around `=` and at the ends, CR LF, `\v`.
            ("password\t=\t' in '\t", Some(" in ")),
            ("password = spaced  \r", Some("spaced")),
            ("password=\"abc\"\r", Some("abc")),
            ("password=abc\x0b", Some("abc")),
            ("password=a=b", Some("a=b")),
            ("password =  ", Some("")),
            // No `=`: `--password`, a prompt (see `client_option`); a
            // `#` in the name cuts it.
            ("  password  ", None),
            ("pass#word=x", None),
        ] {
            assert_eq!(in_client(line).as_deref(), want, "{line:?}");
        }
    }

    /// Names as the `mariadb` client of MariaDB 10.11 takes them (each
    /// checked by what it then did: `PASSWORD=secret`, `LOOSE-password`
    /// and `loose_password` sent a password, `Port=1` dialed port 1;
    /// `loose--password` and `loose-pass-word` were unknown variables; a
    /// password under `[CLIENT]` was sent, under `[ client ]` not).
    #[test]
    fn option_names_are_matched_as_the_client_matches_them() {
        for (line, want) in [
            ("PASSWORD=secret", Some("secret")),
            ("LOOSE-password=secret", Some("secret")),
            ("loose_password=secret", Some("secret")),
            ("loose--password=secret", None),
            ("loose-pass-word=secret", None),
        ] {
            assert_eq!(in_client(line).as_deref(), want, "{line:?}");
        }
        // Groups: any case, spaces dropped before the `]` only (`[client ]`
        // and `[Client-Server]` were read, `[ client ]` was not).
        for (group, read) in [
            ("[CLIENT]", true),
            ("[client ]", true),
            ("[Client-Server]", true),
            ("[ client ]", false),
        ] {
            let got = client_password(&format!("{group}\npassword=secret\n"));
            assert_eq!(got.is_some(), read, "{group}");
        }
        let text = "[client]\nPort=3307\nloose-HOST=db2\n";
        assert_eq!(client_option(text, "port").as_deref(), Some("3307"));
        assert_eq!(client_option(text, "host").as_deref(), Some("db2"));
    }

    /// A bare `password` after a value: `my_print_defaults` of MariaDB
    /// 10.11 printed `--password=first` then `--password`, and the last
    /// wins, so the client prompts rather than send `first`.
    #[test]
    fn a_bare_password_line_hides_an_earlier_password() {
        let text = "[client]\npassword=first\n[client-server]\npassword\n";
        assert_eq!(client_password(text), None);
        assert_eq!(client_option("[client]\nport\n", "port"), None);
    }

    #[test]
    fn includes_are_followed_and_groups_kept_as_the_clients_keep_them() {
        let dir = crate::local::tests::TempDir::new("mycnf");
        let d = dir.path();
        let inc = d.join("inc.cnf");
        let conf_d = d.join("conf.d");
        std::fs::create_dir_all(&conf_d).unwrap();
        std::fs::write(&inc, "password=outside-a-group\n[mysqld]\nuser=not-this\n").unwrap();
        // Written out of order: only name order makes 50-e's the last.
        for (name, n) in [("30-c", 3), ("50-e", 5), ("20-b", 2), ("40-d", 4)] {
            std::fs::write(
                conf_d.join(format!("{name}.cnf")),
                format!("[client-server]\nsocket=/s{n}\n"),
            )
            .unwrap();
        }
        std::fs::write(conf_d.join("10-a.cnf"), "[client]\nsocket=/s1\nhost=h\n").unwrap();
        std::fs::write(conf_d.join("30-c.txt"), "[client]\nhost=not-a-cnf\n").unwrap();
        std::fs::write(
            conf_d.join("40-d.cnf"),
            "[client-mariadb]\ndefault-character-set=utf8mb4\n",
        )
        .unwrap();
        let main = d.join("my.cnf");
        std::fs::write(
            &main,
            format!(
                "[client]\nuser=a\n! include {}\nport=1\n!includedir {}\n!includex /x\n[mysqld]\nport=2\n",
                inc.display(),
                conf_d.display()
            ),
        )
        .unwrap();
        let mut text = String::new();
        assert!(read_into(&main, 0, &mut text));
        let get = |name: &str| client_option(&text, name);
        assert_eq!(get("user").as_deref(), Some("a"), "{text}");
        assert_eq!(
            get("port").as_deref(),
            Some("1"),
            "[client] resumes after an include: {text}"
        );
        assert_eq!(
            get("password"),
            None,
            "an included file starts outside any group: {text}"
        );
        assert!(
            text.contains("!includex /x"),
            "no directive, kept as a line (the groups skip it)"
        );
        assert_eq!(
            get("socket").as_deref(),
            Some("/s5"),
            "name order, [client-server]: {text}"
        );
        assert_eq!(get("host").as_deref(), Some("h"), "only .cnf files: {text}");
        assert_eq!(get("default_character_set").as_deref(), Some("utf8mb4"));
        // An include of itself stops at the depth limit instead of looping.
        let loop_file = d.join("loop.cnf");
        std::fs::write(
            &loop_file,
            format!("[client]\nport=3\n!include {}\n", loop_file.display()),
        )
        .unwrap();
        let mut text = String::new();
        assert!(read_into(&loop_file, 0, &mut text));
        assert_eq!(client_option(&text, "port").as_deref(), Some("3"));
        assert!(!read_into(&d.join("absent.cnf"), 0, &mut text));
    }
}
