//! The lease's values from the command line: `--advertise` shown by
//! `status` and `watch` for the tenure that wrote it, a lease kept by
//! `--min-hold` after its run ended told from one whose command still runs,
//! bad values refused before anything runs, and a table made by the
//! release before the values, upgraded in place. Against real servers.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::stores::{self, Server};
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

fn status(url: &str, name: &str, as_json: bool) -> String {
    let mut c = leaderrun();
    c.args(["--store", url, "status", "--name", name]);
    if as_json {
        c.arg("--json");
    }
    let out = run(c);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.stdout
}

/// What a user of `--advertise` and `--min-hold` relies on, on one store:
/// the command itself sees its value in `status` while it runs (not kept);
/// after it exits, the lease is shown kept by `--min-hold` with the value
/// still there; `watch --json` printed the acquisition with the value and
/// the new epoch; the next holder, advertising nothing, shows none.
fn values_on(srv: Server) {
    let dir = TempDir::new("advertise");
    let bin = env!("CARGO_BIN_EXE_leaderrun");
    // `watch` never creates the store (file or table): `init` does.
    let mut init = leaderrun();
    init.args(["--store", &srv.url, "init"]);
    let out = run(init);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (mut watch, lines) = watch_json(&srv.url, "adv", &dir);
    let first = lines.recv_timeout(10 * SEC).expect("watch's state line");
    assert_eq!(first["event"], "state", "{first}");

    let inside = dir.file("inside.json");
    let script = format!(
        "{bin} --store '{}' status --name adv --json > {}",
        srv.url,
        inside.display()
    );
    let out = run(lr(
        &srv.url,
        "adv",
        &["--advertise", "10.0.0.7:8080", "--min-hold", "20s"],
        &script,
    ));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let during = json(&read(&inside));
    assert_eq!(
        (&during["advertised"], &during["kept"], &during["live"]),
        (&"10.0.0.7:8080".into(), &false.into(), &true.into()),
        "while the command runs: {during}"
    );
    let epoch = during["epoch"].as_i64().expect("epoch");

    let after = json(&status(&srv.url, "adv", true));
    assert_eq!(
        (&after["advertised"], &after["kept"], &after["live"]),
        (&"10.0.0.7:8080".into(), &true.into(), &true.into()),
        "after the command ended, within --min-hold: {after}"
    );
    assert_eq!(after["epoch"], epoch, "{after}");
    let text = status(&srv.url, "adv", false);
    assert!(
        text.contains("kept by --min-hold (run ended)")
            && text.contains("advertises 10.0.0.7:8080"),
        "{text}"
    );

    let acquired = loop {
        let l = lines.recv_timeout(10 * SEC).expect("watch's acquired line");
        if l["event"] == "acquired" {
            break l;
        }
    };
    assert_eq!(
        (&acquired["advertised"], &acquired["epoch"]),
        (&"10.0.0.7:8080".into(), &epoch.into()),
        "{acquired}"
    );

    // An operator frees it; the next holder advertises nothing.
    let mut c = leaderrun();
    c.args(["--store", &srv.url, "release", "--name", "adv"]);
    assert_eq!(run(c).code, Some(0));
    let script = format!(
        "{bin} --store '{}' status --name adv --json > {}",
        srv.url,
        inside.display()
    );
    let out = run(lr(&srv.url, "adv", &[], &script));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let next = json(&read(&inside));
    assert_eq!(next["epoch"], epoch + 1, "{next}");
    assert_eq!(
        (&next["advertised"], &next["kept"]),
        (&serde_json::Value::Null, &false.into()),
        "a later tenure shows none of an earlier one's values: {next}"
    );
    signal(watch.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut watch, 5 * SEC).code(), Some(0));
}

#[test]
fn values_embedded() {
    values_on(stores::sqlite());
}

#[test]
fn values_postgres() {
    values_on(stores::postgres());
}

#[test]
fn values_mysql() {
    values_on(stores::mysql());
}

#[test]
fn values_redis() {
    values_on(stores::redis());
}

#[test]
fn values_etcd() {
    values_on(stores::etcd());
}

#[test]
fn values_zookeeper() {
    values_on(stores::zookeeper());
}

