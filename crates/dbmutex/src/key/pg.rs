//! PostgreSQL keys: a [`LockName`] to the `pg_advisory_lock` arguments (see
//! the [contract](super#postgresql)).

use std::fmt;

use super::name::{LockName, Prefix};

/// A PostgreSQL advisory-lock key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
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

    /// The key `pg_locks` shows as `(classid, objid, objsubid)`: the inverse
    /// of [`pg_locks_ids`](Self::pg_locks_ids). `objsubid` 2 is the two-`int4`
    /// form, anything else the `bigint` form.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn from_pg_locks(classid: u32, objid: u32, objsubid: i16) -> PgKey {
        if objsubid == 2 {
            PgKey::Pair(classid as i32, objid as i32)
        } else {
            PgKey::Big(((u64::from(classid) << 32) | u64::from(objid)) as i64)
        }
    }

    /// The key whose text form ([`Display`](fmt::Display): `k1 k2` or `k`)
    /// is `text`; `None` for anything else.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn from_text(text: &str) -> Option<PgKey> {
        let mut parts = text.split(' ');
        let a: i64 = parts.next()?.parse().ok()?;
        let key = match parts.next() {
            Some(b) => PgKey::Pair(i32::try_from(a).ok()?, b.parse().ok()?),
            None => PgKey::Big(a),
        };
        parts.next().is_none().then_some(key)
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
    let crc = if bytes.len() < SHORT {
        crc32_short(bytes)
    } else {
        crc32fast::hash(bytes)
    };
    (crc & 0x7fff_ffff) as i32
}

/// Names shorter than this are hashed by [`crc32_short`]; longer ones by
/// `crc32fast`, which (from 1.5) folds 16 bytes and more with carry-less
/// multiplies where the CPU has them, and reads no table.
const SHORT: usize = 16;

/// CRC-32 (zlib's, reflected polynomial 0xEDB88320), four bits at a time
/// from a 16-entry table: 64 bytes, one cache line. Below 16 bytes
/// `crc32fast` reads its slicing tables (8 KB), about a cache line per
/// byte of the name, and a fleet worker, which every other process runs
/// between its locks, finds those lines cold (BENCHMARKS.md, "The data a
/// cycle touches"). Equal to `crc32fast::hash` for every input (tested).
fn crc32_short(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 16] = {
        let mut t = [0u32; 16];
        let mut i = 0;
        while i < 16 {
            let mut c = i as u32;
            let mut bit = 0;
            while bit < 4 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
                bit += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        crc = (crc >> 4) ^ TABLE[(crc & 15) as usize];
        crc = (crc >> 4) ^ TABLE[(crc & 15) as usize];
    }
    !crc
}

