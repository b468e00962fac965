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
use tokio::sync::mpsc::UnboundedReceiver;

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
    /// The watchdog died and no replacement could be started.
    Unguarded,
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
    // Try-once: the watchdog's exec and start-up run while the acquire is
    // in flight (a connect, a round trip); it gets its orders only once the
    // lease is ours. A waiting standby starts it on acquiring instead, so
    // that standbys stay one process each.
    let early = if r.wait {
        None
    } else {
        Watchdog::spawn(&r.name).ok()
    };
    let mut lease = match r
        .elector
        .wait_for_lease(r.wait, r.timeout, &mut signals)
        .await
    {
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

/// Completes when the watchdog dies: its end of the ack pipe closes. Never,
/// without one.
async fn watchdog_gone(w: &Rc<RefCell<Option<Watchdog>>>) {
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
fn replace_watchdog(w: &Rc<RefCell<Option<Watchdog>>>) -> bool {
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

/// What the run form holds from acquiring to exiting.
struct Run {
    name: String,
    holder: String,
    t: Timing,
    clock: BootClock,
    wait: bool,
    timeout: Option<Duration>,
    min_hold: Option<Duration>,
    max_term: Option<Duration>,
    conflict_exit_code: i32,
    command: Vec<OsString>,
    store_arg: Option<String>,
    store_origin: crate::store::Origin,
    log: (u8, bool, bool),
    elector: Elector<AnyStore, BootClock>,
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
        let wakeups = if cfg.push { cfg.store.wakeups() } else { None };
        let extends = cfg.store.capabilities().failover_extends_lease;
        let mut elector = Elector::new(cfg.store, clock, cfg.name.clone(), cfg.holder.clone(), t);
        elector.failover_extends_lease(extends);
        if let Some(w) = wakeups {
            elector.push(w);
        }
        let report = Reporter::new(&cfg.name, cfg.metrics_file.clone()).shared();
        let watchdog: Rc<RefCell<Option<Watchdog>>> = Rc::default();
        elector.observe(Box::new(Observers {
            report: report::Shared(report.clone()),
            watchdog: watchdog.clone(),
            give_up: t.give_up,
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
                let waited = self.timeout.unwrap_or_default();
                tracing::warn!(
                    event = "timeout",
                    "--timeout ({}) passed without leading {name}",
                    humantime::format_duration(waited)
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

    /// The second guard starts before the command does: from the command's
    /// first instant, either process stops it on time (docs/contract.md §10).
    /// Err is the exit status: the command must not start.
    async fn arm_watchdog(&mut self, lease: &Lease, early: Option<Watchdog>) -> Result<(), i32> {
        let t = self.t;
        let orders = Orders {
            store: self.store_arg.clone(),
            origin: self.store_origin,
            name: self.name.clone(),
            holder: self.holder.clone(),
            epoch: lease.epoch,
            lease: t.lease,
            renew: t.renew,
            give_up: t.give_up,
            kill_after: t.kill_after,
            retry: t.retry,
            min_hold: self.min_hold,
            acquired_at: lease.acquired_at,
            deadline: lease.sent + t.give_up,
            verbose: self.log.0,
            quiet: self.log.1,
            json: self.log.2,
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
                tracing::error!(
                    event = "watchdog_failed",
                    "cannot start the watchdog ({e}); not running the command"
                );
                self.elector.release(lease, None).await;
                Err(exit::FAILURE)
            }
        }
    }

    /// Whether a watchdog is alive and holds its orders, replacing a dead
    /// one if need be.
    fn ensure_watchdog(&self) -> bool {
        let alive = self.watchdog.borrow().as_ref().is_some_and(Watchdog::alive);
        alive || replace_watchdog(&self.watchdog)
    }

    /// The watchdog's work is over: everything the command started is gone.
    /// It is told so now, and reaped when the run ends (Drop of `Watchdog`),
    /// so that its exit overlaps the release's round trip.
    fn finish_watchdog(&self) {
        if let Some(mut w) = self.watchdog.borrow_mut().take() {
            w.done();
            *self.leaving.borrow_mut() = Some(w);
        }
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
        if self.clock.now() >= lease.sent + self.t.give_up {
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
        let place = supervisor::Placement {
            cgroup: Cgroup::create(&format!("leaderrun-{}", std::process::id())),
            terminal: Terminal::attached(),
            skip: self.watchdog.borrow().as_ref().and_then(Watchdog::pid),
            keep_hup_ignored: hup_ignored,
            token,
        };
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.spawning(place.cgroup.as_ref());
        }
        let child = match supervisor::spawn(&self.command, file, &env, place) {
            Ok(c) => c,
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
        let hold = self.elector.hold(lease);
        tokio::pin!(hold);
        loop {
            tokio::select! {
                biased;
                lost = &mut hold => return End::Lost(lost),
                _ = watchdog_gone(&watchdog) => {
                    if !replace_watchdog(&watchdog) {
                        return End::Unguarded;
                    }
                    child.set_skip(watchdog.borrow().as_ref().and_then(Watchdog::pid));
                }
                _ = async {
                    match step_down {
                        Some(at) => clock.sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => return End::Stepped,
                st = child.wait() => return End::Exited(st),
                Some(sig) = signals.recv() => {
                    tracing::info!(event = "signal", "passing {sig} to the command's process group");
                    child.signal(sig);
                }
            }
        }
    }

    /// The command exited: anything it left behind dies before the lease
    /// could pass on (the same G + K arithmetic as a loss), then release.
    async fn after_exit(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        st: ExitStatus,
    ) -> i32 {
        let (t, clock) = (self.t, self.clock);
        let kill_at = (clock.now() + t.kill_after).min(lease.sent + t.give_up + t.kill_after);
        let gone = child.sweep(&clock, kill_at).await;
        child.cleanup();
        self.finish_watchdog();
        let code = status_code(st);
        tracing::info!(
            event = "exited",
            epoch = lease.epoch,
            "command exited with status {code}"
        );
        if gone {
            self.elector.release(lease, self.min_hold).await;
        } else {
            tracing::warn!(
                event = "release_failed",
                epoch = lease.epoch,
                "processes the command started survive SIGKILL; the lease is left to expire"
            );
        }
        self.report.borrow_mut().released();
        code
    }

    /// The lease was lost: stop everything, exit 75. Once all of it is gone
    /// the lease is handed back at our epoch, unless someone else already
    /// holds it: after a loss to the store's silence the store may still
    /// hold it for us (until `sent + L`, and on etcd, whose leader change
    /// re-extends every lease, up to a whole lease longer), and the next
    /// holder should start when the store answers again, not then.
    async fn after_loss(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        lost: Lost,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> i32 {
        tracing::warn!(
            event = "lost",
            epoch = lease.epoch,
            "lost lease {}: {}; stopping the command",
            self.name,
            lost.reason
        );
        self.report.borrow_mut().lost();
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.stopping();
        }
        let (t, clock) = (self.t, self.clock);
        let kill_at = (clock.now() + t.kill_after).min(lost.deadline + t.kill_after);
        let (st, gone) = child.stop(&clock, kill_at, signals).await;
        child.cleanup();
        self.finish_watchdog();
        tracing::warn!(
            event = "stopped",
            epoch = lease.epoch,
            "command stopped (status {}); exiting 75",
            status_code(st)
        );
        if gone && lost.reason != crate::elector::LossReason::Superseded {
            self.elector.release_after_loss(lease).await;
        }
        exit::LOST
    }

    /// The watchdog died and no other could be started: the command must
    /// not run with one guard. Stop it as on a loss, release, exit 75.
    async fn after_unguarded(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> i32 {
        tracing::warn!(
            event = "lost",
            epoch = lease.epoch,
            "the command would run with one guard only (the watchdog died and none could \
             be started); stopping it"
        );
        self.report.borrow_mut().lost();
        let (t, clock) = (self.t, self.clock);
        let kill_at = (clock.now() + t.kill_after).min(lease.sent + t.give_up + t.kill_after);
        let (st, gone) = child.stop(&clock, kill_at, signals).await;
        child.cleanup();
        self.finish_watchdog();
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
        exit::LOST
    }

    /// `--max-term` passed: stop the command as on a loss, release, and sit
    /// out until a rival leads (or the lease would have expired).
    async fn after_term(
        &mut self,
        lease: &Lease,
        child: &mut supervisor::Child,
        signals: &mut UnboundedReceiver<nix::sys::signal::Signal>,
    ) -> i32 {
        let name = self.name.clone();
        let term = self.max_term.unwrap_or_default();
        tracing::info!(
            event = "max_term",
            epoch = lease.epoch,
            "led {name} for --max-term ({}); stopping the command to hand over",
            humantime::format_duration(term)
        );
        if let Some(w) = self.watchdog.borrow_mut().as_mut() {
            w.stopping();
        }
        // The stop path of a loss, with the deadlines of the lease we still
        // hold: renewals stop here, so SIGKILL comes no later than the last
        // renewal's G + K, before the lease could pass on.
        let (t, clock) = (self.t, self.clock);
        let kill_at = (clock.now() + t.kill_after).min(lease.sent + t.give_up + t.kill_after);
        let (st, gone) = child.stop(&clock, kill_at, signals).await;
        child.cleanup();
        self.finish_watchdog();
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
        exit::LOST
    }
}
