//! The running command and everything it starts: started as the leader of
//! a process group of its own with a guardian watching (see
//! [`crate::group`]), supervised until no process of the group is left
//! (signals forwarded, the group stopped when the lock is lost or held past
//! `--max-hold`, job control on a terminal).

use std::pin::pin;
use std::time::{Duration, Instant};

use dbmutex::LockGuard;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::child::{self, Program};
use crate::exit::{self, Failure};
use crate::group::{self, Exiting, Guardian, Terminal};
use crate::say::{secs, Say};
use crate::signals::Signals;
use crate::spawn::Child;

/// How often dbmutex checks whether the command's group is empty while it
/// stops it.
const GROUP_POLL: Duration = Duration::from_millis(10);
/// How long processes may take to die of SIGKILL before dbmutex gives up
/// waiting for them (and says so).
const KILL_GRACE: Duration = Duration::from_secs(2);

/// How the command's run ended.
pub enum Ended {
    /// It exited (or died of a signal) with this status for us.
    Exited(u8),
    /// The lock was lost; the command was stopped.
    Lost,
    /// The command held the lock past --max-hold; it was stopped.
    MaxHold,
}

/// The running command: the leader of its own process group.
pub struct Tree {
    child: Child,
    pgid: libc::pid_t,
    /// Stops the group should dbmutex die before [`Tree::end`].
    guardian: Guardian,
    /// dbmutex's controlling terminal, if any (see [`Terminal`]).
    terminal: Option<Terminal>,
    /// SIGCHLD, to see the command stop (Ctrl-Z, or SIGTTIN when it reads
    /// the terminal from the background), when there is a terminal.
    sigchld: Option<Signal>,
    /// Time between SIGTERM and SIGKILL when the group is stopped.
    kill_after: Duration,
    /// The lock's name, for messages.
    name: String,
    say: Say,
}

impl Tree {
    /// Starts `program` with `env` (see [`Program::spawn`]) in a group of
    /// its own, `guardian` (forked with `kill_after`, see
    /// [`Guardian::start`]) armed before it exists. `name` and `say` are
    /// for the messages about the group.
    pub fn start(
        program: &Program,
        env: &[(&str, Option<String>)],
        guardian: std::io::Result<Guardian>,
        kill_after: Duration,
        name: &str,
        say: Say,
    ) -> Result<Tree, Failure> {
        // With a terminal, dbmutex watches the command for stops (job
        // control). Listen before the command exists: a SIGCHLD from a stop
        // that comes before the listener would be missed, and the job
        // would hang.
        let terminal = Terminal::controlling();
        // The guardian first: from the moment the command exists, dbmutex's
        // death (even by SIGKILL) stops its whole process group.
        let guardian = guardian.map_err(|e| {
            Failure::new(
                exit::OS_ERROR,
                format!("cannot start the process that watches over the command: {e}"),
            )
        })?;
        let sigchld = match &terminal {
            Some(_) => match signal(SignalKind::child()) {
                Ok(s) => Some(s),
                Err(e) => {
                    guardian.dismiss();
                    return Err(Failure::new(
                        exit::OS_ERROR,
                        format!("cannot handle signals: {e}"),
                    ));
                }
            },
            None => None,
        };
        // The group gets the terminal only if dbmutex has it (foreground job).
        let give = terminal.as_ref().filter(|t| t.is_ours()).map(Terminal::raw_fd);
        let child = match program.spawn(guardian.report_fd(), give, env) {
            Ok(c) => c,
            Err(f) => {
                drop(guardian.disarm());
                return Err(f);
            }
        };
        Ok(Tree {
            pgid: child.id(),
            child,
            guardian,
            terminal,
            sigchld,
            kill_after,
            name: name.to_owned(),
            say,
        })
    }

    /// Supervises the command to its end (see [`Tree::supervise`]), then
    /// takes the terminal back; the guardian is disarmed once the group is
    /// gone, and returned to be reaped later (see [`Guardian::disarm`]).
    /// On an error it is dropped armed: its pipe closes as at dbmutex's
    /// death, and it stops the group.
    pub async fn run(
        mut self,
        guard: &LockGuard,
        signals: &mut Signals,
    ) -> Result<(Ended, Exiting), Failure> {
        let ended = self.supervise(guard, signals).await;
        if let Some(t) = &self.terminal {
            if t.is_owned_by(self.pgid) {
                t.take_back();
            }
        }
        let ended = ended?;
        Ok((ended, self.guardian.disarm()))
    }

    /// Waits for the command, forwarding signals to its group; stops the
    /// group if the lock is lost. Returns once no process of the group is
    /// left (or, after SIGKILL, none can run any more).
    async fn supervise(&mut self, guard: &LockGuard, signals: &mut Signals) -> Result<Ended, Failure> {
        let (name, say) = (self.name.clone(), self.say);
        let mut lost = pin!(guard.lost());
        let status = loop {
            tokio::select! {
                status = self.child.wait() => break wait_result(status)?,
                sig = signals.recv() => group::signal_group(self.pgid, sig),
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
                    self.stop(false, signals).await?;
                    return Ok(if over { Ended::MaxHold } else { Ended::Lost });
                }
                sig = stopped(&mut self.sigchld, self.pgid) => self.on_stop(sig),
            }
        };
        // The command is done; what it left in its group must not outlive
        // the lock either.
        if group::group_alive(self.pgid) {
            say.note(format_args!(
                "the command exited but left processes in its process group; \
                 stopping them with SIGTERM before releasing lock {name}"
            ));
            self.stop(true, signals).await?;
        }
        Ok(Ended::Exited(child::exit_code(status)))
    }

    /// SIGTERM to the group, then SIGKILL after `kill_after` unless it is
    /// empty by then. `reaped`: the leader has been waited for already.
    async fn stop(&mut self, mut reaped: bool, signals: &mut Signals) -> Result<(), Failure> {
        let (kill_after, say) = (self.kill_after, self.say);
        group::signal_group(self.pgid, libc::SIGTERM);
        let mut deadline = pin!(tokio::time::sleep(kill_after));
        loop {
            tokio::select! {
                status = self.child.wait(), if !reaped => {
                    wait_result(status)?;
                    reaped = true;
                    if !group::group_alive(self.pgid) {
                        return Ok(());
                    }
                }
                sig = signals.recv() => group::signal_group(self.pgid, sig),
                () = tokio::time::sleep(GROUP_POLL), if reaped => {
                    if !group::group_alive(self.pgid) {
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
        group::signal_group(self.pgid, libc::SIGKILL);
        if !reaped {
            wait_result(self.child.wait().await)?;
        }
        // SIGKILL acts when a process next leaves the kernel: give one stuck
        // in a system call (state D) a moment, so the lock outlives the group.
        let killed = Instant::now();
        while group::group_alive(self.pgid) && killed.elapsed() < KILL_GRACE {
            tokio::time::sleep(GROUP_POLL).await;
        }
        if group::group_alive(self.pgid) {
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
        group::signal_group(self.pgid, libc::SIGCONT);
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
        if let Some(sig) = group::child_stopped(pid) {
            return sig;
        }
        s.recv().await;
    }
}

fn wait_result(r: std::io::Result<std::process::ExitStatus>) -> Result<std::process::ExitStatus, Failure> {
    r.map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot wait for the command: {e}")))
}
