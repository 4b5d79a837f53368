//! Lock-delay: after a holder is lost uncleanly, the lock stays closed for
//! a while, so that the lost holder's in-flight work drains before the next
//! holder starts (Chubby's and Consul's lock-delay). Opt in per acquisition
//! with [`LockOptions::lock_delay`](crate::LockOptions::lock_delay); the
//! CLI's `dbmutex run --lock-delay D`.
//!
//! The record is one row (or file) per key, `closed_until`, written only by
//! the lock's holder on the lock's own session:
//!
//! - acquired: the holder reads it; closed (in the future, by the
//!   server's clock) → it waits, holding the lock, until then (or gives up
//!   at its own deadline, leaving the record as it was); open → it writes
//!   `now + d + beat`;
//! - held: renewed to `now + d + beat` every `beat` (a quarter of `d`,
//!   between 100 ms and 1 s);
//! - released cleanly: cleared before the unlock, so the next holder goes
//!   at once.
//!
//! A holder lost between two renewals leaves the record saying closed
//! until `d + beat` after its last renewal: the lock stays closed between
//! `d` and `d + beat` after the lost holder's last sign of life (measured:
//! RELIABILITY.md, "Lock-delay").
//!
//! Where it lives:
//! - **PostgreSQL**: the table [`POSTGRES_TABLE`] creates,
//!   `public.dbmutex_delay` (like `dbmutex_fence`, whatever the
//!   `search_path`); times are the server's `clock_timestamp()`.
//! - **MySQL / MariaDB**: the table [`MYSQL_TABLE`], in the connection's
//!   database; times are the server's `UTC_TIMESTAMP(6)`.
//! - **local**: `<lock file>.delay`, the wall-clock time (microseconds
//!   since the epoch) it is closed until.
//!
//! A role that may not create tables needs the table created once
//! (`dbmutex init`) and then `SELECT, INSERT, UPDATE` on it.

use std::time::Duration;

/// The table that keeps PostgreSQL lock-delay records (what `dbmutex init`
/// runs).
pub const POSTGRES_TABLE: &str = "CREATE TABLE IF NOT EXISTS public.dbmutex_delay \
     (lock_key text PRIMARY KEY, closed_until timestamptz)";

/// The table that keeps MySQL / MariaDB lock-delay records (what `dbmutex
/// init` runs); times are UTC.
pub const MYSQL_TABLE: &str = "CREATE TABLE IF NOT EXISTS dbmutex_delay \
     (lock_key VARBINARY(512) NOT NULL PRIMARY KEY, closed_until DATETIME(6) NULL) ENGINE=InnoDB";

/// One step of lock-delay on a held lock's own session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Just granted: if the record says closed, how long still (nothing
    /// written); else record closed for this long from now, and answer zero.
    Enter(Duration),
    /// Held: record closed for this long from now.
    Renew(Duration),
    /// Released cleanly: clear the record.
    Open,
}

/// How often a holder renews its record for a lock-delay of `d`.
pub(crate) fn beat(d: Duration) -> Duration {
    (d / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// How long a record written now says closed: `d` after the holder's last
/// renewal, however late in its beat it is lost.
pub(crate) fn closed_for(d: Duration) -> Duration {
    d.saturating_add(beat(d))
}

/// What the library tells a role that may not create or write the table.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn no_table_help(what: &str) -> String {
    format!(
        "lock-delay needs the table dbmutex_delay, and this role cannot {what} it: \
         run `dbmutex init --database-url URL` (or the statement in dbmutex::delay) as a role \
         that may, then grant SELECT, INSERT, UPDATE on dbmutex_delay to this one"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_beat_is_a_quarter_within_bounds() {
        assert_eq!(beat(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(beat(Duration::from_millis(100)), Duration::from_millis(100));
        assert_eq!(beat(Duration::from_secs(3600)), Duration::from_secs(1));
        assert_eq!(closed_for(Duration::from_secs(10)), Duration::from_secs(11));
        assert_eq!(closed_for(Duration::MAX), Duration::MAX);
    }
}
