//! Slots: a counting semaphore across processes and hosts, on top of
//! locks. Slot `i` of NAME is an ordinary lock with a name of its own
//! ([`LockName::Slot`]); holding any one of NAME's `n` slot locks is
//! holding one of its `n` places.
//!
//! Every holder also says how many slots it counts, with marker locks
//! beside the slots (see [`Locker::acquire_slot`], "Counts"), so a holder
//! that counts another number is refused instead of raising the cap, and
//! `status` can see slot holders without being told `n`.

use std::time::Duration;

use crate::core::wait::{Backoff, Deadline};
use crate::{Error, LockGuard, LockName, LockOptions, Locker, Mode, Result};

/// One of a semaphore's slots, held (see [`Locker::acquire_slot`]). Derefs
/// to its [`LockGuard`]; dropping it releases the slot and its count
/// markers.
#[derive(Debug)]
#[must_use = "the slot is released as soon as the guard is dropped"]
pub struct SlotGuard {
    // Dropped first: the markers go before the slot, so whoever takes the
    // slot next never meets this holder's count.
    count: SlotCount,
    guard: LockGuard,
    slot: u32,
}

/// The marker locks by which a slot holder says how many slots it counts
/// (see [`Locker::acquire_slot`], "Counts"). Dropping it releases them.
#[derive(Debug)]
#[must_use = "the count markers are released as soon as this is dropped"]
pub struct SlotCount {
    /// In release order.
    markers: Vec<LockGuard>,
}

impl SlotCount {
    /// Releases the markers, the last taken first.
    pub async fn release(self) -> Result<()> {
        let mut first_err = Ok(());
        for m in self.markers {
            if let Err(e) = m.release().await {
                first_err = first_err.and(Err(e));
            }
        }
        first_err
    }
}

impl SlotGuard {
    /// Which slot (`0..slots`).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's lock guard and its count markers, to hold (and release)
    /// apart. Release the markers first: a slot freed while its holder's
    /// markers stay makes a newcomer that counts another number refused.
    pub fn into_parts(self) -> (LockGuard, SlotCount) {
        (self.guard, self.count)
    }

    /// Releases the slot (as [`LockGuard::release`]) after its markers.
    pub async fn release(self) -> Result<()> {
        let markers = self.count.release().await;
        self.guard.release().await.and(markers)
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
    ///   and 1024.
    ///
    /// # Counts
    ///
    /// `slots` must be the same for every holder of `name`: a holder that
    /// counts 5 beside three that count 3 would make 4 at once. Each holder
    /// therefore also holds marker locks (slot indices from
    /// [`SLOT_MARKERS`] up, never a slot's), and a holder that finds
    /// holders counting another number gets [`Error::Config`] (its slot
    /// released):
    ///
    /// - With shared locks (PostgreSQL, local), every holder holds, shared,
    ///   the marker of its count (`SLOT_MARKERS + slots`) and the marker of
    ///   any count (`SLOT_MARKERS`). More holders of the second than of
    ///   the first (counted per server session or process) means someone
    ///   counts otherwise. Holders mark before they check, so of two that
    ///   come together at least one sees the other.
    /// - MySQL/MariaDB has no shared locks: the holder of slot `i` holds the
    ///   marker `SLOT_MARKERS + 1025 + slots × 1024 + i`, and a held slot
    ///   among the `slots` it counts without that marker is a holder
    ///   counting otherwise. A holder counting more, in a slot beyond the
    ///   newcomer's count, is not seen by the newcomer (it sees the
    ///   newcomer's slots when it comes after).
    ///
    /// Holders in one process (one server session) are one holder to the
    /// markers: their counts are not compared with each other.
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
        let mut backoff = Backoff::new(Deadline::after(opts.timeout), opts.max_backoff);
        let first = fastrand::u32(0..slots);
        loop {
            for slot in (first..slots).chain(0..first) {
                if let Some(guard) = self.acquire(LockName::Slot(name.clone(), slot), &once).await? {
                    let count = self.mark_count(&name, slots, slot, opts).await?;
                    return Ok(Some(SlotGuard { count, guard, slot }));
                }
            }
            if opts.is_try_once() || !backoff.pause(None).await {
                return Ok(None);
            }
        }
    }

