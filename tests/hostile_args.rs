//! Property tests: no command line makes leaderrun panic, every refusal is
//! one line, and every timing that is accepted keeps the contract's
//! relations (docs/contract.md §1). Seeded and reproducible; the seed and
//! the failing case are printed.

use std::time::Duration;

use clap::Parser;
use leaderrun::cli::{one_line_error, Cli};
use leaderrun::clock::{BootClock, Clock};
use leaderrun::run::RunConfig;
use leaderrun::timing::{Timing, TimingArgs, MAX_ANY_DURATION, MIN_RETRY_ROOM};

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[(self.next() % v.len() as u64) as usize]
    }
}

const FLAGS: &[&str] = &[
    "--lease",
    "--renew",
    "--give-up",
    "--kill-after",
    "--retry",
    "--timeout",
    "--min-hold",
    "--conflict-exit-code",
    "--holder",
    "--name",
    "-n",
    "--wait",
    "-v",
    "-vv",
    "-q",
    "--log-format",
    "--metrics-file",
    "--store",
    "-s",
    "--epoch",
    "--json",
    "status",
    "check",
    "release",
    "init",
    "--print",
    "--",
    "--help",
    "-h",
];
const VALUES: &[&str] = &[
    "0",
    "0s",
    "1ns",
    "1ms",
    "99ms",
    "100ms",
    "500ms",
    "1s",
    "2s",
    "3s",
    "15s",
    "1m",
    "7days",
    "8days",
    "365days",
    "366days",
    "18446744073709551615s",
    "99999999999999999999999s",
    "1000000000y",
    "-5s",
    "1.5s",
    "10 s",
    "ten",
    "",
    "1y 1ns",
    "\u{0}",
    "255",
    "256",
    "-1",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "x",
    "-x",
    ".x",
    "na me",
    "ü",
    "a\nb",
    "json",
    "text",
    "sqlite:///tmp/leaderrun-hostile-args.db",
    "postgres://u:p@127.0.0.1:1/db",
    "sqlite://relative.db",
    "host=x password=secret",
    "mysql://",
    "redis://:pw@",
    "etcd://a:1,b:2",
    "/dev/null",
    "--",
    "sh",
    "true",
];

fn argv(rng: &mut Rng) -> Vec<String> {
    let mut v = vec!["leaderrun".to_string()];
    // Half the lines start well formed, so the generator reaches the
    // timing and store checks behind the parser, not only clap's errors.
    if rng.next() % 2 == 0 {
        v.extend(["--name".to_string(), "x".to_string()]);
        v.extend([
            "--store".to_string(),
            "sqlite:///tmp/leaderrun-hostile-args.db".to_string(),
        ]);
    }
    let n = rng.next() % 7;
    for _ in 0..n {
        if rng.next() % 2 == 0 {
            v.push(rng.pick(FLAGS).to_string());
        } else {
            v.push(rng.pick(VALUES).to_string());
        }
    }
    if rng.next() % 3 != 0 {
        v.extend(["--".to_string(), "true".to_string()]);
    }
    v
}

#[test]
fn no_command_line_panics_and_every_refusal_is_one_line() {
    // Nothing from the machine's environment may steer the store choice.
    for k in [
        "LEADERRUN_STORE",
        "DATABASE_URL",
        "LEADERRUN_NAME",
        "LEASE_NAME",
        "LEASE_EPOCH",
    ] {
        std::env::remove_var(k);
    }
    std::env::set_var("LEADERRUN_STATE_DIR", std::env::temp_dir());
    let seed = 0x001e_ade2_u64;
    let mut rng = Rng(seed);
    let mut accepted = 0;
    for case in 0..10_000 {
        let args = argv(&mut rng);
        let res = std::panic::catch_unwind(|| match Cli::try_parse_from(&args) {
            Err(e) => Err(one_line_error(&e)),
            Ok(cli) if cli.admin.is_some() => Ok(()),
            Ok(cli) => RunConfig::from_cli(cli.common, cli.run)
                .map(|cfg| {
                    // What is accepted is added to boot-clock stamps (a
                    // deadline, the --timeout) and written to stores: it
                    // must stay far from overflowing either.
                    for d in [cfg.job.timeout.map(|t| t.value()), cfg.job.min_hold]
                        .into_iter()
                        .flatten()
                    {
                        assert!(d <= MAX_ANY_DURATION, "{args:?} accepted {d:?}");
                        assert!(BootClock.now().checked_add(d).is_some());
                    }
                })
                .map_err(|e| e.to_string()),
        });
        match res {
            Err(_) => panic!("seed {seed} case {case}: {args:?} panicked"),
            Ok(Err(msg)) => assert!(
                !msg.contains('\n') && !msg.is_empty(),
                "seed {seed} case {case}: {args:?} refused with {msg:?}"
            ),
            Ok(Ok(())) => accepted += 1,
        }
    }
    assert!(
        accepted > 100,
        "the generator hardly reaches valid command lines"
    );
}

#[test]
fn every_accepted_timing_keeps_the_relations() {
    let mut rng = Rng(0x0714_14e6);
    let any = |rng: &mut Rng| -> Option<Duration> {
        match rng.next() % 6 {
            0 => None,
            1 => Some(Duration::from_nanos(rng.next() % 1000)),
            2 => Some(Duration::from_millis(rng.next() % 20_000)),
            3 => Some(Duration::from_secs(rng.next() % (10 * 24 * 3600))),
            4 => Some(Duration::new(rng.next(), 999_999_999)),
            _ => Some(Duration::from_millis(rng.next() % 3_000)),
        }
    };
    let mut ok = 0;
    for _ in 0..100_000 {
        let a = TimingArgs {
            lease: any(&mut rng).map(Into::into),
            renew: any(&mut rng).map(Into::into),
            give_up: any(&mut rng).map(Into::into),
            kill_after: any(&mut rng).map(Into::into),
            retry: any(&mut rng).map(Into::into),
        };
        let Ok(t) = std::panic::catch_unwind(|| Timing::resolve(a.clone())).expect("no panic")
        else {
            continue;
        };
        ok += 1;
        assert!(
            t.renew > Duration::ZERO && t.renew < t.give_up,
            "{a:?} -> {t:?}"
        );
        assert!(t.give_up - t.renew >= MIN_RETRY_ROOM, "{a:?} -> {t:?}");
        assert!(t.give_up + t.kill_after < t.lease, "{a:?} -> {t:?}");
        assert!(t.retry > Duration::ZERO, "{a:?} -> {t:?}");
        // Several renewal attempts fit between R and G.
        assert!(t.renew_retry() > Duration::ZERO, "{a:?} -> {t:?}");
        assert!(t.renew_retry() * 4 <= t.give_up - t.renew, "{a:?} -> {t:?}");
        assert!(
            t.call_cap() <= t.renew.max(Duration::from_millis(50)),
            "{a:?} -> {t:?}"
        );
    }
    assert!(
        ok > 1000,
        "only {ok} timings accepted: the generator misses"
    );
}
