//! Lock names and the database keys they map to.
//!
//! The mapping is part of dbmutex's public contract: it is documented here,
//! tested with fixed vectors, and never changed silently. It follows the Ruby
//! gem `with_advisory_lock`, so a Rust worker and a Rails worker that lock the
//! same name exclude each other.
//!
//! # PostgreSQL
//!
//! | name | key | lock call |
//! |---|---|---|
//! | string `s` | `k1 = crc32(utf8(s)) & 0x7fffffff`, `k2 = prefix & 0x7fffffff` | `pg_*_advisory_lock(k1, k2)` (two `int4`) |
//! | integer `n` | `k1 = n & 0x7fffffff`, `k2 = prefix & 0x7fffffff` | `pg_*_advisory_lock(k1, k2)` |
//! | [`LockName::raw_i64`] | the `bigint` as given | `pg_*_advisory_lock(k)` (one `int8`) |
//! | [`LockName::raw_pair`] | the two `int4` as given | `pg_*_advisory_lock(a, b)` |
//!
//! `crc32` is zlib's (IEEE 802.3) CRC-32, as Ruby's `Zlib.crc32`. The prefix
//! comes from the API, else from the environment variable
//! `WITH_ADVISORY_LOCK_PREFIX`, read as Ruby's `String#to_i` reads it (leading
//! decimal digits; anything non-numeric is `0`).
//!
//! **Collisions.** `k1` has 31 bits, so two different names share a lock with
//! probability 2⁻³¹ per pair: with 1,000 names in use the chance that *some*
//! pair collides is about 0.02 %, with 10,000 names about 2.3 %. A collision
//! never breaks safety (two names that collide just exclude each other more
//! than needed), but it can make unrelated work wait. Use raw keys when you
//! manage a key space yourself. `bigint` keys and `int4` pairs are separate
//! lock spaces in PostgreSQL: `raw_i64(1)` and `raw_pair(0, 1)` never conflict.
//!
//! # MySQL and MariaDB
//!
//! The lock string is `prefix + name` (the prefix as written in the
//! environment variable, as the gem does) — exactly what the gem sends to
//! `GET_LOCK` — wherever the server accepts it:
//!
//! | server ([`MysqlFlavour`], read from `VERSION()` at connect) | passed unchanged when `prefix + name` has |
//! |---|---|
//! | MariaDB (limit measured on 10.11: 192 bytes; 193 fails with error 1059) | at most 192 bytes |
//! | MySQL (limit from MySQL 8's documentation, not measured: 64 characters, error 3057) | at most 64 characters and at most 192 bytes |
//!
//! Only a string the server would reject — where the gem itself fails — is
//! mapped, deterministically and the same way on both servers, to exactly
//! 64 characters: its first 47 characters (fewer if those pass 175 bytes),
//! `#`, and the first 16 hex digits of the SHA-256 of the whole string (see
//! [`mysql_lock_string_for`]). So on MariaDB a Rails worker and a Rust worker
//! share every name the gem can lock at all. The extra 192-byte cap on MySQL
//! (reached only by names with 4-byte characters) is a precaution, unmeasured;
//! it keeps the MySQL mapping what it was before dbmutex told the servers
//! apart. Integer names use their decimal form.
//!
//! Fixed vectors (unit tests `mysql_vectors`):
//!
//! | `prefix + name` | MariaDB | MySQL |
//! |---|---|---|
//! | `"a" × 64` | unchanged | unchanged |
//! | `"a" × 65` | unchanged | `"a" × 47 + "#635361c48bb9eab1"` |
//! | `"a" × 192` | unchanged | `"a" × 47 + "#7cee24628d290c16"` |
//! | `"a" × 193` | `"a" × 47 + "#33f93a9879ef18f9"` | the same |
//! | `"é" × 96` (96 characters, 192 bytes) | unchanged | `"é" × 47 + "#25187876b1179826"` |
//! | `"é" × 97` (194 bytes) | `"é" × 47 + "#6150e9b6b371f2b0"` | the same |
//! | `"😀" × 48` (48 characters, 192 bytes) | unchanged | unchanged |
//! | `"😀" × 49` (196 bytes) | `"😀" × 43 + "#2f4c9a2f211fb1e1"` (189 bytes) | the same |
//!
//! A mapped string cannot be turned back into its name;
//! [`Locker::list`](crate::Locker::list) shows the name for locks its own locker holds and
//! `None` for other holders' mapped strings (whose key still starts with the
//! name's first characters). Names are compared case-sensitively by MariaDB
//! and case-insensitively by MySQL 8: on MySQL 8, `Report` and `report` are
//! one lock.
//!
//! # Local backend
//!
//! One lock file per name: `<dir>/<head>-<hash>.lock`, where `head` is up to
//! 32 characters of the name made file-safe and `hash` the first 32 hex digits
//! of the SHA-256 of `prefix + name`.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::Error;

