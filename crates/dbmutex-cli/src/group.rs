//! The command's process group: the guardian that stops the group if
//! dbmutex dies, signalling and watching the group, and the terminal while
//! the command runs. [`crate::tree`] supervises the command with these.
//!
//! # Why a process group, and a guardian
//!
//! The lock protects the command *and everything it starts*. The command is
//! therefore the leader of a process group of its own; every signal dbmutex
//! sends (forwarded signals, SIGTERM and SIGKILL when the lock is lost, the
//! clean-up of stragglers) goes to the whole group.
//!
//! dbmutex cannot catch its own SIGKILL, and when it dies the server frees
//! the lock at once. So before the command starts, dbmutex forks a
//! *guardian*: a tiny process in a session of its own (no terminal signals,
//! no job-control group shared with dbmutex) that holds the read end of a
//! pipe whose only writer is dbmutex. The command (between its clone and its
//! exec) writes its process id into that pipe, so the guardian knows the
//! group before anything in it runs. When dbmutex is done with the group it
//! writes one byte ("disarm") and the guardian exits. If dbmutex dies first,
//! the kernel closes its end of the pipe; the guardian reads end-of-file,
//! sends SIGTERM (and SIGCONT, for a stopped group) to the group, and SIGKILL
//! after `--kill-after` if anything in it is still alive.
//!
//! The guardian runs only async-signal-safe system calls after the fork (no
//! allocation, no locks): dbmutex may have other threads, whose locks a fork
//! copies in whatever state they are.
//!
//! # What escapes
//!
//! A process that leaves the group (calls `setsid` or `setpgid` itself, as
//! daemons do, or as `setsid(1)` and some shells' `set -m` do) is no longer
//! reached. Catching those needs a cgroup (e.g. `systemd-run --scope`, or a
//! service with `KillMode=control-group`). `PR_SET_CHILD_SUBREAPER` was
//! considered and not used: the guardian is not an ancestor of the command,
//! so it would adopt nothing; on dbmutex it would die with dbmutex (so it
//! gives nothing after a SIGKILL), and while dbmutex lives, adopting
//! orphans means reaping them with `waitpid(-1)`, which races the wait for
//! the command's own status.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// The guardian: a forked process that stops the command's group if
/// dbmutex dies. See the module docs.
pub struct Guardian {
    /// The write end of the pipe; dbmutex's death closes it.
    pipe: OwnedFd,
    pid: libc::pid_t,
}

impl Guardian {
    /// Forks the guardian. Call before spawning the command (`main` does it
    /// for `run` before anything else: see there), and pass
    /// [`Guardian::report_fd`] to [`crate::child::Program::spawn`].
    pub fn start(kill_after: Duration) -> io::Result<Guardian> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let (read_end, write_end) = (fds[0], fds[1]);
        let kill_after = libc::timespec {
            tv_sec: kill_after.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: kill_after.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the child runs only `guardian_main`, which makes nothing
        // but async-signal-safe system calls and never returns.
        match unsafe { libc::fork() } {
            -1 => {
                let e = io::Error::last_os_error();
                // SAFETY: both descriptors are ours and not used elsewhere.
                unsafe {
                    libc::close(read_end);
                    libc::close(write_end);
                }
                Err(e)
            }
            0 => unsafe { guardian_main(read_end, kill_after) },
            pid => {
                // SAFETY: the read end is ours; the guardian has its copy.
                unsafe { libc::close(read_end) };
                Ok(Guardian {
                    // SAFETY: write_end is an open descriptor nobody else owns.
                    pipe: unsafe { OwnedFd::from_raw_fd(write_end) },
                    pid,
                })
            }
        }
    }

    /// The descriptor the command writes its pid into before its exec.
    pub fn report_fd(&self) -> RawFd {
        self.pipe.as_raw_fd()
    }

