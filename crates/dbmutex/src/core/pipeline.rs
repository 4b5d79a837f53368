//! The acquisition pipeline, read top to bottom:
//! validate → cap → capability check → key → deadline → in-process hold →
//! admit → try/poll or server wait → lock-delay and fence (when asked) →
//! guard.
//!
//! [`Pipeline`] runs it over any [`Backend`]; [`Engine`] is its object-safe
//! face, which the [`Locker`](crate::Locker) holds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::arbiter::{Arbiter, SlotExt};
use super::backend::{Attempt, Backend, Missing, WaitIn, Waited};
use super::guard::{BoxFut, Grant, LockGuard};
use super::metrics::{Attempt as Measured, Labels, Outcome};
use super::permits::{Permit, Permits};
use super::reuse::{boxed_cold, Reused};
use super::settle::{self, Settled};
use super::upgrade::{self, Upgrade, Upgraded};
use super::wait::{Backoff, Deadline};
use crate::runs::LastRun;
use crate::settings::Settings;
use crate::types::{BackendKind, Capabilities, Holder, ListedLock};
use crate::{Error, LockName, LockOptions, Mode, Result};

super::reuse::shelf! {
    /// Each thread's spare allocation for server waits.
    static WAITS;
    /// ... for waits after a failed try.
    static WAITS_AFTER_TRY;
    /// ... for acquisitions.
    static ACQUIRES;
}

/// A backend behind the core, as the [`Locker`](crate::Locker) sees it.
pub(crate) trait Engine: Send + Sync {
    fn kind(&self) -> BackendKind;
    fn capabilities(&self) -> Capabilities;
    /// The id of the locker (shared by its clones).
    fn id(&self) -> u64;
    fn held_count(&self) -> usize;
    /// Boxed on [`ACQUIRES`]' spare allocation (large, made on every lock).
    fn acquire<'a>(&'a self, name: LockName, opts: &'a LockOptions) -> Reused<'a, Result<Option<LockGuard>>>;
    fn holders(&self, name: LockName) -> BoxFut<'_, Result<Vec<Holder>>>;
    fn is_locked(&self, name: LockName) -> BoxFut<'_, Result<bool>>;
    fn list(&self) -> BoxFut<'_, Result<Vec<ListedLock>>>;
    fn key_of(&self, name: &LockName) -> Result<String>;
    fn create_tables(&self) -> BoxFut<'_, Result<()>>;
    fn last_run(&self, name: LockName) -> BoxFut<'_, Result<Option<LastRun>>>;
    /// Upgrades `name`, held shared by this task's enclosing scoped call
    /// (whose grant gave `up`), to exclusive (see [`super::upgrade`]).
    fn upgrade<'a>(
        &'a self,
        name: &'a LockName,
        opts: &'a LockOptions,
        up: Option<Arc<dyn Upgrade>>,
    ) -> BoxFut<'a, Result<Option<Upgraded>>>;
}

/// The longest pause between two reconnects of a wait that lost its server.
const RECONNECT_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);

/// The pipeline over one backend.
pub(crate) struct Pipeline<B: Backend> {
    backend: B,
    /// Which backend it is (for metrics, `Locker::kind` and the capability
    /// table), told by whoever made it from the URL.
    kind: BackendKind,
    /// The in-process arbiter: tasks of this locker told apart before the
    /// server sees them.
    arbiter: Arc<Arbiter<B::Key, B::SlotExt>>,
    settings: Settings,
    id: u64,
    /// Locks held through this locker now (the cap).
    count: Arc<AtomicUsize>,
    /// Permits to wait in the server under [`WaitIn::TryThenServer`]; a
    /// grant won that way keeps its permit until released.
    server_waits: Arc<Permits>,
}

