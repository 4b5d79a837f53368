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
use crate::core::guard::{BoxFuture, DelayRecord, Grant, OnSession};
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
    /// From `Drop`: no runtime is needed here, the handle spawns onto the
    /// connection's own runtime. If that runtime is gone, so is the
    /// connection, and the server has freed the lock.
    fn in_background(mut self) {
        if self.lock.mode == Mode::Exclusive {
            if let Some(h) = self.hold.take() {
                self.hold = handoff::park(&self.lock, h);
                if self.hold.is_none() {
                    // Handed to a waiter of this process, as `release` does.
                    self.names.remove(&self.lock.key);
                    return;
                }
            }
        }
        if self
            .lock
            .conn
            .send_unlock(self.lock.mode, &self.lock.key, self.lock.text)
        {
            // On the wire: whatever this process sends next reaches the
            // server after it, so the hold and the room can go now.
            self.names.remove(&self.lock.key);
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
                lock,
                hold,
                budget,
                names,
            } = self;
            names.remove(&lock.key);
            let r = lock.unlock().await;
            drop((hold, budget));
            if let Err(e) = r {
                tracing::warn!(name = %lock.name, error = %e, "dbmutex: unlock on drop failed");
            }
        }));
    }
}

impl Grant for SessionGrant {
    fn release(mut self: Box<Self>) -> BoxFuture<Result<()>> {
        Box::pin(async move {
            // Dropped before its first poll, this future drops `self`, whose
            // armed undo unlocks in the background. From here on the future
            // owns the unlock: its first poll sends it (below).
            let Release {
                lock,
                mut hold,
                budget,
                names,
            } = self.release.take().expect("held until released");
            names.remove(&lock.key);
            let _budget = budget;
            if lock.mode == Mode::Exclusive {
                if let Some(h) = hold.take() {
                    hold = handoff::park(&lock, h);
                    if hold.is_none() {
                        return Ok(());
                    }
                }
            }
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
