//! `--once-per` on MySQL/MariaDB, Redis and etcd beyond the store-generic
//! tests of tests/once_per.rs: the upgrade of a MySQL table made by the
//! release before `--once-per`, Redis's keys and an ACL from that release,
//! etcd's refusal of a period it cannot keep half of. Against real servers.

use crate::support::etcd::Etcd;
use crate::support::mysql::My;
use crate::support::redis::Redis;
use crate::support::*;

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

/// Every key of a `--once-per` run has the lease's hash tag; the record has
/// no expiry, and the period key lives half the period (1h / 2) by Redis's
/// clock.
#[test]
fn redis_the_period_lives_half_the_period_and_the_record_for_good() {
    let r = Redis::start();
    let out = run(lr(&r.url(), "rec", &["--once-per", "1h"], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
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

/// etcd keeps the period as a lease of half of it, in whole seconds of at
/// least 2: any other period is refused before anything runs (exit 2, one
/// line naming why); 4s is the shortest it keeps.
#[test]
fn etcd_refuses_a_period_it_cannot_keep_half_of() {
    let e = Etcd::start();
    let dir = TempDir::new("once-etcd-usage");
    let ran = dir.file("ran");
    let script = format!("echo > {}", ran.display());
    for period in ["2s", "3s", "5s", "4500ms"] {
        let out = run(lr(&e.url(), "job", &["--once-per", period], &script));
        assert_eq!(out.code, Some(2), "{period}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("must be a multiple of 2s and at least 4s"),
            "{period}: {}",
            out.stderr
        );
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
        assert!(!ran.exists(), "{period}: the command ran");
    }
    let out = run(lr(&e.url(), "job", &["--once-per", "4s"], &script));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(ran.exists());
}

/// On the stores that delete an expired lease's key (Redis, etcd), a run
/// whose lease ran out before its hand-back still writes its end: the
/// record still names it, so no one has run since. Its release finds no
/// lease ("not ours"), and the record says `lost`.
fn an_expired_runs_end_is_still_recorded(url: &str) {
    use leaderrun::store::{open, Acquired, LeaseLock, Origin, Outcome};
    use std::time::Duration;
    let sec = Duration::from_secs(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut l = match open(Some((url, Origin::Flag)), "leaderrun-test", 5 * sec) {
            Ok(s) => s.lock("lost", "a"),
            Err(e) => panic!("cannot open {url}: {e}"),
        };
        l.once_per(leaderrun::store::Period::new(Duration::from_secs(1800)));
        let lease = l
            .capabilities()
            .grant(2 * sec)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            l.take(lease, 5 * sec).await.expect("take"),
            Acquired::Taken(1)
        );
        let t0 = std::time::Instant::now();
        while l
            .inspect(5 * sec)
            .await
            .expect("inspect")
            .is_some_and(|i| i.is_live())
        {
            assert!(t0.elapsed() < lease + 5 * sec, "never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        l.ending(Outcome::Lost);
        assert!(!l
            .release(1, Duration::ZERO, 5 * sec)
            .await
            .expect("release"));
    });
    let j = status_json(url, "lost");
    assert_eq!(j["last_run"]["outcome"], "lost", "{j}");
    assert!(j["last_run"]["ended_at"].is_string(), "{j}");
}

#[test]
fn redis_an_expired_runs_end_is_still_recorded() {
    let r = Redis::start();
    an_expired_runs_end_is_still_recorded(&r.url());
}

#[test]
fn etcd_an_expired_runs_end_is_still_recorded() {
    let e = Etcd::start();
    an_expired_runs_end_is_still_recorded(&e.url());
}
