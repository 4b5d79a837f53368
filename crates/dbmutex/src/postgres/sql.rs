//! Statement text for advisory-lock calls.
//!
//! Keys are integers and are either bound as parameters or inlined as
//! decimal numbers; the only text from the caller is the lock name, which
//! appears solely inside an SQL comment escaped by [`key::sql_comment`].

use tokio_postgres::types::{ToSql, Type};

use crate::key::{self, PgKey};
use crate::{LockName, Mode};

/// Which advisory-lock function.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Call {
    /// `pg_try_advisory[_xact]_lock[_shared]`: returns a boolean at once.
    Try,
    /// `pg_advisory[_xact]_lock[_shared]`: blocks in the server.
    Wait,
    /// `pg_advisory_unlock[_shared]`.
    Unlock,
}

/// The function name for a call.
pub(crate) fn function(call: Call, xact: bool, mode: Mode) -> String {
    let shared = if mode == Mode::Shared { "_shared" } else { "" };
    let xact = if xact { "_xact" } else { "" };
    match call {
        Call::Try => format!("pg_try_advisory{xact}_lock{shared}"),
        Call::Wait => format!("pg_advisory{xact}_lock{shared}"),
        Call::Unlock => format!("pg_advisory_unlock{shared}"),
    }
}

/// `SELECT fn($1[, $2]) /* name */` with its typed parameters, for
/// `query_typed` (one round trip, no prepared statement).
pub(crate) fn bound(call: Call, xact: bool, mode: Mode, key: &PgKey, name: &LockName) -> (String, Params) {
    bound_commented(call, xact, mode, key, &key::sql_comment(name))
}

/// As [`bound`], with the comment already escaped by [`key::sql_comment`].
pub(crate) fn bound_commented(
    call: Call,
    xact: bool,
    mode: Mode,
    key: &PgKey,
    comment: &str,
) -> (String, Params) {
    let f = function(call, xact, mode);
    match *key {
        PgKey::Pair(a, b) => (format!("SELECT {f}($1, $2) /* {comment} */"), Params::Pair(a, b)),
        PgKey::Big(k) => (format!("SELECT {f}($1) /* {comment} */"), Params::Big(k)),
    }
}

/// `SELECT fn($1[, $2])` with no comment: the same text for every name, so
/// it can be prepared once per connection.
pub(crate) fn bound_plain(call: Call, xact: bool, mode: Mode, key: &PgKey) -> (String, Params) {
    let f = function(call, xact, mode);
    match *key {
        PgKey::Pair(a, b) => (format!("SELECT {f}($1, $2)"), Params::Pair(a, b)),
        PgKey::Big(k) => (format!("SELECT {f}($1)"), Params::Big(k)),
    }
}

/// `SELECT fn(k1, k2) /* name */` with the integers inlined, for simple-query
/// batches.
pub(crate) fn inline(call: Call, xact: bool, mode: Mode, key: &PgKey, name: &LockName) -> String {
    format!(
        "SELECT {}({}) /* {} */",
        function(call, xact, mode),
        key.sql_args(),
        key::sql_comment(name)
    )
}

/// `lock_timeout` value for a wait bound: whole milliseconds, at least 1
/// (0 would mean "no timeout"), at most the server's maximum (about 24.8
/// days; a longer bound waits that long).
pub(crate) fn lock_timeout_ms(d: std::time::Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000).clamp(1, i32::MAX as u128)
}

/// `lock_timeout` for a wait: the bound in milliseconds, or `0` (no
/// timeout) for a wait without one.
pub(crate) fn wait_ms(timeout: Option<std::time::Duration>) -> u128 {
    timeout.map_or(0, lock_timeout_ms)
}

/// Typed parameters of a bound statement.
pub(crate) enum Params {
    Pair(i32, i32),
    Big(i64),
}

impl Params {
    /// The parameters that bind `key`.
    pub(crate) fn of(key: &PgKey) -> Params {
        match *key {
            PgKey::Pair(a, b) => Params::Pair(a, b),
            PgKey::Big(k) => Params::Big(k),
        }
    }

    /// As `query_typed` wants them.
    pub(crate) fn as_typed(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        match self {
            Params::Pair(a, b) => vec![(a as &(dyn ToSql + Sync), Type::INT4), (b, Type::INT4)],
            Params::Big(k) => vec![(k as &(dyn ToSql + Sync), Type::INT8)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names() {
        assert_eq!(
            function(Call::Try, false, Mode::Exclusive),
            "pg_try_advisory_lock"
        );
        assert_eq!(
            function(Call::Wait, true, Mode::Shared),
            "pg_advisory_xact_lock_shared"
        );
        assert_eq!(
            function(Call::Unlock, false, Mode::Shared),
            "pg_advisory_unlock_shared"
        );
        let (s, _) = bound(
            Call::Try,
            false,
            Mode::Exclusive,
            &PgKey::Pair(1, 2),
            &"a*/b".into(),
        );
        assert_eq!(s, "SELECT pg_try_advisory_lock($1, $2) /* a--b */");
        assert_eq!(
            inline(Call::Wait, false, Mode::Exclusive, &PgKey::Big(-5), &"x".into()),
            "SELECT pg_advisory_lock(-5) /* x */"
        );
    }

    #[test]
    fn timeouts_round_up() {
        assert_eq!(lock_timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(lock_timeout_ms(Duration::from_millis(300)), 300);
        assert_eq!(lock_timeout_ms(Duration::from_micros(300_500)), 301);
        assert_eq!(lock_timeout_ms(Duration::MAX), i32::MAX as u128);
    }
}
