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

pub use config::{Refused, RunConfig};
use guard::{replace_watchdog, watchdog_gone};

use std::cell::RefCell;
use std::ffi::OsString;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::Duration;

use crate::cli::{one_line_error, Cli};
use crate::clock::{BootClock, Clock};
use crate::duration::DurationArg;
use crate::elector::{describe_held, Elector, Lease, Lost, Observer, Waited};
use crate::report::{self, Reporter};
use crate::stop::StopPlan;
use crate::store::{LeaseInfo, Lock};
use crate::supervisor;
use crate::terminal::Terminal;
use crate::timing::Timing;
use crate::tree::Cgroup;
use crate::watchdog::{self, Watchdog};
use crate::{exit, logging, signals};
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::Level;

/// Parse the command line, run, and return the exit status.
pub fn main_entry() -> i32 {
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(watchdog::ARG)) {
        return watchdog::main();
    }
    let cli = match crate::cli::parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if matches!(e.kind(), DisplayHelp | DisplayVersion) {
                let _ = e.print();
                return 0;
            }
            // clap refused the line, so which format it asked for is read
            // from the arguments themselves.
            logging::set_format(crate::cli::log_format_in(std::env::args_os()));
            let line = one_line_error(&e);
            let msg = line.strip_prefix("error: ").unwrap_or(&line);
            logging::say(Level::ERROR, "usage_error", msg);
            return exit::USAGE;
        }
    };
    let Cli {
        admin,
        common,
        run: run_args,
    } = cli;
    logging::init(common.log());
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let msg = format!("cannot start the runtime: {e}");
            logging::say(Level::ERROR, "startup_failed", &msg);
            return exit::FAILURE;
        }
    };
    if let Some(cmd) = admin {
        return rt.block_on(crate::admin::run(cmd, common));
    }
    let cfg = match RunConfig::from_cli(common, run_args) {
        Ok(c) => c,
        Err(r) => {
            let event = if r.code == exit::USAGE {
                "usage_error"
            } else {
                "store_error"
            };
            logging::say(Level::ERROR, event, &r.msg);
            return r.code;
        }
    };
    logging::set_context(&cfg.name, &cfg.holder);
    // One thread: the child's parent-death signal is tied to the thread that
    // spawned it (see src/supervisor/), and the main thread lives longest.
    rt.block_on(run(cfg))
}

enum End {
    Exited(ExitStatus),
    Lost(Lost),
    /// `--max-term` passed.
    Stepped,
    /// The watchdog died and no replacement could be started.
    Unguarded,
}

