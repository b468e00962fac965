//! `init --print` prints the configured store's dialect, named; a read-only
//! database (a standby, a primary demoted during failover) is a store that
//! may heal: `--wait` keeps trying.

use std::time::Duration;

use crate::support::{
    leaderrun, lr, run, spawn, wait_exit, wait_file, wait_for, Output, Pg, TempDir,
};

fn admin(store: Option<&str>, args: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(args);
    if let Some(s) = store {
        c.args(["--store", s]);
    }
    run(c)
}

#[test]
fn init_print_names_the_dialect_of_the_configured_store() {
    let dir = TempDir::new("initprint");
    // Nothing configured: the Postgres table (the embedded store makes its own).
    let r = admin(None, &["init", "--print"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout
            .starts_with("-- leaderrun lease table, no store configured; dialect: PostgreSQL"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("timestamptz"), "{}", r.stdout);
    // DATABASE_URL counts as configured.
    let mut c = leaderrun();
    c.env("DATABASE_URL", "postgres://u@127.0.0.1:1/x")
        .args(["init", "--print"]);
    let r = run(c);
    assert!(
        r.stdout
            .starts_with("-- leaderrun lease table, dialect: PostgreSQL"),
        "{}",
        r.stdout
    );
    let lite = format!("sqlite://{}", dir.file("l.db").display());
    let r = admin(Some(&lite), &["init", "--print"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout
            .starts_with("-- leaderrun lease table, dialect: SQLite"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("boot_id"), "{}", r.stdout);
    assert!(!dir.file("l.db").exists(), "--print connected");
    let r = admin(Some("mysql://u:pw@127.0.0.1:1/x"), &["init", "--print"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout
            .starts_with("-- leaderrun lease table, dialect: MySQL/MariaDB"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("DATETIME(6)"), "{}", r.stdout);
}

/// The printed Postgres SQL, piped into psql, gives a table every later run
/// can use (the bug was an `integer` expiry from the SQLite dialect).
#[test]
fn init_print_piped_into_postgres_makes_a_working_table() {
    let pg = Pg::start();
    let r = admin(None, &["init", "--print"]);
    pg.sql(r.stdout.trim());
    assert_eq!(run(lr(&pg.url(), "x", &[], "true")).code, Some(0));
    assert_eq!(pg.lease_row("x"), "|1|f");
}

fn read_only(pg: &Pg, on: bool) {
    pg.sql(&format!(
        "ALTER SYSTEM SET default_transaction_read_only = {}",
        if on { "on" } else { "off" }
    ));
    pg.sql("SELECT pg_reload_conf()");
    // Wait until new sessions see the setting.
    let want = if on { "on" } else { "off" };
    wait_for("the reload", Duration::from_secs(5), || {
        pg.try_sql("SHOW default_transaction_read_only").as_deref() == Ok(want)
    });
}

/// A read-only server, with the table missing and with it present: `--wait`
/// keeps trying (no CREATE-grant hint, no exit 125) and runs the command
/// once the server takes writes again.
#[test]
fn a_read_only_database_is_waited_out() {
    for table in [false, true] {
        let pg = Pg::start();
        let dir = TempDir::new("readonly");
        if table {
            pg.sql(leaderrun::store::postgres::TABLE_SQL);
        }
        read_only(&pg, true);
        let ran = dir.file("ran");
        let log = dir.file("log");
        let mut child = spawn(
            lr(
                &pg.url(),
                "ro",
                &["--wait", "--retry", "200ms", "--lease", "3s"],
                &format!("touch {}", ran.display()),
            ),
            &log,
        );
        wait_for("a read-only warning", Duration::from_secs(10), || {
            crate::support::read(&log).contains("read-only")
        });
        // Several retries later it is still waiting, not failed.
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "exited: {}",
            crate::support::read(&log)
        );
        let text = crate::support::read(&log);
        assert!(!text.contains("grant CREATE"), "{text}");
        assert!(!ran.exists());
        read_only(&pg, false);
        wait_file(&ran, Duration::from_secs(10));
        assert_eq!(
            wait_exit(&mut child, Duration::from_secs(10)).code(),
            Some(0),
            "{}",
            crate::support::read(&log)
        );
    }
}

/// Try-once against a read-only server fails (125) without the
/// CREATE-grant hint, which would send the operator the wrong way.
#[test]
fn try_once_on_a_read_only_database_says_read_only() {
    let pg = Pg::start();
    read_only(&pg, true);
    let r = run(lr(&pg.url(), "ro", &[], "true"));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(r.stderr.contains("read-only"), "{}", r.stderr);
    assert!(!r.stderr.contains("grant CREATE"), "{}", r.stderr);
}

/// status, check and release against a database without the lease table:
/// 125 with one line naming the database (password hidden) and `leaderrun
/// init`, and the table is still missing afterwards. A run creates it.
fn looking_never_creates(url: &str, password: &str, table_exists: &dyn Fn() -> bool) {
    assert!(!table_exists());
    let shown = url.replace(password, "***");
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["status", "--name", "x"],
        &["check", "--name", "x", "--epoch", "1"],
        &["release", "--name", "x"],
    ] {
        let r = admin(Some(url), args);
        assert_eq!(r.code, Some(125), "{args:?}: {}{}", r.stdout, r.stderr);
        assert_eq!(r.stdout, "", "{args:?}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(&shown), "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("`leaderrun init`"),
            "{args:?}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains(password), "{args:?}: {}", r.stderr);
        assert!(!table_exists(), "{args:?} created the table");
    }
    let r = run(lr(url, "x", &[], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(table_exists());
    assert_eq!(admin(Some(url), &["status", "--name", "x"]).code, Some(0));
}

#[test]
fn looking_never_creates_the_table_postgres() {
    let pg = Pg::start();
    looking_never_creates(&pg.url(), crate::support::pg::PASSWORD, &|| {
        pg.sql("SELECT to_regclass('leader_lease') IS NOT NULL") == "t"
    });
}

#[test]
fn looking_never_creates_the_table_mariadb() {
    let my = crate::support::mysql::My::start();
    looking_never_creates(&my.url(), crate::support::mysql::PASSWORD, &|| {
        my.sql(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = 'lr' AND table_name = 'leader_lease'",
        ) == "1"
    });
}

/// `init` as a login that lacks what a run needs: 125 naming exactly what
/// is missing, never "ready". With exactly the documented grants (no
/// more): "ready", and a run acquires, renews and releases, and status,
/// check and release work.
fn init_checks_the_grants(
    app: &str,
    app_password: &str,
    grant: &dyn Fn(&str),
    revoke_notify: Option<&dyn Fn(bool)>,
) {
    let all = ["SELECT", "INSERT", "UPDATE"];
    let lacks = |r: &Output, missing: &[&str]| {
        assert_eq!(r.code, Some(125), "{}{}", r.stdout, r.stderr);
        assert!(!r.stdout.contains("ready"), "{}", r.stdout);
        assert!(!r.stderr.contains(app_password), "{}", r.stderr);
        for p in all {
            let named = r.stderr.contains(&format!("{p} on leader_lease"));
            assert_eq!(named, missing.contains(&p), "{p}: {}", r.stderr);
        }
    };
    // No grant at all: MariaDB refuses the login to the database itself.
    let r = admin(Some(app), &["init"]);
    assert_eq!(r.code, Some(125), "{}{}", r.stdout, r.stderr);
    assert!(!r.stdout.contains("ready"), "{}", r.stdout);
    assert!(
        r.stderr.contains("SELECT, INSERT, UPDATE ON"),
        "{}",
        r.stderr
    );
    grant("SELECT");
    lacks(&admin(Some(app), &["init"]), &["INSERT", "UPDATE"]);
    grant("INSERT, UPDATE");
    if let Some(revoke) = revoke_notify {
        revoke(true);
        let r = admin(Some(app), &["init"]);
        assert_eq!(r.code, Some(125), "{}", r.stderr);
        assert!(
            r.stderr.contains("EXECUTE on pg_notify(text, text)"),
            "{}",
            r.stderr
        );
        revoke(false);
    }
    let r = admin(Some(app), &["init"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.starts_with("lease table ready in "),
        "{}",
        r.stdout
    );

    // What "ready" promises: a run that renews (R = 333 ms) and releases...
    let dir = TempDir::new("grants");
    let r = run(lr(app, "g", &["-vv", "--lease", "1s"], "sleep 1.2"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("renewed"), "{}", r.stderr);
    assert!(r.stderr.contains("released"), "{}", r.stderr);
    assert!(!r.stderr.contains("WARN"), "{}", r.stderr);
    // ...and the operator's subcommands.
    let mut a = spawn(
        lr(
            app,
            "g",
            &["--lease", "30s"],
            &crate::support::worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), Duration::from_secs(10));
    let r = admin(Some(app), &["status", "--name", "g"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("held, expires in"), "{}", r.stdout);
    let r = admin(Some(app), &["check", "--name", "g", "--epoch", "2"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    crate::support::kill_holder_and_watchdog(&mut a);
    let r = admin(Some(app), &["release", "--name", "g", "--epoch", "2"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = run(lr(app, "g", &[], "echo $LEASE_EPOCH"));
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "3"), "{}", r.stderr);
}

#[test]
fn init_checks_the_grants_postgres() {
    let pg = Pg::start();
    pg.sql(leaderrun::store::postgres::TABLE_SQL);
    pg.sql("CREATE ROLE app LOGIN PASSWORD 'App-pw-81x'");
    let app = format!(
        "postgres://app:App-pw-81x@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    init_checks_the_grants(
        &app,
        "App-pw-81x",
        &|p| {
            pg.sql(&format!("GRANT {p} ON leader_lease TO app"));
        },
        Some(&|revoked| {
            pg.sql(&format!(
                "{} EXECUTE ON FUNCTION pg_notify(text, text) {} PUBLIC",
                if revoked { "REVOKE" } else { "GRANT" },
                if revoked { "FROM" } else { "TO" }
            ));
        }),
    );
}

#[test]
fn init_checks_the_grants_mariadb() {
    let my = crate::support::mysql::My::start();
    my.sql(leaderrun::store::mysql::TABLE_SQL);
    my.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'App-pw-81x'");
    let app = format!("mysql://app:App-pw-81x@127.0.0.1:{}/lr", my.port);
    init_checks_the_grants(
        &app,
        "App-pw-81x",
        &|p| {
            my.sql(&format!("GRANT {p} ON lr.leader_lease TO 'app'@'%'"));
        },
        None,
    );
}
