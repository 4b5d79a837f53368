//! Lock-delay (`LockOptions::lock_delay`) on every backend, with real
//! processes: a holder killed with SIGKILL (this test binary re-run as a
//! child) leaves its lock closed for the delay after its last renewal,
//! and a holder that releases — awaited or by dropping its guard — opens it
//! at once. The contender waits in every case, so the time from the kill
//! (or the release) to its grant is the closure.

mod common;
#[path = "common/lines.rs"]
mod lines;
use lines::Child;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{unique, Backend};
use dbmutex::{Error, LockOptions, Locker};

/// Set in a child process: `url`, `name` and the delay in ms, `\n`-joined.
const CHILD_ENV: &str = "DBMUTEX_TEST_DELAY_CHILD";

/// The delay every holder of these tests asks for, and its renewal beat
/// (a quarter of it, see `dbmutex::delay`).
const DELAY: Duration = Duration::from_secs(2);
const BEAT: Duration = Duration::from_millis(500);

fn opts() -> LockOptions {
    LockOptions::new()
        .lock_delay(DELAY)
        .timeout(Duration::from_secs(20))
}

/// A killed holder's lock opens between `DELAY` and `DELAY + BEAT` after
/// its last renewal, so between `DELAY - BEAT` and `DELAY + BEAT` after the
/// kill (plus the machine's slack on the late side); a clean release, at once.
async fn a_killed_holders_lock_stays_closed_for_the_delay(b: Backend) {
    let name = unique("delay-kill");
    let mut child = hold(b, &name);
    // A few renewals happen before the kill.
    tokio::time::sleep(3 * BEAT).await;
    let contender = b.locker().await;
    let waiting = {
        let (contender, name) = (contender.clone(), name.clone());
        tokio::spawn(async move {
            let g = contender.acquire(name.as_str(), &opts()).await;
            (Instant::now(), g)
        })
    };
    // The contender is queued behind the child before it dies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the contender got in while the child held the lock"
    );
    let killed = Instant::now();
    child.kill();
    let (at, g) = waiting.await.unwrap();
    let g = g.unwrap().expect("granted once the delay passed");
    let closed = at - killed;
    eprintln!("{b:?}: lock closed for {closed:?} after the kill (delay {DELAY:?}, beat {BEAT:?})");
    assert!(
        closed >= DELAY - BEAT - Duration::from_millis(100),
        "{b:?}: the lock opened {closed:?} after the kill, under the delay {DELAY:?} less a beat"
    );
    assert!(
        closed <= DELAY + BEAT + Duration::from_millis(1500),
        "{b:?}: the lock stayed closed {closed:?} after the kill, far past {DELAY:?} + {BEAT:?}"
    );

    // The new holder renews it: released cleanly, it opens at once, to a
    // waiter as to a try.
    let third = b.locker().await;
    let next = {
        let (third, name) = (third.clone(), name.clone());
        tokio::spawn(async move {
            let g = third.acquire(name.as_str(), &opts()).await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(3 * BEAT).await;
    let released = Instant::now();
    g.release().await.unwrap();
    let (at, g) = next.await.unwrap();
    let g = g.unwrap().expect("granted after a clean release");
    let gap = at - released;
    eprintln!("{b:?}: a clean release let the waiter in after {gap:?}");
    assert!(
        gap < DELAY / 2,
        "{b:?}: a clean release kept the lock closed for {gap:?}"
    );

    // A dropped guard opens it too (in the background, before its unlock).
    drop(g);
    let dropped = Instant::now();
    let g = contender
        .acquire(name.as_str(), &opts())
        .await
        .unwrap()
        .expect("granted after a dropped guard");
    let gap = dropped.elapsed();
    assert!(
        gap < DELAY / 2,
        "{b:?}: a dropped guard kept the lock closed for {gap:?}"
    );
    g.release().await.unwrap();
}

/// While the lock is closed, a try answers "not acquired" at once, and so
/// does a wait whose bound ends before the closure does; neither changes
/// the record, and a wait that outlasts the closure is granted once it ends.
async fn a_closed_lock_is_refused_within_the_callers_bound(b: Backend) {
    let name = unique("delay-bound");
    let mut child = hold(b, &name);
    tokio::time::sleep(2 * BEAT).await;
    let killed = Instant::now();
    child.kill();
    let other = b.locker().await;
    // The server frees a killed client's lock within milliseconds; the
    // try then finds the lock itself free and the record closed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let tried = other
        .acquire(name.as_str(), &LockOptions::try_once().lock_delay(DELAY))
        .await
        .unwrap();
    assert!(tried.is_none(), "{b:?}: a try got a lock closed by its delay");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "{b:?}: the try waited {:?}",
        t.elapsed()
    );
    let short = LockOptions::new()
        .lock_delay(DELAY)
        .timeout(Duration::from_millis(300));
    let t = Instant::now();
    assert!(other.acquire(name.as_str(), &short).await.unwrap().is_none());
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "{b:?}: a short wait took {:?}",
        t.elapsed()
    );
    let g = other
        .acquire(name.as_str(), &opts())
        .await
        .unwrap()
        .expect("granted after the delay");
    let closed = killed.elapsed();
    assert!(
        closed >= DELAY - BEAT - Duration::from_millis(100),
        "{b:?}: opened after {closed:?}"
    );
    g.release().await.unwrap();
}

