//! The one locking procedure for connections the caller owns, over any
//! driver that can run simple-protocol batches ([`Exec`]).

use std::future::Future;

use crate::core::metrics;
use crate::core::wait::{Backoff, Deadline};
use crate::key::{pg_key, PgKey, Prefix};
use crate::postgres::errors::{map_failure, Failure, SESSION_OF_ANOTHER};
use crate::postgres::sql::{self, BoundedWait, Call, Form, Within};
use crate::types::BackendKind;
use crate::{Error, LockName, LockOptions, Mode, Result, WaitStrategy};

/// A connection that runs simple-protocol batches.
pub(crate) trait Exec: Send {
    /// Runs `sql` (one or more statements) and returns the first column of
    /// every row of every statement, as text.
    fn batch<'a>(
        &'a mut self,
        sql: &'a str,
    ) -> impl Future<Output = std::result::Result<Vec<Option<String>>, Failure>> + Send + 'a;

    /// Told before a statement that may take the lock is sent (`true`) and
    /// once an answer says the lock was not taken (`false`), for a
    /// [`Pending`](super::guard::Pending) acquisition to know what a drop
    /// must undo. The default does nothing.
    fn may_hold(&mut self, _yes: bool) {}
}

/// What to lock, and how.
pub(crate) struct Request<'a> {
    pub(crate) name: LockName,
    pub(crate) key: PgKey,
    pub(crate) opts: &'a LockOptions,
    /// A transaction-level lock (else a session lock).
    pub(crate) xact: bool,
    /// The connection is inside a transaction block.
    pub(crate) in_tx: bool,
}

impl<'a> Request<'a> {
    /// A session lock of `name` (checked), refusing a transaction-lock
    /// option (`instead`: the function that takes those).
    pub(crate) fn session(
        name: LockName,
        opts: &'a LockOptions,
        prefix: &Prefix,
        in_tx: bool,
        instead: &str,
    ) -> Result<Self> {
        name.validate()?;
        if opts.is_transaction() {
            return Err(Error::Config(format!(
                "lock_session takes session locks; for a transaction lock use {instead}"
            )));
        }
        Ok(Request {
            key: pg_key(&name, prefix),
            name,
            opts,
            xact: false,
            in_tx,
        })
    }

    /// A transaction lock of `name` (checked), in an open transaction.
    pub(crate) fn xact(name: LockName, opts: &'a LockOptions, prefix: &Prefix) -> Result<Self> {
        name.validate()?;
        Ok(Request {
            key: pg_key(&name, prefix),
            name,
            opts,
            xact: true,
            in_tx: true,
        })
    }
}

impl Request<'_> {
    /// The metrics' labels: PostgreSQL, the mode, never the name (these
    /// calls have no locker settings to opt in with).
    pub(crate) fn labels(&self) -> metrics::Labels {
        metrics::Labels::new(BackendKind::Postgres, self.opts.get_mode(), &self.name, false)
    }

    /// `SELECT fn(key)`, and for a transaction lock the guard that refuses a
    /// server session another dbmutex client claimed (no row then).
    fn statement(&self, call: Call, name: Option<&LockName>) -> String {
        if self.xact {
            return sql::inline(call, true, self.opts.mode, &self.key, name, "");
        }
        let f = sql::function(call, false, self.opts.mode);
        match name {
            Some(n) => format!(
                "SELECT {f}({}) /* {} */",
                self.key.sql_args(),
                crate::key::sql_comment(n)
            ),
            None => format!("SELECT {f}({})", self.key.sql_args()),
        }
    }
}

/// Takes the lock `r` asks for on `c`; `false` when the wait ended without it.
/// Counted in the metrics as any acquisition (crate docs, "Metrics").
pub(crate) async fn acquire<E: Exec>(c: &mut E, r: &Request<'_>) -> Result<bool> {
    let measured = metrics::Attempt::start(r.labels());
    let got = acquire_inner(c, r).await;
    measured.end(metrics::Outcome::of(got.as_ref().copied(), r.opts.is_try_once()));
    got
}

async fn acquire_inner<E: Exec>(c: &mut E, r: &Request<'_>) -> Result<bool> {
    let deadline = Deadline::after(r.opts.timeout);
    // No name on the try: one text per key form, and nobody sees it. The
    // server wait carries it, where pg_stat_activity shows it.
    let try_sql = r.statement(Call::Try, None);
    if try_lock(c, &try_sql, &r.name).await? {
        return Ok(true);
    }
    if r.opts.is_try_once() {
        return Ok(false);
    }
    if r.opts.strategy == WaitStrategy::Poll {
        let mut backoff = Backoff::new(deadline, r.opts.max_backoff);
        while backoff.pause(None).await {
            if try_lock(c, &try_sql, &r.name).await? {
                return Ok(true);
            }
        }
        return Ok(false);
    }
    wait_in_server(c, r, deadline).await
}

