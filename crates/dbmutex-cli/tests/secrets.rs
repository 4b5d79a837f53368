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

use support::{connection_strings, host_port, hostile_passwords, Secret};

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");

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
