//! `dbmutex run`: take the lock, run the command, release, pass its status on.

use std::pin::pin;
use std::time::{Duration, Instant};

use dbmutex::runs::Run;
use dbmutex::{BackendKind, LockGuard, LockName, LockOptions, Locker, Mode};
use tokio::process::Child;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::backend::Target;
use crate::child::{self, Program};
use crate::cli::{Global, RunArgs};
use crate::exit::{self, Failure};
use crate::once;
use crate::report::{holders_text, valid_name};
use crate::say::{secs, shown, Say};
use crate::signals::Signals;
use crate::tree::{self, Guardian, Terminal};

/// How long a wait lasts before dbmutex says what it is waiting for.
const NOTICE_AFTER: Duration = Duration::from_secs(1);
/// With `-v`, how often the waiting notice is repeated (with the holders as
/// they are then): often enough to watch a hand-over, rarely enough that a
/// long wait does not flood a log.
const NOTICE_EVERY: Duration = Duration::from_secs(5);
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
    let say = Say {
        quiet: global.quiet,
        verbose: global.verbose,
    };
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
    let wait = args.wait();
    // A busy lock is news unless -q, or -E 0 (not acquired = nothing to
    // report) without -v.
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

    let mut signals = Signals::install()?;
    let start = Instant::now();
    let taken = tokio::select! {
        r = connect_and_take(&target, &lock, &name, opts, wait, notices, args.slots) => r?,
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
            busy.note(format_args!(
                "lock {name} is held elsewhere; not running the command"
            ));
        } else {
            busy.note(format_args!(
                "gave up waiting for lock {name} after {}; not running the command",
                secs(start.elapsed())
            ));
        }
        return Ok(args.conflict_exit_code);
    };
    let fence = guard.fence().map(|t| format!(", fence {t}")).unwrap_or_default();
    say.detail(format_args!(
        "acquired lock {name} ({}{fence}) on {} after {}",
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
    let run = match args.once_per {
        None => None,
        Some(window) => match once::start(&guard, window, args.reset_window, &name, busy).await {
            Ok(Some(run)) => Some(run),
            Ok(None) => {
                let _ = release(guard).await;
                return Ok(args.conflict_exit_code);
            }
            Err(f) => {
                let _ = release(guard).await;
                return Err(f);
            }
        },
    };

    // With a terminal, dbmutex watches the command for stops (job control).
    // Listen before the command exists: a SIGCHLD from a stop that comes
    // before the listener would be missed, and the job would hang.
    let terminal = Terminal::controlling();
    let sigchld = match &terminal {
        Some(_) => match signal(SignalKind::child()) {
            Ok(s) => Some(s),
            Err(e) => {
                let _ = release(guard).await;
                return Err(Failure::new(
                    exit::OS_ERROR,
                    format!("cannot handle signals: {e}"),
                ));
            }
        },
        None => None,
    };
    // The guardian first: from the moment the command exists, dbmutex's
    // death (even by SIGKILL) stops its whole process group.
    let guardian = match Guardian::start(args.kill_after) {
        Ok(g) => g,
        Err(e) => {
            let _ = release(guard).await;
            return Err(Failure::new(
                exit::OS_ERROR,
                format!("cannot start the process that watches over the command: {e}"),
            ));
        }
    };
    // The group gets the terminal only if dbmutex has it (foreground job).
    let give = terminal.as_ref().filter(|t| t.is_ours()).map(Terminal::raw_fd);
    // What the command may want to know of its lock: the name as given, the
    // fencing token only when asked for (an inherited one, from an outer
    // `dbmutex run --fence`, is not this lock's: removed), the slot.
    // The database URL is dbmutex's, not the command's: it may hold a
    // password (DATABASE_URL, often the application's own, stays).
    let mut env = vec![
        ("DBMUTEX_LOCK_NAME", Some(args.name.clone())),
        ("DBMUTEX_FENCE", guard.fence().map(|t| t.to_string())),
        ("DBMUTEX_DATABASE_URL", None),
    ];
    if let LockName::Slot(_, slot) = guard.name() {
        env.push(("DBMUTEX_SLOT", Some(slot.to_string())));
    }
    let child = match program.spawn(guardian.report_fd(), give, &env) {
        Ok(c) => c,
        Err(f) => {
            guardian.disarm();
            // Found by the check, gone (or not executable) by now: the
            // record says how this run ended.
            if let Some(run) = &run {
                once::finish(&guard, run, f.code, &name, say).await;
            }
            let _ = release(guard).await;
            return Err(f);
        }
    };
    let mut tree = Tree::new(child, terminal, sigchld)?;
    let ended = tree
        .supervise(&guard, &mut signals, args.kill_after, &name, say)
        .await;
    if let Some(t) = &tree.terminal {
        if t.is_owned_by(tree.pgid) {
            t.take_back();
        }
    }
    if ended.is_ok() {
        // The group is gone: nothing left for the guardian to stop. (On an
        // error it stays armed, and stops the group when dbmutex exits.)
        guardian.disarm();
    }
    finish(ended, guard, run, &name, say).await
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

/// What to say while waiting for the lock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Notices {
    /// Nothing (`-q`, or `-E 0` without `-v`).
    Never,
    /// One line after [`NOTICE_AFTER`].
    Once,
    /// That line, then another every [`NOTICE_EVERY`] (`-v`).
    Repeat,
}

async fn connect_and_take(
    target: &Target,
    name: &LockName,
    shown_name: &str,
    opts: LockOptions,
    wait: Option<Duration>,
    notices: Notices,
    slots: Option<u32>,
) -> Result<Option<(Locker, LockGuard)>, Failure> {
    let start = tokio::time::Instant::now();
    let locker = target.connect_for_wait(wait).await?;
    // `-w` bounds the whole wait: the connect spent part of it.
    let wait = wait.map(|w| w.saturating_sub(start.elapsed()));
    let acquire = async {
        acquire(&locker, name, opts, wait, slots)
            .await
            .map_err(exit::after_connect)
    };
    let mut acquire = pin!(acquire);
    let mut next = NOTICE_AFTER;
    let mut said = 0u32;
    while notices == Notices::Repeat || (notices == Notices::Once && said == 0) {
        tokio::select! {
            r = &mut acquire => return Ok(r?.map(|g| (locker.clone(), g))),
            () = tokio::time::sleep_until(start + next) => {}
        }
        // Still waiting: say on what, and who holds it now, while the wait
        // goes on.
        let holders = tokio::select! {
            r = &mut acquire => return Ok(r?.map(|g| (locker.clone(), g))),
            h = tokio::time::timeout(HOLDERS_QUERY_LIMIT, locker.holders(name.clone())) => h,
        };
        let who = match holders {
            Ok(Ok(h)) if !h.is_empty() => format!(" (held by {})", holders_text(&h)),
            _ => String::new(),
        };
        if said == 0 {
            eprintln!("dbmutex: waiting for lock {shown_name}{who}");
        } else {
            eprintln!(
                "dbmutex: still waiting for lock {shown_name} after {}{who}",
                secs(start.elapsed())
            );
        }
        said += 1;
        // The next notice keeps to the period however long the query took.
        next += NOTICE_EVERY;
        while start + next <= tokio::time::Instant::now() {
            next += NOTICE_EVERY;
        }
    }
    Ok(acquire.await?.map(|g| (locker.clone(), g)))
}

/// Takes the lock within `wait` with the library's default strategy: one
/// cheap attempt on the locker's shared session, then (if that failed and a
/// wait is allowed) a wait in the server, which hands the lock over the
/// moment it is released.
async fn acquire(
    locker: &Locker,
    name: &LockName,
    opts: LockOptions,
    wait: Option<Duration>,
    slots: Option<u32>,
) -> Result<Option<LockGuard>, dbmutex::Error> {
    let opts = opts.timeout_opt(wait);
    match slots {
        // One of the semaphore's slots (its lock is LockName::Slot).
        Some(n) => Ok(locker
            .acquire_slot(name.to_string(), n, &opts)
            .await?
            .map(dbmutex::SlotGuard::into_guard)),
        None => locker.acquire(name.clone(), &opts).await,
    }
}

/// How the command's run ended.
enum Ended {
    /// It exited (or died of a signal) with this status for us.
    Exited(u8),
    /// The lock was lost; the command was stopped.
    Lost,
    /// The command held the lock past --max-hold; it was stopped.
    MaxHold,
}

/// How often dbmutex checks whether the command's group is empty while it
/// stops it.
const GROUP_POLL: Duration = Duration::from_millis(10);
/// How long processes may take to die of SIGKILL before dbmutex gives up
/// waiting for them (and says so).
const KILL_GRACE: Duration = Duration::from_secs(2);

/// The running command: the leader of its own process group.
struct Tree {
    child: Child,
    pgid: libc::pid_t,
    /// dbmutex's controlling terminal, if any (see [`Terminal`]).
    terminal: Option<Terminal>,
    /// SIGCHLD, to see the command stop (Ctrl-Z, or SIGTTIN when it reads
    /// the terminal from the background), when there is a terminal.
    sigchld: Option<Signal>,
}

impl Tree {
    fn new(child: Child, terminal: Option<Terminal>, sigchld: Option<Signal>) -> Result<Tree, Failure> {
        let Some(pid) = child.id() else {
            return Err(Failure::new(exit::OS_ERROR, "the command vanished at its start"));
        };
        Ok(Tree {
            child,
            pgid: pid as libc::pid_t,
            terminal,
            sigchld,
        })
    }

    /// Waits for the command, forwarding signals to its group; stops the
    /// group if the lock is lost. Returns once no process of the group is
    /// left (or, after SIGKILL, none can run any more).
    async fn supervise(
        &mut self,
        guard: &LockGuard,
        signals: &mut Signals,
        kill_after: Duration,
        name: &str,
        say: Say,
    ) -> Result<Ended, Failure> {
        let mut lost = pin!(guard.lost());
        let status = loop {
            tokio::select! {
                status = self.child.wait() => break wait_result(status)?,
                sig = signals.recv() => tree::signal_group(self.pgid, sig),
                () = &mut lost => {
                    let over = guard.max_hold_exceeded() && guard.is_held();
                    if over {
                        say.error(format_args!(
                            "the command held lock {name} past --max-hold ({}); \
                             stopping the command's process group with SIGTERM",
                            secs(guard.held_for())
                        ));
                    } else {
                        say.error(format_args!(
                            "lock {name} was lost (its database connection is gone); \
                             stopping the command's process group with SIGTERM"
                        ));
                    }
                    self.stop(false, signals, kill_after, say).await?;
                    return Ok(if over { Ended::MaxHold } else { Ended::Lost });
                }
                sig = stopped(&mut self.sigchld, self.pgid) => self.on_stop(sig),
            }
        };
        // The command is done; what it left in its group must not outlive
        // the lock either.
        if tree::group_alive(self.pgid) {
            say.note(format_args!(
                "the command exited but left processes in its process group; \
                 stopping them with SIGTERM before releasing lock {name}"
            ));
            self.stop(true, signals, kill_after, say).await?;
        }
        Ok(Ended::Exited(child::exit_code(status)))
    }

    /// SIGTERM to the group, then SIGKILL after `kill_after` unless it is
    /// empty by then. `reaped`: the leader has been waited for already.
    async fn stop(
        &mut self,
        mut reaped: bool,
        signals: &mut Signals,
        kill_after: Duration,
        say: Say,
    ) -> Result<(), Failure> {
        tree::signal_group(self.pgid, libc::SIGTERM);
        let mut deadline = pin!(tokio::time::sleep(kill_after));
        loop {
            tokio::select! {
                status = self.child.wait(), if !reaped => {
                    wait_result(status)?;
                    reaped = true;
                    if !tree::group_alive(self.pgid) {
                        return Ok(());
                    }
                }
                sig = signals.recv() => tree::signal_group(self.pgid, sig),
                () = tokio::time::sleep(GROUP_POLL), if reaped => {
                    if !tree::group_alive(self.pgid) {
                        return Ok(());
                    }
                }
                () = &mut deadline => break,
            }
        }
        say.error(format_args!(
            "the command's process group did not stop within {} of SIGTERM; sending SIGKILL",
            secs(kill_after)
        ));
        tree::signal_group(self.pgid, libc::SIGKILL);
        if !reaped {
            wait_result(self.child.wait().await)?;
        }
        // SIGKILL acts when a process next leaves the kernel: give one stuck
        // in a system call (state D) a moment, so the lock outlives the group.
        let killed = Instant::now();
        while tree::group_alive(self.pgid) && killed.elapsed() < KILL_GRACE {
            tokio::time::sleep(GROUP_POLL).await;
        }
        if tree::group_alive(self.pgid) {
            say.error(format_args!(
                "processes of the command's group still exist {} after SIGKILL",
                secs(KILL_GRACE)
            ));
        }
        Ok(())
    }

    /// The command stopped with signal `sig`. Job control needs the shell to
    /// see it, and the shell watches dbmutex, not the command's group:
    ///
    /// - Ctrl-Z (SIGTSTP) or SIGSTOP, or a read from the terminal while the
    ///   job is in the background (SIGTTIN/SIGTTOU): dbmutex takes the
    ///   terminal back (if the group had it) and stops itself, so the shell
    ///   reports the job stopped. On `fg` (dbmutex continued in the
    ///   foreground) the group gets the terminal and SIGCONT; on `bg`, SIGCONT
    ///   only.
    /// - SIGTTIN/SIGTTOU while dbmutex is in the foreground (it was moved
    ///   there after the command started): the group gets the terminal and
    ///   continues.
    fn on_stop(&mut self, sig: i32) {
        let Some(t) = &self.terminal else { return };
        let tty_stop = sig == libc::SIGTTIN || sig == libc::SIGTTOU;
        if !(tty_stop && t.is_ours()) {
            if t.is_owned_by(self.pgid) {
                t.take_back();
            }
            // SAFETY: kill(2) to ourselves; the default action of SIGTSTP
            // (which dbmutex does not handle) stops it until SIGCONT.
            unsafe { libc::kill(libc::getpid(), libc::SIGTSTP) };
        }
        if t.is_ours() {
            t.give_to(self.pgid);
        }
        tree::signal_group(self.pgid, libc::SIGCONT);
    }
}

/// Completes when the command (our child) has stopped; never when `sigchld`
/// is `None`.
async fn stopped(sigchld: &mut Option<Signal>, pid: libc::pid_t) -> i32 {
    let Some(s) = sigchld else {
        return std::future::pending().await;
    };
    loop {
        // Check first: the stop may have come before this was first polled
        // (the listener recorded its SIGCHLD, but stay on the safe side).
        if let Some(sig) = tree::child_stopped(pid) {
            return sig;
        }
        s.recv().await;
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
    run: Option<Run>,
    name: &str,
    say: Say,
) -> Result<u8, Failure> {
    // A once-per-window run's end, recorded while the lock is still held
    // (a lost lock keeps the start only).
    let code = match &ended {
        Ok(Ended::Exited(code)) => Some(*code),
        Ok(Ended::MaxHold) => Some(exit::MAX_HOLD),
        _ => None,
    };
    if let (Some(run), Some(code)) = (&run, code) {
        once::finish(&guard, run, code, name, say).await;
    }
    let held_for = guard.held_for();
    let held_throughout = guard.is_held();
    let released = release(guard).await;
    let code = match ended? {
        Ended::Lost => return Ok(exit::LOCK_LOST),
        // Stopped with the lock still held: it is released like any other.
        Ended::MaxHold => return Ok(exit::MAX_HOLD),
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
