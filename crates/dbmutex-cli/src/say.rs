//! dbmutex's own messages: stderr only, prefixed `dbmutex:`, filtered by
//! `-q` and `-v`. Stdout belongs to the command.

use std::fmt::Display;

#[derive(Clone, Copy, Debug)]
pub struct Say {
    pub quiet: bool,
    pub verbose: bool,
}

impl Say {
    /// A message worth seeing unless `-q` (waiting, not acquired).
    pub fn note(&self, msg: impl Display) {
        if !self.quiet {
            eprintln!("dbmutex: {msg}");
        }
    }

    /// A message for `-v` only (timings).
    pub fn detail(&self, msg: impl Display) {
        if self.verbose {
            eprintln!("dbmutex: {msg}");
        }
    }

    /// An error or warning: always shown.
    pub fn error(&self, msg: impl Display) {
        eprintln!("dbmutex: {msg}");
    }
}

/// A lock name as messages show it: as is, or quoted and escaped when it
/// holds control characters (a newline must not forge a second message).
pub fn shown(name: &str) -> String {
    if name.chars().any(char::is_control) {
        format!("{name:?}")
    } else {
        name.to_owned()
    }
}

/// Seconds with millisecond precision, for messages.
pub fn secs(d: std::time::Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}
