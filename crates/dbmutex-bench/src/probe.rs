//! Counting the server connections a scenario uses, from the server's side.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dbmutex::BackendKind;
use mysql_async::prelude::Queryable;
use tokio::sync::{oneshot, Mutex};

use crate::raw;

/// How often a [`Sampler`] looks.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// `IS_USED_LOCK` calls per MySQL statement.
const MY_CHUNK: usize = 100;

/// A connection of its own that asks the server who is connected.
pub enum Probe {
    /// Counts `pg_stat_activity` rows with the scenario's `application_name`.
    Pg(tokio_postgres::Client),
    /// MySQL cannot list a client's connections by name, so this collects
    /// the connection ids that own the scenario's lock strings
    /// (`IS_USED_LOCK`) each time it looks.
    My(Mutex<mysql_async::Conn>),
    /// The local backend has no server connections.
    Off,
}

impl Probe {
    /// Connects the probe for `kind`.
    pub async fn connect(kind: BackendKind, url: &str) -> anyhow::Result<Probe> {
        Ok(match kind {
            BackendKind::Postgres => Probe::Pg(raw::pg_connect(url, "dbmutex-bench-probe").await?),
            BackendKind::Mysql => Probe::My(Mutex::new(raw::my_connect(url).await?)),
            // The local backend: no server connections to count.
            _ => Probe::Off,
        })
    }

    /// PostgreSQL: the connections named `app` now. MySQL: adds the current
    /// owners of `lock_strings` to `seen` and returns how many it has seen.
    pub async fn count(
        &self,
        app: &str,
        lock_strings: &[String],
        seen: &mut HashSet<u64>,
    ) -> anyhow::Result<Option<i64>> {
        match self {
            Probe::Pg(c) => {
                let row = c
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                        &[&app],
                    )
                    .await?;
                Ok(Some(row.get(0)))
            }
            Probe::My(conn) => {
                let mut conn = conn.lock().await;
                for chunk in lock_strings.chunks(MY_CHUNK) {
                    let sql = format!("SELECT {}", vec!["IS_USED_LOCK(?)"; chunk.len()].join(", "));
                    let row: Option<mysql_async::Row> = conn.exec_first(sql, chunk.to_vec()).await?;
                    for i in 0..row.as_ref().map_or(0, |r| r.len()) {
                        if let Some(Some(id)) = row.as_ref().and_then(|r| r.get::<Option<u64>, _>(i)) {
                            seen.insert(id);
                        }
                    }
                }
                Ok(Some(seen.len() as i64))
            }
            Probe::Off => Ok(None),
        }
    }

    /// PostgreSQL: the backend pids of the connections named `app`.
    pub async fn pg_backend_pids(&self, app: &str) -> anyhow::Result<Vec<i32>> {
        match self {
            Probe::Pg(c) => Ok(c
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                    &[&app],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect()),
            _ => anyhow::bail!("backend pids are PostgreSQL's"),
        }
    }
}

/// Samples the connection count in the background while a scenario runs
/// and keeps the peak.
pub struct Sampler {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Option<i64>>,
}

impl Sampler {
    /// Starts sampling for the connections named `app` (PostgreSQL) or the
    /// owners of `lock_strings` (MySQL).
    pub fn start(probe: Arc<Probe>, app: String, lock_strings: Vec<String>) -> Sampler {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut seen = HashSet::new();
            let mut peak = None;
            loop {
                // Look after a pause, not at once: `Locker::connect` opens a
                // short-lived second connection (the pooler check) that has
                // just closed and must not count as used by the scenario.
                tokio::select! {
                    _ = &mut stopped => break peak,
                    () = tokio::time::sleep(SAMPLE_EVERY) => {}
                }
                // A failed look (say, while a probe fills the lock table) is
                // skipped, not fatal: the next one may succeed.
                if let Ok(Some(n)) = probe.count(&app, &lock_strings, &mut seen).await {
                    peak = Some(peak.map_or(n, |p: i64| p.max(n)));
                }
            }
        });
        Sampler { stop, task }
    }

    /// Stops sampling; the peak seen, `None` if nothing could be counted.
    pub async fn finish(self) -> Option<i64> {
        let _ = self.stop.send(());
        self.task.await.ok().flatten()
    }
}
