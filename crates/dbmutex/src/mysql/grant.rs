//! One user lock held on a [`LockConn`], and its release.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::watch;

use super::conn::answer_bound;
use super::errors::db_err;
use super::get_lock::NESTED_CHUNK;
use super::lock_conn::{ping_timeout, LockConn};
use super::registry::Shared;
use crate::core::arbiter::Hold;
use crate::core::detach::Undo;
use crate::core::guard::{releasing, BoxFuture, DelayRecord, Grant, OnSession, Releasing, RELEASES};
use crate::core::loss::LossToken;
use crate::runs::{RunStart, Who};
use crate::{Error, LockName, Result};

/// `RELEASE_LOCK` for the session's last lock, then `RELEASE_ALL_LOCKS` as
/// proof that the session now holds nothing (MariaDB and MySQL evaluate
/// select items left to right): only then may the connection be reused.
const RELEASE_LAST_SQL: &str = "SELECT RELEASE_LOCK(?), RELEASE_ALL_LOCKS()";
/// `RELEASE_LOCK` while the session keeps other locks.
const RELEASE_ONE_SQL: &str = "SELECT RELEASE_LOCK(?), NULL";

/// One lock held on a [`LockConn`].
pub(super) struct MyGrant {
    /// Dropped armed, the release runs in the background.
    release: Undo<Release>,
    lost: watch::Receiver<bool>,
}

/// Everything the release needs, moved into the task that performs it.
struct Release {
    shared: Arc<Shared>,
    lc: Arc<LockConn>,
    lock: String,
    name: LockName,
    /// The in-process hold; given back only after the server released, so
    /// the next task of this process finds the server lock free.
    hold: Option<Hold<String>>,
}

impl MyGrant {
    /// A lock `GET_LOCK` just took on `lc`, registered for nested calls.
    pub(super) fn new(
        shared: Arc<Shared>,
        lc: Arc<LockConn>,
        lock: String,
        name: LockName,
        hold: Option<Hold<String>>,
    ) -> Self {
        shared.remember(&lock, &lc, &name);
        MyGrant {
            lost: lc.lost.subscribe(),
            release: Undo::with(
                Release {
                    shared,
                    lc,
                    lock,
                    name,
                    hold,
                },
                // Spawned on the runtime the lock was taken on, so no
                // runtime is needed here. If that runtime is gone, the task
                // (and with it the connection) is dropped: the socket closes
                // and the server frees the lock.
                |mut release| {
                    // The next request of this process for the name waits
                    // for this unlock instead of finding the name busy.
                    if let Some(h) = release.hold.as_mut() {
                        h.releasing();
                    }
                    let runtime = release.shared.runtime.clone();
                    drop(runtime.spawn(async move {
                        if let Err(e) = release.run().await {
                            tracing::warn!(error = %e, "dbmutex: MySQL unlock on drop failed");
                        }
                    }));
                },
            ),
        }
    }
}

impl Grant for MyGrant {
    fn release(mut self: Box<Self>) -> Releasing {
        let mut release = self.release.take().expect("held until released");
        if let Some(h) = release.hold.as_mut() {
            h.releasing();
        }
        // In the caller's task (no hop to another task, which cost a
        // quarter of an uncontended cycle). If the caller stops waiting
        // midway, the unlock's fate is unknown: the session is killed from
        // another connection, which frees the lock for sure.
        let mut kill = release
            .shared
            .connector
            .kill_on_drop(&release.shared.runtime, release.lc.id);
        releasing(&RELEASES, move || async move {
            let r = release.run().await;
            kill.disarm();
            r
        })
    }

    fn loss(&self) -> LossToken {
        LossToken::of(self.lost.clone())
    }

    fn on_session(&self) -> Option<&dyn OnSession> {
        Some(self)
    }
}

impl OnSession for MyGrant {
    fn fence(&self, key: String) -> BoxFuture<Result<u64>> {
        self.on_lock_session("a fencing token", move |lc, lock, name| {
            super::fence::issue(lc, key, lock, name)
        })
    }

    fn start_run(&self, window: Duration, who: Who) -> BoxFuture<Result<RunStart>> {
        self.on_lock_session("a run", move |lc, lock, name| {
            super::runs::start(lc, lock, name, window, who)
        })
    }

    fn finish_run(&self, run: u64, exit_code: Option<i32>) -> BoxFuture<Result<()>> {
        self.on_lock_session("a run", move |lc, lock, name| {
            super::runs::finish(lc, lock, name, run, exit_code)
        })
    }

    fn delay(&self, key: String) -> DelayRecord {
        let held = self.release.peek(|r| {
            let runtime = r.shared.runtime.clone();
            (runtime, r.lc.clone(), r.lock.clone(), r.name.clone())
        });
        Arc::new(move |step| {
            let held = held.clone();
            let key = key.clone();
            spawned("a lock-delay record", held, move |lc, lock, name| {
                super::delay::step(lc, key, lock, name, step)
            })
        })
    }
}

