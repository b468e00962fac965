//! leaderrun and its watchdog never signal a process that is not the
//! command's: not one that took a pid the command's tree (or leaderrun
//! itself) had, nor one that took the command's process-group id, and the
//! watchdog never trusts a look at /proc it could not take while leaderrun
//! provably lived. Pids are recycled on purpose here, through
//! /proc/sys/kernel/ns_last_pid (root); where it is not writable each test
//! says so and skips.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;
use nix::sys::signal::Signal;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn embedded(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("leases.db").display())
}

/// Renewals leaderrun has logged (at -vv) so far.
fn renewals(log: &std::path::Path) -> usize {
    read(log).lines().filter(|l| l.contains("renewed")).count()
}

/// Wait until leaderrun has logged `n` renewals, then a moment for the
/// watchdog to read the last one (and take its look).
fn wait_renewals(log: &std::path::Path, n: usize) {
    wait_for(&format!("{n} renewals"), 10 * SEC, || renewals(log) >= n);
    std::thread::sleep(100 * MS);
}

fn nobody() -> (u32, u32) {
    let u = nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .expect("user nobody exists");
    (u.uid.as_raw(), u.gid.as_raw())
}

/// A command that leaves a process behind in a session of its own (which
/// ignores SIGTERM, so that the sweep runs until SIGKILL at `K`), writes its
/// pid to `cmd.pid` and exits at once: the command's group is then empty.
fn leaves_one_behind(dir: &TempDir) -> String {
    format!(
        "setsid sh -c 'trap \"\" TERM; echo $$ > {e}.tmp && mv {e}.tmp {e}; exec sleep 1000' & \
         while [ ! -e {e} ]; do sleep 0.01; done; echo $$ > {c}.tmp && mv {c}.tmp {c}; exit 0",
        e = dir.file("esc.pid").display(),
        c = dir.file("cmd.pid").display(),
    )
}

/// `K` = 2 s: time for the test to hand the command's pid to an impostor
/// while leaderrun still sweeps.
const LONG_K: [&str; 6] = ["--lease", "6s", "--give-up", "3s", "--kill-after", "2s"];

/// An impostor: a process given the command's pid once the command has been
/// reaped, leading a process group of its own, so that its group id is the
/// command's old one.
fn impostor_for(cmd: i32) -> Option<Child> {
    with_pid(cmd, || {
        Command::new("sleep")
            .arg("1000")
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep")
    })
}

/// The command exits and leaves a process behind that only SIGKILL ends:
/// leaderrun sweeps it, and SIGKILLs it at `K`. Meanwhile the command's pid,
/// and so its empty group's id, goes to an impostor group leader: neither
/// leaderrun (at `K`) nor its watchdog (when leaderrun is killed during the
/// sweep) may signal that group.
fn impostor_group(kill_leaderrun: bool) {
    if !can_force_pids() {
        return;
    }
    let dir = TempDir::new(if kill_leaderrun { "imp-wd" } else { "imp-lr" });
    let store = embedded(&dir);
    let mut a = spawn(
        lr(&store, "imp", &LONG_K, &leaves_one_behind(&dir)),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("cmd.pid"), 10 * SEC);
    let (cmd, esc) = (pid_in(&dir.file("cmd.pid")), pid_in(&dir.file("esc.pid")));
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    // Reaped by leaderrun: the pid is free, and the group is empty.
    let Some(mut imp) = impostor_for(cmd) else {
        eprintln!("skipped: could not get pid {cmd} for the impostor (the machine forks too much)");
        let _ = a.kill();
        let _ = a.wait();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(esc), Signal::SIGKILL).ok();
        return;
    };
    let imp_pid = imp.id() as i32;
    if kill_leaderrun {
        signal(a.id(), Signal::SIGKILL);
        let _ = a.wait();
        wait_for("the watchdog to finish", 5 * SEC, || !alive(w));
    } else {
        let st = wait_exit(&mut a, 10 * SEC);
        assert_eq!(st.code(), Some(0), "{}", read(&dir.file("a.log")));
    }
    wait_for("the process left behind to die", 2 * SEC, || !alive(esc));
    let survived = alive(imp_pid);
    let _ = imp.kill();
    let _ = imp.wait();
    assert!(
        survived,
        "the impostor that took the command's pgid {cmd} was killed ({}): {}",
        if kill_leaderrun {
            "by the watchdog"
        } else {
            "by leaderrun's sweep"
        },
        read(&dir.file("a.log"))
    );
}

#[test]
fn an_impostor_with_the_commands_group_id_is_not_killed_by_the_sweep() {
    impostor_group(false);
}

