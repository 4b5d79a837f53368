#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod arbiter;
mod error;
mod guard;
pub mod key;
mod local;
mod locker;
#[cfg(feature = "mysql")]
mod mysql;
mod options;
#[cfg(feature = "postgres")]
pub mod postgres;
mod redact;
mod settings;
mod types;
mod wait;

pub use error::{Error, Result};
pub use guard::LockGuard;
pub use key::{LockName, Prefix};
pub use locker::{current_locks, HeldLock, Locker, LockerBuilder, Outcome, DEFAULT_MAX_LOCKS};
pub use options::{LockOptions, Mode, WaitStrategy};
pub use redact::redact_url;
pub use types::{BackendKind, Capabilities, Holder, ListedLock};

/// The workspace README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct WorkspaceReadme;
