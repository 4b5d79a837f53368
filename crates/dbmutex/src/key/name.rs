//! Lock names, prefixes, and what every mapping shares (see the key
//! contract in [`super`]).

use std::fmt;

use sha2::{Digest, Sha256};

use crate::Error;

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
#[non_exhaustive]
pub enum LockName {
    /// A string name, hashed as the gem hashes it.
    Str(String),
    /// An integer name: the masked integer is the key, as in the gem.
    Int(i64),
    /// A raw PostgreSQL `bigint` key (`pg_advisory_lock(bigint)`).
    RawI64(i64),
    /// A raw PostgreSQL `(int4, int4)` key (`pg_advisory_lock(int, int)`).
    RawPair(i32, i32),
    /// Slot `i` of the counting semaphore named by the string (see
    /// [`Locker::acquire_slot`](crate::Locker::acquire_slot)). Its key is
    /// disjoint from every string and integer name's (see the key contract,
    /// [`key`](crate::key), "Slots").
    Slot(String, u32),
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
        if let LockName::Str(s) | LockName::Slot(s, _) = self {
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
            LockName::Slot(s, i) => write!(f, "{s} [slot {i}]"),
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

pub(super) fn sha256_hex(data: &[u8], digits: usize) -> String {
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
pub(super) fn text_of(name: &LockName) -> Result<String, Error> {
    match name {
        LockName::Str(s) => Ok(s.clone()),
        LockName::Int(n) => Ok(n.to_string()),
        // A NUL byte, which no string name has: no string name's text.
        LockName::Slot(s, i) => Ok(format!("{s}\0slot {i}")),
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
