//! What a backend must provide: the [`Backend`] trait. The core owns the
//! rest — validation, the cap, capability checks, deadlines, in-process
//! arbitration, polling, scopes, guards (see [`super::pipeline`]).
//!
//! A backend only maps a name to its key, tries once (or waits in the
//! server, if it can), hands back a [`Grant`] that releases (and, where it
//! can, runs the statements fencing tokens and once-per runs need on the
//! lock's own session: [`OnSession`](super::guard::OnSession)), says in its
//! own words what it cannot do, and answers who holds what.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use super::arbiter::{Hold, SlotExt};
use super::guard::{BoxFut, Grant};
use super::wait::Deadline;
use crate::runs::LastRun;
use crate::settings::Settings;
use crate::types::{Holder, ListedLock};
use crate::{Error, LockName, LockOptions, Result};

/// How one acquisition waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitIn {
    /// The core retries [`Backend::try_once`] with backoff up to this cap.
    Poll {
        /// The longest pause between two tries.
        max_backoff: Duration,
    },
    /// The backend waits in the server ([`Backend::wait_in_server`]).
    Server,
    /// One [`Backend::try_once`], then (if busy, and a server-wait permit
    /// is free) [`Backend::wait_in_server`] with the hold; without a permit,
    /// as `Poll`.
    TryThenServer {
        /// The longest pause between two tries when it polls.
        max_backoff: Duration,
    },
}

/// The backend's plan for one acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Take the in-process hold first (tasks sharing a session must be told
    /// apart here; a dedicated connection per lock needs none).
    pub(crate) hold: bool,
    pub(crate) wait: WaitIn,
}

/// An option a backend may not honour ([`Backend::refusal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Shared locks.
    Shared,
    /// Transaction-level locks.
    Transaction,
    /// Session locks (PostgreSQL behind a transaction pooler).
    SessionLocks,
    /// Fencing tokens ([`OnSession::fence`](super::guard::OnSession::fence)).
    Fencing,
    /// Upgrading a shared lock inside one task; asked when the shared
    /// grant offers no upgrade (PostgreSQL: a transaction-level lock).
    Upgrade,
}

/// How a wait in the server ended.
pub(crate) enum Waited<T> {
    /// Granted.
    Granted(Box<dyn Grant>),
    /// The deadline passed.
    TimedOut,
    /// It could not start now (PostgreSQL: the server has no connection to
    /// spare for it); the core polls instead, with the tries handed back.
    Poll(T),
}

/// The records a backend keeps beside its locks: fencing tokens and
/// once-per-window runs ([`crate::fence`], [`crate::runs`]).
pub(crate) trait Records: Send + Sync {
    /// Creates the tables they need on the server, for a role that may;
    /// the locks' own roles then need only the grants. Nothing to create
    /// is `Ok`.
    fn create_tables(&self) -> BoxFut<'_, Result<()>>;

    /// The last run recorded for `key`, read without the lock; `None` if it
    /// never ran (or the table does not exist yet).
    fn last_run<'a>(&'a self, name: &'a LockName, key: &'a str) -> BoxFut<'a, Result<Option<LastRun>>>;
}

/// One acquisition as the core hands it to the backend.
pub(crate) struct Attempt<'a, B: Backend> {
    pub(crate) name: &'a LockName,
    pub(crate) key: &'a B::Key,
    pub(crate) opts: &'a LockOptions,
    pub(crate) settings: &'a Settings,
    /// When the wait ends; computed once, by the core, and passed down
    /// as is.
    pub(crate) deadline: Deadline,
    /// The in-process hold, when the plan asked for one. A grant takes it
    /// (it is given back when the lock is released).
    pub(crate) hold: Option<Hold<B::Key, B::SlotExt>>,
    /// The locker's id (see [`Attempt::enclosing`]).
    pub(crate) locker: u64,
}

impl<B: Backend> Attempt<'_, B> {
    /// The innermost lock this locker holds in a scoped call of this task
    /// (looked up when asked: most backends never do).
    pub(crate) fn enclosing(&self) -> Option<LockName> {
        super::scope::enclosing(self.locker)
    }
}

/// The holders of `name`'s `key` as [`Backend::held`] rows, one a holder.
pub(crate) fn rows(name: &LockName, key: &impl fmt::Display, holders: Vec<Holder>) -> Vec<ListedLock> {
    let (name, key) = (name.to_string(), key.to_string());
    holders
        .into_iter()
        .map(|holder| ListedLock {
            name: Some(name.clone()),
            key: key.clone(),
            holder,
        })
        .collect()
}

/// A future a backend method returns.
pub(crate) trait Fut<'a, T>: Future<Output = Result<T>> + Send + 'a {}
impl<'a, T, F: Future<Output = Result<T>> + Send + 'a> Fut<'a, T> for F {}

/// A lock backend. Implementing this in one folder is all a new backend
/// takes: the core does the rest (waiting, deadlines, polling, the
/// in-process arbiter, re-entrancy, fencing order, runs, metrics).
pub(crate) trait Backend: Send + Sync + Sized + 'static {
    /// The database key a name maps to (its text form is what
    /// [`Locker::key_of`](crate::Locker::key_of) shows).
    type Key: Clone + Eq + Hash + fmt::Display + Send + Sync + 'static;
    /// Per-key state kept beside the in-process hold.
    type SlotExt: SlotExt;
    /// What one acquisition prepares once, after the in-process hold, for
    /// all its tries and its wait (room in the server, a session); a grant
    /// takes what it needs of it.
    type Tries: Send + Sync;

    /// Why this backend cannot honour `missing` here, in its own words;
    /// `None` if it can. (Which backend it is, the core was told when it
    /// was made: see `Pipeline::new`.)
    fn refusal(&self, missing: Missing) -> Option<String>;

    /// The key `name` maps to with this locker's prefix.
    fn key(&self, name: &LockName) -> Result<Self::Key>;

    /// How to wait for this acquisition.
    fn plan(&self, opts: &LockOptions) -> Plan;

    /// Prepares one acquisition's tries (after the in-process hold:
    /// waiters queued in process take no room in the server).
    fn begin<'a>(&'a self, at: &'a Attempt<'_, Self>) -> impl Fut<'a, Self::Tries>;

    /// One try that never waits: `Ok(None)` when someone else holds it.
    /// Only called when the plan polls or tries first (a backend that only
    /// waits in the server needs none).
    fn try_once<'a>(
        &'a self,
        _tries: &'a Self::Tries,
        _at: &'a mut Attempt<'_, Self>,
    ) -> impl Fut<'a, Option<Box<dyn Grant>>> {
        async { Err(Error::Unsupported("this backend only waits in the server".into())) }
    }

    /// Waits in the server until `at.deadline`; only called when the plan
    /// says [`WaitIn::Server`] or [`WaitIn::TryThenServer`] (then `at.hold`
    /// is the in-process hold: the grant keeps it until released).
    fn wait_in_server<'a>(
        &'a self,
        _tries: Self::Tries,
        _at: &'a mut Attempt<'_, Self>,
    ) -> impl Fut<'a, Waited<Self::Tries>> {
        async {
            Err(Error::Unsupported(
                "this backend cannot wait in the server".into(),
            ))
        }
    }

    /// Who holds what now: every lock held on the server, or (`only`) the
    /// holders of one name's key (then [`rows`] makes the rows).
    fn held<'a>(&'a self, only: Option<(&'a LockName, &'a Self::Key)>) -> impl Fut<'a, Vec<ListedLock>>;

    /// The records it keeps (fencing tokens, runs), if any.
    fn records(&self) -> Option<&dyn Records> {
        None
    }
}
