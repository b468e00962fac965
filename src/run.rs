//! The run form: wait for the lease, run the child while leading, map the
//! outcome to an exit status. This is the only place where the elector (the
//! lease) and the supervisor (the process) meet.

use std::cell::RefCell;
use std::ffi::OsString;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::Duration;

use crate::cli::{one_line_error, Cli, Common, RunArgs};
use crate::clock::{BootClock, Clock};
use crate::elector::{describe_held, Elector, Lease, Lost, Observer, Waited};
use crate::report::{self, Reporter};
use crate::store::{AnyStore, LeaseInfo, StoreAdmin};
use crate::supervisor::{self, status_code};
use crate::terminal::Terminal;
use crate::timing::{Timing, TimingArgs};
use crate::tree::Cgroup;
use crate::watchdog::{self, Orders, Watchdog};
use crate::{exit, logging, names, signals};

/// Everything the run form needs, validated.
pub struct RunConfig {
    /// `--store` as given, for the watchdog (which resolves it the same way).
    pub store_arg: Option<String>,
    pub store_origin: crate::store::Origin,
    pub log: (u8, bool, bool),
    pub name: String,
    pub holder: String,
    pub timing: Timing,
    pub store: AnyStore,
    pub wait: bool,
    pub timeout: Option<Duration>,
    pub min_hold: Option<Duration>,
    pub max_term: Option<Duration>,
    /// Use the store's push wake-ups while waiting (not `--no-push`).
    pub push: bool,
    pub conflict_exit_code: i32,
    pub command: Vec<OsString>,
    pub metrics_file: Option<std::path::PathBuf>,
}

/// Why the run form cannot start: one line, and the exit status it means
/// (2 for usage errors, 125 when the environment leaves no store).
#[derive(Debug)]
pub struct Refused {
    pub code: i32,
    pub msg: String,
}

impl From<String> for Refused {
    fn from(msg: String) -> Refused {
        Refused {
            code: exit::USAGE,
            msg,
        }
    }
}

impl From<&str> for Refused {
    fn from(msg: &str) -> Refused {
        msg.to_string().into()
    }
}

impl RunConfig {
    pub fn from_cli(common: Common, run: RunArgs) -> Result<RunConfig, Refused> {
        let args = TimingArgs {
            lease: run.lease,
            renew: run.renew,
            give_up: run.give_up,
            kill_after: run.kill_after,
            retry: run.retry,
        };
        let timing = Timing::resolve(args).map_err(|e| e.to_string())?;
        let name = run.name.ok_or("--name is required")?;
        let store = crate::store::resolve(
            common.store.clone(),
            common.store_origin,
            &format!("leaderrun {name}"),
            timing.give_up,
        )
        .map_err(|e| Refused {
            code: e.exit_code(),
            msg: e.to_string(),
        })?;
        // The timing must hold for the lease the store really grants (a
        // store with whole-second leases rounds up), not the one asked for.
        let granted = store.capabilities().grant(timing.lease)?;
        let timing = if granted == timing.lease {
            timing
        } else {
            Timing::resolve(TimingArgs {
                lease: Some(granted),
                ..args
            })
            .map_err(|e| {
                format!(
                    "{e} (the store grants a lease of {})",
                    humantime::format_duration(granted)
                )
            })?
        };
        if let Some(m) = run.max_term {
            if m.is_zero() {
                return Err("--max-term must be longer than 0".into());
            }
            // Stepping down releases at once; a keep that outlasts the term
            // would hold the lease against the very rival it steps down for.
            if run.min_hold.is_some_and(|h| h >= m) {
                return Err("--min-hold must be shorter than --max-term".into());
            }
        }
        if run.command.first().is_none_or(|c| c.is_empty()) {
            return Err("the command after -- must not be empty".into());
        }
        Ok(RunConfig {
            store_arg: common.store,
            store_origin: common.store_origin,
            log: (
                common.verbose,
                common.quiet,
                common.log_format == crate::cli::LogFormat::Json,
            ),
            holder: run.holder.unwrap_or_else(names::default_holder),
            name,
            timing,
            store,
            wait: run.wait,
            timeout: run.timeout,
            min_hold: run.min_hold,
            max_term: run.max_term,
            push: !run.no_push,
            conflict_exit_code: i32::from(run.conflict_exit_code),
            command: run.command,
            metrics_file: run.metrics_file,
        })
    }
}

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
            crate::stderr::line(&one_line_error(&e));
            return exit::USAGE;
        }
    };
    let Cli {
        admin,
        common,
        run: run_args,
    } = cli;
    logging::init(common.verbose, common.quiet, common.log_format);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::stderr::line(&format!("error: cannot start the runtime: {e}"));
            return exit::FAILURE;
        }
    };
    if let Some(cmd) = admin {
        return rt.block_on(crate::admin::run(cmd, common));
    }
    let cfg = match RunConfig::from_cli(common, run_args) {
        Ok(c) => c,
        Err(r) => {
            crate::stderr::line(&format!("error: {}", r.msg));
            return r.code;
        }
    };
    logging::set_context(&cfg.name, &cfg.holder);
    // One thread: the child's parent-death signal is tied to the thread that
    // spawned it (see supervisor.rs), and the main thread lives longest.
    rt.block_on(run(cfg))
}

