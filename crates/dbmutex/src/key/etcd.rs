//! etcd: a [`LockName`] to the key prefix its lock queue lives under (see
//! the [contract](super#etcd)).

use super::name::{text_of, LockName, Prefix};
use crate::Error;

/// The root under which an `etcd://` URL without a path keeps its locks.
pub const ETCD_DEFAULT_ROOT: &str = "dbmutex";

/// The key prefix of `name`'s lock queue under `root` (the URL's path,
/// [`ETCD_DEFAULT_ROOT`] when it has none):
/// `root + "/" + escaped(prefix + name) + "/"`. Each acquisition puts one
/// key under it; the key with the lowest create revision holds the lock.
///
/// ```
/// use dbmutex::key::{etcd_lock_prefix, Prefix};
/// assert_eq!(etcd_lock_prefix(&"nightly/report".into(), &Prefix::none(), "dbmutex").unwrap(),
///            "dbmutex/nightly%2Freport/");
/// ```
pub fn etcd_lock_prefix(name: &LockName, prefix: &Prefix, root: &str) -> Result<String, Error> {
    let full = format!("{}{}", prefix.text(), text_of(name)?);
    Ok(format!("{root}/{}/", escape(&full)))
}

/// `%`, `/` and control characters (a slot's NUL among them) as `%XX`,
/// per UTF-8 byte; everything else unchanged, so a name stays readable in
/// `etcdctl get --prefix` and one escaped name never contains another's
/// queue prefix.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '%' || c == '/' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The name behind one waiter's key `root/escaped/<id>` (as listed under
/// `root/`), without the locker's `prefix` when it starts with it; a
/// slot's text is shown as [`LockName::Slot`] shows it. `None` for a key
/// that no lock queue of this root can have.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn etcd_name_of(key: &str, root: &str, prefix: &str) -> Option<String> {
    let rest = key.strip_prefix(root)?.strip_prefix('/')?;
    let (escaped, _) = rest.split_once('/')?;
    let text = percent_encoding::percent_decode_str(escaped).decode_utf8().ok()?;
    let text = text.strip_prefix(prefix).unwrap_or(&text);
    Some(match text.split_once("\0slot ") {
        Some((s, i)) => format!("{s} [slot {i}]"),
        None => text.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed vectors: the mapping is part of the public contract.
    #[test]
    fn etcd_vectors() {
        let none = Prefix::none();
        let cases: [(LockName, &Prefix, &str); 6] = [
            ("job".into(), &none, "dbmutex/job/"),
            ("a/b%c".into(), &none, "dbmutex/a%2Fb%25c/"),
            ("日本".into(), &none, "dbmutex/日本/"),
            (42i64.into(), &none, "dbmutex/42/"),
            (LockName::Slot("pool".into(), 3), &none, "dbmutex/pool%00slot 3/"),
            ("line\nbreak".into(), &none, "dbmutex/line%0Abreak/"),
        ];
        for (name, prefix, want) in cases {
            assert_eq!(etcd_lock_prefix(&name, prefix, ETCD_DEFAULT_ROOT).unwrap(), want);
        }
        let app = Prefix::new("app:");
        assert_eq!(
            etcd_lock_prefix(&"x".into(), &app, "team/locks").unwrap(),
            "team/locks/app:x/"
        );
        assert!(etcd_lock_prefix(&LockName::raw_i64(1), &none, "r").is_err());
    }

    #[test]
    fn names_come_back_from_keys() {
        for (name, prefix) in [
            (LockName::from("a/b%c"), ""),
            (LockName::from("日本\n"), "app:"),
            (LockName::from(7i64), "app:"),
            (LockName::Slot("pool".into(), 2), ""),
        ] {
            let p = etcd_lock_prefix(&name, &Prefix::new(prefix), "r/s").unwrap();
            let key = format!("{p}694d7c1f2a3b4c5d");
            assert_eq!(etcd_name_of(&key, "r/s", prefix).unwrap(), name.to_string());
        }
        assert_eq!(etcd_name_of("other/x/1", "r", ""), None);
        assert_eq!(etcd_name_of("r/x", "r", ""), None);
    }
}
