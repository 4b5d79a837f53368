//! Once-per-window runs: "this job runs at most once an hour across the
//! fleet", which no lock released at the end of the job can give on its own.
//!
//! Under the lock, [`LockGuard::start_run`](crate::LockGuard::start_run)
//! reads the name's last start. If it was less than the window, minus its
//! [`grace`], ago — by the **database server's clock**, never the
//! client's — the run is not due
//! ([`RunStart::NotDue`] says when and where it last started). Otherwise it
//! records a new start (time, host, process id) and the caller runs the
//! job, then records its end with
//! [`LockGuard::finish_run`](crate::LockGuard::finish_run). Both statements
//! run on the lock's own session while the lock is held, so two workers on
//! a "cron tick" never both find the run due: the first records its start
//! before it releases the lock, and every later one finds it.
//! [`Locker::once_per`](crate::Locker::once_per) does all of this around a
//! closure; `dbmutex run --once-per 1h NAME -- CMD` around a command.
//!
//! ```no_run
//! # async fn demo() -> dbmutex::Result<()> {
//! use std::time::Duration;
//! use dbmutex::{LockOptions, Locker};
//! use dbmutex::runs::OncePer;
//!
//! let locker = Locker::connect("postgres://app@127.0.0.1/app").await?;
//! let hour = Duration::from_secs(3600);
//! match locker.once_per("nightly-report", hour, &LockOptions::new(), || async {
//!     // the job
//! }).await? {
//!     OncePer::Ran(()) => println!("ran"),
//!     OncePer::NotDue(last) => println!("ran {:?} ago on {}", last.ago, last.host),
//!     OncePer::NotAcquired => println!("busy"),
//! }
//! # Ok(()) }
//! ```
//!
//! **The grace.** A run is due once the last one started at least
//! `window - grace(window)` ago, where [`grace`] is half the window, at most
//! one minute. Cron fires late by a varying amount (its jitter), and hosts
//! whose clocks differ fire one tick at different moments: without a grace,
//! a window equal to the cron period skips every tick that fires a little
//! earlier after its predecessor than the one before. With it, a window
//! equal to the period runs once per tick as long as one tick's starts on
//! all hosts (jitter plus clock differences) spread over less than the
//! grace. The price: a loop that asks every few seconds runs once per
//! `window - grace`, not once per window.
//!
//! **What counts** is the last *start*: a run that failed or never finished
//! (its process was killed) still fills its window. The record keeps how
//! it ended ([`LastRun::exit_code`], [`LastRun::finished_at`]) for
//! `dbmutex status` to show.
//!
//! # Where runs are recorded
//!
//! - **PostgreSQL**: the table [`POSTGRES_TABLE`] creates, one row per key
//!   ([`Locker::key_of`](crate::Locker::key_of)'s text), in the same schema
//!   as `dbmutex_fence`; times are `clock_timestamp()`.
//! - **MySQL / MariaDB**: the table [`MYSQL_TABLE`], in the connection's
//!   database; times are `UTC_TIMESTAMP(6)`.
//! - **local**: `<lock file>.run` beside the lock file, rewritten while the
//!   lock is held. Ages are measured on the kernel's boot clock
//!   (`CLOCK_BOOTTIME`, read from `/proc/uptime`), which no process can set
//!   or fake and a wall clock stepped by NTP does not move; a record from
//!   an earlier boot is aged by the wall clock. The file is readable and
//!   writable by every user (mode 0666), as the lock directory is shared.
//!
//! The library creates the tables on first use. A role that may not create
//! tables needs them created once (`dbmutex init --database-url URL`, or
//! [`Locker::create_tables`](crate::Locker::create_tables)) and then:
//!
//! ```sql
//! GRANT SELECT, INSERT, UPDATE ON dbmutex_runs TO app_role;        -- PostgreSQL
//! GRANT SELECT, INSERT, UPDATE ON mydb.dbmutex_runs TO 'app'@'%';  -- MySQL
//! ```
//!
//! A server clock set back makes the last run look recent (not due until
//! the clock passes it again); one set forward makes it look old.

use std::time::{Duration, SystemTime};

/// The table that records PostgreSQL runs (what `dbmutex init` runs).
pub const POSTGRES_TABLE: &str = "CREATE TABLE IF NOT EXISTS dbmutex_runs (\
     lock_key text PRIMARY KEY, lock_name text NOT NULL, run bigint NOT NULL, \
     started_at timestamptz NOT NULL, host text NOT NULL, pid bigint NOT NULL, \
     finished_at timestamptz, exit_code integer)";

/// The table that records MySQL / MariaDB runs (what `dbmutex init` runs).
/// Times are UTC.
pub const MYSQL_TABLE: &str = "CREATE TABLE IF NOT EXISTS dbmutex_runs (\
     lock_key VARBINARY(512) NOT NULL PRIMARY KEY, lock_name VARBINARY(1024) NOT NULL, \
     run BIGINT UNSIGNED NOT NULL, started_at DATETIME(6) NOT NULL, host VARCHAR(255) NOT NULL, \
     pid BIGINT NOT NULL, finished_at DATETIME(6) NULL, exit_code INT NULL) ENGINE=InnoDB";

