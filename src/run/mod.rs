//! The run form: wait for the lease, run the child while leading, map the
//! outcome to an exit status. This is the only place where the elector (the
//! lease) and the supervisor (the process) meet.
//!
//! `config.rs` checks the command line into a [`RunConfig`]; this file is
//! the story; `guard.rs` keeps the watchdog (started, confirmed, replaced);
//! `endings.rs` the three ways a leadership ends.

mod config;
mod endings;
mod guard;

pub use config::{Job, RunConfig};
use guard::{replace_watchdog, watchdog_gone};

use std::cell::RefCell;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::Duration;

use crate::clock::{BootClock, Clock};
use crate::duration::DurationArg;
use crate::elector::{describe_held, Elector, Lease, Lost, Observer, Waited};
use crate::error::Error;
use crate::exit::Exit;
use crate::published::{Publisher, Standing};
use crate::report::{self, Reporter};
use crate::stop::StopPlan;
use crate::store::{LeaseInfo, LeaseLock, Lock, Outcome};
use crate::supervisor;
use crate::terminal::Terminal;
use crate::tree::Cgroup;
use crate::watchdog::Watchdog;
use crate::{logging, signals};
use tokio::sync::mpsc::UnboundedReceiver;

enum End {
    Exited(ExitStatus),
    Lost(Lost),
    /// `--max-term` passed.
    Stepped,
    /// The watchdog died and no replacement could be started.
    Unguarded,
}

/// Renewals reach the status reporter and, once there are, the watchdog
/// (as the new give-up deadline) and the record the command's `check`
/// reads (published.rs).
struct Observers {
    report: report::Shared,
    watchdog: Rc<RefCell<Option<Watchdog>>>,
    published: Rc<RefCell<Option<Publisher>>>,
}

impl Observer for Observers {
    fn waiting(&mut self, held: Option<&LeaseInfo>) {
        self.report.waiting(held)
    }
    fn wants_holder(&self) -> bool {
        self.report.wants_holder()
    }
    fn renewed(&mut self, lease: &Lease) {
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.renewed(lease.sent);
        }
        if let Some(p) = self.published.borrow_mut().as_mut() {
            p.renewed(lease.sent);
        }
        self.report.renewed(lease)
    }
    fn renew_failed(&mut self, epoch: i64) {
        self.report.renew_failed(epoch)
    }
}

/// How long a try-once acquire may take before the watchdog is started
/// beside it. Longer than an embedded acquire on an idle host (about a
/// millisecond), so that a run that finds the lease held, and an embedded
/// run, start no watchdog early: on two shared CPUs the watchdog's exec
/// competes with the acquire rather than overlapping it (measured,
/// docs/performance.md, "A lean run": the skip took 0.61 x as long without the early watchdog,
/// a free embedded run no longer). Shorter than a server's connection and
/// round trips, so that those still hide the watchdog's start-up.
const OVERLAP_AFTER: Duration = Duration::from_millis(3);

