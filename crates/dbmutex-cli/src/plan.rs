//! `dbmutex run`'s arguments turned into one validated plan before anything
//! connects: what to run, which lock, how long to wait, what to say. Every
//! check that needs no server is here, so a bad command line never takes a
//! lock. The duration grammar of every time option lives in [`duration`].

pub mod duration;

use std::time::Duration;

use dbmutex::{BackendKind, LockName, LockOptions, Mode};

use crate::backend::Target;
use crate::child::Program;
use crate::cli::{Global, RunArgs};
use crate::exit::Failure;
use crate::report::valid_name;
use crate::say::{shown, Say};

/// What to say while waiting for the lock.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Notices {
    /// Nothing (`-q`, or `-E 0` without `-v`).
    Never,
    /// One line after a second.
    Once,
    /// That line, then another every 5 s (`-v`).
    Repeat,
}

/// `--once-per`: the window, and whether to start it afresh now.
#[derive(Clone, Copy)]
pub struct OncePer {
    pub window: Duration,
    pub reset: bool,
}

/// A validated `dbmutex run`.
pub struct Plan {
    pub program: Program,
    pub lock: LockName,
    /// NAME as given (the command's `DBMUTEX_LOCK_NAME`).
    pub given_name: String,
    /// NAME as messages show it.
    pub name: String,
    pub target: Target,
    pub mode: Mode,
    /// The lock's options, without the wait (see [`Plan::wait`]).
    pub opts: LockOptions,
    /// The wait bound: `None` = forever, zero = try once.
    pub wait: Option<Duration>,
    pub slots: Option<u32>,
    pub once_per: Option<OncePer>,
    pub kill_after: Duration,
    /// The status when the lock is not acquired (`-E`).
    pub conflict_exit_code: u8,
    /// dbmutex's own messages.
    pub say: Say,
    /// Messages about a busy lock: news unless `-q`, or `-E 0` (not
    /// acquired = nothing to report) without `-v`.
    pub busy: Say,
    pub notices: Notices,
}

impl Plan {
    /// Checks the arguments in the order a user meets them: the command,
    /// then the name, then the backend and what it supports.
    pub fn new(global: &Global, args: RunArgs) -> Result<Plan, Failure> {
        let mut program = program(&args)?;
        // A command that cannot start takes no lock and records no run.
        program.check()?;
        let lock = valid_name(&args.name, &args.int)?;
        let target = Target::choose(global)?;
        let mode = if args.shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        check_supported(target.kind, mode, args.transaction)?;
        let name = match &lock {
            LockName::Int(n) => n.to_string(),
            _ => shown(&args.name),
        };
        let mut opts = LockOptions::new()
            .mode(mode)
            .transaction(args.transaction)
            .fenced(args.fence);
        if let Some(d) = args.max_hold {
            opts = opts.max_hold(d);
        }
        if let Some(d) = args.lock_delay {
            opts = opts.lock_delay(d);
        }
        let say = Say {
            quiet: global.quiet,
            verbose: global.verbose,
        };
        let busy = Say {
            quiet: global.quiet || (args.conflict_exit_code == 0 && !global.verbose),
            verbose: global.verbose,
        };
        let notices = if busy.quiet {
            Notices::Never
        } else if global.verbose {
            Notices::Repeat
        } else {
            Notices::Once
        };
        Ok(Plan {
            wait: args.wait(),
            program,
            lock,
            given_name: args.name,
            name,
            target,
            mode,
            opts,
            slots: args.slots,
            once_per: args.once_per.map(|window| OncePer {
                window,
                reset: args.reset_window,
            }),
            kill_after: args.kill_after,
            conflict_exit_code: args.conflict_exit_code,
            say,
            busy,
            notices,
        })
    }
}

/// The command from `-c` or the trailing arguments.
fn program(args: &RunArgs) -> Result<Program, Failure> {
    match (&args.shell_command, args.argv.is_empty()) {
        (Some(line), _) => Ok(Program::Shell(line.clone())),
        (None, false) => Ok(Program::Argv {
            argv: args.argv.clone(),
            found: None,
        }),
        (None, true) => Err(Failure::usage(
            "no command to run: give one after NAME (dbmutex run NAME -- COMMAND [ARGS...]) \
             or with -c 'SHELL COMMAND'",
        )),
    }
}

/// Rejects options the backend cannot honour, before connecting.
fn check_supported(kind: BackendKind, mode: Mode, transaction: bool) -> Result<(), Failure> {
    let can = kind.capabilities();
    if mode == Mode::Shared && !can.shared {
        return Err(Failure::usage(format!(
            "the {} backend's locks are exclusive only: drop -s/--shared, \
             or use PostgreSQL or the local backend",
            kind.as_str()
        )));
    }
    if transaction && !can.transaction {
        return Err(Failure::usage(format!(
            "--transaction needs PostgreSQL; the {} backend holds session locks only",
            kind.as_str()
        )));
    }
    Ok(())
}
