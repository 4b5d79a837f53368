//! Statement text for advisory-lock calls.
//!
//! Keys are integers and are either bound as parameters or inlined as
//! decimal numbers; the only text from the caller is the lock name, which
//! appears solely inside an SQL comment escaped by [`key::sql_comment`].

use std::borrow::Cow;

use tokio_postgres::types::{ToSql, Type};

use crate::core::wait::Deadline;
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

/// What puts a bounded wait's settings back, so that they read as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Within {
    /// Autocommit: the statement's own transaction, or a batch's implicit
    /// one, ends them.
    Autocommit,
    /// A transaction the batch begins (`BEGIN`) on a connection of its own:
    /// set back to the session's values after the wait.
    NewTransaction,
    /// A transaction the caller has open: the wait runs in a savepoint, the
    /// values before are read first (its first two rows) and put back with
    /// [`restore_settings`]; after a failure, [`ROLLBACK_WAIT`] recovers the
    /// transaction.
    OpenTransaction,
}

/// How a bounded wait's text carries the key, the claim token and the bound.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Form {
    /// One statement, preparable: the key `$1[, $2]` and the bound
    /// ([`lock_timeout`]) next; the claim token (if guarded) inlined, as a
    /// connection's prepared statements are its own (one parameter fewer
    /// to encode and bind on every wait). Autocommit only.
    Bound,
    /// A simple-protocol batch with everything inlined, the bound read from
    /// the deadline here, as the text is built.
    Inline(Deadline),
}

/// A wait in the server bounded by its own `lock_timeout`, with
/// `statement_timeout` off for it (a role's or database's defaults must not
/// cut short the wait the caller chose), the settings reading as before
/// afterwards. The one recipe for every such wait: [`Self::text`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct BoundedWait<'a> {
    /// A transaction-level lock (else a session lock).
    pub(crate) xact: bool,
    pub(crate) mode: Mode,
    pub(crate) key: &'a PgKey,
    /// The claim token of the guard the statement carries ([`guard`]; in
    /// [`Form::Bound`] it is bound, not inlined); `None`: no guard (a
    /// session lock on a caller's own connection).
    pub(crate) claim: Option<&'a str>,
    /// The name, in a comment (`None`: name comments off).
    pub(crate) comment: Option<&'a LockName>,
    pub(crate) within: Within,
    pub(crate) form: Form,
}

/// The statement that ends a caller's failed wait ([`Within::OpenTransaction`]):
/// the transaction, its settings and its other locks are as before the wait.
pub(crate) const ROLLBACK_WAIT: &str = "ROLLBACK TO SAVEPOINT dbmutex_wait; RELEASE SAVEPOINT dbmutex_wait";

impl BoundedWait<'_> {
    /// The text. In a batch the settings are a statement of their own before
    /// the lock's: PostgreSQL starts a statement's `statement_timeout` when
    /// the statement starts, and a batch's next statement starts afresh.
    /// [`Form::Bound`] sets them in the lock statement's target list, which
    /// is evaluated in order (observed: DB-FACTS.md): `lock_timeout` applies
    /// to the wait, but a `statement_timeout` already running for the
    /// statement goes on: a session whose claim found one in force waits
    /// with the batch instead (`waits.rs`).
    pub(crate) fn text(&self) -> String {
        let f = function(Call::Wait, self.xact, self.mode);
        let comment = self
            .comment
            .map(|n| format!(" /* {} */", key::sql_comment(n)))
            .unwrap_or_default();
        let guard = self
            .claim
            .map(|owner| {
                debug_assert!(owner.bytes().all(|b| b.is_ascii_hexdigit()));
                format!(" WHERE {}", guard(self.xact, self.key, &format!("'{owner}'")))
            })
            .unwrap_or_default();
        let Form::Inline(deadline) = self.form else {
            debug_assert!(self.within == Within::Autocommit && !self.xact);
            let (args, bound) = match self.key {
                PgKey::Pair(..) => ("$1, $2", 3),
                PgKey::Big(_) => ("$1", 2),
            };
            let set = settings(&format!("${bound}"));
            return format!("SELECT {set}, {f}({args}){guard}{comment}");
        };
        let set = format!("SELECT {}", settings(&format!("'{}'", lock_timeout(deadline))));
        let lock = format!("SELECT {f}({}){guard}{comment}", self.key.sql_args());
        match self.within {
            Within::Autocommit => format!("{set}; {lock}"),
            Within::NewTransaction => format!(
                "BEGIN; {set}; {lock}; SET LOCAL lock_timeout TO DEFAULT; SET LOCAL statement_timeout TO DEFAULT"
            ),
            Within::OpenTransaction => format!(
                "SAVEPOINT dbmutex_wait; SELECT current_setting('lock_timeout'); \
                 SELECT current_setting('statement_timeout'); {set}; {lock}; RELEASE SAVEPOINT dbmutex_wait"
            ),
        }
    }

    /// How many rows the text answers when the lock statement ran (fewer:
    /// the claim guard refused it on a session that is not ours).
    pub(crate) fn rows(&self) -> usize {
        match (self.form, self.within) {
            (Form::Bound, _) => 1,
            (_, Within::OpenTransaction) => 4,
            _ => 2,
        }
    }
}

