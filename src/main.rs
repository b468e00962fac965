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