/// The run form, start to finish: the story; each step is a method below.
pub async fn run(cfg: RunConfig) -> Result<Exit, Error> {
    // Whether `nohup` (or anything else) set SIGHUP to "ignore": it stays
    // so, for leaderrun and for the command.
    let hup_ignored = signals::ignored(nix::sys::signal::Signal::SIGHUP);
    let mut signals = signals::listen(hup_ignored).map_err(|source| Error::Startup {
        what: "install signal handlers",
        source,
    })?;
    let file = supervisor::check_command(&cfg.job.command)?;
    // Orphans of the command's tree come to leaderrun, not init (tree.rs),
    // and so does the watchdog once its intermediate exits (fork.rs): its
    // reaper is then leaderrun, not a PID 1 that may reap nothing.
    crate::tree::become_subreaper();
    let mut r = Run::new(cfg);
    // Try-once: an acquire still in flight after OVERLAP_AFTER (a connect,
    // a round trip to a server) has the watchdog's exec and start-up run
    // beside it; it gets its orders only once the lease is ours. A quick
    // answer (the embedded store, and above all its "held elsewhere")
    // starts no watchdog it would only kill. A waiting standby starts it on
    // acquiring, so that standbys stay one process each.
    let mut early = None;
    let waited = {
        let timeout = r.job.timeout.as_ref().map(DurationArg::value);
        let acquire = r.elector.wait_for_lease(r.job.wait, timeout, &mut signals);
        tokio::pin!(acquire);
        if r.job.wait {
            acquire.await
        } else {
            tokio::select! {
                biased;
                w = &mut acquire => w,
                () = tokio::time::sleep(OVERLAP_AFTER) => {
                    early = Watchdog::spawn(&r.job.name).ok();
                    acquire.await
                }
            }
        }
    };
    let mut lease = match waited {
        Waited::Acquired(l) => l,
        other => return r.not_leading(other),
    };
    r.acquired(&lease);
    r.arm_watchdog(&lease, early).await?;
    let Some(mut child) = r.start_command(&lease, &file, hup_ignored).await? else {
        return Ok(Exit::Lost);
    };
    Ok(
        match r.supervise(&mut lease, &mut child, &mut signals).await {
            End::Exited(st) => r.after_exit(&lease, &mut child, st).await,
            End::Lost(lost) => r.after_loss(&lease, &mut child, lost, &mut signals).await,
            End::Stepped => r.after_term(&lease, &mut child, &mut signals).await,
            End::Unguarded => r.after_unguarded(&lease, &mut child, &mut signals).await,
        },
    )
}

/// What the run form holds from acquiring to exiting.
struct Run {
    job: Job,
    clock: BootClock,
    elector: Elector<Lock, BootClock>,
    report: Rc<RefCell<Reporter>>,
    watchdog: Rc<RefCell<Option<Watchdog>>>,
    /// A watchdog told `done`, reaped as the run ends.
    leaving: RefCell<Option<Watchdog>>,
    /// The lease as the command's `leaderrun check` reads it.
    published: Rc<RefCell<Option<Publisher>>>,
    /// The store as `status` names it (no password), for that record.
    store_shown: String,
}

impl Run {
    fn new(cfg: RunConfig) -> Run {
        let RunConfig { store, job } = cfg;
        let clock = BootClock;
        let store_shown = store.describe();
        tracing::info!(
            event = "store",
            "store {store_shown}; holder {}",
            job.holder
        );
        let mut lock = store.lock(job.name.clone(), job.holder.clone());
        if let Some((_, period)) = &job.once_per {
            lock.once_per(*period);
        }
        if let Some(value) = &job.advertise {
            lock.advertise(value.clone());
        }
        if let Some(n) = job.slots {
            lock.slots(n);
        }
        let wakeups = if job.push { lock.wakeups() } else { None };
        let extends = lock.capabilities().failover_extends_lease;
        let mut elector = Elector::new(lock, clock, job.timing);
        elector.failover_extends_lease(extends);
        if let Some(w) = wakeups {
            elector.push(w);
        }
        let report = Reporter::new(&job.name, job.metrics_file.clone()).shared();
        let watchdog: Rc<RefCell<Option<Watchdog>>> = Rc::default();
        let published: Rc<RefCell<Option<Publisher>>> = Rc::default();
        elector.observe(Box::new(Observers {
            report: report::Shared(report.clone()),
            watchdog: watchdog.clone(),
            published: published.clone(),
        }));
        report.borrow_mut().starting();
        Run {
            job,
            clock,
            elector,
            report,
            watchdog,
            leaving: RefCell::default(),
            published,
            store_shown,
        }
    }

