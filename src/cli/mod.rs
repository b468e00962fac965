//! The command line (docs/guide.md, "Command line"). Scripts and tests rely on it: flags
//! are added, never renamed.

use std::ffi::OsString;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::names::{parse_advertise, parse_holder, parse_name, parse_slot, parse_slots};

use crate::duration::DurationArg;
use crate::logging::{self, LogFormat};
use crate::redact::Secret;
use crate::timing::parse_duration as duration;

mod manual;
pub use manual::{
    after_help, Block, Rule, MAN_SECTIONS, TIMING_DEFAULTS, TIMING_RULES, TIMING_TEXT,
};

/// The two forms, as `--help` shows them: the run form's COMMAND is the
/// user's program after `--`, not one of leaderrun's subcommands.
pub const USAGE: &str = "\
leaderrun [OPTIONS] --name <NAME> -- <COMMAND> [ARGS]...
       leaderrun [--store <URL>] [-v|-q] [--log-format <FORMAT>] <SUBCOMMAND> [OPTIONS]";

/// `--log-format`'s values. The type is the logging layer's; only its
/// spelling on the command line is said here.
impl clap::ValueEnum for LogFormat {
    fn value_variants<'a>() -> &'a [LogFormat] {
        &[LogFormat::Text, LogFormat::Json]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        Some(match self {
            LogFormat::Text => PossibleValue::new("text").help("One line of text per event"),
            LogFormat::Json => PossibleValue::new("json").help("One JSON object per event"),
        })
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "leaderrun",
    version,
    about = "Run a command only while this process holds a lease in a shared store",
    long_about = "Run a command only while this process holds a lease in a shared store.\n\n\
        leaderrun takes the lease NAME, starts COMMAND with the fencing token LEASE_EPOCH in its \
        environment, renews the lease in the background, and stops COMMAND (SIGTERM, then SIGKILL \
        to its whole process group) before the lease can pass to anyone else.",
    override_usage = USAGE,
    subcommand_value_name = "SUBCOMMAND",
    subcommand_help_heading = "Subcommands",
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub admin: Option<Admin>,

    #[command(flatten)]
    pub common: Common,

    #[command(flatten)]
    pub run: RunArgs,
}

/// Options every form takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379...] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]
    #[arg(
        short,
        long,
        env = "LEADERRUN_STORE",
        hide_env_values = true,
        value_name = "URL",
        global = true
    )]
    pub store: Option<Secret>,

    /// Whether `store` came from `--store` or `LEADERRUN_STORE` (filled in
    /// by [`parse`]; errors name it instead of echoing the URL).
    #[arg(skip)]
    pub store_origin: crate::store::Origin,

    /// More output: -v lifecycle (acquired, released), -vv every renewal
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Only errors
    #[arg(short, long, conflicts_with = "verbose", global = true)]
    pub quiet: bool,

    /// Log line format on stderr
    #[arg(long, value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT", global = true)]
    pub log_format: LogFormat,
}

impl Common {
    /// The log settings these flags ask for.
    pub fn log(&self) -> logging::Settings {
        logging::Settings {
            verbose: self.verbose,
            quiet: self.quiet,
            format: self.log_format,
        }
    }
}

