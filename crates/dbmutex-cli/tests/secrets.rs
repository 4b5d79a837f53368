//! Hostile passwords through the real binary (issue 9, item 8): every
//! subcommand, with `-v` and `--json`, the URL given by flag or by
//! environment, against closed ports (connection refused) and the real
//! servers (PostgreSQL trusts loopback, so the password is ignored and the
//! command runs; MariaDB refuses root with a wrong password). Neither stdout
//! nor stderr may contain the password, its percent-encoded form, or any
//! fragment of it between two delimiters. Cases come from a fixed seed.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

mod support;

use support::Rng;

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");

/// What goes between a password's marker tokens.
const PIECES: &[&str] = &[
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
    "%40",
    "%3F",
    "%23",
    "%25",
    "%zz",
    "ü",
    "€",
    "🔑",
    "@127.0.0.1:5432/",
    "?sslmode=",
    "&password=",
    "/test?",
    "password=",
    "$(",
    "`",
    "\u{a0}",
];

/// A password and the texts that must never be printed.
struct Secret {
    text: String,
    needles: Vec<String>,
}

fn token(case: usize, i: usize) -> String {
    format!("Cx{case:04}{}Zk", (b'a' + i as u8) as char)
}

fn secret(text: String, tokens: &[String]) -> Secret {
    let mut needles = vec![text.clone(), pct(&text)];
    for t in tokens {
        needles.push(t.clone());
        needles.push(t[..6].to_owned());
        needles.push(t[t.len() - 6..].to_owned());
    }
    Secret { text, needles }
}

fn hostile_passwords(random: usize) -> Vec<Secret> {
    let shapes = [
        "pa/{t}",
        "pa?{t}",
        "pa#{t}",
        "pa@{t}",
        "5432/{t}",
        "pa%2F{t}",
        "p a ss '{t}\"",
        "\\{t}€🔑",
        "x&sslmode={t}",
        "@127.0.0.1:5432/{t}",
    ];
    let mut out: Vec<Secret> = shapes
        .iter()
        .enumerate()
        .map(|(case, shape)| {
            let t = token(case, 0);
            secret(shape.replace("{t}", &t), &[t])
        })
        .collect();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for case in shapes.len()..shapes.len() + random {
        let mut text = String::new();
        let mut tokens = Vec::new();
        for i in 0..1 + rng.below(3) {
            if i > 0 || rng.below(2) == 0 {
                for _ in 0..1 + rng.below(3) {
                    text.push_str(PIECES[rng.below(PIECES.len())]);
                }
            }
            let t = token(case, i);
            text.push_str(&t);
            tokens.push(t);
        }
        out.push(secret(text, &tokens));
    }
    out
}

/// Percent-encodes everything but ASCII letters and digits.
fn pct(s: &str) -> String {
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

/// `host:port` of a test URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").expect("a URL").1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap().to_owned()
}

fn connection_strings(p: &str, pg: &str, my: &str) -> Vec<String> {
    let e = pct(p);
    let kv = p.replace('\\', "\\\\").replace('\'', "\\'");
    let (pg_host, pg_port) = pg.rsplit_once(':').unwrap_or((pg, "5432"));
    vec![
        format!("postgres://postgres:{p}@{pg}/test"),
        format!("postgresql://postgres:{e}@{pg}/test"),
        format!("postgres://postgres@{pg}/test?password={p}"),
        format!("postgres://postgres@{pg}/test?sslmode=disable&password={e}"),
        format!("host={pg_host} port={pg_port} user=postgres password='{kv}' dbname=test"),
        format!("mysql://root:{p}@{my}/test"),
        format!("mariadb://root:{e}@{my}/test"),
        format!("mysql://root@{my}/test?password={e}"),
    ]
}

/// One invocation: arguments and environment.
struct Job {
    secret: usize,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// PostgreSQL on the real server with a well-formed URL: `run` must run.
    must_run: bool,
}