enum End {
    Exited(ExitStatus),
    Lost(Lost),
    /// `--max-term` passed.
    Stepped,
}

/// Renewals reach the status reporter and, once there is one, the
/// watchdog (as the new give-up deadline).
struct Observers {
    report: report::Shared,
    watchdog: Rc<RefCell<Option<Watchdog>>>,
    give_up: Duration,
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
            w.deadline(lease.sent + self.give_up);
        }
        self.report.renewed(lease)
    }
    fn renew_failed(&mut self, epoch: i64) {
        self.report.renew_failed(epoch)
    }
}

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
    let clock = BootClock;
    let t = cfg.timing;
    let name = cfg.name.clone();
    tracing::info!(
        event = "store",
        "store {}; holder {}",
        cfg.store.describe(),
        cfg.holder
    );
    let wakeups = if cfg.push { cfg.store.wakeups() } else { None };
    let mut elector = Elector::new(cfg.store, clock, cfg.name, cfg.holder.clone(), t);
    if let Some(w) = wakeups {
        elector.push(w);
    }
    let report = Reporter::new(&name, cfg.metrics_file.clone()).shared();
    let watchdog: Rc<RefCell<Option<Watchdog>>> = Rc::default();
    elector.observe(Box::new(Observers {
        report: report::Shared(report.clone()),
        watchdog: watchdog.clone(),
        give_up: t.give_up,
    }));
    report.borrow_mut().starting();

    // Try-once: the watchdog's exec and start-up run while the acquire is
    // in flight (a connect, a round trip); it gets its orders only once the
    // lease is ours. A waiting standby starts it on acquiring instead, so
    // that standbys stay one process each.
    let mut early = if cfg.wait {
        None
    } else {
        Watchdog::spawn(&name).ok()
    };
    let mut lease = match elector
        .wait_for_lease(cfg.wait, cfg.timeout, &mut signals)
        .await
    {
        Waited::Acquired(l) => l,
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
            return cfg.conflict_exit_code;
        }
        Waited::TimedOut => {
            let waited = cfg.timeout.unwrap_or_default();
            tracing::warn!(
                event = "timeout",
                "--timeout ({}) passed without leading {name}",
                humantime::format_duration(waited)
            );
            return exit::TIMEOUT;
        }
        Waited::Interrupted(sig) => {
            tracing::info!(
                event = "interrupted",
                "{sig} while waiting for lease {name}; the command was not started"
            );
            return exit::for_signal(sig as i32);
        }
        Waited::Failed(e) => {
            tracing::error!(event = "store_error", "{e}");
            return exit::FAILURE;
        }
    };
    tracing::info!(
        event = "acquired",
        epoch = lease.epoch,
        "acquired lease {name}"
    );
    report.borrow_mut().acquired(lease.epoch);
    logging::set_epoch(lease.epoch);

    // The second guard starts before the command does: from the command's
    // first instant, either process stops it on time (docs/contract.md §10).
    let orders = Orders {
        store: cfg.store_arg.clone(),
        origin: cfg.store_origin,
        name: name.clone(),
        holder: cfg.holder.clone(),
        epoch: lease.epoch,
        lease: t.lease,
        give_up: t.give_up,
        kill_after: t.kill_after,
        min_hold: cfg.min_hold,
        acquired_at: lease.acquired_at,
        deadline: lease.sent + t.give_up,
        verbose: cfg.log.0,
        quiet: cfg.log.1,
        json: cfg.log.2,
    };
    let started = match early.take() {
        Some(w) => w.give(&orders),
        None => Watchdog::start(&orders),
    };
    match started {
        Ok(w) => *watchdog.borrow_mut() = Some(w),
        Err(e) => {
            tracing::error!(
                event = "watchdog_failed",
                "cannot start the watchdog ({e}); not running the command"
            );
            elector.release(&lease, None).await;
            return exit::FAILURE;
        }
    }
    let finish = |w: &Rc<RefCell<Option<Watchdog>>>| {
        if let Some(w) = w.borrow_mut().take() {
            w.done();
        }
    };

    let env = [
        ("LEASE_EPOCH", lease.epoch.to_string()),
        ("LEASE_NAME", name.clone()),
        ("LEASE_HOLDER", cfg.holder.clone()),
    ];
    // A freeze between the acquisition and this line must not start the
    // command on a lease that may already have passed on.
    if clock.now() >= lease.sent + t.give_up {
        tracing::warn!(
            event = "lost",
            epoch = lease.epoch,
            "lost lease {name} before the command started: past the give-up deadline (frozen?)"
        );
        finish(&watchdog);
        return exit::LOST;
    }
    let place = supervisor::Placement {
        cgroup: Cgroup::create(&format!("leaderrun-{}", std::process::id())),
        terminal: Terminal::attached(),
        skip: watchdog.borrow().as_ref().and_then(Watchdog::pid),
        keep_hup_ignored: hup_ignored,
    };
    if let Some(w) = watchdog.borrow_mut().as_mut() {
        w.spawning(place.cgroup.as_ref());
    }
    // Orphans of the command's tree come to leaderrun, not init (tree.rs);
    // only now, so that the watchdog, started detached, was not adopted.
    crate::tree::become_subreaper();
    let mut child = match supervisor::spawn(&cfg.command, &file, &env, place) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(event = "spawn_failed", "{e}");
            finish(&watchdog);
            elector.release(&lease, None).await;
            return e.exit_code();
        }
    };
    if let Some(w) = watchdog.borrow_mut().as_mut() {
        w.child(nix::unistd::Pid::from_raw(child.pid()), child.cgroup());
    }
    tracing::debug!(event = "started", pid = child.pid(), "started the command");

    let step_down = cfg.max_term.map(|m| lease.acquired_at + m);
    let end = {
        let hold = elector.hold(&mut lease);
        tokio::pin!(hold);
        loop {
            tokio::select! {
                biased;
                lost = &mut hold => break End::Lost(lost),
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

    match end {
        End::Exited(st) => {
            // Anything the child left behind dies before the lease could
            // pass on: the same G + K arithmetic as a loss.
            let kill_at = (clock.now() + t.kill_after).min(lease.sent + t.give_up + t.kill_after);
            let gone = child.sweep(&clock, kill_at).await;
            child.cleanup();
            finish(&watchdog);
            let code = status_code(st);
            tracing::info!(
                event = "exited",
                epoch = lease.epoch,
                "command exited with status {code}"
            );
            if gone {
                elector.release(&lease, cfg.min_hold).await;
            } else {
                tracing::warn!(
                    event = "release_failed",
                    epoch = lease.epoch,
                    "processes the command started survive SIGKILL; the lease is left to expire"
                );
            }
            report.borrow_mut().released();
            code
        }
        End::Lost(lost) => {
            tracing::warn!(
                event = "lost",
                epoch = lease.epoch,
                "lost lease {name}: {}; stopping the command",
                lost.reason
            );
            report.borrow_mut().lost();
            if let Some(w) = watchdog.borrow_mut().as_mut() {
                w.stopping();
            }
            let kill_at = (clock.now() + t.kill_after).min(lost.deadline + t.kill_after);
            let (st, _) = child.stop(&clock, kill_at, &mut signals).await;
            child.cleanup();
            finish(&watchdog);
            tracing::warn!(
                event = "stopped",
                epoch = lease.epoch,
                "command stopped (status {}); exiting 75",
                status_code(st)
            );
            // No release: after a loss the lease is either someone else's
            // or ours only until it expires, at most L - G - K from now, and a
            // store we could not renew with would only delay the exit.
            exit::LOST
        }
        End::Stepped => {
            let term = cfg.max_term.unwrap_or_default();
            tracing::info!(
                event = "max_term",
                epoch = lease.epoch,
                "led {name} for --max-term ({}); stopping the command to hand over",
                humantime::format_duration(term)
            );
            if let Some(w) = watchdog.borrow_mut().as_mut() {
                w.stopping();
            }
            // The stop path of a loss, with the deadlines of the lease we
            // still hold: renewals stop here, so SIGKILL comes no later than
            // the last renewal's G + K, before the lease could pass on.
            let kill_at = (clock.now() + t.kill_after).min(lease.sent + t.give_up + t.kill_after);
            let (st, gone) = child.stop(&clock, kill_at, &mut signals).await;
            child.cleanup();
            finish(&watchdog);
            let released = gone && elector.release(&lease, None).await;
            report.borrow_mut().released();
            let successor = if released {
                // A signal (`systemctl stop`) ends the sit-out at once: the
                // command is gone and the lease released already.
                tokio::select! {
                    s = elector.sit_out(lease.epoch) => s,
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
            // 75, as for a loss: in both cases leaderrun stopped a command
            // that was still running because this process should no longer
            // lead, and the caller should try again later (EX_TEMPFAIL); a
            // unit or script written for 75 needs nothing new. The log
            // events (max_term, stepped_down) tell the two apart.
            exit::LOST
        }
    }
}
