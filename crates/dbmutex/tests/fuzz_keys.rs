//! Bad input, fuzzed (issue #6): name → key mapping for every backend, prefix
//! parsing, name validation and option combinations, over seeded random
//! inputs (reproducible: the seed is fixed, `fastrand` is already a
//! dependency), plus a few hundred hostile names through a real server.
//!
//! Every pure property runs a fixed number of cases and asserts that the
//! generator reached each branch it is meant to cover (a generator that
//! degenerated to one kind of input would fail, not pass quietly); the
//! counts are printed (`cargo test --test fuzz_keys -- --nocapture`).

mod common;

use std::time::Duration;

use dbmutex::key::{
    gem_hash, local_file_name, mysql_lock_string, mysql_lock_string_for, pg_key, sql_comment, MysqlFlavour,
    PgKey, MAX_NAME_BYTES, MYSQL_MAX_BYTES, MYSQL_MAX_CHARS,
};
use dbmutex::{Error, LockName, LockOptions, Mode, Prefix, WaitStrategy};

const CASES: usize = 100_000;
const SEED: u64 = 0x0064_626d_7574_6578; // "dbmutex"

/// Characters that stress the mappings: ASCII punctuation, quotes, comment
/// markers, NUL and control characters, multi-byte UTF-8, path characters.
const PIECES: &[&str] = &[
    "a",
    "Z",
    "0",
    "9",
    " ",
    "'",
    "\"",
    "`",
    "\\",
    "/",
    "*/",
    "/*",
    "--",
    ";",
    ".",
    "..",
    "\0",
    "\n",
    "\t",
    "\r",
    "%",
    "_",
    "#",
    ":",
    "é",
    "ß",
    "€",
    "😀",
    "\u{202e}",
    "\u{feff}",
    "\u{7f}",
    "ﬀ",
    "İ",
    "\u{10ffff}",
];

/// A random string: pieces, random chars, or lossy UTF-8 of random bytes.
fn random_string(rng: &mut fastrand::Rng, max_len: usize) -> String {
    let len = rng.usize(0..=max_len);
    match rng.u8(0..3) {
        0 => (0..len).map(|_| PIECES[rng.usize(0..PIECES.len())]).collect(),
        1 => (0..len).map(|_| rng.char(..)).collect(),
        _ => {
            let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }
}

fn random_name(rng: &mut fastrand::Rng) -> LockName {
    match rng.u8(0..8) {
        0 => LockName::Int(rng.i64(..)),
        1 => LockName::raw_i64(rng.i64(..)),
        2 => LockName::raw_pair(rng.i32(..), rng.i32(..)),
        3 => LockName::Str(random_string(rng, 300)),
        _ => LockName::Str(random_string(rng, 40)),
    }
}

fn random_prefix(rng: &mut fastrand::Rng) -> Prefix {
    match rng.u8(0..4) {
        0 => Prefix::none(),
        1 => Prefix::from(rng.i64(..)),
        2 => Prefix::new(
            (0..rng.usize(1..40))
                .map(|_| char::from(rng.u8(b'0'..=b'9')))
                .collect::<String>(),
        ),
        _ => Prefix::new(random_string(rng, 20)),
    }
}

/// Ruby's `to_i & 0x7fffffff`, computed independently (digits only, with
/// Ruby's single underscores, sign, leading whitespace).
fn reference_k2(text: &str) -> i32 {
    let t = text.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, rest) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let mut digits = String::new();
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            digits.push(b[i] as char);
        } else if b[i] == b'_'
            && i > 0
            && b[i - 1].is_ascii_digit()
            && b.get(i + 1).is_some_and(u8::is_ascii_digit)
        {
        } else {
            break;
        }
        i += 1;
    }
    let m: u128 = 1 << 31;
    let v = digits
        .bytes()
        .fold(0u128, |acc, d| (acc * 10 + u128::from(d - b'0')) % m);
    (if neg { (m - v) % m } else { v }) as i32
}

