//! `dbmutex run`: take the lock, run the command, release, pass its status on.

use std::pin::pin;
use std::time::{Duration, Instant};

use dbmutex::{BackendKind, LockGuard, LockOptions, Locker, Mode, WaitStrategy};
use tokio::process::Child;

use crate::backend::Target;
use crate::child::{self, Program};
use crate::cli::{Global, RunArgs};
use crate::exit::{self, Failure};
use crate::report::{holders_text, valid_name};
use crate::say::{secs, shown, Say};
use crate::signals::{self, Signals};

/// How long a wait lasts before dbmutex says what it is waiting for.
const NOTICE_AFTER: Duration = Duration::from_secs(1);
/// How long the "who holds it" query may delay that notice.
const HOLDERS_QUERY_LIMIT: Duration = Duration::from_secs(2);
/// How long the release may take before dbmutex exits anyway (exiting
/// closes the connection, so the server frees the lock regardless).
const RELEASE_LIMIT: Duration = Duration::from_secs(10);
/// After giving up a wait, time for the library's background cancel of the
/// server-side wait to go out before the process exits.
const CANCEL_GRACE: Duration = Duration::from_millis(50);

pub async fn run(global: &Global, args: RunArgs) -> Result<u8, Failure> {
    let program = program(&args)?;
    valid_name(&args.name)?;
    let target = Target::choose(global)?;
    let mode = if args.shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    };
    check_supported(target.kind, mode, args.transaction)?;
    let say = Say {
        quiet: global.quiet,
        verbose: global.verbose,
    };
    let name = shown(&args.name);
    let opts = LockOptions::new().mode(mode).transaction(args.transaction);
    let wait = args.wait();

    let mut signals = Signals::install()?;
    let start = Instant::now();
    let taken = tokio::select! {
        r = connect_and_take(&target, &args.name, opts, wait, say) => r?,
        sig = signals.recv() => {
            tokio::time::sleep(CANCEL_GRACE).await;
            say.note(format_args!(
                "got {} while waiting for lock {name}; not running the command",
                child::signal_name(sig)
            ));
            return Ok(exit::for_signal(sig));
        }
    };
    let Some((_locker, guard)) = taken else {
        if wait == Some(Duration::ZERO) {
            say.note(format_args!(
                "lock {name} is held elsewhere; not running the command"
            ));
        } else {
            say.note(format_args!(
                "gave up waiting for lock {name} after {}; not running the command",
                secs(start.elapsed())
            ));
        }
        return Ok(args.conflict_exit_code);
    };
    say.detail(format_args!(
        "acquired lock {name} ({}) on {} after {}",
        mode.as_str(),
        target.describe(),
        secs(start.elapsed())
    ));
    if !guard.is_held() {
        return Err(Failure::new(
            exit::UNAVAILABLE,
            format!("lock {name} was lost before the command started; not running it"),
        ));
    }

    let mut child = match program.spawn() {
        Ok(c) => c,
        Err(f) => {
            let _ = release(guard).await;
            return Err(f);
        }
    };
    let ended = supervise(&mut child, &guard, &mut signals, args.kill_after, &name, say).await;
    finish(ended, guard, &name, say).await
}

/// The command from `-c` or the trailing arguments.
fn program(args: &RunArgs) -> Result<Program, Failure> {
    match (&args.shell_command, args.argv.is_empty()) {
        (Some(line), _) => Ok(Program::Shell(line.clone())),
        (None, false) => Ok(Program::Argv(args.argv.clone())),
        (None, true) => Err(Failure::usage(
            "no command to run: give one after NAME (dbmutex run NAME -- COMMAND [ARGS...]) \
             or with -c 'SHELL COMMAND'",
        )),
    }
}

/// Rejects options the backend cannot honour, before connecting.
fn check_supported(kind: BackendKind, mode: Mode, transaction: bool) -> Result<(), Failure> {
    if mode == Mode::Shared && kind == BackendKind::Mysql {
        return Err(Failure::usage(
            "MySQL/MariaDB locks (GET_LOCK) are exclusive only: drop -s/--shared, \
             or use PostgreSQL or the local backend",
        ));
    }
    if transaction && kind != BackendKind::Postgres {
        return Err(Failure::usage(format!(
            "--transaction needs PostgreSQL; the {} backend holds session locks only",
            kind.as_str()
        )));
    }
    Ok(())
}

async fn connect_and_take(
    target: &Target,
    name: &str,
    opts: LockOptions,
    wait: Option<Duration>,
    say: Say,
) -> Result<Option<(Locker, LockGuard)>, Failure> {
    let locker = target.connect().await?;
    let mut acquire = pin!(acquire(&locker, name, opts, wait));
    tokio::select! {
        r = &mut acquire => return Ok(r?.map(|g| (locker.clone(), g))),
        () = tokio::time::sleep(NOTICE_AFTER) => {}
    }
    if say.quiet {
        return Ok(acquire.await?.map(|g| (locker.clone(), g)));
    }
    // Still waiting: say on what, and who holds it, while the wait goes on.
    let holders = tokio::select! {
        r = &mut acquire => return Ok(r?.map(|g| (locker.clone(), g))),
        h = tokio::time::timeout(HOLDERS_QUERY_LIMIT, locker.holders(name)) => h,
    };
    let who = match holders {
        Ok(Ok(h)) if !h.is_empty() => format!(" (held by {})", holders_text(&h)),
        _ => String::new(),
    };
    say.note(format_args!("waiting for lock {}{who}", shown(name)));
    let guard = acquire.await?;
    Ok(guard.map(|g| (locker.clone(), g)))
}

