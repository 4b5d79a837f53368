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

mod local;
mod mysql;
mod pg;

use std::fmt;

use sha2::{Digest, Sha256};

use crate::Error;

pub use local::local_file_name;
pub(crate) use local::local_name_from_note;
#[cfg(feature = "mysql")]
pub(crate) use mysql::{mysql_as_listed, mysql_maybe_cut, mysql_name_of};
pub use mysql::{mysql_lock_string, mysql_lock_string_for, MysqlFlavour, MYSQL_MAX_BYTES, MYSQL_MAX_CHARS};
#[cfg(feature = "postgres")]
pub(crate) use pg::name_from_comments;
pub use pg::{gem_hash, pg_key, sql_comment, PgKey};

/// The environment variable the gem reads its key prefix from.
pub const PREFIX_ENV: &str = "WITH_ADVISORY_LOCK_PREFIX";

/// The longest lock name accepted, in bytes (names are mapped to keys, so the
/// limit is about memory and log sizes, not about the database).
pub const MAX_NAME_BYTES: usize = 64 * 1024;

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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn validation() {
        assert!(LockName::from("").validate().is_err());
        assert!(LockName::from("a\0b").validate().is_err());
        assert!(LockName::from("x".repeat(MAX_NAME_BYTES + 1)).validate().is_err());
        assert!(LockName::from("ok").validate().is_ok());
        assert!(LockName::from(0i64).validate().is_ok());
    }
}
