//! Local lock files: a [`LockName`] to the lock file's name (see the
//! [contract](super#local-backend)).

use super::{sha256_hex, text_of, LockName, Prefix};
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
}