#[test]
fn name_to_key_mappings_are_total_stable_and_bounded() {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let (mut mysql_mapped, mut raw_refused, mut passed_unchanged) = (0, 0, 0);
    for _ in 0..CASES {
        let name = random_name(&mut rng);
        let prefix = random_prefix(&mut rng);

        // PostgreSQL: total, stable, and the gem's formula.
        let k = pg_key(&name, &prefix);
        assert_eq!(k, pg_key(&name.clone(), &prefix.clone()), "stable");
        match &name {
            LockName::Str(s) => assert_eq!(k, PgKey::Pair(gem_hash(s.as_bytes()), prefix.pg_k2())),
            LockName::Int(n) => assert_eq!(k, PgKey::Pair((*n & 0x7fff_ffff) as i32, prefix.pg_k2())),
            LockName::RawI64(v) => assert_eq!(k, PgKey::Big(*v)),
            LockName::RawPair(a, b) => assert_eq!(k, PgKey::Pair(*a, *b)),
            other => panic!("a name form this test does not generate: {other:?}"),
        }
        if let PgKey::Pair(k1, _) = k {
            if !matches!(name, LockName::RawPair(..)) {
                assert!(k1 >= 0, "k1 is masked to 31 bits");
            }
        }
        assert!(prefix.pg_k2() >= 0);

        // MySQL and local: string and integer names map; raw keys are refused with a typed error.
        let my = mysql_lock_string(&name, &prefix);
        let local = local_file_name(&name, &prefix);
        match &name {
            LockName::RawI64(_) | LockName::RawPair(..) => {
                assert!(matches!(my, Err(Error::Unsupported(_))), "{my:?}");
                assert!(matches!(local, Err(Error::Unsupported(_))), "{local:?}");
                raw_refused += 1;
            }
            _ => {
                let full = format!("{}{}", prefix.text(), name);
                let my = my.expect("string and integer names map");
                assert!(my.chars().count() <= MYSQL_MAX_CHARS, "{my:?}");
                assert!(my.len() <= MYSQL_MAX_BYTES, "{my:?}");
                assert_eq!(my, mysql_lock_string(&name, &prefix).unwrap(), "stable");
                if full.chars().count() <= MYSQL_MAX_CHARS && full.len() <= MYSQL_MAX_BYTES {
                    assert_eq!(my, full, "short names pass unchanged");
                    passed_unchanged += 1;
                } else {
                    mysql_mapped += 1;
                    assert_eq!(my.chars().count(), MYSQL_MAX_CHARS.min(my.chars().count()));
                    let (head, hash) = my.rsplit_once('#').expect("head#hash");
                    assert!(full.starts_with(head), "{my:?}");
                    assert_eq!(hash.len(), 16);
                    assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
                }
                let local = local.expect("string and integer names map");
                assert!(!local.contains('/') && !local.contains('\0'), "{local:?}");
                assert!(!local.starts_with('.'), "{local:?}");
                assert!(
                    local.ends_with(".lock") && local.len() <= 32 + 1 + 32 + 5,
                    "{local:?}"
                );
                assert_eq!(local, local_file_name(&name, &prefix).unwrap(), "stable");
            }
        }
    }
    println!(
        "key mappings: {CASES} cases ({passed_unchanged} MySQL names unchanged, {mysql_mapped} long ones hashed, \
         {raw_refused} raw keys refused)"
    );
    assert!(
        mysql_mapped > 1000 && raw_refused > 1000 && passed_unchanged > 1000,
        "the generator covers every branch"
    );
}

#[test]
fn prefix_parsing_matches_ruby_to_i() {
    let mut rng = fastrand::Rng::with_seed(SEED ^ 1);
    let (mut zero, mut nonzero) = (0, 0);
    for _ in 0..CASES {
        let text = match rng.u8(0..3) {
            0 => random_string(&mut rng, 30),
            1 => {
                let sign = ["", "-", "+", " ", " -", "\t+"][rng.usize(0..6)];
                let digits: String = (0..rng.usize(0..45))
                    .map(|_| {
                        if rng.u8(0..8) == 0 {
                            '_'
                        } else {
                            char::from(rng.u8(b'0'..=b'9'))
                        }
                    })
                    .collect();
                format!("{sign}{digits}{}", ["", "x", " 1", "_"][rng.usize(0..4)])
            }
            _ => rng.i64(..).to_string(),
        };
        let p = Prefix::new(text.clone());
        assert_eq!(p.pg_k2(), reference_k2(&text), "prefix {text:?}");
        assert_eq!(p.pg_k2(), Prefix::new(text.clone()).pg_k2(), "stable");
        assert_eq!(p.text(), text);
        if p.pg_k2() == 0 {
            zero += 1;
        } else {
            nonzero += 1;
        }
    }
    println!("prefix parsing: {CASES} cases ({nonzero} numeric prefixes, {zero} that give 0)");
    assert!(
        zero > 1000 && nonzero > 1000,
        "the generator covers numeric and non-numeric prefixes"
    );
}

