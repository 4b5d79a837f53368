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
//!   goes on only if `used + admitted + step ≤ 3/4 × capacity`, where
//!   `admitted` are its own acquisitions under way that the server has not
//!   granted yet (so not counted); its allowance then becomes what it holds
//!   and has admitted plus `step`, so one count admits at most `step` locks
//!   the server has not seen. Releases lower the allowance again: room is
//!   lent, not kept. Past the budget the acquisition fails with
//!   [`Error::ServerLockBudget`], and the server keeps a quarter of its table.
//!
//! **Connections are a budget too.** A locker needs one connection (its lock
//! session, which also waits in the server when it holds nothing else);
//! before it opens another — to wait for a second name while its session
//! holds a lock — it asks the server how many ordinary connection slots are
//! free ([`room_for_connection`]) and opens one only if, after it, at least
//! [`CONNECTION_RESERVE`] (or a tenth of `max_connections`, if more) stay
//! free for everyone else. Otherwise it polls on the lock session, which
//! needs no connection.
//!
//! Every client holds a server connection, so at most `max_connections`
//! lockers can each run `step` ahead of their last count: dbmutex's locks
//! stay below `3/4 × capacity + max_connections × step ≤ capacity`, whatever
//! the number of processes, and the count costs a query only once per
//! `step` locks past the first `step`.

use std::sync::Arc;

use super::conn::{LockTable, PgConn};
use crate::{Error, Result};

/// The fewest ordinary connection slots an extra connection of a locker
/// leaves free (a tenth of `max_connections`, if that is more).
pub(crate) const CONNECTION_RESERVE: i64 = 5;

/// Whether the server has room for one more connection of ours (see the
/// module docs), asked on `conn`; `false` if it cannot tell.
pub(crate) async fn room_for_connection(conn: &PgConn) -> bool {
    // Other roles' sessions may hide their backend_type (no
    // pg_read_all_stats): counted as clients, to err on the safe side.
    let sql = "SELECT current_setting('max_connections')::int,                current_setting('max_connections')::int                - current_setting('superuser_reserved_connections')::int                - coalesce(current_setting('reserved_connections', true)::int, 0)                - (SELECT count(*) FROM pg_stat_get_activity(NULL) a                   WHERE a.backend_type IS NULL OR a.backend_type = 'client backend')::int";
    match conn.client.query_typed(sql, &[]).await {
        Ok(rows) => rows.first().is_some_and(|r| {
            let (max, free): (i32, i32) = (r.get(0), r.get(1));
            // One more of ours must leave the reserve free.
            i64::from(free) > CONNECTION_RESERVE.max(i64::from(max) / 10)
        }),
        Err(e) => {
            tracing::debug!(error = %e, "dbmutex: cannot count the server's free connections; polling instead");
            false
        }
    }
}

/// One locker's share of the server's lock table.
pub(crate) struct Budget {
    table: LockTable,
    state: std::sync::Mutex<State>,
    /// One count at a time.
    gate: tokio::sync::Mutex<()>,
}

/// What this locker holds and may take.
#[derive(Debug)]
struct State {
    /// Server locks granted to this locker: the server's count sees them.
    granted: u64,
    /// Admitted, not yet granted: no count sees them.
    admitted: u64,
    /// `granted + admitted` may grow to this without a count. A count lets
    /// it run `step` past what the locker has then; releases lower it, so
    /// room granted once is not kept.
    allowance: u64,
}

impl Budget {
    pub(crate) fn new(table: LockTable) -> Arc<Budget> {
        Arc::new(Budget {
            table,
            state: std::sync::Mutex::new(State {
                granted: 0,
                admitted: 0,
                allowance: step(table),
            }),
            gate: tokio::sync::Mutex::new(()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The server-wide entries past which no new lock is taken.
    pub(crate) fn limit(&self) -> u64 {
        self.table.capacity() / 4 * 3
    }

    /// A slot if the allowance has room.
    fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut st = self.state();
        (st.granted + st.admitted < st.allowance).then(|| {
            st.admitted += 1;
            Slot {
                budget: self.clone(),
                granted: false,
            }
        })
    }

    /// Reserves room for one more server lock, counting the server's table
    /// (on `probe`) when this locker's allowance is used up: each count
    /// admits at most `step` locks the server has not seen. The count is
    /// bounded by `within`. The slot gives the room back when dropped.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is reserved until the call returns a slot.
    pub(crate) async fn reserve<F, Fut>(
        self: &Arc<Self>,
        within: std::time::Duration,
        probe: F,
    ) -> Result<Slot>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Arc<PgConn>>>,
    {
        if let Some(slot) = self.admit() {
            return Ok(slot);
        }
        // Boxed: the count is rare, and its future (a connect inside) is
        // large; inline it would be moved with every acquisition's.
        Box::pin(self.count_and_reserve(within, probe)).await
    }

    /// [`reserve`](Self::reserve) once the allowance is spent: counts the
    /// server's lock table, within `within`.
    async fn count_and_reserve<F, Fut>(
        self: &Arc<Self>,
        within: std::time::Duration,
        probe: F,
    ) -> Result<Slot>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Arc<PgConn>>>,
    {
        let count = async {
            let _one = self.gate.lock().await;
            loop {
                if let Some(slot) = self.admit() {
                    return Ok(slot);
                }
                let conn = probe().await?;
                let rows = conn
                    .client
                    .query("SELECT count(*) FROM pg_locks WHERE NOT fastpath", &[])
                    .await
                    .map_err(|e| Error::Database(Box::new(e)))?;
                // Perhaps read on the idle lock session: an answer, so a
                // keepalive probe queued behind it is not taken for silence.
                conn.heard_from_server();
                let used = rows.first().map_or(0, |r| r.get::<_, i64>(0)).max(0) as u64;
                let limit = self.limit();
                let mut st = self.state();
                // Admitted but not granted yet: not in the server's count.
                if used + st.admitted + step(self.table) > limit {
                    return Err(Error::ServerLockBudget {
                        used,
                        limit,
                        capacity: self.table.capacity(),
                    });
                }
                st.allowance = st.granted + st.admitted + step(self.table);
            }
        };
        match tokio::time::timeout(within, count).await {
            Ok(r) => r,
            Err(_) => Err(Error::Connect(
                format!("the server did not answer the lock-table count within {within:?}").into(),
            )),
        }
    }
}

/// How far a locker may run ahead of its last count.
fn step(table: LockTable) -> u64 {
    (table.per_transaction / 4).max(1)
}

/// Room for one server lock; given back on drop.
pub(crate) struct Slot {
    budget: Arc<Budget>,
    granted: bool,
}

impl Slot {
    /// The server granted the lock: from now on the server's count
    /// includes it.
    pub(crate) fn granted(mut self) -> Self {
        if !self.granted {
            self.granted = true;
            let mut st = self.budget.state();
            st.admitted -= 1;
            st.granted += 1;
        }
        self
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let step = step(self.budget.table);
        let mut st = self.budget.state();
        if self.granted {
            st.granted -= 1;
        } else {
            st.admitted -= 1;
        }
        // Room is lent for `step` past what is held, not kept for ever.
        st.allowance = st.allowance.min(st.granted + st.admitted + step);
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
