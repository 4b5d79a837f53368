//! `dbmutex`: run a command under a lock that the database owns — flock(1)
//! across hosts — and inspect such locks.
//!
//! Stdout, stdin and stderr belong to the command; dbmutex writes only its
//! own messages, to stderr, prefixed `dbmutex:`. `main` returns the exit
//! status that `--help` documents.

mod acquire;
mod backend;
mod child;
mod cli;
mod docs;
mod exit;
mod group;
mod init;
mod log;
mod once;
mod plan;
mod report;
mod run;
mod say;
mod signals;
mod spawn;
mod tree;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;

use crate::cli::{Cli, Command, Global};
use crate::exit::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(&e)),
    };
    // What needs no runtime: the documentation subcommands.
    let done = match &cli.command {
        Command::Help(args) => Some(docs::help(&args.command).map(|e| usage_error(&e))),
        Command::Completions(args) => Some(docs::completions(args.shell).map(|()| 0)),
        Command::Man(args) => Some(docs::man(args.command.as_deref()).map(|()| 0)),
        _ => None,
    };
    match done {
        Some(Ok(code)) => return ExitCode::from(code),
        Some(Err(f)) => {
            eprintln!("dbmutex: {f}");
            return ExitCode::from(f.code);
        }
        None => {}
    }
    let Cli { global, command } = cli;
    log::install(global.quiet);
    let result = match command {
        Command::Run(args) => {
            // The guardian, forked first: the process is smallest now (no
            // runtime, no connection), so the fork copies least and dbmutex
            // takes the fewest copy-on-write faults after it, and no other
            // thread exists whose locks the fork could copy held (see
            // `group`).
            let guardian = group::Guardian::start(args.kill_after);
            let Some(runtime) = runtime() else {
                if let Ok(g) = guardian {
                    g.dismiss();
                }
                return ExitCode::from(exit::OS_ERROR);
            };
            runtime.block_on(run::run(&global, args, guardian))
        }
        command => {
            let Some(runtime) = runtime() else {
                return ExitCode::from(exit::OS_ERROR);
            };
            runtime.block_on(execute(&global, command))
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("dbmutex: {f}");
            ExitCode::from(f.code)
        }
    }
}

/// The async runtime, or `None` (said on stderr) if it cannot start.
/// Current-thread on purpose: the command is started from this thread, and
/// the parent-death signal fires when that *thread* exits.
fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("dbmutex: cannot start the async runtime: {e}");
            None
        }
    }
}

/// Runs the parsed command but `run` (which `main` starts with its
/// guardian) and the documentation subcommands.
async fn execute(global: &Global, command: Command) -> Result<u8, Failure> {
    match command {
        Command::Status(args) => report::status(global, args).await,
        Command::List(args) => report::list(global, args).await,
        Command::Key(args) => report::key(global, args),
        Command::Init => init::init(global).await,
        Command::Run(_) | Command::Help(_) | Command::Completions(_) | Command::Man(_) => {
            unreachable!("handled in main")
        }
    }
}

/// Prints a parse error (or the help or version asked for) and returns the
/// exit status: 0 for `--help` and `--version`, 64 for any usage error
/// (clap's own default would be 2).
fn usage_error(e: &clap::Error) -> u8 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        // `dbmutex` alone: the help, on stderr, as a usage error.
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{}", e.render());
            exit::USAGE
        }
        _ => {
            eprint!("dbmutex: {}", scrub_usage(e.render().to_string()));
            exit::USAGE
        }
    }
}

/// clap quotes the arguments it could not use (`invalid value '…' for
/// '--timeout <SECONDS>'`, `unexpected argument '…'`). One that looks like
/// a connection string (`://`, `password`, or `user:pass@host`) — a URL
/// passed to the wrong flag, `--databse-url=…`
/// — is shown as `dbmutex::redact_url` describes it, never as given.
fn scrub_usage(mut text: String) -> String {
    for arg in std::env::args_os().skip(1) {
        let arg = arg.to_string_lossy().into_owned();
        let value = arg.split_once('=').map(|(_, v)| v.to_owned());
        for candidate in [Some(arg), value].into_iter().flatten() {
            let lower = candidate.to_ascii_lowercase();
            let suspect = candidate.contains("://")
                || lower.contains("password")
                || (candidate.contains('@') && candidate.contains(':'));
            if suspect && text.contains(&candidate) {
                text = text.replace(&candidate, &dbmutex::redact_url(&candidate));
            }
        }
    }
    text
}