/// The last recorded start of a name, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LastRun {
    /// How many runs have started under this name; this one's number.
    pub run: u64,
    /// When it started (the server's clock).
    pub started_at: SystemTime,
    /// How long ago it started, by the server's clock when it was read
    /// (zero if the server's clock has since been set back before it).
    pub ago: Duration,
    /// The host that ran it.
    pub host: String,
    /// The process id that recorded the start (`dbmutex run`'s own).
    pub pid: u32,
    /// When it finished; `None` while it runs, or if it never recorded its
    /// end (killed, or its lock was lost).
    pub finished_at: Option<SystemTime>,
    /// Its exit status as recorded ([`Locker::once_per`](crate::Locker::once_per)
    /// records 0).
    pub exit_code: Option<i32>,
}

/// A run that [`LockGuard::start_run`](crate::LockGuard::start_run)
/// recorded as started; give it to
/// [`LockGuard::finish_run`](crate::LockGuard::finish_run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub(crate) run: u64,
}

impl Run {
    /// How many runs have started under this name; this one's number.
    pub fn number(&self) -> u64 {
        self.run
    }
}

/// What [`LockGuard::start_run`](crate::LockGuard::start_run) found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunStart {
    /// Due: its start is recorded; run, then record the end.
    Due(Run),
    /// Not due: the last run started less than the window ago.
    NotDue(LastRun),
}

/// What [`Locker::once_per`](crate::Locker::once_per) did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum OncePer<T> {
    /// It ran the closure, which returned this.
    Ran(T),
    /// The last run started less than the window ago: the closure did not run.
    NotDue(LastRun),
    /// The lock was not acquired within the wait: the closure did not run.
    NotAcquired,
}

/// Who records a start: this host's name and process id.
#[derive(Clone, Debug)]
pub(crate) struct Who {
    pub(crate) host: String,
    pub(crate) pid: u32,
}

impl Who {
    /// This process, on this host (the kernel's host name; `localhost`
    /// when it cannot be read).
    pub(crate) fn me() -> Who {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        Who {
            host,
            pid: std::process::id(),
        }
    }
}

/// Microseconds since the Unix epoch (what the servers are asked for) as
/// a time; negative ones (before 1970) are clamped to the epoch.
pub(crate) fn from_micros(us: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// A window as whole microseconds (the servers' resolution), saturating.
pub(crate) fn window_micros(window: Duration) -> i64 {
    i64::try_from(window.as_micros()).unwrap_or(i64::MAX)
}

/// A server's answer "started `ago_us` ago" as a duration (a clock set
/// back: zero).
pub(crate) fn ago(ago_us: i64) -> Duration {
    Duration::from_micros(u64::try_from(ago_us).unwrap_or(0))
}

/// How much earlier than a whole `window` after the last start a run is
/// already due: half the window, at most one minute (see the module docs).
pub fn grace(window: Duration) -> Duration {
    (window / 2).min(MAX_GRACE)
}

/// The longest [`grace`]: more than cron's jitter and the clock differences
/// of hosts kept in time, small beside an hourly or daily window.
const MAX_GRACE: Duration = Duration::from_secs(60);

/// Whether a run that started `ago_us` ago (server clock) leaves a new one
/// due under `window`, less its [`grace`]. A start in the future (a clock
/// set back) is recent.
pub(crate) fn due(ago_us: i64, window: Duration) -> bool {
    ago_us >= window_micros(window - grace(window))
}

/// The name as the tables keep it, for the people who read them: at most
/// 1,000 bytes (MySQL's column holds 1,024).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn stored_name(name: &crate::LockName) -> String {
    let mut s = name.to_string();
    if s.len() > 1000 {
        let mut end = 1000;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// What the library tells a role that may not create or write the table.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn no_table_help(what: &str) -> String {
    format!(
        "once-per-window runs need the table dbmutex_runs, and this role cannot {what} it: \
         run `dbmutex init --database-url URL` (or the statement in dbmutex::runs) as a role that may, \
         then grant SELECT, INSERT, UPDATE on dbmutex_runs to this one"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_is_by_the_servers_age_and_a_future_start_is_recent() {
        let hour = Duration::from_secs(3600);
        assert!(due(3_540_000_000, hour), "an hour less the minute of grace");
        assert!(!due(3_539_999_999, hour));
        let two = Duration::from_secs(2);
        assert!(due(1_000_000, two), "half of a short window");
        assert!(!due(999_999, two));
        assert_eq!(grace(Duration::from_secs(90)), Duration::from_secs(45));
        assert!(!due(-5, hour), "a start after now (clock set back) is recent");
        assert!(due(0, Duration::ZERO), "a zero window is always due");
        assert!(!due(i64::MAX - 1, Duration::MAX));
        assert_eq!(ago(-5), Duration::ZERO);
        assert_eq!(from_micros(-1), SystemTime::UNIX_EPOCH);
        assert_eq!(
            from_micros(1_500_000),
            SystemTime::UNIX_EPOCH + Duration::from_millis(1500)
        );
    }

    #[test]
    fn who_names_a_host() {
        let me = Who::me();
        assert!(!me.host.is_empty() && !me.host.contains('\n'));
        assert_eq!(me.pid, std::process::id());
    }
}
