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
    /// The lock was held longer than its
    /// [`LockOptions::max_hold`](crate::LockOptions::max_hold) (from a scoped
    /// call, which then stopped its closure and released the lock).
    #[error("lock {name:?} was held past its max_hold of {max_hold:?}")]
    MaxHoldExceeded {
        /// The lock's name.
        name: String,
        /// The limit.
        max_hold: Duration,
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
    /// The message includes the driver's whole error chain, so `source()`
    /// is `None` (each cause is said once, by `{}` and by `{:#}` alike);
    /// [`Error::cause`] gives the driver's error.
    #[error("cannot connect to the database: {}", chain(.0.as_ref()))]
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// Any other database error; [`Error::sqlstate`] gives its code. As for
    /// [`Error::Connect`], the message carries the cause.
    #[error("database error: {}", chain(.0.as_ref()))]
    Database(Box<dyn std::error::Error + Send + Sync>),
    /// A local-backend I/O error (lock directory, lock file); the message
    /// carries the cause.
    #[error("lock file error: {}", chain(.0))]
    Io(std::io::Error),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
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
        #[cfg(feature = "sqlx")]
        if let Some(e) = src.downcast_ref::<sqlx::Error>() {
            return e
                .as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned());
        }
        let _ = src;
        None
    }

    /// The driver's (or the operating system's) error behind this one, to
    /// downcast (`tokio_postgres::Error`, `mysql_async::Error`,
    /// `sqlx::Error`, `std::io::Error`). For [`Error::Deadlock`] and
    /// [`Error::LockTableFull`] it is also their `source()`.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Deadlock { source, .. } => Some(source.as_ref()),
            Error::LockTableFull(e) | Error::Connect(e) | Error::Database(e) => Some(e.as_ref()),
            Error::Io(e) => Some(e),
            _ => None,
        }
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
/// connection ..."): drivers put the server's words in the source. A source
/// whose words are already there is skipped, and a segment repeated right
/// after itself is said once (mysql_async nests "Input/output error: " in
/// two of its types).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
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
    let mut segments: Vec<&str> = Vec::new();
    for s in out.split(": ") {
        if segments.last() != Some(&s) {
            segments.push(s);
        }
    }
    segments.join(": ")
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// `outer: inner`, the way mysql_async's `Error::Io` shows its `IoError`.
    #[derive(Debug)]
    struct Nested(&'static str, Option<Box<Nested>>);
    impl std::fmt::Display for Nested {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match &self.1 {
                Some(inner) => write!(f, "{}: {inner}", self.0),
                None => f.write_str(self.0),
            }
        }
    }
    impl std::error::Error for Nested {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    /// What `{:#}` (anyhow) and error reporters print: the message, then
    /// every source.
    fn report(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            out.push_str(": ");
            out.push_str(&c.to_string());
            cur = c.source();
        }
        out
    }

    #[test]
    fn every_cause_is_said_once() {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let mysql_like = || {
            Nested(
                "Input/output error",
                Some(Box::new(Nested(
                    "Input/output error",
                    Some(Box::new(Nested("Connection refused", None))),
                ))),
            )
        };
        let errors = [
            Error::Connect(Box::new(refused())),
            Error::Connect(Box::new(mysql_like())),
            Error::Database(Box::new(mysql_like())),
            Error::Io(refused()),
            Error::Deadlock {
                name: "x".into(),
                source: Box::new(Nested("process 7 waits for process 8", None)),
            },
            Error::LockTableFull(Box::new(Nested("out of shared memory", None))),
        ];
        for e in &errors {
            let r = report(e);
            for word in [
                "Connection refused",
                "Input/output error",
                "deadlock detected",
                "out of shared memory",
            ] {
                assert!(r.matches(word).count() <= 1, "{word:?} twice in {r:?}");
            }
            assert!(e.cause().is_some(), "{e:?} hides its cause");
        }
        assert_eq!(
            errors[1].to_string(),
            "cannot connect to the database: Input/output error: Connection refused"
        );
    }
}
