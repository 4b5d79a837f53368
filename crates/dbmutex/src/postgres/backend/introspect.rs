//! Who holds what: the server's `pg_locks`, joined with
//! `pg_stat_activity`, read on the locker's side connection, or one key's
//! holders on the idle lock session (see [`super::lazy`]).

use tokio_postgres::types::Type;

use super::conn::PgConn;
use crate::key::{name_from_comments, PgKey, Prefix};
use crate::postgres::errors::db_err;
use crate::types::{Holder, HolderId, ListedLock};
use crate::{LockName, Mode, Result};

/// The holders of `key` (the key of `name`).
pub(crate) async fn holders(
    conn: &PgConn,
    name: &LockName,
    key: &PgKey,
    prefix: &Prefix,
) -> Result<Vec<Holder>> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let sql = format!("{LOCKS_QUERY} AND l.classid = $1 AND l.objid = $2 AND l.objsubid = $3 ORDER BY l.pid");
    let rows = conn
        .client
        .query_typed(
            &sql,
            &[
                (&classid, Type::OID),
                (&objid, Type::OID),
                (&objsubid, Type::INT2),
            ],
        )
        .await
        .map_err(|e| db_err(e, name))?;
    Ok(rows.iter().map(|r| listed(r, prefix).holder).collect())
}

/// Every advisory lock of this database.
pub(crate) async fn list(conn: &PgConn, prefix: &Prefix) -> Result<Vec<ListedLock>> {
    let rows = conn
        .client
        .query_typed(&format!("{LOCKS_QUERY} ORDER BY l.pid, l.classid, l.objid"), &[])
        .await
        .map_err(|e| db_err(e, &LockName::Str("(list)".into())))?;
    Ok(rows.iter().map(|r| listed(r, prefix)).collect())
}

/// Granted advisory locks of the current database, with what
/// `pg_stat_activity` tells of their holders (the server hides the query
/// text of other roles' sessions unless the role may see it).
const LOCKS_QUERY: &str = "SELECT l.classid, l.objid, l.objsubid, l.mode, l.pid, \
     a.application_name, a.usename::text, \
     CASE WHEN a.client_addr IS NULL THEN 'local' ELSE host(a.client_addr) || ':' || a.client_port END, \
     to_char(coalesce(a.xact_start, a.backend_start) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), a.query \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())";

fn listed(r: &tokio_postgres::Row, prefix: &Prefix) -> ListedLock {
    let classid: u32 = r.get(0);
    let objid: u32 = r.get(1);
    let objsubid: i16 = r.get(2);
    let mode: &str = r.get(3);
    let key = PgKey::from_pg_locks(classid, objid, objsubid);
    let query: Option<String> = r.get(9);
    ListedLock {
        name: query.as_deref().and_then(|q| name_from_comments(q, &key, prefix)),
        key: key.to_string(),
        holder: Holder {
            id: HolderId::BackendPid(i64::from(r.get::<_, i32>(4))),
            pid: i64::from(r.get::<_, i32>(4)),
            mode: if mode == "ShareLock" {
                Mode::Shared
            } else {
                Mode::Exclusive
            },
            application: r.get(5),
            user: r.get(6),
            client: r.get(7),
            since: r.get(8),
        },
    }
}

/// Whether this connection's own server session holds `key` in `mode`;
/// `None` when the question ran on another server session (see
/// `PgConn::claim`).
pub(crate) async fn holds(
    conn: &PgConn,
    key: &PgKey,
    mode: Mode,
) -> std::result::Result<Option<bool>, tokio_postgres::Error> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let lock_mode = if mode == Mode::Shared {
        "ShareLock"
    } else {
        "ExclusiveLock"
    };
    let owner = conn.owner();
    let rows = conn
        .client
        .query_typed(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND pid = pg_backend_pid() AND classid = $1 AND objid = $2 AND objsubid = $3 AND mode = $4) \
             WHERE current_setting('dbmutex.owner', true) = $5",
            &[
                (&classid, Type::OID),
                (&objid, Type::OID),
                (&objsubid, Type::INT2),
                (&lock_mode, Type::TEXT),
                (&owner, Type::TEXT),
            ],
        )
        .await?;
    Ok(rows.first().map(|r| r.get::<_, bool>(0)))
}

/// Whether other sessions only *wait* in the server for `key` (any mode)
/// in this database, and none holds it: then this session's exclusive try
/// fails (a queued waiter's request conflicts), yet a blocking request of
/// this session, which holds `key` shared, is granted at once, ahead of
/// waiters that wait for it.
pub(crate) async fn only_waited_for(
    conn: &PgConn,
    key: &PgKey,
) -> std::result::Result<bool, tokio_postgres::Error> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let rows = conn
        .client
        .query_typed(
            "SELECT bool_or(NOT granted) AND NOT bool_or(granted) FROM pg_locks \
             WHERE locktype = 'advisory' AND pid <> pg_backend_pid() \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid = $1 AND objid = $2 AND objsubid = $3",
            &[
                (&classid, Type::OID),
                (&objid, Type::OID),
                (&objsubid, Type::INT2),
            ],
        )
        .await?;
    Ok(rows.first().and_then(|r| r.get::<_, Option<bool>>(0)) == Some(true))
}
