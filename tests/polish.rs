//! The corners a new user and an operator meet first (issue #12): flags
//! before a subcommand, help text, scripts that cannot run, the status table,
//! JSON logs, the state directory. Every test runs the real binary.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::support::*;

const SEC: Duration = Duration::from_secs(1);
const BIN: &str = env!("CARGO_BIN_EXE_leaderrun");

fn sqlite(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("leases.db").display())
}

fn args(a: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(a);
    run(c)
}

/// An executable file with exactly these bytes.
fn script(dir: &TempDir, name: &str, body: &[u8]) -> std::path::PathBuf {
    let p = dir.file(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

// ---- 1. common flags before a subcommand ----

#[test]
fn common_flags_may_precede_a_subcommand() {
    let dir = TempDir::new("global");
    let s = sqlite(&dir);
    assert_eq!(run(lr(&s, "job", &[], "true")).code, Some(0));
    for pre in [
        vec!["--store", s.as_str()],
        vec!["-s", s.as_str(), "-v"],
        vec!["--store", s.as_str(), "--log-format", "json", "-v"],
        vec!["-q", "--store", s.as_str()],
    ] {
        let mut a = pre.clone();
        a.push("status");
        let r = args(&a);
        assert_eq!(r.code, Some(0), "{a:?}: {}", r.stderr);
        assert!(r.stdout.contains("job"), "{a:?}: {}", r.stdout);
        if pre.contains(&"json") {
            for l in r.stderr.lines() {
                serde_json::from_str::<serde_json::Value>(l)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            }
            assert!(r.stderr.contains("\"event\":\"store\""), "{}", r.stderr);
        }
    }
    // The run form's own flags before a subcommand would be ignored by it:
    // refused, in one line.
    let r = args(&["--store", &s, "--name", "job", "status"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("--name belongs to the run form"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);
}

/// The idiom from the README and the guide, inside a job: `check` with the
/// store before it.
#[test]
fn check_with_the_store_first_works_inside_a_job() {
    let dir = TempDir::new("check-first");
    let s = sqlite(&dir);
    let job = format!("{BIN} --store '{s}' check || exit 75; {BIN} -q --store '{s}' check --epoch 99 && exit 3; exit 0");
    let r = run(lr(&s, "job", &[], &job));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

// ---- 10. help text, release without --name ----

#[test]
fn help_reads_right() {
    let r = args(&["--help"]);
    assert_eq!(r.code, Some(0));
    assert!(
        !r.stdout.contains("LEADERRUN_NAME="),
        "an unset variable shown as set to empty: {}",
        r.stdout
    );
    assert!(r.stdout.contains("[env: LEADERRUN_NAME]"), "{}", r.stdout);
    let usage: Vec<&str> = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Usage:"))
        .take(2)
        .collect();
    assert!(usage[0].contains("--name <NAME> -- <COMMAND>"), "{usage:?}");
    assert!(
        usage[1].contains("<SUBCOMMAND>") && !usage[1].contains("<COMMAND>"),
        "the second form must not read as the run form's COMMAND: {usage:?}"
    );
    assert!(r.stdout.contains("Subcommands:"), "{}", r.stdout);
}

#[test]
fn release_takes_the_name_only_from_the_command_line() {
    let dir = TempDir::new("release-env");
    let s = sqlite(&dir);
    assert_eq!(
        run(lr(&s, "job", &["--min-hold", "30s"], "true")).code,
        Some(0)
    );
    let mut c = leaderrun();
    c.env("LEADERRUN_NAME", "job")
        .args(["release", "--store", &s]);
    let r = run(c);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("--name"), "{}", r.stderr);
    let j = args(&["status", "--store", &s, "--name", "job", "--json"]);
    assert!(
        j.stdout.contains("\"live\":true"),
        "released anyway: {}",
        j.stdout
    );
}

// ---- 5. scripts that exist but cannot run ----

/// Found before the lease is taken (no epoch used up), with the status a
/// shell gives and what is really wrong, never "command not found".
#[test]
fn a_script_that_cannot_run_says_why_and_takes_no_lease() {
    let dir = TempDir::new("shebang");
    let s = sqlite(&dir);
    let cases: &[(&str, &[u8], i32, &str)] = &[
        (
            "crlf.sh",
            b"#!/bin/sh\r\necho hi\r\n",
            127,
            "bad interpreter /bin/sh^M: no such file (the script has Windows line endings",
        ),
        (
            "missing.sh",
            b"#!/no/such/interpreter -e\necho hi\n",
            127,
            "bad interpreter /no/such/interpreter: no such file",
        ),
        (
            "env.sh",
            b"#!/usr/bin/env no-such-interpreter-xyz\nprint(1)\n",
            127,
            "interpreter no-such-interpreter-xyz (from #!/usr/bin/env no-such-interpreter-xyz) is not on PATH",
        ),
    ];
    // An interpreter that exists but is not executable.
    std::fs::write(dir.file("interp"), "").unwrap();
    let noexec = format!("#!{}\necho hi\n", dir.file("interp").display());
    let noexec_want = format!(
        "bad interpreter {}: permission denied",
        dir.file("interp").display()
    );
    let noexec_case = ("noexec.sh", noexec.as_bytes(), 126, noexec_want.as_str());
    for (name, body, code, want) in cases.iter().chain([&noexec_case]) {
        let p = script(&dir, name, body);
        let mut c = leaderrun();
        c.args(["--store", &s, "--name", "job", "--"]).arg(&p);
        let r = run(c);
        assert_eq!(r.code, Some(*code), "{name}: {}", r.stderr);
        assert!(
            r.stderr.contains(want),
            "{name}: wanted {want:?} in {}",
            r.stderr
        );
        assert!(!r.stderr.contains("not found:"), "{name}: {}", r.stderr);
    }
    // Found through PATH too.
    script(&dir, "crlf-on-path", b"#!/bin/sh\r\ntrue\r\n");
    let mut c = leaderrun();
    c.env(
        "PATH",
        format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    )
    .args(["--store", &s, "--name", "job", "--", "crlf-on-path"]);
    let r = run(c);
    assert_eq!(r.code, Some(127), "{}", r.stderr);
    assert!(r.stderr.contains("Windows line endings"), "{}", r.stderr);
    // No lease was ever taken: the first real run gets epoch 1.
    let r = run(lr(&s, "job", &[], "echo $LEASE_EPOCH"));
    assert_eq!(r.stdout.trim(), "1", "an epoch was used up: {}", r.stderr);
    // Scripts that do run are left alone: blanks around the interpreter, env.
    for (name, body) in [
        ("blanks.sh", &b"#!  /bin/sh  \nexit 7\n"[..]),
        ("viaenv.sh", b"#!/usr/bin/env sh\nexit 7\n"),
        ("envopts.sh", b"#!/usr/bin/env -S sh -e\nexit 7\n"),
    ] {
        let p = script(&dir, name, body);
        let mut c = leaderrun();
        c.args(["--store", &s, "--name", "ok", "--"]).arg(&p);
        let r = run(c);
        assert_eq!(r.code, Some(7), "{name}: {}", r.stderr);
    }
}

// ---- 10. log lines ----

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// `pid` is a number, and lines about the command (the SIGKILL at the kill
/// deadline among them) carry the epoch of the lease it runs under.
#[test]
fn json_logs_have_numeric_pids_and_the_kill_carries_the_epoch() {
    let dir = TempDir::new("jsonkill");
    let s = sqlite(&dir);
    // A command that ignores SIGTERM: only the SIGKILL stops it.
    let job = format!(
        "trap '' TERM; echo $$ > {p}.tmp && mv {p}.tmp {p}; while :; do sleep 0.05; done",
        p = dir.file("pid").display()
    );
    let mut a = spawn(
        lr(
            &s,
            "k",
            &["--lease", "3s", "-vv", "--log-format", "json"],
            &job,
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("pid"), 10 * SEC);
    // Cleared under its feet: the next renewal is refused, the lease lost.
    let r = args(&["release", "--store", &s, "--name", "k"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(75));
    let lines = json_lines(&read(&dir.file("a.log")));
    let started = lines
        .iter()
        .find(|v| v["event"] == "started")
        .expect("a started line");
    assert!(started["pid"].is_i64(), "pid is not a number: {started}");
    let kill = lines
        .iter()
        .find(|v| v["event"] == "kill")
        .unwrap_or_else(|| panic!("no kill line in {lines:?}"));
    assert_eq!(kill["epoch"], 1, "{kill}");
    assert!(kill["pid"].is_i64(), "{kill}");
}

/// After a renew_failed warning, the recovery shows at the default level
/// too: a cron mail with the trouble also says it passed.
#[test]
fn recovery_after_a_failed_renewal_is_shown_by_default() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    let dir = TempDir::new("recover");
    let mut a = spawn(
        lr(
            &pg.url_via(proxy.port),
            "r",
            &["--lease", "12s", "--renew", "2s", "--give-up", "8s"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    proxy.blackhole();
    wait_for("renew_failed", 15 * SEC, || {
        read(&dir.file("a.log")).contains("renewal failed")
    });
    proxy.heal();
    let t0 = std::time::Instant::now();
    while !read(&dir.file("a.log")).contains("renewed again") {
        assert!(
            t0.elapsed() < 10 * SEC,
            "no recovery line: {}",
            read(&dir.file("a.log"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = read(&dir.file("a.log"));
    assert!(log.contains(" WARN renewed again"), "{log}");
    signal(a.id(), nix::sys::signal::Signal::SIGTERM);
    wait_exit(&mut a, 10 * SEC);
}

// ---- 10. the status table ----

fn sql(db: &std::path::Path, q: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use sqlx::Connection;
        let url = format!("sqlite://{}", db.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.expect("open");
        sqlx::query(q).execute(&mut c).await.expect("sql");
    });
}

/// Terminal columns, as the test reads them: CJK takes two.
fn columns(s: &str) -> usize {
    s.chars()
        .map(|c| {
            if ('\u{4e00}'..='\u{9fff}').contains(&c) {
                2
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn the_status_table_is_for_humans() {
    let dir = TempDir::new("table");
    let s = sqlite(&dir);
    // No leases yet: the header alone, and under the table what a failover
    // of the store can lose; JSON an empty array.
    assert_eq!(args(&["init", "--store", &s]).code, Some(0));
    let r = args(&["status", "--store", &s]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    assert!(r.stdout.starts_with("NAME"), "{}", r.stdout);
    assert_eq!(
        lines[1],
        "replication: none (one host, one file); a failover cannot lose an acknowledged acquisition"
    );
    assert_eq!(
        args(&["status", "--store", &s, "--json"]).stdout.trim(),
        "[]"
    );

    for (name, holder) in [("a", "主机主机:1"), ("bbbbbbbb", "host-b:22"), ("c", "x")] {
        let r = run(lr(
            &s,
            name,
            &["--min-hold", "60s", "--holder", holder],
            "true",
        ));
        assert_eq!(r.code, Some(0), "{}", r.stderr);
    }
    // A row written by hand: a newline and a right-to-left override.
    sql(
        &dir.file("leases.db-leases/c.db"),
        "UPDATE leader_lease SET holder = 'evil' || char(10) || 'x' || char(8238) || 'txt.exe' WHERE name = 'c'",
    );
    let r = args(&["status", "--store", &s]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "a newline broke a row: {}", r.stdout);
    assert!(lines[4].starts_with("replication: "), "{}", r.stdout);
    let lines = &lines[..4];
    assert!(!r.stdout.contains('\u{202e}'), "{}", r.stdout);
    assert!(
        r.stdout.contains("evil\\nx\\u{202e}txt.exe"),
        "{}",
        r.stdout
    );
    // Columns line up on the terminal, CJK included.
    let state_at = |l: &str, word: &str| {
        columns(&l[..l.find(word).unwrap_or_else(|| panic!("{word} in {l}"))])
    };
    let at = state_at(lines[0], "STATE");
    for l in &lines[1..] {
        // Each run has ended: --min-hold keeps the lease.
        assert_eq!(state_at(l, "kept"), at, "misaligned:\n{}", r.stdout);
    }
    let epoch_end = |l: &str| columns(l) - columns(&l[l.find("held").unwrap_or(l.len())..]);
    assert_eq!(epoch_end(lines[1]), epoch_end(lines[2]));
    // No millisecond noise: "expires in 59s", not "59s 873ms".
    assert!(!r.stdout.contains("ms"), "{}", r.stdout);
    assert!(
        r.stdout.contains("expires in 59s") || r.stdout.contains("expires in 1m"),
        "{}",
        r.stdout
    );
}

#[test]
fn looking_at_a_store_file_that_does_not_exist_creates_nothing() {
    let dir = TempDir::new("typo");
    let typo = format!("sqlite://{}", dir.file("typo/x.db").display());
    for a in [
        &["status"][..],
        &["status", "--json"],
        &["check", "--name", "x", "--epoch", "1"],
        &["release", "--name", "x"],
    ] {
        let mut c = leaderrun();
        c.args(a).args(["--store", &typo]);
        let r = run(c);
        assert_eq!(r.code, Some(125), "{a:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("no such store file"),
            "{a:?}: {}",
            r.stderr
        );
        assert!(!dir.file("typo").exists(), "{a:?} created it");
    }
    // The embedded default before its first use is simply empty.
    let mut c = leaderrun();
    c.env("LEADERRUN_STATE_DIR", dir.file("state"))
        .arg("status");
    let r = run(c);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.starts_with("NAME"), "{}", r.stdout);
    assert!(
        !dir.file("state").exists(),
        "status created the embedded store"
    );
}

// ---- 10. error messages ----

/// A TLS setting sqlx does not know was reported as "error with
/// configuration: error with configuration: …".
#[test]
fn a_bad_tls_mode_is_reported_once() {
    for url in [
        "postgres://u@127.0.0.1:1/db?sslmode=bogus",
        "mysql://u@127.0.0.1:1/db?ssl-mode=bogus",
    ] {
        let r = run(lr(url, "tls", &[], "true"));
        assert_eq!(r.code, Some(2), "{url}: {}", r.stderr);
        assert_eq!(
            r.stderr.matches("error with configuration").count(),
            1,
            "{url}: {}",
            r.stderr
        );
        assert!(r.stderr.contains("ssl_mode"), "{url}: {}", r.stderr);
    }
}

/// Failures of TLS itself name their cause once.
#[test]
fn tls_errors_are_not_doubled() {
    let tls = Pg::start_with(true);
    let dir = TempDir::new("tlserr");
    std::fs::write(dir.file("junk.crt"), "not a certificate\n").unwrap();
    for q in [
        "sslmode=verify-full".to_string(),
        format!(
            "sslmode=verify-full&sslrootcert={}",
            dir.file("missing.crt").display()
        ),
        format!(
            "sslmode=verify-full&sslrootcert={}",
            dir.file("junk.crt").display()
        ),
        format!("sslmode=require&sslcert={}", dir.file("junk.crt").display()),
        format!(
            "sslmode=require&sslcert={0}&sslkey={0}",
            dir.file("junk.crt").display()
        ),
    ] {
        let url = format!(
            "postgres://postgres:{}@localhost:{}/postgres?{q}",
            crate::support::pg::PASSWORD,
            tls.port
        );
        let r = run(lr(&url, "tls", &[], "true"));
        assert_eq!(r.code, Some(125), "{q}: {}", r.stderr);
        assert!(
            r.stderr.matches("error with configuration").count() <= 1,
            "{q}: {}",
            r.stderr
        );
    }
}

/// A holder id with a newline is refused showing the newline, not a space.
#[test]
fn a_refused_value_is_shown_escaped() {
    let r = run(lr(
        "sqlite:///tmp/unused.db",
        "x",
        &["--holder", "a\nb"],
        "true",
    ));
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains(r"'a\nb'"), "{}", r.stderr);
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);
}

/// A state directory leaderrun cannot write to is named, with the reason.
#[test]
fn an_unwritable_state_directory_says_why() {
    let dir = TempDir::new("rostate");
    let ro = dir.file("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let mut c = leaderrun_unprivileged(&dir);
    c.env("LEADERRUN_STATE_DIR", &ro)
        .args(["--name", "x", "--", "true"]);
    let r = run(c);
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    let want = format!("{}: permission denied", ro.display());
    assert!(r.stderr.contains(&want), "wanted {want:?} in {}", r.stderr);
}

// ---- 2. nohup ----

/// `nohup leaderrun … -- job`: a hangup neither stops leaderrun nor reaches
/// the job, as with `nohup job` alone.
#[test]
fn nohup_protects_leaderrun_and_the_job() {
    let dir = TempDir::new("nohup");
    let s = sqlite(&dir);
    let (pid, done) = (dir.file("pid"), dir.file("done"));
    let job = format!(
        "echo $$ > {p}.tmp && mv {p}.tmp {p}; sleep 1; touch {d}",
        p = pid.display(),
        d = done.display()
    );
    let mut c = std::process::Command::new("nohup");
    c.arg(BIN)
        .args(["--store", &s, "--name", "n", "--", "sh", "-c", &job])
        .env_remove("LEADERRUN_STORE")
        .env_remove("DATABASE_URL")
        .current_dir(dir.path());
    let mut lr = spawn(c, &dir.file("lr.log"));
    wait_file(&pid, 10 * SEC);
    let job_pid = pid_in(&pid);
    // The hangup a closing terminal sends: to leaderrun and to the job.
    signal_group(lr.id(), nix::sys::signal::Signal::SIGHUP);
    signal(job_pid as u32, nix::sys::signal::Signal::SIGHUP);
    let st = wait_exit(&mut lr, 10 * SEC);
    assert_eq!(st.code(), Some(0), "{}", read(&dir.file("lr.log")));
    assert!(done.exists(), "the job did not finish");
}
