//! A cheap millisecond clock for the hot path's bookkeeping (when a
//! connection last answered, when a key was last contended): the kernel's
//! coarse monotonic clock, which the vDSO reads without the timestamp
//! counter, at the resolution of the kernel's tick (1–10 ms; 4 ms here).
//! Every lock cycle reads it two to six times; `Instant::elapsed` and
//! `as_millis` cost ~100 instructions a read more (issue #25's callgrind
//! figures). Not for deadlines: those stay on `Instant`.

/// Milliseconds on a monotonic clock (since boot on Linux), never 0,
/// coarse: two reads within a few milliseconds may be equal.
pub(crate) fn coarse_ms() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's
        // duration, and the clock id is a constant the kernel knows (since
        // 2.6.32); the call writes nothing else.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0 {
            return ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000 + 1;
        }
    }
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::coarse_ms;

    #[test]
    fn it_moves_forward_in_milliseconds() {
        let a = coarse_ms();
        assert!(a > 0);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let b = coarse_ms();
        // 50 ms later, give or take the coarse clock's tick, or much later
        // on a busy machine; not seconds (0) nor microseconds (~50,000).
        assert!((35..=5_000).contains(&(b - a)), "{a} -> {b}");
    }
}