/// The environment variable the gem reads its key prefix from.
pub const PREFIX_ENV: &str = "WITH_ADVISORY_LOCK_PREFIX";

/// The longest lock name accepted, in bytes (names are mapped to keys, so the
/// limit is about memory and log sizes, not about the database).
pub const MAX_NAME_BYTES: usize = 64 * 1024;

/// Longest lock string MySQL accepts, in characters (MySQL 8's limit); also
/// the length of every mapped (hashed) lock string.
pub const MYSQL_MAX_CHARS: usize = 64;
/// Longest lock string MariaDB accepts, in bytes; no lock string dbmutex
/// sends to either server is longer.
pub const MYSQL_MAX_BYTES: usize = 192;

/// Which MySQL-protocol server a lock string is for: their limits on lock
/// names differ (see the [module docs](self#mysql-and-mariadb)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MysqlFlavour {
    /// MariaDB: names up to 192 bytes.
    MariaDb,
    /// MySQL (and anything that is not MariaDB): names up to 64 characters.
    Mysql,
}

impl MysqlFlavour {
    /// The flavour a server's `VERSION()` string names: MariaDB's contains
    /// `MariaDB` (e.g. `10.11.19-MariaDB-0+deb12u1`, or with the `5.5.5-`
    /// prefix its handshake sends); anything else is taken for MySQL, whose
    /// limit is the stricter one.
    pub fn from_version(version: &str) -> Self {
        if version.to_ascii_lowercase().contains("mariadb") {
            MysqlFlavour::MariaDb
        } else {
            MysqlFlavour::Mysql
        }
    }

    /// Whether this server takes `lock` as a `GET_LOCK` name unchanged.
    pub fn accepts(self, lock: &str) -> bool {
        match self {
            MysqlFlavour::MariaDb => lock.len() <= MYSQL_MAX_BYTES,
            MysqlFlavour::Mysql => lock.len() <= MYSQL_MAX_BYTES && lock.chars().count() <= MYSQL_MAX_CHARS,
        }
    }
}

/// The name of a lock: a string, an integer, or a raw database key.
///
/// Build one with `From` (`"report".into()`, `42.into()`) or with
/// [`LockName::raw_i64`] / [`LockName::raw_pair`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LockName {
    /// A string name, hashed as the gem hashes it.
    Str(String),
    /// An integer name: the masked integer is the key, as in the gem.
    Int(i64),
    /// A raw PostgreSQL `bigint` key (`pg_advisory_lock(bigint)`).
    RawI64(i64),
    /// A raw PostgreSQL `(int4, int4)` key (`pg_advisory_lock(int, int)`).
    RawPair(i32, i32),
}

impl LockName {
    /// A raw PostgreSQL `bigint` key, for matching libraries that use the
    /// one-argument lock functions.
    pub fn raw_i64(key: i64) -> Self {
        LockName::RawI64(key)
    }

    /// A raw PostgreSQL `(int4, int4)` key, used exactly as given.
    pub fn raw_pair(k1: i32, k2: i32) -> Self {
        LockName::RawPair(k1, k2)
    }

