//! How a leadership ends: the command exited, the lease was lost, the
//! watchdog could not be kept, or `--max-term` passed.

use std::process::ExitStatus;

use tokio::sync::mpsc::UnboundedReceiver;

use super::guard::watched;
use super::Run;
use crate::clock::Clock;
use crate::duration::show;
use crate::elector::{Lease, Lost};
use crate::exit::Exit;
use crate::stop::{Stop, StopPlan};
use crate::store::{LeaseLock, Outcome};
use crate::supervisor::{self, status_code};

impl Run {
    /// A stop begun now, on the deadlines of `lease` (stop.rs): SIGTERM at
    /// once, SIGKILL `K` later but never past `G + K`.
    fn stop_now(&self, lease: &Lease) -> Stop {
        Stop::at(
            &StopPlan::new(lease.sent, self.job.timing),
            self.clock.now(),
        )
    }

    /// The stop every ending but a plain exit shares: SIGTERM once, SIGKILL
    /// at its deadline, with the watchdog watched (and replaced) meanwhile;
    /// then the cgroup goes and the watchdog is told it is over. The exit
    /// status, and whether everything the command started is gone.
    async fn stop_command(
        &mut self,
        child: &mut supervisor::Child,
        stop: Stop,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> (ExitStatus, bool) {
        let (w, skip) = (self.watchdog.clone(), child.skip());
        let out = watched(&w, skip, child.stop(&self.clock, stop, signals)).await;
        child.cleanup();
        self.finish_watchdog();
        out
    }

    /// The command exited: anything it left behind dies before the lease
    /// could pass on (the same G + K arithmetic as a loss), then release.
    pub(super) async fn after_exit(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        st: ExitStatus,
    ) -> Exit {
        let stop = self.stop_now(lease);
        let (w, skip) = (self.watchdog.clone(), child.skip());
        let gone = watched(&w, skip, child.sweep(&self.clock, stop)).await;
        child.cleanup();
        self.finish_watchdog();
        let code = status_code(st);
        tracing::info!(
            event = "exited",
            epoch = lease.epoch,
            "command exited with status {code}"
        );
        // The run record's end (under --once-per) goes with the release.
        self.elector.lock.ending(Outcome::of(st));
        if gone {
            self.elector.release(lease, self.job.min_hold).await;
        } else {
            tracing::warn!(
                event = "release_failed",
                epoch = lease.epoch,
                "processes the command started survive SIGKILL; the lease is left to expire"
            );
        }
        self.report.borrow_mut().released();
        Exit::Command(code)
    }

    /// The lease was lost: stop everything, exit 75. Once all of it is gone
    /// the lease is handed back at our epoch, unless someone else already
    /// holds it: after a loss to the store's silence the store may still
    /// hold it for us (until `sent + L`, and on etcd, whose leader change
    /// re-extends every lease, up to a whole lease longer), and the next
    /// holder should start when the store answers again, not then.
    pub(super) async fn after_loss(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        lost: Lost,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> Exit {
        tracing::warn!(
            event = "lost",
            epoch = lease.epoch,
            "lost lease {}: {}; stopping the command",
            self.lease_name(),
            lost.reason
        );
        self.report.borrow_mut().lost();
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.stopping();
        }
        let stop = self.stop_now(lease);
        let (st, gone) = self.stop_command(child, stop, signals).await;
        tracing::warn!(
            event = "stopped",
            epoch = lease.epoch,
            "command stopped (status {}); exiting 75",
            status_code(st)
        );
        // Superseded: the row, and the run record with it, is someone
        // else's now; nothing is written.
        self.elector.lock.ending(Outcome::Lost);
        if gone && lost.reason != crate::elector::LossReason::Superseded {
            self.elector.release_after_loss(lease).await;
        }
        Exit::Lost
    }

    /// The watchdog died and no other could be started: the command must
    /// not run with one guard. Stop it as on a loss, release, exit 75.
    pub(super) async fn after_unguarded(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> Exit {
        tracing::warn!(
            event = "lost",
            epoch = lease.epoch,
            "the command would run with one guard only (the watchdog died and none could \
             be started); stopping it"
        );
        self.report.borrow_mut().lost();
        let stop = self.stop_now(lease);
        let (st, gone) = self.stop_command(child, stop, signals).await;
        self.elector.lock.ending(Outcome::Killed);
        if gone {
            self.elector.release(lease, None).await;
        }
        self.report.borrow_mut().released();
        tracing::warn!(
            event = "stopped",
            epoch = lease.epoch,
            "command stopped (status {}); exiting 75",
            status_code(st)
        );
        Exit::Lost
    }

    /// `--max-term` passed: stop the command as on a loss, release, and sit
    /// out until a rival leads (or the lease would have expired).
    pub(super) async fn after_term(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> Exit {
        let name = self.lease_name();
        let term = self.job.max_term.unwrap_or_default();
        tracing::info!(
            event = "max_term",
            epoch = lease.epoch,
            "led {name} for --max-term ({}); stopping the command to hand over",
            show(term)
        );
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.stopping();
        }
        // The stop path of a loss, with the deadlines of the lease we still
        // hold: renewals stop here, so SIGKILL comes no later than the last
        // renewal's G + K, before the lease could pass on.
        let stop = self.stop_now(lease);
        let (st, gone) = self.stop_command(child, stop, signals).await;
        self.elector.lock.ending(Outcome::Killed);
        let released = gone && self.elector.release(lease, None).await;
        self.report.borrow_mut().released();
        let successor = if released {
            // A signal (`systemctl stop`) ends the sit-out at once: the
            // command is gone and the lease released already.
            tokio::select! {
                s = self.elector.sit_out(lease.epoch) => s,
                Some(_) = signals.recv() => None,
            }
        } else {
            None
        };
        match successor {
            Some(h) => tracing::info!(
                event = "stepped_down",
                epoch = lease.epoch,
                "command stopped (status {}); {} leads {name} now; exiting 75",
                status_code(st),
                crate::names::printable(&h)
            ),
            None => tracing::info!(
                event = "stepped_down",
                epoch = lease.epoch,
                "command stopped (status {}); no one else took {name} over; exiting 75",
                status_code(st)
            ),
        }
        // 75, as for a loss: in both cases leaderrun stopped a command that
        // was still running because this process should no longer lead, and
        // the caller should try again later (EX_TEMPFAIL); a unit or script
        // written for 75 needs nothing new. The log events (max_term,
        // stepped_down) tell the two apart.
        Exit::Lost
    }
}
