//! Who holds what: a queue's head is its holder; each key's value is a
//! note about who put it.

use etcd_client::{Client, GetOptions, KeyValue, SortOrder, SortTarget};
use jiff::Timestamp;

use super::client;
use crate::key::etcd_name_of;
use crate::types::{Holder, HolderId, ListedLock};
use crate::{Mode, Result};

/// The value of a key this backend puts: `<since>\t<pid>\t<application>`
/// (RFC 3339 UTC with microseconds, the OS process id, the locker's
/// application name).
pub(super) fn note(application: &str) -> String {
    let since = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ");
    format!("{since}\t{}\t{application}", std::process::id())
}

/// The holder a head key describes: its note where it has one (another
/// client's, `etcdctl lock`'s, has none), the lease id as its `pid` else.
fn holder_of(kv: &KeyValue) -> Holder {
    let value = kv.value_str().unwrap_or_default();
    let mut parts = value.splitn(3, '\t');
    let (since, pid, app) = (parts.next(), parts.next(), parts.next());
    let id = match pid.and_then(|p| p.parse().ok()) {
        Some(pid) => HolderId::ClientPid(pid),
        None => HolderId::LeaseId(kv.lease()),
    };
    Holder {
        id,
        pid: id.value().unwrap_or_default(),
        mode: Mode::Exclusive,
        application: app.filter(|a| !a.is_empty()).map(str::to_owned),
        user: None,
        client: None,
        since: since
            .filter(|s| !s.is_empty() && pid.is_some())
            .map(str::to_owned),
    }
}

/// The holder of the queue under `prefix`, if any.
pub(super) async fn holders(client: &Client, prefix: &str) -> Result<Vec<Holder>> {
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let answer = client::get(client, prefix, first).await?;
    Ok(answer.kvs().iter().map(holder_of).collect())
}

/// The head of every queue under `root/`, by key.
pub(super) async fn list(client: &Client, root: &str, prefix: &str) -> Result<Vec<ListedLock>> {
    let all = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let answer = client::get(client, &format!("{root}/"), all).await?;
    let mut heads: std::collections::BTreeMap<String, ListedLock> = Default::default();
    for kv in answer.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        let Some((queue, _)) = key.rsplit_once('/') else {
            continue;
        };
        // Ascending create order: the first key seen of a queue is its head.
        heads.entry(queue.to_owned()).or_insert_with(|| ListedLock {
            name: etcd_name_of(key, root, prefix),
            key: format!("{queue}/"),
            holder: holder_of(kv),
        });
    }
    Ok(heads.into_values().collect())
}
