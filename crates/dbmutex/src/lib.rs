#![doc = include_str!("../README.md")]
//!
//! ## Metrics
//!
//! With the feature `metrics` (off by default), dbmutex records through the
//! [`metrics`](https://docs.rs/metrics/0.24) facade: install any recorder
//! (a Prometheus exporter, StatsD, ...) and these series appear. Without a
//! recorder, or without the feature, nothing is recorded.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `dbmutex_acquisitions_total` | counter | `backend`, `mode`, `outcome` | one per acquisition, when it ends |
//! | `dbmutex_wait_seconds` | histogram | `backend`, `mode`, `outcome` | from the request to the lock or giving up |
//! | `dbmutex_held` | gauge | `backend`, `mode` | locks held through guards now |
//! | `dbmutex_hold_seconds` | histogram | `backend`, `mode` | from acquiring to release, drop or loss |
//! | `dbmutex_losses_total` | counter | `backend`, `mode` | locks lost while held (their session ended) |
//!
//! - `backend`: `postgres`, `mysql`, `local`; `mode`: `exclusive`, `shared`.
//! - `outcome`: `acquired`; `not_acquired` (a try-once found it held);
//!   `timed_out` (a wait ended without it); `deadlock` (the server's
//!   deadlock victim, [`Error::Deadlock`]); `error` (any other error,
//!   [`Error::TooManyLocks`] and an invalid name included); `cancelled` (the
//!   acquiring future was dropped first).
//! - Every acquisition through a [`Locker`] counts once, scoped calls
//!   ([`Locker::with_lock`]) included. A re-entrant scoped call (a name
//!   the task's enclosing call already holds in a mode that covers it)
//!   takes no lock and is not counted. An upgrade (a nested exclusive call
//!   in a shared one) counts in `dbmutex_acquisitions_total` and
//!   `dbmutex_wait_seconds` as `exclusive`, not in `dbmutex_held`. Nested locks that are real acquisitions
//!   (another name) count as any other.
//! - `dbmutex_held` counts guards: two tasks of one process sharing a lock
//!   count 2. It goes down once per guard: on [`LockGuard::release`], on
//!   drop, or as soon as a loss is known (the guard may still be alive);
//!   `dbmutex_hold_seconds` is recorded at that moment, and a loss counts in
//!   `dbmutex_losses_total`. After every path it is back to 0 when no guard
//!   holds.
//! - Locks on your own connection (`postgres::lock_xact`,
//!   `postgres::lock_session`, `postgres::sqlx`) count in
//!   `dbmutex_acquisitions_total` and `dbmutex_wait_seconds` from the
//!   request on (a name refused before it is not counted), never with a
//!   `name` label. A session lock's guard is in `dbmutex_held` and
//!   `dbmutex_hold_seconds` until released or dropped (dbmutex does not
//!   watch your connection: no loss is counted); a transaction lock ends
//!   with your transaction, which dbmutex does not see, so it is in
//!   neither.
//! - A `name` label (the [`LockName`] as text) only with
//!   [`LockerBuilder::metrics_name_label(true)`](LockerBuilder::metrics_name_label):
//!   each name then makes series of its own for the life of the process, so
//!   use it only for a small fixed set of names.
//! - Units and descriptions are given to the recorder installed at the
//!   process's first acquisition: install the recorder before.
//! - Cost, with the feature on: a few atomic operations and a small
//!   allocation per acquisition; a lock that can be lost (PostgreSQL,
//!   MySQL) is watched by a small task while it is held.
//!
#![cfg_attr(feature = "metrics", doc = "```")]
#![cfg_attr(not(feature = "metrics"), doc = "```ignore")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dbmutex::Error> {
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//!
//! // In an application: the exporter of your choice, once, at start-up
//! // (e.g. metrics-exporter-prometheus). Here, one we can read back.
//! let recorder = DebuggingRecorder::new();
//! let snapshots = recorder.snapshotter();
//! metrics::set_global_recorder(recorder).expect("the first recorder");
//!
//! let dir = std::env::temp_dir().join(format!("dbmutex-doc-metrics-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let locker = dbmutex::Locker::local_builder(Some(dir)).connect().await?;
//! let guard = locker.lock("nightly-report").await?;
//! guard.release().await?;
//!
//! let acquired = snapshots.snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
//!     let key = key.key();
//!     let outcome = key.labels().find(|l| l.key() == "outcome").map(|l| l.value().to_owned());
//!     (key.name() == "dbmutex_acquisitions_total" && outcome.as_deref() == Some("acquired"))
//!         .then_some(value)
//! });
//! assert_eq!(acquired, Some(DebugValue::Counter(1)));
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![deny(unsafe_code)]

mod builder;
mod core;
pub mod delay;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
pub mod fence;
pub mod key;
mod local;
mod locker;
#[cfg(feature = "mysql")]
mod mysql;
mod once;
mod options;
#[cfg(feature = "postgres")]
pub mod postgres;
mod redact;
pub mod runs;
mod settings;
mod slots;
mod types;

pub use crate::core::guard::LockGuard;
pub use crate::core::scope::current_locks;
pub use builder::{
    LockerBuilder, DEFAULT_DEAD_PEER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_LOCKS,
    DEFAULT_MAX_SERVER_WAITS,
};
pub use error::{Error, Result};
pub use key::{LockName, Prefix};
pub use locker::Locker;
pub use options::{LockOptions, Mode, WaitStrategy};
pub use redact::redact_url;
pub use slots::{SlotCount, SlotGuard, SlotHolders, MAX_SLOTS, SLOT_MARKERS};
pub use types::{BackendKind, Capabilities, HeldLock, Holder, HolderId, ListedLock, Outcome};
