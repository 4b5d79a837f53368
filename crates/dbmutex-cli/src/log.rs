//! The library's own warnings on stderr, in the CLI's words.
//!
//! The library reports through `tracing` what it cannot return as an error:
//! a password file ignored for its permissions, a wait that lost its server
//! and reconnects, an unlock that failed on drop. Without a subscriber those
//! would go nowhere. This one prints warnings (unless `-q`) and errors
//! (always) as `dbmutex: <message> (field=value, …)`, as [`crate::say`]
//! prints the CLI's own; every other level is off at its call site, so the
//! library's debug logging costs the CLI nothing.
//!
//! A small `tracing::Subscriber` of our own rather than `tracing-subscriber`:
//! it prints one line per event and keeps no spans, which is all the CLI
//! needs, and it adds nothing to build or to start.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::metadata::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the subscriber for the whole process. `quiet` keeps errors only.
pub fn install(quiet: bool) {
    let max = if quiet { Level::ERROR } else { Level::WARN };
    // Fails only if one is installed already: then that one prints.
    let _ = tracing::subscriber::set_global_default(Stderr { max });
}

/// Prints events at `max` or more severe to stderr.
struct Stderr {
    max: Level,
}

impl Stderr {
    fn wants(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event() && *meta.level() <= self.max
    }
}

impl Subscriber for Stderr {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.wants(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        self.wants(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(self.max))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // No span is ever enabled (`wants`); an id is required all the same.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        eprintln!("{}", line(event));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The event as one line: `dbmutex: ` (once, whether or not the message
/// starts with it), the message, then the other fields in parentheses.
/// Control characters in values are escaped, so a field cannot forge a
/// second line.
fn line(event: &Event<'_>) -> String {
    let mut v = Line::default();
    event.record(&mut v);
    let message = v.message.strip_prefix("dbmutex: ").unwrap_or(&v.message);
    let mut out = format!("dbmutex: {}", escape(message));
    if !v.fields.is_empty() {
        let _ = write!(out, " ({})", v.fields.join(", "));
    }
    out
}

#[derive(Default)]
struct Line {
    message: String,
    fields: Vec<String>,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

impl Line {
    fn put(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else {
            self.fields.push(format!("{}={}", field.name(), escape(&value)));
        }
    }
}

fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        s.escape_debug().to_string().into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records the lines `Stderr` would print.
    struct Capture {
        inner: Stderr,
        lines: Arc<Mutex<Vec<String>>>,
    }

    impl Subscriber for Capture {
        fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
            self.inner.register_callsite(meta)
        }
        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            self.inner.enabled(meta)
        }
        fn max_level_hint(&self) -> Option<LevelFilter> {
            self.inner.max_level_hint()
        }
        fn new_span(&self, a: &Attributes<'_>) -> Id {
            self.inner.new_span(a)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            self.lines.lock().unwrap().push(line(event));
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    fn captured(max: Level, f: impl FnOnce()) -> Vec<String> {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sub = Capture {
            inner: Stderr { max },
            lines: lines.clone(),
        };
        tracing::subscriber::with_default(sub, f);
        let out = lines.lock().unwrap().clone();
        out
    }

    #[test]
    fn warnings_and_errors_print_as_one_line_each() {
        let lines = captured(Level::WARN, || {
            tracing::warn!(file = "/home/u/.pgpass", "dbmutex: the password file is ignored");
            tracing::error!(name = "a\nb", "unlock failed");
            tracing::info!("not shown");
            tracing::debug!("not shown");
        });
        assert_eq!(
            lines,
            [
                "dbmutex: the password file is ignored (file=/home/u/.pgpass)",
                "dbmutex: unlock failed (name=a\\nb)",
            ]
        );
    }

    #[test]
    fn quiet_keeps_errors_only() {
        let lines = captured(Level::ERROR, || {
            tracing::warn!("a warning");
            tracing::error!(code = 3, "an error");
        });
        assert_eq!(lines, ["dbmutex: an error (code=3)"]);
    }
}