    /// Tells the guardian that the group is gone (or was never started):
    /// it exits at once, touching nothing. Dropping a guardian without this
    /// arms it: once dbmutex exits, the guardian stops whatever is left of
    /// the group.
    ///
    /// Returns the exiting guardian, reaped when that is dropped: `run`
    /// keeps it over the unlock's round trip, while which the guardian
    /// exits, instead of waiting for that exit before sending the unlock.
    pub fn disarm(self) -> Exiting {
        let Guardian { pipe, pid } = self;
        let byte = [b'x'];
        // SAFETY: writes one byte from our buffer to our descriptor.
        unsafe { libc::write(pipe.as_raw_fd(), byte.as_ptr().cast(), 1) };
        // Closed now: the byte comes first, and a guardian still waiting for
        // the pid (the command failed before writing it) sees end-of-file
        // at once instead of waiting for the rest of a pid.
        drop(pipe);
        Exiting { pid }
    }

    /// Ends a guardian whose command was never spawned (the lock was not
    /// taken, or a once-per run was not due): its pipe closes before any
    /// pid came through, so it exits touching nothing; then it is reaped.
    pub fn dismiss(self) {
        let Guardian { pipe, pid } = self;
        drop(pipe);
        reap(pid);
    }
}

/// A guardian told to exit ([`Guardian::disarm`]), reaped when dropped.
#[must_use = "dropping it reaps the guardian at once"]
pub struct Exiting {
    pid: libc::pid_t,
}

impl Drop for Exiting {
    fn drop(&mut self) {
        reap(self.pid);
    }
}

/// Reaps the guardian `pid`, which is exiting.
fn reap(pid: libc::pid_t) {
    // The guardian exits as soon as it reads the byte or end-of-file;
    // reap it, but never wait on a guardian someone has stopped.
    // It takes a fraction of a millisecond. A pidfd wakes us the moment it
    // exits (Linux 5.3 and later); else, or if a signal cut that wait short,
    // poll from 50 µs up, not in steps that would add milliseconds to every
    // `dbmutex run`.
    let deadline = Instant::now() + Duration::from_secs(1);
    #[cfg(target_os = "linux")]
    wait_for_exit(pid, 1_000);
    let mut pause = Duration::from_micros(50);
    loop {
        // SAFETY: waitpid on our own child, with a null status pointer.
        let r = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        if r != 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

/// Waits at most `ms` milliseconds for child `pid` to exit, through a
/// pidfd (readable once the process has exited); returns at once where
/// there is none.
#[cfg(target_os = "linux")]
fn wait_for_exit(pid: libc::pid_t, ms: libc::c_int) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // (or -1), which we close below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
    if fd < 0 {
        return;
    }
    let mut ready = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polls one pollfd we own; then closes the descriptor we opened.
    unsafe {
        libc::poll(&mut ready, 1, ms);
        libc::close(fd);
    }
}

/// The guardian's whole life. Only async-signal-safe calls from here on.
unsafe fn guardian_main(pipe: RawFd, kill_after: libc::timespec) -> ! {
    // Out of dbmutex's session and process group: no terminal signals, and
    // a `kill -9 -PGID` of dbmutex's job does not reach us.
    libc::setsid();
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        libc::signal(sig, libc::SIG_IGN);
    }
    let mut none = std::mem::zeroed::<libc::sigset_t>();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    // Keep nothing of dbmutex's open: a copy of its database socket would
    // keep the server from seeing dbmutex die (and freeing the lock), and a
    // copy of its stdout would keep a reader from seeing end-of-file.
    close_all_but(pipe);
    libc::chdir(c"/".as_ptr());

    let mut pgid_bytes = [0u8; 4];
    if !read_exact(pipe, &mut pgid_bytes) {
        libc::_exit(0); // dbmutex ended before the command started
    }
    let pgid = libc::pid_t::from_ne_bytes(pgid_bytes);
    let mut byte = [0u8; 1];
    loop {
        let n = libc::read(pipe, byte.as_mut_ptr().cast(), 1);
        if n == 1 {
            libc::_exit(0); // disarmed: dbmutex saw the group end
        }
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        break; // end-of-file: dbmutex died
    }
    if pgid <= 1 {
        libc::_exit(0);
    }
    libc::kill(-pgid, libc::SIGTERM);
    libc::kill(-pgid, libc::SIGCONT);
    let deadline = add(now(), kill_after);
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    loop {
        if !group_alive(pgid) {
            libc::_exit(0);
        }
        if !before(now(), deadline) {
            libc::kill(-pgid, libc::SIGKILL);
            libc::_exit(0);
        }
        libc::nanosleep(&tick, std::ptr::null_mut());
    }
}

