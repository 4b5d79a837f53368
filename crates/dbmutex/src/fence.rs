//! Fencing tokens: the tables that issue them, and how the protected
//! resource checks them.
//!
//! A lock can be lost while its holder still acts: a pause (GC, swap, a
//! stopped VM) or a partition outlasts the session, the server frees the
//! lock, another worker takes it, and the first one's next write lands on
//! top. A *fencing token* lets the resource itself refuse that write.
//! Acquire with [`LockOptions::fenced`](crate::LockOptions::fenced); the
//! guard's [`LockGuard::fence`](crate::LockGuard::fence) is then strictly
//! greater than the token of every earlier holder of the same key. Send it
//! with every write; the resource keeps the highest token it has accepted
//! and rejects lower ones, **in the same transaction as the write**:
//!
//! ```sql
//! -- PostgreSQL ($1 = the token, as bigint) and MySQL/MariaDB (? placeholders)
//! UPDATE accounts SET balance = $2, fence = $1 WHERE id = $3 AND fence <= $1;
//! -- 0 rows updated: a later holder has written; this holder's lock is gone.
//! ```
//!
//! `<=` (not `<`) so one holder may write several times under its token;
//! two holders never share a token, so a stale holder still fails once the
//! newer one has written. (Until the newer holder's first write the
//! resource cannot know of it: fencing rejects the writes that come after.)
//! Start the column at 0; tokens are at least 1. For a resource outside a
//! database, [`FenceGate`] does the same check in memory.
//!
//! # Where tokens come from
//!
//! - **PostgreSQL**: the table [`POSTGRES_TABLE`] creates,
//!   `public.dbmutex_fence` — always in the schema `public`, whatever a
//!   client's `search_path` (so two clients with different paths share one
//!   sequence per key and database) — one row per key
//!   ([`Locker::key_of`](crate::Locker::key_of)'s text, prefix included).
//!   The token is issued by one autocommit statement
//!   (`INSERT … ON CONFLICT … DO UPDATE SET token = … RETURNING`: see
//!   [across failovers](#across-failovers) for the value)
//!   on the lock's own server session, guarded as every lock statement is
//!   (it runs only on the session that holds the lock, never on one a
//!   pooler moved us to), and committed before the guard is returned.
//! - **MySQL / MariaDB**: the table [`MYSQL_TABLE`], in the connection's
//!   database; one autocommit `INSERT … ON DUPLICATE KEY UPDATE` on the
//!   lock's own connection, which only writes while `IS_USED_LOCK(key)` is
//!   that connection.
//! - **local**: a file beside the lock file, `<lock file>.fence`, holding
//!   the last token as decimal text, replaced (write a temporary file,
//!   `fsync`, rename, `fsync` the directory) while the lock is held. Do not
//!   delete it: tokens would start again at 1. In the host-wide shared
//!   directory (mode 1777) the file belongs to the first user who fenced
//!   the name, and the sticky bit forbids other users to replace it: their
//!   fenced acquisitions of that name fail with
//!   [`Error::Io`](crate::Error::Io) (not tested here: the tests run as one
//!   user). Fence across users in a directory they share by group instead.
//!
//! The library creates the table on first use (`CREATE TABLE IF NOT
//! EXISTS`). A role that may not create tables (PostgreSQL 15 no longer
//! lets every role create in `public`) needs it created once by one that
//! may — `dbmutex init --database-url URL` runs the statement — and then only these
//! grants (PostgreSQL, MySQL):
//!
//! ```sql
//! GRANT SELECT, INSERT, UPDATE ON public.dbmutex_fence TO app_role;
//! GRANT SELECT, INSERT, UPDATE ON mydb.dbmutex_fence TO 'app'@'%';
//! ```
//!
//! # Across failovers
//!
//! Advisory locks and `GET_LOCK` locks are never replicated: a promoted
//! standby starts with none, and an asynchronous one may lack the last
//! token rows (a row at 2 on a standby whose old primary issued 5).
//!
//! - **PostgreSQL**: a token is at least `(timeline - 1) << 40 | 1`, where
//!   `timeline` is the server's current timeline (from the name of its
//!   current WAL file, which a role with no privileges may read; the
//!   checkpoint's `timeline_id` still names the old timeline right after
//!   `pg_ctl promote`), and otherwise the row's last token plus one. Every
//!   promotion starts a new, higher timeline, so every token a promoted
//!   standby issues is greater than every token issued on any earlier
//!   timeline — whatever rows replication lost, and in split brain, while
//!   the superseded primary goes on issuing tokens on its old timeline.
//!   Measured on a private primary and an async standby: tokens 1..5 on
//!   the primary, the standby's row at 2, then `1099511627777` (`1 << 40 |
//!   1`) and up after the promotion. On a server that never failed over
//!   (timeline 1) tokens are the plain counter of earlier versions, so a
//!   table from before keeps its order. A token never goes down on a
//!   server that keeps its row (the timeline only raises the floor).
//!   Assumptions: fewer than 2⁴⁰ tokens per key on one timeline (at 10,000
//!   a second, 3.5 years), else the ordering across a later promotion is
//!   lost (tokens still grow on the server); a restore from a backup
//!   (point-in-time recovery, or any `recovery.signal` / `standby.signal`
//!   recovery that is then promoted) starts a new timeline above every
//!   timeline in its archive's history, and tokens go on above the old
//!   ones; but a copy of a data directory started as it is (or a new
//!   cluster loaded with `pg_dump` output) stays on its old timeline, and
//!   re-issues the tokens issued after the copy was made — as does a
//!   standby promoted in a cluster whose timeline history files were lost.
//!   Managed services that hide `pg_current_wal_lsn()` are not covered
//!   (not tested).
//! - **MySQL / MariaDB** have no timeline: tokens are one counter per key
//!   on the server that issues them. A replica promoted with replication
//!   lag re-issues tokens the old primary issued after the replica's last
//!   applied transaction, and in split brain both servers issue the same
//!   numbers. Tokens are only ordered across a promotion when the replica
//!   has applied every token row (semi-synchronous replication
//!   acknowledged `AFTER_SYNC`, and the old primary fenced off first).
//! - **local**: one host, no failover.
//!
//! A database whose `public` schema was dropped needs it back (`CREATE
//! SCHEMA public`) for fencing. Earlier versions created the table in
//! the first schema of the `search_path`; the library refuses to create
//! `public.dbmutex_fence` while such a table is on the path, and says how
//! to move it (`ALTER TABLE s.dbmutex_fence SET SCHEMA public`), so that
//! tokens go on from the last ones.
//!
//! Tokens are as durable as the server's commits: with PostgreSQL
//! `synchronous_commit = off`, or MySQL `innodb_flush_log_at_trx_commit`
//! other than 1, a server crash may forget the last tokens issued, and
//! hand them out again.

