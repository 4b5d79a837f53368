//! Held user locks: the session that holds them, the watcher that notices
//! when that session dies, and the release.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::{watch, Notify, OwnedMutexGuard};

use super::{answer_bound, db_err, spawn_kill, Shared, NESTED_CHUNK};
use crate::arbiter::Hold;
use crate::guard::{BoxFuture, Held};
use crate::{Error, LockName, Result};

/// `RELEASE_LOCK` for the session's last lock, then `RELEASE_ALL_LOCKS` as
/// proof that the session now holds nothing (MariaDB and MySQL evaluate
/// select items left to right): only then may the connection be reused.
const RELEASE_LAST_SQL: &str = "SELECT RELEASE_LOCK(?), RELEASE_ALL_LOCKS()";
/// `RELEASE_LOCK` while the session keeps other locks.
const RELEASE_ONE_SQL: &str = "SELECT RELEASE_LOCK(?), NULL";

/// A server session holding one or more locks: the lock that opened it, and
/// locks taken in scoped calls nested inside that one.
pub(super) struct LockConn {
    /// `None` once the session is gone or handed back for reuse.
    conn: Arc<tokio::sync::Mutex<Option<Conn>>>,
    id: u32,
    /// The session's `CONNECTION_ID()`, as `IS_USED_LOCK` reports holders.
    server_id: u64,
    lost: watch::Sender<bool>,
    /// Locks held on the session; changed only under `conn`'s mutex.
    held: AtomicUsize,
    /// A nested acquisition is using the session.
    busy: AtomicBool,
    stop: Notify,
    /// Asks the watcher to ping now rather than at the end of its period.
    poke: Notify,
}

impl LockConn {
    /// Wraps a connection that just took its first lock, and starts its watcher.
    pub(super) fn start(shared: &Arc<Shared>, conn: Conn, server_id: u64, keepalive: Duration) -> Arc<Self> {
        let lc = Arc::new(LockConn {
            id: conn.id(),
            server_id,
            conn: Arc::new(tokio::sync::Mutex::new(Some(conn))),
            lost: watch::channel(false).0,
            held: AtomicUsize::new(1),
            busy: AtomicBool::new(false),
            stop: Notify::new(),
            poke: Notify::new(),
        });
        drop(shared.runtime.spawn(watch_conn(
            shared.clone(),
            lc.clone(),
            keepalive,
            ping_timeout(keepalive),
        )));
        lc
    }

    /// The server's connection id.
    pub(super) fn id(&self) -> u32 {
        self.id
    }

    /// The session's `CONNECTION_ID()`: what `IS_USED_LOCK` answers while
    /// the session holds a lock.
    pub(super) fn server_id(&self) -> u64 {
        self.server_id
    }

    pub(super) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Pings the session now: the loss check could not reach the server, so
    /// the session may be gone too (a server restart closes every socket,
    /// and a ping on a closed socket fails at once).
    pub(super) fn poke(&self) {
        self.poke.notify_one();
    }

    /// The server says this session no longer holds one of its locks (the
    /// session was killed, or reset): reports every lock of the session
    /// lost at once, and makes sure the session ends — closed here if it is
    /// idle, else killed from another connection — so that it cannot hold
    /// anything the guards no longer claim.
    pub(super) fn mark_lost(&self, shared: &Arc<Shared>) {
        if self.lost.send_replace(true) {
            return;
        }
        self.stop.notify_one();
        tracing::warn!(
            connection = self.id,
            "dbmutex: the server no longer shows a MySQL lock on its session; the session's locks are lost"
        );
        match self.conn.try_lock() {
            Ok(mut slot) => drop(slot.take()),
            Err(_) => spawn_kill(shared, self.id),
        }
    }

    /// Claims the session for one nested acquisition; `None` if another one
    /// is using it (that acquisition then gets a connection of its own).
    pub(super) fn claim(self: &Arc<Self>) -> Option<Claim> {
        self.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then(|| Claim(self.clone()))
    }
}

/// A ping slower than this is treated as a dead connection.
fn ping_timeout(keepalive: Duration) -> Duration {
    (keepalive * 2).max(Duration::from_secs(2))
}

/// The right to run one nested acquisition on a [`LockConn`].
pub(super) struct Claim(Arc<LockConn>);

