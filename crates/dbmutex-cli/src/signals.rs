//! The signals dbmutex catches: SIGINT, SIGTERM and SIGHUP.
//!
//! While waiting for the lock they end the wait; while the command runs they
//! are forwarded to it (except a Ctrl-C, which the terminal sends to the
//! command itself). Catching them also keeps them from killing dbmutex
//! before it has released the lock and reported the command's status.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::exit::Failure;

pub struct Signals {
    caught: Vec<(i32, Signal)>,
}

impl Signals {
    /// Installs the handlers. Do it before connecting, so a signal during
    /// the wait is never lost to the default action.
    pub fn install() -> Result<Signals, Failure> {
        let kinds = [
            (libc::SIGINT, SignalKind::interrupt()),
            (libc::SIGTERM, SignalKind::terminate()),
            (libc::SIGHUP, SignalKind::hangup()),
        ];
        let caught = kinds
            .into_iter()
            .map(|(n, k)| signal(k).map(|s| (n, s)))
            .collect::<std::io::Result<_>>()
            .map_err(|e| Failure::new(crate::exit::OS_ERROR, format!("cannot handle signals: {e}")))?;
        Ok(Signals { caught })
    }

    /// The next signal's number.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a signal that arrives while nobody awaits is kept for the
    /// next call.
    pub async fn recv(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (n, s) in &mut self.caught {
                if s.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*n);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

/// True when `sig` is a SIGINT that the terminal sent to the command too: a
/// Ctrl-C reaches every process of the terminal's foreground process group,
/// and the command shares dbmutex's group. Forwarding it would deliver a
/// second SIGINT, which many programs read as "force quit now".
pub fn terminal_sent_it_to_the_command(sig: i32) -> bool {
    if sig != libc::SIGINT {
        return false;
    }
    // SAFETY: getpgrp and tcgetpgrp take no pointers and only read process
    // and terminal state; on a descriptor that is not a terminal tcgetpgrp
    // returns -1, which is no process group.
    let ours = unsafe { libc::getpgrp() };
    [0, 1, 2]
        .into_iter()
        .any(|fd| unsafe { libc::tcgetpgrp(fd) } == ours)
}