    /// Who holds slots of `name` now, whatever they count, and the counts
    /// they give (see "Counts" above). On MySQL/MariaDB, which has no
    /// shared count markers, the counts are not known, and the holders are
    /// found in the server's list of user locks ([`Locker::list`]) or,
    /// where it has none (MariaDB without `metadata_lock_info`, MySQL
    /// without `performance_schema`), by asking each of the [`MAX_SLOTS`]
    /// slot locks (one `IS_USED_LOCK` each: about a second). A snapshot,
    /// as [`Locker::holders`]; holders are counted per server session or
    /// process.
    pub async fn slot_holders(&self, name: &str) -> Result<SlotHolders> {
        if !self.capabilities().shared {
            let slot = |i| LockName::Slot(name.to_owned(), i);
            let holders = match self.list().await {
                // The server lists its user locks (MariaDB's
                // metadata_lock_info, MySQL's performance_schema): one query.
                Ok(listed) => {
                    let keys = (0..MAX_SLOTS)
                        .map(|i| self.key_of(slot(i)))
                        .collect::<Result<std::collections::HashSet<_>>>()?;
                    listed.iter().filter(|l| keys.contains(&l.key)).count()
                }
                Err(Error::Unsupported(_)) => {
                    let mut holders = 0;
                    for i in 0..MAX_SLOTS {
                        holders += usize::from(self.is_locked(slot(i)).await?);
                    }
                    holders
                }
                Err(e) => return Err(e),
            };
            return Ok(SlotHolders {
                holders,
                counts: Vec::new(),
            });
        }
        let holders = self.holders(marker(name, ANY_COUNT)).await?.len();
        let mut counts = Vec::new();
        if holders > 0 {
            // Which counts: the markers among every lock held now, by key.
            let mut by_key = std::collections::HashMap::new();
            for n in 1..=MAX_SLOTS {
                by_key.insert(self.key_of(marker(name, n))?, n);
            }
            for listed in self.list().await? {
                if let Some(&n) = by_key.get(&listed.key) {
                    match counts.iter_mut().find(|(c, _)| *c == n) {
                        Some((_, k)) => *k += 1,
                        None => counts.push((n, 1)),
                    }
                }
            }
            counts.sort_unstable();
        }
        Ok(SlotHolders { holders, counts })
    }

    /// Takes `slot`'s count markers and checks them against the other
    /// holders' (see [`Locker::acquire_slot`], "Counts").
    async fn mark_count(&self, name: &str, slots: u32, slot: u32, opts: &LockOptions) -> Result<SlotCount> {
        let shared = self.capabilities().shared;
        // Markers are never fenced, never limited by max-hold; they wait
        // briefly for a leaver's release (it lets them go before its slot).
        let mark_opts = LockOptions::new()
            .transaction(opts.transaction)
            .mode(if shared { Mode::Shared } else { opts.mode })
            .timeout(MARKER_WAIT);
        let wanted = if shared {
            vec![marker(name, slots), marker(name, ANY_COUNT)]
        } else {
            vec![slot_marker(name, slots, slot)]
        };
        let mut markers = Vec::new();
        for m in wanted {
            match self.acquire(m.clone(), &mark_opts).await? {
                Some(g) => markers.insert(0, g),
                None => {
                    return Err(Error::Database(
                        format!("the count marker {m} of the semaphore stayed busy for {MARKER_WAIT:?}")
                            .into(),
                    ))
                }
            }
        }
        let count = SlotCount { markers };
        let mut tries = 0;
        // A mismatch seen once may be a holder of our count between its
        // two steps: look again before refusing.
        loop {
            let other = if shared {
                self.other_counts_shared(name, slots).await?
            } else {
                self.other_counts_by_slot(name, slots, slot).await?
            };
            if !other {
                return Ok(count);
            }
            tries += 1;
            if tries == MARKER_CHECKS {
                let _ = count.release().await;
                return Err(Error::Config(format!(
                    "holders of the semaphore {name:?} count another number of slots than {slots}: \
                     every holder must give the same count"
                )));
            }
            tokio::time::sleep(MARKER_RECHECK).await;
        }
    }

    async fn other_counts_shared(&self, name: &str, slots: u32) -> Result<bool> {
        let any = self.holders(marker(name, ANY_COUNT)).await?.len();
        let ours = self.holders(marker(name, slots)).await?.len();
        Ok(any > ours)
    }

    async fn other_counts_by_slot(&self, name: &str, slots: u32, slot: u32) -> Result<bool> {
        for j in (0..slots).filter(|&j| j != slot) {
            if self.is_locked(LockName::Slot(name.to_owned(), j)).await?
                && !self.is_locked(slot_marker(name, slots, j)).await?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Who holds slots of a semaphore (see [`Locker::slot_holders`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlotHolders {
    /// Holders of any of its slots.
    pub holders: usize,
    /// The counts they give, each with its number of holders, by count
    /// (empty where unknown: MySQL/MariaDB). More than one: holders
    /// disagree (see [`Locker::acquire_slot`]).
    pub counts: Vec<(u32, usize)>,
}

/// The most slots a semaphore may have.
pub const MAX_SLOTS: u32 = 1024;

/// The first slot index of the count markers (see [`Locker::acquire_slot`],
/// "Counts"); slots themselves are below [`MAX_SLOTS`].
pub const SLOT_MARKERS: u32 = 1 << 20;

/// The count that stands for "any count" in a shared marker's index.
const ANY_COUNT: u32 = 0;
/// How long a marker may be busy (a leaver of the same count letting its
/// per-slot marker go).
const MARKER_WAIT: Duration = Duration::from_secs(2);
/// How many checks must see another count before a holder is refused.
const MARKER_CHECKS: u32 = 3;
const MARKER_RECHECK: Duration = Duration::from_millis(20);

/// The shared marker of holders counting `slots` (or any count, 0).
fn marker(name: &str, slots: u32) -> LockName {
    LockName::Slot(name.to_owned(), SLOT_MARKERS + slots)
}

/// MySQL/MariaDB: the marker of slot `slot` held by a holder counting `slots`.
fn slot_marker(name: &str, slots: u32, slot: u32) -> LockName {
    LockName::Slot(
        name.to_owned(),
        SLOT_MARKERS + MAX_SLOTS + 1 + slots * MAX_SLOTS + slot,
    )
}
