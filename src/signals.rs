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

/// Start listening; every forwarded signal that arrives is sent on the
/// returned channel, in order.
pub fn listen() -> std::io::Result<UnboundedReceiver<Signal>> {
    let (tx, rx) = unbounded_channel();
    for sig in FORWARDED {
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