impl<B: Backend> Pipeline<B> {
    pub(crate) fn new(backend: B, kind: BackendKind, settings: Settings, id: u64) -> Self {
        Pipeline {
            kind,
            server_waits: Permits::new(settings.max_server_waits),
            backend,
            arbiter: Arc::default(),
            settings,
            id,
            count: Arc::default(),
        }
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the hold, the ticket and any grant are owned by this
    /// future (or by a backend task that undoes what nobody takes over), so
    /// dropping it at any await point leaves nothing held.
    async fn acquire(&self, name: LockName, opts: &LockOptions) -> Result<Option<LockGuard>> {
        // Recorded once however it ends (dropped mid-way: `cancelled`).
        let labels = Labels::new(self.kind, opts.mode, &name, self.settings.metrics_name_label);
        let measured = Measured::start(labels.clone());
        let r = self.acquire_inner(name, opts, labels).await;
        measured.end(Outcome::of(r.as_ref().map(Option::is_some), opts.is_try_once()));
        r
    }

    async fn acquire_inner(
        &self,
        name: LockName,
        opts: &LockOptions,
        labels: Labels,
    ) -> Result<Option<LockGuard>> {
        name.validate()?;
        if let Some(held) = super::scope::held_against(self.id, &name, opts.mode) {
            // Held, by this very task: busy for a try, a deadlock for a wait.
            if opts.is_try_once() {
                return Ok(None);
            }
            return Err(upgrade::self_deadlock(&name, held, opts.mode));
        }
        // The cap, reserved before the first await and atomically, so
        // concurrent acquirers never pass it together.
        let limit = self.settings.max_locks;
        if self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Error::TooManyLocks { limit });
        }
        let reservation = Reservation(&self.count);
        self.refuse(opts)?;
        let key = self.backend.key(&name)?;
        // Timed only for the debug log (a clock read is not free).
        let start = tracing::enabled!(tracing::Level::DEBUG).then(tokio::time::Instant::now);
        let deadline = Deadline::after(opts.timeout);
        let grant = if start.is_some() {
            // The debug log's span, boxed: off, it costs the hot path's
            // future nothing.
            let span = tracing::debug_span!("dbmutex", name = %name, mode = opts.mode.as_str());
            boxed_cold(|| tracing::Instrument::instrument(self.grant(&name, &key, opts, deadline), span))
                .await?
        } else {
            self.grant(&name, &key, opts, deadline).await?
        };
        let waited_us = start.map_or(0, |s| s.elapsed().as_micros() as u64);
        match grant {
            Some(Granted { grant: g, permit }) => {
                // Rare and large: boxed, off the hot path's future.
                let Settled {
                    grant: g,
                    fence,
                    delay,
                } = if opts.fenced || opts.lock_delay.is_some() {
                    match boxed_cold(|| settle::settle(g, &name, key.to_string(), opts, deadline.at()))
                        .await?
                    {
                        Some(s) => s,
                        None => return Ok(None),
                    }
                } else {
                    Settled::plain(g)
                };
                std::mem::forget(reservation);
                tracing::debug!(name = %name, mode = opts.mode.as_str(), waited_us, fence, "dbmutex: acquired");
                Ok(Some(LockGuard::new(
                    g,
                    permit,
                    name,
                    opts.mode,
                    fence,
                    self.count.clone(),
                    labels,
                    opts.max_hold,
                    delay,
                )))
            }
            None if opts.is_try_once() => {
                tracing::debug!(name = %name, "dbmutex: busy (tried once)");
                Ok(None)
            }
            None => {
                tracing::debug!(name = %name, waited_us, "dbmutex: timed out");
                Ok(None)
            }
        }
    }

    /// The backend's records, or why there are none.
    fn records(&self) -> Result<&dyn super::backend::Records> {
        self.backend.records().ok_or_else(|| {
            Error::Unsupported(format!(
                "the {} backend keeps no records (fencing tokens, runs)",
                self.kind.as_str()
            ))
        })
    }

    /// An option the backend cannot honour, refused in its own words.
    fn refuse(&self, opts: &LockOptions) -> Result<()> {
        if (opts.fenced || opts.lock_delay.is_some()) && (opts.mode == Mode::Shared || opts.transaction) {
            // Token order is lock order only for a lock one holder has at a
            // time, until released: shared holders overlap, and a token
            // (or a lock-delay record) written in a transaction lock's
            // transaction would roll back with it.
            let what = if opts.fenced {
                "fencing tokens"
            } else {
                "lock-delay"
            };
            return Err(Error::Unsupported(format!(
                "{what} needs an exclusive session lock (not shared(true) or transaction(true))"
            )));
        }
        let needs = [
            (opts.mode == Mode::Shared).then_some(Missing::Shared),
            opts.transaction.then_some(Missing::Transaction),
            (!opts.transaction).then_some(Missing::SessionLocks),
            opts.fenced.then_some(Missing::Fencing),
        ];
        match needs.into_iter().flatten().find_map(|m| self.backend.refusal(m)) {
            Some(why) => Err(Error::Unsupported(why)),
            None => Ok(()),
        }
    }

    /// Deadline → (hold → admit → wait), again after a lost or refused
    /// connection until the deadline: a waiter rides out a server restart,
    /// a dropped connection or a pooler slow to hand out a session
    /// (reconnecting with backoff), and fails with the last error only once
    /// its own bound has passed. A try-once fails at once.
    async fn grant(
        &self,
        name: &LockName,
        key: &B::Key,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Granted>> {
        let mut backoff = Backoff::new(deadline, RECONNECT_BACKOFF);
        let mut told = false;
        loop {
            // Retries are rare: boxed, so the first attempt's future is
            // the only one inline (this size is moved on every lock).
            let r = match (told, deadline.at()) {
                // A retry's connect must not outlast the caller's bound.
                (true, Some(d)) => {
                    match tokio::time::timeout_at(
                        d,
                        boxed_cold(|| self.grant_once(name, key, opts, deadline)),
                    )
                    .await
                    {
                        Ok(r) => r,
                        Err(_) => return Ok(None),
                    }
                }
                _ => self.grant_once(name, key, opts, deadline).await,
            };
            match r {
                Err(e) if matches!(e, Error::Connect(_)) && !opts.is_try_once() => {
                    if !told {
                        tracing::warn!(name = %name, error = %e, "dbmutex: lost the server while waiting; reconnecting until the wait's bound");
                        told = true;
                    }
                    if !backoff.pause(None).await {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    /// Hold → begin → wait, once.
    async fn grant_once(
        &self,
        name: &LockName,
        key: &B::Key,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Granted>> {
        let plan = self.backend.plan(opts);
        // In-process first: costs the server nothing, and the server could
        // not tell the tasks on one session apart anyway.
        let hold = if plan.hold {
            match self.arbiter.hold(key, opts.mode, deadline.at()).await {
                Some(h) => Some(h),
                None => return Ok(None),
            }
        } else {
            None
        };
        let mut at = Attempt {
            name,
            key,
            opts,
            settings: &self.settings,
            deadline,
            hold,
            locker: self.id,
        };
        let tries = self.backend.begin(&at).await?;
        // The waits are boxed: only the first try is inline in the
        // acquisition's future, which stays small (it is moved on every
        // acquisition); a wait reuses the allocation of this thread's last
        // wait (`core::reuse`: a wait's future is ~4 KB, past malloc's
        // per-thread cache).
        let g = match plan.wait {
            WaitIn::Server => {
                match Reused::new_cold(&WAITS, || self.backend.wait_in_server(tries, &mut at)).await? {
                    Waited::Granted(g) => Some(g),
                    Waited::TimedOut => None,
                    Waited::Poll(_) => {
                        return Err(Error::Database(
                            "the server wait asked to poll where the backend cannot".into(),
                        ))
                    }
                }
            }
            WaitIn::Poll { max_backoff } => boxed_cold(|| self.poll(&tries, &mut at, max_backoff)).await?,
            WaitIn::TryThenServer { max_backoff } => {
                if let Some(g) = self.backend.try_once(&tries, &mut at).await? {
                    return Ok(Some(Granted::new(g, None)));
                }
                if opts.is_try_once() || at.deadline.passed() {
                    return Ok(None);
                }
                return Reused::new_cold(&WAITS_AFTER_TRY, || {
                    self.wait_after_try(tries, &mut at, max_backoff)
                })
                .await;
            }
        };
        Ok(g.map(|g| Granted::new(g, None)))
    }

    /// [`WaitIn::TryThenServer`] once the try failed: a permit (the
    /// locker's bound on server waits), then the wait in the server; without
    /// a permit, or when the backend cannot wait now, poll.
    async fn wait_after_try(
        &self,
        tries: B::Tries,
        at: &mut Attempt<'_, B>,
        max_backoff: std::time::Duration,
    ) -> Result<Option<Granted>> {
        // Polling is the rare way here: boxed, so the wait's future stays small.
        let (tries, permit) = match self.server_waits.try_take() {
            Some(permit) => match self.backend.wait_in_server(tries, at).await? {
                Waited::Granted(g) => return Ok(Some(Granted::new(g, Some(permit)))),
                Waited::TimedOut => return Ok(None),
                Waited::Poll(tries) => (tries, Some(permit)),
            },
            None => (tries, None),
        };
        drop(permit);
        Ok(boxed_cold(|| self.poll(&tries, at, max_backoff))
            .await?
            .map(|g| Granted::new(g, None)))
    }

    /// Tries until granted or the deadline passed, pausing with backoff,
    /// woken early by an in-process release or the backend's own signal.
    async fn poll(
        &self,
        tries: &B::Tries,
        at: &mut Attempt<'_, B>,
        max_backoff: std::time::Duration,
    ) -> Result<Option<Box<dyn Grant>>> {
        let slot = at.hold.as_ref().map(|h| h.slot().clone());
        let wake = slot.as_deref().and_then(<B::SlotExt as SlotExt>::wake);
        let mut backoff = Backoff::new(at.deadline, max_backoff);
        loop {
            // Registered before the try, so a release between the try and
            // the pause is not missed.
            let mut notified = wake.map(|w| Box::pin(w.notified()));
            if let Some(n) = notified.as_mut() {
                n.as_mut().enable();
            }
            if let Some(g) = self.backend.try_once(tries, at).await? {
                return Ok(Some(g));
            }
            if !backoff.pause(notified.as_mut().map(|n| n.as_mut())).await {
                return Ok(None);
            }
        }
    }
}

impl<B: Backend> Engine for Pipeline<B> {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            session_locks: self.backend.refusal(Missing::SessionLocks).is_none(),
            ..self.kind.capabilities()
        }
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn held_count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    fn acquire<'a>(&'a self, name: LockName, opts: &'a LockOptions) -> Reused<'a, Result<Option<LockGuard>>> {
        if cfg!(feature = "metrics") {
            return Reused::new(&ACQUIRES, || Pipeline::acquire(self, name, opts));
        }
        // Nothing to measure: no wrapper (a state machine fewer per lock).
        let labels = Labels::new(self.kind, opts.mode, &name, self.settings.metrics_name_label);
        Reused::new(&ACQUIRES, || self.acquire_inner(name, opts, labels))
    }

    fn holders(&self, name: LockName) -> BoxFut<'_, Result<Vec<Holder>>> {
        Box::pin(async move {
            name.validate()?;
            let key = self.backend.key(&name)?;
            let rows = self.backend.held(Some((&name, &key))).await?;
            Ok(rows.into_iter().map(|r| r.holder).collect())
        })
    }

    fn is_locked(&self, name: LockName) -> BoxFut<'_, Result<bool>> {
        Box::pin(async move {
            name.validate()?;
            let key = self.backend.key(&name)?;
            Ok(!self.backend.held(Some((&name, &key))).await?.is_empty())
        })
    }

    fn list(&self) -> BoxFut<'_, Result<Vec<ListedLock>>> {
        Box::pin(self.backend.held(None))
    }

    fn key_of(&self, name: &LockName) -> Result<String> {
        name.validate()?;
        Ok(self.backend.key(name)?.to_string())
    }

    fn create_tables(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move { self.records()?.create_tables().await })
    }

    fn last_run(&self, name: LockName) -> BoxFut<'_, Result<Option<LastRun>>> {
        Box::pin(async move {
            name.validate()?;
            let key = self.backend.key(&name)?;
            self.records()?.last_run(&name, &key.to_string()).await
        })
    }

    fn upgrade<'a>(
        &'a self,
        name: &'a LockName,
        opts: &'a LockOptions,
        up: Option<Arc<dyn Upgrade>>,
    ) -> BoxFut<'a, Result<Option<Upgraded>>> {
        Box::pin(async move {
            let labels = Labels::new(self.kind, opts.mode, name, self.settings.metrics_name_label);
            let measured = Measured::start(labels);
            let r = match self.backend.key(name) {
                Ok(key) => upgrade::acquire(&self.backend, &self.arbiter, &key, name, opts, up).await,
                Err(e) => Err(e),
            };
            measured.end(Outcome::of(r.as_ref().map(Option::is_some), opts.is_try_once()));
            r
        })
    }
}

/// A grant, with the server-wait permit it took (kept until released).
struct Granted {
    grant: Box<dyn Grant>,
    permit: Option<Permit>,
}

impl Granted {
    fn new(grant: Box<dyn Grant>, permit: Option<Permit>) -> Self {
        Granted { grant, permit }
    }
}

/// Undoes a cap reservation unless forgotten.
struct Reservation<'a>(&'a AtomicUsize);

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