/// The run form: `leaderrun [OPTIONS] --name <NAME> -- <COMMAND> [ARGS]...`
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Lease name: 1-128 of A-Z a-z 0-9 . _ - (not starting with - or .)
    // hide_env_values: clap would show an unset variable as `[env: LEADERRUN_NAME=]`,
    // which reads as "set to empty".
    #[arg(short, long, env = "LEADERRUN_NAME", hide_env_values = true, value_parser = parse_name, required = true)]
    pub name: Option<String>,

    /// Lease length L [default: 15s]
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub lease: Option<DurationArg>,

    /// Renew interval R [default: L/3]
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub renew: Option<DurationArg>,

    /// Stop the command when no renewal succeeded for this long, G [default: 2L/3]
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub give_up: Option<DurationArg>,

    /// Grace between SIGTERM and SIGKILL, K [default: (L-G)/2]
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub kill_after: Option<DurationArg>,

    /// Contend until leading (default: try once, skip if held)
    #[arg(long)]
    pub wait: bool,

    /// With --wait: stop waiting after this long (exit 124)
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true, requires = "wait")]
    pub timeout: Option<DurationArg>,

    /// How often a waiting contender tries, P [default: 2s]
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub retry: Option<DurationArg>,

    /// Keep the lease at least this long after acquiring it
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub min_hold: Option<DurationArg>,

    /// Step down after leading this long: stop the command (as on a lost lease), release, wait
    /// until another contender leads (at most one lease length), exit 75
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub max_term: Option<DurationArg>,

    /// Run at most once per firing of a schedule (cron): skip, like a held lease, when a run of
    /// this name started less than DUR/2 ago by the store's clock (2s to 365d; on etcd a whole
    /// even number of seconds, at least 4s)
    #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub once_per: Option<DurationArg>,

    /// With --once-per: a later firing of the same period runs again when that period's run
    /// failed (did not exit 0, or never ended); a run that exited 0 is never repeated
    #[arg(long)]
    pub retry_failed: bool,

    /// Wait by polling only, without the store's push wake-ups (for a Postgres behind PgBouncer
    /// in transaction mode, where LISTEN does not work)
    #[arg(long)]
    pub no_push: bool,

    /// Holder id [default: <hostname>:<pid>:<random>]; must be unique per process
    #[arg(long, value_name = "ID", value_parser = parse_holder)]
    pub holder: Option<String>,

    /// Store this text with the lease while it is held (an address, a URL): `status` and `watch`
    /// show it to anyone who may read the store; at most 256 bytes, no control characters
    #[arg(long, value_name = "TEXT", value_parser = parse_advertise)]
    pub advertise: Option<String>,

    /// Let up to N holders run at once, each in a slot of its own with its own epoch
    /// (LEASE_SLOT, 0 to N-1); every contender for the name must give the same N [default: 1]
    #[arg(long, value_name = "N", value_parser = parse_slots)]
    pub slots: Option<u32>,

    /// Exit status when the lease is held elsewhere
    #[arg(long, value_name = "N", default_value_t = 0, allow_hyphen_values = true, value_parser = exit_code)]
    pub conflict_exit_code: u8,

    /// Write Prometheus metrics to this file (atomically replaced)
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<std::path::PathBuf>,

    /// The command and its arguments, run directly (no shell)
    #[arg(last = true, value_name = "COMMAND", required = true)]
    pub command: Vec<OsString>,
}

#[derive(Debug, Subcommand)]
pub enum Admin {
    /// Show holder, epoch and time to expiry (by the store's clock) of one lease or all
    Status {
        /// Only this lease
        #[arg(short, long, value_parser = parse_name)]
        name: Option<String>,
        /// One JSON object per lease (an array without --name)
        #[arg(long)]
        json: bool,
    },
    /// Clear a lease whose holder is gone; the next holder still gets a higher epoch
    Release {
        /// The lease to clear (never taken from LEADERRUN_NAME: clearing is deliberate)
        #[arg(short, long, value_parser = parse_name)]
        name: String,
        /// Only this slot of the name (`--slots`; what `status` showed as NAME#SLOT) [default: 0]
        #[arg(long, value_name = "SLOT", value_parser = parse_slot)]
        slot: Option<u32>,
        /// Only if the lease is still at this epoch (what `status` showed)
        #[arg(short, long, allow_negative_numbers = true)]
        epoch: Option<i64>,
        /// Only if this holder holds it (a unit's ExecStopPost naming its own run's --holder)
        #[arg(long, value_name = "ID", value_parser = parse_holder)]
        holder: Option<String>,
    },
    /// Exit 0 only while the lease is live at this epoch (for a child, before a step that must not run twice)
    Check {
        /// The lease (leaderrun sets LEASE_NAME for the command it runs)
        #[arg(short, long, env = "LEASE_NAME", hide_env_values = true, value_parser = parse_name)]
        name: String,
        /// The epoch it must be live at (leaderrun sets LEASE_EPOCH likewise)
        #[arg(
            short,
            long,
            env = "LEASE_EPOCH",
            hide_env_values = true,
            allow_negative_numbers = true
        )]
        epoch: i64,
        /// The slot, under --slots (leaderrun sets LEASE_SLOT likewise) [default: 0]
        #[arg(long, value_name = "SLOT", env = "LEASE_SLOT", hide_env_values = true, value_parser = parse_slot)]
        slot: Option<u32>,
    },
    /// Print who holds the lease(s) now, then one line per change (acquired, released, expired) until interrupted
    Watch {
        /// Only this lease (woken by the store's push where it has one)
        #[arg(short, long, value_parser = parse_name)]
        name: Option<String>,
        /// One JSON object per line
        #[arg(long)]
        json: bool,
        /// How often to read the store [default: 2s]
        #[arg(long, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
        retry: Option<DurationArg>,
    },
    /// Create the lease table, or print its SQL with --print
    Init {
        /// Print the SQL instead of running it
        #[arg(long)]
        print: bool,
    },
}

