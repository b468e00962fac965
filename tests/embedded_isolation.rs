//! A leaderrun stopped (SIGSTOP, Ctrl-Z, a frozen cgroup) at the instant it
//! holds the embedded store's write lock, against real SQLite files and the
//! real binary: it costs no other lease anything, a rival of its own name
//! leads once its lease is over, and a stopped contender costs the holder
//! nothing.
//!
//! The instant is made certain, not hoped for: the leaderrun under test runs
//! with a small `LD_PRELOAD` library (below, built with `cc`) that wraps
//! `fcntl`; once a trigger file exists, the first process that *takes*
//! SQLite's WAL write lock (a write lock on byte 120 of a `-shm` file, the
//! `WAL_WRITE_LOCK` of SQLite's unix VFS) deletes the trigger and stops
//! itself with SIGSTOP, holding the lock, exactly as a SIGSTOP arriving in
//! that half millisecond would leave it. `/proc/locks` then shows the stopped
//! process holding it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

/// L = 3 s: R = 1 s, G = 2 s, K = 500 ms.
const L: Duration = Duration::from_secs(3);
const R: Duration = Duration::from_secs(1);
const G: Duration = Duration::from_secs(2);
const LEASE: [&str; 2] = ["--lease", "3s"];
/// How long a run may take to start its command (not what is measured
/// here; a machine busy building may be slow to create a store).
const START: Duration = Duration::from_secs(30);

/// Stops the process right after it took SQLite's WAL write lock, once,
/// when the file `$FREEZE_TRIGGER` exists (it is deleted then).
const FREEZE_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

static void maybe_freeze(int cmd, void *arg, int r) {
    const char *trigger = getenv("FREEZE_TRIGGER");
    if (r != 0 || !trigger || !arg || (cmd != F_SETLK && cmd != F_SETLKW)) return;
    struct flock *fl = arg;
    if (fl->l_type == F_WRLCK && fl->l_start == 120 && fl->l_len == 1 && unlink(trigger) == 0)
        kill(getpid(), SIGSTOP);
}

#define SHIM(NAME) \
int NAME(int fd, int cmd, ...) { \
    static int (*real)(int, int, ...); \
    if (!real) real = (int (*)(int, int, ...))dlsym(RTLD_NEXT, #NAME); \
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap); \
    int r = real(fd, cmd, arg); \
    maybe_freeze(cmd, arg, r); \
    return r; \
}
SHIM(fcntl)
SHIM(fcntl64)
"#;

/// The freezing library, built in `dir`.
fn freeze_library(dir: &TempDir) -> PathBuf {
    let src = dir.file("freeze.c");
    let lib = dir.file("freeze.so");
    std::fs::write(&src, FREEZE_C).expect("write freeze.c");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("cc not found: install the Debian package `gcc`");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

fn store(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("leases.db").display())
}

/// Wait until the run `child` (logging to `log`) has started its command
/// (`ready` exists). A run that ends first fails the test at once, with its
/// exit status and its log, rather than after `START` with neither.
fn started(child: &mut Child, ready: &Path, log: &Path) {
    let t0 = Instant::now();
    while !ready.exists() {
        let ended = child.try_wait().ok().flatten();
        if ended.is_some() || t0.elapsed() > START {
            panic!(
                "{} not there after {:?}; the run {}; its log:\n{}",
                ready.display(),
                t0.elapsed(),
                ended.map_or("still runs".into(), |s| format!("ended: {s}")),
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `lr` that stops itself inside the write lock once `trigger` exists.
fn freezable(
    lib: &Path,
    trigger: &Path,
    url: &str,
    name: &str,
    extra: &[&str],
    script: &str,
) -> Command {
    let mut c = lr(url, name, extra, script);
    c.env("LD_PRELOAD", lib).env("FREEZE_TRIGGER", trigger);
    c
}

/// Whether `pid` is stopped (state `T`).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('T')
        })
        .unwrap_or(false)
}

/// Whether `pid` holds a POSIX write lock (`/proc/locks`).
fn holds_a_write_lock(pid: u32) -> bool {
    read(Path::new("/proc/locks")).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"POSIX")
            && f.get(3) == Some(&"WRITE")
            && f.get(4) == Some(&pid.to_string().as_str())
    })
}

