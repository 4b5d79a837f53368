//! One `GET_LOCK` wait: its statements, how a long wait is cut into
//! chunks, and how long an answer may take.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::time::Instant;

use super::conn::{answer_bound, Connector};
use super::errors::Fail;

/// The longest single `GET_LOCK` of a wait; a longer one (or one without a
/// bound) goes on with another. MariaDB answers 0 at once to timeouts beyond
/// about 1.7e10 s, so a large finite timeout must be cut up too.
pub(crate) const FOREVER_CHUNK: Duration = Duration::from_secs(3600);

/// The longest single `GET_LOCK` of a nested acquisition: between chunks the
/// enclosing session is free for the release of its other locks and for its
/// keepalive pings.
pub(crate) const NESTED_CHUNK: Duration = Duration::from_secs(1);

/// The timeout of the next `GET_LOCK` of a wait: what is left until
/// `deadline` (forever when `None`), at most `cap`; and whether it is the
/// last one (it reaches the deadline).
pub(crate) fn chunk(deadline: Option<Instant>, now: Instant, cap: Duration) -> (Duration, bool) {
    match deadline {
        None => (cap, false),
        Some(d) => {
            let left = d.saturating_duration_since(now);
            if left <= cap {
                (left, true)
            } else {
                (cap, false)
            }
        }
    }
}

/// One `SELECT GET_LOCK(lock, wait)`, its answer awaited at most `bound`.
pub(crate) async fn get_lock_once(
    conn: &mut Conn,
    lock: &str,
    wait: Duration,
    bound: Duration,
) -> Result<Option<i64>, Fail> {
    get_lock_once_id(conn, lock, wait, bound).await.map(|(v, _)| v)
}

/// [`get_lock_once`], also answering the session's `CONNECTION_ID()` — the
/// id `IS_USED_LOCK` names the holder by (the handshake's id is 32 bits,
/// and a proxy may show its own), for the loss check.
async fn get_lock_once_id(
    conn: &mut Conn,
    lock: &str,
    wait: Duration,
    bound: Duration,
) -> Result<(Option<i64>, Option<u64>), Fail> {
    let q = conn.exec_first::<(Option<i64>, Option<u64>), _, _>(
        "SELECT GET_LOCK(?, ?), CONNECTION_ID()",
        (lock, wait.as_secs_f64()),
    );
    match tokio::time::timeout(bound, q).await {
        Ok(Ok(row)) => Ok(row.unwrap_or_default()),
        Ok(Err(e)) => Err(Fail::Driver(e)),
        Err(_) => Err(Fail::NoAnswer(bound)),
    }
}

/// How one wait ended.
pub(crate) enum GetLock {
    /// Taken, on the session with this `CONNECTION_ID()`.
    Acquired(u64),
    TimedOut,
    /// `GET_LOCK` returned NULL: an error the server reports as a value.
    Null,
}

/// `GET_LOCK` until acquired, refused (the deadline passed) or NULL, on a
/// session that holds nothing else.
///
/// Cancel safety: if dropped while a `GET_LOCK` runs, the session is killed
/// from another connection (and `conn`, dropped by the caller, closes), so a
/// wait that is still running cannot take the lock later. The same happens
/// when the connection fails midway or gives no answer in time.
pub(crate) async fn get_lock(
    connector: &std::sync::Arc<Connector>,
    runtime: &tokio::runtime::Handle,
    conn: &mut Conn,
    lock: &str,
    deadline: Option<Instant>,
    keepalive: Duration,
) -> Result<GetLock, Fail> {
    let mut kill = connector.kill_on_drop(runtime, conn.id());
    let r = async {
        loop {
            let (wait, last) = chunk(deadline, Instant::now(), FOREVER_CHUNK);
            match get_lock_once_id(conn, lock, wait, answer_bound(wait, keepalive)).await? {
                (Some(1), id) => return Ok(GetLock::Acquired(id.unwrap_or(u64::from(conn.id())))),
                (Some(_), _) if !last => continue,
                (Some(_), _) => return Ok(GetLock::TimedOut),
                (None, _) => return Ok(GetLock::Null),
            }
        }
    }
    .await;
    if matches!(r, Ok(_) | Err(Fail::Driver(mysql_async::Error::Server(_)))) {
        // The statement ended in the server: nothing is left running.
        kill.disarm();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_bound_adds_the_keepalive_margin() {
        let s = Duration::from_secs;
        assert_eq!(answer_bound(s(10), s(1)), s(14));
        assert_eq!(
            answer_bound(Duration::ZERO, Duration::from_millis(250)),
            Duration::from_millis(2500)
        );
        assert_eq!(answer_bound(Duration::MAX, s(1)), Duration::MAX);
        assert_eq!(answer_bound(s(1), Duration::MAX), Duration::MAX);
    }

    #[test]
    fn chunks_are_capped_and_the_last_reaches_the_deadline() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(chunk(None, now, FOREVER_CHUNK), (FOREVER_CHUNK, false));
        // A huge finite timeout: capped, not the last.
        let far = now.checked_add(s(1 << 40)).unwrap();
        assert_eq!(chunk(Some(far), now, FOREVER_CHUNK), (FOREVER_CHUNK, false));
        assert_eq!(chunk(Some(now + s(5)), now, NESTED_CHUNK), (NESTED_CHUNK, false));
        assert_eq!(chunk(Some(now + s(1)), now, NESTED_CHUNK), (s(1), true));
        assert_eq!(chunk(Some(now + s(30)), now, FOREVER_CHUNK), (s(30), true));
        // Past the deadline: a try-once.
        assert_eq!(
            chunk(Some(now), now + s(1), FOREVER_CHUNK),
            (Duration::ZERO, true)
        );
        // Every GET_LOCK of a wait is answered within its bound: the client
        // never waits past the wait's own bound plus the margin.
        let (wait, _) = chunk(Some(now + s(30)), now, FOREVER_CHUNK);
        assert!(answer_bound(wait, s(1)) <= s(30) + s(4));
    }
}
