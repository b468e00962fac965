//! The operator's surface: subcommands on both stores, systemd notify, JSON
//! logs and the metrics file.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::support::*;
use nix::sys::signal::Signal;

const SEC: Duration = Duration::from_secs(1);

fn admin(store: &str, args: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(args).args(["--store", store]);
    run(c)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// status, release and check, as an operator would use them after a holder
/// died without releasing its lease.
fn subcommands_against(store: &str) {
    let dir = TempDir::new("admin");
    let lease = ["--lease", "30s", "--holder", "host-a:1"];
    let mut a = spawn(
        lr(store, "sweep", &lease, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);

    let r = admin(store, &["status", "--name", "sweep"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("host-a:1") && r.stdout.contains("held, expires in"),
        "{}",
        r.stdout
    );
    let j = json(&admin(store, &["status", "--name", "sweep", "--json"]).stdout);
    assert_eq!(j["holder"], "host-a:1");
    assert_eq!(j["epoch"], 1);
    assert_eq!(j["live"], true);
    let left = j["expires_in_ms"].as_i64().unwrap();
    assert!(left > 25_000 && left <= 30_000, "{j}");
    let all = json(&admin(store, &["status", "--json"]).stdout);
    assert_eq!(all.as_array().map(Vec::len), Some(1));
    assert_eq!(admin(store, &["status", "--name", "nope"]).code, Some(1));

    assert_eq!(
        admin(store, &["check", "--name", "sweep", "--epoch", "1"]).code,
        Some(0)
    );
    let r = admin(store, &["check", "--name", "sweep", "--epoch", "2"]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("not live at epoch 2"), "{}", r.stderr);

    // The holder and its watchdog die without releasing: the lease would
    // block for 30 s.
    kill_holder_and_watchdog(&mut a);
    assert_eq!(
        admin(store, &["release", "--name", "sweep", "--epoch", "7"]).code,
        Some(1),
        "wrong epoch"
    );
    let r = admin(store, &["release", "--name", "sweep"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("was held by host-a:1 at epoch 1"),
        "{}",
        r.stdout
    );
    assert_eq!(
        admin(store, &["release", "--name", "sweep"]).code,
        Some(1),
        "nothing left to release"
    );

    // A rival now acquires at once, with a higher epoch, and `check` follows.
    let mut b = spawn(
        lr(store, "sweep", &[], &worker(&dir, "b")),
        &dir.file("b.log"),
    );
    wait_file(&dir.file("b.pid"), 5 * SEC);
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    assert_eq!(
        admin(store, &["check", "--name", "sweep", "--epoch", "1"]).code,
        Some(1)
    );
    assert_eq!(
        admin(store, &["check", "--name", "sweep", "--epoch", "2"]).code,
        Some(0)
    );
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
    assert_eq!(
        admin(store, &["check", "--name", "sweep", "--epoch", "2"]).code,
        Some(1),
        "released"
    );

    // The child itself can check, from the environment leaderrun gives it.
    let out = dir.file("check");
    let script = format!(
        "{} check --store '{store}'; echo $? > {}",
        env!("CARGO_BIN_EXE_leaderrun"),
        out.display()
    );
    assert_eq!(run(lr(store, "sweep", &[], &script)).code, Some(0));
    assert_eq!(read(&out).trim(), "0");

    // After expiry, status says how long ago.
    assert_eq!(
        run(lr(store, "short", &["--min-hold", "300ms"], "true")).code,
        Some(0)
    );
    std::thread::sleep(Duration::from_millis(400));
    let j = json(&admin(store, &["status", "--name", "short", "--json"]).stdout);
    assert_eq!(j["live"], false, "{j}");
    assert!(j["expires_in_ms"].as_i64().unwrap() < 0, "{j}");
    let r = admin(store, &["status", "--name", "short"]);
    assert!(
        r.stdout.contains("expired") && r.stdout.contains("ago"),
        "{}",
        r.stdout
    );
}

#[test]
fn subcommands_on_postgres() {
    let pg = Pg::start();
    subcommands_against(&pg.url());
}

/// The same through PgBouncer: every run form, status, release and check
/// call (and the watchdog's hand-back) goes through the pooler.
#[test]
fn subcommands_through_pgbouncer_in_transaction_mode() {
    let pg = Pg::start();
    let b = pgbouncer::Bouncer::start(&pg, pgbouncer::Mode::Transaction);
    subcommands_against(&b.url());
}

#[test]
fn subcommands_through_pgbouncer_in_session_mode() {
    let pg = Pg::start();
    let b = pgbouncer::Bouncer::start(&pg, pgbouncer::Mode::Session);
    subcommands_against(&b.url());
}

#[test]
fn subcommands_on_the_embedded_store() {
    let dir = TempDir::new("admin-sqlite");
    subcommands_against(&format!("sqlite://{}", dir.file("leases.db").display()));
}

#[test]
fn init_creates_the_table_or_prints_its_sql() {
    let pg = Pg::start();
    let r = admin(&pg.url(), &["init", "--print"]);
    assert_eq!(r.code, Some(0));
    assert!(
        r.stdout
            .starts_with("-- leaderrun lease table, dialect: PostgreSQL")
            && r.stdout
                .contains("\nCREATE TABLE IF NOT EXISTS leader_lease"),
        "{}",
        r.stdout
    );
    assert_eq!(
        pg.sql("SELECT to_regclass('leader_lease') IS NULL"),
        "t",
        "--print creates nothing"
    );
    let r = admin(&pg.url(), &["init"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(pg.sql("SELECT to_regclass('leader_lease') IS NULL"), "f");
    // The printed SQL is what a DBA runs for a role that may not create tables.
    pg.sql("DROP TABLE leader_lease; CREATE ROLE app LOGIN PASSWORD 'apppw'; REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    let app = format!(
        "postgres://app:apppw@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    let r = admin(&app, &["init"]);
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(!r.stderr.contains("apppw"));
    pg.sql(admin(&pg.url(), &["init", "--print"]).stdout.trim());
    pg.sql("GRANT SELECT, INSERT, UPDATE ON leader_lease TO app");
    assert_eq!(run(lr(&app, "x", &[], "true")).code, Some(0));
}

/// The run form is unchanged by the subcommands, even for a command that is
/// literally called `status`.
#[test]
fn a_command_named_status_still_runs() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("named");
    let bin = dir.file("status");
    std::fs::write(&bin, "#!/bin/sh\nexit 42\n").unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = format!("sqlite://{}", dir.file("l.db").display());
    let mut c = leaderrun();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.env("PATH", path)
        .args(["--store", &store, "--name", "status", "--", "status"]);
    assert_eq!(run(c).code, Some(42));
}

#[test]
fn systemd_hears_ready_and_current_status() {
    let pg = Pg::start();
    let dir = TempDir::new("notify");
    let sock_path = dir.file("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(10 * SEC)).unwrap();
    let mut a = spawn(
        lr(
            &pg.url(),
            "svc",
            &["--holder", "host-a:9"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);

    let env_out = dir.file("env");
    let b_script = format!(
        "echo \"${{NOTIFY_SOCKET:-unset}}\" > {}; {}",
        env_out.display(),
        worker(&dir, "b")
    );
    let mut c = lr(&pg.url(), "svc", &["--wait", "--retry", "100ms"], &b_script);
    c.env("NOTIFY_SOCKET", &sock_path);
    let mut b = spawn(c, &dir.file("b.log"));
    let mut buf = [0u8; 4096];
    let mut next = || {
        let n = sock.recv(&mut buf).expect("a notify message");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(next(), "READY=1\nSTATUS=contending for lease svc");
    let m = next();
    assert!(
        m.starts_with("STATUS=waiting; lease svc held by host-a:9 (epoch 1) for another"),
        "{m}"
    );
    signal(a.id(), Signal::SIGTERM);
    wait_exit(&mut a, 5 * SEC);
    let mut m = next();
    while m.starts_with("STATUS=waiting") {
        m = next();
    }
    assert_eq!(m, "STATUS=leading, epoch 2");
    wait_file(&dir.file("b.pid"), 5 * SEC);
    assert_eq!(
        read(&env_out).trim(),
        "unset",
        "the child must not inherit NOTIFY_SOCKET"
    );
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
    assert_eq!(next(), "STOPPING=1");
}

#[test]
fn every_json_log_line_parses_and_names_its_event() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    let dir = TempDir::new("jsonlog");
    // A lease lost to a silent store exercises most events.
    let args = [
        "--lease",
        "2s",
        "-vv",
        "--log-format",
        "json",
        "--holder",
        "h\"1",
    ];
    let mut a = spawn(
        lr(&pg.url_via(proxy.port), "j", &args, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_for("a renewal", 5 * SEC, || {
        read(&dir.file("a.log")).contains("\"renewed\"")
    });
    proxy.blackhole();
    assert_eq!(wait_exit(&mut a, 5 * SEC).code(), Some(75));
    let r = run(lr(
        &pg.url(),
        "j",
        &["-v", "--log-format", "json", "--wait", "--retry", "100ms"],
        "exit 0",
    ));
    let text = read(&dir.file("a.log")) + &r.stderr;
    let mut events = Vec::new();
    for line in text.lines() {
        let v = json(line);
        for k in [
            "time", "level", "event", "name", "epoch", "holder", "message",
        ] {
            assert!(v.get(k).is_some(), "{k} missing in {line}");
        }
        assert_eq!(v["name"], "j");
        events.push(v["event"].as_str().unwrap().to_string());
    }
    for want in [
        "store",
        "acquired",
        "started",
        "renewed",
        "renew_failed",
        "lost",
        "stopped",
        "exited",
        "released",
    ] {
        assert!(
            events.iter().any(|e| e == want),
            "no {want} event in {events:?}"
        );
    }
    let acquired = text
        .lines()
        .map(json)
        .find(|v| v["event"] == "acquired")
        .unwrap();
    assert_eq!(acquired["holder"], "h\"1");
    assert_eq!(acquired["epoch"], 1);
}

/// `name{labels} value` lines of a Prometheus text file, by metric name.
fn metrics(path: &std::path::Path) -> std::collections::HashMap<String, f64> {
    let text = read(path);
    let mut out = std::collections::HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let name = series.split('{').next().unwrap().to_string();
        assert!(series.ends_with("{name=\"m\"}"), "{line}");
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        out.insert(name, v);
    }
    out
}

#[test]
fn metrics_file_parses_and_changes_on_takeover() {
    let pg = Pg::start();
    let dir = TempDir::new("metrics");
    let mut a = spawn(
        lr(&pg.url(), "m", &[], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let file = dir.file("m.prom");
    let args = [
        "--wait",
        "--retry",
        "100ms",
        "--lease",
        "3s",
        "--metrics-file",
        file.to_str().unwrap(),
    ];
    let mut b = spawn(
        lr(&pg.url(), "m", &args, &worker(&dir, "b")),
        &dir.file("b.log"),
    );
    wait_file(&file, 5 * SEC);
    let m = metrics(&file);
    assert_eq!(m["leaderrun_leading"], 0.0);
    assert_eq!(m["leaderrun_leader_changes_total"], 0.0);
    assert!(m["leaderrun_last_renewal_timestamp_seconds"].is_nan());
    // A file cannot age by itself: an "age" gauge would read ~0 at every
    // write, so only the timestamp is written (alert on time() - it).
    assert!(
        !m.contains_key("leaderrun_seconds_since_last_renewal"),
        "{m:?}"
    );

    signal(a.id(), Signal::SIGTERM);
    wait_exit(&mut a, 5 * SEC);
    wait_for("the takeover in the metrics", 5 * SEC, || {
        metrics(&file).get("leaderrun_leading") == Some(&1.0)
    });
    let m = metrics(&file);
    assert_eq!(m["leaderrun_epoch"], 2.0);
    assert_eq!(m["leaderrun_leader_changes_total"], 1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let age = now - m["leaderrun_last_renewal_timestamp_seconds"];
    assert!((0.0..1.5).contains(&age), "{m:?}");
    // Renewals keep it fresh.
    wait_for("a renewal in the metrics", 5 * SEC, || {
        metrics(&file)["leaderrun_last_renewal_timestamp_seconds"]
            > m["leaderrun_last_renewal_timestamp_seconds"]
    });
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
    assert_eq!(metrics(&file)["leaderrun_leading"], 0.0);
    assert!(!dir.path().read_dir().unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp")));
}

#[test]
fn unreachable_store_fails_subcommands_with_125() {
    let url = format!(
        "postgres://u:Sup3rSecret@127.0.0.1:{}/db?sslmode=disable",
        free_port()
    );
    for args in [
        &["status"][..],
        &["release", "--name", "x"],
        &["check", "--name", "x", "--epoch", "1"],
        &["init"],
    ] {
        let r = admin(&url, args);
        assert_eq!(r.code, Some(125), "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("Sup3rSecret"), "{}", r.stderr);
    }
    let r = run({
        let mut c = leaderrun();
        c.args(["check", "--name", "x"]);
        c
    });
    assert_eq!(r.code, Some(2), "check needs an epoch: {}", r.stderr);
}

/// With `--log-format json` every line a subcommand writes to stderr is an
/// event like the run form's (its answers on stdout stay as they are):
/// answers of "no", a store that refuses, a file store that is not there,
/// usage errors found after parsing and by clap itself. Without it, the
/// same lines stay plain text.
#[test]
fn subcommands_write_json_events_when_asked() {
    let dir = TempDir::new("admin-json");
    let s = format!("sqlite://{}", dir.file("leases.db").display());
    let missing = format!("sqlite://{}", dir.file("none.db").display());
    let refusing = format!(
        "postgres://u:Sup3rSecret@127.0.0.1:{}/db?sslmode=disable",
        free_port()
    );
    assert_eq!(
        run(lr(&s, "job", &["--min-hold", "30s"], "true")).code,
        Some(0)
    );
    // (arguments after `--log-format json`, exit status, events on stderr)
    let cases: &[(&[&str], i32, &[&str])] = &[
        (&["-v", "--store", &s, "status"], 0, &["store"]),
        (
            &["--store", &s, "status", "--name", "nope"],
            1,
            &["no_lease"],
        ),
        (&["-v", "--store", &s, "status", "--json"], 0, &["store"]),
        (
            &["--store", &s, "release", "--name", "nope"],
            1,
            &["not_released"],
        ),
        (
            &["--store", &s, "check", "--name", "job", "--epoch", "9"],
            1,
            &["check_failed"],
        ),
        (&["-v", "--store", &s, "init"], 0, &["store"]),
        (
            &["--store", "redis://127.0.0.1:1", "init", "--print"],
            0,
            &["no_table"],
        ),
        (&["--store", &refusing, "status"], 125, &["store_error"]),
        (
            &["--store", &refusing, "release", "--name", "job"],
            125,
            &["store_error"],
        ),
        (
            &[
                "--store", &refusing, "check", "--name", "job", "--epoch", "1",
            ],
            125,
            &["store_error"],
        ),
        (&["--store", &refusing, "init"], 125, &["store_error"]),
        (
            &[
                "--store", &missing, "check", "--name", "job", "--epoch", "1",
            ],
            125,
            &["store_error"],
        ),
        (
            &["--store", "bogus://x", "release", "--name", "job"],
            2,
            &["usage_error"],
        ),
        (
            &["--store", &s, "--lease", "3s", "status"],
            2,
            &["usage_error"],
        ),
        (
            &["--store", &s, "check", "--name", "job"],
            2,
            &["usage_error"],
        ),
    ];
    for (args, code, events) in cases {
        let mut c = leaderrun();
        c.args(["--log-format", "json"]).args(*args);
        let r = run(c);
        assert_eq!(r.code, Some(*code), "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("Sup3rSecret"), "{}", r.stderr);
        let mut seen = Vec::new();
        for line in r.stderr.lines() {
            let v = json(line);
            for k in [
                "time", "level", "event", "name", "epoch", "holder", "message",
            ] {
                assert!(v.get(k).is_some(), "{args:?}: {k} missing in {line}");
            }
            let event = v["event"].as_str().unwrap_or_default().to_string();
            if ["no_lease", "not_released", "check_failed"].contains(&event.as_str()) {
                assert_eq!(v["level"], "warn", "{line}");
                assert_ne!(v["name"], serde_json::Value::Null, "{line}");
            }
            if event.ends_with("_error") {
                assert_eq!(v["level"], "error", "{line}");
            }
            seen.push(event);
        }
        assert_eq!(&seen, events, "{args:?}: {}", r.stderr);
    }
    // The answers on stdout are what they were.
    let mut c = leaderrun();
    c.args(["--log-format", "json", "--store", &s, "status"]);
    let r = run(c);
    assert!(r.stdout.starts_with("NAME "), "{}", r.stdout);
    let mut c = leaderrun();
    c.args([
        "--log-format",
        "json",
        "--store",
        &s,
        "status",
        "--name",
        "job",
        "--json",
    ]);
    assert!(json(&run(c).stdout)["holder"].is_string());
    // Without the flag, the same refusals are one plain line each.
    for (args, want) in [
        (
            &["status", "--name", "nope"][..],
            "leaderrun: no lease named nope\n",
        ),
        (
            &["release", "--name", "nope"],
            "leaderrun: nope is not held; nothing released\n",
        ),
        (
            &["--lease", "3s", "status"],
            "leaderrun: error: --lease belongs to the run form",
        ),
    ] {
        let mut c = leaderrun();
        c.args(["--store", &s]).args(args);
        let r = run(c);
        assert!(r.stderr.starts_with(want), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    }
    let mut c = leaderrun();
    c.args(["--store", &refusing, "status"]);
    let r = run(c);
    assert!(
        r.stderr.contains(" ERROR ") && !r.stderr.starts_with('{'),
        "{}",
        r.stderr
    );
}
