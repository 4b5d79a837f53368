//! The names of the locks a locker holds on its lock session: `list` shows
//! them for that session (its lock statements are prepared and nameless,
//! and introspection runs on the same session, so the server's query text
//! cannot tell them).

use std::sync::Mutex;

use crate::key::PgKey;
use crate::LockName;

/// Held keys → their name and how many guards hold them.
#[derive(Default)]
pub(crate) struct OwnNames(Mutex<crate::core::FastMap<PgKey, (LockName, usize)>>);

impl OwnNames {
    pub(crate) fn add(&self, key: PgKey, name: &LockName) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(key).or_insert_with(|| (name.clone(), 0)).1 += 1;
    }

    pub(crate) fn remove(&self, key: &PgKey) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Occupied(mut e) = m.entry(*key) {
            e.get_mut().1 -= 1;
            if e.get().1 == 0 {
                e.remove();
            }
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
            .filter(|(n, _)| !matches!(n, LockName::RawI64(_) | LockName::RawPair(..)))
            .map(|(n, _)| n.to_string())
    }
}
