//! Exit statuses (sysexits.h values, as the contract in `--help` lists them)
//! and the failure type that carries one.

use std::fmt;

/// Bad flag or value, empty name, no command, an option the backend lacks.
pub const USAGE: u8 = 64;
/// Server unreachable, authentication failed, other database error before
/// the command started.
pub const UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran.
pub const LOCK_LOST: u8 = 70;
/// The operating system refused something dbmutex needs (runtime, signals).
pub const OS_ERROR: u8 = 71;
/// Writing our own output failed.
pub const IO_ERROR: u8 = 74;
/// Configuration error: `--require-database` (or `DBMUTEX_REQUIRE_DATABASE`)
/// and no database URL (sysexits.h `EX_CONFIG`).
pub const CONFIG: u8 = 78;
/// Default for "not acquired" (`-n` conflict, `-w` timeout).
pub const NOT_ACQUIRED: u8 = 75;
/// The command held the lock past `--max-hold` and was stopped (as
/// timeout(1) exits when its command times out).
pub const MAX_HOLD: u8 = 124;
/// The command was found but could not be executed (as env(1) and shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as env(1) and shells).
pub const NOT_FOUND: u8 = 127;

/// The status for a process that died of signal `sig`: 128 + N, as shells report it.
pub fn for_signal(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(u8::MAX)
}

/// An error that ends dbmutex: a message for stderr and an exit status.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
    /// What kind of error, for `--json` (`None`: the exit status says it).
    pub kind: Option<&'static str>,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            kind: None,
        }
    }

    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = Some(kind);
        self
    }

    /// The kind `dbmutex status --json` reports: the library error's, else
    /// one the exit status implies.
    pub fn kind(&self) -> &'static str {
        self.kind.unwrap_or(match self.code {
            USAGE => "usage",
            UNAVAILABLE => "database",
            CONFIG => "require_database",
            IO_ERROR => "output",
            _ => "other",
        })
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Failure::new(USAGE, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<dbmutex::Error> for Failure {
    fn from(e: dbmutex::Error) -> Self {
        use dbmutex::Error;
        let (code, kind) = match &e {
            // What the user asked for cannot be done as asked: a usage error.
            Error::InvalidName(_) => (USAGE, "invalid_name"),
            Error::Config(_) => (USAGE, "config"),
            Error::Unsupported(_) => (USAGE, "unsupported"),
            Error::LockLost { .. } => (LOCK_LOST, "lock_lost"),
            Error::MaxHoldExceeded { .. } => (MAX_HOLD, "max_hold"),
            Error::Connect(_) => (UNAVAILABLE, "connect"),
            Error::Io(_) => (UNAVAILABLE, "lock_file"),
            // Database, Deadlock, LockTableFull, TooManyLocks, and whatever
            // later versions add: the server failed us.
            _ => (UNAVAILABLE, "database"),
        };
        Failure::new(code, describe(&e)).with_kind(kind)
    }
}

/// A library error met after connecting, while the lock is taken or the
/// run recorded: a configuration error then is the server's state (a
/// missing table, a missing grant, a lock file that is not a regular
/// file), not the command line's: 69, as `run --help` says.
pub fn after_connect(e: dbmutex::Error) -> Failure {
    let mut f = Failure::from(e);
    if f.kind == Some("config") {
        f.code = UNAVAILABLE;
    }
    f
}

/// The error's message followed by those of its sources that it does not
/// already include.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_the_contract() {
        let usage = dbmutex::Error::Unsupported("no shared locks".into());
        assert_eq!(Failure::from(usage).code, USAGE);
        let name = dbmutex::Error::InvalidName("empty".into());
        assert_eq!(Failure::from(name).code, USAGE);
        let connect = dbmutex::Error::Connect("refused".into());
        let f = Failure::from(connect);
        assert_eq!(f.code, UNAVAILABLE);
        assert!(f.message.contains("refused"), "{}", f.message);
        assert_eq!(f.kind(), "connect");
        assert_eq!(
            Failure::from(dbmutex::Error::Database("x".into())).code,
            UNAVAILABLE
        );
    }

    #[test]
    fn config_errors_after_connecting_are_the_servers() {
        let missing = || dbmutex::Error::Config("run `dbmutex init --database-url URL`".into());
        assert_eq!(Failure::from(missing()).code, USAGE);
        let f = after_connect(missing());
        assert_eq!((f.code, f.kind()), (UNAVAILABLE, "config"));
        let unsupported = dbmutex::Error::Unsupported("no shared locks".into());
        assert_eq!(after_connect(unsupported).code, USAGE);
    }

    /// Each source's text appears once, however the chain repeats it.
    #[test]
    fn describe_prints_each_cause_once() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl fmt::Display for E {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let os = E("Connection refused (os error 111)", None);
        let io = E("io: Connection refused (os error 111)", Some(Box::new(os)));
        let top = E(
            "cannot connect: io: Connection refused (os error 111)",
            Some(Box::new(io)),
        );
        assert_eq!(
            describe(&top),
            "cannot connect: io: Connection refused (os error 111)"
        );
        let bare = E("cannot connect", Some(Box::new(E("timed out", None))));
        assert_eq!(describe(&bare), "cannot connect: timed out");
    }

    #[test]
    fn signal_statuses() {
        assert_eq!(for_signal(15), 143);
        assert_eq!(for_signal(9), 137);
        assert_eq!(for_signal(200), 255);
    }
}
