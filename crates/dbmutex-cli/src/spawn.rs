//! Starting the command without copying dbmutex: `clone(CLONE_VM |
//! CLONE_VFORK)`, as `posix_spawn` does, with the steps `posix_spawn`
//! cannot take (the guardian's pid report, the parent-death signal) run in
//! the child before its exec.
//!
//! Why not `fork` (what `std::process::Command` does once it has a
//! `pre_exec` step): a fork copies dbmutex's page tables, the child then
//! faults in every page it writes before its exec, the exec tears that
//! copy down, and dbmutex itself faults on its next write to every page the
//! fork marked copy-on-write. On `dbmutex run`'s path to the command that
//! was the largest cost on the client besides its own start (`perf trace`:
//! 0.26 ms in `clone` and 0.37 ms more until the exec; with a shared
//! address space the child runs at once and the exec has nothing to tear
//! down).
//!
//! # What the child may do
//!
//! The child shares dbmutex's memory (its own stack aside) until its exec,
//! and dbmutex's thread waits meanwhile (`CLONE_VFORK`): it runs only
//! raw system calls and `execvpe`, reads only what the parent prepared
//! before the clone, and writes only its error slot. Every signal is
//! blocked across the clone; the child puts every caught signal back to
//! its default before it unblocks them, so no handler of dbmutex's ever
//! runs in it (`posix_spawn` does the same).
//!
//! glibc 2.25 or later: older `clone` wrappers wrote a cached pid/tid into
//! the thread they were called from when given `CLONE_VM` alone (the
//! child shares that thread's TLS), and older `execvpe` could allocate.
//! A build links against glibc 2.34's symbols anyway.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

/// The child's stack, beyond what a script's fallback argv takes: `execvpe`
/// builds the paths it tries there, and for a script without `#!` an argv
/// of `/bin/sh` and the arguments (one pointer each, added to this).
const STACK_SIZE: usize = 256 * 1024;

/// The child's stack: mapped for the child alone, with a page below it
/// that faults, so an overflow kills the child instead of writing over
/// dbmutex's memory (which the child shares).
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new(size: usize) -> io::Result<Stack> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = size.div_ceil(page) * page + page;
        // SAFETY: a fresh private anonymous mapping, unmapped in Drop; its
        // lowest page is then made inaccessible (the guard).
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stack = Stack { base, len };
            if libc::mprotect(base, page, libc::PROT_NONE) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// The highest 16-byte aligned address of the stack (it grows down).
    fn top(&self) -> *mut libc::c_void {
        ((self.base as usize + self.len) & !15) as *mut libc::c_void
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping `new` made, which nothing uses any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// How often a child is polled for its exit where there is no pidfd
/// (Linux before 5.3).
const POLL_WITHOUT_PIDFD: Duration = Duration::from_millis(2);

/// What to start, prepared before the clone (the child may not allocate).
pub struct Spawn {
    /// The file `argv[0]` names, found in `$PATH` before: exec'd first
    /// (`None`: `argv[0]` is searched there).
    found: Option<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    /// The guardian's pipe: the child writes its pid there.
    pub report_fd: RawFd,
    /// The terminal to give the child's group, if dbmutex had it.
    pub terminal: Option<RawFd>,
}

impl Spawn {
    /// `program` with `args`, in dbmutex's environment changed by `env`
    /// (a `None` value removes the variable). `found`: the file `program`
    /// names, already looked up in `$PATH` (the child then makes no failed
    /// exec per directory before it, while dbmutex waits for it); `program`
    /// stays the command's `argv[0]`. `None` when a string holds a NUL
    /// byte, which no exec could pass.
    pub fn new(
        program: &OsStr,
        found: Option<&Path>,
        args: &[&OsStr],
        env: &[(&str, Option<String>)],
        report_fd: RawFd,
        terminal: Option<RawFd>,
    ) -> Option<Spawn> {
        let c = |s: &OsStr| CString::new(s.as_bytes()).ok();
        let found = match found {
            Some(path) => Some(c(path.as_os_str())?),
            None => None,
        };
        let mut argv = vec![c(program)?];
        for a in args {
            argv.push(c(a)?);
        }
        let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| !env.iter().any(|(name, _)| k.as_bytes() == name.as_bytes()))
            .collect();
        for (k, v) in env {
            if let Some(v) = v {
                vars.push((k.into(), v.into()));
            }
        }
        let mut envp = Vec::with_capacity(vars.len());
        for (k, v) in vars {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(CString::new(kv).ok()?);
        }
        Some(Spawn {
            found,
            argv,
            env: envp,
            report_fd,
            terminal,
        })
    }

    /// Starts the program (the file found in `$PATH`, else searched there as
    /// `execvp` does) as the
    /// leader of a process group of its own; see [`crate::child::Program::spawn`].
    /// Returns once the child has exec'd, or with the error that kept it
    /// from it.
    ///
    /// Must be called on the thread that lives as long as dbmutex: the
    /// parent-death signal fires when the thread that started the child
    /// exits.
    pub fn start(&self) -> io::Result<Child> {
        let (argv, envp) = (null_terminated(&self.argv), null_terminated(&self.env));
        let stack = Stack::new(STACK_SIZE + (self.argv.len() + 2) * std::mem::size_of::<*const u8>())?;
        let args = ChildArgs {
            found: self.found.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            report_fd: self.report_fd,
            terminal: self.terminal.unwrap_or(-1),
            // SAFETY: getpid has no preconditions.
            parent: unsafe { libc::getpid() },
            error: AtomicI32::new(0),
        };
        // SAFETY: all signals are blocked across the clone (and restored
        // after it) so that none is handled on the child's side before it
        // resets the handlers. The child runs `child_main` on its own stack
        // with `args`, both of which outlive it: CLONE_VFORK suspends this
        // thread until the child has exec'd or exited, and `stack`, `args`,
        // `argv` and `envp` live until after that.
        let pid = unsafe {
            let mut all = std::mem::zeroed::<libc::sigset_t>();
            let mut old = std::mem::zeroed::<libc::sigset_t>();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = libc::clone(
                child_main,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::addr_of!(args) as *mut libc::c_void,
            );
            let e = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            if pid < 0 {
                return Err(e);
            }
            pid
        };
        drop(stack);
        let failed = args.error.load(Ordering::Acquire);
        if failed != 0 {
            // The child exited without its exec: reap it.
            // SAFETY: waitpid on our own child, with a null status pointer.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            return Err(io::Error::from_raw_os_error(failed));
        }
        Ok(Child::new(pid))
    }
}