#[test]
fn name_validation_and_comment_escaping() {
    let mut rng = fastrand::Rng::with_seed(SEED ^ 2);
    let (mut accepted, mut refused) = (0, 0);
    let mut inputs: Vec<String> = vec![
        String::new(),
        "\0".into(),
        "a\0b".into(),
        "x".repeat(MAX_NAME_BYTES),
        "x".repeat(MAX_NAME_BYTES + 1),
        "y".repeat(1 << 20),
        "é".repeat(MAX_NAME_BYTES / 2 + 1),
        "*/ DROP TABLE t; /*".into(),
        "'; --".into(),
        "/*/**/*/".into(),
        "*/*/".into(),
    ];
    while inputs.len() < CASES {
        inputs.push(random_string(&mut rng, 80));
    }
    for s in &inputs {
        let name = LockName::from(s.as_str());
        let expect_ok = !s.is_empty() && s.len() <= MAX_NAME_BYTES && !s.contains('\0');
        match name.validate() {
            Ok(()) => {
                assert!(expect_ok, "{s:?} accepted");
                accepted += 1;
            }
            Err(Error::InvalidName(msg)) => {
                assert!(!expect_ok, "{s:?} refused: {msg}");
                assert!(msg.len() < 200, "the message does not echo the name");
                refused += 1;
            }
            Err(e) => panic!("{s:?}: not InvalidName: {e:?}"),
        }
        let c = sql_comment(&name);
        assert!(!c.contains("*/") && !c.contains("/*"), "{c:?}");
        assert!(!c.chars().any(char::is_control), "{c:?}");
    }
    println!(
        "name validation: {} cases ({accepted} accepted, {refused} refused)",
        inputs.len()
    );
    assert!(
        accepted > 1000 && refused > 1000,
        "the generator covers valid and invalid names"
    );
}

fn random_duration(rng: &mut fastrand::Rng) -> Duration {
    match rng.u8(0..6) {
        0 => Duration::ZERO,
        1 => Duration::from_nanos(rng.u64(1..1000)),
        2 => Duration::from_millis(rng.u64(0..10_000)),
        3 => Duration::from_secs(rng.u64(0..u64::from(u32::MAX))),
        4 => Duration::from_secs(u64::MAX),
        _ => Duration::new(rng.u64(..), rng.u32(0..1_000_000_000)),
    }
}

#[test]
fn option_combinations() {
    let mut rng = fastrand::Rng::with_seed(SEED ^ 3);
    let mut combos = std::collections::HashSet::new();
    for _ in 0..CASES {
        let timeout = if rng.bool() {
            Some(random_duration(&mut rng))
        } else {
            None
        };
        let backoff = random_duration(&mut rng);
        let (shared, xact) = (rng.bool(), rng.bool());
        let strategy = if rng.bool() {
            WaitStrategy::Poll
        } else {
            WaitStrategy::Server
        };
        let o = LockOptions::new()
            .timeout_opt(timeout)
            .shared(shared)
            .transaction(xact)
            .wait_strategy(strategy)
            .max_backoff(backoff);
        assert_eq!(o.get_timeout(), timeout);
        assert_eq!(o.get_mode(), if shared { Mode::Shared } else { Mode::Exclusive });
        assert_eq!(o.is_transaction(), xact);
        assert_eq!(o.get_wait_strategy(), strategy);
        assert_eq!(o.clone(), o);
        // Builder calls commute with each other's fields.
        let again = LockOptions::new()
            .max_backoff(backoff)
            .wait_strategy(strategy)
            .transaction(xact)
            .shared(shared)
            .timeout_opt(timeout);
        assert_eq!(again, o);
        assert!(!format!("{o:?}").is_empty());
        combos.insert((timeout.is_some(), shared, xact, strategy == WaitStrategy::Poll));
    }
    println!(
        "option combinations: {CASES} cases, {} of 16 flag combinations",
        combos.len()
    );
    assert_eq!(combos.len(), 16, "the generator covers every flag combination");
}

