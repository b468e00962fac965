fn main() {
    one_malloc_arena();
    // `--generate man|bash|zsh|fish`: the man page and completions, for
    // packaging (hidden from --help).
    if let Some(code) = leaderrun::generate::from_args() {
        std::process::exit(code);
    }
    // The watchdog is this same binary started again (src/watchdog/).
    let code = if leaderrun::watchdog::is_watchdog() {
        leaderrun::watchdog::main()
    } else {
        leaderrun::entry::main_entry().code()
    };
    // Queued log lines (the watchdog's too: its last line is often the one
    // that says what became of the lease) get a bounded chance to reach
    // stderr.
    leaderrun::report::flush_metrics(std::time::Duration::from_millis(500));
    leaderrun::stderr::flush(std::time::Duration::from_millis(500));
    std::process::exit(code);
}

// Panics unwind (Cargo.toml says why) with the unwinder linked in from
// libgcc_eh.a, not from libgcc_s.so: one shared library fewer to map,
// relocate and initialise at every start of leaderrun and of its watchdog
// (docs/performance.md, "A lean run"). std's own link line still names
// libgcc_s, which --as-needed then drops as unused.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[link(name = "gcc_eh", kind = "static")]
extern "C" {}

/// Every thread allocates from the main malloc arena. By default glibc
/// gives each new thread an arena of its own (a 64 MB reservation, faulted
/// in page by page) as soon as it allocates: the store's worker thread paid
/// that on every run for a few kilobytes of statements. leaderrun's threads
/// (the store's worker, the log and metrics writers) allocate little and
/// seldom at once, so one arena costs them nothing measurable, and each run
/// less (docs/performance.md, "A lean run"). Set before any thread starts.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of the allocator; no thread other
    // than this one exists yet.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}
