//! Every stop sends each process one SIGTERM, not one per mechanism that
//! finds it, and leaderrun and its watchdog never both send one; the
//! command never runs with one guard (a dead watchdog is replaced at once,
//! one that never confirmed its orders starts nothing); and no watchdog is
//! left a zombie under a PID 1 that reaps nothing.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn embedded(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("leases.db").display())
}

/// L = 3 s: R = 1 s, G = 2 s, K = 500 ms.
const L3: [&str; 2] = ["--lease", "3s"];

/// A command that counts the SIGTERMs it gets (a line in `cmd.terms` each)
/// and goes on, and so does a descendant that left its group (`esc.terms`);
/// `then` runs in the command once both are up (`exit 0`, or a loop).
/// `on_term` is the command's own reaction after counting.
fn counting(dir: &TempDir, on_term: &str, then: &str) -> String {
    format!(
        "trap 'echo T >> {ct}{on_term}' TERM; \
         setsid sh -c 'trap \"echo T >> {et}\" TERM; echo $$ > {ep}.tmp && mv {ep}.tmp {ep}; \
         while :; do sleep 0.02; done' & \
         while [ ! -e {ep} ]; do sleep 0.01; done; echo $$ > {cp}.tmp && mv {cp}.tmp {cp}; {then}",
        ct = dir.file("cmd.terms").display(),
        et = dir.file("esc.terms").display(),
        ep = dir.file("esc.pid").display(),
        cp = dir.file("cmd.pid").display(),
    )
}

fn terms(dir: &TempDir, who: &str) -> usize {
    read(&dir.file(&format!("{who}.terms"))).lines().count()
}

fn forever() -> &'static str {
    "while :; do sleep 0.02; done"
}

/// leaderrun, as root or (with `user`) as nobody, where no cgroup is made.
fn base(dir: &TempDir, user: bool, name: &str) -> Command {
    let mut c = if user {
        leaderrun_unprivileged(dir)
    } else {
        leaderrun()
    };
    c.args(["--store", &embedded(dir), "--name", name]);
    c
}

fn with_script(mut c: Command, extra: &[&str], script: &str) -> Command {
    c.args(extra).args(["--", "sh", "-c", script]);
    c
}

fn started(dir: &TempDir) -> [i32; 2] {
    wait_file(&dir.file("cmd.pid"), 10 * SEC);
    [pid_in(&dir.file("cmd.pid")), pid_in(&dir.file("esc.pid"))]
}

fn assert_dead(pids: [i32; 2]) {
    for p in pids {
        wait_for(&format!("{p} to die"), 3 * SEC, || !alive(p));
    }
}

fn assert_one_each(dir: &TempDir, path: &str) {
    let (c, e) = (terms(dir, "cmd"), terms(dir, "esc"));
    assert_eq!(
        (c, e),
        (1, 1),
        "{path}: SIGTERMs to the command and to its escaped descendant: {}",
        read(&dir.file("a.log"))
    );
    eprintln!("{path}: SIGTERMs per process: command {c}, escaped descendant {e}");
}

/// On a loss (the lease released from outside under the holder).
fn on_loss(user: bool) {
    if user && !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = TempDir::new(if user { "t-loss-u" } else { "t-loss" });
    let mut a = spawn(
        with_script(base(&dir, user, "l"), &L3, &counting(&dir, "", forever())),
        &dir.file("a.log"),
    );
    let pids = started(&dir);
    let mut rel = if user {
        leaderrun_unprivileged(&dir)
    } else {
        leaderrun()
    };
    rel.args(["release", "--name", "l", "--store", &embedded(&dir)]);
    assert_eq!(run(rel).code, Some(0));
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(75));
    assert_dead(pids);
    assert_one_each(&dir, if user { "loss, no cgroup" } else { "loss" });
}

#[test]
fn one_sigterm_per_process_on_a_loss() {
    on_loss(false);
}

#[test]
fn one_sigterm_per_process_on_a_loss_without_a_cgroup() {
    on_loss(true);
}

#[test]
fn one_sigterm_per_process_at_max_term() {
    let dir = TempDir::new("t-max");
    let mut a = spawn(
        with_script(
            base(&dir, false, "m"),
            &[&L3[..], &["--max-term", "1s"]].concat(),
            &counting(&dir, "", forever()),
        ),
        &dir.file("a.log"),
    );
    let pids = started(&dir);
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(75));
    assert_dead(pids);
    assert_one_each(&dir, "--max-term");
}

