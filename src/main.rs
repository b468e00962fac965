fn main() {
    // `--generate man|bash|zsh|fish`: the man page and completions, for
    // packaging (hidden from --help).
    if let Some(code) = leaderrun::generate::from_args() {
        std::process::exit(code);
    }
    let code = leaderrun::run::main_entry();
    // Queued log lines get a bounded chance to reach stderr.
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
