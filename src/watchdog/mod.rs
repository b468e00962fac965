//! The watchdog: a second process that stops the command on time by itself
//! (docs/contract.md §10, "either process suffices").
//!
//! leaderrun enforces the give-up deadline with a timer, but a process can
//! stop running: frozen by SIGSTOP or a debugger, blocked in the kernel,
//! stuck in a bug, or killed outright. The watchdog holds the same deadlines
//! on the same boot clock and acts alone when they pass:
//!
//! * at `sent + G` (plus a short grace: leaderrun, when it runs, sends its
//!   own SIGTERM at `G` and so holds the token) it sends SIGTERM, then
//!   SIGCONT, to everything the command started; at `sent + G + K`,
//!   SIGKILL (stop.rs). Since `G + K < L`, the command is dead before the
//!   store lets a rival acquire, whatever leaderrun is doing;
//! * if leaderrun dies (the pipe below reads end-of-file without a "done"
//!   first), it kills everything the command started at once and, once all
//!   of it is gone, hands the lease back at that epoch (only at that epoch),
//!   so a standby takes over within its retry interval instead of waiting
//!   out the lease.
//!
//! It is `/proc/self/exe` started again (a fork alone could not safely run
//! a store client), with its orders on a pipe as its stdin: the store URL,
//! which may hold a password, is never in its argv or environment (its argv
//! holds leaderrun's pid; its fd 3 is leaderrun's pidfd, its fd 4 the
//! SIGTERM token, tree.rs). It is started through an intermediate
//! (fork.rs) and adopted by leaderrun, a subreaper, which reaps it when it
//! is done: a PID 1 that reaps nothing is never left its zombie. It
//! says `ready` on its stdout once it holds its orders, and keeps that pipe
//! open until it dies, so that leaderrun learns of its death at once and
//! starts another. It runs in a process group of its own with terminal and
//! job-control signals ignored, so a Ctrl-C, a hangup or a SIGKILL to
//! leaderrun's group does not reach it. It holds no store connection until
//! it must release, and sleeps in `poll` between messages.
//!
//! leaderrun's side of the pipe is non-blocking: a frozen watchdog can never
//! stall leaderrun. A deadline it misses that way is an *earlier* one, so a
//! stale watchdog errs towards stopping the command, never towards running
//! it too long.
//!
//! The files: `orders.rs` what crosses the pipe (typed, one JSON object a
//! line); `handle.rs` leaderrun's side (start, orders, `ready`, updates,
//! replacement); `machine.rs` the watchdog's decisions, a state machine
//! with no I/O; `process.rs` the watchdog process, a poll loop that does
//! the machine's I/O.

mod handle;
pub mod machine;
pub mod orders;
mod process;

pub use handle::{Watchdog, WatchdogError};
pub use orders::{Msg, Orders};

/// `argv[1]` that makes `leaderrun` a watchdog; argv[0] names it in `ps`.
pub const ARG: &str = "--be-watchdog";

/// The line a watchdog writes on its stdout once it holds its orders.
const READY: &[u8] = b"ready\n";

/// Whether this process was started as a watchdog (`argv[1]` is [`ARG`]).
pub fn is_watchdog() -> bool {
    std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(ARG))
}

/// The watchdog process's entry (see process.rs): its exit status.
pub fn main() -> i32 {
    process::main()
}
