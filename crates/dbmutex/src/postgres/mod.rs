//! The PostgreSQL backend, and helpers for callers who own the transaction.
//!
//! `backend/` is the [`Locker`](crate::Locker)'s backend (its connections,
//! waits, hand-off and records); `caller/` takes locks on a connection you
//! own ([`lock_session`], [`lock_xact`], `sqlx`); both build their
//! statements with `sql.rs` and read errors with `errors.rs`.
//!
//! # How locks are held
//!
//! - **Session locks (the default).** One connection per
//!   [`Locker`](crate::Locker) — the *lock session* — takes every session
//!   lock of the process that is free when asked. PostgreSQL cannot tell the
//!   tasks on one session apart (session locks are re-entrant), so tasks
//!   first take an in-process hold on the key (first come, first served),
//!   then ask the server. Concurrent requests are pipelined on the one
//!   connection.
//! - **A busy lock** is waited for in the server (the default
//!   [`WaitStrategy::TryThenServer`](crate::WaitStrategy::TryThenServer)):
//!   the task holding the in-process hold
//!   waits in the server's queue, so processes take turns and any holder's
//!   release (the gem's, psql's) hands the lock over at once, waking only
//!   the next waiter. It waits on the lock session itself when that holds
//!   nothing else (the session then holds the lock, and the next lock
//!   session is the next idle connection): a process that takes one lock at
//!   a time keeps **one connection**, waiting or holding. Otherwise it waits
//!   on a connection of its own, if the server has room for one (see
//!   `backend/budget.rs`); at most
//!   [`LockerBuilder::max_server_waits`](crate::LockerBuilder::max_server_waits)
//!   names wait (and are then held) that way per locker; past that, or
//!   when the server is short of connections, waiters poll the lock
//!   session.
//! - **Server-side waits** asked for
//!   ([`WaitStrategy::Server`](crate::WaitStrategy::Server)) and
//!   **transaction locks**
//!   ([`LockOptions::transaction`](crate::LockOptions::transaction)) use a
//!   dedicated connection per guard, because a blocked statement would stall the
//!   shared session.
//! - **Your own connection**: [`lock_xact`] takes a transaction-level lock in
//!   a `tokio_postgres::Transaction` you own, [`lock_session`] a session lock
//!   on a `Client` (or a pool object that derefs to one); with the `sqlx`
//!   feature, the `sqlx` module does both on an sqlx connection.
//! - **Behind a transaction pooler** (PgBouncer `pool_mode = transaction`),
//!   which dbmutex detects when it connects, session locks fail with
//!   [`Error::Unsupported`](crate::Error::Unsupported); use
//!   [`LockOptions::transaction`](crate::LockOptions::transaction).
//!
//! # Upgrade inside one task
//!
//! A nested scoped exclusive call inside a scoped shared one for the same
//! name upgrades ([`Locker::with_lock`](crate::Locker::with_lock)), as the
//! gem does: the session holding the shared lock takes it exclusive too
//! (its own locks never conflict), and `pg_advisory_unlock` drops just that
//! at the end. It *tries* with backoff (that session serves other locks
//! and its keepalive probe, so it never blocks): shared requests of other
//! processes may overtake it, and the server's deadlock detector does not
//! see it. So a waiting upgrader holds an *intent* lock (a `bigint` key
//! with the high bit set, mixed from the name's; `list` shows it unnamed):
//! a second upgrader in another process finds it and fails at once with
//! [`Error::Deadlock`](crate::Error::Deadlock). Behind a session that only
//! waits in the server for the name (it waits for the upgrader's shared lock), the server refuses
//! the upgrader's try but grants its blocking request at once, ahead of
//! that waiter: the upgrader sends that request (200 ms bound). A
//! transaction lock on either side, or a fenced nested call, is
//! [`Error::Unsupported`](crate::Error::Unsupported).
//!
//! A lock lives as long as its connection: when the connection ends (server
//! restart, `pg_terminate_backend`, network failure noticed by TCP
//! keepalive), every guard on it reports the loss at once. Nothing is ever
//! re-acquired silently.

mod backend;
mod caller;
mod errors;
mod sql;

pub(crate) use backend::PgBackend;
#[cfg(feature = "sqlx")]
pub use caller::sqlx;
pub use caller::{lock_session, lock_xact, CallerClient, ClientLockGuard, NotAcquired, XactLock};
