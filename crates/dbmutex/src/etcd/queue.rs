//! Taking a lock: put this acquisition's key, then wait only for the
//! deletion of the key just below it in create-revision order, as etcd's
//! `concurrency.Mutex` does — first come, first served, and a release
//! wakes exactly the next waiter.

use std::sync::Arc;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::client::{self, session_over};
use super::grant::{delete_until_done, EtcdGrant, Held};
use super::session::{over, Session};
use crate::core::arbiter::Hold;
use crate::core::detach::Undo;
use crate::Result;

/// How a queued key's wait ended.
pub(super) enum Queued {
    /// First in its queue: the lock is held.
    Head(Box<EtcdGrant>),
    /// The deadline passed first (for a try-once, at once); the key is gone.
    TimedOut,
}

/// The key just below ours, and the revision at which it was seen.
struct Ahead {
    key: Vec<u8>,
    seen_at: i64,
}

/// Puts `key` (under the queue `prefix`) with the session's lease and waits
/// until it heads the queue or `deadline` passes.
///
/// # Cancel safety
///
/// Cancel-safe: the key is deleted in the background if this future is
/// dropped at any point, but only after the put has completed (a delete
/// that overtook the put would leave the key queued for the lease's life).
pub(super) async fn enqueue(
    client: &Client,
    session: Arc<Session>,
    prefix: &str,
    key: String,
    note: String,
    deadline: Option<Instant>,
    hold: Option<Hold<String>>,
) -> Result<Queued> {
    let (put_done, done) = watch::channel(false);
    let runtime = tokio::runtime::Handle::current();
    let mut undo = Undo::with(
        (
            Held {
                client: client.clone(),
                key: key.clone(),
                runtime: runtime.clone(),
                session: session.clone(),
                hold,
            },
            done,
        ),
        |(mut held, mut done)| {
            if let Some(h) = held.hold.as_mut() {
                h.releasing();
            }
            let runtime = held.runtime.clone();
            drop(runtime.spawn(async move {
                over(&mut done).await;
                delete_until_done(held).await;
            }));
        },
    );
    // The put, our key's create revision and a look at the two newest keys
    // of the queue (ours and the one just below it), in one round trip;
    // spawned, so that it completes (and then says so) even if this
    // acquisition is dropped midway.
    let put = Txn::new().and_then([
        TxnOp::put(
            key.as_bytes(),
            note,
            Some(PutOptions::new().with_lease(session.lease)),
        ),
        TxnOp::get(key.as_bytes(), Some(GetOptions::new().with_keys_only())),
        TxnOp::get(prefix, Some(newest(2))),
    ]);
    let put_client = client.clone();
    let answer = runtime
        .spawn(async move {
            let r = client::txn(&put_client, put).await;
            let _ = put_done.send(true);
            r
        })
        .await
        .map_err(|_| session_over("the etcd put task ended unexpectedly"))?
        .inspect_err(|e| {
            if client::is_lease_gone(e) {
                session.end("etcd says the lease is gone");
            }
        })?;
    let seen_at = answer.header().map_or(0, |h| h.revision());
    let got = |i: usize| match answer.op_responses().get(i) {
        Some(TxnOpResponse::Get(g)) => g.kvs().to_vec(),
        _ => Vec::new(),
    };
    // The key's create revision, not the transaction's revision: a put
    // retried after a lost answer rewrites the key, which keeps it.
    let revision = got(1).first().map_or(0, |kv| kv.create_revision());
    let newest = got(2);
    let mut ahead = match newest.first() {
        Some(kv) if kv.key() == key.as_bytes() => newest.get(1).map(|kv| Ahead {
            key: kv.key().to_vec(),
            seen_at,
        }),
        // Others queued after a first, unanswered put of ours.
        _ => next_ahead(client, &key, prefix, revision).await?,
    };
    while let Some(a) = ahead {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return timed_out(client, &key, undo).await;
        }
        let gone = wait_deleted(client, &a, session.ended());
        match deadline {
            Some(d) => match tokio::time::timeout_at(d, gone).await {
                Ok(r) => r?,
                Err(_) => return timed_out(client, &key, undo).await,
            },
            None => gone.await?,
        }
        ahead = next_ahead(client, &key, prefix, revision).await?;
    }
    if session.is_over() {
        return Err(session_over(
            "the etcd lease ended while the lock was being taken",
        ));
    }
    let (held, _) = undo.take().expect("armed until here");
    Ok(Queued::Head(Box::new(EtcdGrant::new(held, revision))))
}

/// The newest `n` keys of a queue, newest first.
fn newest(n: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(n)
        .with_keys_only()
}

/// Deletes our key now, so the next try finds the queue as it was.
async fn timed_out(
    client: &Client,
    key: &str,
    mut undo: Undo<(Held, watch::Receiver<bool>)>,
) -> Result<Queued> {
    client::delete(client, key).await?;
    undo.disarm();
    Ok(Queued::TimedOut)
}

/// Waits until the key ahead is deleted (or the watch ends: the caller
/// looks again either way). A session that ends meanwhile is an error.
async fn wait_deleted(client: &Client, ahead: &Ahead, mut ended: watch::Receiver<bool>) -> Result<()> {
    let opts = WatchOptions::new()
        .with_start_revision(ahead.seen_at + 1)
        .with_filters([WatchFilterType::NoPut]);
    let watching = async {
        let mut stream = client.watch_client().watch(ahead.key.clone(), Some(opts)).await?;
        while let Some(answer) = stream.message().await? {
            if answer.canceled()
                || answer
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
            {
                break;
            }
        }
        Ok::<(), etcd_client::Error>(())
    };
    tokio::select! {
        r = watching => {
            if r.is_err() {
                // A member went away mid-watch: look again shortly, on
                // whichever member answers.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Ok(())
        }
        _ = over(&mut ended) => Err(session_over("the etcd lease ended while waiting for the lock")),
        // A watch on a member that went silent (cut off, frozen) never
        // ends by itself: look again now and then.
        () = tokio::time::sleep(RELOOK) => Ok(()),
    }
}

/// How often a waiter looks at the queue again while its watch says nothing.
const RELOOK: std::time::Duration = std::time::Duration::from_secs(5);

/// The key now just below ours, if our key is still queued; an error if it
/// is gone (its lease ended).
async fn next_ahead(client: &Client, key: &str, prefix: &str, revision: i64) -> Result<Option<Ahead>> {
    let look = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then([TxnOp::get(
            prefix,
            Some(newest(1).with_max_create_revision(revision - 1)),
        )]);
    let answer = client::txn(client, look).await?;
    if !answer.succeeded() {
        return Err(session_over(
            "the lock's key vanished from etcd while waiting (its lease ended)",
        ));
    }
    let seen_at = answer.header().map_or(0, |h| h.revision());
    Ok(match answer.op_responses().first() {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| Ahead {
            key: kv.key().to_vec(),
            seen_at,
        }),
        _ => None,
    })
}