/// Takes the lock within `wait`: one cheap attempt on the locker's shared
/// session first, then (if that failed and a wait is allowed) a wait in the
/// server, which hands the lock over the moment it is released.
async fn acquire(
    locker: &Locker,
    name: &str,
    opts: LockOptions,
    wait: Option<Duration>,
) -> Result<Option<LockGuard>, dbmutex::Error> {
    let start = Instant::now();
    // A transaction lock needs a connection of its own anyway: no point in
    // a first attempt that would open and close one.
    if !opts.is_transaction() || wait == Some(Duration::ZERO) {
        if let Some(g) = locker
            .acquire(name, &opts.clone().timeout(Duration::ZERO))
            .await?
        {
            return Ok(Some(g));
        }
        if wait == Some(Duration::ZERO) {
            return Ok(None);
        }
    }
    let rest = wait.map(|w| w.saturating_sub(start.elapsed()));
    locker
        .acquire(name, &opts.timeout_opt(rest).wait_strategy(WaitStrategy::Server))
        .await
}

/// How the command's run ended.
enum Ended {
    /// It exited (or died of a signal) with this status for us.
    Exited(u8),
    /// The lock was lost; the command was stopped.
    Lost,
}

/// Waits for the command, forwarding signals; stops it if the lock is lost.
async fn supervise(
    child: &mut Child,
    guard: &LockGuard,
    signals: &mut Signals,
    kill_after: Duration,
    name: &str,
    say: Say,
) -> Result<Ended, Failure> {
    let mut lost = pin!(guard.lost());
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Ended::Exited(child::exit_code(wait_result(status)?))),
            sig = signals.recv() => forward(child, sig),
            () = &mut lost => break,
        }
    }
    say.error(format_args!(
        "lock {name} was lost (its database connection is gone); stopping the command with SIGTERM"
    ));
    child::signal(child, libc::SIGTERM);
    let mut deadline = pin!(tokio::time::sleep(kill_after));
    loop {
        tokio::select! {
            status = child.wait() => {
                wait_result(status)?;
                return Ok(Ended::Lost);
            }
            sig = signals.recv() => forward(child, sig),
            () = &mut deadline => break,
        }
    }
    say.error(format_args!(
        "the command did not stop within {} of SIGTERM; sending SIGKILL",
        secs(kill_after)
    ));
    child::signal(child, libc::SIGKILL);
    wait_result(child.wait().await)?;
    Ok(Ended::Lost)
}

/// Passes a signal dbmutex got on to the command, unless it got it already.
fn forward(child: &Child, sig: i32) {
    if !signals::terminal_sent_it_to_the_command(sig) {
        child::signal(child, sig);
    }
}

fn wait_result(r: std::io::Result<std::process::ExitStatus>) -> Result<std::process::ExitStatus, Failure> {
    r.map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot wait for the command: {e}")))
}

/// Releases the lock and picks the exit status: the command's, or 70 when
/// the lock did not last the whole run.
async fn finish(
    ended: Result<Ended, Failure>,
    guard: LockGuard,
    name: &str,
    say: Say,
) -> Result<u8, Failure> {
    let held_for = guard.held_for();
    let held_throughout = guard.is_held();
    let released = release(guard).await;
    let code = match ended? {
        Ended::Lost => return Ok(exit::LOCK_LOST),
        Ended::Exited(code) => code,
    };
    match released {
        Err(dbmutex::Error::LockLost { .. }) => {}
        _ if !held_throughout => {}
        Ok(()) => {
            say.detail(format_args!(
                "released lock {name} after holding it {}",
                secs(held_for)
            ));
            return Ok(code);
        }
        Err(e) => {
            // The library closes the connection (or our exit does), so the
            // server frees the lock.
            say.error(format_args!(
                "could not confirm the release of lock {name}: {}",
                exit::describe(&e)
            ));
            return Ok(code);
        }
    }
    say.error(format_args!(
        "lock {name} was lost while the command ran (it exited with status {code})"
    ));
    Ok(exit::LOCK_LOST)
}

/// Releases the lock, waiting at most [`RELEASE_LIMIT`] for the server.
async fn release(guard: LockGuard) -> Result<(), dbmutex::Error> {
    tokio::time::timeout(RELEASE_LIMIT, guard.release())
        .await
        .unwrap_or_else(|_| Err(dbmutex::Error::Database("no answer from the server".into())))
}
