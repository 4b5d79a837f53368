//! MySQL and MariaDB lock strings: a [`LockName`] to the `GET_LOCK` string
//! (see the [contract](super#mysql-and-mariadb)).

use super::name::{sha256_hex, text_of, LockName, Prefix};
use crate::Error;

/// Longest lock string MySQL accepts, in characters (MySQL 8's limit); also
/// the length of every mapped (hashed) lock string.
pub const MYSQL_MAX_CHARS: usize = 64;
/// Longest lock string MariaDB accepts, in bytes; no lock string dbmutex
/// sends to either server is longer.
pub const MYSQL_MAX_BYTES: usize = 192;

/// Which MySQL-protocol server a lock string is for: their limits on lock
/// names differ (see the [module docs](super#mysql-and-mariadb)).
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
    if let LockName::Slot(s, _) = name {
        // Always mapped: the servers end a lock string at a NUL byte, so
        // the head is the name's and only the hash covers the slot.
        return Ok(mysql_mapped_as(&format!("{}{s}", prefix.text()), &full));
    }
    if flavour.accepts(&full) {
        return Ok(full);
    }
    Ok(mysql_mapped(&full))
}

/// The mapped form of a lock string no server would take.
fn mysql_mapped(full: &str) -> String {
    mysql_mapped_as(full, full)
}

/// The head of `shown`, `#`, and 16 hex digits of SHA-256(`hashed`).
fn mysql_mapped_as(shown: &str, hashed: &str) -> String {
    let full = shown;
    // 47 characters, fewer if they would pass 175 bytes: with '#' and 16
    // hex digits the result fits both 64 characters and 192 bytes.
    let mut head = String::new();
    for c in full.chars().take(47) {
        if head.len() + c.len_utf8() > MYSQL_MAX_BYTES - 17 {
            break;
        }
        head.push(c);
    }
    format!("{head}#{}", sha256_hex(hashed.as_bytes(), 16))
}

/// Whether `lock` has the shape of a mapped lock string: a head of 47
/// characters, or a shorter one that stopped at the 175-byte cap (then at
/// least 172 bytes), then `#` and 16 lowercase hex digits. A name of that
/// very shape passed unchanged looks the same; nothing else does.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
fn mysql_looks_mapped(lock: &str) -> bool {
    let Some((head, hash)) = lock.rsplit_once('#') else {
        return false;
    };
    let hex = hash.len() == 16 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let n = head.chars().count();
    hex && (n == 47
        || (n < 47 && head.len() >= MYSQL_MAX_BYTES - 17 - 3 && head.len() <= MYSQL_MAX_BYTES - 17))
}

/// A lock string as MariaDB's `METADATA_LOCK_INFO` shows it (measured on
/// 10.11): read as `utf8mb3`, so each byte of a 4-byte character shows as
/// `?`, and cut to 64 characters.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn mysql_as_listed(lock: &str) -> String {
    lock.chars()
        .flat_map(|c| match c.len_utf8() {
            4 => std::iter::repeat_n('?', 4),
            _ => std::iter::repeat_n(c, 1),
        })
        .take(MYSQL_MAX_CHARS)
        .collect()
}

/// Whether a listed string may be cut short or altered by the listing
/// (see [`mysql_as_listed`]), so that it must be checked before it counts as
/// the lock string.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn mysql_maybe_cut(listed: &str) -> bool {
    listed.contains('?') || listed.chars().count() >= MYSQL_MAX_CHARS
}

/// The name behind a lock string, when it can be known from the string:
/// the string minus the prefix. A string in the shape of a mapped long name
/// (see [`mysql_looks_mapped`]: a head, `#`, 16 hex digits) is taken for
/// one, so its name is unknown here; the backend fills in the names of the
/// locks its own locker holds. A listed string that may be cut or altered
/// ([`mysql_maybe_cut`]) is named here too and must be checked by the caller.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn mysql_name_of(key: &str, prefix: &Prefix) -> Option<String> {
    let rest = key.strip_prefix(prefix.text())?;
    (!mysql_looks_mapped(key) && !rest.is_empty()).then(|| rest.to_owned())
}

