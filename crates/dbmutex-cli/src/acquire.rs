//! Taking the plan's lock (or slot): connect, wait within `-w` saying once
//! (or, with `-v`, every 5 s) what for and who holds it, give up on a
//! signal. What it returns, [`Held`], is released in one place
//! ([`Held::release`], from `run`'s finish), whatever happened after.

use std::pin::pin;
use std::time::{Duration, Instant};

use dbmutex::{BackendKind, LockGuard, LockName, LockOptions, Locker, SlotCount};

use crate::child;
use crate::exit::{self, Failure};
use crate::plan::{Notices, Plan};
use crate::report::holders_text;
use crate::say::secs;
use crate::signals::Signals;

/// How long a wait lasts before dbmutex says what it is waiting for.
const NOTICE_AFTER: Duration = Duration::from_secs(1);
/// With `-v`, how often the waiting notice is repeated (with the holders as
/// they are then): often enough to watch a hand-over, rarely enough that a
/// long wait does not flood a log.
const NOTICE_EVERY: Duration = Duration::from_secs(5);
/// How long the "who holds it" query may delay that notice.
const HOLDERS_QUERY_LIMIT: Duration = Duration::from_secs(2);
/// How long the release may take before dbmutex exits anyway (exiting
/// closes the connection, so the server frees the lock regardless).
const RELEASE_LIMIT: Duration = Duration::from_secs(10);
/// After giving up a wait, time for the library's background cancel of the
/// server-side wait to go out before the process exits.
const CANCEL_GRACE: Duration = Duration::from_millis(50);

/// The lock, held: released by [`Held::release`] (or, should dbmutex die,
/// by the server when its connection closes).
pub struct Held {
    /// Kept for as long as the lock is held.
    _locker: Locker,
    guard: LockGuard,
    /// With `--slots`: the markers of the slot count, released first.
    count: Option<SlotCount>,
}

