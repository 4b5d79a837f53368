//! Lock statements as protocol-level prepared statements
//! ([`Text::Prepared`](super::Text::Prepared)): prepared on a connection's
//! first use of a call, mode and key form, and cached for its life.

use super::PgConn;
use crate::key::PgKey;
use crate::postgres::sql::{self, Call};
use crate::Mode;

impl PgConn {
    /// The statement for `call`, `mode` and `key`'s form, if prepared.
    pub(super) fn cached(&self, call: Call, mode: Mode, key: &PgKey) -> Option<tokio_postgres::Statement> {
        self.statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(call, mode, matches!(key, PgKey::Big(_))))
            .cloned()
    }

    /// The lock statement for `call`, `mode` and `key`'s form, prepared on
    /// first use and cached for the connection. A try's unlock is prepared
    /// with it (pipelined: one round trip for both), so that no unlock ever
    /// waits for a prepare: a release dropped mid-prepare would not know
    /// whether its unlock went out.
    pub(super) async fn prepared(
        &self,
        call: Call,
        mode: Mode,
        key: &PgKey,
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        let form = matches!(key, PgKey::Big(_));
        if let Some(s) = self.cached(call, mode, key) {
            return Ok(s);
        }
        let (s, unlock) = if call == Call::Try {
            let (t, u) = tokio::try_join!(
                self.prepare_one(Call::Try, mode, key),
                self.prepare_one(Call::Unlock, mode, key)
            )?;
            (t, Some(u))
        } else {
            (self.prepare_one(call, mode, key).await?, None)
        };
        let mut cache = self.statements.lock().unwrap_or_else(|e| e.into_inner());
        cache.insert((call, mode, form), s.clone());
        if let Some(u) = unlock {
            cache.insert((Call::Unlock, mode, form), u);
        }
        Ok(s)
    }

    /// [`sql::bounded_wait_plain`] for `mode` and `key`'s form, prepared on
    /// first use and cached for the connection.
    pub(crate) async fn prepared_wait(
        &self,
        mode: Mode,
        key: &PgKey,
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        let id = (Call::Wait, mode, matches!(key, PgKey::Big(_)));
        let cached = self
            .statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        if let Some(s) = cached {
            return Ok(s);
        }
        let (_, params) = sql::bound_plain(Call::Wait, false, mode, key, "");
        let mut types: Vec<_> = params.as_typed().into_iter().map(|(_, t)| t).collect();
        types.push(tokio_postgres::types::Type::TEXT);
        let s = self
            .client
            .prepare_typed(&sql::bounded_wait_plain(mode, key), &types)
            .await?;
        self.statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, s.clone());
        Ok(s)
    }

    async fn prepare_one(
        &self,
        call: Call,
        mode: Mode,
        key: &PgKey,
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        let (sql, params) = sql::bound_plain(call, false, mode, key, "");
        let types: Vec<_> = params.as_typed().into_iter().map(|(_, t)| t).collect();
        self.client.prepare_typed(&sql, &types).await
    }
}