/// The PostgreSQL key for `name` under `prefix`.
pub fn pg_key(name: &LockName, prefix: &Prefix) -> PgKey {
    match name {
        LockName::Str(s) => PgKey::Pair(gem_hash(s.as_bytes()), prefix.pg_k2()),
        LockName::Int(n) => PgKey::Pair((*n & 0x7fff_ffff) as i32, prefix.pg_k2()),
        LockName::RawI64(k) => PgKey::Big(*k),
        LockName::RawPair(a, b) => PgKey::Pair(*a, *b),
        // The second half negative: string and integer names' is the
        // prefix's, never negative.
        LockName::Slot(s, i) => {
            PgKey::Pair(gem_hash(format!("{s}\0slot {i}").as_bytes()), -1 - prefix.pg_k2())
        }
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

/// The lock name in a statement's `/* name */` comment (as [`sql_comment`]
/// writes it, and the gem), if it maps to `key` under `prefix`: the inverse
/// of [`sql_comment`] for the names that pass through it unchanged. The
/// statement may be about another lock of the same session, so a comment
/// whose name maps elsewhere is skipped.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn name_from_comments(query: &str, key: &PgKey, prefix: &Prefix) -> Option<String> {
    let mut rest = query;
    while let Some(start) = rest.find("/* ") {
        let after = &rest[start + 3..];
        let end = after.find(" */")?;
        let candidate = &after[..end];
        let as_name = LockName::Str(candidate.to_owned());
        if !candidate.is_empty() && pg_key(&as_name, prefix) == *key {
            return Some(candidate.to_owned());
        }
        if let Ok(n) = candidate.parse::<i64>() {
            if pg_key(&LockName::Int(n), prefix) == *key {
                return Some(candidate.to_owned());
            }
        }
        rest = &after[end + 3..];
    }
    None
}

#[cfg(test)]
mod tests {

    #[test]
    fn slot_keys_are_disjoint_from_names() {
        for prefix in [Prefix::none(), Prefix::new("42")] {
            let plain = pg_key(&"render".into(), &prefix);
            let PgKey::Pair(_, k2) = plain else { panic!("pair") };
            assert!(k2 >= 0);
            let slots: Vec<_> = (0..3)
                .map(|i| pg_key(&LockName::Slot("render".into(), i), &prefix))
                .collect();
            for (i, k) in slots.iter().enumerate() {
                let PgKey::Pair(_, k2) = *k else { panic!("pair") };
                assert!(k2 < 0, "slot {i} k2 {k2}");
                assert!(
                    slots[i + 1..].iter().all(|o| o != k),
                    "slots {i} and later collide"
                );
            }
        }
    }

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
    fn the_short_crc_is_zlibs() {
        // Every length either side of the switch and of crc32fast's own
        // (16 and 128 bytes), over bytes that vary in every bit (a
        // pseudo-random walk, so no two inputs are alike).
        let mut x = 0x9E37_79B9u32;
        let bytes: Vec<u8> = (0..132)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        for len in 0..bytes.len() {
            for start in [0, 1, 3] {
                let b = &bytes[start.min(len)..len];
                assert_eq!(crc32_short(b), crc32fast::hash(b), "{} bytes", b.len());
                assert_eq!(gem_hash(b), (crc32fast::hash(b) & 0x7fff_ffff) as i32);
            }
        }
        // The short CRC on its own, past the switch too.
        assert_eq!(crc32_short(&bytes), crc32fast::hash(&bytes));
        assert_eq!(crc32_short(b"hello"), 907_060_870);
        assert_eq!(crc32_short(&[0xff; 5]), crc32fast::hash(&[0xff; 5]));
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

    #[test]
    fn names_from_comments() {
        let p = Prefix::none();
        let k = pg_key(&"job".into(), &p);
        assert_eq!(
            name_from_comments("SELECT pg_try_advisory_lock($1, $2) /* job */", &k, &p).as_deref(),
            Some("job")
        );
        assert_eq!(name_from_comments("SELECT 1 /* other */", &k, &p), None);
        let k7 = pg_key(&7i64.into(), &p);
        assert_eq!(
            name_from_comments("SELECT x /* a */ /* 7 */", &k7, &p).as_deref(),
            Some("7")
        );
        assert_eq!(name_from_comments("/* unterminated", &k, &p), None);
    }

    /// `pg_locks` ids back to the key, over both forms' edges.
    #[test]
    fn pg_locks_ids_round_trip() {
        for key in [
            PgKey::Pair(0, 0),
            PgKey::Pair(1, -2),
            PgKey::Pair(i32::MIN, i32::MAX),
            PgKey::Pair(-1, -1),
            PgKey::Big(0),
            PgKey::Big(-1),
            PgKey::Big(1 << 32 | 2),
            PgKey::Big(i64::MIN),
            PgKey::Big(i64::MAX),
        ] {
            let (classid, objid, objsubid) = key.pg_locks_ids();
            assert_eq!(PgKey::from_pg_locks(classid, objid, objsubid), key, "{key:?}");
        }
        // As pg_locks shows them: a pair's ids are its two int4 as oids.
        assert_eq!(PgKey::from_pg_locks(u32::MAX, 5, 2), PgKey::Pair(-1, 5));
        assert_eq!(PgKey::from_pg_locks(1, 2, 1), PgKey::Big(1 << 32 | 2));
    }

    /// A key's text form back to the key; other text is refused.
    #[test]
    fn text_round_trip() {
        for key in [
            PgKey::Pair(1, -2),
            PgKey::Pair(i32::MIN, i32::MAX),
            PgKey::Big(i64::MIN),
            PgKey::Big(i64::MAX),
            PgKey::Big(7),
            pg_key(&"report".into(), &Prefix::new("42")),
        ] {
            assert_eq!(PgKey::from_text(&key.to_string()), Some(key), "{key}");
        }
        for junk in [
            "",
            " ",
            "x",
            "1 x",
            "1 2 3",
            "1  2",
            "1 2 ",
            "99999999999 1",
            "1 99999999999",
        ] {
            assert_eq!(PgKey::from_text(junk), None, "{junk:?}");
        }
    }

    /// A name through the comment the lock statement carries and back:
    /// recovered exactly when the comment shows it unchanged, else unknown.
    #[test]
    fn comments_round_trip() {
        for prefix in [Prefix::none(), Prefix::new("42")] {
            for name in [
                LockName::from("job"),
                LockName::from(" padded "),
                LockName::from("naïve 😀 name"),
                LockName::from("a -- b"),
                LockName::from("*/"),
                LockName::from("x /* y */ z"),
                LockName::from("tab\there"),
                LockName::from("line\nbreak"),
                LockName::from(0i64),
                LockName::from(-1i64),
                LockName::from(7i64),
            ] {
                let key = pg_key(&name, &prefix);
                let comment = sql_comment(&name);
                // As the lock statements are written (postgres/sql.rs), after
                // a comment about another lock of the session.
                let other = sql_comment(&"other".into());
                let query =
                    format!("SELECT 1 /* {other} */; SELECT pg_try_advisory_lock(1, 2) /* {comment} */");
                let want = (comment == name.to_string()).then(|| name.to_string());
                assert_eq!(name_from_comments(&query, &key, &prefix), want, "{name:?}");
            }
            // Raw keys are written as `raw:…`, which names no key here.
            let raw = LockName::raw_i64(5);
            let query = format!("SELECT pg_try_advisory_lock(5) /* {} */", sql_comment(&raw));
            assert_eq!(name_from_comments(&query, &pg_key(&raw, &prefix), &prefix), None);
        }
    }
}
