//! What a backend must provide: the [`Backend`] trait. The core owns the
//! rest — validation, the cap, capability checks, deadlines, in-process
//! arbitration, polling, scopes, guards (see [`super::pipeline`]).
//!
//! A backend only maps a name to its key, tries once (or waits in the
//! server, if it can), hands back a [`Grant`] that releases (and, when
//! [`Capabilities::fencing`] says so, issues fencing tokens on the lock's own
//! session: [`Grant::fence`]), and answers who holds what.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::arbiter::{Arbiter, Hold, Slot, SlotExt};
use super::guard::Grant;
use crate::runs::LastRun;
use crate::settings::Settings;
use crate::types::{BackendKind, Capabilities, Holder, ListedLock};
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

/// What the backend cannot do, for [`Backend::explain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Shared locks.
    Shared,
    /// Transaction-level locks.
    Transaction,
    /// Session locks (PostgreSQL behind a transaction pooler).
    SessionLocks,
    /// Fencing tokens ([`Grant::fence`]).
    Fencing,
}

/// One acquisition as the core hands it to the backend.
pub(crate) struct Attempt<'a, B: Backend> {
    pub(crate) name: &'a LockName,
    pub(crate) key: &'a B::Key,
    pub(crate) opts: &'a LockOptions,
    pub(crate) settings: &'a Settings,
    /// When the wait ends (`None`: never); computed once, by the core.
    pub(crate) deadline: Option<Instant>,
    /// The in-process hold, when the plan asked for one. A grant takes it
    /// (it is given back when the lock is released).
    pub(crate) hold: Option<Hold<B::Key, B::SlotExt>>,
    /// Admitted before the first server statement; a grant takes it.
    pub(crate) ticket: Option<B::Ticket>,
    /// The innermost lock this locker holds in a scoped call of this task.
    pub(crate) enclosing: Option<LockName>,
}

/// A future a backend method returns.
pub(crate) trait Fut<'a, T>: Future<Output = Result<T>> + Send + 'a {}
impl<'a, T, F: Future<Output = Result<T>> + Send + 'a> Fut<'a, T> for F {}

/// A lock backend. Implementing this in one folder is all a new backend
/// takes: the core does the rest.
pub(crate) trait Backend: Send + Sync + Sized + 'static {
    /// The database key a name maps to (its text form is [`Backend::key_text`]).
    type Key: Clone + Eq + Hash + fmt::Display + Send + Sync + 'static;
    /// Per-key state kept beside the in-process hold.
    type SlotExt: SlotExt;
    /// Room in the server admitted before the first server statement.
    type Ticket: Send + 'static;
    /// What one polling wait prepares once for all its tries (a session).
    type Tries: Send + Sync;

    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// What it can do now (PostgreSQL turns session locks off behind a pooler).
    fn capabilities(&self) -> Capabilities {
        self.kind().capabilities()
    }

    /// The refusal's wording for an option it cannot honour.
    fn explain(&self, missing: Missing) -> String;

    /// The key `name` maps to with this locker's prefix.
    fn key(&self, name: &LockName, settings: &Settings) -> Result<Self::Key>;

    /// The key as [`Locker::key_of`](crate::Locker::key_of) shows it.
    fn key_text(&self, key: &Self::Key) -> String {
        key.to_string()
    }

    /// The in-process arbiter.
    fn arbiter(&self) -> &Arc<Arbiter<Self::Key, Self::SlotExt>>;

    /// How to wait for this acquisition.
    fn plan(&self, opts: &LockOptions) -> Plan;

    /// Admits one more server lock (after the hold: waiters queued in
    /// process take no room).
    fn admit<'a>(&'a self, settings: &'a Settings) -> impl Fut<'a, Self::Ticket>;

    /// Prepares the tries of one polling wait.
    fn prepare<'a>(&'a self, at: &'a Attempt<'_, Self>) -> impl Fut<'a, Self::Tries>;

    /// What wakes a polling waiter early besides an in-process release.
    fn wake(_slot: &Slot<Self::SlotExt>) -> Option<&Notify> {
        None
    }

    /// One try that never waits: `Ok(None)` when someone else holds it.
    fn try_once<'a>(
        &'a self,
        tries: &'a Self::Tries,
        at: &'a mut Attempt<'_, Self>,
    ) -> impl Fut<'a, Option<Box<dyn Grant>>>;

    /// Under [`WaitIn::TryThenServer`]: whether a wait in the server can
    /// start now (PostgreSQL: a connection for it is at hand). If not (the
    /// server refuses more connections), the core polls instead.
    fn ready_to_wait<'a>(&'a self, _at: &'a Attempt<'_, Self>) -> impl Fut<'a, bool> {
        std::future::ready(Ok(true))
    }

    /// Waits in the server until `at.deadline`; only called when the plan
    /// says [`WaitIn::Server`] or [`WaitIn::TryThenServer`] (then `at.hold`
    /// is the in-process hold: the grant keeps it until released).
    fn wait_in_server<'a>(&'a self, _at: &'a mut Attempt<'_, Self>) -> impl Fut<'a, Option<Box<dyn Grant>>> {
        async {
            Err(Error::Unsupported(
                "this backend cannot wait in the server".into(),
            ))
        }
    }

    /// Creates the tables fencing tokens and once-per-window runs need on
    /// the server ([`crate::fence`], [`crate::runs`]), for a role that may;
    /// the locks' own roles then need only the grants. Nothing to create
    /// is `Ok`.
    fn create_tables<'a>(&'a self, _settings: &'a Settings) -> impl Fut<'a, ()> {
        async { Err(Error::Unsupported("this backend keeps no tables".into())) }
    }

    /// The last run recorded for `key` ([`crate::runs`]), read without the
    /// lock; `None` if it never ran (or the table does not exist yet).
    fn last_run<'a>(
        &'a self,
        _name: &'a LockName,
        _key: &'a Self::Key,
        _settings: &'a Settings,
    ) -> impl Fut<'a, Option<LastRun>> {
        async { Err(Error::Unsupported("this backend records no runs".into())) }
    }

    /// Who holds `key` now.
    fn holders<'a>(
        &'a self,
        name: &'a LockName,
        key: &'a Self::Key,
        settings: &'a Settings,
    ) -> impl Fut<'a, Vec<Holder>>;

    /// Whether anyone holds `key` now.
    fn is_locked<'a>(
        &'a self,
        name: &'a LockName,
        key: &'a Self::Key,
        settings: &'a Settings,
    ) -> impl Fut<'a, bool> {
        async move { Ok(!self.holders(name, key, settings).await?.is_empty()) }
    }

    /// Every lock held on the server now.
    fn list<'a>(&'a self, settings: &'a Settings) -> impl Fut<'a, Vec<ListedLock>>;
}
