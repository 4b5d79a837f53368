//! A nested acquisition: inside a scoped call that holds a lock of the same
//! locker, `GET_LOCK` waits on that lock's session, as the gem does, so the
//! server sees the whole chain and can detect a deadlock.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::conn::answer_bound;
use super::errors::{db_err, fail_err, null_err, Fail};
use super::get_lock::{chunk, get_lock_once, NESTED_CHUNK};
use super::grant::MyGrant;
use super::lock_conn::{Claim, LockConn};
use super::registry::Shared;
use crate::core::arbiter::Hold;
use crate::core::backend::{Attempt, Backend};
use crate::core::guard::Grant;
use crate::settings::Settings;
use crate::{Error, LockName, Result};

/// The session holding `enclosing` (the innermost scoped lock of this
/// locker in this task), claimed for one nested acquisition. Scoped
/// calls of other lockers never lend their sessions: their lock strings
/// may equal ones this locker holds through unrelated guards.
pub(super) fn claim_enclosing(
    shared: &Shared,
    enclosing: Option<&LockName>,
    settings: &Settings,
) -> Option<Claim> {
    let key = shared.lock_string(enclosing?, &settings.prefix).ok()?;
    let registry = shared.registry.lock().unwrap_or_else(|e| e.into_inner());
    let lc: Arc<LockConn> = registry.get(&key)?.lc.clone();
    drop(registry);
    if lc.is_lost() {
        return None;
    }
    lc.claim()
}

/// Waits on the enclosing scoped call's session. `Err(hold)` when that
/// session is gone (its scoped call is stopping): the acquisition goes
/// on with a connection of its own.
pub(super) async fn wait<B: Backend<Key = String>>(
    shared: &Arc<Shared>,
    claim: Claim,
    at: &Attempt<'_, B>,
    hold: Option<Hold<String>>,
) -> std::result::Result<Result<Option<Box<dyn Grant>>>, Option<Hold<String>>> {
    let (tx, rx) = oneshot::channel();
    let nested = Nested {
        shared: shared.clone(),
        claim,
        lock: at.key.clone(),
        name: at.name.clone(),
        deadline: at.deadline.at(),
        keepalive: at.settings.keepalive,
    };
    // A task of its own: if this acquisition is dropped midway, the task
    // still ends the wait cleanly and gives the session back (see
    // `Nested::run`).
    drop(shared.runtime.spawn(nested.run(hold, tx)));
    match rx.await {
        Ok(NestedEnd::Done(r)) => Ok(r.map(|g| g.map(|g| Box::new(g) as Box<dyn Grant>))),
        Ok(NestedEnd::Gone(hold)) => Err(hold),
        Err(_) => Ok(Err(Error::Database(
            "the nested MySQL acquisition task ended unexpectedly".into(),
        ))),
    }
}

/// How a nested acquisition's task ended, sent to the acquisition.
enum NestedEnd {
    Done(Result<Option<MyGrant>>),
    /// The enclosing session is gone: the in-process hold comes back, and
    /// the acquisition goes on with a connection of its own.
    Gone(Option<Hold<String>>),
}

/// A nested acquisition: `GET_LOCK` on the enclosing scoped call's session.
struct Nested {
    shared: Arc<Shared>,
    claim: Claim,
    lock: String,
    name: LockName,
    deadline: Option<Instant>,
    keepalive: Duration,
}

impl Nested {
    /// Waits in chunks of [`NESTED_CHUNK`], taking the session's connection
    /// for each and giving it back after each (the session mutex is fair:
    /// a queued release or ping runs in between), and sends the outcome on
    /// `tx`.
    ///
    /// If the acquisition stops listening (it was dropped) while a
    /// `GET_LOCK` runs, the statement is ended with `KILL QUERY` from
    /// another connection — never `KILL CONNECTION`: the session holds the
    /// enclosing lock — its answer read, and a lock it took after all
    /// released, before the connection goes back to its owner. An outcome
    /// sent just as the acquisition is dropped is dropped with the channel:
    /// a [`MyGrant`] then releases itself.
    async fn run(self, hold: Option<Hold<String>>, mut tx: oneshot::Sender<NestedEnd>) {
        let Nested {
            shared,
            claim,
            lock,
            name,
            deadline,
            keepalive,
        } = self;
        let id = claim.lock_conn().id();
        loop {
            let Some(mut borrowed) = claim.borrow().await else {
                let _ = tx.send(NestedEnd::Gone(hold));
                return;
            };
            if tx.is_closed() {
                borrowed.give_back(false);
                return;
            }
            let (wait, last) = chunk(deadline, Instant::now(), NESTED_CHUNK);
            let bound = answer_bound(wait, keepalive);
            let (r, mut abandoned) = {
                let once = get_lock_once(borrowed.conn(), &lock, wait, bound);
                tokio::pin!(once);
                tokio::select! {
                    r = &mut once => (r, false),
                    () = tx.closed() => {
                        // Ends the wait now: GET_LOCK returns NULL, or 1 if
                        // it took the lock first. If the kill fails, the
                        // chunk ends by itself within a second.
                        shared.connector.kill_query(id).await;
                        (once.await, true)
                    }
                }
            };
            abandoned |= tx.is_closed();
            let send = |tx: oneshot::Sender<NestedEnd>, r| drop(tx.send(NestedEnd::Done(r)));
            match r {
                Ok(Some(1)) if abandoned => {
                    // Taken after all: release it before the session goes
                    // back to its owner.
                    let sql = "SELECT RELEASE_LOCK(?)";
                    let q = borrowed
                        .conn()
                        .exec_first::<(Option<i64>,), _, _>(sql, (lock.as_str(),));
                    match tokio::time::timeout(answer_bound(Duration::ZERO, keepalive), q).await {
                        Ok(Ok(Some((Some(1),)))) => borrowed.give_back(false),
                        _ => {
                            // Unknown state: end the session (its locks
                            // are reported lost) rather than leave this
                            // lock held by nobody.
                            drop(borrowed);
                            shared.spawn_kill(id);
                        }
                    }
                    drop(hold);
                    return;
                }
                Ok(Some(1)) => {
                    borrowed.give_back(true);
                    let grant = MyGrant::new(shared.clone(), claim.lock_conn().clone(), lock, name, hold);
                    // The session is free for the caller's next nested
                    // acquisition before the caller hears of this one.
                    drop(claim);
                    send(tx, Ok(Some(grant)));
                    return;
                }
                Ok(Some(_)) => {
                    borrowed.give_back(false);
                    if abandoned {
                        return;
                    }
                    if last {
                        drop(claim);
                        send(tx, Ok(None));
                        return;
                    }
                }
                Ok(None) => {
                    borrowed.give_back(false);
                    if !abandoned {
                        drop(claim);
                        send(tx, Err(null_err(&lock)));
                    }
                    return;
                }
                Err(Fail::Driver(e @ mysql_async::Error::Server(_))) => {
                    // The session keeps the locks it held (a deadlock
                    // victim too).
                    borrowed.give_back(false);
                    drop(claim);
                    send(tx, Err(db_err(e, &name)));
                    return;
                }
                Err(e) => {
                    // The connection failed or went silent: dropping
                    // `borrowed` closes it and reports its locks lost.
                    let silent = matches!(e, Fail::NoAnswer(_));
                    drop(borrowed);
                    if silent {
                        shared.spawn_kill(id);
                    }
                    send(tx, Err(fail_err(e, &name)));
                    return;
                }
            }
        }
    }
}
