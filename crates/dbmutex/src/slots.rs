//! Slots: a counting semaphore across processes and hosts, on top of
//! locks. Slot `i` of NAME is an ordinary lock with a name of its own
//! ([`LockName::Slot`]); holding any one of NAME's `n` slot locks is
//! holding one of its `n` places.

use std::time::Duration;

use crate::core::wait::{deadline, Backoff};
use crate::{Error, LockGuard, LockName, LockOptions, Locker, Result};

/// One of a semaphore's slots, held (see [`Locker::acquire_slot`]). Derefs
/// to its [`LockGuard`]; dropping it releases the slot.
#[derive(Debug)]
#[must_use = "the slot is released as soon as the guard is dropped"]
pub struct SlotGuard {
    guard: LockGuard,
    slot: u32,
}

impl SlotGuard {
    /// Which slot (`0..slots`).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's lock guard.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Releases the slot (as [`LockGuard::release`]).
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}

impl std::ops::Deref for SlotGuard {
    type Target = LockGuard;
    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl Locker {
    /// Takes one of `slots` places of the semaphore `name`: at most `slots`
    /// holders at once, across processes and hosts. `None` when none came
    /// free within the wait [`LockOptions`] sets.
    ///
    /// - Slot `i` is the lock [`LockName::Slot`]`(name, i)`, whose key is
    ///   disjoint from every string and integer name's, so a slot never
    ///   excludes a plain lock and the other way round.
    /// - Each round tries every slot once, starting at a random one (so
    ///   holders spread), then pauses as a polling wait does (doubling up to
    ///   [`LockOptions::max_backoff`]); there is no queue between waiters.
    /// - Modes and transaction locks are as for one lock; `slots` between 1
    ///   and 1024, and the same for every holder of `name` (a holder that
    ///   counts fewer slots only excludes the others less).
    ///
    /// ```no_run
    /// # async fn demo(locker: dbmutex::Locker) -> Result<(), dbmutex::Error> {
    /// use dbmutex::LockOptions;
    /// use std::time::Duration;
    /// let opts = LockOptions::new().timeout(Duration::from_secs(30));
    /// if let Some(slot) = locker.acquire_slot("render", 3, &opts).await? {
    ///     println!("rendering in slot {} of 3", slot.slot());
    ///     slot.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`Locker::acquire`].
    pub async fn acquire_slot(
        &self,
        name: impl Into<String>,
        slots: u32,
        opts: &LockOptions,
    ) -> Result<Option<SlotGuard>> {
        let name = name.into();
        if !(1..=MAX_SLOTS).contains(&slots) {
            return Err(Error::Config(format!(
                "a semaphore has 1 to {MAX_SLOTS} slots, not {slots}"
            )));
        }
        LockName::Slot(name.clone(), 0).validate()?;
        let once = opts.clone().timeout(Duration::ZERO);
        let mut backoff = Backoff::new(deadline(opts.timeout), opts.max_backoff);
        let first = fastrand::u32(0..slots);
        loop {
            for slot in (first..slots).chain(0..first) {
                if let Some(guard) = self.acquire(LockName::Slot(name.clone(), slot), &once).await? {
                    return Ok(Some(SlotGuard { guard, slot }));
                }
            }
            if opts.is_try_once() || !backoff.pause(None).await {
                return Ok(None);
            }
        }
    }
}

/// The most slots a semaphore may have.
pub const MAX_SLOTS: u32 = 1024;
