//! The command line (README, "Command line"). Scripts and tests rely on it: flags
//! are added, never renamed.

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::names::{parse_holder, parse_name};

use crate::timing::parse_duration as duration;

/// The two forms, as `--help` shows them: the run form's COMMAND is the
/// user's program after `--`, not one of leaderrun's subcommands.
pub const USAGE: &str = "\
leaderrun [OPTIONS] --name <NAME> -- <COMMAND> [ARGS]...
       leaderrun [--store <URL>] [-v|-q] [--log-format <FORMAT>] <SUBCOMMAND> [OPTIONS]";

/// Text for the end of `--help` and for the man page.
pub const AFTER_HELP: &str = "\
Exit status (run form): the command's own; 128+N when it died of signal N (or leaderrun got
signal N while waiting); 75 the lease was lost, or --max-term passed, and the command stopped;
124 --timeout passed;
125 leaderrun failed (store unreachable, wrong password, permission denied); 126 command (or
its #! interpreter) not executable; 127 command (or its #! interpreter) not found; 2 usage
error; --conflict-exit-code (default 0) when the lease is held elsewhere. 126 and 127 are
found before the lease is taken.
Subcommands: 0 done / live; 1 no such lease, nothing to clear, or not live at that epoch;
125 store failure; 2 usage error.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event
    Text,
    /// One JSON object per event
    Json,
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
    after_help = AFTER_HELP,
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
    /// Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379…] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]
    #[arg(
        short,
        long,
        env = "LEADERRUN_STORE",
        hide_env_values = true,
        value_name = "URL",
        global = true
    )]
    pub store: Option<String>,

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
    pub lease: Option<Duration>,

    /// Renew interval R [default: L/3]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub renew: Option<Duration>,

    /// Stop the command when no renewal succeeded for this long, G [default: 2L/3]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub give_up: Option<Duration>,

    /// Grace between SIGTERM and SIGKILL, K [default: (L-G)/2]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub kill_after: Option<Duration>,

    /// Contend until leading (default: try once, skip if held)
    #[arg(long)]
    pub wait: bool,

    /// With --wait: stop waiting after this long (exit 124)
    #[arg(long, value_name = "DUR", value_parser = duration, requires = "wait")]
    pub timeout: Option<Duration>,

    /// How often a waiting contender tries, P [default: 2s]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub retry: Option<Duration>,

    /// Keep the lease at least this long after acquiring it
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub min_hold: Option<Duration>,

    /// Step down after leading this long: stop the command (as on a lost lease), release, wait
    /// until another contender leads (at most one lease length), exit 75
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub max_term: Option<Duration>,

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

/// Parse the command line, noting where `--store` came from.
pub fn parse() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let mut cmd = Cli::command();
    let m = cmd.try_get_matches_from_mut(std::env::args_os())?;
    if let Some((sub, _)) = m.subcommand() {
        run_flags_before(&m, sub)
            .map_err(|msg| cmd.error(clap::error::ErrorKind::ArgumentConflict, msg))?;
    }
    let mut cli = Cli::from_arg_matches(&m)?;
    cli.common.store_origin = store_origin(&m);
    Ok(cli)
}

/// The common flags may come before a subcommand (`leaderrun --store URL
/// status`), as a user of git or systemctl expects; the run form's own flags
/// may not, since the subcommand would silently ignore them. (`--name` from
/// `LEADERRUN_NAME` is not an error: the environment is not a request.)
fn run_flags_before(m: &clap::ArgMatches, sub: &str) -> Result<(), String> {
    use clap::parser::ValueSource;
    let run = RunArgs::augment_args(clap::Command::new("run"));
    for arg in run.get_arguments() {
        let id = arg.get_id().as_str();
        if m.value_source(id) == Some(ValueSource::CommandLine) {
            let flag = arg
                .get_long()
                .map_or_else(|| "COMMAND".to_string(), |l| format!("--{l}"));
            return Err(format!(
                "{flag} belongs to the run form, not to `{sub}`; options of `{sub}` go after it \
                 (leaderrun {sub} --help)"
            ));
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
