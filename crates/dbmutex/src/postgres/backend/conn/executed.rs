//! Lock statements prepared on the server under names of our own
//! ([`Text::Executed`](super::Text::Executed)): `PREPARE` once per
//! connection, then `EXECUTE name(k1, k2)` over the simple protocol.
//!
//! Parsed and planned once, like a protocol-level prepared statement, but
//! under a name no other client can know (`dbmutex_` and the first 12 hex
//! digits of the connection's random claim token), so a pooler that moved
//! us to another server session can never make us run someone else's
//! statement: there the name does not exist (SQLSTATE 26000, read as a
//! move), and the statement's own claim check refuses a session that is not
//! ours.

use std::sync::Arc;

use tokio_postgres::error::SqlState;
use tokio_postgres::SimpleQueryMessage;

use super::PgConn;
use crate::key::PgKey;
use crate::postgres::sql::{self, Call};
use crate::Mode;

impl PgConn {
    /// Whether this connection has `PREPARE`d the statement of `call`, `mode`
    /// and `key`'s form (see [`executed_call`](Self::executed_call)).
    pub(super) fn has_executed(&self, call: Call, mode: Mode, key: &PgKey) -> bool {
        let bit = 1 << super::prepared::slot(call, mode, key);
        self.executed.load(std::sync::atomic::Ordering::Relaxed) & bit != 0
    }

    /// One lock call as `EXECUTE`, preparing it first (in the same round
    /// trip) on this connection's first use of it. The answer as
    /// [`PgConn::lock_call`] gives it: `None` when we were moved.
    pub(super) async fn executed_call(
        self: &Arc<Self>,
        call: Call,
        mode: Mode,
        key: &PgKey,
        owner: &str,
    ) -> Result<Option<bool>, tokio_postgres::Error> {
        let big = matches!(key, PgKey::Big(_));
        let name = format!(
            "dbmutex_{}_{}{}{}",
            &owner[..owner.len().min(12)],
            match call {
                Call::Try => "t",
                Call::Wait => "w",
                Call::Unlock => "u",
            },
            if mode == Mode::Shared { "s" } else { "x" },
            if big { "b" } else { "p" }
        );
        let exec = format!("EXECUTE {name}({})", key.sql_args());
        let prepared = self.has_executed(call, mode, key);
        // First use: the PREPARE goes in the same round trip as the EXECUTE.
        let prepare = (!prepared).then(|| {
            let body = sql::prepared_body(call, mode, key, Some(owner));
            let types = if big { "int8" } else { "int4, int4" };
            format!("PREPARE {name} ({types}) AS {body}; {exec}")
        });
        let msgs = match self
            .client
            .simple_query(prepare.as_deref().unwrap_or(&exec))
            .await
        {
            Ok(m) => m,
            // Left by an earlier PREPARE whose answer never came back.
            Err(e) if !prepared && e.code() == Some(&SqlState::DUPLICATE_PSTATEMENT) => {
                self.client.simple_query(&exec).await?
            }
            // Our statement is not on this server session: a pooler moved us.
            Err(e) if prepared && e.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME) => {
                self.moved();
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if !prepared {
            let bit = 1 << super::prepared::slot(call, mode, key);
            self.executed.fetch_or(bit, std::sync::atomic::Ordering::Relaxed);
        }
        self.heard_from_server();
        let first = msgs.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0) != Some("f")),
            _ => None,
        });
        if first.is_none() {
            self.moved();
        }
        Ok(first)
    }
}
