//! The session that holds user locks (a [`LockConn`]), lent to nested
//! acquisitions, and the watcher that notices when it dies.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::{watch, Notify, OwnedMutexGuard};

use super::conn::Connector;

/// A server session holding one or more locks: the lock that opened it, and
/// locks taken in scoped calls nested inside that one.
pub(super) struct LockConn {
    /// `None` once the session is gone or handed back for reuse.
    pub(super) conn: Arc<tokio::sync::Mutex<Option<Conn>>>,
    pub(super) id: u32,
    /// The session's `CONNECTION_ID()`, as `IS_USED_LOCK` reports holders.
    server_id: u64,
    pub(super) lost: watch::Sender<bool>,
    /// Locks held on the session; changed only under `conn`'s mutex.
    pub(super) grants: AtomicUsize,
    /// A nested acquisition is using the session.
    busy: AtomicBool,
    pub(super) stop: Notify,
    /// Asks the watcher to ping now rather than at the end of its period.
    poke: Notify,
    /// Kills the session from another connection when it must end.
    connector: Arc<Connector>,
    runtime: tokio::runtime::Handle,
    /// The watcher runs (it starts only for a lock the loss check has seen
    /// held, or on a poke: a lock held for a moment costs no task).
    watching: AtomicBool,
    /// When the session took its first lock: the watcher's first ping is
    /// due a keepalive period after it, however late the watcher starts.
    born: std::time::Instant,
    keepalive: Duration,
}

impl LockConn {
    /// Wraps a connection that just took its first lock. Its watcher starts
    /// later, if the lock is held long enough for the loss check to see it
    /// ([`LockConn::ensure_watcher`]).
    pub(super) fn start(
        connector: &Arc<Connector>,
        runtime: &tokio::runtime::Handle,
        conn: Conn,
        server_id: u64,
        keepalive: Duration,
    ) -> Arc<Self> {
        Arc::new(LockConn {
            id: conn.id(),
            server_id,
            conn: Arc::new(tokio::sync::Mutex::new(Some(conn))),
            lost: watch::channel(false).0,
            grants: AtomicUsize::new(1),
            busy: AtomicBool::new(false),
            stop: Notify::new(),
            poke: Notify::new(),
            connector: connector.clone(),
            runtime: runtime.clone(),
            watching: AtomicBool::new(false),
            born: std::time::Instant::now(),
            keepalive,
        })
    }

    /// Starts the watcher unless it runs. The loss check calls this for
    /// every lock it sees held (it looks every `check::interval`, at most
    /// the keepalive period), so the first ping is still due a keepalive
    /// period after the lock was taken.
    pub(super) fn ensure_watcher(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let first = self.keepalive.saturating_sub(self.born.elapsed());
        drop(self.runtime.spawn(watch_conn(
            self.clone(),
            first,
            self.keepalive,
            ping_timeout(self.keepalive),
        )));
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
    pub(super) fn poke(self: &Arc<Self>) {
        self.ensure_watcher();
        self.poke.notify_one();
    }

    /// The server says this session no longer holds one of its locks (the
    /// session was killed, or reset): reports every lock of the session
    /// lost at once, and makes sure the session ends — closed here if it is
    /// idle, else killed from another connection — so that it cannot hold
    /// anything the guards no longer claim.
    pub(super) fn mark_lost(&self) {
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
            Err(_) => self.spawn_kill(),
        }
    }

    /// Ends the session from another connection, in the background.
    pub(super) fn spawn_kill(&self) {
        self.connector.spawn_kill(&self.runtime, self.id);
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
pub(super) fn ping_timeout(keepalive: Duration) -> Duration {
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
            self.lc.grants.fetch_add(1, Ordering::AcqRel);
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

/// Pings the session every `keepalive`; when a ping fails or gets no answer
/// within `timeout`, closes the connection and reports its locks lost. Ends
/// when the session is handed back or gone.
async fn watch_conn(lc: Arc<LockConn>, first: Duration, keepalive: Duration, timeout: Duration) {
    let mut wait = first;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = lc.stop.notified() => return,
            () = lc.poke.notified() => {}
        }
        wait = keepalive;
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
            lc.connector.kill(lc.id).await;
            return;
        }
    }
}
