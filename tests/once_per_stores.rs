//! `--once-per` end to end on the stores beyond Postgres (tests/once_per.rs):
//! racing firings, the run record in `status`, and the upgrade of a table
//! made by the release before `--once-per`. Against real servers.

use std::process::Child;

use crate::support::mysql::My;
use crate::support::redis::Redis;
use crate::support::*;

/// The status a skipped firing exits with here (`--conflict-exit-code`).
const SKIP: i32 = 3;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

fn status_json(url: &str, name: &str) -> serde_json::Value {
    let mut c = leaderrun();
    c.args(["--store", url, "status", "--name", name, "--json"]);
    let out = run(c);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    json(&out.stdout)
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Six firings of one period at once: one runs, five skip as "done this
/// period"; then the record of a run that exited 7.
fn six_racing_firings_run_once_and_leave_a_record(url: &str) {
    let dir = TempDir::new("once-race");
    let runs = dir.file("runs");
    let script = format!("echo ran >> {}; sleep 0.3", runs.display());
    let kids: Vec<Child> = (0..6)
        .map(|_| {
            let skip = SKIP.to_string();
            let mut c = lr(
                url,
                "race",
                &["-v", "--once-per", "1h", "--conflict-exit-code", &skip],
                &script,
            );
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c.spawn().expect("spawn leaderrun")
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| k.wait_with_output().expect("wait"))
        .collect();
    let codes: Vec<_> = outs.iter().map(|o| o.status.code()).collect();
    let errs: Vec<_> = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert_eq!(lines(&runs), ["ran"], "codes {codes:?} {errs:?}");
    assert_eq!(
        codes.iter().filter(|c| **c == Some(0)).count(),
        1,
        "{codes:?} {errs:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == Some(SKIP)).count(),
        5,
        "{codes:?} {errs:?}"
    );
    for o in outs.iter().filter(|o| o.status.code() == Some(SKIP)) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("this period's run started"), "{err}");
    }
    let out = run(lr(
        url,
        "rec",
        &["--once-per", "1h", "--holder", "h1"],
        "exit 7",
    ));
    assert_eq!(out.code, Some(7), "{}", out.stderr);
    let j = status_json(url, "rec");
    let r = &j["last_run"];
    assert_eq!(r["outcome"], "exit 7", "{j}");
    assert_eq!(r["holder"], "h1", "{j}");
    assert_eq!(r["epoch"], j["epoch"], "{j}");
    let (started, ended) = (r["started_ms_ago"].as_i64(), r["ended_ms_ago"].as_i64());
    assert!(
        started.zip(ended).is_some_and(|(s, e)| s >= e && e >= 0),
        "{j}"
    );
    assert!(
        r["started_at"].as_str().is_some_and(|s| s.ends_with('Z')),
        "{j}"
    );
    assert!(r["ended_at"].is_string(), "{j}");
    // A second firing of that period skips, the lease being free.
    let out = run(lr(url, "rec", &["--once-per", "1h"], "exit 9"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(status_json(url, "rec")["last_run"]["outcome"], "exit 7");
    // A lease without --once-per has no record.
    assert_eq!(run(lr(url, "plain", &[], "true")).code, Some(0));
    assert!(status_json(url, "plain").get("last_run").is_none());
}

#[test]
fn mysql_six_racing_firings_run_once_and_leave_a_record() {
    let my = My::start();
    six_racing_firings_run_once_and_leave_a_record(&my.url());
}

/// The table as the release before `--once-per` made it.
const MYSQL_TODAYS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    holder     VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00'
) ENGINE = InnoDB";

/// Upgrading in place on MySQL/MariaDB: a login with that release's grants
/// keeps running plain runs; a `--once-per` run exits 125 naming the one
/// statement; `init --print` prints it; after `init` by a login that may
/// alter the table the same login runs `--once-per`. A login that may
/// alter it needs no `init`.
#[test]
fn mysql_a_table_made_before_once_per_is_upgraded() {
    let my = My::start();
    my.sql(MYSQL_TODAYS_TABLE_SQL);
    my.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'apppw'");
    my.sql("GRANT SELECT, INSERT, UPDATE ON lr.leader_lease TO 'app'@'%'");
    let app = format!("mysql://app:apppw@127.0.0.1:{}/lr", my.port);
    let out = run(lr(&app, "plain", &[], "echo $LEASE_EPOCH"));
    assert_eq!(
        (out.code, out.stdout.trim()),
        (Some(0), "1"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr, "");
    let dir = TempDir::new("once-upgrade-my");
    let ran = dir.file("ran");
    let once = |url: &str| {
        run(lr(
            url,
            "job",
            &["--once-per", "1h"],
            &format!("echo >> {}", ran.display()),
        ))
    };
    let out = once(&app);
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(leaderrun::store::mysql::UPGRADE_SQL),
        "{}",
        out.stderr
    );
    assert!(!ran.exists(), "the command ran without the rule");
    // The plain run still works, and status shows no record, without asking.
    assert_eq!(run(lr(&app, "plain", &[], "true")).code, Some(0));
    assert!(status_json(&app, "plain").get("last_run").is_none());
    let mut print = leaderrun();
    print.args(["init", "--print", "--store", &app]);
    let out = run(print);
    assert!(
        out.stdout.contains(leaderrun::store::mysql::UPGRADE_SQL),
        "{}",
        out.stdout
    );
    // `lr` owns the database: init adds the columns.
    let mut init = leaderrun();
    init.args(["init", "--store", &my.url()]);
    let out = run(init);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = once(&app);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(lines(&ran).len(), 1);
    assert_eq!(status_json(&app, "job")["last_run"]["outcome"], "exit 0");
    // A login that may alter the table needs no init.
    my.sql("DROP TABLE leader_lease");
    my.sql(MYSQL_TODAYS_TABLE_SQL);
    let out = run(lr(&my.url(), "job", &["--once-per", "1h"], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        status_json(&my.url(), "job")["last_run"]["outcome"],
        "exit 0"
    );
}

#[test]
fn redis_six_racing_firings_run_once_and_leave_a_record() {
    let r = Redis::start();
    six_racing_firings_run_once_and_leave_a_record(&r.url());
    // Every key is the lease's hash tag's, the record has no expiry, and
    // the period key lives half the period (1h / 2) by Redis's clock.
    assert_eq!(r.cli(&["PTTL", "{leaderrun:rec}:run"]), "-1");
    let pttl: i64 = r
        .cli(&["PTTL", "{leaderrun:rec}:period"])
        .parse()
        .unwrap_or(0);
    assert!((1_700_000..=1_800_000).contains(&pttl), "{pttl}");
}

/// A user made by the ACL line of the release before `--once-per` (no
/// `TIME`, `HSET`, `HMGET`): every plain run works as before; a
/// `--once-per` run exits 125 naming the command refused, and runs nothing.
#[test]
fn redis_an_acl_without_the_record_commands_refuses_only_once_per() {
    let r = Redis::start();
    let mut acl = vec![
        "ACL",
        "SETUSER",
        "old",
        "on",
        ">old-pw",
        "resetkeys",
        "~{leaderrun:*",
    ];
    acl.extend(["resetchannels", "&{leaderrun:*", "-@all"]);
    acl.extend([
        "+ping",
        "+eval",
        "+evalsha",
        "+exists",
        "+incr",
        "+set",
        "+get",
        "+pexpire",
        "+del",
        "+publish",
        "+pttl",
        "+info",
        "+scan",
        "+subscribe",
        "+wait",
    ]);
    assert_eq!(r.cli(&acl), "OK");
    let url = format!("redis://old:old-pw@127.0.0.1:{}/0", r.port);
    let out = run(lr(&url, "plain", &[], "echo $LEASE_EPOCH"));
    assert_eq!(
        (out.code, out.stdout.trim()),
        (Some(0), "1"),
        "{}",
        out.stderr
    );
    let dir = TempDir::new("once-acl");
    let ran = dir.file("ran");
    let out = run(lr(
        &url,
        "job",
        &["--once-per", "1h"],
        &format!("echo > {}", ran.display()),
    ));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(out.stderr.contains("+time +hset +hmget"), "{}", out.stderr);
    assert!(!ran.exists(), "the command ran without the rule");
    // Nothing was left behind: plain runs of the name still work.
    assert_eq!(run(lr(&url, "job", &[], "true")).code, Some(0));
}
