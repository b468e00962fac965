fn main() {
    std::process::exit(leaderrun::run::main_entry());
}
