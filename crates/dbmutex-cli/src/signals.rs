//! The signals dbmutex catches: SIGINT, SIGTERM, SIGHUP and SIGQUIT.
//!
//! While waiting for the lock they end the wait; while the command runs they
//! are forwarded to its whole process group. (When dbmutex started in the
//! terminal's foreground, the command's group has the terminal while it
//! runs, so a Ctrl-C from it reaches the command directly, not dbmutex.) Catching them also keeps them from killing dbmutex
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
            (libc::SIGQUIT, SignalKind::quit()),
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