#[test]
fn an_impostor_with_the_commands_group_id_is_not_killed_by_the_watchdog() {
    impostor_group(true);
}

/// L = 3 s: R = 1 s, G = 2 s, K = 500 ms.
const L3: [&str; 2] = ["--lease", "3s"];

/// Without a cgroup (an unprivileged user), leaderrun is SIGKILLed while its
/// watchdog is stopped with a renewal unread; its pid then goes to a
/// stranger (the same user) with a child. When the watchdog resumes, it
/// reads the renewal together with end-of-file: its look at "leaderrun's
/// descendants" would be the stranger's, and it must not take it.
#[test]
fn the_watchdog_never_kills_the_children_of_a_process_that_took_leaderruns_pid() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (to run leaderrun and the stranger as nobody)");
        return;
    }
    if !can_force_pids() {
        return;
    }
    let dir = TempDir::new("lr-pid");
    let store = embedded(&dir);
    let mut c = leaderrun_unprivileged(&dir);
    c.args(["--store", &store, "--name", "p", "-vv"])
        .args(L3)
        .args(["--", "sh", "-c", &worker(&dir, "a")]);
    let log = dir.file("a.log");
    let mut a = spawn(c, &log);
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    // A renewal reaches the watchdog; then one waits in its pipe, unread.
    wait_renewals(&log, 1);
    signal(w as u32, Signal::SIGSTOP);
    let n = renewals(&log);
    wait_renewals(&log, n + 1);
    let lr_pid = a.id() as i32;
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    let (uid, gid) = nobody();
    let child_pid = dir.file("stranger-child.pid");
    let stranger = with_pid(lr_pid, || {
        Command::new("sh")
            .args([
                "-c",
                &format!("sleep 1000 & echo $! > {}; wait", child_pid.display()),
            ])
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn stranger")
    });
    let Some(mut stranger) = stranger else {
        signal(w as u32, Signal::SIGKILL);
        eprintln!("skipped: could not get pid {lr_pid} for the stranger");
        return;
    };
    wait_file(&child_pid, 5 * SEC);
    let sc = pid_in(&child_pid);
    signal(w as u32, Signal::SIGCONT);
    wait_for("the watchdog to finish", 5 * SEC, || !alive(w));
    let survived = alive(sc);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(sc), Signal::SIGKILL);
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert!(
        survived,
        "the watchdog killed {sc}, a child of the process that took leaderrun's pid {lr_pid}: {}",
        read(&dir.file("a.log"))
    );
}

/// Without a cgroup, the watchdog finds descendants that left the command's
/// group by looking at leaderrun's tree at each renewal. Stopped for two
/// renewals, it missed the look that would have seen one; when leaderrun
/// is then killed, the watchdog cannot vouch that everything is gone and
/// must not hand the lease back (a rival would run beside the survivor at
/// once); the lease is left to expire.
#[test]
fn a_watchdog_that_missed_its_looks_does_not_hand_the_lease_back() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (to run leaderrun as nobody, without a cgroup)");
        return;
    }
    let dir = TempDir::new("wd-missed");
    let store = embedded(&dir);
    let script = escapes_on_go(&dir);
    let base = |dir: &TempDir| {
        let mut c = leaderrun_unprivileged(dir);
        c.args(["--store", &store, "--name", "m"]).args(L3);
        c
    };
    let mut c = base(&dir);
    c.args(["-vv", "--", "sh", "-c", &script]);
    let log = dir.file("a.log");
    let mut a = spawn(c, &log);
    wait_file(&dir.file("cmd.pid"), 10 * SEC);
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    wait_renewals(&log, 1); // one good look, of the command alone
    signal(w as u32, Signal::SIGSTOP);
    std::fs::write(dir.file("go"), "").expect("go");
    wait_file(&dir.file("esc.pid"), 5 * SEC);
    let esc = pid_in(&dir.file("esc.pid"));
    // Two renewals the watchdog does not read, the escaped one running.
    let n = renewals(&log);
    wait_renewals(&log, n + 2);
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    signal(w as u32, Signal::SIGCONT);
    wait_for("the watchdog to finish", 5 * SEC, || !alive(w));
    // Well before the lease expires (at most L after the last renewal).
    let mut rival = base(&dir);
    rival.args(["--conflict-exit-code", "99", "--", "true"]);
    let r = run(rival);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(esc), Signal::SIGKILL);
    assert_eq!(
        r.code,
        Some(99),
        "the lease was handed back while {esc}, unseen by the watchdog, ran: {}\n{}",
        r.stderr,
        read(&dir.file("a.log"))
    );
    assert!(
        read(&dir.file("a.log")).contains("left to expire"),
        "{}",
        read(&dir.file("a.log"))
    );
}
