//! A session lock held on the shared lock session, and its release (with
//! the in-process hand-off of [`super::handoff`]).

use std::future::Future;

use tokio::sync::watch;

use super::budget;
use std::sync::Arc;

use super::handoff::{self, PgHold};
use super::names::OwnNames;
use super::session_lock::SessionLock;
use crate::core::detach::Undo;
use crate::core::guard::{releasing, BoxFuture, DelayRecord, Grant, OnSession, Releasing};
use crate::core::loss::LossToken;
use crate::runs::{RunStart, Who};
use crate::{Mode, Result};
use std::time::Duration;

/// A session lock held on the shared lock session.
pub(crate) struct SessionGrant {
    /// Dropped armed, the unlock runs in the background.
    release: Undo<Release>,
    lost: watch::Receiver<bool>,
}

/// What the release needs.
struct Release {
    lock: SessionLock,
    /// Given back once the unlock is on the wire.
    hold: Option<PgHold>,
    /// Room in the server's lock table, given back once the server lock is.
    budget: Option<budget::Slot>,
    /// The locker's names of held locks (for `list`).
    names: Arc<OwnNames>,
}

impl SessionGrant {
    pub(crate) fn new(
        lock: SessionLock,
        hold: Option<PgHold>,
        budget: Option<budget::Slot>,
        names: Arc<OwnNames>,
    ) -> Self {
        names.add(lock.key, &lock.name);
        SessionGrant {
            lost: lock.conn.lost_signal(),
            release: Undo::with(
                Release {
                    lock,
                    hold,
                    budget,
                    names,
                },
                Release::in_background,
            ),
        }
    }
}

impl Release {
    /// Lets go of the name (for `list`) and, for an exclusive lock another
    /// task of ours waits for, parks the server lock for that task instead
    /// of unlocking it (see [`handoff`]): `true` when it did, and nothing is
    /// left to unlock.
    fn handed_over(&mut self) -> bool {
        self.names.remove(&self.lock.key);
        if self.lock.mode != Mode::Exclusive {
            return false;
        }
        let Some(h) = self.hold.take() else {
            return false;
        };
        self.hold = handoff::park(&self.lock, h);
        self.hold.is_none()
    }

    /// From `Drop`: no runtime is needed here. On a direct connection the
    /// unlock is queued on it by this thread; else the handle spawns it
    /// onto the connection's own runtime. If that runtime is gone, so is
    /// the connection, and the server has freed the lock.
    fn in_background(mut self) {
        // Queued: whatever this connection sends next reaches the server
        // after it, so the hold goes now (dropped with `self`), and the
        // room in the lock table too (a lock another connection of ours
        // takes meanwhile may overtake it: one lock, within the budget's
        // margin).
        if self.handed_over() || self.lock.conn.send_unlock(self.lock.mode, &self.lock.key) {
            return;
        }
        // The next request of this process for the key waits for this
        // unlock instead of finding the key busy.
        if let Some(h) = self.hold.as_mut() {
            h.releasing();
        }
        let runtime = self.lock.conn.runtime.clone();
        drop(runtime.spawn(async move {
            let Release {
                lock, hold, budget, ..
            } = self;
            let name = lock.name.clone();
            let r = lock.unlock().await;
            drop((hold, budget));
            if let Err(e) = r {
                tracing::warn!(name = %name, error = %e, "dbmutex: unlock on drop failed");
            }
        }));
    }
}

crate::core::reuse::shelf! {
    /// The spare allocation of each thread's lock-session-grant releases.
    static RELEASES;
}

impl Grant for SessionGrant {
    fn release(mut self: Box<Self>) -> Releasing {
        releasing(&RELEASES, move || async move {
            // Dropped before its first poll, this future drops `self`, whose
            // armed undo unlocks in the background. From here on the future
            // owns the unlock: its first poll sends it (below).
            let mut release = self.release.take().expect("held until released");
            if release.handed_over() {
                return Ok(());
            }
            let Release {
                lock, hold, budget, ..
            } = release;
            let _budget = budget;
            let unlock = lock.unlock();
            tokio::pin!(unlock);
            // The first poll sends the unlock. Once it is on the wire, an
            // in-process waiter may go: whatever it sends reaches the server
            // after our unlock, so the hand-off costs it one round trip.
            let first = std::future::poll_fn(|cx| std::task::Poll::Ready(unlock.as_mut().poll(cx))).await;
            drop(hold);
            match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => unlock.await,
            }
        })
    }

    fn loss(&self) -> LossToken {
        LossToken::of(self.lost.clone())
    }

    fn upgrader(&self) -> Option<Arc<dyn crate::core::upgradable::Upgrade>> {
        let of = |r: &Release| super::upgrade::PgUpgrade::of(&r.lock, r.hold.is_some());
        self.release.peek(of).flatten()
    }

    fn on_session(&self) -> Option<&dyn OnSession> {
        Some(self)
    }
}

impl OnSession for SessionGrant {
    fn fence(&self, key: String) -> BoxFuture<Result<u64>> {
        super::fence::for_grant(self.release.peek(|r| r.lock.clone()), key)
    }

    fn start_run(&self, window: Duration, who: Who) -> BoxFuture<Result<RunStart>> {
        super::runs::start_for_grant(self.release.peek(|r| r.lock.clone()), window, who)
    }

    fn finish_run(&self, run: u64, exit_code: Option<i32>) -> BoxFuture<Result<()>> {
        super::runs::finish_for_grant(self.release.peek(|r| r.lock.clone()), run, exit_code)
    }

    fn delay(&self, key: String) -> DelayRecord {
        super::delay::record(self.release.peek(|r| r.lock.clone()), key)
    }
}
