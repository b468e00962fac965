//! The run form end to end: the real binary against a throwaway Postgres.

use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

const SEC: Duration = Duration::from_secs(1);

#[test]
fn child_gets_the_lease_in_its_environment_and_its_status_passes_through() {
    let pg = Pg::start();
    let dir = TempDir::new("env");
    let out = dir.file("env");
    let script = format!(
        "echo \"$LEASE_EPOCH $LEASE_NAME $LEASE_HOLDER\" > {}; exit 3",
        out.display()
    );
    let r = run(lr(&pg.url(), "nightly", &["--holder", "host-a:1"], &script));
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert_eq!(read(&out).trim(), "1 nightly host-a:1");
    assert_eq!(
        r.stderr, "",
        "a healthy run prints nothing by default (cron mail stays quiet)"
    );
    // The next acquisition gets the next epoch; the lease was released.
    let r = run(lr(&pg.url(), "nightly", &[], &script));
    assert_eq!(r.code, Some(3));
    assert!(read(&out).starts_with("2 nightly "), "{}", read(&out));
    assert_eq!(
        pg.lease_row("nightly").split('|').next(),
        Some(""),
        "released: no holder"
    );
}

#[test]
fn store_url_comes_from_the_environment_in_order() {
    let pg = Pg::start();
    let mut c = leaderrun();
    c.env("DATABASE_URL", pg.url())
        .args(["--name", "from-env", "--", "true"]);
    assert_eq!(run(c).code, Some(0));
    let mut c = leaderrun();
    c.env("LEADERRUN_STORE", pg.url())
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("LEADERRUN_NAME", "from-env")
        .args(["--", "true"]);
    assert_eq!(
        run(c).code,
        Some(0),
        "LEADERRUN_STORE wins over DATABASE_URL"
    );
    assert_eq!(pg.lease_row("from-env"), "|2|f");
}

#[test]
fn held_lease_is_skipped_quietly_with_the_conflict_exit_code() {
    let pg = Pg::start();
    let dir = TempDir::new("held");
    let (ready, go) = (dir.file("ready"), dir.file("go"));
    let mut holder = spawn(
        lr(
            &pg.url(),
            "job",
            &["--holder", "host-a:77"],
            &format!(
                "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
                ready.display(),
                go.display()
            ),
        ),
        &dir.file("a.log"),
    );
    wait_file(&ready, 10 * SEC);

    // A DBA can see who holds the connection.
    let apps = pg.sql(
        "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'leaderrun%'",
    );
    assert_eq!(apps, "leaderrun job");

    let ran = dir.file("ran");
    let script = format!("touch {}", ran.display());
    let r = run(lr(&pg.url(), "job", &[], &script));
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (Some(0), ""),
        "skip is silent and exits 0"
    );
    let r = run(lr(
        &pg.url(),
        "job",
        &["--conflict-exit-code", "3"],
        &script,
    ));
    assert_eq!(r.code, Some(3));
    let r = run(lr(&pg.url(), "job", &["-v"], &script));
    assert!(
        r.stderr.contains("held by host-a:77 (epoch 1)"),
        "{}",
        r.stderr
    );
    assert!(
        !ran.exists(),
        "the command ran while the lease was held elsewhere"
    );

    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut holder, 10 * SEC).code(), Some(0));
}