    /// Checks that the name can name a lock: not empty, no NUL byte, at most
    /// [`MAX_NAME_BYTES`] bytes.
    pub fn validate(&self) -> Result<(), Error> {
        if let LockName::Str(s) = self {
            if s.is_empty() {
                return Err(Error::InvalidName("the lock name is empty".into()));
            }
            if s.len() > MAX_NAME_BYTES {
                return Err(Error::InvalidName(format!(
                    "the lock name has {} bytes; at most {MAX_NAME_BYTES} are allowed",
                    s.len()
                )));
            }
            if s.contains('\0') {
                return Err(Error::InvalidName("the lock name contains a NUL byte".into()));
            }
        }
        Ok(())
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockName::Str(s) => f.write_str(s),
            LockName::Int(n) => write!(f, "{n}"),
            LockName::RawI64(k) => write!(f, "raw:{k}"),
            LockName::RawPair(a, b) => write!(f, "raw:{a}:{b}"),
        }
    }
}

impl From<&str> for LockName {
    fn from(s: &str) -> Self {
        LockName::Str(s.to_owned())
    }
}
impl From<String> for LockName {
    fn from(s: String) -> Self {
        LockName::Str(s)
    }
}
impl From<&String> for LockName {
    fn from(s: &String) -> Self {
        LockName::Str(s.clone())
    }
}
impl From<i64> for LockName {
    fn from(n: i64) -> Self {
        LockName::Int(n)
    }
}
impl From<i32> for LockName {
    fn from(n: i32) -> Self {
        LockName::Int(n.into())
    }
}
impl From<u32> for LockName {
    fn from(n: u32) -> Self {
        LockName::Int(n.into())
    }
}
impl From<&LockName> for LockName {
    fn from(n: &LockName) -> Self {
        n.clone()
    }
}

/// The key prefix shared by every lock of a locker.
///
/// PostgreSQL uses its integer value (as Ruby's `to_i`, masked to 31 bits);
/// MySQL prepends its text, as the gem does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Prefix {
    text: String,
}

impl Prefix {
    /// A prefix given as text (for example the environment variable's value).
    pub fn new(text: impl Into<String>) -> Self {
        Prefix { text: text.into() }
    }

    /// No prefix: `k2 = 0` on PostgreSQL, nothing prepended on MySQL.
    pub fn none() -> Self {
        Prefix::default()
    }

    /// The prefix from `WITH_ADVISORY_LOCK_PREFIX`, or none when unset.
    pub fn from_env() -> Self {
        Prefix::new(std::env::var(PREFIX_ENV).unwrap_or_default())
    }

    /// The text prepended to MySQL lock strings and local lock names.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The PostgreSQL `k2`: `ruby_to_i(text) & 0x7fffffff`.
    pub fn pg_k2(&self) -> i32 {
        ruby_to_i_mod31(&self.text)
    }
}

impl From<i64> for Prefix {
    fn from(n: i64) -> Self {
        Prefix::new(n.to_string())
    }
}

/// Ruby's `String#to_i`, reduced modulo 2³¹ as `& 0x7fffffff` does on Ruby's
/// arbitrary-precision integers (two's complement for negatives).
fn ruby_to_i_mod31(s: &str) -> i32 {
    const M: i64 = 1 << 31;
    let t = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut acc: i64 = 0;
    let mut prev_digit = false;
    let bytes = digits.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'0'..=b'9' => {
                acc = (acc * 10 + i64::from(b - b'0')) % M;
                prev_digit = true;
            }
            // Ruby accepts single underscores between digits ("1_000").
            b'_' if prev_digit && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                prev_digit = false;
            }
            _ => break,
        }
    }
    let v = if neg { (M - acc) % M } else { acc };
    v as i32
}

/// A PostgreSQL advisory-lock key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PgKey {
    /// The two-`int4` form: `pg_locks.classid = k1`, `objid = k2`, `objsubid = 2`.
    Pair(i32, i32),
    /// The `bigint` form: `classid` = high 32 bits, `objid` = low 32 bits, `objsubid = 1`.
    Big(i64),
}