/// The pointers of `strings` and a null after them, as exec takes them.
fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// What the child reads, prepared by the parent.
struct ChildArgs {
    /// The file found in `$PATH` (a path), or null: search for `argv[0]`.
    found: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    report_fd: RawFd,
    /// -1 for none.
    terminal: RawFd,
    parent: libc::pid_t,
    /// The errno that kept the child from its exec (0: it exec'd).
    error: AtomicI32,
}

/// The child, from the clone to its exec. Only raw system calls (and
/// `execvpe`, which `posix_spawnp` itself calls in this position).
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive until we exec or
    // exit (the parent is suspended until then).
    let args = unsafe { &*(arg as *const ChildArgs) };
    let fail = |e: libc::c_int| -> ! {
        args.error
            .store(if e == 0 { libc::EIO } else { e }, Ordering::Release);
        // SAFETY: ends this child only (it is a process of its own).
        unsafe { libc::_exit(127) }
    };
    let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    // SAFETY: async-signal-safe system calls on values of our own.
    unsafe {
        // No handler of dbmutex's may run here: every caught signal back to
        // its default (SIGPIPE too, which the Rust runtime ignores), before
        // the signals are unblocked.
        for sig in 1..=libc::SIGRTMAX() {
            let mut old = std::mem::zeroed::<libc::sigaction>();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            {
                let mut dfl = std::mem::zeroed::<libc::sigaction>();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        let mut none = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // The leader of a group of its own; the guardian learns which
        // before anything in it runs.
        if libc::setpgid(0, 0) != 0 {
            fail(errno());
        }
        let me = libc::getpid().to_ne_bytes();
        if libc::write(args.report_fd, me.as_ptr().cast(), me.len()) != me.len() as isize {
            fail(errno());
        }
        if args.terminal >= 0 {
            crate::group::give_terminal(args.terminal, libc::getpid());
        }
        // SIGTERM if dbmutex dies; and give up if it died already.
        #[cfg(target_os = "linux")]
        {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                fail(errno());
            }
            if libc::getppid() != args.parent {
                fail(libc::ESRCH);
            }
        }
        // The file found before the wait for the lock; if it cannot be run
        // by now for a reason execvp's search goes past (gone, made
        // unexecutable), `$PATH` is searched again, as without it (that
        // search meets the file again and reports EACCES as execvp does).
        if !args.found.is_null() {
            libc::execvpe(args.found, args.argv, args.envp);
            let e = errno();
            if !matches!(
                e,
                libc::ENOENT | libc::EACCES | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT
            ) {
                fail(e);
            }
        }
        libc::execvpe(*args.argv, args.argv, args.envp);
        fail(errno())
    }
}

/// The started command: waited for through a pidfd (polled where there is
/// none).
pub struct Child {
    pid: libc::pid_t,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Child {
    /// Never fails: the command runs by now, so it must be waited for
    /// (and its lock held) whatever happens here; without a pidfd (Linux
    /// before 5.3) or its registration (epoll out of memory or watches),
    /// the exit is polled.
    fn new(pid: libc::pid_t) -> Child {
        // SAFETY: pidfd_open takes a pid and flags (0: PIDFD_NONBLOCK
        // needs Linux 5.10, and epoll does not) and returns a new
        // descriptor (or -1), which the OwnedFd then owns.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
        let pidfd = (fd >= 0).then(|| {
            // SAFETY: fd is a descriptor we just opened.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // `with_interest` over tokio 1.54's `register`: the same, in
            // every tokio this crate accepts. The OwnedFd keeps the
            // descriptor open as long as the AsyncFd.
            #[allow(deprecated)]
            AsyncFd::with_interest(fd, tokio::io::Interest::READABLE).ok()
        });
        Child {
            pid,
            pidfd: pidfd.flatten(),
            status: None,
        }
    }

    pub fn id(&self) -> libc::pid_t {
        self.pid
    }

    /// Waits for the child to exit and reaps it (at once if it has already
    /// been).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the status is taken only when the child is reaped, and
    /// kept for the next call.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(s);
            }
            match &self.pidfd {
                Some(fd) => fd.readable().await?.clear_ready(),
                None => tokio::time::sleep(POLL_WITHOUT_PIDFD).await,
            }
        }
    }

    /// The status, if the child has exited (reaping it).
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child, into our status variable.
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        match r {
            0 => Ok(None),
            r if r == self.pid => {
                let s = ExitStatus::from_raw(status);
                self.status = Some(s);
                Ok(Some(s))
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }
}
