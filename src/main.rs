fn main() {
    let code = leaderrun::run::main_entry();
    // Queued log lines get a bounded chance to reach stderr.
    leaderrun::report::flush_metrics(std::time::Duration::from_millis(500));
    leaderrun::stderr::flush(std::time::Duration::from_millis(500));
    std::process::exit(code);
}