/// The final sweep, after the command exited: what it left behind (a
/// descendant in a session of its own) gets one SIGTERM.
#[test]
fn one_sigterm_per_process_in_the_sweep_after_the_command_exits() {
    let dir = TempDir::new("t-sweep");
    let script = counting(&dir, "", "sleep 0.2; exit 0");
    let mut a = spawn(
        with_script(base(&dir, false, "s"), &L3, &script),
        &dir.file("a.log"),
    );
    let pids = started(&dir);
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    assert_dead(pids);
    let e = terms(&dir, "esc");
    assert_eq!(
        e,
        1,
        "the sweep's SIGTERMs to the leftover: {}",
        read(&dir.file("a.log"))
    );
    eprintln!("sweep: SIGTERMs to the leftover: {e}");
}

/// A SIGTERM sent to leaderrun is passed on once, to the command's group;
/// the command exits on it, and the sweep then sends the leftover its one.
#[test]
fn a_forwarded_sigterm_is_passed_on_once_and_the_sweep_adds_one_to_the_leftover() {
    let dir = TempDir::new("t-fwd");
    let script = counting(&dir, "; exit 0", forever());
    let mut a = spawn(
        with_script(base(&dir, false, "f"), &L3, &script),
        &dir.file("a.log"),
    );
    let pids = started(&dir);
    signal(a.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    assert_dead(pids);
    assert_one_each(&dir, "forwarded, then the sweep");
}

/// leaderrun frozen: its watchdog sends the SIGTERM (once), and leaderrun,
/// thawed before the kill deadline, sends none of its own on top: one of
/// the two holds the SIGTERM token, never both.
fn watchdog_stop(user: bool) {
    if user && !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = TempDir::new(if user { "t-wd-u" } else { "t-wd" });
    let mut a = spawn(
        with_script(
            base(&dir, user, "w"),
            &[&L3[..], &["-vv"]].concat(),
            &counting(&dir, "", forever()),
        ),
        &dir.file("a.log"),
    );
    let pids = started(&dir);
    // A renewal, so that even without a cgroup the watchdog has seen the
    // escaped descendant (its look is taken as it reads the renewal).
    wait_for("a renewal", 10 * SEC, || {
        read(&dir.file("a.log")).contains("renewed")
    });
    std::thread::sleep(100 * MS);
    signal(a.id(), Signal::SIGSTOP);
    wait_for("the watchdog's SIGTERM", 5 * SEC, || terms(&dir, "cmd") > 0);
    // Thawed inside K: leaderrun finds its deadline passed and stops the
    // command itself, but the watchdog has sent the SIGTERM already.
    signal(a.id(), Signal::SIGCONT);
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(75));
    assert_dead(pids);
    assert!(
        read(&dir.file("a.log")).contains("no renewal reached the watchdog"),
        "{}",
        read(&dir.file("a.log"))
    );
    assert_one_each(
        &dir,
        if user {
            "watchdog's stop, no cgroup"
        } else {
            "watchdog's stop"
        },
    );
}

#[test]
fn one_sigterm_per_process_when_the_watchdog_stops_a_frozen_leaderrun() {
    watchdog_stop(false);
}

#[test]
fn one_sigterm_per_process_when_the_watchdog_stops_a_frozen_leaderrun_without_a_cgroup() {
    watchdog_stop(true);
}