async fn try_lock<E: Exec>(c: &mut E, sql: &str, name: &LockName) -> Result<bool> {
    c.may_hold(true);
    let got = match c.batch(sql).await {
        Ok(rows) => match rows.first() {
            Some(v) => Ok(v.as_deref() == Some("t")),
            None => Err(Error::Unsupported(SESSION_OF_ANOTHER.into())),
        },
        Err(f) => Err(map_failure(f, name)),
    };
    if !matches!(got, Ok(true)) {
        c.may_hold(false);
    }
    got
}

/// Waits in the server until `deadline`, `lock_timeout` set for the wait
/// only ([`BoundedWait`]). Outside a transaction block the settings are
/// transaction-local in the batch's implicit transaction, which ends with
/// the batch; inside one, the wait runs in a savepoint and the old values
/// are put back.
async fn wait_in_server<E: Exec>(c: &mut E, r: &Request<'_>, deadline: Deadline) -> Result<bool> {
    let wait = BoundedWait {
        xact: r.xact,
        mode: r.opts.mode,
        key: &r.key,
        // A transaction lock's guard refuses a session another client
        // claimed; a session lock on the caller's connection has none.
        claim: r.xact.then_some(""),
        comment: Some(&r.name),
        within: if r.in_tx {
            Within::OpenTransaction
        } else {
            Within::Autocommit
        },
        form: Form::Inline(deadline),
    };
    c.may_hold(true);
    if !r.in_tx {
        let got = match c.batch(&wait.text()).await {
            Ok(rows) if rows.len() < wait.rows() => Err(Error::Unsupported(SESSION_OF_ANOTHER.into())),
            Ok(_) => Ok(true),
            Err(f) if f.code.as_deref() == Some(LOCK_NOT_AVAILABLE) => Ok(false),
            Err(f) => Err(map_failure(f, &r.name)),
        };
        if !matches!(got, Ok(true)) {
            c.may_hold(false);
        }
        return got;
    }
    match c.batch(&wait.text()).await {
        Ok(rows) => {
            // A setting made in a released savepoint lasts until the
            // transaction ends: put the old values back.
            let old = |i: usize| rows.get(i).cloned().flatten().unwrap_or_else(|| "0".into());
            c.batch(&sql::restore_settings(&old(0), &old(1)))
                .await
                .map_err(|f| map_failure(f, &r.name))?;
            // Rows: the two old settings, the new ones, then the lock's
            // (none when the transaction guard refused the session).
            if rows.len() == wait.rows() {
                Ok(true)
            } else {
                c.may_hold(false);
                Err(Error::Unsupported(SESSION_OF_ANOTHER.into()))
            }
        }
        Err(f) => {
            c.may_hold(false);
            // Back to the savepoint: the transaction, its settings and its
            // other locks are as they were before the wait.
            c.batch(sql::ROLLBACK_WAIT)
                .await
                .map_err(|f2| map_failure(f2, &r.name))?;
            if f.code.as_deref() == Some(LOCK_NOT_AVAILABLE) {
                Ok(false)
            } else {
                Err(map_failure(f, &r.name))
            }
        }
    }
}

/// SQLSTATE 55P03: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// `SELECT pg_advisory_unlock[_shared](key)`.
pub(crate) fn unlock_sql(key: &PgKey, mode: Mode) -> String {
    format!(
        "SELECT {}({})",
        sql::function(Call::Unlock, false, mode),
        key.sql_args()
    )
}

/// Runs the unlock of a session lock; `Err(LockLost)` when the session did
/// not hold it (the connection was reset, or a pooler moved it).
pub(crate) async fn unlock<E: Exec>(c: &mut E, key: &PgKey, mode: Mode, name: &LockName) -> Result<()> {
    let rows = c
        .batch(&unlock_sql(key, mode))
        .await
        .map_err(|f| map_failure(f, name))?;
    match rows.first() {
        Some(Some(v)) if v == "t" => Ok(()),
        _ => Err(Error::LockLost {
            name: name.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements() {
        let name: LockName = "x".into();
        let opts = LockOptions::new().shared(true);
        let r = Request {
            name: name.clone(),
            key: PgKey::Pair(1, -2),
            opts: &opts,
            xact: false,
            in_tx: false,
        };
        assert_eq!(
            r.statement(Call::Try, None),
            "SELECT pg_try_advisory_lock_shared(1,-2)"
        );
        assert_eq!(
            r.statement(Call::Wait, Some(&name)),
            "SELECT pg_advisory_lock_shared(1,-2) /* x */"
        );
        assert_eq!(
            unlock_sql(&PgKey::Big(7), Mode::Exclusive),
            "SELECT pg_advisory_unlock(7)"
        );
        let x = Request { xact: true, ..r };
        assert!(x
            .statement(Call::Try, None)
            .starts_with("SELECT pg_try_advisory_xact_lock_shared(1,-2) WHERE"));
    }
}
