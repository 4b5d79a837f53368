//! The etcd floor: etcd's own `concurrency.Mutex` (Go, `client/v3/concurrency`)
//! written against the same client crate dbmutex uses, with no dbmutex
//! logic — what a careful raw client pays per lock cycle:
//!
//! - a session = one lease (TTL 10 s) kept alive in the background;
//! - lock = one transaction: put `<prefix><lease>` with the lease if it
//!   does not exist yet (else read it), and read the queue's first key by
//!   create revision; if that is not ours, wait for the deletion of the key
//!   just below ours (a read, then a watch), and look again;
//! - unlock = delete the key.
//!
//! Uncontended that is two writes (the put, the delete), as dbmutex's cycle.

use anyhow::{bail, Context};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions,
};

/// The members an `etcd://h1:p1,h2:p2[/root]` URL names, as gRPC endpoints.
pub fn endpoints(url: &str) -> anyhow::Result<Vec<String>> {
    let rest = url.split_once("://").map(|(_, r)| r).context("an etcd:// URL")?;
    let hosts = rest.split('/').next().unwrap_or_default();
    let v: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("http://{h}"))
        .collect();
    anyhow::ensure!(!v.is_empty(), "no etcd member in the URL");
    Ok(v)
}

/// The raw floor's queue prefix for lock `name` (beside dbmutex's keys,
/// never among them).
pub fn queue(name: &str) -> String {
    format!("dbmutex-bench-raw/{name}/")
}

/// A client of the members `url` names.
pub async fn connect(url: &str) -> anyhow::Result<Client> {
    Client::connect(endpoints(url)?, None)
        .await
        .context("connecting to etcd")
}

/// One raw session (a lease kept alive) and the mutex cycle on it.
pub struct EtcdMutex {
    client: Client,
    lease: i64,
    /// Keeps the lease alive; aborted on drop (the lease then expires).
    keeper: tokio::task::JoinHandle<()>,
    /// The key of the lock held now.
    held: Option<String>,
}

impl Drop for EtcdMutex {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl EtcdMutex {
    /// Grants the session's lease and starts keeping it alive.
    pub async fn new(client: Client) -> anyhow::Result<EtcdMutex> {
        let mut lc = client.lease_client();
        let lease = lc.grant(10, None).await?.id();
        let (mut keeper, mut answers) = lc.keep_alive(lease).await?;
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                if keeper.keep_alive().await.is_err() || !matches!(answers.message().await, Ok(Some(_))) {
                    return;
                }
            }
        });
        Ok(EtcdMutex {
            client,
            lease,
            keeper,
            held: None,
        })
    }

    /// Waits until this session holds the lock under `prefix` (a queue's
    /// key prefix ending in `/`).
    pub async fn lock(&mut self, prefix: &str) -> anyhow::Result<()> {
        let key = format!("{prefix}{:x}", self.lease);
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let owner = TxnOp::get(prefix, Some(first));
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(self.lease))),
                owner.clone(),
            ])
            .or_else([TxnOp::get(key.as_str(), None), owner]);
        let mut kv = self.client.kv_client();
        let answer = kv.txn(txn).await?;
        let ours = match (answer.succeeded(), answer.op_responses().first()) {
            (true, _) => answer.header().map_or(0, |h| h.revision()),
            (false, Some(TxnOpResponse::Get(g))) => g.kvs().first().map_or(0, |kv| kv.create_revision()),
            _ => bail!("an etcd transaction without its read"),
        };
        let owner = match answer.op_responses().last() {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        };
        self.held = Some(key);
        if owner == Some(ours) {
            return Ok(());
        }
        self.wait_deletes(prefix, ours - 1).await
    }

    /// Waits until no key under `prefix` with a create revision up to
    /// `max` is left (etcd's `waitDeletes`).
    async fn wait_deletes(&mut self, prefix: &str, max: i64) -> anyhow::Result<()> {
        let last = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(max)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        loop {
            let got = self.client.kv_client().get(prefix, Some(last.clone())).await?;
            let Some(kv) = got.kvs().first() else {
                return Ok(());
            };
            let at = got.header().map_or(0, |h| h.revision());
            let opts = WatchOptions::new()
                .with_start_revision(at + 1)
                .with_filters([WatchFilterType::NoPut]);
            let mut stream = self.client.watch_client().watch(kv.key(), Some(opts)).await?;
            while let Some(w) = stream.message().await? {
                if w.events().iter().any(|e| e.event_type() == EventType::Delete) {
                    break;
                }
            }
        }
    }

    /// Deletes the held key.
    pub async fn unlock(&mut self) -> anyhow::Result<()> {
        let key = self.held.take().context("unlock without a lock")?;
        self.client.kv_client().delete(key, None).await?;
        Ok(())
    }
}