/// A few hundred hostile names and option mixes through the real server:
/// each ends in a lock or a typed error, and no lock is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_through_the_server() {
    let locker = common::Backend::Postgres.locker().await;
    let other = common::Backend::Postgres.locker().await;
    let mut rng = fastrand::Rng::with_seed(SEED ^ 4);
    let tag = common::unique("fuzz");
    let (mut acquired, mut refused) = (0, 0);
    const N: usize = 300;
    for i in 0..N {
        let body = match i % 6 {
            0 => random_string(&mut rng, 60),
            1 => format!("*/ SELECT pg_sleep(10); /* {}", random_string(&mut rng, 10)),
            2 => format!("'; DROP TABLE x; -- {}", random_string(&mut rng, 10)),
            3 => "z".repeat(rng.usize(1..200_000)),
            4 => {
                let bytes: Vec<u8> = (0..rng.usize(0..100)).map(|_| rng.u8(..)).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            _ => String::new(),
        };
        // Unique per case, so a leak cannot hide behind a collision with
        // another case; empty and NUL-only bodies stay as they are.
        let name = if i % 12 == 5 {
            body
        } else {
            format!("{tag}-{i}-{body}")
        };
        let timeout = [
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_secs(3600 * 24),
        ][i % 3];
        let opts = LockOptions::new()
            .timeout(timeout)
            .transaction(i % 4 == 0)
            .wait_strategy(if i % 5 == 0 {
                WaitStrategy::Server
            } else {
                WaitStrategy::Poll
            });
        match locker.acquire(name.as_str(), &opts).await {
            Ok(Some(g)) => {
                assert!(!common::free_for(&other, &name).await, "case {i}: held");
                g.release()
                    .await
                    .unwrap_or_else(|e| panic!("case {i}: release: {e}"));
                assert!(
                    common::free_for(&other, &name).await,
                    "case {i}: free after release"
                );
                acquired += 1;
            }
            Ok(None) => panic!("case {i}: a fresh name was not acquired"),
            Err(Error::InvalidName(_)) => {
                assert!(LockName::from(name.as_str()).validate().is_err(), "case {i}");
                refused += 1;
            }
            Err(e) => panic!("case {i}: untyped outcome {e:?}"),
        }
    }
    println!(
        "hostile names through the server: {N} cases, {acquired} acquired and released, {refused} refused"
    );
    assert_eq!(acquired + refused, N);
    assert!(refused > 0 && acquired > N / 2);
    assert_eq!(locker.held_count(), 0);
}

/// Slot lock strings: never a NUL (the servers cut a lock string there), at
/// most 64 characters, none equal to its name's or another slot's.
#[test]
fn mysql_slot_strings_carry_no_nul_and_differ() {
    let p = Prefix::none();
    let mut seen = Vec::new();
    for name in ["r".to_owned(), "n".repeat(200)] {
        for i in 0..3 {
            for f in [MysqlFlavour::Mysql, MysqlFlavour::MariaDb] {
                let s = mysql_lock_string_for(&LockName::Slot(name.clone(), i), &p, f).unwrap();
                assert!(!s.contains('\0') && s.chars().count() <= 64, "{s:?}");
                assert_ne!(s, mysql_lock_string_for(&name.as_str().into(), &p, f).unwrap());
                seen.push((name.len(), i, s));
            }
        }
    }
    for a in &seen {
        assert!(
            seen.iter()
                .filter(|b| b.2 == a.2)
                .all(|b| (b.0, b.1) == (a.0, a.1)),
            "{a:?}"
        );
    }
}
