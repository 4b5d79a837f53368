//! How driver errors and results read: error mapping and row helpers.

use tokio_postgres::error::SqlState;

use crate::{Error, LockName, Result};

/// Maps a driver error met while acquiring `name`.
pub(crate) fn db_err(e: tokio_postgres::Error, name: &LockName) -> Error {
    match e.code() {
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED => Error::Deadlock {
            name: name.to_string(),
            source: Box::new(e),
        },
        Some(c) if *c == SqlState::OUT_OF_MEMORY => Error::LockTableFull(Box::new(e)),
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW =>
        {
            Error::Connect(Box::new(e))
        }
        _ if e.is_closed() => Error::Connect(Box::new(e)),
        _ => Error::Database(Box::new(e)),
    }
}

/// The server ended the session (terminated, shutting down): its locks are gone.
pub(crate) fn is_session_end(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CRASH_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW
    })
}

pub(crate) fn is_lock_timeout(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
}

/// The first boolean of a `query_typed` result.
pub(crate) fn first_bool(rows: &[tokio_postgres::Row]) -> Result<bool> {
    rows.first()
        .and_then(|r| r.try_get::<_, bool>(0).ok())
        .ok_or_else(|| Error::Database("the lock function returned no boolean".into()))
}

/// The first text value of a simple-query batch result.
pub(crate) fn first_text(msgs: &[tokio_postgres::SimpleQueryMessage]) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
        _ => None,
    })
}

/// How many rows a simple-query batch returned.
pub(crate) fn row_count(msgs: &[tokio_postgres::SimpleQueryMessage]) -> usize {
    msgs.iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count()
}
