//! Once-per-window runs on the local backend (see [`crate::runs`]): the
//! last run in `<lock file>.run`, replaced while the lock is held.
//!
//! Ages come from the kernel's boot clock, this backend's "server clock":
//! one for every process of the host, never set, never stepped, and read
//! from `/proc/uptime`, so that no per-process view of the wall clock (a
//! `faketime`-style shim) shifts it. A record from another boot (its
//! `boot` differs) is aged by the wall clock.
//!
//! The file is lines of `key=value`: `run`, `started_us`, `host`, `pid`,
//! `boot` (the boot's id) and `boot_us` (the boot clock at the start), and
//! once it ended `finished_us` and `exit` (wall times in microseconds since
//! the Unix epoch).

use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::fence::{beside, read, replace};
use super::file::io_error;
use crate::runs::{self, LastRun, Run, RunStart, Who};
use crate::{Error, Result};

const SUFFIX: &str = ".run";

/// Reads the last run and, if a new one is due, records its start; the
/// caller holds the lock file at `lock`. Blocking.
pub(super) fn start(lock: &Path, window: Duration, who: &Who) -> Result<RunStart> {
    let last = last(lock)?;
    if let Some((last, ago)) = &last {
        if !runs::due(*ago, window) {
            return Ok(RunStart::NotDue(last.clone()));
        }
    }
    let run = last.map_or(0, |(l, _)| l.run) + 1;
    let mut text = format!(
        "run={run}\nstarted_us={}\nhost={}\npid={}\n",
        micros(SystemTime::now()),
        one_line(&who.host),
        who.pid
    );
    if let Some((boot, at)) = boot_clock() {
        text.push_str(&format!("boot={boot}\nboot_us={at}\n"));
    }
    replace(lock, SUFFIX, &text)?;
    Ok(RunStart::Due(Run { run }))
}

/// Records the end of `run`, started under the lock the caller holds.
pub(super) fn finish(lock: &Path, run: u64, exit_code: Option<i32>) -> Result<()> {
    let path = beside(lock, SUFFIX);
    let text = read(&path).map_err(|e| io_error(format!("cannot read {}", path.display()), e))?;
    let fields = parse(&text, &path)?;
    if fields.run != run {
        return Err(Error::Io(io::Error::other(format!(
            "{} records run {}, not run {run}: another holder started one",
            path.display(),
            fields.run
        ))));
    }
    let mut text: String = text
        .lines()
        .filter(|l| !l.starts_with("finished_us=") && !l.starts_with("exit="))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(&format!("finished_us={}\n", micros(SystemTime::now())));
    if let Some(code) = exit_code {
        text.push_str(&format!("exit={code}\n"));
    }
    replace(lock, SUFFIX, &text)
}

/// The last run recorded beside `lock` and its age in microseconds (this
/// host's clock); `None` if it never ran. Blocking.
pub(super) fn last(lock: &Path) -> Result<Option<(LastRun, i64)>> {
    let path = beside(lock, SUFFIX);
    let text = match read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(format!("cannot read {}", path.display()), e)),
    };
    let f = parse(&text, &path)?;
    let ago = match (&f.boot, boot_clock()) {
        (Some((boot, at)), Some((now_boot, now))) if *boot == now_boot => now.saturating_sub(*at),
        _ => micros(SystemTime::now()).saturating_sub(f.started_us),
    };
    Ok(Some((
        LastRun {
            run: f.run,
            started_at: runs::from_micros(f.started_us),
            ago: runs::ago(ago),
            host: f.host,
            pid: f.pid,
            finished_at: f.finished_us.map(runs::from_micros),
            exit_code: f.exit,
        },
        ago,
    )))
}

struct Fields {
    run: u64,
    started_us: i64,
    host: String,
    pid: u32,
    finished_us: Option<i64>,
    exit: Option<i32>,
    /// The boot it started in and the boot clock then (absent in records
    /// of older versions).
    boot: Option<(String, i64)>,
}

/// A run file's fields; one missing or unreadable is an error (never a
/// silent "due").
fn parse(text: &str, path: &Path) -> Result<Fields> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
    };
    let bad = || {
        io_error(
            format!("run file {} is not a run record", path.display()),
            io::Error::from(io::ErrorKind::InvalidData),
        )
    };
    fn num<T: std::str::FromStr>(v: Option<&str>) -> Option<T> {
        v?.parse().ok()
    }
    /// Absent is `None`; present and unreadable is an error.
    fn opt<T: std::str::FromStr>(v: Option<&str>) -> std::result::Result<Option<T>, ()> {
        v.map(|v| v.parse().map_err(drop)).transpose()
    }
    Ok(Fields {
        run: num(field("run")).ok_or_else(bad)?,
        started_us: num(field("started_us")).ok_or_else(bad)?,
        host: field("host").ok_or_else(bad)?.to_owned(),
        pid: num(field("pid")).ok_or_else(bad)?,
        finished_us: opt(field("finished_us")).map_err(|()| bad())?,
        exit: opt(field("exit")).map_err(|()| bad())?,
        boot: match (field("boot"), opt(field("boot_us")).map_err(|()| bad())?) {
            (Some(id), Some(at)) => Some((id.to_owned(), at)),
            _ => None,
        },
    })
}

/// This boot's id and the boot clock in microseconds (the kernel's
/// uptime, `CLOCK_BOOTTIME` to 10 ms, suspended time included); `None`
/// where either cannot be read.
pub(super) fn boot_clock() -> Option<(String, i64)> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let secs: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    Some((id.trim().to_owned(), (secs * 1e6) as i64))
}

fn micros(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

/// A host name as one line of the file.
fn one_line(host: &str) -> String {
    host.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_due_once_per_window_and_its_end_is_kept() {
        let dir = std::env::temp_dir().join(format!("dbmutex-runs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("x.lock");
        let _ = std::fs::remove_file(beside(&lock, SUFFIX));
        let who = Who {
            host: "h1".into(),
            pid: 42,
        };
        let hour = Duration::from_secs(3600);
        let RunStart::Due(run) = start(&lock, hour, &who).unwrap() else {
            panic!("the first run is due")
        };
        assert_eq!(run.number(), 1);
        let RunStart::NotDue(last) = start(&lock, hour, &who).unwrap() else {
            panic!("a second run within the hour is not due")
        };
        assert_eq!(
            (last.run, last.host.as_str(), last.pid, last.exit_code),
            (1, "h1", 42, None)
        );
        finish(&lock, 1, Some(3)).unwrap();
        let (last, _) = super::last(&lock).unwrap().unwrap();
        assert_eq!(last.exit_code, Some(3));
        assert!(last.finished_at.is_some());
        assert!(finish(&lock, 7, Some(0)).is_err(), "not this run's record");
        let RunStart::Due(run) = start(&lock, Duration::ZERO, &who).unwrap() else {
            panic!("a zero window is always due")
        };
        assert_eq!(run.number(), 2);
        std::fs::write(beside(&lock, SUFFIX), "run=x\n").unwrap();
        assert!(
            start(&lock, hour, &who).is_err(),
            "a damaged record is an error, not a run"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
