//! The option files read as the `mariadb` client of MariaDB 10.11 reads them.

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

/// Unique prefixes, as the `mariadb` client of MariaDB 10.11 took them
/// (each checked by what it did: `pass=wrong` and `LOOSE-PAS=wrong`
/// sent a password, `po=3307` dialed port 3307, with "Using unique
/// option prefix … is error-prone"; `u=`, `pa=` and `loose-h=` stopped
/// it with "ambiguous option").
#[test]
fn a_unique_prefix_names_its_option_as_in_the_client() {
    for (line, name, want) in [
        ("pass=wrong", "password", Some("wrong")),
        ("passw=wrong", "password", Some("wrong")),
        ("LOOSE-PAS=wrong", "password", Some("wrong")),
        ("po=3307", "port", Some("3307")),
        ("us=cron", "user", Some("cron")),
        ("ho=db2", "host", Some("db2")),
        ("soc=/run/db.sock", "socket", Some("/run/db.sock")),
        // Ambiguous: `pa` (pager, password), `u` (unbuffered, user),
        // `h` (help, host, html), `p`, and no name at all.
        ("pa=x", "password", None),
        ("u=cron", "user", None),
        ("loose-h=db2", "host", None),
        ("p=x", "port", None),
        ("=x", "password", None),
        // Longer than the option, or another option's prefix.
        ("passwords=x", "password", None),
        ("sock=x", "ssl", None),
    ] {
        let text = format!("[client]\n{line}\n");
        assert_eq!(client_option(&text, name).as_deref(), want, "{line:?}");
    }
    // The option list is sorted, which `option_named`'s exact match
    // relies on (`ssl` before `ssl_ca`).
    assert!(CLIENT_OPTIONS.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(option_named("ssl"), Some("ssl"));
    assert_eq!(option_named("ssl_cap"), Some("ssl_capath"));
    assert_eq!(option_named("ssl_c"), None);
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