impl Claim {
    /// Takes the session's connection out for one statement. `None` when
    /// the session is gone.
    pub(super) async fn borrow(&self) -> Option<Borrowed> {
        let mut guard = self.0.conn.clone().lock_owned().await;
        let conn = guard.take()?;
        Some(Borrowed {
            guard,
            conn: Some(conn),
            lc: self.0.clone(),
        })
    }

    pub(super) fn lock_conn(&self) -> &Arc<LockConn> {
        &self.0
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// A session's connection taken out for a nested acquisition, with its
/// mutex held so that nobody else uses the session meanwhile. Dropped
/// without [`Borrowed::give_back`] (the acquisition was abandoned midway, or
/// the connection failed), the connection closes and the session's locks are
/// reported lost.
pub(super) struct Borrowed {
    guard: OwnedMutexGuard<Option<Conn>>,
    conn: Option<Conn>,
    lc: Arc<LockConn>,
}

impl Borrowed {
    pub(super) fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("present until given back")
    }

    /// Puts the connection back; `took_lock` when the statement took one
    /// more lock on it.
    pub(super) fn give_back(mut self, took_lock: bool) {
        if took_lock {
            self.lc.held.fetch_add(1, Ordering::AcqRel);
        }
        *self.guard = self.conn.take();
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            self.lc.lost.send_replace(true);
            self.lc.stop.notify_one();
        }
    }
}

/// One lock held on a [`LockConn`].
pub(super) struct MyHeld {
    /// `None` once the release is under way.
    state: Option<Release>,
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
    hold: Hold<String>,
}

impl MyHeld {
    /// A lock `GET_LOCK` just took on `lc`, registered for nested calls.
    pub(super) fn new(
        shared: Arc<Shared>,
        lc: Arc<LockConn>,
        lock: String,
        name: LockName,
        hold: Hold<String>,
    ) -> Self {
        shared.remember(&lock, &lc, &name);
        MyHeld {
            lost: lc.lost.subscribe(),
            state: Some(Release {
                shared,
                lc,
                lock,
                name,
                hold,
            }),
        }
    }
}

impl Held for MyHeld {
    fn release(mut self: Box<Self>) -> BoxFuture<Result<()>> {
        let release = self.state.take().expect("held until released");
        // Spawned: the release completes even if the caller stops waiting.
        let task = release.shared.runtime.clone().spawn(release.run());
        Box::pin(async move {
            task.await
                .unwrap_or_else(|_| Err(Error::Database("the unlock task ended unexpectedly".into())))
        })
    }

    fn lost_signal(&self) -> Option<watch::Receiver<bool>> {
        Some(self.lost.clone())
    }
}

impl Drop for MyHeld {
    fn drop(&mut self) {
        if let Some(release) = self.state.take() {
            // Spawned on the runtime the lock was taken on, so no runtime is
            // needed here. If that runtime is gone, the task (and with it the
            // connection) is dropped: the socket closes and the server frees
            // the lock.
            let runtime = release.shared.runtime.clone();
            drop(runtime.spawn(async move {
                if let Err(e) = release.run().await {
                    tracing::debug!(error = %e, "dbmutex: MySQL unlock on drop failed");
                }
            }));
        }
    }
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
            spawn_kill(&self.shared, lc.id);
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
        let last = lc.held.load(Ordering::Acquire) == 1;
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
                lc.held.fetch_sub(1, Ordering::AcqRel);
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
                spawn_kill(&self.shared, lc.id);
                Err(Error::Database(
                    format!("RELEASE_LOCK got no answer within {timeout:?}; the connection was closed")
                        .into(),
                ))
            }
        }
    }
}

/// Pings the session every `keepalive`; when a ping fails or gets no answer
/// within `timeout`, closes the connection and reports its locks lost. Ends
/// when the session is handed back or gone.
async fn watch_conn(shared: Arc<Shared>, lc: Arc<LockConn>, keepalive: Duration, timeout: Duration) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(keepalive) => {}
            () = lc.stop.notified() => return,
            () = lc.poke.notified() => {}
        }
        let mut slot = lc.conn.lock().await;
        let Some(conn) = slot.as_mut() else { return };
        let alive = matches!(tokio::time::timeout(timeout, conn.ping()).await, Ok(Ok(())));
        if !alive {
            drop(slot.take());
            drop(slot);
            lc.lost.send_replace(true);
            tracing::warn!(
                connection = lc.id,
                "dbmutex: MySQL lock connection is gone; its locks are lost"
            );
            // If the server is still there, make sure the session ends.
            shared.connector.kill(lc.id).await;
            return;
        }
    }
}
