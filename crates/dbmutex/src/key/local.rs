//! Local lock files: a [`LockName`] to the lock file's name (see the
//! [contract](super#local-backend)).

use super::name::{sha256_hex, text_of, LockName, Prefix};
use crate::Error;

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

/// The name behind a lock file's note, for a locker whose prefix text is
/// `prefix`: the note stores `prefix + name`, the text the file name hashes
/// (see [`local_file_name`]), so the name is the noted text without
/// `prefix`; a note that does not start with `prefix` (another locker's
/// lock) is shown whole. The file name itself cannot be turned back: its
/// head is lossy and the rest a hash.
pub(crate) fn local_name_from_note(noted: String, prefix: &str) -> String {
    match noted.strip_prefix(prefix) {
        Some(name) => name.to_owned(),
        None => noted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    /// Name → the note's text (as the local backend writes it) → name: the
    /// same name, so the same lock file.
    #[test]
    fn notes_round_trip() {
        for prefix in [Prefix::none(), Prefix::new("app:"), Prefix::new("7")] {
            for name in [
                LockName::from("job"),
                LockName::from("job\nwith newline"),
                LockName::from("app:nested"),
                LockName::from("日本"),
                LockName::from(42i64),
            ] {
                let noted = format!("{}{name}", prefix.text());
                let back = local_name_from_note(noted, prefix.text());
                assert_eq!(back, name.to_string(), "{prefix:?} {name:?}");
                assert_eq!(
                    local_file_name(&back.as_str().into(), &prefix).unwrap(),
                    local_file_name(&name, &prefix).unwrap()
                );
            }
        }
        // Another locker's note is shown whole.
        assert_eq!(local_name_from_note("app:job".into(), "other:"), "app:job");
    }
}
