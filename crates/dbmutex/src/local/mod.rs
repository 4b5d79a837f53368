//! The local backend: lock files on this host plus in-process arbitration.

use std::path::PathBuf;

use crate::guard::Held;
use crate::locker::{Holder, ListedLock, Settings};
use crate::{BackendKind, Error, LockName, LockOptions, Result};

pub(crate) struct LocalBackend {
    #[allow(dead_code)]
    dir: PathBuf,
}

impl LocalBackend {
    pub(crate) fn new(dir: Option<PathBuf>, _settings: &Settings) -> Result<Self> {
        Ok(LocalBackend {
            dir: dir.unwrap_or_else(|| PathBuf::from("/tmp")),
        })
    }
    pub(crate) fn kind(&self) -> BackendKind {
        BackendKind::Local
    }
    pub(crate) async fn acquire(
        &self,
        _name: &LockName,
        _opts: &LockOptions,
        _s: &Settings,
    ) -> Result<Option<Box<dyn Held>>> {
        Err(Error::Unsupported("local backend: not yet".into()))
    }
    pub(crate) async fn is_locked(&self, _name: &LockName, _s: &Settings) -> Result<bool> {
        Err(Error::Unsupported("local backend: not yet".into()))
    }
    pub(crate) async fn holders(&self, _name: &LockName, _s: &Settings) -> Result<Vec<Holder>> {
        Err(Error::Unsupported("local backend: not yet".into()))
    }
    pub(crate) async fn list(&self, _s: &Settings) -> Result<Vec<ListedLock>> {
        Err(Error::Unsupported("local backend: not yet".into()))
    }
}
