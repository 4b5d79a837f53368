//! The raw-SQL floor: what the driver alone costs, measured in the same run.
//!
//! - `rtt`: one prepared `SELECT 1` per operation on one connection.
//! - `floor`: PostgreSQL prepared `SELECT pg_try_advisory_lock($1, $2)` +
//!   `SELECT pg_advisory_unlock($1, $2)`, as pgbench `-M prepared` runs them;
//!   MySQL prepared `SELECT GET_LOCK(?, 0)` + `SELECT RELEASE_LOCK(?)`. Each
//!   client has its own connection and its own key.
//! - `floor --floor-unnamed` (PostgreSQL): the same two statements the way
//!   dbmutex sends them — unnamed (`query_typed`: parse, bind and execute in
//!   one round trip) with the lock name in an SQL comment — to tell the
//!   statement form's cost from the library's own.
//! - etcd: `rtt` is one linearizable read of a key; `floor` etcd's own
//!   `concurrency.Mutex` cycle ([`crate::raw_etcd`]) on a queue of each
//!   client's own; `floor-contended` the same cycle by every client on one
//!   queue (the floor the `contended` scenario is judged beside).

use std::sync::Arc;

use anyhow::ensure;
use dbmutex::BackendKind;
use mysql_async::prelude::Queryable;
use tokio::sync::Barrier;
use tokio_postgres::types::{ToSql, Type};

use crate::report::Row;
use crate::scenarios::Env;
use crate::stats::{Sample, Timer};
use crate::{clients, raw};

/// Round trips of a prepared `SELECT 1` on one connection.
pub async fn rtt(env: &Env) -> anyhow::Result<Row> {
    let app = env.app("rtt");
    let (url, dur) = (env.url.clone(), env.p.duration);
    let kind = env.kind;
    let s = clients::run(1, move |_, barrier| {
        let (url, app) = (url.clone(), app.clone());
        async move {
            match kind {
                BackendKind::Postgres => {
                    let c = raw::pg_connect(&url, &app).await?;
                    let one = c.prepare("SELECT 1").await?;
                    barrier.wait().await;
                    let mut t = Timer::run_for(dur);
                    while t.start() {
                        c.query_one(&one, &[]).await?;
                        t.stop();
                    }
                    Ok(t.finish())
                }
                #[cfg(feature = "etcd")]
                BackendKind::Etcd => {
                    let mut kv = crate::raw_etcd::connect(&url).await?.kv_client();
                    barrier.wait().await;
                    let mut t = Timer::run_for(dur);
                    while t.start() {
                        kv.get("dbmutex-bench-rtt", None).await?;
                        t.stop();
                    }
                    Ok(t.finish())
                }
                _ => {
                    let mut c = raw::my_connect(&url).await?;
                    let one = c.prep("SELECT 1").await?;
                    barrier.wait().await;
                    let mut t = Timer::run_for(dur);
                    while t.start() {
                        let _: Option<i64> = c.exec_first(&one, ()).await?;
                        t.stop();
                    }
                    Ok(t.finish())
                }
            }
        }
    })
    .await?;
    let mut row = Row::new("rtt", kind.as_str(), 1, s.lat, s.seconds);
    row.connections = Some(1);
    Ok(row)
}

/// The raw lock cycle on `n` connections at once.
pub async fn floor(env: &Env, n: usize) -> anyhow::Result<Row> {
    let app = env.app(&format!("floor-{n}"));
    let sampler = env.sampler(&app, vec![]);
    let (url, dur, kind, unnamed) = (env.url.clone(), env.p.duration, env.kind, env.p.floor_unnamed);
    let names: Vec<String> = (0..n).map(|i| env.name("floor", i)).collect();
    let s = clients::run(n, move |i, barrier| {
        let (url, app, name) = (url.clone(), app.clone(), names[i].clone());
        async move {
            match kind {
                BackendKind::Postgres if unnamed => {
                    pg_unnamed_client(&url, &app, i, &name, barrier, dur).await
                }
                _ => {
                    let mut raw = RawCycle::connect(kind, &url, &app, i, &name).await?;
                    barrier.wait().await;
                    let mut t = Timer::run_for(dur);
                    while t.start() {
                        raw.cycle().await?;
                        t.stop();
                    }
                    Ok(t.finish())
                }
            }
        }
    })
    .await?;
    let mut row = Row::new("floor", kind.as_str(), n, s.lat, s.seconds);
    if kind == BackendKind::Postgres {
        row.set("statements", if unnamed { "unnamed" } else { "prepared" });
    }
    row.connections = match kind {
        BackendKind::Postgres => sampler.finish().await,
        // The MySQL probe counts lock owners; the floor's own connections
        // are known: one per client.
        _ => Some(n as i64),
    };
    Ok(row)
}

