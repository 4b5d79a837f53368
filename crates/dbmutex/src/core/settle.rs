//! Between the grant and the guard: what an acquisition asked for on the
//! lock's own session, in order — lock-delay (a lost holder's closure is
//! waited out holding the lock), then the fencing token — so that token
//! order is lock order. Either failing releases the lock before the error
//! returns (a cancelled acquisition drops the grant, which releases it too).

use tokio::time::Instant;

use super::delay::{self, Renewal};
use super::guard::Grant;
use crate::{Error, LockName, LockOptions, Result};

/// A grant ready to become a guard.
pub(crate) struct Settled {
    pub(crate) grant: Box<dyn Grant>,
    /// The fencing token, if asked for.
    pub(crate) fence: Option<u64>,
    /// The lock-delay renewal, if asked for.
    pub(crate) delay: Option<Renewal>,
}

impl Settled {
    /// A grant with nothing asked of its session.
    pub(crate) fn plain(grant: Box<dyn Grant>) -> Self {
        Settled {
            grant,
            fence: None,
            delay: None,
        }
    }
}

/// Runs lock-delay and fencing on `g` as `opts` ask; `Ok(None)` (the lock
/// released) when a lost holder's closure outlasts `deadline`.
pub(crate) async fn settle(
    g: Box<dyn Grant>,
    name: &LockName,
    key: String,
    opts: &LockOptions,
    deadline: Option<Instant>,
) -> Result<Option<Settled>> {
    let delay = match opts.lock_delay {
        None => None,
        Some(d) => {
            let record = g.on_session().map(|s| s.delay(key.clone()));
            match delay::enter(record, d, deadline).await {
                Ok(Some(record)) => Some((record, d)),
                Ok(None) => return release_unused(g, name, None).await,
                Err(e) => return release_unused(g, name, Some(e)).await,
            }
        }
    };
    let fence = match opts.fenced {
        false => None,
        true => match fence(g.as_ref(), key).await {
            Ok(token) => Some(token),
            Err(e) => return release_unused(g, name, Some(e)).await,
        },
    };
    Ok(Some(Settled {
        grant: g,
        fence,
        delay: delay.map(|(record, d)| Renewal::start(record, d, name.clone())),
    }))
}

/// The grant's fencing token, on its own session.
async fn fence(g: &dyn Grant, key: String) -> Result<u64> {
    match g.on_session() {
        Some(s) => s.fence(key).await,
        None => Err(Error::Unsupported("this backend issues no fencing tokens".into())),
    }
}

/// Releases a grant the acquisition will not hand out, then answers
/// `Ok(None)` or the error.
async fn release_unused(g: Box<dyn Grant>, name: &LockName, e: Option<Error>) -> Result<Option<Settled>> {
    if let Err(r) = g.release().await {
        tracing::debug!(name = %name, error = %r, "dbmutex: release of a lock not handed out");
    }
    e.map_or(Ok(None), Err)
}
