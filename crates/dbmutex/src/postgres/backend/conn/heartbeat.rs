//! The keepalive probe of a connection that holds locks.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::session::PgConn;
use crate::core::clock::coarse_ms;

impl PgConn {
    /// Keeps checking that the server answers, for a connection that runs
    /// only statements that answer at once (the lock session; a dedicated
    /// connection while it holds its lock): when it
    /// has been quiet for `every`, it sends one short `SELECT` (carrying the last
    /// lock name's comment, so `pg_stat_activity` still shows it); no answer
    /// within `every` (at least 500 ms) closes it and reports it lost. So a
    /// silent failure — a partition, a hung server — is noticed within
    /// `every + max(every, 500 ms)` of the last answer, where TCP keepalive
    /// alone may take much longer (a middlebox or proxy that still
    /// acknowledges TCP hides it).
    ///
    /// Each probe of a session-lock connection also checks that it still
    /// runs on its claimed server session (see
    /// [`Claim`](super::session::Claim)); with `xact` (a connection whose open
    /// transaction pins its session) it need not. It also checks that a
    /// server that was a writable primary at connect still is (see
    /// [`probe_query`](Self::probe_query)), so a holder on a primary that a
    /// failover demoted is told within the same bound.
    ///
    /// A connection has one probe task for its life: starting it again only
    /// sets what it probes, and stopping it pauses it (no task is spawned or
    /// aborted per lock: a fleet waiter goes from lock session to waiting
    /// connection and back on every acquisition).
    pub(crate) fn start_heartbeat(self: &Arc<Self>, every: Duration, xact: bool) {
        self.set_beat(if xact { BEAT_XACT } else { BEAT_SESSION });
        let mut beat = self.beat.lock().unwrap_or_else(|e| e.into_inner());
        if beat.as_ref().is_none_or(|h| h.is_finished()) {
            *beat = Some(self.probe(every));
        }
    }

    /// Pauses the keepalive probe, before a statement that may block in the
    /// server (the probe would take its silence for a dead server). A probe
    /// already sent is let go unanswered, as one of an earlier holder.
    pub(crate) fn stop_heartbeat(&self) {
        self.set_beat(BEAT_PAUSED);
    }

    /// A new spell of `mode`, from now: a probe sent in an earlier spell is
    /// let go (its silence may be a blocking wait's, or a pooler's queue,
    /// and no longer says anything about this holder), and the first probe
    /// of the spell goes out only once it has been quiet for `every`.
    fn set_beat(&self, mode: u64) {
        let now = coarse_ms();
        self.beat_mode.store((now << 2) | mode, Ordering::SeqCst);
    }

    /// The probe's clock runs on the process's timer thread ([`crate::core::timers`]),
    /// not on the connection's runtime: a sleeping timer in a runtime makes
    /// every park of that runtime read the clock and search the timer wheel,
    /// which cost the caller's runtime ~700 instructions per lock cycle
    /// (issue #25's callgrind figures) for a probe that, on a busy lock
    /// session, never goes out. The probe itself (its statement, the wait
    /// for its answer, and what follows) runs on the connection's runtime,
    /// as before: a runtime too blocked to read the answer is not taken for
    /// a dead server, since it cannot send the probe either.
    ///
    /// Until the process's timer thread runs, a probe's first sleep (no
    /// probe is due before `every`) is on the connection's runtime, and
    /// only then does a task there start the thread (~100 µs, cold, once
    /// per process) and move the probe to it: not on the path of the
    /// acquisition that started the probe, and a `dbmutex run` whose
    /// command ends within `every` never starts it. (Started while the
    /// lock session connected instead, it cost `dbmutex run x -- true`
    /// 0.15-0.33 ms.)
    fn probe(self: &Arc<Self>, every: Duration) -> tokio::task::AbortHandle {
        let weak = Arc::downgrade(self);
        if let Some(clock) = crate::core::timers::started() {
            let on = clock.unwrap_or(&self.runtime);
            return on.spawn(probe_loop(weak, every, every)).abort_handle();
        }
        self.runtime
            .spawn(async move {
                tokio::time::sleep(every).await;
                let clock = crate::core::timers::handle();
                let Some(conn) = weak.upgrade() else { return };
                let on = clock.unwrap_or(&conn.runtime);
                let probing = on
                    .spawn(probe_loop(Arc::downgrade(&conn), every, Duration::ZERO))
                    .abort_handle();
                // Before this task ends, so `start_heartbeat` never finds
                // it finished with no probe in its place.
                *conn.beat.lock().unwrap_or_else(|e| e.into_inner()) = Some(probing);
            })
            .abort_handle()
    }