/// Renewals reach the status reporter and, once there is one, the
/// watchdog (as the new give-up deadline).
struct Observers {
    report: report::Shared,
    watchdog: Rc<RefCell<Option<Watchdog>>>,
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
pub async fn run(cfg: RunConfig) -> i32 {
    // Whether `nohup` (or anything else) set SIGHUP to "ignore": it stays
    // so, for leaderrun and for the command.
    let hup_ignored = signals::ignored(nix::sys::signal::Signal::SIGHUP);
    let mut signals = match signals::listen(hup_ignored) {
        Ok(rx) => rx,
        Err(e) => {
            tracing::error!(
                event = "startup_failed",
                "cannot install signal handlers: {e}"
            );
            return exit::FAILURE;
        }
    };
    let file = match supervisor::check_command(&cfg.command) {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(event = "spawn_failed", "{e}");
            return e.exit_code();
        }
    };
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
        let timeout = r.timeout.as_ref().map(DurationArg::value);
        let acquire = r.elector.wait_for_lease(r.wait, timeout, &mut signals);
        tokio::pin!(acquire);
        if r.wait {
            acquire.await
        } else {
            tokio::select! {
                biased;
                w = &mut acquire => w,
                () = tokio::time::sleep(OVERLAP_AFTER) => {
                    early = Watchdog::spawn(&r.name).ok();
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
    if let Err(code) = r.arm_watchdog(&lease, early).await {
        return code;
    }
    let mut child = match r.start_command(&lease, &file, hup_ignored).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match r.supervise(&mut lease, &mut child, &mut signals).await {
        End::Exited(st) => r.after_exit(&lease, &mut child, st).await,
        End::Lost(lost) => r.after_loss(&lease, &mut child, lost, &mut signals).await,
        End::Stepped => r.after_term(&lease, &mut child, &mut signals).await,
        End::Unguarded => r.after_unguarded(&lease, &mut child, &mut signals).await,
    }
}

/// What the run form holds from acquiring to exiting.
struct Run {
    name: String,
    holder: String,
    t: Timing,
    clock: BootClock,
    wait: bool,
    timeout: Option<DurationArg>,
    min_hold: Option<Duration>,
    max_term: Option<Duration>,
    conflict_exit_code: i32,
    command: Vec<OsString>,
    store_arg: Option<crate::redact::Secret>,
    store_origin: crate::store::Origin,
    log: logging::Settings,
    elector: Elector<Lock, BootClock>,
    report: Rc<RefCell<Reporter>>,
    watchdog: Rc<RefCell<Option<Watchdog>>>,
    /// A watchdog told `done`, reaped as the run ends.
    leaving: RefCell<Option<Watchdog>>,
}

impl Run {
    fn new(cfg: RunConfig) -> Run {
        let clock = BootClock;
        let t = cfg.timing;
        tracing::info!(
            event = "store",
            "store {}; holder {}",
            cfg.store.describe(),
            cfg.holder
        );
        let lock = cfg.store.lock(cfg.name.clone(), cfg.holder.clone());
        let wakeups = if cfg.push { lock.wakeups() } else { None };
        let extends = lock.capabilities().failover_extends_lease;
        let mut elector = Elector::new(lock, clock, t);
        elector.failover_extends_lease(extends);
        if let Some(w) = wakeups {
            elector.push(w);
        }
        let report = Reporter::new(&cfg.name, cfg.metrics_file.clone()).shared();
        let watchdog: Rc<RefCell<Option<Watchdog>>> = Rc::default();
        elector.observe(Box::new(Observers {
            report: report::Shared(report.clone()),
            watchdog: watchdog.clone(),
        }));
        report.borrow_mut().starting();
        Run {
            name: cfg.name,
            holder: cfg.holder,
            t,
            clock,
            wait: cfg.wait,
            timeout: cfg.timeout,
            min_hold: cfg.min_hold,
            max_term: cfg.max_term,
            conflict_exit_code: cfg.conflict_exit_code,
            command: cfg.command,
            store_arg: cfg.store_arg,
            store_origin: cfg.store_origin,
            log: cfg.log,
            elector,
            report,
            watchdog,
            leaving: RefCell::default(),
        }
    }

    /// The exit status when the lease was not had.
    fn not_leading(&self, w: Waited<nix::sys::signal::Signal>) -> i32 {
        let name = &self.name;
        match w {
            Waited::Acquired(_) => exit::FAILURE,
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
                self.conflict_exit_code
            }
            Waited::TimedOut => {
                let waited = self.timeout.clone().unwrap_or_default();
                tracing::warn!(
                    event = "timeout",
                    "--timeout ({waited}) passed without leading {name}"
                );
                exit::TIMEOUT
            }
            Waited::Interrupted(sig) => {
                tracing::info!(
                    event = "interrupted",
                    "{sig} while waiting for lease {name}; the command was not started"
                );
                exit::for_signal(sig as i32)
            }
            Waited::Failed(e) => {
                tracing::error!(event = "store_error", "{e}");
                exit::FAILURE
            }
        }
    }

    fn acquired(&self, lease: &Lease) {
        tracing::info!(
            event = "acquired",
            epoch = lease.epoch,
            "acquired lease {}",
            self.name
        );
        self.report.borrow_mut().acquired(lease.epoch);
        logging::set_epoch(lease.epoch);
    }

    /// Start the command on `lease`, in a cgroup of its own where one can be
    /// made. Err is the exit status: no command runs.
    async fn start_command(
        &mut self,
        lease: &Lease,
        file: &std::path::Path,
        hup_ignored: bool,
    ) -> Result<supervisor::Child, i32> {
        let name = &self.name;
        let env = [
            ("LEASE_EPOCH", lease.epoch.to_string()),
            ("LEASE_NAME", name.clone()),
            ("LEASE_HOLDER", self.holder.clone()),
        ];
        // A freeze between the acquisition and this line must not start the
        // command on a lease that may already have passed on.
        let plan = StopPlan::new(lease.sent, self.t);
        if self.clock.now() >= plan.give_up_at() {
            tracing::warn!(
                event = "lost",
                epoch = lease.epoch,
                "lost lease {name} before the command started: past the give-up deadline (frozen?)"
            );
            self.finish_watchdog();
            return Err(exit::LOST);
        }
        // The second guard must be alive and hold its orders now: one that
        // died since (the OOM killer, a stray kill) is replaced first.
        if !self.ensure_watchdog() {
            tracing::error!(
                event = "watchdog_failed",
                "the watchdog is gone and no other could be started; not running the command"
            );
            self.finish_watchdog();
            self.elector.release(lease, None).await;
            return Err(exit::FAILURE);
        }
        let token = match self.watchdog.borrow().as_ref() {
            Some(w) => w.token(),
            None => return Err(exit::FAILURE),
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
        let child = match supervisor::spawn(&self.command, file, &env, place) {
            Ok(c) => c,
            Err(supervisor::SpawnError::PastDeadline) => {
                tracing::warn!(
                    event = "lost",
                    epoch = lease.epoch,
                    "lost lease {name} before the command started: past the give-up deadline at exec (frozen?)"
                );
                self.finish_watchdog();
                return Err(exit::LOST);
            }
            Err(e) => {
                tracing::error!(event = "spawn_failed", "{e}");
                self.finish_watchdog();
                self.elector.release(lease, None).await;
                return Err(e.exit_code());
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
        Ok(child)
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
        let step_down = self.max_term.map(|m| lease.acquired_at + m);
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
        // A command that ended while leaderrun was not running ended on a
        // lease that may have passed on: a loss, exit 75, as for any
        // leaderrun that wakes past its give-up deadline (§6). Ctrl-Z is
        // the common case: it stops the command, and leaderrun stops itself
        // with it (terminal.rs) inside the wait above; held past `G`, the
        // watchdog stops the command meanwhile, and after `fg` leaderrun
        // runs on from inside that wait and finds the command gone before
        // its give-up timer is looked at.
        let give_up_at = StopPlan::new(lease.sent, self.t).give_up_at();
        if matches!(end, End::Exited(_)) && clock.now() >= give_up_at {
            return End::Lost(Lost {
                reason: self.elector.late_or_gave_up(give_up_at),
                deadline: give_up_at,
            });
        }
        end
    }
}
