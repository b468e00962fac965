//! The run form's second guard: the watchdog started, confirmed, watched
//! and replaced (docs/contract.md §10).

use std::cell::RefCell;
use std::rc::Rc;

use super::Run;
use crate::elector::Lease;
use crate::error::Error;
use crate::tree::TermToken;
use crate::watchdog::{Orders, Watchdog};

/// Completes when the watchdog dies: its end of the ack pipe closes. Never,
/// without one.
pub(super) async fn watchdog_gone(w: &Rc<RefCell<Option<Watchdog>>>) {
    use std::os::fd::AsRawFd;
    use tokio::io::{unix::AsyncFd, Interest};
    let fd = w.borrow().as_ref().and_then(Watchdog::gone_fd);
    // SAFETY: the descriptor is moved into the AsyncFd, so it stays open
    // (and the same file) for as long as the registration lives.
    let registered =
        fd.and_then(|f| unsafe { AsyncFd::register_with_interest(f, Interest::READABLE) }.ok());
    let Some(afd) = registered else {
        return std::future::pending().await;
    };
    loop {
        let Ok(mut ready) = afd.readable().await else {
            return std::future::pending().await;
        };
        // Nothing is written after `ready`: what is readable is the end.
        let mut b = [0u8; 16];
        match nix::unistd::read(afd.get_ref().as_raw_fd(), &mut b) {
            Ok(0) => return,
            Err(nix::errno::Errno::EAGAIN) | Ok(_) => ready.clear_ready(),
            Err(_) => return,
        }
    }
}

/// The watchdog died: start another with the current orders at once (the
/// SIGTERM token goes with it). False when none could be started: the
/// command must then be stopped (docs/contract.md §10).
pub(super) fn replace_watchdog(w: &Rc<RefCell<Option<Watchdog>>>) -> bool {
    let mut slot = w.borrow_mut();
    let Some(old) = slot.as_ref() else {
        return false;
    };
    match old.replace() {
        Ok(new) => {
            tracing::warn!(
                event = "watchdog_replaced",
                "the watchdog died; a new one (pid {}) holds the current orders",
                new.pid().map_or(0, |p| p.as_raw())
            );
            // The old one is reaped as it is dropped.
            *slot = Some(new);
            true
        }
        Err(e) => {
            tracing::error!(
                event = "watchdog_failed",
                "the watchdog died and no other could be started ({e})"
            );
            *slot = None;
            false
        }
    }
}

/// Run `stop` (a stop or a sweep of the command) while the watchdog is
/// watched: one that dies meanwhile is replaced at once, as while the
/// command runs, and the new one is left out of the sweep (`skip`). The
/// stop itself goes on either way: it is never restarted, so no process
/// gets a second SIGTERM.
pub(super) async fn watched<T>(
    w: &Rc<RefCell<Option<Watchdog>>>,
    skip: crate::tree::Skip,
    stop: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            out = &mut stop => return out,
            _ = watchdog_gone(w) => {
                // Unreplaceable: the slot is emptied and this branch sleeps
                // for good; leaderrun alone finishes the stop it began.
                replace_watchdog(w);
                skip.set(w.borrow().as_ref().and_then(Watchdog::pid).map(|p| p.as_raw()));
            }
        }
    }
}

impl Run {
    /// The second guard starts before the command does: from the command's
    /// first instant, either process stops it on time (docs/contract.md §10).
    /// Err: the command must not start (the lease has been released).
    pub(super) async fn arm_watchdog(
        &mut self,
        lease: &Lease,
        early: Option<Watchdog>,
    ) -> Result<(), Error> {
        let orders = Orders {
            store: self.job.store_arg.clone(),
            origin: self.job.store_origin,
            // The slot's own lease under --slots: the one to hand back.
            name: self.lease_name(),
            holder: self.job.holder.clone(),
            epoch: lease.epoch,
            timing: self.job.timing,
            min_hold: self.job.min_hold,
            acquired_at: lease.acquired_at,
            sent: lease.sent,
            verbose: self.job.log.verbose,
            quiet: self.job.log.quiet,
            json: self.job.log.format == crate::logging::LogFormat::Json,
        };
        let started = match early {
            Some(w) => w.give(&orders),
            None => Watchdog::start(&orders),
        };
        match started {
            Ok(w) => {
                *self.watchdog.borrow_mut() = Some(w);
                Ok(())
            }
            Err(e) => {
                self.elector.release(lease, None).await;
                Err(Error::Watchdog(e))
            }
        }
    }

    /// The SIGTERM token of a watchdog that is alive and holds its orders,
    /// replacing a dead one if need be; `None` when none can be had.
    pub(super) fn ensure_watchdog(&self) -> Option<TermToken> {
        let alive = self.watchdog.borrow().as_ref().is_some_and(Watchdog::alive);
        if !alive && !replace_watchdog(&self.watchdog) {
            return None;
        }
        self.watchdog.borrow().as_ref().map(Watchdog::token)
    }

    /// The watchdog's work is over: everything the command started is gone.
    /// It is told so now, and reaped when the run ends (Drop of `Watchdog`),
    /// so that its exit overlaps the release's round trip.
    pub(super) fn finish_watchdog(&self) {
        if let Some(mut w) = self.watchdog.borrow_mut().take() {
            w.done();
            *self.leaving.borrow_mut() = Some(w);
        }
    }
}