impl Held {
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Releases the lock (after a slot's count markers), waiting at most
    /// [`RELEASE_LIMIT`] for the server.
    pub async fn release(self) -> Result<(), dbmutex::Error> {
        let release = async {
            if let Some(count) = self.count {
                // The slot's own release is what the status reports.
                let _ = count.release().await;
            }
            self.guard.release().await
        };
        tokio::time::timeout(RELEASE_LIMIT, release)
            .await
            .unwrap_or_else(|_| Err(dbmutex::Error::Database("no answer from the server".into())))
    }
}

/// Takes the plan's lock; [`Taken::Not`] when it was not acquired or a
/// signal ended the wait (said as the plan's notices say).
pub async fn take(plan: &Plan, signals: &mut Signals) -> Result<Taken, Failure> {
    let start = Instant::now();
    let taken = tokio::select! {
        r = connect_and_take(plan) => r?,
        sig = signals.recv() => {
            tokio::time::sleep(CANCEL_GRACE).await;
            plan.say.note(format_args!(
                "got {} while waiting for lock {}; not running the command",
                child::signal_name(sig),
                plan.name
            ));
            return Ok(Taken::Not(exit::for_signal(sig)));
        }
    };
    let Some(held) = taken else {
        if plan.wait == Some(Duration::ZERO) {
            plan.busy.note(format_args!(
                "lock {} is held elsewhere; not running the command",
                plan.name
            ));
        } else {
            plan.busy.note(format_args!(
                "gave up waiting for lock {} after {}; not running the command",
                plan.name,
                secs(start.elapsed())
            ));
        }
        return Ok(Taken::Not(plan.conflict_exit_code));
    };
    let fence = held
        .guard
        .fence()
        .map(|t| format!(", fence {t}"))
        .unwrap_or_default();
    plan.say.detail(format_args!(
        "acquired lock {} ({}{fence}) on {} after {}",
        plan.name,
        plan.mode.as_str(),
        plan.target.describe(),
        secs(start.elapsed())
    ));
    Ok(Taken::Held(Box::new(held)))
}

/// What [`take`] got.
pub enum Taken {
    /// Boxed: a `Held` is some 200 bytes, the other variant one.
    Held(Box<Held>),
    /// Not acquired (busy, timed out, or a signal): exit with this status.
    Not(u8),
}

async fn connect_and_take(plan: &Plan) -> Result<Option<Held>, Failure> {
    let start = tokio::time::Instant::now();
    let locker = plan.target.connect_for_wait(plan.wait).await?;
    let held = |r: Option<(LockGuard, Option<SlotCount>)>| {
        r.map(|(guard, count)| Held {
            _locker: locker.clone(),
            guard,
            count,
        })
    };
    // `-w` bounds the whole wait, the connect included.
    let left = || plan.wait.map(|w| w.saturating_sub(start.elapsed()));
    // With a notice to give (a wait that can outlast its first second), on
    // a server where a wait blocks its connection: one try, and if the
    // lock is busy, who holds it, read now on the connection that will
    // wait (a fleet of waiters each opening a second one to say "held by"
    // would crowd the server out). A try or read that fails leaves it to
    // the wait, which reconnects within `-w`.
    let mut first_holders = None;
    let blocks = matches!(locker.backend(), BackendKind::Postgres | BackendKind::Mysql);
    if blocks && plan.notices != Notices::Never && plan.wait.is_none_or(|w| w > NOTICE_AFTER) {
        let once = plan.opts.clone().timeout(Duration::ZERO);
        match acquire(&locker, &plan.lock, &once, plan.slots).await {
            Ok(Some(got)) => return Ok(held(Some(got))),
            Ok(None) => first_holders = Some(holders_now(&locker, plan, left()).await),
            Err(_) => {}
        }
    }
    let wait = left();
    let opts = plan.opts.clone().timeout_opt(wait);
    let acquire = async {
        acquire(&locker, &plan.lock, &opts, plan.slots)
            .await
            .map_err(exit::after_connect)
    };
    let mut acquire = pin!(acquire);
    let mut next = NOTICE_AFTER;
    let mut said = 0u32;
    while plan.notices == Notices::Repeat || (plan.notices == Notices::Once && said == 0) {
        tokio::select! {
            r = &mut acquire => return Ok(held(r?)),
            () = tokio::time::sleep_until(start + next) => {}
        }
        // Still waiting: say on what, and who holds it. The first notice
        // names the holders read before the wait; `-v`'s later ones read
        // them again while the wait goes on (a short-lived second
        // connection on PostgreSQL and MySQL: asked for with `-v`).
        let who = match first_holders.take() {
            Some(who) => who,
            None => tokio::select! {
                r = &mut acquire => return Ok(held(r?)),
                who = holders_now(&locker, plan, None) => who,
            },
        };
        if said == 0 {
            eprintln!("dbmutex: waiting for lock {}{who}", plan.name);
        } else {
            eprintln!(
                "dbmutex: still waiting for lock {} after {}{who}",
                plan.name,
                secs(start.elapsed())
            );
        }
        said += 1;
        // The next notice keeps to the period however long the query took.
        next += NOTICE_EVERY;
        while start + next <= tokio::time::Instant::now() {
            next += NOTICE_EVERY;
        }
    }
    Ok(held(acquire.await?))
}

/// " (held by ...)" as the server tells now, or nothing if it does not
/// tell within [`HOLDERS_QUERY_LIMIT`] (or within `left`, what is left of
/// `-w`).
async fn holders_now(locker: &Locker, plan: &Plan, left: Option<Duration>) -> String {
    let limit = left.map_or(HOLDERS_QUERY_LIMIT, |l| l.min(HOLDERS_QUERY_LIMIT));
    match tokio::time::timeout(limit, locker.holders(plan.lock.clone())).await {
        Ok(Ok(h)) if !h.is_empty() => format!(" (held by {})", holders_text(&h)),
        _ => String::new(),
    }
}

/// Takes the lock within the options' wait with the library's default
/// strategy: one cheap attempt on the locker's shared session, then (if
/// that failed and a wait is allowed) a wait in the server, which hands the
/// lock over the moment it is released. With `slots`, one of the
/// semaphore's slots (its lock is `LockName::Slot`) and its count markers.
async fn acquire(
    locker: &Locker,
    name: &LockName,
    opts: &LockOptions,
    slots: Option<u32>,
) -> Result<Option<(LockGuard, Option<SlotCount>)>, dbmutex::Error> {
    Ok(match slots {
        Some(n) => locker.acquire_slot(name.to_string(), n, opts).await?.map(|s| {
            let (guard, count) = s.into_parts();
            (guard, Some(count))
        }),
        None => locker.acquire(name.clone(), opts).await?.map(|g| (g, None)),
    })
}
