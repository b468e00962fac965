//! The command line (docs/guide.md, "Command line"). Scripts and tests rely on it: flags
//! are added, never renamed.

use std::ffi::OsString;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::names::{parse_holder, parse_name};

use crate::duration::DurationArg;
use crate::logging::{self, LogFormat};
use crate::redact::Secret;
use crate::timing::parse_duration as duration;

/// The two forms, as `--help` shows them: the run form's COMMAND is the
/// user's program after `--`, not one of leaderrun's subcommands.
pub const USAGE: &str = "\
leaderrun [OPTIONS] --name <NAME> -- <COMMAND> [ARGS]...
       leaderrun [--store <URL>] [-v|-q] [--log-format <FORMAT>] <SUBCOMMAND> [OPTIONS]";

/// The five durations: symbol, flag, default. The one statement of the
/// defaults outside `timing.rs`, rendered into `--help`, the man page and
/// checked against `Timing::resolve` by a unit test below.
pub const TIMING_DEFAULTS: &[(&str, &str, &str)] = &[
    ("L", "--lease", "15s"),
    ("R", "--renew", "L/3"),
    ("G", "--give-up", "2L/3"),
    ("K", "--kill-after", "(L − G)/2"),
    ("P", "--retry", "2s"),
];

/// A relation between the durations that leaderrun refuses to start without.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub rule: &'static str,
    pub why: &'static str,
    /// Flags that break this rule and no other: the test that the table
    /// and `Timing::resolve` agree runs them and expects a usage error.
    pub broken_by: &'static [&'static str],
}

/// Every timing relation, as `--help`, the man page and the README state it.
pub const TIMING_RULES: &[Rule] = &[
    Rule {
        rule: "0 < R < G",
        why: "a renewal is due before the holder gives up",
        broken_by: &["--renew", "10s", "--give-up", "10s"],
    },
    Rule {
        rule: "G − R ≥ 100ms",
        why: "room to retry a failed renewal several times before giving up",
        broken_by: &["--renew", "5s", "--give-up", "5050ms"],
    },
    Rule {
        rule: "G + K < L",
        why: "the command is dead (SIGKILL sent) before the store lets a rival acquire",
        broken_by: &["--give-up", "10s", "--kill-after", "5s"],
    },
    Rule {
        rule: "P ≥ 50ms",
        why: "a waiting contender polls without busying a core",
        broken_by: &["--wait", "--retry", "1ms"],
    },
];

/// The timing paragraph of the man page, after the defaults and the rules.
pub const TIMING_TEXT: &[Block] = &[
    Block::Para(
        "The rules are checked against the lease the store will really grant (etcd grants whole \
         seconds). The holder counts from the moment it sent its last successful renewal, on \
         CLOCK_BOOTTIME. The store set expiry at least L after that moment, by its own clock. At \
         sent + G the command's process group gets SIGTERM, at sent + G + K SIGKILL; since G + K < L \
         the command is dead before any rival can acquire. A failed renewal is retried at once on a \
         fresh connection, then every min(P, R, (G − R)/4).",
    ),
    Block::Para(
        "With the defaults: renew every 5s, SIGTERM after 10s without a successful renewal, SIGKILL \
         at 12.5s, expiry at 15s at the earliest. A waiting contender takes over within L + P of a \
         holder's death, and within P of a clean release.",
    ),
];

/// A piece of the man page's prose. Backticks mark code, rendered bold.
#[derive(Debug, Clone, Copy)]
pub enum Block {
    Para(&'static str),
    /// A term and its explanation.
    Item(&'static str, &'static str),
    /// Lines shown verbatim.
    Example(&'static [&'static str]),
}

/// The man page's sections after EXIT STATUS and TIMING, beside the flags
/// they explain.
pub const MAN_SECTIONS: &[(&str, &[Block])] = &[
    (
        "ENVIRONMENT",
        &[
            Block::Item(
                "`LEADERRUN_NAME`, `LEADERRUN_STORE`",
                "defaults for --name and --store",
            ),
            Block::Item(
                "`DATABASE_URL`",
                "the store, when neither --store nor LEADERRUN_STORE is set",
            ),
            Block::Item(
                "`LEADERRUN_STATE_DIR`, `XDG_STATE_HOME`, `HOME`",
                "where the embedded store lives when no store is configured (see FILES)",
            ),
            Block::Item(
                "`NOTIFY_SOCKET`",
                "set by systemd for Type=notify units: leaderrun sends READY=1 and keeps STATUS= \
                 current; the command does not inherit it",
            ),
            Block::Item(
                "`LEASE_EPOCH`, `LEASE_NAME`, `LEASE_HOLDER`",
                "set for the command: the fencing token, the lease name and this process's holder \
                 id. `leaderrun check` reads LEASE_NAME and LEASE_EPOCH and is a usage error \
                 without them or --name and --epoch",
            ),
        ],
    ),
    (
        "FILES",
        &[Block::Para(
            "The embedded store: $LEADERRUN_STATE_DIR/leases.db; for root \
             /var/lib/leaderrun/leases.db; otherwise $XDG_STATE_HOME/leaderrun/leases.db or \
             ~/.local/state/leaderrun/leases.db. One host only; never on a network filesystem.",
        )],
    ),
    (
        "EXAMPLES",
        &[
            Block::Para("Run a nightly job at most once at a time on this host:"),
            Block::Example(&["leaderrun --name nightly -- ./report.sh"]),
            Block::Para(
                "The same cron line on several hosts, sharing a Postgres; a host whose clock is a \
                 few seconds late still skips:",
            ),
            Block::Example(&[
                "0 3 * * * leaderrun --store postgres://app@db/jobs --name invoice-sweeper --min-hold 5m -- ./sweep.sh",
            ]),
            Block::Para("A standby systemd service: every host runs it, one leads:"),
            Block::Example(&["ExecStart=/usr/bin/leaderrun -v --wait --name ingest -- /usr/bin/ingestd"]),
            Block::Para("Before a step that must not run twice, from inside the command:"),
            Block::Example(&["leaderrun check || exit 75"]),
            Block::Para("Who holds what, and clearing a lease whose holder is gone:"),
            Block::Example(&[
                "leaderrun status",
                "leaderrun release --name invoice-sweeper --epoch 41",
            ]),
        ],
    ),
];

