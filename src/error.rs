//! Why a run or a subcommand failed: one enum over the domains' own errors,
//! each knowing its exit status ([`crate::exit::Exit`]) and its log event.
//! `entry.rs` is the one place that logs a failure and turns it into an
//! exit status; the steps below it return these instead of numbers.

use tracing::Level;

use crate::exit::Exit;
use crate::store::{ResolveError, StoreError};
use crate::supervisor::SpawnError;
use crate::watchdog::WatchdogError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line, checked after parsing: a flag, a duration, a
    /// relation between them.
    #[error("{0}")]
    Usage(String),
    /// No store: a store string that cannot be used, or no place for the
    /// embedded one.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The store failed (will not heal, or did not heal in time).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A file store that a subcommand would have to create to look into.
    #[error(
        "no such store file {file} (from {origin}); status, release, check and watch never create one \
         (a run or `leaderrun init` does)"
    )]
    NoStoreFile {
        file: String,
        origin: crate::store::Origin,
    },
    /// The command cannot be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// No second guard could be had: the command must not start.
    #[error("cannot start the watchdog ({0}); not running the command")]
    Watchdog(#[source] WatchdogError),
    /// The watchdog died before the command started and none could replace it.
    #[error("the watchdog is gone and no other could be started; not running the command")]
    Unguarded,
    /// The process itself: the async runtime, the signal handlers.
    #[error("cannot {what}: {source}")]
    Startup {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// `check` inside a command could not read what its leaderrun
    /// publishes (published.rs), so it cannot tell.
    #[error("cannot check lease {name}: {source}; `--store` reads a store instead")]
    LeaseState {
        name: String,
        #[source]
        source: crate::published::ReadError,
    },
    /// An answer that could not be put into words (`status --json`).
    #[error("cannot write JSON: {0}")]
    Output(#[source] serde_json::Error),
}

impl Error {
    /// The exit status this failure means.
    pub fn exit(&self) -> Exit {
        match self {
            Error::Usage(_) => Exit::Usage,
            Error::Resolve(e) => e.exit(),
            Error::Spawn(e) => e.exit(),
            Error::Store(e) if e.kind() == crate::store::ErrorKind::Usage => Exit::Usage,
            Error::Store(_)
            | Error::NoStoreFile { .. }
            | Error::Watchdog(_)
            | Error::Unguarded
            | Error::Startup { .. }
            | Error::LeaseState { .. }
            | Error::Output(_) => Exit::Failure,
        }
    }

    /// The log event it is reported as.
    pub fn event(&self) -> &'static str {
        match self {
            Error::Usage(_) => "usage_error",
            Error::Resolve(e) if e.exit() == Exit::Usage => "usage_error",
            Error::Store(e) if e.kind() == crate::store::ErrorKind::Usage => "usage_error",
            Error::Resolve(_) | Error::Store(_) | Error::NoStoreFile { .. } => "store_error",
            Error::Spawn(_) => "spawn_failed",
            Error::Watchdog(_) | Error::Unguarded => "watchdog_failed",
            Error::Startup { .. } => "startup_failed",
            Error::Output(_) => "output_failed",
            Error::LeaseState { .. } => "check_failed",
        }
    }

    /// A refusal stands on its own (nothing was attempted: the line is
    /// `leaderrun: error: …` whatever `-q` says); anything else failed
    /// while running and is a log event like the run's others.
    fn is_refusal(&self) -> bool {
        match self {
            Error::Usage(_)
            | Error::Resolve(_)
            | Error::NoStoreFile { .. }
            | Error::Startup { .. }
            | Error::Output(_) => true,
            Error::Store(_)
            | Error::Spawn(_)
            | Error::Watchdog(_)
            | Error::Unguarded
            | Error::LeaseState { .. } => false,
        }
    }

    /// Log it, once: what `entry.rs` does with every failure.
    pub fn report(&self) {
        if self.is_refusal() {
            crate::logging::say(Level::ERROR, self.event(), &self.to_string());
        } else {
            tracing::error!(event = self.event(), "{self}");
        }
    }
}

impl From<WatchdogError> for Error {
    fn from(e: WatchdogError) -> Error {
        Error::Watchdog(e)
    }
}
