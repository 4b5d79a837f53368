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

/// The condition every lock statement carries, so that nothing is locked
/// where it would not exclude (see `PgConn::claim`; `owner` is SQL: a
/// parameter such as `$3`, or a quoted literal).
///
/// - A session lock runs only on the server session this connection
///   claimed when it connected. Behind a pooler that moved the connection
///   to another server session, the statement returns no row and locks
///   nothing.
/// - A transaction lock (its open transaction pins one server session) runs
///   on a session no other client claimed, or, on one that another client
///   claimed, only if that session holds no session lock on the key: such a
///   lock would be re-entrant for our transaction there. Only the rare
///   second case reads `pg_locks`.
fn guard(xact: bool, key: &PgKey, owner: &str) -> String {
    if xact {
        let (classid, objid, objsubid) = key.pg_locks_ids();
        format!(
            "(coalesce(current_setting('dbmutex.owner', true), '') IN ('', {owner}) \
             OR NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND pid = pg_backend_pid() AND classid = '{classid}'::oid AND objid = '{objid}'::oid AND objsubid = {objsubid}))"
        )
    } else {
        format!("current_setting('dbmutex.owner', true) = {owner}")
    }
}

/// `SELECT fn($1[, $2]) WHERE <guard> /* name */` with its typed parameters,
/// for `query_typed` (one round trip, no prepared statement); without the
/// comment when `name` is `None` (name comments off). `owner` is the
/// connection's claim token (`""` for an unclaimed one).
pub(crate) fn bound<'a>(
    call: Call,
    xact: bool,
    mode: Mode,
    key: &PgKey,
    name: Option<&LockName>,
    owner: &'a str,
) -> (String, Params<'a>) {
    match name {
        Some(name) => bound_commented(call, xact, mode, key, &key::sql_comment(name), owner),
        None => bound_plain(call, xact, mode, key, owner),
    }
}

/// As [`bound`], with the comment already escaped by [`key::sql_comment`].
pub(crate) fn bound_commented<'a>(
    call: Call,
    xact: bool,
    mode: Mode,
    key: &PgKey,
    comment: &str,
    owner: &'a str,
) -> (String, Params<'a>) {
    let (sql, params) = bound_plain(call, xact, mode, key, owner);
    (format!("{sql} /* {comment} */"), params)
}

/// `SELECT fn($1[, $2]) WHERE <guard>` with no comment: the same text for
/// every name, so it can be prepared once per connection.
pub(crate) fn bound_plain<'a>(
    call: Call,
    xact: bool,
    mode: Mode,
    key: &PgKey,
    owner: &'a str,
) -> (String, Params<'a>) {
    let f = function(call, xact, mode);
    let params = Params::of(key, owner);
    let sql = match *key {
        PgKey::Pair(..) => format!("SELECT {f}($1, $2) WHERE {}", guard(xact, key, "$3")),
        PgKey::Big(_) => format!("SELECT {f}($1) WHERE {}", guard(xact, key, "$2")),
    };
    (sql, params)
}

/// A session-lock wait bounded by its own `lock_timeout` in one statement:
/// `SELECT set_config('lock_timeout', $t, true), set_config(
/// 'statement_timeout', '0', true), fn($1[, $2]) WHERE <guard>`, the same
/// text for every name (prepared once per connection), the timeout (`"Nms"`,
/// `"0"`: none) bound last. In autocommit the statement is its own
/// transaction, so the settings end with it; the target list is evaluated
/// in order, so they apply to the wait (observed: DB-FACTS.md).
pub(crate) fn bounded_wait_plain(mode: Mode, key: &PgKey) -> String {
    let f = function(Call::Wait, false, mode);
    let (args, owner, timeout) = match key {
        PgKey::Pair(..) => ("$1, $2", "$3", "$4"),
        PgKey::Big(_) => ("$1", "$2", "$3"),
    };
    format!(
        "SELECT set_config('lock_timeout', {timeout}, true), set_config('statement_timeout', '0', true), \
         {f}({args}) WHERE {}",
        guard(false, key, owner)
    )
}

