//! The run form's command line, checked: everything [`super::run`] needs.

use std::ffi::OsString;
use std::time::Duration;

use crate::cli::{Common, RunArgs};
use crate::duration::{show, DurationArg};
use crate::error::Error;
use crate::names;
use crate::redact::Secret;
use crate::store::{Period, Store};
use crate::timing::{Timing, TimingArgs};

/// Everything the run form needs, validated: the store, and the job.
pub struct RunConfig {
    pub store: Store,
    pub job: Job,
}

/// What to run and how: everything but the store, kept whole by the run
/// (src/run/mod.rs) from start to exit.
pub struct Job {
    /// `--store` as given, for the watchdog (which resolves it the same way).
    pub store_arg: Option<Secret>,
    pub store_origin: crate::store::Origin,
    pub log: crate::logging::Settings,
    pub name: String,
    pub holder: String,
    pub timing: Timing,
    pub wait: bool,
    /// As typed: the message when it passes quotes it.
    pub timeout: Option<DurationArg>,
    pub min_hold: Option<Duration>,
    pub max_term: Option<Duration>,
    /// `--once-per`, as typed (messages quote it), and the rule: its half
    /// (the window) and `--retry-failed`.
    pub once_per: Option<(DurationArg, Period)>,
    /// `--advertise`: stored with the lease while it is held.
    pub advertise: Option<String>,
    /// `--slots`, where given: up to N holders, each in a slot of its own.
    pub slots: Option<u32>,
    /// Use the store's push wake-ups while waiting (not `--no-push`).
    pub push: bool,
    pub conflict_exit_code: i32,
    pub command: Vec<OsString>,
    pub metrics_file: Option<std::path::PathBuf>,
}

impl RunConfig {
    pub fn from_cli(common: Common, run: RunArgs) -> Result<RunConfig, Error> {
        let args = TimingArgs {
            lease: run.lease,
            renew: run.renew,
            give_up: run.give_up,
            kill_after: run.kill_after,
            retry: run.retry,
        };
        let timing = Timing::resolve(args.clone()).map_err(usage)?;
        let name = run.name.ok_or_else(|| usage("--name is required"))?;
        let store = crate::store::resolve(
            common.store.clone().map(Secret::into_exposed),
            common.store_origin,
            &format!("leaderrun {name}"),
            timing.give_up,
        )?;
        // The timing must hold for the lease the store really grants (a
        // store with whole-second leases rounds up), not the one asked for.
        let granted = store.capabilities().grant(timing.lease).map_err(usage)?;
        let timing = if granted == timing.lease {
            timing
        } else {
            Timing::resolve(TimingArgs {
                lease: Some(granted.into()),
                ..args
            })
            .map_err(|e| {
                usage(format!(
                    "{e} (the store grants a lease of {})",
                    show(granted)
                ))
            })?
        };
        let min_hold = run.min_hold.as_ref().map(DurationArg::value);
        let max_term = run.max_term.as_ref().map(DurationArg::value);
        if let Some(m) = max_term {
            if m.is_zero() {
                return Err(usage("--max-term must be longer than 0"));
            }
            // Stepping down releases at once; a keep that outlasts the term
            // would hold the lease against the very rival it steps down for.
            if min_hold.is_some_and(|h| h >= m) {
                return Err(usage("--min-hold must be shorter than --max-term"));
            }
        }
        if run.wait && run.timeout.as_ref().is_some_and(|t| t.value().is_zero()) {
            // It would give up before its first attempt, even on a free
            // lease; trying once is what leaving out --wait does.
            return Err(usage(
                "--timeout 0s gives up before the first attempt; leave out --wait to try once",
            ));
        }
        let once_per = match run.once_per {
            Some(p) => {
                let (p, half) = once_per(p, run.wait, &store)?;
                Some((
                    p,
                    Period {
                        half,
                        retry_failed: run.retry_failed,
                    },
                ))
            }
            // Without a period there is no run to retry: refused rather
            // than ignored, since it would never do what it says.
            None if run.retry_failed => {
                return Err(usage(
                    "--retry-failed needs --once-per: it retries a period's failed run",
                ))
            }
            None => None,
        };
        if run.retry_failed && !store.retry_failed() {
            return Err(usage(format!(
                "--retry-failed is not supported on the {} store yet",
                store.kind()
            )));
        }
        if run.advertise.is_some() && !store.advertises() {
            return Err(usage(format!(
                "--advertise is not supported on the {} store yet",
                store.kind()
            )));
        }
        if run.slots.is_some_and(|n| n > 1) {
            if once_per.is_some() {
                return Err(usage(
                    "--slots with --once-per: a period has one run, not one per slot",
                ));
            }
            // Every slot's lease name must be a lease name a store takes.
            let last = crate::names::slot_name(&name, run.slots.unwrap_or(1) - 1);
            if last.len() > crate::names::MAX_NAME {
                return Err(usage(format!(
                    "lease name {name} is {} characters long: with --slots {} its last slot's \
                     lease, {last}, would be {}, and at most {} are allowed",
                    name.len(),
                    run.slots.unwrap_or(1),
                    last.len(),
                    crate::names::MAX_NAME
                )));
            }
            if !store.slots() {
                return Err(usage(format!(
                    "--slots is not supported on the {} store yet",
                    store.kind()
                )));
            }
        }
        if run.command.first().is_none_or(|c| c.is_empty()) {
            return Err(usage("the command after -- must not be empty"));
        }
        let job = Job {
            log: common.log(),
            store_arg: common.store,
            store_origin: common.store_origin,
            holder: run.holder.unwrap_or_else(names::default_holder),
            name,
            timing,
            wait: run.wait,
            timeout: run.timeout,
            min_hold,
            max_term,
            once_per,
            advertise: run.advertise,
            slots: run.slots,
            push: !run.no_push,
            conflict_exit_code: i32::from(run.conflict_exit_code),
            command: run.command,
            metrics_file: run.metrics_file,
        };
        Ok(RunConfig { store, job })
    }
}

/// `--once-per`, checked before anything runs: its range, no `--wait`, and
/// a store that keeps the rule (the others refuse it until they do).
fn once_per(
    period: DurationArg,
    wait: bool,
    store: &Store,
) -> Result<(DurationArg, Duration), Error> {
    let half = crate::timing::once_per_half(&period).map_err(usage)?;
    if wait {
        return Err(usage(
            "--once-per cannot be used with --wait: a standby has no firing",
        ));
    }
    if !store.once_per() {
        return Err(usage(format!(
            "--once-per is not supported on the {} store yet",
            store.kind()
        )));
    }
    // A store that keeps the period as a lease of its own in whole units
    // (etcd: seconds, at least 2) must keep exactly DUR/2: a rounded one
    // would move the rule's boundary. Millisecond stores keep any DUR.
    let caps = store.capabilities();
    let unit = caps.granularity;
    if unit > Duration::from_millis(1)
        && (period.value().as_nanos() % (2 * unit.as_nanos()) != 0 || half < caps.min_lease)
    {
        return Err(usage(format!(
            "--once-per ({period}) on the {} store must be a multiple of {} and at least {}: the \
             store keeps the period as a lease of half of it, granted in multiples of {} of at \
             least {}",
            store.kind(),
            show(2 * unit),
            show(2 * caps.min_lease),
            show(unit),
            show(caps.min_lease),
        )));
    }
    Ok((period, half))
}

/// A refusal of the command line, in its own words.
fn usage(msg: impl ToString) -> Error {
    Error::Usage(msg.to_string())
}
