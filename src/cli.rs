//! The command line (DESIGN-NOTES §3). Scripts and tests rely on it: flags
//! are added, never renamed.

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Parser};

use crate::names::{parse_holder, parse_name};

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
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
    after_help = "Exit status: the command's own; 128+N when it died of signal N; 75 the lease was lost \
        and the command stopped; 124 --timeout passed; 125 leaderrun failed (store unreachable, \
        permission denied); 126 command not executable; 127 command not found; 2 usage error. \
        When the lease is held elsewhere: --conflict-exit-code (default 0)."
)]
pub struct Cli {
    /// Lease name: 1-128 of A-Z a-z 0-9 . _ - (not starting with - or .)
    #[arg(short, long, env = "LEADERRUN_NAME", value_parser = parse_name)]
    pub name: String,

    /// Store URL: postgres://user:pass@host/db or sqlite://PATH [default: DATABASE_URL, then the embedded single-host store]
    #[arg(
        short,
        long,
        env = "LEADERRUN_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub store: Option<String>,

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

    /// Holder id [default: <hostname>:<pid>:<random>]; must be unique per process
    #[arg(long, value_name = "ID", value_parser = parse_holder)]
    pub holder: Option<String>,

    /// Exit status when the lease is held elsewhere
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub conflict_exit_code: u8,

    /// More output: -v lifecycle (acquired, released), -vv every renewal
    #[arg(short, long, action = ArgAction::Count)]
    pub verbose: u8,

    /// Only errors
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// The command and its arguments, run directly (no shell)
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// clap's error, as one line: cron mail and journals keep it whole.
pub fn one_line_error(e: &clap::Error) -> String {
    let text = e.render().to_string();
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