impl PgKey {
    /// The SQL argument list for this key (integers only, safe to inline).
    pub fn sql_args(&self) -> String {
        match self {
            PgKey::Pair(a, b) => format!("{a},{b}"),
            PgKey::Big(k) => format!("{k}"),
        }
    }

    /// `(classid, objid, objsubid)` as `pg_locks` shows this key.
    pub fn pg_locks_ids(&self) -> (u32, u32, i16) {
        match *self {
            PgKey::Pair(a, b) => (a as u32, b as u32, 2),
            PgKey::Big(k) => ((k as u64 >> 32) as u32, k as u32, 1),
        }
    }
}

impl fmt::Display for PgKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgKey::Pair(a, b) => write!(f, "{a} {b}"),
            PgKey::Big(k) => write!(f, "{k}"),
        }
    }
}

/// `crc32(bytes) & 0x7fffffff`, the gem's `stable_hashcode` for strings.
pub fn gem_hash(bytes: &[u8]) -> i32 {
    (crc32fast::hash(bytes) & 0x7fff_ffff) as i32
}

/// The PostgreSQL key for `name` under `prefix`.
pub fn pg_key(name: &LockName, prefix: &Prefix) -> PgKey {
    match name {
        LockName::Str(s) => PgKey::Pair(gem_hash(s.as_bytes()), prefix.pg_k2()),
        LockName::Int(n) => PgKey::Pair((*n & 0x7fff_ffff) as i32, prefix.pg_k2()),
        LockName::RawI64(k) => PgKey::Big(*k),
        LockName::RawPair(a, b) => PgKey::Pair(*a, *b),
    }
}

fn sha256_hex(data: &[u8], digits: usize) -> String {
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(digits);
    for b in digest.iter() {
        if out.len() >= digits {
            break;
        }
        out.push_str(&format!("{b:02x}"));
    }
    out.truncate(digits);
    out
}

/// The text form of a name for string-keyed backends (MySQL, local).
fn text_of(name: &LockName) -> Result<String, Error> {
    match name {
        LockName::Str(s) => Ok(s.clone()),
        LockName::Int(n) => Ok(n.to_string()),
        LockName::RawI64(_) | LockName::RawPair(..) => Err(Error::Unsupported(
            "raw PostgreSQL keys name locks on PostgreSQL only; use a string or integer name".into(),
        )),
    }
}

/// The `GET_LOCK` string for `name` under `prefix` on a MySQL server: the
/// same as [`mysql_lock_string_for`] with [`MysqlFlavour::Mysql`], the
/// stricter limit, so it is also a string every server accepts.
///
/// On MariaDB, names of 65 to 192 bytes map differently (they are passed
/// unchanged there, as the gem sends them); use [`mysql_lock_string_for`], or
/// [`Locker::key_of`](crate::Locker::key_of) which knows the server.
///
/// ```
/// use dbmutex::key::{mysql_lock_string, LockName, Prefix};
/// assert_eq!(mysql_lock_string(&"report".into(), &Prefix::new("app:")).unwrap(), "app:report");
/// let long = "x".repeat(100);
/// let mapped = mysql_lock_string(&long.as_str().into(), &Prefix::none()).unwrap();
/// assert_eq!(mapped.chars().count(), 64);
/// assert!(mapped.starts_with(&"x".repeat(47)));
/// ```
pub fn mysql_lock_string(name: &LockName, prefix: &Prefix) -> Result<String, Error> {
    mysql_lock_string_for(name, prefix, MysqlFlavour::Mysql)
}