/// Lock-delay needs an exclusive session lock, as fencing does.
async fn lock_delay_refuses_shared_locks(b: Backend) {
    let l = b.locker().await;
    let name = unique("delay-shared");
    let r = l.acquire(name.as_str(), &opts().shared(true)).await;
    assert!(matches!(r, Err(Error::Unsupported(_))), "{b:?}: {r:?}");
}

/// `backends!(module: Backend [tests...]; ...)`: one `#[tokio::test]` per
/// backend and test.
macro_rules! backends {
    ($($module:ident: $variant:ident [$($test:ident),* $(,)?];)*) => {$(
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Backend::$variant).await
                }
            )*
        }
    )*};
}

backends! {
    postgres: Postgres [
        a_killed_holders_lock_stays_closed_for_the_delay,
        a_closed_lock_is_refused_within_the_callers_bound,
        lock_delay_refuses_shared_locks,
    ];
    mysql: Mysql [
        a_killed_holders_lock_stays_closed_for_the_delay,
        a_closed_lock_is_refused_within_the_callers_bound,
    ];
    local: Local [
        a_killed_holders_lock_stays_closed_for_the_delay,
        a_closed_lock_is_refused_within_the_callers_bound,
        lock_delay_refuses_shared_locks,
    ];
}

/// This test binary re-run as a holder of `name` on `b` with lock-delay
/// (killed by the test); returns once it holds it.
fn hold(b: Backend, name: &str) -> Child {
    let spec = format!("{}\n{name}\n{}", b.url(), DELAY.as_millis());
    let child = Child::spawn(Command::new(std::env::current_exe().unwrap()).env(CHILD_ENV, spec));
    match child.line().as_str() {
        "held" => child,
        other => panic!("the holding child did not say it held the lock: {other:?}"),
    }
}

/// The child's body runs before libtest's `main` (an ELF constructor), so
/// it is not a test; in every other run of this binary it returns at once.
#[used]
#[link_section = ".init_array"]
static CHILD_MAIN: extern "C" fn() = child_main;

extern "C" fn child_main() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split('\n');
    let (url, name) = (parts.next().unwrap().to_owned(), parts.next().unwrap().to_owned());
    let delay = Duration::from_millis(parts.next().unwrap().parse().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locker = Locker::connect(&url).await.unwrap();
        let opts = LockOptions::try_once().lock_delay(delay);
        let _guard = locker
            .acquire(name.as_str(), &opts)
            .await
            .unwrap()
            .expect("the parent left the lock free");
        println!("held");
        // Held (and renewed) until killed.
        std::future::pending::<()>().await;
    });
}