    /// How the run ends when the lease was not had.
    fn not_leading(&self, w: Waited<nix::sys::signal::Signal>) -> Result<Exit, Error> {
        let name = &self.job.name;
        match w {
            // Not reached: the caller took the lease.
            Waited::Acquired(_) => Ok(Exit::Failure),
            Waited::Held(info) => {
                match info {
                    Some(i) => tracing::info!(
                        event = "held",
                        "{}; not running the command",
                        describe_held(&i)
                    ),
                    None => tracing::info!(
                        event = "held",
                        "lease {name} is held elsewhere; not running the command"
                    ),
                }
                Ok(Exit::Held(self.job.conflict_exit_code))
            }
            Waited::DoneThisPeriod { started_ms_ago } => {
                // Info, like "held": the skip is the expected answer on every
                // host but one, and a cron mail of it is noise.
                let ago = crate::duration::show(crate::duration::about(Duration::from_millis(
                    started_ms_ago.max(0) as u64,
                )));
                let per = self.job.once_per.as_ref().map(|(p, _)| p.to_string());
                tracing::info!(
                    event = "done_this_period",
                    "lease {name}: this period's run started {ago} ago by the store's clock (--once-per {}); not running the command",
                    per.unwrap_or_default()
                );
                Ok(Exit::Held(self.job.conflict_exit_code))
            }
            Waited::TimedOut => {
                let waited = self.job.timeout.clone().unwrap_or_default();
                tracing::warn!(
                    event = "timeout",
                    "--timeout ({waited}) passed without leading {name}"
                );
                Ok(Exit::Timeout)
            }
            Waited::Interrupted(sig) => {
                tracing::info!(
                    event = "interrupted",
                    "{sig} while waiting for lease {name}; the command was not started"
                );
                Ok(Exit::Signal(sig as i32))
            }
            Waited::Failed(e) => Err(e.into()),
        }
    }

    /// The lease this run took: its name, or under `--slots` the slot's
    /// own lease (`NAME#i`), which the watchdog hands back, the command's
    /// `check` reads and the messages name.
    fn lease_name(&self) -> String {
        self.elector.lock.lease_name().to_string()
    }

    fn acquired(&self, lease: &Lease) {
        tracing::info!(
            event = "acquired",
            epoch = lease.epoch,
            "acquired lease {}",
            self.lease_name()
        );
        self.report.borrow_mut().acquired(lease.epoch);
        logging::set_epoch(lease.epoch);
    }