/// etcd: `n` raw sessions, each its own connection, cycling on one queue.
#[cfg(feature = "etcd")]
pub async fn floor_contended(env: &Env, n: usize) -> anyhow::Result<Row> {
    let (url, dur) = (env.url.clone(), env.p.duration);
    let prefix = crate::raw_etcd::queue(&env.name("floor-c", 0));
    let s = clients::run(n, move |_, barrier| {
        let (url, prefix) = (url.clone(), prefix.clone());
        async move {
            let mut m = crate::raw_etcd::EtcdMutex::new(crate::raw_etcd::connect(&url).await?).await?;
            barrier.wait().await;
            let mut t = Timer::run_for(dur);
            while t.start() {
                m.lock(&prefix).await?;
                t.stop();
                m.unlock().await?;
            }
            Ok(t.finish())
        }
    })
    .await?;
    let mut row = Row::new("floor-contended", env.kind.as_str(), n, s.lat, s.seconds);
    row.connections = Some(n as i64);
    Ok(row)
}

async fn pg_unnamed_client(
    url: &str,
    app: &str,
    i: usize,
    name: &str,
    barrier: Arc<Barrier>,
    dur: std::time::Duration,
) -> anyhow::Result<Sample> {
    let c = raw::pg_connect(url, app).await?;
    let lock = format!("SELECT pg_try_advisory_lock($1, $2) /* {name} */");
    let unlock = format!("SELECT pg_advisory_unlock($1, $2) /* {name} */");
    let (k1, k2) = floor_key(i);
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&k1, Type::INT4), (&k2, Type::INT4)];
    barrier.wait().await;
    let mut t = Timer::run_for(dur);
    while t.start() {
        let got: bool = c.query_typed(&lock, &params).await?[0].get(0);
        ensure!(got, "floor key ({k1}, {k2}) is held by another session");
        let freed: bool = c.query_typed(&unlock, &params).await?[0].get(0);
        ensure!(freed, "floor key ({k1}, {k2}) was not held at unlock");
        t.stop();
    }
    Ok(t.finish())
}

/// Client `i`'s floor key; our process id as the second half keeps
/// concurrent runs apart.
fn floor_key(i: usize) -> (i32, i32) {
    (i as i32, (std::process::id() & 0x7fff_ffff) as i32)
}

/// The raw driver's lock cycle on one connection of its own: PostgreSQL
/// prepared `pg_try_advisory_lock($1, $2)` + `pg_advisory_unlock($1, $2)`
/// on client `i`'s key, MySQL prepared `GET_LOCK(?, 0)` + `RELEASE_LOCK(?)`
/// on `name`. The `floor` and `paired` scenarios run it.
pub enum RawCycle {
    Pg {
        c: tokio_postgres::Client,
        lock: tokio_postgres::Statement,
        unlock: tokio_postgres::Statement,
        key: (i32, i32),
    },
    My {
        c: mysql_async::Conn,
        lock: mysql_async::Statement,
        unlock: mysql_async::Statement,
        name: String,
    },
    /// etcd's `concurrency.Mutex` on a queue of its own.
    #[cfg(feature = "etcd")]
    Etcd {
        m: Box<crate::raw_etcd::EtcdMutex>,
        prefix: String,
    },
}

impl RawCycle {
    pub async fn connect(
        kind: BackendKind,
        url: &str,
        app: &str,
        i: usize,
        name: &str,
    ) -> anyhow::Result<RawCycle> {
        Ok(match kind {
            BackendKind::Postgres => {
                let c = raw::pg_connect(url, app).await?;
                let lock = c.prepare("SELECT pg_try_advisory_lock($1, $2)").await?;
                let unlock = c.prepare("SELECT pg_advisory_unlock($1, $2)").await?;
                RawCycle::Pg {
                    c,
                    lock,
                    unlock,
                    key: floor_key(i),
                }
            }
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => RawCycle::Etcd {
                m: Box::new(crate::raw_etcd::EtcdMutex::new(crate::raw_etcd::connect(url).await?).await?),
                prefix: crate::raw_etcd::queue(name),
            },
            _ => {
                let mut c = raw::my_connect(url).await?;
                let lock = c.prep("SELECT GET_LOCK(?, 0)").await?;
                let unlock = c.prep("SELECT RELEASE_LOCK(?)").await?;
                RawCycle::My {
                    c,
                    lock,
                    unlock,
                    name: name.to_owned(),
                }
            }
        })
    }

    /// One lock and unlock, each checked.
    pub async fn cycle(&mut self) -> anyhow::Result<()> {
        match self {
            RawCycle::Pg { c, lock, unlock, key } => {
                let (k1, k2) = *key;
                let got: bool = c.query_one(&*lock, &[&k1, &k2]).await?.get(0);
                ensure!(got, "floor key ({k1}, {k2}) is held by another session");
                let freed: bool = c.query_one(&*unlock, &[&k1, &k2]).await?.get(0);
                ensure!(freed, "floor key ({k1}, {k2}) was not held at unlock");
            }
            RawCycle::My {
                c,
                lock,
                unlock,
                name,
            } => {
                let got: Option<Option<i64>> = c.exec_first(&*lock, (name.as_str(),)).await?;
                ensure!(
                    got == Some(Some(1)),
                    "floor lock {name:?} is held by another session"
                );
                let freed: Option<Option<i64>> = c.exec_first(&*unlock, (name.as_str(),)).await?;
                ensure!(
                    freed == Some(Some(1)),
                    "floor lock {name:?} was not held at release"
                );
            }
            #[cfg(feature = "etcd")]
            RawCycle::Etcd { m, prefix } => {
                m.lock(prefix).await?;
                m.unlock().await?;
            }
        }
        Ok(())
    }
}
