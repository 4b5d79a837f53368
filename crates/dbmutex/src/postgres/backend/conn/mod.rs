//! PostgreSQL connections: URL and TLS handling, and a connection whose end
//! is an immediate lock-loss signal.
//!
//! - `connector.rs`: [`Connector`], from a URL or a `Config`, and `connect`;
//! - `tls.rs`: the TLS choice (`sslmode`) and its rustls set-up;
//! - `pgpass.rs`: libpq's password sources (`PGPASSWORD`, the password
//!   file) for a configuration that names no password;
//! - `session.rs`: [`PgConn`], one server session, its lock statements and
//!   its end;
//! - `cancel.rs`: cancelling a statement still running, then closing;
//! - `claim.rs`: the server-session claim, and what happens when a pooler
//!   moves us off it;
//! - `direct.rs`: whether a connection reaches the server with no pooler
//!   in between (then its lock statements are protocol-level prepared);
//! - `prepared.rs`: those prepared statements, cached per connection;
//! - `executed.rs`: the `PREPARE`d form used anywhere else;
//! - `heartbeat.rs`: the keepalive probe of a lock session;
//! - `liveness.rs`: asking the server to free a vanished client's locks
//!   within a bound.

mod cancel;
mod claim;
mod connector;
mod direct;
mod executed;
mod heartbeat;
mod liveness;
mod pgpass;
mod prepared;
mod session;
mod tls;

pub(crate) use claim::StartLater;
pub(crate) use connector::{bounded, Connector};
pub(crate) use session::{LockTable, PgConn, Text};
