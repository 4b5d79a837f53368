//! Hostile passwords and every way to write them into a connection string:
//! the generated cases of the library's `security` test and the CLI's
//! `secrets` test (which includes this file by path), so both attack with
//! the same inputs. Deterministic: the same cases every run.
#![allow(dead_code)]

/// A small deterministic generator (xorshift64*): the same cases every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

/// What goes between a password's marker tokens: every URL and key=value
/// delimiter, percent-encoded forms (valid and not), quotes, spaces,
/// non-ASCII, and fragments that look like the rest of a URL.
pub const PIECES: &[&str] = &[
    "/",
    "?",
    "#",
    "@",
    ":",
    "&",
    "=",
    "%",
    "+",
    ";",
    ",",
    " ",
    "'",
    "\"",
    "\\",
    "%2F",
    "%2f",
    "%40",
    "%3F",
    "%23",
    "%25",
    "%20",
    "%zz",
    "%",
    "ü",
    "€",
    "🔑",
    "\u{a0}",
    "  ",
    "@127.0.0.1:5432/",
    "?sslmode=",
    "&password=",
    "&sslmode=",
    "&sslrootcert=",
    "/test?",
    "#frag",
    "password=",
    "'--",
    "\\'",
    "=\"",
    "`",
    "$(",
    "<",
    ">",
    "[",
    "]",
    "{",
    "}",
    "|",
    "^",
    "~",
    "*",
];

/// A hostile password and the texts that must never appear in output: the
/// password, its percent-encoded form, and every marker token in it (whole,
/// and its first and last 6 characters), so that a leak of any fragment
/// between two delimiters is caught.
pub struct Secret {
    pub text: String,
    pub needles: Vec<String>,
}

pub fn token(case: usize, i: usize) -> String {
    format!("Sx{case:04}{}Yq", (b'a' + i as u8) as char)
}

pub fn secret(text: String, tokens: &[String]) -> Secret {
    let mut needles = vec![text.clone(), pct(&text)];
    for t in tokens {
        needles.push(t.clone());
        needles.push(t[..6].to_owned());
        needles.push(t[t.len() - 6..].to_owned());
    }
    Secret { text, needles }
}

/// Fixed shapes first (the ones seen leaking), then random ones.
pub fn hostile_passwords(random: usize) -> Vec<Secret> {
    let shapes = [
        "pa/{t}",
        "pa?{t}",
        "pa#{t}",
        "pa@{t}",
        "{t}:x",
        "5432/{t}",
        "pa%2F{t}",
        "pa%40{t}",
        "pa%3F{t}",
        "p a ss {t}",
        "'{t}\"",
        "\\{t}\\",
        "{t}€ü🔑",
        "x&password={t}",
        "x?sslmode={t}",
        "x&sslmode={t}",
        "x&sslrootcert={t}",
        "@127.0.0.1:5432/{t}",
        "{t}@127.0.0.1:5432/test?x=",
        "{t}",
    ];
    let mut out: Vec<Secret> = shapes
        .iter()
        .enumerate()
        .map(|(case, shape)| {
            let t = token(case, 0);
            secret(shape.replace("{t}", &t), &[t])
        })
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for case in shapes.len()..shapes.len() + random {
        let mut text = String::new();
        let mut tokens = Vec::new();
        for i in 0..1 + rng.below(4) {
            if i > 0 || rng.below(2) == 0 {
                for _ in 0..1 + rng.below(3) {
                    text.push_str(PIECES[rng.below(PIECES.len())]);
                }
            }
            let t = token(case, i);
            text.push_str(&t);
            tokens.push(t);
        }
        if rng.below(2) == 0 {
            text.push_str(PIECES[rng.below(PIECES.len())]);
        }
        out.push(secret(text, &tokens));
    }
    out
}

/// Percent-encodes everything but ASCII letters and digits.
pub fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `host:port` of a test URL (`scheme://user@host:port/db`).
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").expect("a URL").1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap().to_owned()
}

/// Every way a password can be written into a connection string, for a
/// PostgreSQL and a MySQL server at these addresses.
pub fn connection_strings(p: &str, pg: &str, my: &str) -> Vec<String> {
    let e = pct(p);
    // libpq key=value quoting: backslash and quote escaped.
    let kv = p.replace('\\', "\\\\").replace('\'', "\\'");
    let (pg_host, pg_port) = pg.rsplit_once(':').unwrap_or((pg, "5432"));
    vec![
        format!("postgres://postgres:{p}@{pg}/test"),
        format!("postgresql://postgres:{e}@{pg}/test"),
        format!("postgres://postgres@{pg}/test?password={p}"),
        format!("postgres://postgres@{pg}/test?sslmode=disable&password={e}"),
        format!("postgres://postgres@{pg}/test?PASSWORD={e}&sslpassword={e}"),
        format!("host={pg_host} port={pg_port} user=postgres password='{kv}' dbname=test"),
        format!("host={pg_host} port={pg_port} user=postgres password={p} dbname=test"),
        format!("mysql://root:{p}@{my}/test"),
        format!("mariadb://root:{e}@{my}/test"),
        format!("mysql://root@{my}/test?password={e}&pass={e}"),
        format!("mysql://root:{e}@{my}/test?pool_min={p}"),
        format!("nosuch://u:{p}@{pg}/db"),
        p.to_owned(),
    ]
}