/// Arm the trigger and wait until `lr` has stopped itself holding the write
/// lock: at its next renewal, within `R` (plus a second for a slow host).
fn freeze_inside_the_lock(lr: &Child, trigger: &Path) -> Instant {
    std::fs::write(trigger, "").expect("trigger");
    wait_for(
        "the leaderrun to stop inside the write lock",
        R + Duration::from_secs(1),
        || stopped(lr.id()),
    );
    let at = Instant::now();
    assert!(!trigger.exists(), "stopped, but not by the trigger");
    assert!(
        holds_a_write_lock(lr.id()),
        "stopped without the write lock"
    );
    at
}

/// Whether `child` is still running, without waiting.
fn running(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(None))
}

/// End a process this test started, whatever state it is in.
fn end(child: &mut Child) {
    signal(child.id(), Signal::SIGKILL);
    signal(child.id(), Signal::SIGCONT);
    let _ = child.wait();
}

/// A run under another name keeps its lease through a whole lease and more
/// (every renewal goes through), a new run under a third name starts at
/// once, and `status` and `watch` answer, while a leaderrun stays stopped
/// holding the write lock. On a single file for every lease, the first lost its lease
/// at `G` (exit 75) and the second waited 10 s for "no answer" (exit 125).
#[test]
fn a_stopped_leaderrun_holds_up_no_other_lease() {
    let dir = TempDir::new("iso-other");
    let url = store(&dir);
    let lib = freeze_library(&dir);
    let trigger = dir.file("trigger");
    let victim_ready = dir.file("victim.ready");
    let frozen_ready = dir.file("frozen.ready");
    let mut victim = spawn(
        lr(
            &url,
            "victim",
            &LEASE,
            &format!("touch {}; exec sleep 60", victim_ready.display()),
        ),
        &dir.file("victim.log"),
    );
    let mut frozen = spawn(
        freezable(
            &lib,
            &trigger,
            &url,
            "frozen",
            &LEASE,
            &format!("touch {}; exec sleep 60", frozen_ready.display()),
        ),
        &dir.file("frozen.log"),
    );
    started(&mut victim, &victim_ready, &dir.file("victim.log"));
    started(&mut frozen, &frozen_ready, &dir.file("frozen.log"));
    // Its watchdog stopped too (as a frozen cgroup would have it), so that
    // nothing ends the stopped run: it holds its file all along.
    let watchdog = watchdog_of(frozen.id()).expect("the frozen run's watchdog");
    let at = freeze_inside_the_lock(&frozen, &trigger);
    signal(watchdog as u32, Signal::SIGSTOP);

    // A new run of another name: started and done within a lease (on one
    // shared file it waited 10 s for "no answer").
    let t0 = Instant::now();
    let r = run(lr(&url, "unrelated", &[], "echo ran"));
    let took = t0.elapsed();
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "ran"), "{}", r.stderr);
    assert!(took < L, "a run of another name took {took:?}");

    // `watch` of every lease, started now and kept until the end.
    let watch_log = dir.file("watch.log");
    let mut c = leaderrun();
    c.args(["--store", &url, "watch", "--retry", "200ms"]);
    let mut watch = spawn(c, &watch_log);

    // `status` reads every lease, the stopped one's included.
    let t0 = Instant::now();
    let mut c = leaderrun();
    c.args(["--store", &url, "status"]);
    let r = run(c);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(t0.elapsed() < L, "status took {:?}", t0.elapsed());
    for name in ["victim", "frozen", "unrelated"] {
        assert!(r.stdout.contains(name), "{name} missing: {}", r.stdout);
    }

    // The victim keeps its lease for a whole lease after the freeze and
    // more: every renewal in that time went through, or it would have
    // given up at G.
    while at.elapsed() < L + R {
        assert!(
            running(&mut victim),
            "the run of another name ended {:?} after the freeze: {}",
            at.elapsed(),
            read(&dir.file("victim.log"))
        );
        assert!(stopped(frozen.id()), "the stopped leaderrun was woken");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = leaderrun();
    c.args(["--store", &url, "status", "--name", "victim"]);
    let r = run(c);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("held"), "{}", r.stdout);

    // The watcher saw every lease and never went blind.
    signal(watch.id(), Signal::SIGTERM);
    wait_exit(&mut watch, 5 * R);
    let seen = read(&watch_log);
    assert!(
        seen.contains("victim") && seen.contains("frozen") && seen.contains("unrelated"),
        "{seen}"
    );
    assert!(!seen.contains("did not answer"), "{seen}");

    // Nobody needed the stopped run's own file: it was left alone.
    assert!(stopped(frozen.id()) && holds_a_write_lock(frozen.id()));
    end(&mut frozen);
    signal(watchdog as u32, Signal::SIGKILL);
    signal(watchdog as u32, Signal::SIGCONT);
    signal(victim.id(), Signal::SIGTERM);
    wait_exit(&mut victim, 5 * R);
}

