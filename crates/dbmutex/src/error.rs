//! The error type.

use std::time::Duration;

/// Everything that can go wrong in dbmutex.
///
/// Contention is not an error: `try_*` and bounded waits return `Ok(None)`
/// (or [`Outcome::NotAcquired`](crate::Outcome::NotAcquired)) when someone
/// else holds the lock. [`Error::NotAcquired`] appears only where the caller
/// asked for "not acquired" to be an error.
///
/// No variant's `Display` or `Debug`, nor any source's, contains a
/// password: a connection string appears only as
/// [`redact_url`](crate::redact_url) describes it (`postgres://user@host:port/db`,
/// rebuilt from the driver's parse), drivers' complaints about a malformed
/// string are reworded without the values they quote, and a URL the driver
/// would misread (part of the password taken for the host or database) is
/// refused with [`Error::Config`] before anything is sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name cannot name a lock (empty, NUL byte, too long).
    #[error("invalid lock name: {0}")]
    InvalidName(String),
    /// The URL or another setting is malformed, or the URL is ambiguous
    /// (the message says which characters to percent-encode).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The backend cannot do what was asked; the message says what to use instead.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The lock was not acquired within the wait the caller chose
    /// (only from the calls that make this an error).
    #[error("lock {name:?} not acquired within {waited:?}")]
    NotAcquired {
        /// The lock's name.
        name: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// The server detected a deadlock and chose this waiter as the victim
    /// (PostgreSQL SQLSTATE 40P01, MariaDB 1213, MySQL 3058). Locks this
    /// session already held stay held.
    #[error("deadlock detected while waiting for lock {name:?}")]
    Deadlock {
        /// The lock's name.
        name: String,
        /// The server's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The connection that held the lock is gone, so the server has freed it.
    #[error("lock {name:?} was lost: its database connection is gone")]
    LockLost {
        /// The lock's name.
        name: String,
    },
    /// The locker already holds as many locks as its configured cap allows.
    #[error("this locker already holds {limit} locks, its cap (see LockerBuilder::max_locks)")]
    TooManyLocks {
        /// The cap.
        limit: usize,
    },
    /// PostgreSQL's shared lock table is full (SQLSTATE 53200). While it is
    /// full every session's queries fail; release locks or raise
    /// `max_locks_per_transaction` on the server.
    #[error("the server's lock table is full (SQLSTATE 53200): raise max_locks_per_transaction or hold fewer locks")]
    LockTableFull(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Taking one more lock would bring the server's shared lock table
    /// (PostgreSQL) past dbmutex's budget: three quarters of
    /// `max_locks_per_transaction × (max_connections +
    /// max_prepared_transactions)`, counted over every session of the
    /// server. dbmutex refuses here, well before the table is full (when
    /// every client of the server would fail). Release locks, or raise
    /// `max_locks_per_transaction` on the server.
    #[error(
        "the server's lock table holds {used} entries; dbmutex takes no lock past {limit} \
         (3/4 of max_locks_per_transaction x (max_connections + max_prepared_transactions) = {capacity}), \
         so that the table never fills: release locks or raise max_locks_per_transaction"
    )]
    ServerLockBudget {
        /// Entries in the server's lock table when counted.
        used: u64,
        /// The budget for the whole server.
        limit: u64,
        /// The table's size by the server's settings.
        capacity: u64,
    },
    /// Connecting failed: server unreachable, refused, TLS, or authentication.
    #[error("cannot connect to the database: {}", chain(.0.as_ref()))]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Any other database error; [`Error::sqlstate`] gives its code.
    #[error("database error: {}", chain(.0.as_ref()))]
    Database(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A local-backend I/O error (lock directory, lock file).
    #[error("lock file error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The SQLSTATE (PostgreSQL) or SQL state (MySQL) behind this error, if any.
    pub fn sqlstate(&self) -> Option<String> {
        let src: &(dyn std::error::Error + 'static) = match self {
            Error::Deadlock { source, .. } => source.as_ref(),
            Error::LockTableFull(e) | Error::Connect(e) | Error::Database(e) => e.as_ref(),
            _ => return None,
        };
        #[cfg(feature = "postgres")]
        if let Some(e) = src.downcast_ref::<tokio_postgres::Error>() {
            return e.code().map(|c| c.code().to_owned());
        }
        #[cfg(feature = "mysql")]
        if let Some(mysql_async::Error::Server(e)) = src.downcast_ref::<mysql_async::Error>() {
            return Some(e.state.clone());
        }
        let _ = src;
        None
    }

    /// True for [`Error::Deadlock`].
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Error::Deadlock { .. })
    }

    /// True when the error is about reaching the server (connect failed or
    /// the connection was lost), as opposed to a bad request.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connect(_) | Error::LockLost { .. })
    }
}

/// An error and its sources in one line ("db error: FATAL: terminating
/// connection ..."): drivers put the server's words in the source.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = c.source();
    }
    out
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
