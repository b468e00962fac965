//! Signals leaderrun passes on: TERM, INT, HUP, QUIT, USR1, USR2.
//!
//! Handlers are installed before anything else happens, so a signal that
//! arrives while the store is still being contacted is not lost (nor does it
//! kill leaderrun with a lease half-taken): it ends the wait cleanly, or is
//! passed to the child once there is one.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Whether `sig` is set to "ignore" now (as inherited): `nohup` leaves
/// SIGHUP so, and leaderrun keeps it so rather than handle and pass it on.
pub fn ignored(sig: Signal) -> bool {
    let mut old = std::mem::MaybeUninit::<nix::libc::sigaction>::zeroed();
    // SAFETY: with a null new action, sigaction only reads the current one
    // into `old`, a valid, zeroed struct.
    let rc = unsafe { nix::libc::sigaction(sig as i32, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: sigaction succeeded and filled `old` (or it stays zeroed).
    rc == 0 && unsafe { old.assume_init() }.sa_sigaction == nix::libc::SIG_IGN
}

/// Start listening; every forwarded signal that arrives is sent on the
/// returned channel, in order. With `skip_hup`, SIGHUP is left as it is.
pub fn listen(skip_hup: bool) -> std::io::Result<UnboundedReceiver<Signal>> {
    let (tx, rx) = unbounded_channel();
    for sig in FORWARDED {
        if skip_hup && sig == Signal::SIGHUP {
            continue;
        }
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }
    Ok(rx)
}