    /// One probe, in `spell`: `true` to keep probing (answered `t`, or let
    /// go because the spell changed), `false` once the connection has been
    /// closed or found moved.
    async fn probe_once(self: Arc<Self>, spell: u64, answer_within: Duration) -> bool {
        let conn = self;
        let xact = spell & 3 == BEAT_XACT;
        // A name's text is itself a string name with the same comment.
        let text = conn.last_name.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let comment = crate::key::sql_comment(&crate::LockName::Str(text));
        let query = conn.probe_query(xact, &comment);
        let probe = conn.client.simple_query(&query);
        tokio::pin!(probe);
        loop {
            let asked_ms = coarse_ms();
            match tokio::time::timeout(answer_within, &mut probe).await {
                Ok(Ok(msgs)) => {
                    conn.heard_from_server();
                    match crate::postgres::errors::first_text(&msgs).as_deref() {
                        Some("t") => return true,
                        Some(SUPERSEDED) => {
                            tracing::warn!(
                                "dbmutex: the server of the lock session is no longer a writable \
                                 primary (in recovery, or read-only: demoted in a failover); \
                                 closing it (its locks are lost)"
                            );
                            conn.close();
                        }
                        _ => conn.moved(),
                    }
                    return false;
                }
                // Other answers came meanwhile: the server is alive,
                // just busy (our probe waits its turn behind them).
                Err(_) if conn.last_answer_ms.load(Ordering::Relaxed) > asked_ms => {}
                // Another spell since (paused for a wait that blocks,
                // or another holder's): the probe is let go.
                Err(_) if conn.beat_mode.load(Ordering::SeqCst) != spell => return true,
                _ => {
                    tracing::warn!(
                        "dbmutex: the lock session did not answer its keepalive; closing it (its locks are lost)"
                    );
                    conn.close();
                    return false;
                }
            }
        }
    }

    /// The probe's one statement: `t` while all is well; `f` when it ran
    /// on a server session that is not ours (see
    /// [`Claim`](super::session::Claim); not asked with `xact`);
    /// [`SUPERSEDED`] when the claim found a writable primary and the
    /// server is now in recovery or read-only (`default_transaction_read_only`
    /// turned on, as a failover manager does to a primary it demotes): the
    /// lock there no longer excludes the clients of the new primary. One
    /// round trip either way; `pg_is_in_recovery()` is volatile, so a
    /// load-balancing pooler (pgpool-II) sends the probe to the primary.
    fn probe_query(&self, xact: bool, comment: &str) -> String {
        use std::fmt::Write;
        let mut whens = String::new();
        // Still on our own server session? (A connection without a claim
        // holds only transaction locks, pinned by their transaction.) The
        // token is hex: nothing to escape.
        let claimed = self.claim.get().filter(|_| !xact);
        if let Some(c) = claimed {
            let _ = write!(
                whens,
                " WHEN current_setting('dbmutex.owner', true) IS DISTINCT FROM '{}' THEN 'f'",
                c.token
            );
        }
        // Still a writable primary? The default, not `transaction_read_only`:
        // in the open transaction of a transaction lock, that is the one
        // its BEGIN got, and a reload that fences the server shows only in
        // the default (outside a transaction the two are the same).
        if (claimed.is_some() || xact) && self.writable.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = write!(
                whens,
                " WHEN pg_is_in_recovery() OR current_setting('default_transaction_read_only') <> 'off' \
                 THEN '{SUPERSEDED}'"
            );
        }
        // Nothing to check (a transaction lock on a server that was not a
        // writable primary when it was checked): a CASE needs a WHEN.
        let mut q = match whens.is_empty() {
            true => String::from("SELECT 't'"),
            false => format!("SELECT CASE{whens} ELSE 't' END"),
        };
        if !comment.is_empty() {
            let _ = write!(q, " /* {comment} */");
        }
        q
    }
}

/// `PgConn::beat_mode`'s low two bits (the rest: when the spell began, in
/// `coarse_ms`): no probe (a wait that
/// blocks may be under way).
const BEAT_PAUSED: u64 = 0;
/// Probing a session-lock connection (checks its claim too).
const BEAT_SESSION: u64 = 1;
/// Probing a connection whose open transaction pins its session.
const BEAT_XACT: u64 = 2;

/// The probe's answer when the server is no longer a writable primary.
const SUPERSEDED: &str = "superseded";

/// The keepalive probe's clock for one connection (see `PgConn::probe`):
/// sleeps until the connection has been quiet for `every`, then has one
/// probe run on the connection's runtime; ends with the connection. Its
/// first look is after `first`.
async fn probe_loop(weak: std::sync::Weak<PgConn>, every: Duration, first: Duration) {
    let answer_within = every.max(Duration::from_millis(500));
    let mut wait = first;
    loop {
        tokio::time::sleep(wait).await;
        let Some(conn) = weak.upgrade() else { return };
        if conn.is_lost() {
            return;
        }
        let spell = conn.beat_mode.load(Ordering::SeqCst);
        if spell & 3 == BEAT_PAUSED {
            wait = every;
            continue;
        }
        // The probe goes out `every` after the last answer (or the
        // spell's start), not on a fixed tick: a tick could add up
        // to another `every`.
        let quiet = Duration::from_millis(
            coarse_ms().saturating_sub(conn.last_answer_ms.load(Ordering::Relaxed).max(spell >> 2)),
        );
        if quiet < every {
            wait = every - quiet;
            continue;
        }
        wait = every;
        let runtime = conn.runtime.clone();
        // A runtime shut down (its connection task with it)
        // ends the probing too.
        match runtime.spawn(conn.probe_once(spell, answer_within)).await {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
    }
}
