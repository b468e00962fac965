//! `init --print` prints the configured store's dialect, named; a read-only
//! database (a standby, a primary demoted during failover) is a store that
//! may heal: `--wait` keeps trying.

mod support;

use std::time::Duration;

use support::{leaderrun, lr, run, spawn, wait_exit, wait_file, wait_for, Output, Pg, TempDir};

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
            support::read(&log).contains("read-only")
        });
        // Several retries later it is still waiting, not failed.
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "exited: {}",
            support::read(&log)
        );
        let text = support::read(&log);
        assert!(!text.contains("grant CREATE"), "{text}");
        assert!(!ran.exists());
        read_only(&pg, false);
        wait_file(&ran, Duration::from_secs(10));
        assert_eq!(
            wait_exit(&mut child, Duration::from_secs(10)).code(),
            Some(0),
            "{}",
            support::read(&log)
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