impl MyGrant {
    /// Runs `work` on the lock's session while this grant holds it:
    /// spawned, as the release is, since a statement cut off midway would
    /// leave the session's protocol state unknown.
    fn on_lock_session<T, F, Fut>(&self, what: &str, work: F) -> BoxFuture<Result<T>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<LockConn>, String, LockName) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let held = self.release.peek(|r| {
            let runtime = r.shared.runtime.clone();
            (runtime, r.lc.clone(), r.lock.clone(), r.name.clone())
        });
        spawned(what, held, work)
    }
}

/// What a statement on a held lock's session needs: the runtime the lock
/// was taken on, its connection, its lock string and its name.
type Held = (tokio::runtime::Handle, Arc<LockConn>, String, LockName);

/// Runs `work` on the runtime the lock was taken on (see
/// [`MyGrant::on_lock_session`]); `held` is `None` once released.
fn spawned<T, F, Fut>(what: &str, held: Option<Held>, work: F) -> BoxFuture<Result<T>>
where
    T: Send + 'static,
    F: FnOnce(Arc<LockConn>, String, LockName) -> Fut,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let Some((runtime, lc, lock, name)) = held else {
        return Box::pin(std::future::ready(Err(Error::Database(
            format!("{what} for a released lock").into(),
        ))));
    };
    let task = runtime.spawn(work(lc, lock, name));
    Box::pin(async move {
        task.await.unwrap_or_else(|_| {
            Err(Error::Database(
                "a task on the lock's connection ended unexpectedly".into(),
            ))
        })
    })
}

impl Release {
    async fn run(self) -> Result<()> {
        self.shared.forget(&self.lock, &self.lc);
        let r = self.unlock().await;
        drop(self.hold);
        r
    }

    async fn unlock(&self) -> Result<()> {
        let lc = &self.lc;
        let lost = || Error::LockLost {
            name: self.name.to_string(),
        };
        // Waits for a ping or nested acquisition in progress: a command cut
        // off midway would leave the connection's protocol state unknown.
        // Bounded: a nested wait gives the session back after each chunk,
        // and an abandoned one after its cleanup; longer means the session
        // is stuck, and it is ended.
        let keepalive = self.shared.connector.keepalive();
        let busy_bound = answer_bound(NESTED_CHUNK, keepalive)
            .saturating_mul(2)
            .saturating_add(self.shared.connector.kill_bound())
            .saturating_add(answer_bound(Duration::ZERO, keepalive));
        let Ok(mut slot) = tokio::time::timeout(busy_bound, lc.conn.lock()).await else {
            lc.lost.send_replace(true);
            lc.stop.notify_one();
            self.shared.spawn_kill(lc.id);
            return Err(Error::Database(
                format!(
                    "the connection holding {:?} stayed busy for {busy_bound:?}; it was killed, which frees its locks",
                    self.name
                )
                .into(),
            ));
        };
        let Some(conn) = slot.as_mut() else {
            return Err(lost());
        };
        let last = lc.grants.load(Ordering::Acquire) == 1;
        let sql = if last { RELEASE_LAST_SQL } else { RELEASE_ONE_SQL };
        let timeout = ping_timeout(Duration::ZERO);
        let answer = tokio::time::timeout(
            timeout,
            conn.exec_first::<(Option<i64>, Option<i64>), _, _>(sql, (self.lock.as_str(),)),
        )
        .await;
        // Every way out but a confirmed release ends the session: then the
        // server frees whatever it held, and its other guards learn it.
        let end_session = |slot: &mut Option<Conn>| {
            drop(slot.take());
            lc.lost.send_replace(true);
            lc.stop.notify_one();
        };
        match answer {
            Ok(Ok(Some((Some(1), rest)))) => {
                lc.grants.fetch_sub(1, Ordering::AcqRel);
                if last {
                    lc.stop.notify_one();
                    let conn = slot.take().expect("checked above");
                    if rest == Some(0) {
                        self.shared.connector.checkin(conn);
                    } else {
                        tracing::warn!(lock = %self.lock, others = ?rest, "dbmutex: a MySQL lock session held other locks; closed");
                    }
                }
                Ok(())
            }
            Ok(Ok(_)) => {
                // 0: another session holds it; NULL: nobody does. Either way
                // it was not ours any more.
                end_session(&mut slot);
                Err(lost())
            }
            Ok(Err(e)) => {
                let server = matches!(e, mysql_async::Error::Server(_));
                end_session(&mut slot);
                Err(if server { db_err(e, &self.name) } else { lost() })
            }
            Err(_) => {
                end_session(&mut slot);
                drop(slot);
                // In the background: the release must not wait on a server
                // that did not answer.
                self.shared.spawn_kill(lc.id);
                Err(Error::Database(
                    format!("RELEASE_LOCK got no answer within {timeout:?}; the connection was closed")
                        .into(),
                ))
            }
        }
    }
}
