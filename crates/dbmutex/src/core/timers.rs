//! The process's timer thread (`dbmutex-timers`): a runtime of its own
//! that keeps the clocks of the library's long sleeps — PostgreSQL's
//! keepalive probes, the idle-connection reapers — off the callers'
//! runtimes. A sleeping timer in a runtime makes every park of that
//! runtime read the clock and search its timer wheel: ~700 instructions
//! per lock cycle for a probe that, on a busy lock session, never goes
//! out, and ~1,000 per acquisition of a fleet waiter for a reaper that
//! wakes once a minute (issue #25's callgrind figures). What a sleep
//! wakes up to do still runs on the caller's runtime (see the users).

use tokio::runtime::Handle;

/// [`handle`], once started (`None` inside: the thread could not start).
static TIMERS: std::sync::OnceLock<Option<Handle>> = std::sync::OnceLock::new();

/// The timer thread's runtime, started on first use (~100 µs, cold, once
/// per process); `None` if the thread could not be started (its users
/// then sleep on their own runtimes, as before).
pub(crate) fn handle() -> Option<&'static Handle> {
    TIMERS
        .get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .ok()?;
            let handle = rt.handle().clone();
            std::thread::Builder::new()
                .name("dbmutex-timers".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .ok()?;
            Some(handle)
        })
        .as_ref()
}

/// The timer thread's runtime if it has been started (its start was
/// tried: `Some(None)` when that failed), without starting it.
pub(crate) fn started() -> Option<Option<&'static Handle>> {
    TIMERS.get().map(Option::as_ref)
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "current_thread")]
    async fn a_sleep_on_the_timer_thread_ends_there() {
        let on = super::handle().expect("the timer thread starts");
        assert!(super::started().is_some_and(|h| h.is_some()));
        let t = std::time::Instant::now();
        on.spawn(tokio::time::sleep(std::time::Duration::from_millis(20)))
            .await
            .unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(20));
    }
}
