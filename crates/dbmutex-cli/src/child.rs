//! The command dbmutex runs: starting it, signalling it, reading its status.

use std::ffi::OsString;
use std::io;
use std::process::ExitStatus;

use tokio::process::{Child, Command};

use crate::exit::{self, Failure};

/// What to run: an argv, or a shell command line.
pub enum Program {
    Argv(Vec<OsString>),
    Shell(OsString),
}

impl Program {
    fn command(&self) -> Command {
        match self {
            Program::Argv(argv) => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
            Program::Shell(line) => {
                let mut c = Command::new(shell());
                c.arg("-c").arg(line);
                c
            }
        }
    }

    /// The program's name, for messages.
    pub fn display(&self) -> String {
        match self {
            Program::Argv(argv) => argv[0].to_string_lossy().into_owned(),
            Program::Shell(_) => shell().to_string_lossy().into_owned(),
        }
    }

    /// Starts the program with our stdin, stdout and stderr. On Linux it gets
    /// SIGTERM if dbmutex dies, so it never runs on without the lock.
    ///
    /// Must be called on the thread that lives as long as dbmutex (the
    /// runtime is current-thread): the parent-death signal fires when the
    /// *thread* that forked exits.
    ///
    /// Fails with 127 when the program is not found and 126 when it cannot
    /// be executed, as env(1) and shells do.
    pub fn spawn(&self) -> Result<Child, Failure> {
        let mut cmd = self.command();
        die_with_parent(&mut cmd);
        cmd.spawn().map_err(|e| {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            Failure::new(code, format!("cannot run {}: {e}", self.display()))
        })
    }
}

/// `$SHELL`, else `/bin/sh`, as flock(1) runs `-c`.
fn shell() -> OsString {
    std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".into())
}

/// Asks the kernel to send the child SIGTERM when dbmutex dies (Linux), and
/// makes the child give up before exec if dbmutex already died after the fork.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: prctl and getppid are, and the
    // error is built from a raw errno without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Dead before the prctl took effect: we have been reparented.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

/// Sends `sig` to the child, unless it has been reaped already.
pub fn signal(child: &Child, sig: i32) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) has no memory-safety preconditions. The pid is our
        // unreaped child's (`id()` is `None` once waited for), so it cannot
        // have been recycled for another process.
        unsafe {
            libc::kill(pid as libc::pid_t, sig);
        }
    }
}

/// Our exit status for the child's: its exit code, or 128+N for signal N.
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status.code() {
        Some(code) => code as u8,
        // wait(2) reports an exit code or a fatal signal, nothing else.
        None => status.signal().map_or(u8::MAX, exit::for_signal),
    }
}

/// The conventional name of a signal, for messages.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGKILL => "SIGKILL".into(),
        _ => format!("signal {sig}"),
    }
}
