//! Never fill the server's lock table.
//!
//! PostgreSQL keeps every lock of every session in one shared table of
//! about `max_locks_per_transaction × (max_connections +
//! max_prepared_transactions)` entries (it can borrow a little spare shared
//! memory beyond that). Once it is full, every session's queries fail with
//! 53200, and so does every new connection: an outage for every
//! application on the server. A per-process cap cannot prevent that (four
//! processes at 4,096 locks each fill a default server), so each locker
//! also keeps to a budget derived from the server's real capacity and what
//! the whole server holds now:
//!
//! - a locker may hold `step = max(1, max_locks_per_transaction / 4)` locks
//!   without asking;
//! - to go past its allowance it counts the server's lock-table entries
//!   (`pg_locks`, fast-path entries excluded: they are not in the table) and
//!   goes on only if `used + step ≤ 3/4 × capacity`; its allowance then
//!   grows by `step`. Otherwise the acquisition fails with
//!   [`Error::ServerLockBudget`], and the server keeps a quarter of its table.
//!
//! Every client holds a server connection, so at most `max_connections`
//! lockers can each run `step` ahead of their last count: dbmutex's locks
//! stay below `3/4 × capacity + max_connections × step ≤ capacity`, whatever
//! the number of processes, and the count costs a query only once per
//! `step` locks past the first `step`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::PgConn;
use crate::{Error, Result};

/// What the server's lock table can hold, as its settings say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockTable {
    /// `max_locks_per_transaction`.
    pub(crate) per_transaction: u64,
    /// `max_connections + max_prepared_transactions`.
    pub(crate) slots: u64,
}

impl LockTable {
    /// Table entries: `max_locks_per_transaction × (max_connections +
    /// max_prepared_transactions)`.
    pub(crate) fn capacity(self) -> u64 {
        self.per_transaction * self.slots
    }
}

/// One locker's share of the server's lock table.
pub(crate) struct Budget {
    table: LockTable,
    /// Server locks this locker holds (or is about to take).
    held: AtomicU64,
    /// `held` may grow to this without counting the server's table.
    allowance: AtomicU64,
    /// One count at a time.
    gate: tokio::sync::Mutex<()>,
}

impl Budget {
    pub(crate) fn new(table: LockTable) -> Arc<Budget> {
        Arc::new(Budget {
            table,
            held: AtomicU64::new(0),
            allowance: AtomicU64::new(step(table)),
            gate: tokio::sync::Mutex::new(()),
        })
    }

    /// The server-wide entries past which no new lock is taken.
    pub(crate) fn limit(&self) -> u64 {
        self.table.capacity() / 4 * 3
    }

    /// Reserves room for one more server lock, counting the server's table
    /// (on `probe`) when this locker's allowance is used up. The slot gives
    /// the room back when dropped.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped call gives its room back.
    pub(crate) async fn reserve<F, Fut>(self: &Arc<Self>, probe: F) -> Result<Slot>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Arc<PgConn>>>,
    {
        let n = self.held.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = Slot(self.clone());
        if n <= self.allowance.load(Ordering::Acquire) {
            return Ok(slot);
        }
        let _one = self.gate.lock().await;
        let n = self.held.load(Ordering::Acquire);
        if n <= self.allowance.load(Ordering::Acquire) {
            return Ok(slot);
        }
        let conn = probe().await?;
        let rows = conn
            .client
            .query("SELECT count(*) FROM pg_locks WHERE NOT fastpath", &[])
            .await
            .map_err(|e| Error::Database(Box::new(e)))?;
        let used = rows.first().map_or(0, |r| r.get::<_, i64>(0)).max(0) as u64;
        let limit = self.limit();
        if used + step(self.table) > limit {
            return Err(Error::ServerLockBudget {
                used,
                limit,
                capacity: self.table.capacity(),
            });
        }
        self.allowance.store(n + step(self.table), Ordering::Release);
        Ok(slot)
    }
}

/// How far a locker may run ahead of its last count.
fn step(table: LockTable) -> u64 {
    (table.per_transaction / 4).max(1)
}

/// Room for one server lock; given back on drop.
pub(crate) struct Slot(Arc<Budget>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_case_stays_inside_the_table() {
        // Every locker runs `step` ahead of a count that saw the limit.
        for (per_transaction, connections) in [(64, 100), (10, 10), (10, 1000), (1000, 5), (1, 1)] {
            let t = LockTable {
                per_transaction,
                slots: connections,
            };
            let budget = Budget::new(t);
            let worst = budget.limit() + connections * step(t);
            assert!(worst <= t.capacity(), "{t:?}: {worst} > {}", t.capacity());
        }
    }
}