#[test]
fn exit_status_rows() {
    let pg = Pg::start();
    let dir = TempDir::new("codes");
    let url = pg.url();
    let code = |extra: &[&str], cmd: &[&str]| {
        let mut c = leaderrun();
        c.args(["--store", &url, "--name", "codes"])
            .args(extra)
            .arg("--")
            .args(cmd);
        run(c)
    };
    assert_eq!(code(&[], &["sh", "-c", "exit 42"]).code, Some(42));
    assert_eq!(code(&[], &["true"]).code, Some(0));
    // death by signal N: 128 + N
    assert_eq!(
        code(&[], &["sh", "-c", "kill -USR1 $$"]).code,
        Some(128 + 10)
    );
    assert_eq!(
        code(&[], &["sh", "-c", "kill -KILL $$"]).code,
        Some(128 + 9)
    );
    // not found / not executable, and no lease taken for either
    let r = code(&[], &["no-such-command-xyz"]);
    assert_eq!(r.code, Some(127), "{}", r.stderr);
    assert!(
        r.stderr.contains("command not found: no-such-command-xyz"),
        "{}",
        r.stderr
    );
    assert_eq!(code(&[], &["/nonexistent/cmd"]).code, Some(127));
    let noexec = dir.file("noexec.sh");
    std::fs::write(&noexec, "#!/bin/sh\necho hi\n").unwrap();
    let r = code(&[], &[noexec.to_str().unwrap()]);
    assert_eq!(r.code, Some(126), "{}", r.stderr);
    assert_eq!(
        code(&[], &[dir.path().to_str().unwrap()]).code,
        Some(126),
        "a directory"
    );
    // a symlink loop is named as one (126, as a shell says), not "not found"
    let (l1, l2) = (dir.file("loop1"), dir.file("loop2"));
    std::os::unix::fs::symlink(&l2, &l1).unwrap();
    std::os::unix::fs::symlink(&l1, &l2).unwrap();
    let r = code(&[], &[l1.to_str().unwrap()]);
    assert_eq!(r.code, Some(126), "{}", r.stderr);
    assert!(r.stderr.contains("symbolic links"), "{}", r.stderr);
    assert_eq!(
        pg.lease_row("codes"),
        "|4|f",
        "only the four runs that started took the lease"
    );
    // usage error
    assert_eq!(code(&["--lease", "forever"], &["true"]).code, Some(2));
}

#[test]
fn command_runs_from_argv_without_a_shell() {
    let pg = Pg::start();
    let dir = TempDir::new("argv");
    let out = dir.file("out");
    let mut c = leaderrun();
    c.args([
        "--store",
        &pg.url(),
        "--name",
        "argv",
        "--",
        "sh",
        "-c",
        "printf '%s|' \"$@\" > \"$0\"",
    ])
    .arg(&out)
    .args(["a b", "$HOME", "*", ";true"]);
    assert_eq!(run(c).code, Some(0));
    assert_eq!(read(&out), "a b|$HOME|*|;true|");
}

