//! Lock-delay records on the local backend (see [`crate::delay`]):
//! `<lock file>.delay`, rewritten while the lock is held, says until when
//! the lock is closed on the kernel's boot clock (as once-per runs age:
//! one clock for every process of the host, never stepped), as the lines
//! `boot=<boot id>` and `until_us=<boot clock>`; empty when open. A record
//! from another boot is open: nothing of a lost holder's survives a
//! reboot.

use std::io;
use std::path::Path;
use std::time::Duration;

use super::fence::{beside, read, replace};
use super::file::io_error;
use super::runs::boot_clock;
use crate::delay::Step;
use crate::Result;

const SUFFIX: &str = ".delay";

/// One step on the record of the lock file at `lock`, which the caller
/// holds. Blocking.
pub(super) fn step(lock: &Path, step: Step) -> Result<Duration> {
    let (boot, now) = boot_clock().ok_or_else(|| {
        io_error(
            "lock-delay needs the kernel's boot clock (/proc/uptime, /proc/sys/kernel/random/boot_id)".into(),
            io::Error::from(io::ErrorKind::Unsupported),
        )
    })?;
    let closed = match step {
        Step::Enter(d) => {
            let left = closed_until(lock, &boot)?.map_or(0, |until| until - now);
            if left > 0 {
                return Ok(Duration::from_micros(left.unsigned_abs()));
            }
            Some(d)
        }
        Step::Renew(d) => Some(d),
        Step::Open => None,
    };
    let text = match closed {
        Some(d) => {
            let until = now.saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
            format!("boot={boot}\nuntil_us={until}\n")
        }
        None => String::new(),
    };
    replace(lock, SUFFIX, &text)?;
    Ok(Duration::ZERO)
}

/// The boot clock the record of `lock` says it is closed until, if it is
/// of this boot.
fn closed_until(lock: &Path, boot: &str) -> Result<Option<i64>> {
    let path = beside(lock, SUFFIX);
    let text = match read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(format!("cannot read {}", path.display()), e)),
    };
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
    };
    if text.trim().is_empty() || field("boot") != Some(boot) {
        return Ok(None);
    }
    // Unreadable is never open: a lost holder's closure is not skipped.
    let until = field("until_us").and_then(|v| v.parse().ok()).ok_or_else(|| {
        io_error(
            format!("{} is not a lock-delay record", path.display()),
            io::Error::from(io::ErrorKind::InvalidData),
        )
    })?;
    Ok(Some(until))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_record_says_how_long_and_an_open_one_lets_in() {
        let dir = std::env::temp_dir().join(format!("dbmutex-delay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("x.lock");
        let d = Duration::from_secs(5);
        assert_eq!(
            step(&lock, Step::Enter(d)).unwrap(),
            Duration::ZERO,
            "no record: open"
        );
        let left = step(&lock, Step::Enter(d)).unwrap();
        assert!(left > Duration::from_secs(4) && left <= d, "closed for {left:?}");
        step(&lock, Step::Open).unwrap();
        assert_eq!(step(&lock, Step::Enter(d)).unwrap(), Duration::ZERO, "opened");
        std::fs::write(
            beside(&lock, SUFFIX),
            format!("boot={}\nuntil_us=x\n", boot_clock().unwrap().0),
        )
        .unwrap();
        assert!(
            step(&lock, Step::Enter(d)).is_err(),
            "an unreadable record is an error"
        );
        std::fs::write(beside(&lock, SUFFIX), "boot=another\nuntil_us=99999999999999\n").unwrap();
        assert_eq!(
            step(&lock, Step::Enter(d)).unwrap(),
            Duration::ZERO,
            "another boot's record is open"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
