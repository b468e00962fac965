//! Exit statuses (README, "Exit status"). Scripts and tests rely on these numbers.

/// Usage error: bad flags, bad durations, a bad lease name, an unknown store.
pub const USAGE: i32 = 2;
/// The lease was lost while the child ran; the child was stopped.
pub const LOST: i32 = 75;
/// `--timeout` passed without leading.
pub const TIMEOUT: i32 = 124;
/// leaderrun's own failure: store unreachable, permission denied, …
pub const FAILURE: i32 = 125;
/// The command exists but cannot be executed.
pub const NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub const NOT_FOUND: i32 = 127;

/// `128 + N` for death by signal `N`, the shell's convention.
pub fn for_signal(sig: i32) -> i32 {
    128 + sig
}
