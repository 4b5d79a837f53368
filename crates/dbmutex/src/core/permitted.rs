//! The grant of a wait in the server that took one of the locker's
//! server-wait permits ([`WaitIn::TryThenServer`](super::backend::WaitIn)).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::guard::{BoxFuture, Grant};
use super::loss::LossToken;
use super::upgradable::Upgrade;
use crate::runs::{RunStart, Who};
use crate::Result;

/// A grant won by a wait in the server under `WaitIn::TryThenServer`:
/// keeps the locker's server-wait permit (its connection) until released.
pub(super) struct Permitted {
    pub(super) grant: Box<dyn Grant>,
    pub(super) _permit: OwnedSemaphorePermit,
}

impl Grant for Permitted {
    fn release(self: Box<Self>) -> BoxFuture<Result<()>> {
        let Permitted { grant, _permit } = *self;
        Box::pin(async move {
            let r = grant.release().await;
            drop(_permit);
            r
        })
    }

    fn loss(&self) -> LossToken {
        self.grant.loss()
    }

    fn fence(&self, key: String) -> BoxFuture<Result<u64>> {
        self.grant.fence(key)
    }

    fn start_run(&self, window: Duration, who: Who) -> BoxFuture<Result<RunStart>> {
        self.grant.start_run(window, who)
    }

    fn finish_run(&self, run: u64, exit_code: Option<i32>) -> BoxFuture<Result<()>> {
        self.grant.finish_run(run, exit_code)
    }

    fn upgrader(&self) -> Option<Arc<dyn Upgrade>> {
        self.grant.upgrader()
    }
}
