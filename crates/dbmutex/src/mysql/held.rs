//! A held user lock: its dedicated connection, the watcher that notices when
//! that connection dies, and the release.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::{watch, Notify};

use super::{db_err, Shared};
use crate::arbiter::Hold;
use crate::guard::{BoxFuture, Held};
use crate::{Error, LockName, Result};

/// The connection that holds the lock, shared by the guard and its watcher.
/// `None` once it is released or known dead.
type Slot = Arc<tokio::sync::Mutex<Option<Conn>>>;

/// `RELEASE_LOCK` for our lock, then `RELEASE_ALL_LOCKS` as proof that the
/// session now holds nothing (MariaDB and MySQL evaluate select items left
/// to right): only then may the connection be reused.
const RELEASE_SQL: &str = "SELECT RELEASE_LOCK(?), RELEASE_ALL_LOCKS()";

/// One lock held on a connection of its own.
pub(super) struct MyHeld {
    /// `None` once the release is under way.
    state: Option<Release>,
    lost: Arc<watch::Sender<bool>>,
}

/// Everything the release needs, moved into the task that performs it.
struct Release {
    shared: Arc<Shared>,
    conn: Slot,
    lock: String,
    name: LockName,
    lost: Arc<watch::Sender<bool>>,
    stop: Arc<Notify>,
    timeout: Duration,
    /// The in-process hold; given back only after the server released, so
    /// the next task of this process finds the server lock free.
    hold: Hold<String>,
}

impl MyHeld {
    /// Wraps a connection on which `GET_LOCK(lock)` just returned 1, and
    /// starts its watcher.
    pub(super) fn start(
        shared: Arc<Shared>,
        conn: Conn,
        lock: String,
        name: LockName,
        hold: Hold<String>,
        keepalive: Duration,
    ) -> Self {
        let conn: Slot = Arc::new(tokio::sync::Mutex::new(Some(conn)));
        let lost = Arc::new(watch::channel(false).0);
        let stop = Arc::new(Notify::new());
        // A ping slower than this is treated as a dead connection.
        let timeout = (keepalive * 2).max(Duration::from_secs(2));
        drop(shared.runtime.spawn(watch_conn(
            shared.clone(),
            conn.clone(),
            lost.clone(),
            stop.clone(),
            keepalive,
            timeout,
        )));
        MyHeld {
            state: Some(Release {
                shared,
                conn,
                lock,
                name,
                lost: lost.clone(),
                stop,
                timeout,
                hold,
            }),
            lost,
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
        Some(self.lost.subscribe())
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
        self.stop.notify_one();
        // Waits for a ping in progress: a command cut off midway would leave
        // the connection's protocol state unknown.
        let conn = self.conn.lock().await.take();
        let lost = || Error::LockLost {
            name: self.name.to_string(),
        };
        let Some(mut conn) = conn else {
            return Err(lost());
        };
        let id = conn.id();
        let answer = tokio::time::timeout(
            self.timeout,
            conn.exec_first::<(Option<i64>, Option<i64>), _, _>(RELEASE_SQL, (self.lock.as_str(),)),
        )
        .await;
        let r = match answer {
            Ok(Ok(Some((Some(1), Some(0))))) => {
                self.shared.connector.checkin(conn);
                Ok(())
            }
            Ok(Ok(Some((Some(1), others)))) => {
                // Released, but the session held something else too: never
                // reuse it (it closes on drop).
                tracing::warn!(lock = %self.lock, others = ?others, "dbmutex: a MySQL lock connection held other locks; closed");
                Ok(())
            }
            Ok(Ok(_)) => {
                // 0: another session holds it; NULL: nobody does. Either way
                // it was not ours any more.
                self.lost.send_replace(true);
                Err(lost())
            }
            Ok(Err(e @ mysql_async::Error::Server(_))) => Err(db_err(e, &self.name)),
            Ok(Err(_)) => {
                // The connection is gone, and its locks with it.
                self.lost.send_replace(true);
                Err(lost())
            }
            Err(_) => {
                // Fate unknown: close the connection and have the server end
                // the session, which frees the lock.
                drop(conn);
                self.shared.connector.kill(id).await;
                Err(Error::Database(
                    format!(
                        "RELEASE_LOCK got no answer within {:?}; the connection was closed",
                        self.timeout
                    )
                    .into(),
                ))
            }
        };
        drop(self.hold);
        r
    }
}

/// Pings the lock's connection every `keepalive`; when a ping fails or gets
/// no answer within `timeout`, closes the connection and reports the lock
/// lost. Ends when the lock is released.
async fn watch_conn(
    shared: Arc<Shared>,
    slot: Slot,
    lost: Arc<watch::Sender<bool>>,
    stop: Arc<Notify>,
    keepalive: Duration,
    timeout: Duration,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(keepalive) => {}
            () = stop.notified() => return,
        }
        let mut guard = slot.lock().await;
        let Some(conn) = guard.as_mut() else { return };
        let id = conn.id();
        let alive = matches!(tokio::time::timeout(timeout, conn.ping()).await, Ok(Ok(())));
        if !alive {
            let dead = guard.take();
            drop(guard);
            lost.send_replace(true);
            tracing::warn!(
                connection = id,
                "dbmutex: MySQL lock connection is gone; lock lost"
            );
            drop(dead);
            // If the server is still there, make sure the session ends.
            shared.connector.kill(id).await;
            return;
        }
    }
}
