//! The run form's command line, checked: everything [`super::run`] needs.

use std::ffi::OsString;
use std::time::Duration;

use crate::cli::{Common, RunArgs};
use crate::duration::{show, DurationArg};
use crate::exit;
use crate::names;
use crate::redact::Secret;
use crate::store::{AnyStore, StoreAdmin};
use crate::timing::{Timing, TimingArgs};

/// Everything the run form needs, validated.
pub struct RunConfig {
    /// `--store` as given, for the watchdog (which resolves it the same way).
    pub store_arg: Option<Secret>,
    pub store_origin: crate::store::Origin,
    pub log: crate::logging::Settings,
    pub name: String,
    pub holder: String,
    pub timing: Timing,
    pub store: AnyStore,
    pub wait: bool,
    /// As typed: the message when it passes quotes it.
    pub timeout: Option<DurationArg>,
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
        let timing = Timing::resolve(args.clone()).map_err(|e| e.to_string())?;
        let name = run.name.ok_or("--name is required")?;
        let store = crate::store::resolve(
            common.store.clone().map(Secret::into_exposed),
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
                lease: Some(granted.into()),
                ..args
            })
            .map_err(|e| format!("{e} (the store grants a lease of {})", show(granted)))?
        };
        let min_hold = run.min_hold.as_ref().map(DurationArg::value);
        let max_term = run.max_term.as_ref().map(DurationArg::value);
        if let Some(m) = max_term {
            if m.is_zero() {
                return Err("--max-term must be longer than 0".into());
            }
            // Stepping down releases at once; a keep that outlasts the term
            // would hold the lease against the very rival it steps down for.
            if min_hold.is_some_and(|h| h >= m) {
                return Err("--min-hold must be shorter than --max-term".into());
            }
        }
        if run.wait && run.timeout.as_ref().is_some_and(|t| t.value().is_zero()) {
            // It would give up before its first attempt, even on a free
            // lease; trying once is what leaving out --wait does.
            return Err(
                "--timeout 0s gives up before the first attempt; leave out --wait to try once"
                    .into(),
            );
        }
        if run.command.first().is_none_or(|c| c.is_empty()) {
            return Err("the command after -- must not be empty".into());
        }
        Ok(RunConfig {
            log: common.log(),
            store_arg: common.store,
            store_origin: common.store_origin,
            holder: run.holder.unwrap_or_else(names::default_holder),
            name,
            timing,
            store,
            wait: run.wait,
            timeout: run.timeout,
            min_hold,
            max_term,
            push: !run.no_push,
            conflict_exit_code: i32::from(run.conflict_exit_code),
            command: run.command,
            metrics_file: run.metrics_file,
        })
    }
}