/// The command line as clap knows it, with the text that ends `--help`.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().after_help(after_help())
}

/// Parse the command line, noting where `--store` came from.
pub fn parse() -> Result<Cli, clap::Error> {
    use clap::error::ErrorKind::{DisplayHelp, DisplayHelpOnMissingArgumentOrSubcommand};
    use clap::{CommandFactory, FromArgMatches};
    // The text after the flags in `--help` (the timing and exit status
    // tables) is formatted only when help is shown: every run formatted it
    // for nothing (about a third of the parse's instructions).
    let mut cmd = Cli::command();
    let m = match cmd.try_get_matches_from_mut(std::env::args_os()) {
        Err(e)
            if matches!(
                e.kind(),
                DisplayHelp | DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            cmd = command();
            cmd.try_get_matches_from_mut(std::env::args_os())?
        }
        other => other?,
    };
    if let Some((sub, _)) = m.subcommand() {
        run_flags_before(&m, sub)
            .map_err(|msg| cmd.error(clap::error::ErrorKind::ArgumentConflict, msg))?;
    }
    let mut cli = Cli::from_arg_matches(&m)?;
    cli.common.store_origin = store_origin(&m);
    Ok(cli)
}

/// A run-form flag given before a subcommand, which would ignore it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{flag} belongs to the run form, not to `{sub}`; options of `{sub}` go after it \
     (leaderrun {sub} --help)"
)]
pub struct RunFlagBefore {
    pub flag: String,
    pub sub: String,
}

/// The common flags may come before a subcommand (`leaderrun --store URL
/// status`), as a user of git or systemctl expects; the run form's own flags
/// may not, since the subcommand would silently ignore them. (`--name` from
/// `LEADERRUN_NAME` is not an error: the environment is not a request.)
fn run_flags_before(m: &clap::ArgMatches, sub: &str) -> Result<(), RunFlagBefore> {
    use clap::parser::ValueSource;
    let run = RunArgs::augment_args(clap::Command::new("run"));
    for arg in run.get_arguments() {
        let id = arg.get_id().as_str();
        if m.value_source(id) == Some(ValueSource::CommandLine) {
            let flag = arg
                .get_long()
                .map_or_else(|| "COMMAND".to_string(), |l| format!("--{l}"));
            return Err(RunFlagBefore {
                flag,
                sub: sub.to_string(),
            });
        }
    }
    Ok(())
}

/// `--conflict-exit-code`: an exit status, 0 to 255. A negative one reaches
/// here (not clap's "use -- -1" advice, which would make it the command).
fn exit_code(s: &str) -> Result<u8, String> {
    match s.trim().parse::<i64>() {
        Ok(n) => {
            u8::try_from(n).map_err(|_| format!("{n} is out of range: an exit status is 0 to 255"))
        }
        Err(_) => Err(format!("{s} is not a number from 0 to 255")),
    }
}

/// `--store` is global: its value (and source) may sit in a subcommand's
/// matches.
fn store_origin(m: &clap::ArgMatches) -> crate::store::Origin {
    use clap::parser::ValueSource;
    let mut here = Some(m);
    while let Some(m) = here {
        match m.value_source("store") {
            Some(ValueSource::EnvVariable) => return crate::store::Origin::LeaderrunStore,
            Some(ValueSource::CommandLine) => return crate::store::Origin::Flag,
            _ => here = m.subcommand().map(|(_, sub)| sub),
        }
    }
    crate::store::Origin::Flag
}

/// The log format `args` (a whole command line) ask for, read without
/// clap: for the one line that says why clap refused them. As with clap,
/// the last `--log-format` counts, and nothing after `--` does.
pub fn log_format_in(args: impl IntoIterator<Item = OsString>) -> LogFormat {
    let mut format = LogFormat::Text;
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        let value = match arg.to_str() {
            Some("--") => break,
            Some("--log-format") => args.next(),
            Some(a) => match a.strip_prefix("--log-format=") {
                Some(v) => Some(v.into()),
                None => continue,
            },
            None => continue,
        };
        match value.as_ref().and_then(|v| v.to_str()) {
            Some("json") => format = LogFormat::Json,
            Some("text") => format = LogFormat::Text,
            _ => {}
        }
    }
    format
}

