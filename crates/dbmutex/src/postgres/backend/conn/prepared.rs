//! Lock statements as protocol-level prepared statements
//! ([`Text::Prepared`](super::Text::Prepared)): prepared on a connection's
//! first use of a call, mode and key form, and cached for its life. The
//! connection's claim token is inlined in them (it is the connection's for
//! its life, and so are they): only the key is bound.

use super::PgConn;
use crate::key::PgKey;
use crate::postgres::sql::{self, Call};
use crate::Mode;

/// The slot of `call`, `mode` and `key`'s form in `PgConn::statements`
/// (12 of them: try, wait and unlock; exclusive and shared; a pair of
/// `int4` or one `bigint`); also the bit of the same in `PgConn::executed`.
pub(super) fn slot(call: Call, mode: Mode, key: &PgKey) -> usize {
    let call = match call {
        Call::Try => 0,
        Call::Wait => 1,
        Call::Unlock => 2,
    };
    call * 4 + form(mode, key)
}

/// The slot of `mode` and `key`'s form among the 4 of one call (as in
/// `PgConn::bounded_waits`).
fn form(mode: Mode, key: &PgKey) -> usize {
    usize::from(mode == Mode::Shared) * 2 + usize::from(matches!(key, PgKey::Big(_)))
}

impl PgConn {
    /// The statement for `call`, `mode` and `key`'s form, if prepared.
    pub(super) fn cached(&self, call: Call, mode: Mode, key: &PgKey) -> Option<&tokio_postgres::Statement> {
        self.statements[slot(call, mode, key)].get()
    }

    /// The lock statement for `call`, `mode` and `key`'s form, prepared on
    /// first use and cached for the connection. A try's unlock is prepared
    /// with it (pipelined: one round trip for both), so that no unlock ever
    /// waits for a prepare: a release dropped mid-prepare would not know
    /// whether its unlock went out. Two tasks preparing the same one at
    /// once both prepare; the first kept serves both.
    pub(super) async fn prepared(
        &self,
        call: Call,
        mode: Mode,
        key: &PgKey,
    ) -> std::result::Result<&tokio_postgres::Statement, tokio_postgres::Error> {
        if let Some(s) = self.cached(call, mode, key) {
            return Ok(s);
        }
        if call == Call::Try {
            let (t, u) = tokio::try_join!(
                self.prepare_one(Call::Try, mode, key),
                self.prepare_one(Call::Unlock, mode, key)
            )?;
            let _ = self.statements[slot(Call::Unlock, mode, key)].set(u);
            Ok(self.statements[slot(call, mode, key)].get_or_init(|| t))
        } else {
            let s = self.prepare_one(call, mode, key).await?;
            Ok(self.statements[slot(call, mode, key)].get_or_init(|| s))
        }
    }

    /// [`sql::bounded_wait_plain`] for `mode` and `key`'s form, prepared on
    /// first use and cached for the connection. A wait without a bound, on
    /// a session with no `statement_timeout` and no `lock_timeout` in force
    /// (as the claim read them), where its two `set_config`s would set what
    /// is already so, is the plain lock statement instead: [`Call::Wait`]
    /// in [`PgConn::lock_call`] (the raw floor's statement and the claim
    /// check).
    pub(crate) async fn prepared_wait(
        &self,
        mode: Mode,
        key: &PgKey,
    ) -> std::result::Result<&tokio_postgres::Statement, tokio_postgres::Error> {
        let at = form(mode, key);
        if let Some(s) = self.bounded_waits[at].get() {
            return Ok(s);
        }
        let mut types = key_types(key);
        types.push(tokio_postgres::types::Type::TEXT);
        let s = self
            .client
            .prepare_typed(&sql::bounded_wait_plain(mode, key, self.checked_owner()), &types)
            .await?;
        Ok(self.bounded_waits[at].get_or_init(|| s))
    }

    /// The claim token this connection's prepared lock statements check
    /// (see [`Claim`](super::Claim)); `None` where the session is at the
    /// other end of our own socket, which nothing can move (`direct.rs`'s
    /// `is_own_socket`): the check is the statements' costliest part in the
    /// server (BENCHMARKS.md).
    fn checked_owner(&self) -> Option<&str> {
        (!self.own_socket.load(std::sync::atomic::Ordering::Relaxed)).then(|| self.owner())
    }

    async fn prepare_one(
        &self,
        call: Call,
        mode: Mode,
        key: &PgKey,
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        let sql = sql::prepared_body(call, mode, key, self.checked_owner());
        self.client.prepare_typed(&sql, &key_types(key)).await
    }
}

/// The parameter types of `key`'s form.
fn key_types(key: &PgKey) -> Vec<tokio_postgres::types::Type> {
    sql::Params::of(key, "")
        .key_typed()
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}
