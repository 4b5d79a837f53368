//! What both drivers' session-lock guards are made of: [`Pending`], work
//! under way on a caller's connection that may leave a lock behind if cut
//! short, and [`Taken`], the lock a guard holds and gives back.
//!
//! The guards themselves differ where their drivers do: tokio-postgres's
//! borrows a shared `Client` and queues the unlock on it at once; sqlx's
//! owns the connection (it derefs to it, and `release` hands it back), and
//! a drop runs the unlock on a task, because sqlx cannot queue one.

use std::future::Future;

use super::procedure::{Exec, Request};
use crate::core::loss::LossToken;
use crate::core::metrics::Hold;
use crate::key::PgKey;
use crate::postgres::errors::Failure;
use crate::{LockName, Mode};

/// A connection that knows how to undo what a cut-short [`Pending`] may
/// have left on it.
pub(crate) trait Undo: Exec + Sized {
    /// `may_hold`: a statement that may take the lock was sent, and no
    /// answer has said it took nothing.
    fn undo(self, may_hold: bool);
}

/// Work under way on a caller's connection (an acquisition, an unlock)
/// that may leave a lock behind: dropped before [`done`](Self::done) (a
/// cancelled future, an error after the lock), its connection
/// [undoes](Undo::undo) it.
pub(crate) struct Pending<C: Undo> {
    conn: Option<C>,
    may_hold: bool,
}

impl<C: Undo> Pending<C> {
    pub(crate) fn new(conn: C) -> Self {
        Pending {
            conn: Some(conn),
            may_hold: false,
        }
    }

    pub(crate) fn conn(&mut self) -> &mut C {
        self.conn.as_mut().expect("pending connection present")
    }

    /// Finished: nothing to undo; the connection back.
    pub(crate) fn done(mut self) -> C {
        self.conn.take().expect("pending connection present")
    }
}

impl<C: Undo> Exec for Pending<C> {
    fn batch<'a>(
        &'a mut self,
        sql: &'a str,
    ) -> impl Future<Output = std::result::Result<Vec<Option<String>>, Failure>> + Send + 'a {
        self.conn().batch(sql)
    }

    fn may_hold(&mut self, yes: bool) {
        self.may_hold = yes;
    }
}

impl<C: Undo> Drop for Pending<C> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.undo(self.may_hold);
        }
    }
}

/// A session lock taken on a caller's connection, as its guard keeps it:
/// what the unlock needs, and its count in `dbmutex_held` until dropped.
pub(crate) struct Taken {
    pub(crate) name: LockName,
    pub(crate) key: PgKey,
    pub(crate) mode: Mode,
    _metrics: Hold,
}

impl Taken {
    /// The lock `r` asked for, now held.
    pub(crate) fn of(r: Request<'_>) -> Self {
        Taken {
            _metrics: Hold::start(r.labels(), &LossToken::never()),
            key: r.key,
            mode: r.opts.get_mode(),
            name: r.name,
        }
    }

    /// The guard's `Debug`, under its type's name.
    pub(crate) fn debug(&self, f: &mut std::fmt::Formatter<'_>, guard: &str) -> std::fmt::Result {
        f.debug_struct(guard)
            .field("name", &self.name)
            .field("key", &self.key)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}