    /// Start the command on `lease`, in a cgroup of its own where one can be
    /// made. `None`: the give-up deadline passed first (a freeze), and it
    /// never started; on an error the lease has been released.
    async fn start_command(
        &mut self,
        lease: &Lease,
        file: &std::path::Path,
        hup_ignored: bool,
    ) -> Result<Option<supervisor::Child>, Error> {
        let name = &self.lease_name();
        let mut env = vec![
            ("LEASE_EPOCH", lease.epoch.to_string()),
            ("LEASE_NAME", self.job.name.clone()),
            ("LEASE_HOLDER", self.job.holder.clone()),
        ];
        // Under --slots: which slot, whose epoch LEASE_EPOCH is.
        if self.job.slots.is_some() {
            let slot = self.elector.lock.slot().unwrap_or(0);
            env.push(("LEASE_SLOT", slot.to_string()));
        }
        // What `leaderrun check` inside the command asks: this run, not a
        // store the command's environment may or may not name.
        let published = Publisher::new(
            name,
            &self.job.holder,
            self.store_shown.clone(),
            lease.epoch,
            lease.sent,
            self.job.timing,
        );
        if let Some(p) = &published {
            env.push((crate::published::VAR, p.path()));
        }
        *self.published.borrow_mut() = published;
        // A freeze between the acquisition and this line must not start the
        // command on a lease that may already have passed on.
        let plan = StopPlan::new(lease.sent, self.job.timing);
        if self.clock.now() >= plan.give_up_at() {
            tracing::warn!(
                event = "lost",
                epoch = lease.epoch,
                "lost lease {name} before the command started: past the give-up deadline (frozen?)"
            );
            self.lost_start(lease).await;
            return Ok(None);
        }
        // The second guard must be alive and hold its orders now: one that
        // died since (the OOM killer, a stray kill) is replaced first.
        let token = match self.ensure_watchdog() {
            Some(token) => token,
            None => {
                self.finish_watchdog();
                self.elector.lock.ending(Outcome::NotStarted);
                self.elector.release(lease, None).await;
                return Err(Error::Unguarded);
            }
        };
        // The watchdog learns the cgroup's path before it exists: should
        // leaderrun die from here on, the watchdog stops what runs there
        // and removes the directory. One that cannot be made is unsaid.
        let planned = Cgroup::plan();
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.spawning(planned.as_ref());
        }
        let cgroup = match planned {
            Some(cg) if cg.make() => Some(cg),
            Some(_) => {
                if let Some(w) = self.watchdog.borrow_mut().as_mut() {
                    w.spawning(None);
                }
                None
            }
            None => None,
        };
        let place = supervisor::Placement {
            cgroup,
            terminal: Terminal::attached(),
            skip: self.watchdog.borrow().as_ref().and_then(Watchdog::pid),
            keep_hup_ignored: hup_ignored,
            token,
            deadline: plan.give_up_at(),
        };
        let child = match supervisor::spawn(&self.job.command, file, &env, place) {
            Ok(c) => c,
            Err(supervisor::SpawnError::PastDeadline) => {
                tracing::warn!(
                    event = "lost",
                    epoch = lease.epoch,
                    "lost lease {name} before the command started: past the give-up deadline at exec (frozen?)"
                );
                self.lost_start(lease).await;
                return Ok(None);
            }
            Err(e) => {
                self.finish_watchdog();
                self.elector.lock.ending(Outcome::NotStarted);
                self.elector.release(lease, None).await;
                return Err(e.into());
            }
        };
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.child(
                nix::unistd::Pid::from_raw(child.pid()),
                child.start(),
                child.cgroup(),
            );
        }
        tracing::debug!(event = "started", pid = child.pid(), "started the command");
        Ok(Some(child))
    }

    /// The give-up deadline passed before the command started: nothing ran
    /// on this lease, so it is handed back at its epoch, as after a loss to
    /// the store's silence (contract §8). Kept, it would block every
    /// contender for the rest of the lease, and the next firing would skip
    /// a job that ran nowhere. The release names the epoch: it frees
    /// nothing someone else took meanwhile.
    async fn lost_start(&mut self, lease: &Lease) {
        self.finish_watchdog();
        self.elector.lock.ending(Outcome::NotStarted);
        self.elector.release_after_loss(lease).await;
        self.report.borrow_mut().released();
    }

    /// Hold the lease while the command runs: until it exits, the lease is
    /// lost or `--max-term` passes. Signals are passed on meanwhile.
    async fn supervise(
        &mut self,
        lease: &mut Lease,
        child: &mut supervisor::Child,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> End {
        let clock = self.clock;
        let step_down = self.job.max_term.map(|m| lease.acquired_at + m);
        let watchdog = self.watchdog.clone();
        let end = {
            let hold = self.elector.hold(lease);
            tokio::pin!(hold);
            loop {
                tokio::select! {
                    biased;
                    lost = &mut hold => break End::Lost(lost),
                    _ = watchdog_gone(&watchdog) => {
                        if !replace_watchdog(&watchdog) {
                            break End::Unguarded;
                        }
                        child.set_skip(watchdog.borrow().as_ref().and_then(Watchdog::pid));
                    }
                    _ = async {
                        match step_down {
                            Some(at) => clock.sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => break End::Stepped,
                    st = child.wait() => break End::Exited(st),
                    Some(sig) = signals.recv() => {
                        tracing::info!(event = "signal", "passing {sig} to the command's process group");
                        child.signal(sig);
                    }
                }
            }
        };
        // From here on the command's `check` says no: the lease is lost or
        // about to be given back, whatever time it has left.
        if let Some(p) = self.published.borrow_mut().as_mut() {
            p.ended(match end {
                End::Lost(_) | End::Unguarded => Standing::Lost,
                End::Exited(_) | End::Stepped => Standing::Ending,
            });
        }
        // A command that ended while leaderrun was not running ended on a
        // lease that may have passed on: a loss, exit 75, as for any
        // leaderrun that wakes past its give-up deadline (§6). Ctrl-Z is
        // the common case: it stops the command, and leaderrun stops itself
        // with it (terminal.rs) inside the wait above; held past `G`, the
        // watchdog stops the command meanwhile, and after `fg` leaderrun
        // runs on from inside that wait and finds the command gone before
        // its give-up timer is looked at.
        let give_up_at = StopPlan::new(lease.sent, self.job.timing).give_up_at();
        if matches!(end, End::Exited(_)) && clock.now() >= give_up_at {
            return End::Lost(Lost {
                reason: self.elector.late_or_gave_up(give_up_at),
                deadline: give_up_at,
            });
        }
        end
    }
}