/// Durations read as they were given: a typed one as typed, a computed one
/// in one unit, or in seconds to the millisecond (a general-purpose format
/// showed a default R = L/3 as `3s 333ms 333us 333ns` and a year's
/// --min-hold as `11months 30days 3h 50m 24s`).
#[test]
fn durations_are_shown_in_the_units_they_were_given() {
    let dir = TempDir::new("units");
    let store = format!("sqlite://{}", dir.file("l.db").display());
    let r = run(lr(
        &store,
        "u",
        &["--lease", "10s", "--give-up", "3000ms"],
        "true",
    ));
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--renew (3.333s) must be shorter than --give-up (3000ms)"),
        "{}",
        r.stderr
    );

    let r = run(lr(&store, "u", &["-v", "--min-hold", "365d"], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // What is left of the year: computed, so in seconds.
    assert!(
        r.stderr.contains("released; kept for another 315359"),
        "{}",
        r.stderr
    );
    let r = run(lr(&store, "u", &["-v"], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains(") for another 365d;"), "{}", r.stderr);
    let mut c = leaderrun();
    c.args(["status", "--store", &store]);
    let r = run(c);
    assert!(
        r.stdout
            .contains("kept by --min-hold (run ended), expires in 365d"),
        "{}",
        r.stdout
    );
}

#[test]
fn bad_input_is_one_line_exit_2_and_starts_nothing() {
    let dir = TempDir::new("bad");
    let marker = dir.file("ran");
    let touch = format!("touch {}", marker.display());
    let url = "postgres://u:Sup3rSecret@127.0.0.1:1/db";
    let cases: &[(&[&str], &str)] = &[
        (
            &["--lease", "5s", "--give-up", "6s"],
            "--give-up (6s) must be shorter than --lease (5s)",
        ),
        (
            &["--lease", "15s", "--renew", "10s"],
            "--renew (10s) must be shorter than --give-up (10s)",
        ),
        (
            &["--lease", "15s", "--kill-after", "5s"],
            "--give-up (10s) plus --kill-after (5s) must be shorter than --lease (15s)",
        ),
        (&["--retry", "0s"], "--retry (0s) must be at least 50ms"),
        (
            &["--wait", "--retry", "1ns"],
            "--retry (1ns) must be at least 50ms",
        ),
        (
            &["--wait", "--timeout", "0s"],
            "--timeout 0s gives up before the first attempt",
        ),
        (&["--renew", "0s"], "--renew must be longer than zero"),
        (&["--lease", "0s"], "--lease must be longer than zero"),
        (
            &["--lease", "ten"],
            "invalid value 'ten' for '--lease <DUR>'",
        ),
        (
            &["--lease", "-5s"],
            "'-5s' for '--lease <DUR>': -5s is out of range",
        ),
        (&["--timeout", "5s"], "--wait"),
        (&["--conflict-exit-code", "256"], "--conflict-exit-code"),
        (&["--holder", ""], "holder id must not be empty"),
        (&["--wait", "--bogus"], "--bogus"),
    ];
    for (extra, want) in cases {
        let mut c = leaderrun();
        c.args(["--store", url, "--name", "ok"])
            .args(*extra)
            .args(["--", "sh", "-c", &touch]);
        let r = run(c);
        assert_eq!(r.code, Some(2), "{extra:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(want),
            "{extra:?}: wanted {want:?} in {:?}",
            r.stderr
        );
        assert_eq!(
            r.stderr.trim_end().lines().count(),
            1,
            "{extra:?}: not one line: {:?}",
            r.stderr
        );
        assert!(
            !r.stderr.contains("Sup3rSecret"),
            "password echoed: {}",
            r.stderr
        );
    }
    let names = [
        "",
        "a b",
        "x'; DROP TABLE leader_lease; --",
        "../etc/passwd",
        "-x",
        &"n".repeat(129),
    ];
    for name in names {
        let mut c = leaderrun();
        c.args([
            "--store",
            url,
            &format!("--name={name}"),
            "--",
            "sh",
            "-c",
            &touch,
        ]);
        let r = run(c);
        assert_eq!(r.code, Some(2), "name {name:?}: {}", r.stderr);
        assert!(r.stderr.contains("name"), "{}", r.stderr);
    }
    let stores = [
        (
            "ftp://u:Sup3rSecret@h/db",
            "the store URL from --store has an unknown scheme ftp://",
        ),
        ("sqlite://", "needs an absolute file path"),
    ];
    for (store, want) in stores {
        let mut c = leaderrun();
        c.args(["--store", store, "--name", "ok", "--", "sh", "-c", &touch]);
        let r = run(c);
        assert_eq!(r.code, Some(2), "{store}: {}", r.stderr);
        assert!(r.stderr.contains(want), "{}", r.stderr);
        assert!(!r.stderr.contains("Sup3rSecret"), "{}", r.stderr);
    }
    let mut c = leaderrun();
    c.args(["--store", url, "--name", "ok"]);
    assert_eq!(run(c).code, Some(2), "no command");
    assert!(!marker.exists(), "a child was started despite bad input");
}

#[test]
fn help_hides_the_store_password_from_the_environment() {
    let mut c = leaderrun();
    c.env("LEADERRUN_STORE", "postgres://u:Sup3rSecret@h/db")
        .arg("--help");
    let r = run(c);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.contains("--store"), "{}", r.stdout);
    assert!(!r.stdout.contains("Sup3rSecret"), "{}", r.stdout);
}

#[test]
fn unreachable_store_fails_in_bounded_time_with_125() {
    let dir = TempDir::new("unreach");
    let marker = dir.file("ran");
    // Refused: nothing listens on the port.
    let url = format!(
        "postgres://u:Sup3rSecret@127.0.0.1:{}/db?sslmode=disable",
        free_port()
    );
    let t0 = Instant::now();
    let r = run(lr(
        &url,
        "x",
        &["--lease", "3s"],
        &format!("touch {}", marker.display()),
    ));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(t0.elapsed() < 3 * SEC, "{:?}", t0.elapsed());
    assert!(r.stderr.contains("u:***@127.0.0.1"), "{}", r.stderr);
    assert!(!r.stderr.contains("Sup3rSecret"), "{}", r.stderr);
    // Silent: connections accepted, nothing answered. Bounded by G = 2 s.
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    proxy.blackhole();
    let t0 = Instant::now();
    let r = run(lr(
        &pg.url_via(proxy.port),
        "x",
        &["--lease", "3s"],
        &format!("touch {}", marker.display()),
    ));
    let took = t0.elapsed();
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        took >= 2 * SEC - Duration::from_millis(100) && took < 3 * SEC,
        "{took:?}"
    );
    assert!(
        !r.stderr.contains(crate::support::pg::PASSWORD),
        "{}",
        r.stderr
    );
    assert!(!marker.exists());
}