/// clap's error, as one line: cron mail and journals keep it whole.
pub fn one_line_error(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let mut text = e.render().to_string();
    // A value with a newline or a tab in it would be folded into a space
    // below and shown as something it is not: show it escaped instead.
    if let Some(ContextValue::String(v)) = e.get(ContextKind::InvalidValue) {
        if v.chars().any(char::is_control) {
            text = text.replace(v.as_str(), &v.escape_debug().to_string());
        }
    }
    let head = text
        .split("\n\nUsage:")
        .next()
        .unwrap_or(&text)
        .split("\n\nFor more information")
        .next()
        .unwrap_or(&text);
    let mut out = head.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(hint) = unexpected_hint(e) {
        out.push_str("; ");
        out.push_str(&hint);
    }
    // One pointer to help: some errors name a subcommand's already.
    if !out.contains("--help") {
        out.push_str(" (see leaderrun --help)");
    }
    out
}

/// What an unexpected word most likely meant: a subcommand misspelt
/// (`stauts`), or the run form's COMMAND without the `--` before it.
fn unexpected_hint(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(word)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    if word.starts_with('-') {
        return None;
    }
    let subs = ["status", "release", "check", "watch", "init"];
    if let Some(near) = subs.iter().find(|s| edit_distance(word, s) <= 2) {
        return Some(format!("did you mean `{near}`?"));
    }
    Some(format!(
        "the command goes after `--`: leaderrun [OPTIONS] --name <NAME> -- {} ...",
        crate::names::printable(word)
    ))
}

/// Levenshtein distance, for a word as short as a subcommand's name.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::{Timing, TimingArgs};
    use std::time::Duration;

    #[test]
    fn the_log_format_is_read_from_a_refused_line() {
        let f = |args: &[&str]| {
            log_format_in(
                std::iter::once("leaderrun")
                    .chain(args.iter().copied())
                    .map(OsString::from),
            )
        };
        assert_eq!(f(&["--log-format", "json", "check"]), LogFormat::Json);
        assert_eq!(
            f(&["status", "--log-format=json", "--bogus"]),
            LogFormat::Json
        );
        assert_eq!(
            f(&["--log-format", "json", "--log-format", "text"]),
            LogFormat::Text
        );
        assert_eq!(f(&["--bogus"]), LogFormat::Text);
        assert_eq!(
            f(&["--name", "x", "--", "cmd", "--log-format", "json"]),
            LogFormat::Text,
            "the command's own arguments are not leaderrun's"
        );
    }

    /// A password in the store string never reaches a `{:?}` of the
    /// command line, wherever the string came from.
    #[test]
    fn the_command_line_debugs_without_the_password() {
        for args in [
            &[
                "leaderrun",
                "--store",
                "postgres://u:Sup3rSecret@h/db",
                "--name",
                "x",
                "--",
                "true",
            ][..],
            &[
                "leaderrun",
                "status",
                "--store",
                "mysql://u@h/db?password=Sup3rSecret",
            ],
            &[
                "leaderrun",
                "--store",
                "host=h password=Sup3rSecret",
                "init",
            ],
        ] {
            let cli = <Cli as clap::Parser>::try_parse_from(args).expect("parses");
            let shown = format!("{cli:?}");
            assert!(!shown.contains("Sup3rSecret"), "{shown}");
            assert!(shown.contains("store: Some("), "{shown}");
        }
    }

    /// The defaults in the table are the ones `Timing::resolve` fills in.
    #[test]
    fn the_timing_table_states_the_real_defaults() {
        let t = Timing::resolve(TimingArgs::default()).expect("the defaults are valid");
        let shown: Vec<(&str, &str)> = TIMING_DEFAULTS.iter().map(|(s, _, d)| (*s, *d)).collect();
        assert_eq!(
            shown,
            [
                ("L", "15s"),
                ("R", "L/3"),
                ("G", "2L/3"),
                ("K", "(L − G)/2"),
                ("P", "2s")
            ]
        );
        assert_eq!(t.lease, Duration::from_secs(15));
        assert_eq!(t.renew, t.lease / 3);
        assert_eq!(t.give_up, t.lease * 2 / 3);
        assert_eq!(t.kill_after, (t.lease - t.give_up) / 2);
        assert_eq!(t.retry, Duration::from_secs(2));
        for (_, flag, _) in TIMING_DEFAULTS {
            let long = flag.trim_start_matches("--");
            assert!(
                <Cli as clap::CommandFactory>::command()
                    .get_arguments()
                    .any(|a| a.get_long() == Some(long)),
                "{flag} is not a flag"
            );
        }
    }
}
