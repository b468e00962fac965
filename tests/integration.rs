//! leaderrun's integration tests: one binary, one module per subject, and
//! the support code (throwaway servers, the fault proxy, the chaos checker)
//! compiled once. Every test runs the real `leaderrun` binary, or the
//! library against real servers that the harness starts itself.
//!
//! Run one subject with a filter on its module: `cargo nextest run -E
//! 'test(/^faults::/)'`.

mod support;

mod admin;
mod advertise;
mod chaos;
mod check_in_command;
mod conformance;
mod embedded;
mod embedded_isolation;
mod failover_etcd;
mod failover_postgres;
mod failover_redis;
mod failover_zookeeper;
mod faults;
mod generated;
mod hand_back;
mod handover;
mod hostile_args;
mod hostile_rows;
mod init_and_read_only;
mod messages;
mod mysql_semisync;
mod once_per;
mod once_per_broken;
mod once_per_stores;
mod pgbouncer;
mod polish;
mod races;
mod run_cli;
mod slots;
mod stops;
mod store_etcd;
mod store_mysql;
mod store_postgres;
mod store_redis;
mod store_sqlite;
mod store_strings;
mod store_zookeeper;
mod strangers;
mod systemd_unit;
mod terminal;
mod watch;
mod watch_push;
mod watchdog;
mod will_not_heal;

/// The chaos and failover suites' command: this test binary again, running
/// only this test, which does what `CHAOS_CHILD` says (support/chaos_child.rs).
#[test]
#[ignore = "the chaos and failover suites' child process; started by the suites themselves"]
fn chaos_child() {
    if let Ok(spec) = std::env::var("CHAOS_CHILD") {
        support::chaos_child::main(&spec);
    }
}