#[test]
fn wrong_password_fails_with_125_without_echoing_it() {
    let pg = Pg::start();
    let dir = TempDir::new("pw");
    let marker = dir.file("ran");
    let url = format!(
        "postgres://postgres:N0tThePassw0rd@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    for extra in [&[][..], &["--wait"][..]] {
        let t0 = Instant::now();
        let r = run(lr(&url, "x", extra, &format!("touch {}", marker.display())));
        assert_eq!(r.code, Some(125), "{extra:?} {}", r.stderr);
        assert!(t0.elapsed() < 5 * SEC, "a wrong password is not retried");
        assert!(
            r.stderr.contains("password authentication failed"),
            "{}",
            r.stderr
        );
        assert!(!r.stderr.contains("N0tThePassw0rd"), "{}", r.stderr);
        assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);
    }
    assert!(!marker.exists());
}

#[test]
fn sql_shaped_lease_name_is_refused_and_harmless() {
    let pg = Pg::start();
    assert_eq!(run(lr(&pg.url(), "first", &[], "true")).code, Some(0));
    let r = run(lr(
        &pg.url(),
        "x'; DROP TABLE leader_lease; --",
        &[],
        "true",
    ));
    assert_eq!(r.code, Some(2));
    assert_eq!(pg.sql("SELECT count(*) FROM leader_lease"), "1");
}