/// The two transaction-local settings of a bounded wait, `lock_timeout`
/// from `bound` (SQL: a parameter or a literal).
fn settings(bound: &str) -> String {
    format!("set_config('lock_timeout', {bound}, true), set_config('statement_timeout', '0', true)")
}

/// `lock_timeout` for a wait until `deadline`: what is left in whole
/// milliseconds (rounded up, at least 1: 0 would mean "no timeout"), at
/// most the server's maximum (about 24.8 days; a longer bound waits that
/// long), or `0` (no timeout) for a wait without one.
pub(crate) fn lock_timeout(deadline: Deadline) -> Cow<'static, str> {
    match deadline.millis_left() {
        Some(ms) => format!("{}ms", ms.min(i32::MAX as u128)).into(),
        None => "0".into(),
    }
}

/// After a caller's granted wait ([`Within::OpenTransaction`]): the
/// settings read before it (a setting made in a released savepoint lasts
/// until the transaction ends) put back.
pub(crate) fn restore_settings(lock_timeout: &str, statement_timeout: &str) -> String {
    format!(
        "SELECT set_config('lock_timeout', {}, true), set_config('statement_timeout', {}, true)",
        literal(lock_timeout),
        literal(statement_timeout)
    )
}

/// `value` as an SQL string literal, whatever `standard_conforming_strings` says.
fn literal(value: &str) -> String {
    format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// [`BoundedWait`] for a lock session's wait, prepared once per connection
/// with its claim token `owner` inlined (`None`: no claim check, on a
/// connection nothing can move): the same text for every name, bound as
/// [`Params::key_values`] and then [`lock_timeout`].
pub(crate) fn bounded_wait_plain(mode: Mode, key: &PgKey, owner: Option<&str>) -> String {
    BoundedWait {
        xact: false,
        mode,
        key,
        claim: owner,
        comment: None,
        within: Within::Autocommit,
        form: Form::Bound,
    }
    .text()
}

/// `SELECT fn($1[, $2]) WHERE <guard>` with the claim token inlined, for a
/// prepared statement (the token is hex digits: nothing to escape);
/// without the guard when `owner` is `None` (a connection nothing can
/// move: `direct.rs`'s `is_own_socket`).
pub(crate) fn prepared_body(call: Call, mode: Mode, key: &PgKey, owner: Option<&str>) -> String {
    let args = match key {
        PgKey::Big(_) => "$1",
        _ => "$1, $2",
    };
    let f = function(call, false, mode);
    match owner {
        Some(owner) => {
            debug_assert!(owner.bytes().all(|b| b.is_ascii_hexdigit()));
            format!(
                "SELECT {f}({args}) WHERE {}",
                guard(false, key, &format!("'{owner}'"))
            )
        }
        None => format!("SELECT {f}({args})"),
    }
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

    /// The key's values only, without an allocation, of which the first
    /// `n` count: for the
    /// statements a connection prepares with its claim token inlined
    /// ([`prepared_body`], [`bounded_wait_plain`]).
    pub(crate) fn key_values(&self) -> ([&(dyn ToSql + Sync); 2], usize) {
        match self {
            Params::Pair(a, b, _) => ([a, b], 2),
            Params::Big(k, _) => ([k, k], 1),
        }
    }

    /// The key's values with their types: for a statement whose claim
    /// token is inlined in its text (and the types it is prepared with).
    pub(crate) fn key_typed(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        match self {
            Params::Pair(a, b, _) => vec![(a as &(dyn ToSql + Sync), Type::INT4), (b, Type::INT4)],
            Params::Big(k, _) => vec![(k as &(dyn ToSql + Sync), Type::INT8)],
        }
    }

    /// As `query_typed` wants them: the key, then the claim token.
    pub(crate) fn as_typed(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        let (Params::Pair(.., owner) | Params::Big(_, owner)) = self;
        let mut typed = self.key_typed();
        typed.push((owner, Type::TEXT));
        typed
    }
}

#[cfg(test)]
mod tests;
