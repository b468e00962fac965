//! Logs go to stderr, one line per event.
//!
//! The default level is WARN: a healthy try-once run under cron prints
//! nothing, so cron mails only when something deserves a look (a lost lease,
//! renew trouble, a failure). `-v` adds the lifecycle (acquired, released,
//! held by whom), which is what a systemd journal wants; `-vv` adds every
//! renewal. `-q` keeps only errors.

use tracing::Level;

pub fn init(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => Level::ERROR,
        (false, 0) => Level::WARN,
        (false, 1) => Level::INFO,
        (false, _) => Level::DEBUG,
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .with_ansi(ansi)
        .try_init();
}
