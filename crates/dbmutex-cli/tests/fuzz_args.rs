//! Fuzzed command lines: hostile names, timeouts, exit codes, URLs and
//! flags, generated from a fixed seed, run through the real binary. Every
//! case must end in a documented exit status, never a panic, never a
//! password on the terminal, and `run` must write nothing to stdout itself.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::{Command, Stdio};

mod support;

use support::Rng;

const BIN: &str = env!("CARGO_BIN_EXE_dbmutex");

fn name(rng: &mut Rng, case: usize) -> OsString {
    let unique = format!("fz{}-{case}", std::process::id());
    match rng.below(9) {
        0 => OsString::new(),
        1 => OsString::from(format!("{unique}-it's \"quoted\"")),
        2 => OsString::from(format!("{unique} */ DROP TABLE x; /*")),
        3 => OsString::from(format!("{unique}-日本語-😀")),
        4 => OsString::from(format!("{unique}-{}", "x".repeat(100_000))),
        5 => {
            let mut b = unique.into_bytes();
            b.extend_from_slice(&[0xff, 0xfe, b'a', 0x80]);
            OsString::from_vec(b)
        }
        6 => OsString::from(format!("{unique}-{}", "long".repeat(75))),
        7 => OsString::from("-"),
        _ => {
            let mut b = unique.into_bytes();
            for _ in 0..rng.below(40) {
                b.push((rng.next() % 255 + 1) as u8);
            }
            OsString::from_vec(b)
        }
    }
}

const TIMEOUTS: &[&str] = &[
    "0",
    "0.2",
    "0.000001",
    "-1",
    "-0",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e30",
    "1e-400",
    "abc",
    "",
    "1,5",
    "99999999999",
    "0x10",
    " 1",
    "1 ",
];
const EXIT_CODES: &[&str] = &["0", "3", "75", "255", "256", "-1", "abc", ""];
const URLS: &[&str] = &[
    "postgres://",
    "postgres://u:hunter2@127.0.0.1:1/x",
    "mysql://u:hunter2@127.0.0.1:1/x",
    "mysql://h:notaport/db",
    "://",
    "ftp://x",
    "file://relative",
    "u:hunter2@host/db",
    "postgres://u:hunter2@[::1/x",
    "postgres://127.0.0.1:1/x?sslmode=bogus&password=hunter2",
];

/// Exit statuses `dbmutex --help` documents, plus what the commands run here
/// can return themselves: `true`/`false` (0, 1), and the shell's 2 for a
/// syntax error when a hostile name lands after `-c` as the shell command.
const DOCUMENTED: &[i32] = &[0, 1, 2, 64, 69, 70, 75, 126, 127];

#[test]
fn fuzzed_command_lines_end_in_documented_statuses() {
    let dir = std::env::temp_dir().join(format!("dbmutex-fuzz-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng(0x5eed_dbdb_0042_0001);
    let mut by_status = std::collections::BTreeMap::new();
    let cases = 400;
    for case in 0..cases {
        let mut args: Vec<OsString> = Vec::new();
        let mut url_given = false;
        if rng.below(6) == 0 {
            args.push("--database-url".into());
            args.push(rng.pick(URLS).into());
            url_given = true;
        }
        if rng.below(8) == 0 {
            args.push("--prefix".into());
            args.push(rng.pick(&["7", "-1", "abc", "", "99999999999999999999"]).into());
        }
        let sub = rng.pick(&["run", "run", "run", "status", "key", "list", "bogus"]);
        args.push(sub.into());
        if sub == "run" {
            for _ in 0..rng.below(4) {
                match rng.below(7) {
                    0 => args.push("-n".into()),
                    1 => {
                        args.push("-w".into());
                        args.push(rng.pick(TIMEOUTS).into());
                    }
                    2 => args.push(rng.pick(&["-s", "-x"]).into()),
                    3 => {
                        args.push("-E".into());
                        args.push(rng.pick(EXIT_CODES).into());
                    }
                    4 => args.push("--transaction".into()),
                    5 => {
                        args.push("--kill-after".into());
                        args.push(rng.pick(TIMEOUTS).into());
                    }
                    _ => args.push(rng.pick(&["-q", "-v", "--bogus", "-c"]).into()),
                }
            }
        }
        if sub != "list" {
            args.push(name(&mut rng, case));
        }
        if sub == "run" {
            match rng.below(4) {
                0 => {}
                1 => args.extend(["-c".into(), "true".into()]),
                _ => args.extend(["--".into(), rng.pick(&["true", "false"]).into()]),
            }
        }
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("DBMUTEX_DATABASE_URL")
            .env_remove("DATABASE_URL")
            .env_remove("WITH_ADVISORY_LOCK_PREFIX")
            .env("DBMUTEX_LOCK_DIR", &dir)
            .stdin(Stdio::null())
            .output()
            .expect("start dbmutex");
        let code = out
            .status
            .code()
            .unwrap_or_else(|| panic!("case {case}: killed by a signal: {args:?}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            DOCUMENTED.contains(&code),
            "case {case}: exit {code} for {args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("panicked"),
            "case {case}: panic for {args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("hunter2"),
            "case {case}: password shown for {args:?}: {stderr}"
        );
        if sub == "run" {
            assert!(
                out.stdout.is_empty(),
                "case {case}: dbmutex wrote to stdout: {args:?}"
            );
        }
        if code != 0 && code != 1 && !url_given {
            assert!(
                !stderr.is_empty(),
                "case {case}: exit {code} without a word: {args:?}"
            );
        }
        *by_status.entry(code).or_insert(0) += 1;
    }
    println!("fuzzed command lines: {cases} cases, by exit status: {by_status:?}");
    assert!(
        by_status.len() >= 4,
        "the cases should reach several outcomes: {by_status:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