#[test]
fn min_hold_keeps_the_lease_after_a_quick_job() {
    let pg = Pg::start();
    let dir = TempDir::new("minhold");
    let t0 = Instant::now();
    let r = run(lr(&pg.url(), "cron", &["--min-hold", "2s"], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(t0.elapsed() < SEC, "min-hold must not delay the exit");
    // A second host's cron entry, a moment later: skipped.
    let ran = dir.file("ran");
    let r = run(lr(
        &pg.url(),
        "cron",
        &[],
        &format!("touch {}", ran.display()),
    ));
    assert_eq!(r.code, Some(0));
    assert!(!ran.exists(), "ran within --min-hold");
    // Once min-hold has passed since acquisition, the lease is free.
    let r = run(lr(
        &pg.url(),
        "cron",
        &["--wait", "--retry", "50ms"],
        &format!("touch {}", ran.display()),
    ));
    assert_eq!(r.code, Some(0));
    let took = t0.elapsed();
    assert!(ran.exists());
    assert!(
        took >= 2 * SEC - Duration::from_millis(50) && took < 3 * SEC,
        "{took:?}"
    );
    // And without --min-hold the lease is released at once.
    let t1 = Instant::now();
    assert_eq!(run(lr(&pg.url(), "cron", &[], "true")).code, Some(0));
    assert_eq!(
        run(lr(&pg.url(), "cron", &[], &format!("rm {}", ran.display()))).code,
        Some(0)
    );
    assert!(!ran.exists() && t1.elapsed() < SEC);
}

#[test]
fn wait_timeout_exits_124() {
    let pg = Pg::start();
    let dir = TempDir::new("timeout");
    let ready = dir.file("ready");
    let mut holder = spawn(
        lr(
            &pg.url(),
            "t",
            &[],
            &format!("touch {}; sleep 30", ready.display()),
        ),
        &dir.file("a.log"),
    );
    wait_file(&ready, 10 * SEC);
    let ran = dir.file("ran");
    let t0 = Instant::now();
    let r = run(lr(
        &pg.url(),
        "t",
        &["--wait", "--timeout", "1000ms", "--retry", "200ms"],
        &format!("touch {}", ran.display()),
    ));
    let took = t0.elapsed();
    assert_eq!(r.code, Some(124), "{}", r.stderr);
    assert!(
        took >= SEC && took < SEC + Duration::from_millis(700),
        "{took:?}"
    );
    assert!(!ran.exists());
    // Quoted as typed, not converted.
    assert!(
        r.stderr.contains("--timeout (1000ms) passed"),
        "{}",
        r.stderr
    );
    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, 10 * SEC);
}

/// Every forwarded signal reaches the child's trap, and the child's own exit
/// status comes back.
#[test]
fn signals_are_forwarded_to_the_child() {
    let pg = Pg::start();
    let dir = TempDir::new("fwd");
    let sigs = [
        (Signal::SIGTERM, "TERM", 11),
        (Signal::SIGINT, "INT", 12),
        (Signal::SIGHUP, "HUP", 13),
        (Signal::SIGQUIT, "QUIT", 14),
        (Signal::SIGUSR1, "USR1", 15),
        (Signal::SIGUSR2, "USR2", 16),
    ];
    let got = dir.file("got");
    let ready = dir.file("ready");
    let mut traps = String::new();
    for (_, name, code) in sigs {
        traps.push_str(&format!(
            "trap 'echo {name} > {}; exit {code}' {name}; ",
            got.display()
        ));
    }
    let script = format!(
        "{traps} touch {}; while :; do sleep 0.02; done",
        ready.display()
    );
    for (sig, name, code) in sigs {
        let _ = std::fs::remove_file(&ready);
        let _ = std::fs::remove_file(&got);
        let mut a = spawn(lr(&pg.url(), "fwd", &[], &script), &dir.file("a.log"));
        wait_file(&ready, 10 * SEC);
        signal(a.id(), sig);
        let st = wait_exit(&mut a, 5 * SEC);
        assert_eq!(
            read(&got).trim(),
            name,
            "{sig}: {}",
            read(&dir.file("a.log"))
        );
        assert_eq!(st.code(), Some(code), "{sig}");
    }
}

/// A shell's background job starts with SIGINT ignored; the child must still
/// start with default dispositions and be able to trap it, and any other
/// signal leaderrun inherited as ignored (SIGALRM here, which leaderrun does
/// not handle itself and so would pass on through exec).
#[test]
fn child_can_trap_signals_leaderrun_inherited_as_ignored() {
    use std::os::unix::process::CommandExt;
    let pg = Pg::start();
    let dir = TempDir::new("ign");
    let (got, alrm, ready) = (dir.file("got"), dir.file("alrm"), dir.file("ready"));
    let script = format!(
        "trap 'echo INT > {}; exit 0' INT; trap 'echo ALRM > {}' ALRM; echo $$ > {}; \
         while :; do sleep 0.02; done",
        got.display(),
        alrm.display(),
        ready.display()
    );
    let mut c = lr(&pg.url(), "ign", &[], &script);
    // SAFETY: only sigaction/sigprocmask between fork and exec.
    unsafe {
        c.pre_exec(|| {
            use nix::sys::signal::{signal, SigHandler};
            signal(Signal::SIGINT, SigHandler::SigIgn)?;
            signal(Signal::SIGALRM, SigHandler::SigIgn)?;
            Ok(())
        });
    }
    let mut a = spawn(c, &dir.file("a.log"));
    wait_for("child pid", 10 * SEC, || !read(&ready).trim().is_empty());
    signal(pid_in(&ready) as u32, Signal::SIGALRM);
    wait_file(&alrm, 5 * SEC);
    signal(a.id(), Signal::SIGINT);
    let st = wait_exit(&mut a, 5 * SEC);
    assert_eq!(read(&got).trim(), "INT", "{}", read(&dir.file("a.log")));
    assert_eq!(st.code(), Some(0));
}

#[test]
fn signal_while_waiting_ends_the_wait_cleanly() {
    let pg = Pg::start();
    let dir = TempDir::new("waitsig");
    let ready = dir.file("ready");
    let mut holder = spawn(
        lr(
            &pg.url(),
            "w",
            &[],
            &format!("touch {}; sleep 30", ready.display()),
        ),
        &dir.file("a.log"),
    );
    wait_file(&ready, 10 * SEC);
    let ran = dir.file("ran");
    let mut waiter = spawn(
        lr(
            &pg.url(),
            "w",
            &["--wait", "--retry", "100ms", "-v"],
            &format!("touch {}", ran.display()),
        ),
        &dir.file("b.log"),
    );
    // Synchronise on the waiter having contended at least once.
    wait_for("the waiter to log that it waits", 10 * SEC, || {
        read(&dir.file("b.log")).contains("waiting")
    });
    let t0 = Instant::now();
    signal(waiter.id(), Signal::SIGTERM);
    let st = wait_exit(&mut waiter, 5 * SEC);
    assert_eq!(st.code(), Some(128 + 15));
    assert!(t0.elapsed() < SEC, "{:?}", t0.elapsed());
    assert!(!ran.exists());
    assert!(
        !read(&dir.file("b.log")).contains("ERROR"),
        "{}",
        read(&dir.file("b.log"))
    );
    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, 10 * SEC);
    assert_eq!(pg.lease_row("w"), "|1|f", "the waiter never held the lease");
}

