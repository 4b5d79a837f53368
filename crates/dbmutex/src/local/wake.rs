//! Waking a waiter of another process at once instead of at its next poll.
//!
//! A waiter sleeps in the core's polling loop on one of [`CHANNELS`]
//! wake-up channels, chosen by its in-process slot (a key's slot is the same
//! for all of that key's tries; two keys that share a channel only wake each
//! other for a useless try). Each process that waits binds one Unix datagram
//! socket in Linux's abstract namespace (no file; it vanishes with the
//! process), `dbmutex-wake-<pid>-<random>`, read by one thread
//! (`dbmutex-wake`, started on the first wait), and writes the socket's name
//! and its channel into its ticket (see [`super::queue`]). Whoever lets it go
//! first — a process that released the lock and asks again at once — sends
//! it one byte, the channel, to wake it.
//!
//! Best effort: a datagram from anyone else wakes for nothing, and where
//! there is no abstract namespace (not Linux) or it is not shared (another
//! network namespace), the waiter notices the release at its next poll,
//! within `MAX_POLL`.

use tokio::sync::Notify;

use crate::core::arbiter::{Slot, SlotExt};

/// Every wake-up socket's name starts so.
pub(super) const PREFIX: &str = "dbmutex-wake-";

/// The number of wake-up channels.
const CHANNELS: usize = 64;

static WAKE: [Notify; CHANNELS] = [const { Notify::const_new() }; CHANNELS];

/// The channel of the in-process slot at address `slot`.
pub(super) fn channel_of(slot: usize) -> usize {
    ((slot as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % CHANNELS
}

/// What the waiters on `channel` sleep on.
pub(super) fn channel(channel: usize) -> &'static Notify {
    &WAKE[channel % CHANNELS]
}

/// This process's wake-up address (`None`: it cannot be woken, it polls).
#[cfg(not(target_os = "linux"))]
pub(super) fn address() -> Option<&'static str> {
    None
}

/// Wakes the waiters on `channel` of the process at `address`.
#[cfg(not(target_os = "linux"))]
pub(super) fn poke(_address: &str, _channel: usize) {}

#[cfg(target_os = "linux")]
static ADDRESS: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
#[cfg(target_os = "linux")]
static SENDER: std::sync::OnceLock<Option<std::os::unix::net::UnixDatagram>> = std::sync::OnceLock::new();

/// This process's wake-up address (`None`: it cannot be woken, it polls).
#[cfg(target_os = "linux")]
pub(super) fn address() -> Option<&'static str> {
    ADDRESS.get_or_init(bind).as_deref()
}

/// Binds this process's socket and starts the thread that reads it.
#[cfg(target_os = "linux")]
fn bind() -> Option<String> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let name = format!("{PREFIX}{}-{:016x}", std::process::id(), fastrand::u64(..));
    let bound = SocketAddr::from_abstract_name(name.as_bytes()).and_then(|a| UnixDatagram::bind_addr(&a));
    let socket = match bound {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "dbmutex: no wake-up socket; waiters poll");
            return None;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("dbmutex-wake".into())
        .spawn(move || {
            let mut buf = [0u8; 16];
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => buf[..n]
                        .iter()
                        .for_each(|&c| WAKE[usize::from(c) % CHANNELS].notify_waiters()),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "dbmutex: wake-up thread ends; waiters poll");
                        return;
                    }
                }
            }
        });
    match spawned {
        Ok(_) => Some(name),
        Err(e) => {
            tracing::debug!(error = %e, "dbmutex: no wake-up thread; waiters poll");
            None
        }
    }
}

/// Wakes the waiters on `channel` of the process at `address`.
#[cfg(target_os = "linux")]
pub(super) fn poke(address: &str, channel: usize) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let sender = SENDER.get_or_init(|| {
        let s = UnixDatagram::unbound().ok()?;
        // Never wait for a receiver that does not read.
        s.set_nonblocking(true).ok()?;
        Some(s)
    });
    let (Some(sender), Ok(to)) = (sender, SocketAddr::from_abstract_name(address.as_bytes())) else {
        return;
    };
    let _ = sender.send_to_addr(&[(channel % CHANNELS) as u8], &to);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_poke_wakes_the_channel() {
        let addr = address().expect("an abstract socket on Linux");
        let c = channel_of(0x1234_5678);
        let mut woken = std::pin::pin!(channel(c).notified());
        woken.as_mut().enable();
        poke(addr, c);
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .expect("woken");
    }
}

/// The in-process state of a key: a release of the lock file in another
/// process wakes its waiters here (see [`channel`]).
#[derive(Default)]
pub(crate) struct Woken;

impl SlotExt for Woken {
    fn wake(slot: &Slot<Self>) -> Option<&Notify> {
        Some(channel(channel_of(slot as *const Slot<Self> as usize)))
    }
}
