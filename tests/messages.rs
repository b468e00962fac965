//! What a user reads when something is off: one line that says what is
//! wrong and what to do, no advice that would make things worse, JSON that
//! means the same on every store, `-q` that quiets a "no". Every test runs
//! the real binary.

use crate::support::stores;
use crate::support::*;

fn args(a: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(a);
    run(c)
}

fn sqlite(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("leases.db").display())
}

/// A negative value is out of range, said so; never clap's advice to
/// write `-- -5`, which would turn the value into the command.
#[test]
fn a_negative_value_is_out_of_range_not_a_flag() {
    for (a, flag) in [
        (
            &["--name", "x", "--lease", "-5s", "--", "true"][..],
            "--lease",
        ),
        (
            &["--name", "x", "--conflict-exit-code", "-1", "--", "true"],
            "--conflict-exit-code",
        ),
        (
            &["--name", "x", "--conflict-exit-code", "256", "--", "true"],
            "--conflict-exit-code",
        ),
    ] {
        let out = args(a);
        assert_eq!(out.code, Some(2), "{a:?}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
        assert!(
            out.stderr.contains(flag) && out.stderr.contains("out of range"),
            "{a:?}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("use '--"), "{a:?}: {}", out.stderr);
    }
    // A flag taken for a duration's value says that it is a flag.
    let out = args(&["--name", "x", "--lease", "--wait", "--", "true"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--wait is an option"), "{}", out.stderr);
}

/// The two slips a new user makes first: the command without `--`, and a
/// subcommand misspelt. Each gets the hint that fixes it, and nothing runs.
#[test]
fn a_missing_double_dash_and_a_misspelt_subcommand_get_a_hint() {
    let dir = TempDir::new("msg-slips");
    let marker = dir.file("ran");
    let m = marker.display().to_string();
    let out = args(&["--store", &sqlite(&dir), "--name", "x", "touch", &m]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("the command goes after `--`"),
        "{}",
        out.stderr
    );
    assert!(!marker.exists());
    let out = args(&["stauts"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("did you mean `status`?"),
        "{}",
        out.stderr
    );
    // A refusal that names a subcommand's help names no second one.
    let out = args(&["--name", "x", "status"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(out.stderr.matches("--help").count(), 1, "{}", out.stderr);
}

/// The subcommands' JSON lines have no holder of their own: `null`, as
/// every other unknown value, never `""`. `-q` quiets a "no" (the exit
/// status says it), and `release` takes `-e` as `check` does.
#[test]
fn a_subcommands_no_is_null_holder_json_and_quiet_under_q() {
    let dir = TempDir::new("msg-json");
    let s = sqlite(&dir);
    assert_eq!(run(lr(&s, "x", &[], "true")).code, Some(0));
    for a in [
        &[
            "--store",
            &s,
            "--log-format",
            "json",
            "status",
            "--name",
            "nope",
        ][..],
        &[
            "--store",
            &s,
            "--log-format",
            "json",
            "release",
            "--name",
            "nope",
        ],
        &[
            "--store",
            &s,
            "--log-format",
            "json",
            "check",
            "--name",
            "nope",
            "-e",
            "1",
        ],
    ] {
        let out = args(a);
        assert_eq!(out.code, Some(1), "{a:?}: {}", out.stderr);
        let v: serde_json::Value = serde_json::from_str(out.stderr.trim())
            .unwrap_or_else(|e| panic!("{a:?}: not one JSON line ({e}): {}", out.stderr));
        assert!(v["holder"].is_null(), "{a:?}: {v}");
    }
    for a in [
        &["--store", &s, "-q", "status", "--name", "nope"][..],
        &["--store", &s, "-q", "release", "--name", "x", "-e", "7"],
        &[
            "--store", &s, "-q", "check", "--name", "nope", "--epoch", "1",
        ],
    ] {
        let out = args(a);
        assert_eq!(out.code, Some(1), "{a:?}: {}", out.stderr);
        assert_eq!(out.stderr, "", "{a:?}");
    }
}

/// A free lease's `expires_in_ms` is `null` on every store, whether the
/// store kept when it ended (SQL) or deleted the key (Redis).
fn a_free_lease_has_no_expiry_in_json(srv: stores::Server) {
    assert_eq!(run(lr(&srv.url, "f", &[], "true")).code, Some(0));
    let out = args(&["--store", &srv.url, "status", "--name", "f", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(v["live"], false, "{v}");
    assert!(v["expires_in_ms"].is_null(), "{v}");
}

#[test]
fn a_free_lease_has_no_expiry_in_json_embedded() {
    a_free_lease_has_no_expiry_in_json(stores::sqlite());
}

#[test]
fn a_free_lease_has_no_expiry_in_json_postgres() {
    a_free_lease_has_no_expiry_in_json(stores::postgres());
}

#[test]
fn a_free_lease_has_no_expiry_in_json_redis() {
    a_free_lease_has_no_expiry_in_json(stores::redis());
}

#[test]
fn a_free_lease_has_no_expiry_in_json_zookeeper() {
    a_free_lease_has_no_expiry_in_json(stores::zookeeper());
}

/// A try-once run whose store does not answer (every byte held back) says
/// which store, as `status` does.
#[test]
fn no_answer_names_the_store() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    proxy.stall();
    let url = pg.url_via(proxy.port);
    let out = run(lr(&url, "q", &["--lease", "3s"], "true"));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    let shown = format!("127.0.0.1:{}/postgres", proxy.port);
    assert!(
        out.stderr.contains("no answer from the store") && out.stderr.contains(&shown),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains(pg::PASSWORD), "{}", out.stderr);
}

/// A Redis that refuses the password says so in words, naming the store
/// without the password (the driver's own text was "Password
/// authentication failed- AuthenticationFailed").
#[test]
fn a_refused_redis_password_reads_as_such() {
    let srv = stores::redis();
    let url = srv.refused_url.clone().expect("a refused URL");
    let out = run(lr(&url, "r", &[], "true"));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(
        out.stderr.contains("refused the user name or password")
            && !out.stderr.contains("AuthenticationFailed"),
        "{}",
        out.stderr
    );
}

/// `release --holder`: only that holder's lease is freed, at the epoch it
/// has; another holder's is left alone, said so, exit 1.
#[test]
fn release_by_holder_frees_only_that_holders_lease() {
    let dir = TempDir::new("msg-holder");
    let s = sqlite(&dir);
    let mut a = spawn(
        lr(&s, "h", &["--holder", "unit-a"], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), std::time::Duration::from_secs(10));
    let out = args(&[
        "--store", &s, "release", "--name", "h", "--holder", "unit-b",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("not held by unit-b"), "{}", out.stderr);
    let out = args(&[
        "--store", &s, "release", "--name", "h", "--holder", "unit-a",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("released h"), "{}", out.stdout);
    // The holder finds out at its next renewal and ends as a loss.
    assert_eq!(
        wait_exit(&mut a, std::time::Duration::from_secs(20)).code(),
        Some(75)
    );
}
