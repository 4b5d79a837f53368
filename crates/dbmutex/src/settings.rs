//! Settings shared by every backend, as the builder sets them.

use std::time::Duration;

use crate::key::Prefix;

/// Settings shared by every backend.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) prefix: Prefix,
    pub(crate) max_locks: usize,
    pub(crate) keepalive: Duration,
    /// How soon the server frees the locks of a client it no longer hears
    /// from (see [`Settings::server_dead_peer_bound`]).
    pub(crate) dead_peer_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) application_name: String,
    pub(crate) name_comments: bool,
    /// The most names a locker waits for in the server at once under
    /// `WaitStrategy::TryThenServer` (each such wait, and the lock it gets,
    /// takes a connection of its own).
    pub(crate) max_server_waits: usize,
    /// A connection besides the lock session (PostgreSQL's side and spare
    /// wait connections; MySQL's clean idle ones) unused this long is closed.
    pub(crate) idle_timeout: Duration,
    /// Tests only: skip the connect-time pooler check, so the per-statement
    /// session checks meet a pooler alone.
    pub(crate) skip_pooler_check: bool,
    /// Metrics carry a `name` label (feature `metrics`; off by default:
    /// one series per lock name).
    pub(crate) metrics_name_label: bool,
}

// Only the server backends have peers to lose.
#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Settings {
    /// How long a connection may stay silent before its holder is told it
    /// lost its locks: the keepalive probe's bound.
    pub(crate) fn holder_bound(&self) -> Duration {
        self.keepalive + self.keepalive.max(Duration::from_millis(500))
    }

    /// The server's bound for freeing a vanished client's locks: the
    /// configured `dead_peer_timeout`, but at least twice the holder's
    /// bound, so a holder that can be told is told before anyone else can
    /// take its lock.
    pub(crate) fn server_dead_peer_bound(&self) -> Duration {
        self.dead_peer_timeout.max(self.holder_bound() * 2)
    }

    /// How long an idle connection without a keepalive probe (a spare, the
    /// side connection) is kept: `idle_timeout`, but well before the
    /// server's own cut-off for idle sessions, so we close it first.
    pub(crate) fn idle_limit(&self) -> Duration {
        self.idle_timeout.min(self.server_dead_peer_bound() / 2)
    }
}