use std::sync::atomic::{AtomicU64, Ordering};

/// The table that issues PostgreSQL fencing tokens (what `dbmutex init`
/// runs).
pub const POSTGRES_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS public.dbmutex_fence (lock_key text PRIMARY KEY, token bigint NOT NULL)";

/// The table that issues MySQL / MariaDB fencing tokens (what `dbmutex
/// init` runs). The key is binary: MariaDB's lock strings are
/// case-sensitive, and at most 192 bytes (MySQL 8: 64 characters).
pub const MYSQL_TABLE: &str = "CREATE TABLE IF NOT EXISTS dbmutex_fence \
     (lock_key VARBINARY(512) NOT NULL PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB";

/// What the library tells a role that may not create or write the table.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn no_table_help(what: &str) -> String {
    format!(
        "fencing tokens need the table dbmutex_fence, and this role cannot {what} it: \
         run `dbmutex init --database-url URL` (or the statement in dbmutex::fence) as a role that may, \
         then grant SELECT, INSERT, UPDATE on dbmutex_fence to this one"
    )
}

/// The check of a resource that lives in memory (or one process): accepts
/// a token no lower than the highest it has accepted, and remembers the
/// highest. The same rule as the SQL check in the [module docs](self).
///
/// ```
/// use dbmutex::fence::FenceGate;
/// let gate = FenceGate::new();
/// assert!(gate.admit(7));  // holder with token 7 writes
/// assert!(gate.admit(7));  // and writes again
/// assert!(gate.admit(9));  // a later holder writes
/// assert!(!gate.admit(7)); // the stale holder is refused
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: AtomicU64,
}

impl FenceGate {
    /// A gate that has seen no token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a write under `token` may go ahead: `token` is at least the
    /// highest admitted so far (which it then becomes). Do the write only
    /// after a `true`, and under the same exclusion as this check when
    /// writes can race (a gate per resource, checked inside its mutex).
    pub fn admit(&self, token: u64) -> bool {
        self.highest.fetch_max(token, Ordering::AcqRel) <= token
    }

    /// The highest token admitted (0 before any).
    pub fn highest(&self) -> u64 {
        self.highest.load(Ordering::Acquire)
    }
}
