//! Asking the server to notice a client that vanished, so that it frees
//! the client's locks within a bound instead of after hours.
//!
//! A holder behind a silent partition (packets dropped, no RST), on a host
//! that froze, or killed without a FIN keeps its locks on the server until
//! the server notices: by default after the kernel's TCP keepalive, 7,200 s
//! idle. So every session that holds or waits for locks on a direct
//! connection sets, for itself (all are user-settable), with the locker's
//! [`dead_peer_timeout`](crate::LockerBuilder::dead_peer_timeout) `T`:
//!
//! - `tcp_keepalives_idle = T/2`, `tcp_keepalives_interval = T/6`,
//!   `tcp_keepalives_count = 3`: an idle peer that stops answering is dead
//!   after about `T`;
//! - `tcp_user_timeout = T` (PostgreSQL ≥ 12): data the server sent that
//!   stays unacknowledged for `T` ends the session;
//! - `idle_session_timeout = T` (PostgreSQL ≥ 14): a session idle outside a
//!   transaction for `T` ends — the one check that also catches a frozen
//!   process whose kernel still answers TCP. The keepalive probe of every
//!   connection holding a lock (`heartbeat.rs`) keeps a live holder busy;
//! - `client_connection_check_interval` (PostgreSQL ≥ 14): a waiter blocked
//!   in the server whose client is gone leaves the queue.
//!
//! The holder learns of a loss from its probe within `keepalive +
//! max(keepalive, 500 ms)` (2 s by default), before the server frees the
//! lock (`T`, at least twice that: 10 s by default). A frozen holder cannot
//! be told: that is what fencing tokens are for.
//!
//! Only where the server answers on the address and port dialed and
//! nothing shares its sessions: on a connection found direct (`direct.rs`),
//! or once the locker's pooler check found no pooler (a client behind NAT:
//! `claim.rs`, `watch_once_cleared`). Behind a pooler the server's peer is
//! the pooler, and these settings on a server session it shares would end
//! other clients' sessions.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::session::PgConn;

/// The statements that set the server's side of liveness for bound `t` on
/// a server of major version `major` (as its `server_version` says at
/// connect; `0` when unknown: the keepalive settings only). Plain `SET`s
/// name no function, so a fresh backend looks nothing up in its catalogs
/// for them (`set_config` calls with the version read and cast in SQL did:
/// BENCHMARKS.md, CLI start). Sent as one simple query, one implicit
/// transaction: all are set, or none.
pub(crate) fn watch_sql(t: Duration, major: u32) -> String {
    let secs = t.as_secs().max(2);
    let ms = t.as_millis().max(2_000);
    let check_ms = (ms / 4).clamp(100, 1_000);
    let mut sql = format!(
        "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; \
         SET tcp_keepalives_count = 3",
        idle = (secs / 2).max(1),
        interval = (secs / 6).max(1),
    );
    if major >= 12 {
        sql.push_str(&format!("; SET tcp_user_timeout = {ms}"));
    }
    if major >= 14 {
        sql.push_str(&format!(
            "; SET idle_session_timeout = {ms}; SET client_connection_check_interval = {check_ms}"
        ));
    }
    sql
}

impl PgConn {
    /// Sends [`watch_sql`] once per connection, without waiting for the
    /// answer: it goes out ahead of whatever this connection sends next
    /// (one flight, no extra wait).
    pub(super) fn ask_server_to_watch(self: &Arc<Self>) {
        if self.watched.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let sql = watch_sql(self.dead_peer, self.server_major);
        // tokio-postgres queues a request on the connection when its future
        // is first polled (ahead of whatever we send next); the answer is
        // discarded once the future is gone. No task awaits it: one would
        // hold the connection (a strong reference) until the answer came,
        // and a read right after connect (`status`, a contended run's "held
        // by") would find the lock session busy and open a second
        // connection for itself. A SET that fails leaves the server's
        // defaults, as before (that was logged at debug level only).
        let send = std::pin::pin!(self.client.simple_query(&sql));
        let _ = send.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bound_is_ten_seconds_split_as_documented() {
        let sql = watch_sql(Duration::from_secs(10), 15);
        for part in [
            "SET tcp_keepalives_idle = 5;",
            "SET tcp_keepalives_interval = 1;",
            "SET tcp_keepalives_count = 3;",
            "SET tcp_user_timeout = 10000;",
            "SET idle_session_timeout = 10000;",
            "SET client_connection_check_interval = 1000",
        ] {
            assert!(sql.contains(part), "{part} in {sql}");
        }
        assert!(!sql.contains('('), "no function call: {sql}");
    }

    #[test]
    fn older_servers_get_only_what_they_know() {
        let v13 = watch_sql(Duration::from_secs(10), 13);
        assert!(v13.contains("tcp_user_timeout = 10000"), "{v13}");
        assert!(!v13.contains("idle_session_timeout"), "{v13}");
        let v11 = watch_sql(Duration::from_secs(10), 11);
        assert!(v11.contains("tcp_keepalives_count = 3"), "{v11}");
        assert!(!v11.contains("tcp_user_timeout"), "{v11}");
        assert_eq!(watch_sql(Duration::from_secs(10), 0), v11);
    }

    #[test]
    fn tiny_bounds_stay_valid() {
        let sql = watch_sql(Duration::from_millis(1), 15);
        assert!(sql.contains("tcp_keepalives_idle = 1;"), "{sql}");
        assert!(sql.contains("tcp_user_timeout = 2000;"), "{sql}");
        assert!(sql.contains("client_connection_check_interval = 500"), "{sql}");
    }
}