/// Closes every descriptor except `keep` (async-signal-safe).
unsafe fn close_all_but(keep: RawFd) {
    let keep = keep as libc::c_uint;
    let ok_low = keep == 0 || libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32) == 0;
    let ok_high = libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32) == 0;
    if ok_low && ok_high {
        return;
    }
    // Kernels before 5.9: one by one, up to the descriptor limit.
    let mut lim = std::mem::zeroed::<libc::rlimit>();
    let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
        lim.rlim_cur.min(1 << 20) as libc::c_int
    } else {
        65_536
    };
    for fd in 0..max {
        if fd != keep as libc::c_int {
            libc::close(fd);
        }
    }
}

unsafe fn read_exact(fd: RawFd, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        let n = libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got);
        if n > 0 {
            got += n as usize;
        } else if n < 0 && errno() == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

fn errno() -> libc::c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn now() -> libc::timespec {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t
}

fn add(a: libc::timespec, b: libc::timespec) -> libc::timespec {
    let mut nsec = a.tv_nsec + b.tv_nsec;
    let mut sec = a.tv_sec.saturating_add(b.tv_sec);
    if nsec >= 1_000_000_000 {
        nsec -= 1_000_000_000;
        sec = sec.saturating_add(1);
    }
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

fn before(a: libc::timespec, b: libc::timespec) -> bool {
    (a.tv_sec, a.tv_nsec) < (b.tv_sec, b.tv_nsec)
}

/// Whether any process of group `pgid` is left that can still run: zombies
/// (dead, waiting for a parent that may never reap them, as a container's
/// init may not) do not count; a live one we may not signal (e.g. a setuid
/// program) does.
///
/// Async-signal-safe (the guardian calls it): raw system calls and buffers
/// on the stack only.
pub fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks.
    if unsafe { libc::kill(-pgid, 0) } != 0 && errno() != libc::EPERM {
        return false; // no process at all, not even a zombie
    }
    // Something is there: find out whether it is more than zombies.
    // SAFETY: only raw system calls on descriptors this function owns and
    // buffers on its stack.
    unsafe { live_member_in_proc(pgid).unwrap_or(true) }
}

/// Scans /proc for a process of group `pgid` that is not a zombie. `None`
/// when /proc cannot be read.
unsafe fn live_member_in_proc(pgid: libc::pid_t) -> Option<bool> {
    let dir = libc::open(
        c"/proc".as_ptr(),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if dir < 0 {
        return None;
    }
    let mut buf = [0u8; 4096];
    let mut found = false;
    let mut ok = true;
    'scan: loop {
        let n = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
        if n < 0 {
            ok = false;
            break;
        }
        if n == 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let name = &buf[off + 19..off + reclen];
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            let name = &name[..len];
            if !name.is_empty()
                && name.iter().all(u8::is_ascii_digit)
                && member_state(name, pgid) == Some(true)
            {
                found = true;
                break 'scan;
            }
            off += reclen;
        }
    }
    libc::close(dir);
    ok.then_some(found)
}

/// For `/proc/<pid>/stat`: `Some(true)` when the process is in group `pgid`
/// and not a zombie, `Some(false)` when it is not (or is gone), `None` when
/// unreadable.
unsafe fn member_state(pid: &[u8], pgid: libc::pid_t) -> Option<bool> {
    let mut path = [0u8; 32];
    let prefix = b"/proc/";
    let suffix = b"/stat\0";
    if prefix.len() + pid.len() + suffix.len() > path.len() {
        return Some(false);
    }
    path[..prefix.len()].copy_from_slice(prefix);
    path[prefix.len()..prefix.len() + pid.len()].copy_from_slice(pid);
    path[prefix.len() + pid.len()..prefix.len() + pid.len() + suffix.len()].copy_from_slice(suffix);
    let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Some(false); // exited meanwhile
    }
    let mut stat = [0u8; 1024];
    let n = libc::read(fd, stat.as_mut_ptr().cast(), stat.len());
    libc::close(fd);
    if n <= 0 {
        return Some(false);
    }
    let stat = &stat[..n as usize];
    // "pid (comm) S ppid pgrp ...": comm may hold anything, so parse after
    // the last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let mut fields = stat[close + 1..].split(|&b| b == b' ').filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    let _ppid = fields.next()?;
    let pgrp = parse_int(fields.next()?)?;
    Some(pgrp == pgid as i64 && state != b'Z' && state != b'X')
}

