//! The command dbmutex runs: starting it, signalling it, reading its status.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use crate::exit::{self, Failure};
use crate::spawn::{Child, Spawn};

/// What to run: an argv, or a shell command line.
pub enum Program {
    /// `found`: where [`Program::check`] found `argv[0]` (the spawn execs
    /// that file, and does not search `$PATH` again).
    Argv {
        argv: Vec<OsString>,
        found: Option<PathBuf>,
    },
    Shell(OsString),
}

impl Program {
    /// The program's name, for messages.
    pub fn display(&self) -> String {
        match self {
            Program::Argv { argv, .. } => argv[0].to_string_lossy().into_owned(),
            Program::Shell(_) => shell().to_string_lossy().into_owned(),
        }
    }

    /// Fails as [`Program::spawn`] would (127 not found, 126 not
    /// executable) for an argv whose program is missing or not executable,
    /// searched in `$PATH` (else `/bin:/usr/bin`, execvp's default) as
    /// execvp would; the file found is the one the spawn runs. A shell
    /// command line always passes: its shell reports.
    pub fn check(&mut self) -> Result<(), Failure> {
        let Program::Argv { argv, found: out } = self else {
            return Ok(());
        };
        let prog = Path::new(&argv[0]);
        let candidates: Vec<PathBuf> = if prog.as_os_str().as_bytes().contains(&b'/') {
            vec![prog.to_owned()]
        } else {
            let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
            // An empty entry is the current directory, for execvp too; as
            // `./name`, so that the spawn execs it without a search.
            std::env::split_paths(&path)
                .map(|dir| match dir.as_os_str().is_empty() {
                    true => Path::new(".").join(prog),
                    false => dir.join(prog),
                })
                .collect()
        };
        let mut found = false;
        for c in candidates {
            if c.is_file() {
                found = true;
                if executable(&c) {
                    *out = Some(c);
                    return Ok(());
                }
            }
        }
        let (code, why) = if found {
            (
                exit::CANNOT_EXECUTE,
                io::Error::from(io::ErrorKind::PermissionDenied),
            )
        } else {
            (exit::NOT_FOUND, io::Error::from(io::ErrorKind::NotFound))
        };
        Err(Failure::new(
            code,
            format!("cannot run {}: {why}", self.display()),
        ))
    }

    /// Starts the program with our stdin, stdout and stderr, as the leader
    /// of a process group of its own (see [`crate::group`]), without a copy
    /// of dbmutex's memory (see [`crate::spawn`]). Before its exec the child
    /// writes its pid to `report_fd` (the guardian's pipe), takes
    /// `terminal` (when dbmutex had it) and asks for SIGTERM if dbmutex
    /// dies.
    ///
    /// Must be called on the thread that lives as long as dbmutex (the
    /// runtime is current-thread): the parent-death signal fires when the
    /// *thread* that started the child exits.
    ///
    /// `env` is set in the program's environment (`DBMUTEX_*`); a `None`
    /// value is removed from it.
    ///
    /// Fails with 127 when the program is not found and 126 when it cannot
    /// be executed, as env(1) and shells do.
    pub fn spawn(
        &self,
        report_fd: RawFd,
        terminal: Option<RawFd>,
        env: &[(&str, Option<String>)],
    ) -> Result<Child, Failure> {
        let shell_line;
        let (file, args, found): (&OsStr, Vec<&OsStr>, _) = match self {
            Program::Argv { argv, found } => (
                &argv[0],
                argv[1..].iter().map(OsString::as_os_str).collect(),
                found.as_deref(),
            ),
            Program::Shell(line) => {
                shell_line = shell();
                (&shell_line, vec![OsStr::new("-c"), line.as_os_str()], None)
            }
        };
        let cannot = |e: io::Error| {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            Failure::new(code, format!("cannot run {}: {e}", self.display()))
        };
        let spawn = Spawn::new(file, found, &args, env, report_fd, terminal).ok_or_else(|| {
            cannot(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            ))
        })?;
        spawn.start().map_err(cannot)
    }
}

/// `$SHELL`, else `/bin/sh`, as flock(1) runs `-c`.
fn shell() -> OsString {
    std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".into())
}

/// Whether this process may execute `path` (access(2), as exec checks).
fn executable(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads a NUL-terminated path, which `c` is.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
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
        libc::SIGQUIT => "SIGQUIT".into(),
        _ => format!("signal {sig}"),
    }
}