/// Bad values are refused before anything runs: exit 2, one line, no
/// command. Invalid UTF-8 too (clap's refusal).
#[test]
fn bad_values_are_refused() {
    use std::os::unix::ffi::OsStrExt;
    let dir = TempDir::new("advertise-bad");
    let url = format!("sqlite://{}", dir.file("l.db").display());
    let ran = dir.file("ran");
    let long = "a".repeat(257);
    let bad: Vec<(std::ffi::OsString, &str)> = vec![
        ("".into(), "must not be empty"),
        (long.clone().into(), "257 bytes long; at most 256"),
        ("a\tb".into(), "control characters"),
        ("a\nb".into(), "control characters"),
        (
            std::ffi::OsStr::from_bytes(b"a\xffb").to_os_string(),
            "UTF-8",
        ),
    ];
    for (value, says) in bad {
        let mut c = leaderrun();
        c.args(["--store", &url, "--name", "bad", "--advertise"])
            .arg(&value)
            .args(["--", "sh", "-c", &format!("touch {}", ran.display())]);
        let out = run(c);
        assert_eq!(out.code, Some(2), "{value:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{value:?}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
        assert!(!ran.exists(), "{value:?}: the command ran");
    }
    // 256 bytes of multi-byte text is within the bound.
    let fits = "é".repeat(128);
    let out = run(lr(&url, "ok", &["--advertise", &fits], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

/// The table as the release before the lease's values made it (with the
/// run record's columns of `--once-per`).
const PG_TABLE_BEFORE: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    timeline   bigint,
    run_started_at timestamptz,
    run_ended_at   timestamptz,
    run_holder     text,
    run_epoch      bigint,
    run_outcome    text
)";

/// Upgrading in place on Postgres, as a role with that release's grants:
/// plain runs keep working, `--min-hold` included (its lease reads as held,
/// since the table cannot record the mark); an `--advertise` run exits 125
/// naming the one statement and runs nothing; after `init` by the owner the
/// same role advertises, and a kept lease is told.
#[test]
fn postgres_a_table_made_before_the_values_is_upgraded_by_init() {
    let pg = crate::support::Pg::start();
    pg.sql(PG_TABLE_BEFORE);
    pg.sql("CREATE ROLE app LOGIN PASSWORD 'apppw'; GRANT SELECT, INSERT, UPDATE ON leader_lease TO app");
    let app = format!(
        "postgres://app:apppw@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    let out = run(lr(&app, "plain", &["--min-hold", "30s"], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stderr, "");
    let st = json(&status(&app, "plain", true));
    assert_eq!(
        (&st["live"], &st["kept"]),
        (&true.into(), &false.into()),
        "{st}"
    );

    let dir = TempDir::new("advertise-upgrade");
    let ran = dir.file("ran");
    let adv = |url: &str| {
        run(lr(
            url,
            "job",
            &["--advertise", "host-a:80", "--min-hold", "30s"],
            &format!("touch {}", ran.display()),
        ))
    };
    let out = adv(&app);
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(leaderrun::store::postgres::UPGRADE_SQL),
        "{}",
        out.stderr
    );
    assert!(!ran.exists(), "the command ran");
    let mut init = leaderrun();
    init.args(["init", "--store", &pg.url()]);
    let out = run(init);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = adv(&app);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(ran.exists());
    let st = json(&status(&app, "job", true));
    assert_eq!(
        (&st["advertised"], &st["kept"]),
        (&"host-a:80".into(), &true.into()),
        "{st}"
    );
}

/// The same on MySQL/MariaDB, whose upgrade is a statement of its own
/// (no `ADD COLUMN IF NOT EXISTS` on MySQL).
#[test]
fn mysql_a_table_made_before_the_values_is_upgraded_by_init() {
    let my = crate::support::mysql::My::start();
    my.sql(
        "CREATE TABLE leader_lease (
    name       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    holder     VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',
    run_started_at DATETIME(6) NULL,
    run_ended_at   DATETIME(6) NULL,
    run_holder     VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    run_epoch      BIGINT NULL,
    run_outcome    VARCHAR(64) CHARACTER SET utf8mb4 NULL
) ENGINE = InnoDB",
    );
    my.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'apppw'");
    my.sql("GRANT SELECT, INSERT, UPDATE ON lr.leader_lease TO 'app'@'%'");
    let app = format!("mysql://app:apppw@127.0.0.1:{}/lr", my.port);
    let out = run(lr(&app, "plain", &["--min-hold", "30s"], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = run(lr(&app, "job", &["--advertise", "host-a:80"], "true"));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(leaderrun::store::mysql::VALUES_UPGRADE_SQL),
        "{}",
        out.stderr
    );
    let mut init = leaderrun();
    init.args(["init", "--store", &my.url()]);
    let out = run(init);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = run(lr(
        &app,
        "job",
        &["--advertise", "host-a:80", "--min-hold", "30s"],
        "true",
    ));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let st = json(&status(&app, "job", true));
    assert_eq!(
        (&st["advertised"], &st["kept"]),
        (&"host-a:80".into(), &true.into()),
        "{st}"
    );
}
