#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod builder;
mod core;
mod error;
pub mod fence;
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

pub use crate::core::guard::LockGuard;
pub use crate::core::scope::current_locks;
pub use builder::{LockerBuilder, DEFAULT_MAX_LOCKS, DEFAULT_MAX_SERVER_WAITS};
pub use error::{Error, Result};
pub use key::{LockName, Prefix};
pub use locker::Locker;
pub use options::{LockOptions, Mode, WaitStrategy};
pub use redact::redact_url;
pub use types::{BackendKind, Capabilities, HeldLock, Holder, ListedLock, Outcome};

/// The workspace README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct WorkspaceReadme;
