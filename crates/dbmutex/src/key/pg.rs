//! PostgreSQL keys: a [`LockName`] to the `pg_advisory_lock` arguments (see
//! the [contract](super#postgresql)).

use std::fmt;

use super::{LockName, Prefix};

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
    fn comments_cannot_escape() {
        let c = sql_comment(&"x */ DROP TABLE t; /* y\n".into());
        assert!(!c.contains("*/") && !c.contains("/*") && !c.contains('\n'));
        assert_eq!(sql_comment(&"a/*/b".into()), "a--/b");
    }
}
