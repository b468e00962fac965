//! Durations as a person reads them, in every message that shows one.
//!
//! A duration typed on the command line is shown as it was typed: `365d`
//! stays `365d`, `1500ms` stays `1500ms` ([`DurationArg`]). One that
//! leaderrun computed (a default `R = L/3`, the lease a store grants, the
//! time left of a `--min-hold`, a measured delay) is shown by [`show`]: in
//! the largest unit that states it exactly (`10s`, `2m`, `365d`, `500ms`),
//! else in seconds rounded to the millisecond (`3.333s`). A general-purpose
//! formatter would split `365d` into months of 30.44 days and show `L/3` to
//! the nanosecond; neither is what was asked for or what matters.

use std::fmt;
use std::time::Duration;

const NS_PER_MS: u128 = 1_000_000;
const NS_PER_S: u128 = 1_000_000_000;

/// Whole units tried largest first; a duration that is a whole number of
/// one of them is shown in it.
const WHOLE: [(u128, &str); 4] = [
    (86_400 * NS_PER_S, "d"),
    (3_600 * NS_PER_S, "h"),
    (60 * NS_PER_S, "m"),
    (NS_PER_S, "s"),
];

/// `d` for a message: see the module's documentation.
pub fn show(d: Duration) -> Shown {
    Shown(d)
}

/// `d` rounded for a reader who wants to know about how long (a lease's
/// time to expiry in `status`, a holder's time left while waiting): to a
/// tenth of a second below 10s, then to whole seconds, minutes and hours
/// below ten of each, and to whole days beyond. Two or three figures, in
/// one unit: a lease kept for a year reads `365d`, never `31535999s`.
pub fn about(d: Duration) -> Duration {
    let ns = d.as_nanos();
    let step = [
        (10 * NS_PER_S, NS_PER_S / 10),
        (600 * NS_PER_S, NS_PER_S),
        (36_000 * NS_PER_S, 60 * NS_PER_S),
        (864_000 * NS_PER_S, 3_600 * NS_PER_S),
    ]
    .iter()
    .find(|(below, _)| ns < *below)
    .map_or(86_400 * NS_PER_S, |(_, step)| *step);
    let n = (ns + step / 2) / step * step;
    match u64::try_from(n / NS_PER_S) {
        // Below a second's nanoseconds, so the cast is exact.
        Ok(secs) => Duration::new(secs, (n % NS_PER_S) as u32),
        Err(_) => d,
    }
}

/// A computed duration, ready to print (see [`show`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown(Duration);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            return f.write_str("0s");
        }
        if let Some((size, unit)) = WHOLE.iter().find(|(size, _)| ns % size == 0) {
            return write!(f, "{}{unit}", ns / size);
        }
        // Below a millisecond, rounding would leave nothing: such values
        // are only ever typed (`--retry 1ns`), and shown exactly.
        if ns < NS_PER_MS {
            return match ns % 1_000 {
                0 => write!(f, "{}us", ns / 1_000),
                _ => write!(f, "{ns}ns"),
            };
        }
        if ns < NS_PER_S && ns % NS_PER_MS == 0 {
            return write!(f, "{}ms", ns / NS_PER_MS);
        }
        let ms = (ns + NS_PER_MS / 2) / NS_PER_MS;
        let (secs, frac) = (ms / 1_000, ms % 1_000);
        if frac == 0 {
            return write!(f, "{secs}s");
        }
        let frac = format!("{frac:03}");
        write!(f, "{secs}.{}s", frac.trim_end_matches('0'))
    }
}

/// A duration and, when it came straight from the command line, the text
/// it was typed as: messages about the user's own value quote the user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurationArg {
    value: Duration,
    typed: Option<String>,
}

impl DurationArg {
    /// `value`, as the user typed it in `text`.
    pub fn typed(value: Duration, text: &str) -> DurationArg {
        DurationArg {
            value,
            typed: Some(text.to_string()),
        }
    }