/// The `GET_LOCK` string for `name` under `prefix` on a server of `flavour`.
///
/// `prefix + name` when the server accepts it ([`MysqlFlavour::accepts`]);
/// else the first 47 characters (fewer when they would exceed 175 bytes),
/// `#`, and 16 hex digits of SHA-256(prefix + name) — the same on every
/// flavour, 64 characters and at most 192 bytes.
///
/// ```
/// use dbmutex::key::{mysql_lock_string_for, MysqlFlavour, Prefix};
/// let name = "n".repeat(100);
/// // MariaDB takes 100 bytes as they are, as the gem sends them...
/// let maria = mysql_lock_string_for(&name.as_str().into(), &Prefix::none(), MysqlFlavour::MariaDb).unwrap();
/// assert_eq!(maria, name);
/// // ...MySQL 8 would reject them, so they are mapped.
/// let mysql = mysql_lock_string_for(&name.as_str().into(), &Prefix::none(), MysqlFlavour::Mysql).unwrap();
/// assert_eq!(mysql.chars().count(), 64);
/// ```
pub fn mysql_lock_string_for(
    name: &LockName,
    prefix: &Prefix,
    flavour: MysqlFlavour,
) -> Result<String, Error> {
    let full = format!("{}{}", prefix.text(), text_of(name)?);
    if flavour.accepts(&full) {
        return Ok(full);
    }
    Ok(mysql_mapped(&full))
}

/// The mapped form of a lock string no server would take.
fn mysql_mapped(full: &str) -> String {
    // 47 characters, fewer if they would pass 175 bytes: with '#' and 16
    // hex digits the result fits both 64 characters and 192 bytes.
    let mut head = String::new();
    for c in full.chars().take(47) {
        if head.len() + c.len_utf8() > MYSQL_MAX_BYTES - 17 {
            break;
        }
        head.push(c);
    }
    format!("{head}#{}", sha256_hex(full.as_bytes(), 16))
}

/// Whether `lock` has the shape of a mapped lock string: a head of 47
/// characters, or a shorter one that stopped at the 175-byte cap (then at
/// least 172 bytes), then `#` and 16 lowercase hex digits. A name of that
/// very shape passed unchanged looks the same; nothing else does.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn mysql_looks_mapped(lock: &str) -> bool {
    let Some((head, hash)) = lock.rsplit_once('#') else {
        return false;
    };
    let hex = hash.len() == 16 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let n = head.chars().count();
    hex && (n == 47
        || (n < 47 && head.len() >= MYSQL_MAX_BYTES - 17 - 3 && head.len() <= MYSQL_MAX_BYTES - 17))
}

/// The lock-file name (no directory) for `name` under `prefix` on the local backend.
pub fn local_file_name(name: &LockName, prefix: &Prefix) -> Result<String, Error> {
    let full = format!("{}{}", prefix.text(), text_of(name)?);
    let head: String = full
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(32)
        .collect();
    let head = head.trim_start_matches('.');
    Ok(format!(
        "{}{}{}.lock",
        head,
        if head.is_empty() { "" } else { "-" },
        sha256_hex(full.as_bytes(), 32)
    ))
}