/// The watchdog is SIGKILLed (the OOM killer picks small processes too)
/// while the command runs: leaderrun starts another at once, which then
/// stops the command on its own when leaderrun freezes, before a rival
/// leads.
#[test]
fn a_killed_watchdog_is_replaced_and_the_replacement_guards_the_command() {
    let dir = TempDir::new("wd-lost");
    let store = embedded(&dir);
    let mut a = spawn(
        lr(
            &store,
            "wl",
            &[&L3[..], &["-vv"]].concat(),
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let child = pid_in(&dir.file("a.pid"));
    let first = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    signal(first as u32, Signal::SIGKILL);
    let t0 = Instant::now();
    let second = wait_until_some("a new watchdog", 2 * SEC, || {
        watchdog_of(a.id()).filter(|w| *w != first && alive(*w))
    });
    eprintln!("watchdog replaced after {:?}", t0.elapsed());
    // Logged once the new one has confirmed its orders.
    wait_for("the replacement to be logged", 2 * SEC, || {
        read(&dir.file("a.log")).contains("a new one")
    });
    let mut b = spawn(
        lr(
            &store,
            "wl",
            &[&L3[..], &["--wait", "--retry", "50ms"]].concat(),
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    // A renewal reaches the new watchdog; then leaderrun freezes alone.
    let n = read(&dir.file("a.log")).matches("renewed").count();
    wait_for("a renewal", 10 * SEC, || {
        read(&dir.file("a.log")).matches("renewed").count() > n
    });
    std::thread::sleep(100 * MS);
    let t0 = Instant::now();
    signal(a.id(), Signal::SIGSTOP);
    let died = wait_for("the command to die", 5 * SEC, || !alive(child));
    // At most G + K after the last renewal, sent at most R before the freeze.
    assert!(
        died <= 2500 * MS + 300 * MS,
        "command died {died:?} after the freeze"
    );
    wait_file(&dir.file("b.pid"), 10 * SEC);
    let rival = t0.elapsed();
    let overlaps = usize::from(rival <= died);
    eprintln!(
        "overlaps: {overlaps} (command died {died:?}, rival started {rival:?} after the freeze)"
    );
    assert_eq!(overlaps, 0, "the rival ran while the old command was alive");
    signal(a.id(), Signal::SIGCONT);
    assert_eq!(wait_exit(&mut a, 5 * SEC).code(), Some(75));
    assert!(
        !alive(second),
        "the new watchdog outlived leaderrun's `done`"
    );
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// A watchdog that has not confirmed it holds its orders (stopped before
/// it could read them), and then dies with the orders in its pipe: the
/// command is never started, and the lease is released.
#[test]
fn no_command_starts_until_the_watchdog_confirms_its_orders() {
    let pg = Pg::start();
    let dir = TempDir::new("wd-unconfirmed");
    // The store is frozen while leaderrun starts, so that the watchdog,
    // started early, can be stopped before it gets its orders.
    pg.freeze(true);
    let mut a = spawn(
        lr(
            &pg.url(),
            "u",
            &L3,
            &format!("touch {}", dir.file("ran").display()),
        ),
        &dir.file("a.log"),
    );
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    signal(w as u32, Signal::SIGSTOP);
    pg.freeze(false);
    // leaderrun acquires and writes the orders into the stopped watchdog's
    // pipe; the watchdog then dies without reading them.
    std::thread::sleep(500 * MS);
    signal(w as u32, Signal::SIGKILL);
    let st = wait_exit(&mut a, 10 * SEC);
    let log = read(&dir.file("a.log"));
    assert!(
        !dir.file("ran").exists(),
        "the command ran without a confirmed watchdog: {log}"
    );
    assert_eq!(st.code(), Some(125), "{log}");
    // Released: the next run leads at once.
    let r = run(lr(
        &pg.url(),
        "u",
        &["--conflict-exit-code", "99"],
        "exit 0",
    ));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

/// Under a PID 1 that reaps nothing (a container whose entry point is a
/// script or a program that waits only for its own children), runs that
/// lead and runs that find the lease held leave no zombie watchdog behind.
#[test]
fn no_zombie_watchdogs_under_a_pid_1_that_never_reaps() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: unshare --pid needs root");
        return;
    }
    let dir = TempDir::new("zombies");
    let store = embedded(&dir);
    // PID 1 of a new pid namespace: python's subprocess waits for each
    // child by its pid, never for anything else.
    let init = r#"
import os, subprocess, sys, time
lr, store = sys.argv[1], sys.argv[2]
runs = 0
for _ in range(5):
    subprocess.run([lr, "--store", store, "--name", "z", "--", "true"], check=True)
    runs += 1
holder = subprocess.Popen([lr, "--store", store, "--name", "z", "--", "sleep", "2"])
time.sleep(0.5)
for _ in range(3):
    rc = subprocess.run([lr, "--store", store, "--name", "z", "--conflict-exit-code", "9", "--", "true"]).returncode
    assert rc == 9, rc
    runs += 1
holder.wait()
runs += 1
time.sleep(0.5)
zombies = 0
for p in os.listdir("/proc"):
    if p.isdigit():
        with open("/proc/%s/stat" % p) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                zombies += 1
print("runs %d zombies %d" % (runs, zombies))
"#;
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "python3", "-c", init])
        .arg(env!("CARGO_BIN_EXE_leaderrun"))
        .arg(&store)
        .stdin(Stdio::null());
    let out = c
        .output()
        .expect("unshare (util-linux) and python3 (Debian package python3) are needed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
    assert!(stdout.contains("runs 9 zombies 0"), "{stdout}");
}

/// leaderrun frozen past the kill deadline while its watchdog stops the
/// command: thawed, it finds the command ended (unreaped, its child) and
/// says so, without claiming the command "still runs at the kill
/// deadline" or signalling it again.
#[test]
fn a_command_the_watchdog_ended_is_not_said_to_still_run() {
    let dir = TempDir::new("t-thaw");
    let mut a = spawn(
        lr(
            &format!("sqlite://{}", dir.file("leases.db").display()),
            "thaw",
            &["--lease", "3s"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let pid = pid_in(&dir.file("a.pid"));
    signal(a.id(), Signal::SIGSTOP);
    // G = 2 s: the watchdog ends the command; K = 0.5 s later leaderrun's
    // own kill deadline has passed too.
    wait_for("the watchdog to end the command", 10 * SEC, || !alive(pid));
    std::thread::sleep(SEC);
    signal(a.id(), Signal::SIGCONT);
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(75));
    let log = read(&dir.file("a.log"));
    assert!(log.contains("no renewal reached the watchdog"), "{log}");
    assert!(!log.contains("still runs at the kill deadline"), "{log}");
}
