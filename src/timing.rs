//! The five durations of the safety contract and the relations between them.
//!
//! `L` lease, `R` renew interval, `G` give-up, `K` kill-after, `P` retry.
//! The holder counts `G` from the moment it *sent* its last successful
//! renewal; the store counts `L` from the moment it *executed* it, which is
//! later. So `G + K < L` is exactly what makes the child dead (SIGKILL sent)
//! before the store would let any rival acquire. `R < G` leaves at least one
//! retry of the renewal before giving up.

use std::fmt;
use std::time::Duration;

/// Validated timing configuration. Construct with [`Timing::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub lease: Duration,
    pub renew: Duration,
    pub give_up: Duration,
    pub kill_after: Duration,
    pub retry: Duration,
}

/// What the user asked for; `None` means "use the default".
#[derive(Debug, Clone, Copy, Default)]
pub struct TimingArgs {
    pub lease: Option<Duration>,
    pub renew: Option<Duration>,
    pub give_up: Option<Duration>,
    pub kill_after: Option<Duration>,
    pub retry: Option<Duration>,
}

pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);
pub const DEFAULT_RETRY: Duration = Duration::from_secs(2);
/// Leases longer than this are refused: a holder that needs a day of grace
/// has a different problem, and the bound keeps every sum far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A violated relation, worded for the person who typed the flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TimingError(String);

struct Show(Duration);
impl fmt::Display for Show {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Timing {
    /// Fill in defaults (derived from whatever the user did give) and check
    /// `0 < R < G`, `G + K < L`, `P > 0`.
    pub fn resolve(a: TimingArgs) -> Result<Timing, TimingError> {
        let lease = a.lease.unwrap_or(DEFAULT_LEASE);
        if lease.is_zero() {
            return Err(TimingError("--lease must be longer than zero".into()));
        }
        for (flag, d) in [
            ("--lease", Some(lease)),
            ("--renew", a.renew),
            ("--give-up", a.give_up),
            ("--kill-after", a.kill_after),
            ("--retry", a.retry),
        ] {
            if let Some(d) = d {
                if d > MAX_DURATION {
                    return Err(TimingError(format!(
                        "{flag} ({}) is longer than the maximum ({})",
                        Show(d),
                        Show(MAX_DURATION)
                    )));
                }
            }
        }
        let give_up = a.give_up.unwrap_or(lease * 2 / 3);
        let renew = a.renew.unwrap_or(lease / 3);
        let kill_after = a
            .kill_after
            .unwrap_or_else(|| lease.saturating_sub(give_up) / 2);
        let retry = a.retry.unwrap_or(DEFAULT_RETRY);

        if renew.is_zero() {
            return Err(TimingError("--renew must be longer than zero".into()));
        }
        if give_up >= lease {
            return Err(TimingError(format!(
                "--give-up ({}) must be shorter than --lease ({})",
                Show(give_up),
                Show(lease)
            )));
        }
        if renew >= give_up {
            return Err(TimingError(format!(
                "--renew ({}) must be shorter than --give-up ({})",
                Show(renew),
                Show(give_up)
            )));
        }
        if give_up + kill_after >= lease {
            return Err(TimingError(format!(
                "--give-up ({}) plus --kill-after ({}) must be shorter than --lease ({})",
                Show(give_up),
                Show(kill_after),
                Show(lease)
            )));
        }
        if retry.is_zero() {
            return Err(TimingError("--retry must be longer than zero".into()));
        }
        Ok(Timing {
            lease,
            renew,
            give_up,
            kill_after,
            retry,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Option<Duration> {
        Some(Duration::from_secs(x))
    }
    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn defaults_follow_the_lease() {
        let t = Timing::resolve(TimingArgs::default()).unwrap();
        assert_eq!(t.lease, ms(15_000));
        assert_eq!(t.renew, ms(5_000));
        assert_eq!(t.give_up, ms(10_000));
        assert_eq!(t.kill_after, ms(2_500));
        assert_eq!(t.retry, ms(2_000));

        let t = Timing::resolve(TimingArgs {
            lease: s(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (t.renew, t.give_up, t.kill_after),
            (ms(1000), ms(2000), ms(500))
        );
    }

    #[test]
    fn kill_after_default_uses_the_given_give_up() {
        let t = Timing::resolve(TimingArgs {
            lease: s(10),
            give_up: s(6),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(t.kill_after, ms(2000));
    }

    #[test]
    fn every_relation_is_refused_with_its_values() {
        let cases = [
            (
                TimingArgs {
                    lease: s(5),
                    give_up: s(6),
                    ..Default::default()
                },
                "--give-up (6s) must be shorter than --lease (5s)",
            ),
            (
                TimingArgs {
                    lease: s(15),
                    renew: s(10),
                    ..Default::default()
                },
                "--renew (10s) must be shorter than --give-up (10s)",
            ),
            (
                TimingArgs {
                    lease: s(15),
                    kill_after: s(5),
                    ..Default::default()
                },
                "--give-up (10s) plus --kill-after (5s) must be shorter than --lease (15s)",
            ),
            (
                TimingArgs {
                    renew: Some(Duration::ZERO),
                    ..Default::default()
                },
                "--renew must be longer than zero",
            ),
            (
                TimingArgs {
                    retry: Some(Duration::ZERO),
                    ..Default::default()
                },
                "--retry must be longer than zero",
            ),
            (
                TimingArgs {
                    lease: Some(Duration::ZERO),
                    ..Default::default()
                },
                "--lease must be longer than zero",
            ),
        ];
        for (args, want) in cases {
            assert_eq!(Timing::resolve(args).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn absurd_durations_are_refused_not_overflowed() {
        let e = Timing::resolve(TimingArgs {
            lease: Some(Duration::from_secs(u64::MAX / 2)),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("--lease"), "{e}");
    }
}