fn parse_int(digits: &[u8]) -> Option<i64> {
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(v)
}

/// Sends `sig` to group `pgid`; SIGCONT too for SIGTERM, so a stopped group
/// acts on it (as timeout(1) does).
pub fn signal_group(pgid: libc::pid_t, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions. The group is
    // pinned while any of its members lives (a pid is not reused while it
    // names a process group); dbmutex only signals it before the leader is
    // reaped or after checking that members remain.
    unsafe {
        libc::kill(-pgid, sig);
        if sig == libc::SIGTERM {
            libc::kill(-pgid, libc::SIGCONT);
        }
    }
}

/// dbmutex's controlling terminal. When dbmutex is in its foreground
/// process group, the command's group gets the terminal while it runs, so it
/// can read from it (a background group would be stopped by SIGTTIN) and
/// gets Ctrl-C, Ctrl-\\ and Ctrl-Z from it directly.
pub struct Terminal {
    fd: OwnedFd,
}

impl Terminal {
    /// `Some` when dbmutex has a controlling terminal.
    pub fn controlling() -> Option<Terminal> {
        // SAFETY: open(2) of a constant path; the result is checked.
        let fd = unsafe {
            libc::open(
                c"/dev/tty".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a descriptor we just opened and own.
        Some(Terminal {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Whether group `pgid` is the terminal's foreground group.
    pub fn is_owned_by(&self, pgid: libc::pid_t) -> bool {
        // SAFETY: a plain query of terminal state.
        unsafe { libc::tcgetpgrp(self.fd.as_raw_fd()) == pgid }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Gives the terminal back to dbmutex's own process group.
    pub fn take_back(&self) {
        // SAFETY: getpgrp has no preconditions.
        give_terminal(self.fd.as_raw_fd(), unsafe { libc::getpgrp() });
    }

    /// Whether dbmutex's own group is the terminal's foreground group.
    pub fn is_ours(&self) -> bool {
        // SAFETY: getpgrp has no preconditions.
        self.is_owned_by(unsafe { libc::getpgrp() })
    }

    /// Gives the terminal to group `pgid`.
    pub fn give_to(&self, pgid: libc::pid_t) {
        give_terminal(self.fd.as_raw_fd(), pgid);
    }
}

/// `tcsetpgrp` from a process that may be in a background group: SIGTTOU
/// blocked meanwhile, or the kernel would stop us. Async-signal-safe (the
/// command calls it between its clone and its exec).
pub fn give_terminal(fd: RawFd, pgid: libc::pid_t) {
    // SAFETY: sigset operations on local values; tcsetpgrp on a descriptor
    // the caller keeps open.
    unsafe {
        let mut ttou = std::mem::zeroed::<libc::sigset_t>();
        let mut old = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut ttou);
        libc::sigaddset(&mut ttou, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &ttou, &mut old);
        libc::tcsetpgrp(fd, pgid);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// The signal that stopped our child `pid`, if it has stopped (and that
/// was not reported yet). Does not reap: only stop reports are asked for.
pub fn child_stopped(pid: libc::pid_t) -> Option<i32> {
    // SAFETY: waitid writes into our siginfo; WNOHANG never blocks, and
    // without WEXITED it never consumes an exit status.
    unsafe {
        let mut info = std::mem::zeroed::<libc::siginfo_t>();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WSTOPPED | libc::WNOHANG,
        );
        (r == 0 && info.si_pid() == pid && info.si_code == libc::CLD_STOPPED).then(|| info.si_status())
    }
}