/// `SELECT fn($1[, $2]) WHERE <guard>` with the claim token inlined, for a
/// server-side `PREPARE` (the token is hex digits: nothing to escape).
pub(crate) fn prepared_body(call: Call, mode: Mode, key: &PgKey, owner: &str) -> String {
    debug_assert!(owner.bytes().all(|b| b.is_ascii_hexdigit()));
    let args = match key {
        PgKey::Big(_) => "$1",
        _ => "$1, $2",
    };
    format!(
        "SELECT {}({args}) WHERE {}",
        function(call, false, mode),
        guard(false, key, &format!("'{owner}'"))
    )
}

/// `SELECT fn(k1, k2) WHERE <guard> /* name */` with the integers and the
/// claim token inlined, for simple-query batches; without the comment when
/// `name` is `None`. The token is hex digits (or empty): nothing to escape.
pub(crate) fn inline(
    call: Call,
    xact: bool,
    mode: Mode,
    key: &PgKey,
    name: Option<&LockName>,
    owner: &str,
) -> String {
    debug_assert!(owner.bytes().all(|b| b.is_ascii_hexdigit()));
    let sql = format!(
        "SELECT {}({}) WHERE {}",
        function(call, xact, mode),
        key.sql_args(),
        guard(xact, key, &format!("'{owner}'"))
    );
    match name {
        Some(name) => format!("{sql} /* {} */", key::sql_comment(name)),
        None => sql,
    }
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

/// Typed parameters of a bound statement: the key, then the claim token.
pub(crate) enum Params<'a> {
    Pair(i32, i32, &'a str),
    Big(i64, &'a str),
}

impl<'a> Params<'a> {
    /// The parameters that bind `key` and the guard's `owner`.
    pub(crate) fn of(key: &PgKey, owner: &'a str) -> Params<'a> {
        match *key {
            PgKey::Pair(a, b) => Params::Pair(a, b, owner),
            PgKey::Big(k) => Params::Big(k, owner),
        }
    }

    /// As `query` wants them, without an allocation: the values, of which
    /// the first `n` count.
    pub(crate) fn values(&self) -> ([&(dyn ToSql + Sync); 3], usize) {
        match self {
            Params::Pair(a, b, o) => ([a, b, o], 3),
            Params::Big(k, o) => ([k, o, o], 2),
        }
    }

    /// As `query_typed` wants them.
    pub(crate) fn as_typed(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        match self {
            Params::Pair(a, b, o) => vec![
                (a as &(dyn ToSql + Sync), Type::INT4),
                (b, Type::INT4),
                (o, Type::TEXT),
            ],
            Params::Big(k, o) => vec![(k as &(dyn ToSql + Sync), Type::INT8), (o, Type::TEXT)],
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
            Some(&"a*/b".into()),
            "ab12",
        );
        assert_eq!(
            s,
            "SELECT pg_try_advisory_lock($1, $2) WHERE current_setting('dbmutex.owner', true) = $3 /* a--b */"
        );
        assert_eq!(
            inline(
                Call::Wait,
                false,
                Mode::Exclusive,
                &PgKey::Big(-5),
                Some(&"x".into()),
                "ab12"
            ),
            "SELECT pg_advisory_lock(-5) WHERE current_setting('dbmutex.owner', true) = 'ab12' /* x */"
        );
        assert_eq!(
            inline(Call::Wait, false, Mode::Exclusive, &PgKey::Big(-5), None, "ab12"),
            "SELECT pg_advisory_lock(-5) WHERE current_setting('dbmutex.owner', true) = 'ab12'",
            "name comments off: no comment"
        );
        assert!(inline(Call::Wait, true, Mode::Exclusive, &PgKey::Big(-5), Some(&"x".into()), "")
            .starts_with("SELECT pg_advisory_xact_lock(-5) WHERE (coalesce(current_setting('dbmutex.owner', true), '') IN ('', '') OR NOT EXISTS"));
    }

    #[test]
    fn prepared_bodies_inline_only_the_token() {
        assert_eq!(
            prepared_body(Call::Try, Mode::Shared, &PgKey::Pair(1, 2), "ab12"),
            "SELECT pg_try_advisory_lock_shared($1, $2) WHERE current_setting('dbmutex.owner', true) = 'ab12'"
        );
        assert_eq!(
            prepared_body(Call::Unlock, Mode::Exclusive, &PgKey::Big(9), "ab12"),
            "SELECT pg_advisory_unlock($1) WHERE current_setting('dbmutex.owner', true) = 'ab12'"
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