/// A holder stopped inside its lease's write lock: at its give-up deadline
/// its watchdog ends it (its lease is lost from then on anyway) and hands
/// the lease back, so a waiting rival leads at about `G` after the last
/// renewal, before the lease would have ended, and not before the stopped
/// holder's command is gone. On a single file for every lease the rival
/// waited for as long as the holder stayed stopped.
#[test]
fn a_rival_leads_once_the_stopped_holder_has_given_up() {
    let dir = TempDir::new("iso-own");
    let url = store(&dir);
    let lib = freeze_library(&dir);
    let trigger = dir.file("trigger");
    let ready = dir.file("ready");
    let cmd_pid = dir.file("cmd.pid");
    let mut holder = spawn(
        freezable(
            &lib,
            &trigger,
            &url,
            "job",
            &LEASE,
            &format!(
                "echo $$ > {}; touch {}; exec sleep 60",
                cmd_pid.display(),
                ready.display()
            ),
        ),
        &dir.file("holder.log"),
    );
    started(&mut holder, &ready, &dir.file("holder.log"));
    let command = pid_in(&cmd_pid);
    let at = freeze_inside_the_lock(&holder, &trigger);

    let ran = dir.file("rival.ran");
    let mut rival = spawn(
        lr(
            &url,
            "job",
            &[&LEASE[..], &["--wait"]].concat(),
            &format!("echo $LEASE_EPOCH > {}; exec sleep 60", ran.display()),
        ),
        &dir.file("rival.log"),
    );
    // Stopped at a renewal, `R` after the last one went out: the lease
    // would end `L - R` after the freeze; the give-up deadline is `G - R`
    // after it.
    wait_for("the rival to lead", L + R, || !read(&ran).trim().is_empty());
    let led = at.elapsed();
    assert_eq!(read(&ran).trim(), "2", "{}", read(&dir.file("rival.log")));
    assert!(
        !alive(command),
        "the rival leads {led:?} after the freeze while the stopped holder's command runs"
    );
    // Not before the give-up deadline (the stop might have been a harmless
    // Ctrl-Z until then; the renewal that stopped may have gone out a
    // little late), and before the lease would have ended.
    assert!(
        led >= G - R - R / 2 && led < L - R,
        "the rival led {led:?} after the freeze"
    );
    let status = wait_exit(&mut holder, 5 * R);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let log = read(&dir.file("holder.log"));
    assert!(
        log.contains("leaderrun was stopped while it held the file of lease job: ended")
            && log.contains("the lease released"),
        "{log}"
    );
    end(&mut rival);
}