/// Text for the end of `--help`: the timing table and both exit tables.
pub fn after_help() -> String {
    use crate::exit::{plain, RUN_FORM, SUBCOMMANDS};
    let mut out = String::from("Timing (durations such as 500ms, 15s, 2m):\n");
    for (sym, flag, default) in TIMING_DEFAULTS {
        out.push_str(&hanging(
            &format!("{sym} {flag}"),
            &format!("default {default}"),
        ));
    }
    let rules: Vec<&str> = TIMING_RULES.iter().map(|r| r.rule).collect();
    out.push_str(&format!("Refused unless {}.\n", rules.join(", ")));
    for (title, table) in [
        ("Exit status (run form):", RUN_FORM),
        ("Exit status (subcommands):", SUBCOMMANDS),
    ] {
        out.push_str(&format!("\n{title}\n"));
        for s in table {
            out.push_str(&hanging(&plain(s.status), &plain(s.meaning)));
        }
    }
    out
}

/// `term` in a column of its own, `text` wrapped beside it: clap prints
/// after-help text as it is.
fn hanging(term: &str, text: &str) -> String {
    const INDENT: usize = 26;
    const WIDTH: usize = 100;
    let mut out = format!("  {term:<w$}", w = INDENT - 2);
    if term.len() > INDENT - 3 {
        out = format!("  {term}\n{:INDENT$}", "");
    }
    let mut col = INDENT;
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 && col + 1 + word.len() > WIDTH {
            out.push_str(&format!("\n{:INDENT$}", ""));
            col = INDENT;
        } else if i > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += word.len();
    }
    out.push('\n');
    out
}

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
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub lease: Option<DurationArg>,

    /// Renew interval R [default: L/3]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub renew: Option<DurationArg>,

    /// Stop the command when no renewal succeeded for this long, G [default: 2L/3]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub give_up: Option<DurationArg>,

    /// Grace between SIGTERM and SIGKILL, K [default: (L-G)/2]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub kill_after: Option<DurationArg>,

    /// Contend until leading (default: try once, skip if held)
    #[arg(long)]
    pub wait: bool,

    /// With --wait: stop waiting after this long (exit 124)
    #[arg(long, value_name = "DUR", value_parser = duration, requires = "wait")]
    pub timeout: Option<DurationArg>,

    /// How often a waiting contender tries, P [default: 2s]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub retry: Option<DurationArg>,

    /// Keep the lease at least this long after acquiring it
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub min_hold: Option<DurationArg>,

    /// Step down after leading this long: stop the command (as on a lost lease), release, wait
    /// until another contender leads (at most one lease length), exit 75
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub max_term: Option<DurationArg>,

    /// Wait by polling only, without the store's push wake-ups (for a Postgres behind PgBouncer
    /// in transaction mode, where LISTEN does not work)
    #[arg(long)]
    pub no_push: bool,

    /// Holder id [default: <hostname>:<pid>:<random>]; must be unique per process
    #[arg(long, value_name = "ID", value_parser = parse_holder)]
    pub holder: Option<String>,

    /// Exit status when the lease is held elsewhere
    #[arg(long, value_name = "N", default_value_t = 0)]
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
        /// Only if the lease is still at this epoch (what `status` showed)
        #[arg(long)]
        epoch: Option<i64>,
    },
    /// Exit 0 only while the lease is live at this epoch (for a child, before a step that must not run twice)
    Check {
        /// The lease (leaderrun sets LEASE_NAME for the command it runs)
        #[arg(short, long, env = "LEASE_NAME", hide_env_values = true, value_parser = parse_name)]
        name: String,
        /// The epoch it must be live at (leaderrun sets LEASE_EPOCH likewise)
        #[arg(short, long, env = "LEASE_EPOCH", hide_env_values = true)]
        epoch: i64,
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
    out.push_str(" (see leaderrun --help)");
    out
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