fn jobs(secrets: &[Secret]) -> Vec<Job> {
    let real_pg = host_port(
        &std::env::var("DBMUTEX_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
    );
    let real_my = host_port(
        &std::env::var("DBMUTEX_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
    );
    let closed = "127.0.0.1:1".to_owned();
    let mut out = Vec::new();
    let mut n = 0usize;
    for (real, pg, my) in [(false, &closed, &closed), (true, &real_pg, &real_my)] {
        for (i, s) in secrets.iter().enumerate() {
            for (form, url) in connection_strings(&s.text, pg, my).into_iter().enumerate() {
                let name = format!("secrets-{}-{n}", std::process::id());
                let subcommands: [Vec<&str>; 4] = [
                    vec!["-v", "run", "-w", "5", &name, "--", "true"],
                    vec!["-v", "status", "--json", &name],
                    vec!["-v", "list", "--json"],
                    vec!["-v", "key", "--json", &name],
                ];
                for (k, sub) in subcommands.iter().enumerate() {
                    n += 1;
                    // Four ways to hand over the URL, rotating.
                    let (mut args, env): (Vec<String>, Vec<(&'static str, String)>) = match (i + form + k) % 4
                    {
                        0 => (vec!["--database-url".into(), url.clone()], vec![]),
                        1 => (vec![format!("--database-url={url}")], vec![]),
                        2 => (vec![], vec![("DATABASE_URL", url.clone())]),
                        _ => (vec![], vec![("DBMUTEX_DATABASE_URL", url.clone())]),
                    };
                    args.extend(sub.iter().map(|a| a.to_string()));
                    let must_run = real && k == 0 && (form == 1 || form == 3);
                    out.push(Job {
                        secret: i,
                        args,
                        env,
                        must_run,
                    });
                }
            }
            // The URL handed to the wrong flag, or to a misspelt one: clap
            // quotes what it cannot use.
            let url = format!("postgres://postgres:{}@{pg}/test", s.text);
            for args in [
                vec![
                    "run".to_owned(),
                    "-w".into(),
                    url.clone(),
                    "x".into(),
                    "--".into(),
                    "true".into(),
                ],
                vec![
                    "run".to_owned(),
                    format!("--kill-after={url}"),
                    "x".into(),
                    "--".into(),
                    "true".into(),
                ],
                vec![format!("--databse-url={url}"), "key".into(), "x".into()],
                vec![
                    "run".to_owned(),
                    "-E".into(),
                    format!("host=h password='{}'", s.text),
                    "x".into(),
                ],
            ] {
                out.push(Job {
                    secret: i,
                    args,
                    env: vec![],
                    must_run: false,
                });
            }
        }
    }
    out
}

#[test]
fn hostile_passwords_never_reach_stdout_or_stderr() {
    let secrets = hostile_passwords(14);
    let jobs = jobs(&secrets);
    let next = AtomicUsize::new(0);
    let (ran, bytes) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let mut cmd = Command::new(BIN);
                cmd.args(&job.args)
                    .env_remove("DATABASE_URL")
                    .env_remove("DBMUTEX_DATABASE_URL")
                    .env_remove("WITH_ADVISORY_LOCK_PREFIX")
                    .stdin(Stdio::null());
                for (k, v) in &job.env {
                    cmd.env(k, v);
                }
                let out = cmd.output().expect("run dbmutex");
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                bytes.fetch_add(text.len(), Ordering::Relaxed);
                let code = out.status.code();
                let mut problems = Vec::new();
                let secret = &secrets[job.secret];
                for needle in &secret.needles {
                    if text.contains(needle.as_str()) {
                        problems.push(format!("leaked {needle:?}"));
                    }
                }
                if !matches!(code, Some(0 | 1 | 64 | 69)) {
                    problems.push(format!("undocumented exit status {code:?}"));
                }
                if job.must_run {
                    if code == Some(0) && text.contains("acquired lock") {
                        ran.fetch_add(1, Ordering::Relaxed);
                    } else {
                        problems.push(format!("expected the command to run (exit {code:?})"));
                    }
                }
                if !problems.is_empty() {
                    failures.lock().unwrap().push(format!(
                        "{problems:?}\n  password {:?}\n  args {:?} env {:?}\n  output:\n{text}",
                        secret.text, job.args, job.env
                    ));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    let ran = ran.into_inner();
    assert!(ran > 0, "some commands ran under a lock on the real server");
    eprintln!(
        "secrets: {} passwords, {} invocations, {} bytes of output checked, {ran} commands ran on the real server",
        secrets.len(),
        jobs.len(),
        bytes.into_inner()
    );
}
