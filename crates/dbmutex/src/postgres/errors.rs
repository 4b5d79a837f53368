//! How driver errors and results read: error mapping and row helpers.

use tokio_postgres::error::SqlState;

use crate::{Error, LockName, Result};

/// The message when a transaction landed on a server session that another
/// dbmutex client holds session locks on (behind a pooler): its session
/// locks would be re-entrant for our transaction lock there.
pub(crate) const SESSION_OF_ANOTHER: &str = "this transaction runs on a server session that another \
     dbmutex client holds session locks on (a pooler shares server sessions, and some client took \
     session locks through it): a transaction lock there would not exclude that client. Use \
     transaction locks only (LockOptions::transaction(true)) for every client behind this pooler";

/// A failed statement, as either driver reports it.
pub(crate) struct Failure {
    /// The SQLSTATE, when the server answered with an error.
    pub(crate) code: Option<String>,
    /// The connection is gone.
    pub(crate) closed: bool,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync>,
}

/// Maps a driver error met while acquiring `name`.
pub(crate) fn db_err(e: tokio_postgres::Error, name: &LockName) -> Error {
    map_failure(failure(e), name)
}

/// A driver error as the driver-neutral [`Failure`].
pub(crate) fn failure(e: tokio_postgres::Error) -> Failure {
    Failure {
        code: e.code().map(|c| c.code().to_owned()),
        closed: e.is_closed(),
        source: Box::new(e),
    }
}

/// Maps a failed statement (of either driver) met while acquiring `name`.
pub(crate) fn map_failure(f: Failure, name: &LockName) -> Error {
    let code = f.code.as_deref().unwrap_or("");
    if code == SqlState::T_R_DEADLOCK_DETECTED.code() {
        Error::Deadlock {
            name: name.to_string(),
            source: f.source,
        }
    } else if code == SqlState::OUT_OF_MEMORY.code() {
        Error::LockTableFull(f.source)
    } else if [
        &SqlState::ADMIN_SHUTDOWN,
        &SqlState::CRASH_SHUTDOWN,
        &SqlState::CANNOT_CONNECT_NOW,
    ]
    .iter()
    .any(|c| c.code() == code)
        || f.closed
    {
        Error::Connect(f.source)
    } else {
        Error::Database(f.source)
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