#[cfg(test)]
mod tests {

    use super::*;

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
    fn names_from_lock_strings() {
        let p = Prefix::new("app:");
        assert_eq!(mysql_name_of("app:report", &p).as_deref(), Some("report"));
        assert_eq!(mysql_name_of("other:report", &p), None);
        assert_eq!(mysql_name_of("app:", &p), None);
        let long = "n".repeat(100);
        for flavour in [MysqlFlavour::MariaDb, MysqlFlavour::Mysql] {
            let key = mysql_lock_string_for(&long.as_str().into(), &p, flavour).unwrap();
            let want = (flavour == MysqlFlavour::MariaDb).then(|| long.clone());
            assert_eq!(mysql_name_of(&key, &p), want, "{flavour:?}");
        }
        // A mapped string does not reveal its name — multi-byte heads too,
        // which stop short of 47 characters.
        for long in [
            "n".repeat(300),
            "ü".repeat(100),
            "😀".repeat(60),
            format!("a{}", "😀".repeat(60)),
        ] {
            let key = mysql_lock_string_for(&long.as_str().into(), &p, MysqlFlavour::MariaDb).unwrap();
            assert_ne!(key, format!("app:{long}"));
            assert_eq!(mysql_name_of(&key, &p), None, "{key:?}");
        }
        assert_eq!(mysql_name_of("plain", &Prefix::none()).as_deref(), Some("plain"));
    }

    #[test]
    fn listed_strings() {
        assert_eq!(mysql_as_listed("report"), "report");
        assert_eq!(mysql_as_listed("a😀ü"), "a????ü");
        let long = "m".repeat(100);
        assert_eq!(mysql_as_listed(&long), "m".repeat(64));
        assert!(mysql_maybe_cut(&mysql_as_listed(&long)));
        assert!(mysql_maybe_cut("a?b"));
        assert!(!mysql_maybe_cut("report"));
        assert!(!mysql_maybe_cut(&"m".repeat(63)));
    }

    /// Name → lock string → (as the server lists it) → name, on both
    /// servers: the name comes back exactly when the string is the name
    /// unchanged and listed unaltered; a mapped (hashed) string never yields
    /// a name, and a listed string that may be altered is flagged for the
    /// backend's check rather than trusted.
    #[test]
    fn lock_strings_round_trip() {
        let names = [
            "report".to_owned(),
            "a?b".to_owned(),
            "n".repeat(59),
            "n".repeat(60),
            "n".repeat(61),
            "n".repeat(100),
            "n".repeat(188),
            "n".repeat(300),
            "ü".repeat(60),
            "ü".repeat(100),
            "日本".repeat(40),
            "😀".repeat(10),
            "😀".repeat(48),
            "😀".repeat(60),
            format!("a{}", "😀".repeat(60)),
            format!("{}#0123456789abcdef", "x".repeat(43)),
        ];
        for prefix in [Prefix::none(), Prefix::new("app:")] {
            for flavour in [MysqlFlavour::MariaDb, MysqlFlavour::Mysql] {
                for name in &names {
                    let lock = mysql_lock_string_for(&name.as_str().into(), &prefix, flavour).unwrap();
                    let unchanged = lock == format!("{}{name}", prefix.text());
                    let got = mysql_name_of(&lock, &prefix);
                    if unchanged && !mysql_looks_mapped(&lock) {
                        assert_eq!(got.as_deref(), Some(name.as_str()), "{flavour:?} {name:?}");
                    } else {
                        // Mapped, or a name of a mapped string's very shape
                        // (its own locker names it): unknown from the string.
                        assert_eq!(got, None, "{flavour:?} {name:?}");
                    }
                    // MariaDB's listing: trusted as is only when unaltered.
                    let listed = mysql_as_listed(&lock);
                    if let Some(n) = mysql_name_of(&listed, &prefix) {
                        assert!(
                            mysql_maybe_cut(&listed) || (listed == lock && unchanged && n == *name),
                            "{flavour:?} {name:?}: {listed:?} named {n:?} unchecked"
                        );
                    }
                }
            }
        }
    }
}
