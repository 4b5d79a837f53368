//! Running several measuring clients at once.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::stats::Sample;

/// Runs `n` clients concurrently and merges what they measured.
///
/// Client `i` is `client(i, barrier)`; it sets up (connects, prepares), waits
/// on the barrier, then measures, so connection set-up never counts and all
/// clients measure the same span. The run's `seconds` is the longest
/// client's. The first error aborts the other clients (one that failed
/// before the barrier would otherwise leave the rest waiting forever).
pub async fn run<F, Fut>(n: usize, client: F) -> anyhow::Result<Sample>
where
    F: Fn(usize, Arc<Barrier>) -> Fut,
    Fut: Future<Output = anyhow::Result<Sample>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let mut set = JoinSet::new();
    for i in 0..n {
        set.spawn(client(i, barrier.clone()));
    }
    let mut all = Sample::default();
    while let Some(joined) = set.join_next().await {
        let s = joined??;
        all.lat.merge(s.lat);
        all.seconds = all.seconds.max(s.seconds);
    }
    Ok(all)
}