/// The whole run stopped (leaderrun inside the write lock, its watchdog and
/// its command, as a frozen cgroup stops them): nothing of it can hand the
/// lease back, and a rival leads once the lease is over by the store's
/// clock, as after any freeze, ending the stopped leaderrun that holds the
/// file. On a single file for every lease the rival waited for as long as
/// the run stayed stopped.
#[test]
fn a_rival_leads_at_the_lease_end_when_the_whole_run_is_stopped() {
    let dir = TempDir::new("iso-whole");
    let url = store(&dir);
    let lib = freeze_library(&dir);
    let trigger = dir.file("trigger");
    let ready = dir.file("ready");
    let cmd_pid = dir.file("cmd.pid");
    let mut holder = spawn(
        freezable(
            &lib,
            &trigger,
            &url,
            "job",
            &LEASE,
            &format!(
                "echo $$ > {}; touch {}; exec sleep 60",
                cmd_pid.display(),
                ready.display()
            ),
        ),
        &dir.file("holder.log"),
    );
    started(&mut holder, &ready, &dir.file("holder.log"));
    let command = pid_in(&cmd_pid);
    let watchdog = watchdog_of(holder.id()).expect("the holder's watchdog");
    let at = freeze_inside_the_lock(&holder, &trigger);
    signal(watchdog as u32, Signal::SIGSTOP);
    signal(command as u32, Signal::SIGSTOP);

    let ran = dir.file("rival.ran");
    let mut rival = spawn(
        lr(
            &url,
            "job",
            &[&LEASE[..], &["--wait"]].concat(),
            &format!("echo $LEASE_EPOCH > {}; exec sleep 60", ran.display()),
        ),
        &dir.file("rival.log"),
    );
    // The lease ends by `L - R` after the freeze (the last renewal went
    // out `R` before it); the rival's attempt at the end it read, and
    // ending the stopped holder, take milliseconds (`R` allowed for a slow
    // host). Not before the end: the rival must not take a live lease.
    wait_for("the rival to lead", L + R, || !read(&ran).trim().is_empty());
    let led = at.elapsed();
    assert_eq!(read(&ran).trim(), "2", "{}", read(&dir.file("rival.log")));
    assert!(
        led >= L - R - R / 2 && led <= L,
        "the rival led {led:?} after the freeze"
    );
    let status = wait_exit(&mut holder, 5 * R);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert!(
        read(&dir.file("rival.log")).contains("stopped while it held the file of lease job"),
        "{}",
        read(&dir.file("rival.log"))
    );
    for pid in [watchdog, command] {
        signal(pid as u32, Signal::SIGKILL);
        signal(pid as u32, Signal::SIGCONT);
    }
    end(&mut rival);
}

/// A contender stopped inside the lease's write lock (its attempt to
/// acquire) costs the holder nothing: the holder, whose renewal it is in
/// the way of, ends it and keeps renewing. On a single file for every lease
/// the holder lost its lease at `G` (exit 75).
#[test]
fn a_stopped_contender_costs_the_holder_nothing() {
    let dir = TempDir::new("iso-contender");
    let url = store(&dir);
    let lib = freeze_library(&dir);
    let trigger = dir.file("trigger");
    let ready = dir.file("ready");
    let mut holder = spawn(
        lr(
            &url,
            "job",
            &LEASE,
            &format!("touch {}; exec sleep 60", ready.display()),
        ),
        &dir.file("holder.log"),
    );
    started(&mut holder, &ready, &dir.file("holder.log"));
    // Armed before the contender starts: its first write lock is its
    // attempt to acquire.
    std::fs::write(&trigger, "").expect("trigger");
    let ran = dir.file("contender.ran");
    let mut contender = spawn(
        freezable(
            &lib,
            &trigger,
            &url,
            "job",
            &[&LEASE[..], &["--wait"]].concat(),
            &format!("touch {}", ran.display()),
        ),
        &dir.file("contender.log"),
    );
    wait_for("the contender to stop inside the write lock", START, || {
        stopped(contender.id())
    });
    let at = Instant::now();
    assert!(!trigger.exists() && holds_a_write_lock(contender.id()));

    // The holder keeps its lease through a whole lease and more...
    while at.elapsed() < L + R {
        assert!(
            running(&mut holder),
            "the holder ended {:?} after the contender stopped: {}",
            at.elapsed(),
            read(&dir.file("holder.log"))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // ...because its next renewal (within R) ended the stopped contender.
    let status = wait_exit(&mut contender, R);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert!(!ran.exists(), "the stopped contender ran its command");
    assert!(
        read(&dir.file("holder.log")).contains("stopped while it held the file of lease job"),
        "{}",
        read(&dir.file("holder.log"))
    );
    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, 5 * R);
}