    pub fn value(&self) -> Duration {
        self.value
    }
}

/// A duration leaderrun computed: shown by [`show`].
impl From<Duration> for DurationArg {
    fn from(value: Duration) -> DurationArg {
        DurationArg { value, typed: None }
    }
}

impl fmt::Display for DurationArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.typed {
            Some(text) => f.write_str(text),
            None => show(self.value).fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: Duration) -> String {
        show(d).to_string()
    }

    #[test]
    fn whole_units_are_shown_in_the_largest_that_fits() {
        let secs = Duration::from_secs;
        assert_eq!(s(Duration::ZERO), "0s");
        assert_eq!(s(secs(365 * 86_400)), "365d");
        assert_eq!(s(secs(7 * 86_400)), "7d");
        assert_eq!(s(secs(25 * 3_600)), "25h");
        assert_eq!(s(secs(120)), "2m");
        assert_eq!(s(secs(90)), "90s");
        assert_eq!(s(secs(15)), "15s");
        assert_eq!(s(Duration::from_millis(500)), "500ms");
        assert_eq!(s(Duration::from_millis(49)), "49ms");
    }

    #[test]
    fn the_rest_in_seconds_to_the_millisecond() {
        // L/3 for L = 10s: 3.333333333s.
        assert_eq!(s(Duration::from_secs(10) / 3), "3.333s");
        assert_eq!(s(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(s(Duration::from_millis(5_950)), "5.95s");
        assert_eq!(s(Duration::from_millis(5_250)), "5.25s");
        assert_eq!(s(Duration::from_micros(1_500)), "0.002s");
        assert_eq!(s(Duration::from_nanos(4_999_999_999)), "5s");
        // A --min-hold of 365d with 24ms of it spent.
        assert_eq!(
            s(Duration::from_secs(365 * 86_400) - Duration::from_millis(24)),
            "31535999.976s"
        );
    }

    #[test]
    fn below_a_millisecond_exactly() {
        assert_eq!(s(Duration::from_nanos(1)), "1ns");
        assert_eq!(s(Duration::from_micros(250)), "250us");
        assert_eq!(s(Duration::from_nanos(999_999)), "999999ns");
    }

    #[test]
    fn about_keeps_two_or_three_figures_in_one_unit() {
        let a = |d: Duration| show(about(d)).to_string();
        let ms = Duration::from_millis;
        assert_eq!(a(ms(0)), "0s");
        assert_eq!(a(ms(40)), "0s");
        assert_eq!(a(ms(160)), "200ms");
        assert_eq!(a(ms(2_549)), "2.5s");
        assert_eq!(a(ms(9_960)), "10s");
        assert_eq!(a(ms(75_400)), "75s");
        assert_eq!(a(ms(599_400)), "599s");
        assert_eq!(a(ms(4_510_000)), "75m");
        assert_eq!(a(ms(3_599_000)), "1h");
        assert_eq!(a(ms(47 * 3_600_000 + 1_000)), "47h");
        // A --min-hold of 365d a moment (or 40 hours) after it began.
        let year = Duration::from_secs(365 * 86_400);
        assert_eq!(a(year - ms(700)), "365d");
        assert_eq!(a(year - Duration::from_secs(40 * 3_600)), "363d");
        // No overflow at the very end of the range.
        assert!(Duration::MAX - about(Duration::MAX) < Duration::from_secs(86_400));
    }

    #[test]
    fn a_typed_duration_is_shown_as_typed() {
        let d = Duration::from_secs(365 * 86_400);
        assert_eq!(DurationArg::typed(d, "365days").to_string(), "365days");
        assert_eq!(DurationArg::typed(d, "365d").to_string(), "365d");
        assert_eq!(DurationArg::from(d).to_string(), "365d");
        assert_eq!(DurationArg::typed(d, "365d").value(), d);
    }
}