#[test]
fn processes_the_child_left_behind_are_stopped() {
    let pg = Pg::start();
    let dir = TempDir::new("left");
    let bg = dir.file("bg");
    let r = run(lr(
        &pg.url(),
        "left",
        &[],
        &format!("sleep 30 & echo $! > {}; exit 0", bg.display()),
    ));
    assert_eq!(r.code, Some(0));
    let pid = pid_in(&bg);
    assert!(!alive(pid), "background process {pid} outlived leaderrun");
}

/// `sslmode` in the URL is honoured: `require` works against a TLS server and
/// is refused by a plain one; `verify-full` checks the certificate.
#[test]
fn tls_follows_sslmode_in_the_url() {
    let tls = Pg::start_with(true);
    let plain = Pg::start();
    let url = |pg: &Pg, host: &str, mode: &str| {
        format!(
            "postgres://postgres:{}@{host}:{}/postgres?sslmode={mode}",
            crate::support::pg::PASSWORD,
            pg.port
        )
    };
    let r = run(lr(&url(&tls, "127.0.0.1", "require"), "tls", &[], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = run(lr(&url(&plain, "127.0.0.1", "require"), "tls", &[], "true"));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(r.stderr.contains("TLS"), "{}", r.stderr);
    // verify-full with the right root certificate and host name...
    let crt = tls.dir.file("ca.crt");
    let good = format!(
        "{}&sslrootcert={}",
        url(&tls, "localhost", "verify-full"),
        crt.display()
    );
    let r = run(lr(&good, "tls", &[], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // ...and without it (the system roots do not know a self-signed cert).
    let r = run(lr(
        &url(&tls, "localhost", "verify-full"),
        "tls",
        &[],
        "true",
    ));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
}

/// A command that check_command accepts but exec refuses (here: the file is
/// open for writing, ETXTBSY) is reported from the exec itself: 126 with
/// the system's reason, nothing of the command run, and the lease handed
/// back so that the next run leads at once.
#[test]
fn an_exec_that_fails_after_the_lease_is_taken_is_126_and_releases() {
    use std::io::Write;
    let dir = TempDir::new("exec-fails");
    let script = dir.file("busy.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut open = std::fs::OpenOptions::new()
        .append(true)
        .open(&script)
        .unwrap();
    open.flush().unwrap();
    // Only where this kernel refuses to execute a file open for writing.
    match std::process::Command::new(&script).output() {
        Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {}
        _ => {
            eprintln!("skipped: this kernel executes a file open for writing");
            return;
        }
    }
    let store = format!("sqlite://{}", dir.file("leases.db").display());
    let mut c = leaderrun();
    c.args(["--store", &store, "--name", "busy", "--"])
        .arg(&script);
    let r = run(c);
    assert_eq!(r.code, Some(126), "{}", r.stderr);
    assert!(r.stderr.contains("Text file busy"), "{}", r.stderr);
    assert!(!r.stdout.contains("ran"), "the command ran: {}", r.stdout);
    drop(open);
    let next = run(lr(&store, "busy", &[], "echo $LEASE_EPOCH"));
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    assert_eq!(next.stdout.trim(), "2", "the lease was not handed back");
}
