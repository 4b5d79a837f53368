//! Locks on a connection the caller owns: a tokio-postgres `Client`
//! ([`lock_session`]) or `Transaction` ([`lock_xact`]),
//! and, with the `sqlx` feature, an sqlx `PgConnection` ([`sqlx`]).
//!
//! Every one of them answers `Ok(Ok(lock))` when it got the lock and
//! `Ok(Err(..))` when the wait ended without it ([`NotAcquired`], or the
//! connection handed back): a `Result`, so ignoring it is a warning.
//!
//! One procedure serves both drivers. It sends simple-protocol batches only
//! (nothing is prepared on the caller's connection, nothing is left in its
//! statement cache), with the key as integers in the text:
//!
//! 1. try once (`pg_try_advisory[_xact]_lock[_shared]`);
//! 2. then, as [`LockOptions`] says: give up (try-once), poll with backoff
//!    ([`WaitStrategy::Poll`]), or wait in the server's queue (the default),
//!    with `lock_timeout` set for that wait only and put back afterwards —
//!    acquired, timed out or deadlocked.
//!
//! Names map to the same keys as everywhere else in dbmutex (and as the gem).

mod client;
mod guard;
mod outcome;
mod procedure;
#[cfg(feature = "sqlx")]
pub mod sqlx;

pub use client::{lock_session, lock_xact, CallerClient, ClientLockGuard};
pub use outcome::{NotAcquired, XactLock};
