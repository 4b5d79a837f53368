//! The mysql backend: MySQL and MariaDB GET_LOCK.

use crate::guard::Held;
use crate::locker::{Holder, ListedLock, Settings};
use crate::{BackendKind, Error, LockName, LockOptions, Result};

pub(crate) struct MyBackend {}

impl MyBackend {
    pub(crate) async fn connect(_url: &str, _settings: &Settings) -> Result<Self> {
        Err(Error::Unsupported("mysql backend: not yet".into()))
    }
    pub(crate) fn kind(&self) -> BackendKind {
        BackendKind::Mysql
    }
    pub(crate) async fn acquire(
        &self,
        _name: &LockName,
        _opts: &LockOptions,
        _s: &Settings,
    ) -> Result<Option<Box<dyn Held>>> {
        Err(Error::Unsupported("mysql backend: not yet".into()))
    }
    pub(crate) async fn is_locked(&self, _name: &LockName, _s: &Settings) -> Result<bool> {
        Err(Error::Unsupported("mysql backend: not yet".into()))
    }
    pub(crate) async fn holders(&self, _name: &LockName, _s: &Settings) -> Result<Vec<Holder>> {
        Err(Error::Unsupported("mysql backend: not yet".into()))
    }
    pub(crate) async fn list(&self, _s: &Settings) -> Result<Vec<ListedLock>> {
        Err(Error::Unsupported("mysql backend: not yet".into()))
    }
}