/// The lock name as an SQL comment body: `/*` and `*/` become `--` (as the
/// gem does) and control characters become spaces, so the comment can never
/// end early or nest.
pub fn sql_comment(name: &LockName) -> String {
    let s = name.to_string();
    s.replace("/*", "--")
        .replace("*/", "--")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gem_vectors() {
        let none = Prefix::none();
        assert_eq!(pg_key(&"test".into(), &none), PgKey::Pair(1484750348, 0));
        // Zlib.crc32("hello") = 907060870 (< 2^31, unchanged by the mask).
        assert_eq!(pg_key(&"hello".into(), &none), PgKey::Pair(907060870, 0));
        // Zlib.crc32("") would be 0, but empty names are rejected before this.
        // Zlib.crc32("The quick brown fox jumps over the lazy dog") = 0x414FA339.
        assert_eq!(
            pg_key(&"The quick brown fox jumps over the lazy dog".into(), &none),
            PgKey::Pair(0x414F_A339, 0)
        );
        // CRC with the top bit set is masked: crc32("a") = 0xE8B7BE43.
        assert_eq!(pg_key(&"a".into(), &none), PgKey::Pair(0x68B7_BE43, 0));
        // UTF-8 bytes are hashed: crc32("é") over C3 A9.
        assert_eq!(
            pg_key(&"é".into(), &none),
            PgKey::Pair((crc32fast::hash(&[0xC3, 0xA9]) & 0x7fff_ffff) as i32, 0)
        );
    }

    #[test]
    fn integer_and_raw_names() {
        let p = Prefix::new("7");
        assert_eq!(pg_key(&42i64.into(), &p), PgKey::Pair(42, 7));
        assert_eq!(pg_key(&(-1i64).into(), &p), PgKey::Pair(0x7fff_ffff, 7));
        assert_eq!(
            pg_key(&(1i64 << 40 | 5).into(), &p),
            PgKey::Pair(5, 7),
            "high bits are masked away"
        );
        assert_eq!(pg_key(&LockName::raw_i64(-9), &p), PgKey::Big(-9));
        assert_eq!(pg_key(&LockName::raw_pair(-3, -4), &p), PgKey::Pair(-3, -4));
        assert_eq!(PgKey::Big(-1).pg_locks_ids(), (u32::MAX, u32::MAX, 1));
        assert_eq!(PgKey::Big(1 << 32 | 2).pg_locks_ids(), (1, 2, 1));
    }

    #[test]
    fn prefix_reads_like_ruby_to_i() {
        for (text, want) in [
            ("", 0),
            ("abc", 0),
            ("42", 42),
            ("  42abc", 42),
            ("+5", 5),
            ("-1", 0x7fff_ffff),
            ("1_000", 1000),
            ("1__0", 1),
            ("_1", 0),
            ("2147483648", 0),
            ("2147483649", 1),
            (
                "99999999999999999999",
                (99_999_999_999_999_999_999u128 % (1 << 31)) as i32,
            ),
        ] {
            assert_eq!(Prefix::new(text).pg_k2(), want, "prefix {text:?}");
        }
    }

    #[test]
    fn mysql_strings() {
        let p = Prefix::new("app:");
        assert_eq!(mysql_lock_string(&"a".into(), &p).unwrap(), "app:a");
        assert_eq!(mysql_lock_string(&5i64.into(), &p).unwrap(), "app:5");
        let exactly64 = "y".repeat(60);
        assert_eq!(
            mysql_lock_string(&exactly64.as_str().into(), &p).unwrap(),
            format!("app:{exactly64}")
        );
        let long = "z".repeat(61);
        let got = mysql_lock_string(&long.as_str().into(), &p).unwrap();
        assert_eq!(got.chars().count(), 64);
        assert_eq!(
            got,
            format!(
                "app:{}#{}",
                "z".repeat(43),
                sha256_hex(format!("app:{long}").as_bytes(), 16)
            )
        );
        // 60 four-byte characters: 60 chars but 240 bytes > MariaDB's 192.
        let wide = "😀".repeat(60);
        let got = mysql_lock_string(&wide.as_str().into(), &Prefix::none()).unwrap();
        assert!(got.len() <= MYSQL_MAX_BYTES && got.chars().count() <= MYSQL_MAX_CHARS);
        assert_ne!(got, wide);
        assert!(mysql_lock_string(&LockName::raw_i64(1), &p).is_err());
        // Fixed vector, so the mapping can never change silently.
        assert_eq!(
            mysql_lock_string(&"a".repeat(70).as_str().into(), &Prefix::none()).unwrap(),
            format!("{}#{}", "a".repeat(47), "6bd5e5034855a112")
        );
    }

    /// The table in the module docs: the public contract on both servers.
    #[test]
    fn mysql_vectors() {
        use MysqlFlavour::{MariaDb, Mysql};
        let none = Prefix::none();
        let on = |s: &str, f| mysql_lock_string_for(&s.into(), &none, f).unwrap();
        let mapped = |head: &str, hash: &str| format!("{head}#{hash}");
        let a = |n| "a".repeat(n);
        for f in [MariaDb, Mysql] {
            assert_eq!(on(&a(64), f), a(64));
        }
        assert_eq!(on(&a(65), MariaDb), a(65));
        assert_eq!(on(&a(65), Mysql), mapped(&a(47), "635361c48bb9eab1"));
        assert_eq!(on(&a(192), MariaDb), a(192));
        assert_eq!(on(&a(192), Mysql), mapped(&a(47), "7cee24628d290c16"));
        for f in [MariaDb, Mysql] {
            assert_eq!(on(&a(193), f), mapped(&a(47), "33f93a9879ef18f9"));
        }
        // Two-byte characters: MariaDB counts bytes, MySQL characters.
        let e = |n| "é".repeat(n);
        assert_eq!(on(&e(96), MariaDb), e(96));
        assert_eq!(on(&e(96), Mysql), mapped(&e(47), "25187876b1179826"));
        for f in [MariaDb, Mysql] {
            assert_eq!(on(&e(97), f), mapped(&e(47), "6150e9b6b371f2b0"));
        }
        // Four-byte characters: the head stops at 175 bytes.
        let smile = |n| "😀".repeat(n);
        for f in [MariaDb, Mysql] {
            assert_eq!(on(&smile(48), f), smile(48));
            let got = on(&smile(49), f);
            assert_eq!(got, mapped(&smile(43), "2f4c9a2f211fb1e1"));
            assert_eq!(got.len(), 189);
        }
        // The prefix is part of the string, and of the limit.
        let p = Prefix::new("app:");
        let name = "n".repeat(188);
        assert_eq!(
            mysql_lock_string_for(&name.as_str().into(), &p, MariaDb).unwrap(),
            format!("app:{name}")
        );
        let name = "n".repeat(189);
        assert_ne!(
            mysql_lock_string_for(&name.as_str().into(), &p, MariaDb).unwrap(),
            format!("app:{name}")
        );
        // The old entry point is the MySQL mapping.
        assert_eq!(
            mysql_lock_string(&a(65).as_str().into(), &none).unwrap(),
            on(&a(65), Mysql)
        );
    }

    #[test]
    fn flavours_from_version_strings() {
        assert_eq!(
            MysqlFlavour::from_version("10.11.19-MariaDB-0+deb12u1"),
            MysqlFlavour::MariaDb
        );
        assert_eq!(
            MysqlFlavour::from_version("5.5.5-10.6.4-MariaDB-log"),
            MysqlFlavour::MariaDb
        );
        assert_eq!(MysqlFlavour::from_version("8.0.36"), MysqlFlavour::Mysql);
        assert_eq!(
            MysqlFlavour::from_version("8.4.0-commercial"),
            MysqlFlavour::Mysql
        );
    }

    #[test]
    fn mapped_strings_are_recognised() {
        for full in [
            "a".repeat(193),
            "é".repeat(97),
            "😀".repeat(49),
            format!("x{}", "😀".repeat(60)),
        ] {
            assert!(mysql_looks_mapped(&mysql_mapped(&full)), "{full:?}");
        }
        for plain in [
            "report",
            "a#0123456789abcdef",
            &"a".repeat(100),
            &format!("{}#{}", "a".repeat(47), "XYZ"),
        ] {
            assert!(!mysql_looks_mapped(plain), "{plain:?}");
        }
    }

    #[test]
    fn local_names_are_safe() {
        let n = local_file_name(&"../etc/passwd".into(), &Prefix::none()).unwrap();
        assert!(!n.contains('/'));
        assert!(!n.starts_with('.'));
        assert!(n.ends_with(".lock"));
        let u = local_file_name(&"日本".into(), &Prefix::none()).unwrap();
        assert_eq!(u.len(), 32 + ".lock".len());
        assert_ne!(
            local_file_name(&"a".into(), &Prefix::none()).unwrap(),
            local_file_name(&"A".into(), &Prefix::none()).unwrap()
        );
    }

    #[test]
    fn comments_cannot_escape() {
        let c = sql_comment(&"x */ DROP TABLE t; /* y\n".into());
        assert!(!c.contains("*/") && !c.contains("/*") && !c.contains('\n'));
        assert_eq!(sql_comment(&"a/*/b".into()), "a--/b");
    }

    #[test]
    fn validation() {
        assert!(LockName::from("").validate().is_err());
        assert!(LockName::from("a\0b").validate().is_err());
        assert!(LockName::from("x".repeat(MAX_NAME_BYTES + 1)).validate().is_err());
        assert!(LockName::from("ok").validate().is_ok());
        assert!(LockName::from(0i64).validate().is_ok());
    }
}
