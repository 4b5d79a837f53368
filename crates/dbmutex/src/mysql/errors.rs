//! How MySQL/MariaDB errors become dbmutex errors.

use std::time::Duration;

use super::conn::RunError;
use crate::{Error, LockName};

/// MariaDB `ER_LOCK_DEADLOCK` and MySQL 8 `ER_USER_LOCK_DEADLOCK`.
const DEADLOCK_CODES: [u16; 2] = [1213, 3058];
/// MariaDB `ER_TOO_LONG_IDENT` and MySQL 8 `ER_USER_LOCK_WRONG_NAME`.
const BAD_NAME_CODES: [u16; 2] = [1059, 3057];

/// How one `GET_LOCK` call failed.
pub(crate) enum Fail {
    Driver(mysql_async::Error),
    /// No answer within this long.
    NoAnswer(Duration),
}

pub(crate) fn fail_err(f: Fail, name: &LockName) -> Error {
    match f {
        Fail::Driver(e) => db_err(e, name),
        Fail::NoAnswer(bound) => Error::Connect(
            format!(
                "GET_LOCK for {name:?} got no answer within {bound:?} (its timeout plus the keepalive \
                 margin); the connection was treated as dead and closed"
            )
            .into(),
        ),
    }
}

/// Maps a driver error met while working on `name`.
pub(crate) fn db_err(e: mysql_async::Error, name: &LockName) -> Error {
    match &e {
        mysql_async::Error::Server(s) if DEADLOCK_CODES.contains(&s.code) => Error::Deadlock {
            name: name.to_string(),
            source: Box::new(e),
        },
        mysql_async::Error::Server(s) if BAD_NAME_CODES.contains(&s.code) => {
            Error::InvalidName(format!("the server rejected the lock string for {name:?}: {e}"))
        }
        mysql_async::Error::Server(_) => Error::Database(Box::new(e)),
        // The connection is gone or unusable.
        _ => Error::Connect(Box::new(e)),
    }
}

pub(crate) fn null_err(lock: &str) -> Error {
    Error::Database(
        format!(
            "GET_LOCK({lock:?}) returned NULL: the statement was killed, or the server rejected the name \
             or the timeout"
        )
        .into(),
    )
}

pub(crate) fn run_err(e: RunError, name: &LockName) -> Error {
    match e {
        RunError::Connect(e) => e,
        RunError::Query(e) => db_err(e, name),
    }
}
