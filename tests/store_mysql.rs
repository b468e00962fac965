//! The MySQL/MariaDB store end to end: the real binary against a throwaway
//! MariaDB (the contract itself is in tests/conformance.rs).

use std::time::Duration;

use crate::support::mysql::My;
use crate::support::{leaderrun, lr, run, spawn, wait_exit, wait_file, worker, Output, TempDir};

fn admin(store: &str, args: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(args).args(["--store", store]);
    run(c)
}

#[test]
fn the_binary_runs_holds_and_hands_over_on_mysql() {
    let my = My::start();
    let dir = TempDir::new("mye2e");
    let url = my.url();
    // `mariadb://` is the same store.
    let maria = url.replacen("mysql://", "mariadb://", 1);
    let r = run(lr(&maria, "job", &[], "echo $LEASE_EPOCH"));
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "1"), "{}", r.stderr);

    let mut a = spawn(
        lr(&url, "job", &["--lease", "2s"], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), Duration::from_secs(10));
    assert_eq!(crate::support::read(&dir.file("a.epoch")).trim(), "2");
    // Held: try-once skips with the conflict exit code, starting nothing.
    let r = run(lr(
        &url,
        "job",
        &["--conflict-exit-code", "3"],
        "touch never",
    ));
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    // Renewals keep it past several lease lengths.
    std::thread::sleep(Duration::from_millis(2500));
    let r = admin(&url, &["check", "--name", "job", "--epoch", "2"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = admin(&url, &["status", "--name", "job", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(
        (j["epoch"].as_i64(), j["live"].as_bool()),
        (Some(2), Some(true)),
        "{}",
        r.stdout
    );
    // A waiting contender takes over when the holder stops.
    let mut b = spawn(
        lr(
            &url,
            "job",
            &["--wait", "--retry", "100ms", "--lease", "2s"],
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    crate::support::signal(a.id(), nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut a, Duration::from_secs(10)).code(),
        Some(128 + 15)
    );
    wait_file(&dir.file("b.pid"), Duration::from_secs(5));
    assert_eq!(crate::support::read(&dir.file("b.epoch")).trim(), "3");
    // release by an operator: b's next renewal fails and it stops (75).
    let r = admin(&url, &["release", "--name", "job", "--epoch", "3"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(wait_exit(&mut b, Duration::from_secs(10)).code(), Some(75));
    let r = admin(&url, &["init"]);
    assert_eq!(
        (r.code, r.stdout.trim()),
        (
            Some(0),
            format!(
                "lease table ready in {}",
                url.replace(crate::support::mysql::PASSWORD, "***")
            )
            .as_str()
        )
    );
}

#[test]
fn a_wrong_password_is_125_at_once_and_never_echoed() {
    let my = My::start();
    let t0 = std::time::Instant::now();
    let r = run(lr(&my.url_with("Wr0ng-Secret"), "j", &["--wait"], "true"));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "a wrong password is not retried"
    );
    assert!(r.stderr.contains("Access denied"), "{}", r.stderr);
    assert!(!r.stderr.contains("Wr0ng-Secret"), "{}", r.stderr);
}

/// A role that may not create tables works once the table from
/// `init --print` exists; until then the error says what to do.
#[test]
fn the_printed_table_serves_a_role_without_create() {
    let my = My::start();
    my.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'apppw'");
    let app = format!("mysql://app:apppw@127.0.0.1:{}/lr", my.port);
    my.sql("GRANT SELECT ON lr.* TO 'app'@'%'");
    let r = run(lr(&app, "x", &[], "true"));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(r.stderr.contains("init --print"), "{}", r.stderr);
    assert!(!r.stderr.contains("apppw"), "{}", r.stderr);
    let sql = admin(&app, &["init", "--print"]).stdout;
    assert!(
        sql.starts_with("-- leaderrun lease table, dialect: MySQL/MariaDB"),
        "{sql}"
    );
    my.sql(sql.trim().trim_end_matches(';'));
    my.sql("GRANT SELECT, INSERT, UPDATE ON lr.leader_lease TO 'app'@'%'");
    let r = run(lr(&app, "x", &[], "echo $LEASE_EPOCH"));
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "1"), "{}", r.stderr);
}

/// Expiry is kept in UTC whatever the session's time zone (here one the URL
/// asks for): a lease written now is about L ahead of UTC_TIMESTAMP, seen
/// from a session in yet another zone. With NOW() it would be 9.5 h off.
#[test]
fn expiry_is_utc_whatever_the_time_zone() {
    let my = My::start();
    let url = format!("{}?timezone=%2B09:30", my.url());
    let r = run(lr(&url, "tz", &["--min-hold", "60s"], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let ahead = my.sql(
        "SET time_zone = '-07:00'; \
         SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), expires_at) FROM leader_lease WHERE name = 'tz'",
    );
    let ahead: i64 = ahead.parse().expect("seconds");
    assert!((55..=60).contains(&ahead), "{ahead}");
}

/// A read-only server (a replica, a primary demoted during failover) may
/// heal: the error is "unavailable", so `--wait` keeps trying.
#[test]
fn a_read_only_server_may_heal() {
    use leaderrun::store::{open, LeaseLock, Origin};
    let my = My::start();
    my.sql(leaderrun::store::mysql::TABLE_SQL);
    my.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'apppw'");
    my.sql("GRANT SELECT, INSERT, UPDATE ON lr.leader_lease TO 'app'@'%'");
    my.sql("SET GLOBAL read_only = 1");
    let app = format!("mysql://app:apppw@127.0.0.1:{}/lr", my.port);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let t = Duration::from_secs(5);
        let mut s = open(Some((&app, Origin::Flag)), "t", t)
            .expect("open")
            .lock("n", "a");
        let err = s.acquire(t, t).await.expect_err("read-only");
        assert!(err.may_heal(), "{err:?}");
        my.sql("SET GLOBAL read_only = 0");
        assert_eq!(s.acquire(t, t).await.expect("acquire"), Some(1));
    });
}

/// A URL without a database, or with a `require` leaderrun does not know,
/// is a usage error (2) naming what is wrong, for the run form and the
/// subcommands alike, without the password and before any connection.
#[test]
fn a_url_without_a_database_or_with_an_unknown_require_is_a_usage_error() {
    for (url, says) in [
        ("mysql://lr:Pw-n0-db-1@127.0.0.1:1", "names no database"),
        ("mysql://lr:Pw-n0-db-1@127.0.0.1:1/", "names no database"),
        (
            "mariadb://lr:Pw-n0-db-1@127.0.0.1:1/?ssl-mode=DISABLED",
            "names no database",
        ),
        (
            "mysql://lr:Pw-n0-db-1@127.0.0.1:1/lr?require=quorum",
            "require=quorum",
        ),
    ] {
        let r = run(lr(url, "j", &[], "true"));
        assert_eq!(r.code, Some(2), "{url}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{url}: {}", r.stderr);
        assert!(!r.stderr.contains("Pw-n0-db-1"), "{}", r.stderr);
        let r = admin(url, &["status"]);
        assert_eq!(r.code, Some(2), "{url}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{url}: {}", r.stderr);
    }
}
