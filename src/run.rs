//! The run form: wait for the lease, run the child while leading, map the
//! outcome to an exit status. This is the only place where the elector (the
//! lease) and the supervisor (the process) meet.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use crate::cli::{one_line_error, Cli, Common, RunArgs};
use crate::clock::{BootClock, Clock};
use crate::elector::{describe_held, Elector, Lost, Waited};
use crate::report::{self, Reporter};
use crate::store::{AnyStore, StoreAdmin};
use crate::supervisor::{self, status_code};
use crate::timing::{Timing, TimingArgs};
use crate::{exit, logging, names, signals};

/// Everything the run form needs, validated.
pub struct RunConfig {
    pub name: String,
    pub holder: String,
    pub timing: Timing,
    pub store: AnyStore,
    pub wait: bool,
    pub timeout: Option<Duration>,
    pub min_hold: Option<Duration>,
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
            common.store,
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
        if run.command.first().is_none_or(|c| c.is_empty()) {
            return Err("the command after -- must not be empty".into());
        }
        Ok(RunConfig {
            holder: run.holder.unwrap_or_else(names::default_holder),
            name,
            timing,
            store,
            wait: run.wait,
            timeout: run.timeout,
            min_hold: run.min_hold,
            conflict_exit_code: i32::from(run.conflict_exit_code),
            command: run.command,
            metrics_file: run.metrics_file,
        })
    }
}

/// Parse the command line, run, and return the exit status.
pub fn main_entry() -> i32 {
    let cli = match crate::cli::parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if matches!(e.kind(), DisplayHelp | DisplayVersion) {
                let _ = e.print();
                return 0;
            }
            eprintln!("leaderrun: {}", one_line_error(&e));
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
            eprintln!("leaderrun: error: cannot start the runtime: {e}");
            return exit::FAILURE;
        }
    };
    if let Some(cmd) = admin {
        return rt.block_on(crate::admin::run(cmd, common));
    }
    let cfg = match RunConfig::from_cli(common, run_args) {
        Ok(c) => c,
        Err(r) => {
            eprintln!("leaderrun: error: {}", r.msg);
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
}

pub async fn run(cfg: RunConfig) -> i32 {
    let mut signals = match signals::listen() {
        Ok(rx) => rx,
        Err(e) => {
            tracing::error!(
                event = "startup_failed",
                "cannot install signal handlers: {e}"
            );
            return exit::FAILURE;
        }
    };
    if let Err(e) = supervisor::check_command(&cfg.command) {
        tracing::error!(event = "spawn_failed", "{e}");
        return e.exit_code();
    }
    let clock = BootClock;
    let t = cfg.timing;
    let name = cfg.name.clone();
    tracing::info!(
        event = "store",
        "store {}; holder {}",
        cfg.store.describe(),
        cfg.holder
    );
    let mut elector = Elector::new(cfg.store, clock, cfg.name, cfg.holder.clone(), t);
    let report = Reporter::new(&name, cfg.metrics_file.clone()).shared();
    elector.observe(Box::new(report::Shared(report.clone())));
    report.borrow_mut().starting();

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
        return exit::LOST;
    }
    let mut child = match supervisor::spawn(&cfg.command, &env) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(event = "spawn_failed", "{e}");
            elector.release(&lease, None).await;
            return e.exit_code();
        }
    };
    tracing::debug!(event = "started", pid = child.pid(), "started the command");

    let end = {
        let hold = elector.hold(&mut lease);
        tokio::pin!(hold);
        loop {
            tokio::select! {
                biased;
                lost = &mut hold => break End::Lost(lost),
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
            // Anything the child left in its group dies before the lease
            // could pass on: the same G + K arithmetic as a loss.
            let kill_at = (clock.now() + t.kill_after).min(lease.sent + t.give_up + t.kill_after);
            child.sweep_group(&clock, kill_at).await;
            let code = status_code(st);
            tracing::info!(
                event = "exited",
                epoch = lease.epoch,
                "command exited with status {code}"
            );
            elector.release(&lease, cfg.min_hold).await;
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
            let kill_at = (clock.now() + t.kill_after).min(lost.deadline + t.kill_after);
            let st = child.stop(&clock, kill_at, &mut signals).await;
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
    }
}
