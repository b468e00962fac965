//! The five durations of the safety contract and the relations between them.
//!
//! `L` lease, `R` renew interval, `G` give-up, `K` kill-after, `P` retry.
//! The holder counts `G` from the moment it *sent* its last successful
//! renewal; the store counts `L` from the moment it *executed* it, which is
//! later. So `G + K < L` is exactly what makes the child dead (SIGKILL sent)
//! before the store would let any rival acquire. `R < G` leaves room to
//! retry a renewal before giving up; `G - R >= 100ms` makes that room big
//! enough for several retries whatever `L` is (see [`Timing::renew_retry`]).
//!
//! The defaults, and each value's role:
//!
//! | | default | role |
//! |---|---|---|
//! | `L` | 15s | what the store grants per acquire/renew, by its own clock |
//! | `R` | `L/3` | a renewal is sent `R` after the last successful one was sent |
//! | `G` | `2L/3` | no successful renewal sent within `G`: SIGTERM to the command |
//! | `K` | `(L-G)/2` | `K` after SIGTERM: SIGKILL; `G + K < L` is required |
//! | `P` | 2s | a waiting contender's poll interval; caps the renewal retry |

use std::time::Duration;

use crate::duration::{show, DurationArg};

/// Validated timing configuration. Construct with [`Timing::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub lease: Duration,
    pub renew: Duration,
    pub give_up: Duration,
    pub kill_after: Duration,
    pub retry: Duration,
}

/// What the user asked for; `None` means "use the default". A value typed
/// on the command line keeps its text, so that a refusal quotes it.
#[derive(Debug, Clone, Default)]
pub struct TimingArgs {
    pub lease: Option<DurationArg>,
    pub renew: Option<DurationArg>,
    pub give_up: Option<DurationArg>,
    pub kill_after: Option<DurationArg>,
    pub retry: Option<DurationArg>,
}

pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);
pub const DEFAULT_RETRY: Duration = Duration::from_secs(2);
/// Leases longer than this are refused: a holder that needs a day of grace
/// has a different problem, and the bound keeps every sum far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Every duration flag (`--timeout`, `--min-hold` included) is refused past
/// this, so no sum on the boot clock and no value written to a store can
/// overflow, whatever is typed.
pub const MAX_ANY_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// The least room between `R` and `G`: after a failed renewal one retry goes
/// out at once and the rest every `(G - R)/4` at most, so this leaves four
/// or more attempts of at least 25 ms each.
pub const MIN_RETRY_ROOM: Duration = Duration::from_millis(100);
/// A store call is never abandoned sooner than this.
pub const MIN_CALL: Duration = Duration::from_millis(50);
/// The shortest poll: a waiting contender's attempt costs about a
/// millisecond of CPU on the embedded store, so polling no faster than
/// this keeps a waiter at a few percent of a core at worst (a `--retry
/// 1ns` would spin one at 100 %).
pub const MIN_RETRY: Duration = Duration::from_millis(50);

/// The shortest `--once-per`: a period every store can measure (etcd's
/// TTLs are whole seconds, at least 2 s), and one whose half is still far
/// above a store's round trip.
pub const MIN_ONCE_PER: Duration = Duration::from_secs(2);

/// `--once-per`'s half period, the window of the rule (a firing runs unless
/// a run started less than this long ago): the period checked from 2 s to a
/// year (`parse_duration` refuses longer), with the reason otherwise.
pub fn once_per_half(period: &DurationArg) -> Result<Duration, String> {
    if period.value() < MIN_ONCE_PER {
        return Err(format!(
            "--once-per ({period}) must be at least {}: a run is skipped when one started less              than half the period ago, by the store's clock",
            show(MIN_ONCE_PER)
        ));
    }
    Ok(period.value() / 2)
}

/// A violated relation, worded for the person who typed the flags: each
/// value as typed, or as computed when it is a default.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error("{flag} must be longer than zero")]
    Zero { flag: &'static str },
    #[error("{flag} ({value}) is longer than the maximum ({})", show(MAX_DURATION))]
    TooLong {
        flag: &'static str,
        value: DurationArg,
    },
    #[error("--give-up ({give_up}) must be shorter than --lease ({lease})")]
    GiveUpPastLease {
        give_up: DurationArg,
        lease: DurationArg,
    },
    #[error("--renew ({renew}) must be shorter than --give-up ({give_up})")]
    RenewPastGiveUp {
        renew: DurationArg,
        give_up: DurationArg,
    },
    #[error(
        "--give-up ({give_up}) must be at least {} longer than --renew ({renew}), \
         so that a failed renewal can be retried before giving up",
        show(MIN_RETRY_ROOM)
    )]
    NoRoomToRetry {
        give_up: DurationArg,
        renew: DurationArg,
    },
    #[error("--give-up ({give_up}) plus --kill-after ({kill_after}) must be shorter than --lease ({lease})")]
    KillPastLease {
        give_up: DurationArg,
        kill_after: DurationArg,
        lease: DurationArg,
    },
    #[error(
        "--retry ({retry}) must be at least {}, so that a waiting contender does not busy a core",
        show(MIN_RETRY)
    )]
    RetryTooShort { retry: DurationArg },
}

