//! The names of the locks a locker holds on its lock session: `list` shows
//! them for that session (its lock statements are prepared and nameless,
//! and introspection runs on the same session, so the server's query text
//! cannot tell them).

use std::sync::Mutex;

use crate::key::PgKey;
use crate::LockName;

/// Keys → their name and how many guards hold them. A key let go keeps its
/// entry (count 0) until the table outgrows [`KEEP`]: a locker that takes the
/// same names again and again (a worker, a fleet) then neither copies the
/// name nor touches the table's layout per lock.
#[derive(Default)]
pub(crate) struct OwnNames(Mutex<crate::core::FastMap<PgKey, (LockName, usize)>>);

/// Entries kept for keys no longer held, at most.
const KEEP: usize = 1024;

impl OwnNames {
    pub(crate) fn add(&self, key: PgKey, name: &LockName) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((held, n)) = m.get_mut(&key) {
            // A key's name: the same name, or (rarely) another that maps to
            // the same key, which then shows as the one held last.
            if *n == 0 && held != name {
                held.clone_from(name);
            }
            *n += 1;
            return;
        }
        if m.len() >= KEEP {
            m.retain(|_, (_, n)| *n > 0);
        }
        m.insert(key, (name.clone(), 1));
    }

    pub(crate) fn remove(&self, key: &PgKey) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = m.get_mut(key) {
            *n = n.saturating_sub(1);
        }
    }

    /// The name as `list` shows it (raw keys have none).
    /// Names the rows of `list` held by our lock session (server pid
    /// `pid`): its statements carry no name, but we know them.
    pub(crate) fn fill(&self, rows: &mut [crate::types::ListedLock], pid: i32) {
        for row in rows
            .iter_mut()
            .filter(|r| r.name.is_none() && r.holder.pid == i64::from(pid))
        {
            if let Some(key) = PgKey::from_text(&row.key) {
                row.name = self.name_of(&key);
            }
        }
    }

    pub(crate) fn name_of(&self, key: &PgKey) -> Option<String> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(key)
            .filter(|(n, held)| *held > 0 && !matches!(n, LockName::RawI64(_) | LockName::RawPair(..)))
            .map(|(n, _)| n.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_show_while_held_and_entries_stay_bounded() {
        let names = OwnNames::default();
        let (a, b) = (PgKey::Pair(1, 2), PgKey::Pair(3, 4));
        names.add(a, &"alpha".into());
        names.add(a, &"alpha".into());
        assert_eq!(names.name_of(&a).as_deref(), Some("alpha"));
        names.remove(&a);
        assert_eq!(
            names.name_of(&a).as_deref(),
            Some("alpha"),
            "one guard still holds it"
        );
        names.remove(&a);
        assert_eq!(names.name_of(&a), None, "let go: no name, though the entry stays");
        names.remove(&a);
        names.add(a, &"other".into());
        assert_eq!(names.name_of(&a).as_deref(), Some("other"), "the name held last");
        names.add(b, &LockName::raw_pair(3, 4));
        assert_eq!(names.name_of(&b), None, "raw keys have no name");
        for i in 0..3 * KEEP as i32 {
            let k = PgKey::Pair(100, i);
            names.add(k, &"x".into());
            names.remove(&k);
        }
        let len = names.0.lock().unwrap().len();
        assert!(len <= KEEP + 1, "{len} entries kept");
        assert_eq!(
            names.name_of(&a).as_deref(),
            Some("other"),
            "a held key's entry survives a purge"
        );
    }
}
