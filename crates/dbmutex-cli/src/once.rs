//! `run --once-per`: the run record's checks, and how a recorded run reads
//! (in `run`'s messages and in `status`).

use std::time::{Duration, SystemTime};

use dbmutex::runs::{LastRun, Run, RunStart};
use dbmutex::LockGuard;
use serde_json::{json, Value};

use crate::exit::{self, Failure};
use crate::say::Say;

/// Under the lock: `Ok(Some(run))` when a run is due (its start is now
/// recorded), `Ok(None)` when not (said, unless quiet). `reset`: due
/// whatever the last run (`--reset-window`).
pub async fn start(
    guard: &LockGuard,
    window: Duration,
    reset: bool,
    name: &str,
    say: Say,
) -> Result<Option<Run>, Failure> {
    let asked = if reset { Duration::ZERO } else { window };
    match guard.start_run(asked).await.map_err(exit::after_connect)? {
        RunStart::Due(run) => {
            say.detail(format_args!("run {} of {name} recorded as started", run.number()));
            Ok(Some(run))
        }
        RunStart::NotDue(last) => {
            say.note(format_args!(
                "lock {name} {}; it runs once per {}: not running the command",
                text(&last),
                span(window)
            ));
            Ok(None)
        }
    }
}

/// Records the end of `run` with the exit status dbmutex passes on; a
/// failure is said, not fatal (the command has run).
pub async fn finish(guard: &LockGuard, run: &Run, code: u8, name: &str, say: Say) {
    if let Err(e) = guard.finish_run(run, Some(i32::from(code))).await {
        say.error(format_args!(
            "could not record the end of run {} of {name}: {}",
            run.number(),
            exit::describe(&e)
        ));
    }
}

/// "last started at … (… ago) on HOST, pid N; finished …", for people.
pub fn text(last: &LastRun) -> String {
    let ended = match (last.finished_at, last.exit_code) {
        (Some(at), Some(code)) => format!(
            "finished at {} with exit status {code}{}",
            stamp(at),
            meaning(code)
        ),
        (Some(at), None) => format!("finished at {}", stamp(at)),
        _ => "not finished (still running, or stopped before it could record its end)".into(),
    };
    format!(
        "last started at {} ({} ago) on {}, pid {} (run {}); {ended}",
        stamp(last.started_at),
        span(last.ago),
        last.host,
        last.pid,
        last.run
    )
}

/// What an exit status that dbmutex itself gives means, for people.
fn meaning(code: i32) -> &'static str {
    match u8::try_from(code) {
        Ok(exit::NOT_FOUND) => " (the command was not found, or its shell said so)",
        Ok(exit::CANNOT_EXECUTE) => " (the command could not be executed)",
        Ok(exit::MAX_HOLD) => " (stopped after --max-hold)",
        _ => "",
    }
}

/// The record as `status --json` shows it.
pub fn json(last: &LastRun) -> Value {
    json!({
        "run": last.run,
        "started_at": stamp(last.started_at),
        "ago_seconds": last.ago.as_secs_f64(),
        "host": last.host,
        "pid": last.pid,
        "finished_at": last.finished_at.map(stamp),
        "exit_code": last.exit_code,
    })
}

/// RFC 3339 UTC, to the second.
fn stamp(t: SystemTime) -> String {
    match jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.round(jiff::Unit::Second).unwrap_or(ts).to_string(),
        Err(_) => "an unreadable time".into(),
    }
}

/// A duration the way people say it: `45.0 s`, `12 min 3 s`, `5 h`,
/// `3 d 4 h` (a zero second unit left out).
fn span(d: Duration) -> String {
    let s = d.as_secs();
    let (major, minor) = match s {
        0..60 => return format!("{:.1} s", d.as_secs_f64()),
        60..3600 => ((s / 60, "min"), (s % 60, "s")),
        3600..86400 => ((s / 3600, "h"), (s % 3600 / 60, "min")),
        _ => ((s / 86400, "d"), (s % 86400 / 3600, "h")),
    };
    match minor.0 {
        0 => format!("{} {}", major.0, major.1),
        _ => format!("{} {} {} {}", major.0, major.1, minor.0, minor.1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_stamps_read_well() {
        assert_eq!(span(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(span(Duration::from_secs(723)), "12 min 3 s");
        assert_eq!(span(Duration::from_secs(3600)), "1 h");
        assert_eq!(span(Duration::from_secs(3660)), "1 h 1 min");
        assert_eq!(span(Duration::from_secs(2 * 86400 + 7200)), "2 d 2 h");
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_576_000_400);
        assert_eq!(stamp(t), "2025-12-01T08:00:00Z");
    }
}