impl Timing {
    /// Fill in defaults (derived from whatever the user did give) and check
    /// `0 < R < G`, `G − R ≥ 100ms`, `G + K < L`, `P ≥ 50ms`.
    pub fn resolve(a: TimingArgs) -> Result<Timing, TimingError> {
        let lease = a.lease.unwrap_or_else(|| DEFAULT_LEASE.into());
        let l = lease.value();
        if l.is_zero() {
            return Err(TimingError::Zero { flag: "--lease" });
        }
        for (flag, d) in [
            ("--lease", Some(&lease)),
            ("--renew", a.renew.as_ref()),
            ("--give-up", a.give_up.as_ref()),
            ("--kill-after", a.kill_after.as_ref()),
            ("--retry", a.retry.as_ref()),
        ] {
            if let Some(d) = d.filter(|d| d.value() > MAX_DURATION) {
                return Err(TimingError::TooLong {
                    flag,
                    value: d.clone(),
                });
            }
        }
        let give_up = a.give_up.unwrap_or_else(|| (l * 2 / 3).into());
        let renew = a.renew.unwrap_or_else(|| (l / 3).into());
        let kill_after = a
            .kill_after
            .unwrap_or_else(|| (l.saturating_sub(give_up.value()) / 2).into());
        let retry = a.retry.unwrap_or_else(|| DEFAULT_RETRY.into());
        let (r, g, k, p) = (
            renew.value(),
            give_up.value(),
            kill_after.value(),
            retry.value(),
        );

        if r.is_zero() {
            return Err(TimingError::Zero { flag: "--renew" });
        }
        if g >= l {
            return Err(TimingError::GiveUpPastLease { give_up, lease });
        }
        if r >= g {
            return Err(TimingError::RenewPastGiveUp { renew, give_up });
        }
        if g - r < MIN_RETRY_ROOM {
            return Err(TimingError::NoRoomToRetry { give_up, renew });
        }
        if g + k >= l {
            return Err(TimingError::KillPastLease {
                give_up,
                kill_after,
                lease,
            });
        }
        if p < MIN_RETRY {
            return Err(TimingError::RetryTooShort { retry });
        }
        Ok(Timing {
            lease: l,
            renew: r,
            give_up: g,
            kill_after: k,
            retry: p,
        })
    }
}

impl Timing {
    /// The pause between renewal retries after the first one (which goes
    /// out at once, on a fresh connection): short enough that four fit
    /// between `R` and `G`, so a blip (a database restart, a failover) that
    /// heals before `G` is ridden out, and never longer than `P` or `R`.
    pub fn renew_retry(&self) -> Duration {
        self.retry
            .min(self.renew)
            .min((self.give_up - self.renew) / 4)
    }

    /// How long one renewal may take before it is abandoned and retried on a
    /// fresh connection: one blackholed connection cannot eat the budget.
    pub fn call_cap(&self) -> Duration {
        (self.renew / 2)
            .min((self.give_up - self.renew) / 2)
            .max(MIN_CALL)
    }
}

/// A duration flag's value that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration at all (humantime's own wording).
    #[error(transparent)]
    Unreadable(#[from] humantime::DurationError),
    #[error("{text} is longer than the maximum of {} days", MAX_ANY_DURATION.as_secs() / 86_400)]
    TooLong { text: String },
    /// `-5s`: out of range, not a flag.
    #[error("{text} is out of range: a duration cannot be negative")]
    Negative { text: String },
    /// `--lease --wait`: the flag after it was taken for its value.
    #[error("{text} is an option, not a duration (such as 10s or 1m30s)")]
    NotAValue { text: String },
}

