//! The run form: wait for the lease, run the child while leading, map the
//! outcome to an exit status. This is the only place where the elector (the
//! lease) and the supervisor (the process) meet.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Parser;

use crate::cli::{one_line_error, Cli};
use crate::clock::{BootClock, Clock};
use crate::elector::{describe_held, Elector, Lost, Waited};
use crate::store::{AnyStore, StoreUrl};
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
}

impl RunConfig {
    /// Usage errors come back as one line of text (exit 2).
    pub fn from_cli(cli: Cli) -> Result<RunConfig, String> {
        let timing = Timing::resolve(TimingArgs {
            lease: cli.lease,
            renew: cli.renew,
            give_up: cli.give_up,
            kill_after: cli.kill_after,
            retry: cli.retry,
        })
        .map_err(|e| e.to_string())?;
        let url = cli
            .store
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()));
        let url = match url {
            Some(u) => StoreUrl::parse(&u).map_err(|e| e.to_string())?,
            None => StoreUrl::Sqlite(crate::store::sqlite::default_path()?),
        };
        let mut app_name = format!("leaderrun {}", cli.name);
        app_name.truncate(63);
        let store = AnyStore::open(&url, &app_name, timing.give_up)?;
        if cli.command.first().is_none_or(|c| c.is_empty()) {
            return Err("the command after -- must not be empty".into());
        }
        Ok(RunConfig {
            name: cli.name,
            holder: cli.holder.unwrap_or_else(names::default_holder),
            timing,
            store,
            wait: cli.wait,
            timeout: cli.timeout,
            min_hold: cli.min_hold,
            conflict_exit_code: i32::from(cli.conflict_exit_code),
            command: cli.command,
        })
    }
}

/// Parse the command line, run, and return the exit status.
pub fn main_entry() -> i32 {
    let cli = match Cli::try_parse() {
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
    logging::init(cli.verbose, cli.quiet);
    let cfg = match RunConfig::from_cli(cli) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("leaderrun: error: {msg}");
            return exit::USAGE;
        }
    };
    // One thread: the child's parent-death signal is tied to the thread that
    // spawned it (see supervisor.rs), and the main thread lives longest.
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
            tracing::error!("cannot install signal handlers: {e}");
            return exit::FAILURE;
        }
    };
    if let Err(e) = supervisor::check_command(&cfg.command) {
        tracing::error!("{e}");
        return e.exit_code();
    }
    let clock = BootClock;
    let t = cfg.timing;
    let name = cfg.name.clone();
    tracing::info!("store {}; holder {}", cfg.store.describe(), cfg.holder);
    let mut elector = Elector::new(cfg.store, clock, cfg.name, cfg.holder.clone(), t);

    let mut lease = match elector
        .wait_for_lease(cfg.wait, cfg.timeout, &mut signals)
        .await
    {
        Waited::Acquired(l) => l,
        Waited::Held(info) => {
            match info {
                Some(i) => tracing::info!("{}; not running the command", describe_held(&i)),
                None => tracing::info!("lease {name} is held elsewhere; not running the command"),
            }
            return cfg.conflict_exit_code;
        }
        Waited::TimedOut => {
            let waited = cfg.timeout.unwrap_or_default();
            tracing::warn!(
                "--timeout ({}) passed without leading {name}",
                humantime::format_duration(waited)
            );
            return exit::TIMEOUT;
        }
        Waited::Interrupted(sig) => {
            tracing::info!("{sig} while waiting for lease {name}; the command was not started");
            return exit::for_signal(sig as i32);
        }
        Waited::Failed(e) => {
            tracing::error!("{e}");
            return exit::FAILURE;
        }
    };
    tracing::info!(epoch = lease.epoch, holder = %cfg.holder, "acquired lease {name}");

    let env = [
        ("LEASE_EPOCH", lease.epoch.to_string()),
        ("LEASE_NAME", name.clone()),
        ("LEASE_HOLDER", cfg.holder.clone()),
    ];
    let mut child = match supervisor::spawn(&cfg.command, &env) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            elector.release(&lease, None).await;
            return e.exit_code();
        }
    };
    tracing::debug!(pid = child.pid(), "started the command");

    let end = {
        let hold = elector.hold(&mut lease);
        tokio::pin!(hold);
        loop {
            tokio::select! {
                biased;
                lost = &mut hold => break End::Lost(lost),
                st = child.wait() => break End::Exited(st),
                Some(sig) = signals.recv() => {
                    tracing::info!("passing {sig} to the command's process group");
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
            tracing::info!(epoch = lease.epoch, "command exited with status {code}");
            elector.release(&lease, cfg.min_hold).await;
            code
        }
        End::Lost(lost) => {
            tracing::warn!(
                epoch = lease.epoch,
                "lost lease {name}: {}; stopping the command",
                lost.reason
            );
            let kill_at = (clock.now() + t.kill_after).min(lost.deadline + t.kill_after);
            let st = child.stop(&clock, kill_at, &mut signals).await;
            tracing::warn!(
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
