//! From the command line to an exit status: parse, set up logging and the
//! runtime, hand over to the run form or a subcommand, and, in one place,
//! log whatever failed and map every ending to its status.

use tracing::Level;

use crate::cli::{one_line_error, Cli};
use crate::error::Error;
use crate::exit::Exit;
use crate::logging;
use crate::run::RunConfig;

/// Parse the command line, run, and say how it ended.
pub fn main_entry() -> Exit {
    let cli = match crate::cli::parse() {
        Ok(c) => c,
        Err(e) => return refused(&e),
    };
    logging::init(cli.common.log());
    match dispatch(cli) {
        Ok(exit) => exit,
        Err(e) => {
            e.report();
            e.exit()
        }
    }
}

/// The run form or a subcommand, on a runtime of one thread: the child's
/// parent-death signal is tied to the thread that spawned it (see
/// src/supervisor/), and the main thread lives longest.
fn dispatch(cli: Cli) -> Result<Exit, Error> {
    let Cli {
        admin,
        common,
        run: run_args,
    } = cli;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Startup {
            what: "start the runtime",
            source,
        })?;
    if let Some(cmd) = admin {
        return rt.block_on(crate::admin::run(cmd, common));
    }
    let cfg = RunConfig::from_cli(common, run_args)?;
    logging::set_context(&cfg.job.name, &cfg.job.holder);
    rt.block_on(crate::run::run(cfg))
}

/// What clap refused (or `--help`, `--version`, which it prints itself).
fn refused(e: &clap::Error) -> Exit {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        let _ = e.print();
        return Exit::Yes;
    }
    // clap refused the line, so which format it asked for is read from the
    // arguments themselves.
    logging::set_format(crate::cli::log_format_in(std::env::args_os()));
    let line = one_line_error(e);
    let msg = line.strip_prefix("error: ").unwrap_or(&line);
    logging::say(Level::ERROR, "usage_error", msg);
    Exit::Usage
}