/// A duration from the command line, bounded by [`MAX_ANY_DURATION`], with
/// the text it was typed as.
pub fn parse_duration(s: &str) -> Result<DurationArg, DurationError> {
    // Duration flags take values that start with `-` (so that `-5s` gets
    // this answer, not clap's advice to write `-- -5s`, which would make it
    // the command).
    if let Some(rest) = s.trim_start().strip_prefix('-') {
        let text = s.to_string();
        return Err(if rest.starts_with(|c: char| c.is_ascii_digit()) {
            DurationError::Negative { text }
        } else {
            DurationError::NotAValue { text }
        });
    }
    let d = humantime::parse_duration(s)?;
    if d > MAX_ANY_DURATION {
        return Err(DurationError::TooLong {
            text: s.to_string(),
        });
    }
    Ok(DurationArg::typed(d, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_runs_from_two_seconds_to_a_year() {
        let half = |s: &str| once_per_half(&parse_duration(s).unwrap());
        assert_eq!(half("2s"), Ok(Duration::from_secs(1)));
        assert_eq!(half("1h"), Ok(Duration::from_secs(1800)));
        assert_eq!(half("365d"), Ok(MAX_ANY_DURATION / 2));
        assert!(half("1999ms").unwrap_err().contains("at least 2s"));
        assert!(half("0s").is_err());
        assert!(parse_duration("366d").is_err());
    }

    fn s(x: u64) -> Option<DurationArg> {
        Some(Duration::from_secs(x).into())
    }
    fn typed(text: &str) -> Option<DurationArg> {
        Some(parse_duration(text).expect("a duration"))
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
                    renew: Some(Duration::ZERO.into()),
                    ..Default::default()
                },
                "--renew must be longer than zero",
            ),
            (
                TimingArgs {
                    retry: Some(Duration::ZERO.into()),
                    ..Default::default()
                },
                "--retry (0s) must be at least 50ms, so that a waiting contender does not busy a core",
            ),
            (
                TimingArgs {
                    retry: Some(Duration::from_millis(49).into()),
                    ..Default::default()
                },
                "--retry (49ms) must be at least 50ms, so that a waiting contender does not busy a core",
            ),
            (
                TimingArgs {
                    lease: Some(Duration::ZERO.into()),
                    ..Default::default()
                },
                "--lease must be longer than zero",
            ),
        ];
        for (args, want) in cases {
            assert_eq!(Timing::resolve(args).unwrap_err().to_string(), want);
        }
    }

    /// A value the user typed is quoted as typed; a default the user did
    /// not give is shown as computed, never to the nanosecond.
    #[test]
    fn refusals_quote_typed_values_and_show_defaults_plainly() {
        let e = Timing::resolve(TimingArgs {
            lease: typed("10s"),
            give_up: typed("3000ms"),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--renew (3.333s) must be shorter than --give-up (3000ms)"
        );
        let e = Timing::resolve(TimingArgs {
            lease: typed("1 week 1s"),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--lease (1 week 1s) is longer than the maximum (7d)"
        );
        assert!(matches!(
            e,
            TimingError::TooLong {
                flag: "--lease",
                ..
            }
        ));
        let e = Timing::resolve(TimingArgs {
            retry: typed("1ns"),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e,
            TimingError::RetryTooShort {
                retry: typed("1ns").unwrap()
            }
        );
    }

    #[test]
    fn renewal_retries_fit_before_giving_up() {
        // L = 3s: R = 1s, G = 2s. One retry at once, then every 250 ms.
        let t = Timing::resolve(TimingArgs {
            lease: s(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(t.renew_retry(), ms(250));
        assert_eq!(t.call_cap(), ms(500));
        // The defaults: P (2s) is not the bound, (G - R)/4 is.
        let t = Timing::resolve(TimingArgs::default()).unwrap();
        assert_eq!(t.renew_retry(), ms(1250));
        assert_eq!(t.call_cap(), ms(2500));
        // A short P is used as it is.
        let t = Timing::resolve(TimingArgs {
            retry: Some(ms(100).into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(t.renew_retry(), ms(100));
        // A short R with room to spare: half of R is the cap.
        let t = Timing::resolve(TimingArgs {
            renew: s(2),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(t.call_cap(), ms(1000));
        assert_eq!(t.renew_retry(), ms(2000));
        // A long R with little room: the call cap shrinks with the room.
        let t = Timing::resolve(TimingArgs {
            lease: s(20),
            renew: s(8),
            give_up: Some(ms(8_400).into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(t.call_cap(), ms(200));
        assert_eq!(t.renew_retry(), ms(100));
    }

    #[test]
    fn too_little_room_for_retries_is_refused() {
        let e = Timing::resolve(TimingArgs {
            lease: s(10),
            renew: Some(ms(5_950).into()),
            give_up: s(6),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--give-up (6s) must be at least 100ms longer than --renew (5.95s), \
             so that a failed renewal can be retried before giving up"
        );
        // Exactly the minimum is enough.
        assert!(Timing::resolve(TimingArgs {
            lease: s(10),
            renew: Some(ms(5_900).into()),
            give_up: s(6),
            ..Default::default()
        })
        .is_ok());
    }

    #[test]
    fn duration_flags_are_bounded() {
        assert_eq!(
            parse_duration("365days").map(|d| d.value()),
            Ok(MAX_ANY_DURATION)
        );
        assert_eq!(
            parse_duration("366days").unwrap_err().to_string(),
            "366days is longer than the maximum of 365 days"
        );
        assert!(parse_duration("18446744073709551615s").is_err());
        assert!(parse_duration("1000000000y").is_err());
        assert!(parse_duration("ten").is_err());
    }

    #[test]
    fn a_week_is_the_longest_timing_flag() {
        let week = Duration::from_secs(7 * 24 * 3600);
        assert!(Timing::resolve(TimingArgs {
            lease: Some(week.into()),
            ..Default::default()
        })
        .is_ok());
        let e = Timing::resolve(TimingArgs {
            lease: Some((week + Duration::from_nanos(1)).into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("longer than the maximum (7d)"),
            "{e}"
        );
        let e = Timing::resolve(TimingArgs {
            retry: Some((week + Duration::from_secs(1)).into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("--retry"), "{e}");
    }

    #[test]
    fn absurd_durations_are_refused_not_overflowed() {
        let e = Timing::resolve(TimingArgs {
            lease: Some(Duration::from_secs(u64::MAX / 2).into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("--lease"), "{e}");
    }
}
