//! The embedded default store end to end: no server, nothing configured.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use crate::support::*;
use nix::sys::signal::Signal;

const SEC: Duration = Duration::from_secs(1);

fn sh(mut c: Command, script: &str) -> Command {
    c.args(["--", "sh", "-c", script]);
    c
}

/// No store configured, a fresh HOME: the job runs with an epoch, the next
/// run gets a higher one, and a concurrent rival skips.
#[test]
fn works_with_nothing_configured() {
    let dir = TempDir::new("fresh");
    let home = dir.file("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = dir.file("out");
    let job = format!("echo $LEASE_EPOCH >> {}", out.display());
    let mut c = leaderrun_unprivileged(&dir);
    c.env("HOME", &home).args(["-v", "--name", "nightly"]);
    let r = run(sh(c, &job));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let db = home.join(".local/state/leaderrun/leases.db");
    assert!(
        r.stderr.contains(&format!("sqlite://{}", db.display())),
        "-v names the file: {}",
        r.stderr
    );
    assert!(db.exists());
    let mode = std::fs::metadata(db.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "state directory is private");

    let mut c = leaderrun_unprivileged(&dir);
    c.env("HOME", &home).args(["--name", "nightly"]);
    assert_eq!(run(sh(c, &job)).code, Some(0));
    assert_eq!(read(&out), "1\n2\n");

    // A rival while the job runs: skipped, silently.
    let ready = dir.file("ready");
    let mut c = leaderrun_unprivileged(&dir);
    c.env("HOME", &home).args(["--name", "nightly"]);
    let mut holder = spawn(
        sh(c, &format!("touch {}; sleep 30", ready.display())),
        &dir.file("a.log"),
    );
    wait_file(&ready, 10 * SEC);
    let mut c = leaderrun_unprivileged(&dir);
    c.env("HOME", &home).args(["--name", "nightly"]);
    let r = run(sh(c, &job));
    assert_eq!((r.code, r.stderr.as_str()), (Some(0), ""));
    assert_eq!(read(&out), "1\n2\n");
    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, 5 * SEC);

    // XDG_STATE_HOME and LEADERRUN_STATE_DIR move the file.
    let mut c = leaderrun_unprivileged(&dir);
    c.env("HOME", &home)
        .env("XDG_STATE_HOME", dir.file("xdg"))
        .args(["--name", "x"]);
    let r = run(sh(c, "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(dir.file("xdg/leaderrun/leases.db").exists());
    let mut c = leaderrun_unprivileged(&dir);
    c.env("LEADERRUN_STATE_DIR", dir.file("custom"))
        .args(["--name", "x"]);
    let r = run(sh(c, "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(dir.file("custom/leases.db").exists());
}

/// Ten processes racing try-once on one name, many times: their children
/// never overlap, and every epoch handed out is unique.
#[test]
fn racing_processes_never_overlap() {
    let dir = TempDir::new("race");
    let log = dir.file("log");
    let store = format!("sqlite://{}", dir.file("leases.db").display());
    let child = format!(
        "echo start $LEASE_EPOCH $(date +%s%N) >> {log}; sleep 0.02; echo end $LEASE_EPOCH $(date +%s%N) >> {log}",
        log = log.display()
    );
    let lr_bin = env!("CARGO_BIN_EXE_leaderrun");
    let mut racers: Vec<_> = (0..10)
        .map(|_| {
            let loop_ = format!(
                "for i in $(seq 30); do {lr_bin} --store {store} --name race -- sh -c '{child}' || exit 9; done"
            );
            Command::new("sh").args(["-c", &loop_]).spawn().expect("racer")
        })
        .collect();
    for r in racers.iter_mut() {
        assert_eq!(r.wait().unwrap().code(), Some(0), "a racer failed");
    }
    let text = read(&log);
    let mut spans: Vec<(u128, u128, i64)> = Vec::new();
    let mut open: std::collections::HashMap<i64, u128> = Default::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (kind, epoch, t) = (
            f[0],
            f[1].parse::<i64>().unwrap(),
            f[2].parse::<u128>().unwrap(),
        );
        match kind {
            "start" => assert!(
                open.insert(epoch, t).is_none(),
                "epoch {epoch} handed out twice"
            ),
            _ => spans.push((open[&epoch], t, epoch)),
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "children overlapped: epoch {} and epoch {}",
            w[0].2,
            w[1].2
        );
    }
    let epochs: BTreeSet<i64> = spans.iter().map(|s| s.2).collect();
    assert_eq!(epochs.len(), spans.len());
    assert!(
        spans.len() >= 10,
        "too few runs to mean anything: {}",
        spans.len()
    );
    eprintln!("{} runs, no overlap, epochs unique", spans.len());
}

fn faked(c: &mut Command, spec: &str) {
    c.env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", spec)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
}

/// A wall clock hours off (either way) cannot take a held lease: expiry is on
/// the boot clock, which no wall-clock step moves.
#[test]
fn a_wall_clock_hours_off_cannot_take_a_held_lease() {
    let dir = TempDir::new("fake");
    let store = format!("sqlite://{}", dir.file("leases.db").display());
    let ready = dir.file("ready");
    let mut holder = spawn(
        lr(
            &store,
            "held",
            &["--lease", "3s"],
            &format!("touch {}; sleep 30", ready.display()),
        ),
        &dir.file("a.log"),
    );
    wait_file(&ready, 10 * SEC);

    // Sanity: the preload really moves a process's wall clock.
    let mut date = Command::new("date");
    date.arg("+%s");
    faked(&mut date, "+5h");
    let faked_now: i64 = String::from_utf8(date.output().unwrap().stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let real_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (faked_now - real_now - 5 * 3600).abs() < 60,
        "libfaketime is not working"
    );

    let ran = dir.file("ran");
    for spec in ["+5h", "-5h", "+30d"] {
        let mut c = lr(&store, "held", &["-v"], &format!("touch {}", ran.display()));
        faked(&mut c, spec);
        let r = run(c);
        assert_eq!(r.code, Some(0), "{spec}: {}", r.stderr);
        assert!(r.stderr.contains("held by"), "{spec}: {}", r.stderr);
        assert!(
            !ran.exists(),
            "a process with its wall clock at {spec} took a held lease"
        );
    }
    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, 5 * SEC);
}

/// A holder whose wall clock jumps by hours mid-lease keeps leading, and keeps
/// renewing: its deadlines and timers are on the boot clock, armed by raw
/// system calls that a time-faking preload cannot shift.
#[test]
fn a_holder_whose_wall_clock_jumps_keeps_the_lease() {
    let dir = TempDir::new("jump");
    let store = format!("sqlite://{}", dir.file("leases.db").display());
    let spec = dir.file("faketime");
    std::fs::write(&spec, "+0\n").unwrap();
    let ready = dir.file("ready");
    // L = 2 s, R = 667 ms, G = 1.33 s
    let mut c = lr(
        &store,
        "jump",
        &["--lease", "2s", "-v"],
        &format!("touch {}; sleep 30", ready.display()),
    );
    c.env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", &spec)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    let mut holder = spawn(c, &dir.file("a.log"));
    wait_file(&ready, 10 * SEC);
    for jump in ["+6h", "-6h", "+0"] {
        std::fs::write(&spec, format!("{jump}\n")).unwrap();
        std::thread::sleep(2 * SEC); // one whole lease after each jump
        let log = read(&dir.file("a.log"));
        assert!(
            holder.try_wait().unwrap().is_none(),
            "holder exited after a {jump} jump:\n{log}"
        );
        assert!(!log.contains("lost"), "{jump}:\n{log}");
        // Still renewing: a rival is refused a whole lease after the jump.
        let r = run(lr(&store, "jump", &[], "exit 3"));
        assert_eq!(
            r.code,
            Some(0),
            "a rival took the lease after a {jump} jump\n{log}"
        );
    }
    signal(holder.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut holder, 5 * SEC).code(), Some(128 + 15));
}

#[test]
fn store_errors_name_the_path_and_start_nothing() {
    let dir = TempDir::new("errs");
    let ran = dir.file("ran");
    let job = format!("touch {}", ran.display());

    // A directory that cannot be created.
    let locked = dir.file("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
    let mut c = leaderrun_unprivileged(&dir);
    c.env("LEADERRUN_STATE_DIR", locked.join("sub"))
        .args(["--name", "e"]);
    let r = run(sh(c, &job));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr.contains(&locked.join("sub").display().to_string()),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);

    // A file without permission.
    let private = dir.file("private.db");
    std::fs::write(&private, "").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o000)).unwrap();
    let mut c = leaderrun_unprivileged(&dir);
    c.args([
        "--store",
        &format!("sqlite://{}", private.display()),
        "--name",
        "e",
    ]);
    let r = run(sh(c, &job));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr.contains(&private.display().to_string()),
        "{}",
        r.stderr
    );

    // A corrupt database file.
    let corrupt = dir.file("corrupt.db");
    std::fs::write(&corrupt, vec![0x42u8; 16384]).unwrap();
    let r = run(sh(
        {
            let mut c = leaderrun();
            c.args([
                "--store",
                &format!("sqlite://{}", corrupt.display()),
                "--name",
                "e",
            ]);
            c
        },
        &job,
    ));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr.contains(&corrupt.display().to_string()),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("not a database"), "{}", r.stderr);
    assert!(!ran.exists(), "a child was started despite a store error");
}

/// A run ends without copying the WAL back into the database (and without
/// the fsyncs that takes): the WAL is still there afterwards, and the next
/// run reads the lease from it. Many runs later it is still small: the
/// commit that crosses `wal_autocheckpoint` copies it back.
#[test]
fn runs_leave_the_wal_and_keep_it_small() {
    let dir = TempDir::new("wal");
    let db = dir.file("leases.db");
    let url = format!("sqlite://{}", db.display());
    // The lease's own file's WAL (the store's file is written only once,
    // when the lease moves in).
    let wal = dir.file("leases.db-leases/w.db-wal");
    for i in 1..=3 {
        let r = run(lr(&url, "w", &[], "echo $LEASE_EPOCH"));
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        assert_eq!(r.stdout.trim(), i.to_string());
        assert!(
            wal.exists(),
            "the WAL was checkpointed and removed at close"
        );
    }
    for _ in 0..150 {
        let r = run(lr(&url, "w", &[], "true"));
        assert_eq!(r.code, Some(0), "{}", r.stderr);
    }
    let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(size < 1024 * 1024, "WAL grew to {size} bytes");
    let r = run(lr(&url, "w", &[], "echo $LEASE_EPOCH"));
    assert_eq!(r.stdout.trim(), "154");
}
