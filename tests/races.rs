//! Adversarial tests for the watchdog and the process tree: each forces one
//! race that a review reproduced (the F-numbers are the review's) and asserts
//! what a user relies on when it happens. Exact timing is forced, not hoped
//! for: `strace` holds leaderrun inside a chosen system call
//! (`-e inject=SYSCALL:delay_enter|delay_exit=USEC:when=N`, counted per
//! process), SIGSTOP freezes a process for as long as the test needs (the
//! cgroup freezer where the process must stay frozen across its parent's
//! death, see [`cgroup_freeze`]), and files the command writes say when it
//! has got somewhere.
//!
//! Where strace, root, cgroup v2 or `ns_last_pid` is missing, a test says so
//! on stderr and returns. Every test removes what it started (processes,
//! cgroups) even when it fails: see [`Cleanup`].

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

/// Scheduling slack on top of a bound derived from the timing: two shared
/// cores, a 10 ms polling test and strace in the way (the existing suites
/// use 200 ms for the same bounds without strace).
const SLACK: Duration = Duration::from_millis(300);

fn embedded(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("leases.db").display())
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_leaderrun")
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root");
    false
}

/// Whether strace can trace here (installed, and ptrace allowed).
fn strace_works() -> bool {
    let ok = Command::new("strace")
        .args(["-f", "-o", "/dev/null", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: strace is missing or cannot trace here");
    }
    ok
}

// ---------------------------------------------------------------------------
// Processes, named by pid and start time so that cleanup never signals a
// process that took a pid after the one meant had gone.

#[derive(Clone, Copy, Debug)]
struct Proc {
    pid: i32,
    start: u64,
}

fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, counted after the command name's closing parenthesis.
    s.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

impl Proc {
    fn of(pid: i32) -> Option<Proc> {
        start_time(pid).map(|start| Proc { pid, start })
    }
    fn same(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
    fn signal(&self, sig: Signal) {
        if self.same() {
            signal(self.pid as u32, sig);
        }
    }
}

/// SIGSTOP, and wait until the process is stopped (a signal is delivered
/// asynchronously: the test must not go on while it still runs).
fn freeze(pid: i32) {
    signal(pid as u32, Signal::SIGSTOP);
    wait_for(&format!("{pid} to stop"), 2 * SEC, || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with(['T', 't'])
            })
            .unwrap_or(true)
    });
}

/// The children of `pid` (its main thread's, which is where they are
/// listed for a single-threaded parent such as strace or sh).
fn children_of(pid: i32) -> Vec<i32> {
    read(Path::new(&format!("/proc/{pid}/task/{pid}/children")))
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Live processes whose argv contains `mark`.
fn marked(mark: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(mark))
                .unwrap_or(false)
                && alive(*pid)
        })
        .collect()
}

/// Stop every marked process (so that none can fork another), then kill
/// them all, until none is left.
fn kill_marked(mark: &str) {
    let t0 = Instant::now();
    while t0.elapsed() < 5 * SEC {
        let found = marked(mark);
        if found.is_empty() {
            return;
        }
        for p in &found {
            signal(*p as u32, Signal::SIGSTOP);
        }
        for p in &found {
            signal(*p as u32, Signal::SIGKILL);
        }
        std::thread::sleep(5 * MS);
    }
}

// ---------------------------------------------------------------------------
// cgroup v2.

fn cgroup2_mount() -> Option<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4).map(PathBuf::from))
}

/// This test process's own cgroup v2 directory.
fn own_cgroup() -> Option<PathBuf> {
    let mount = cgroup2_mount()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim().trim_start_matches('/')))
}

/// A fresh cgroup directory below this process's own, made by the test (so
/// leaderrun, moved into it, makes its command's cgroup inside, where no
/// other test's can be). None, with the reason printed, where cgroup v2 is
/// not writable.
fn private_cgroup(tag: &str) -> Option<PathBuf> {
    let Some(own) = own_cgroup() else {
        eprintln!("skipped: no cgroup v2 hierarchy");
        return None;
    };
    let dir = own.join(format!("races-{tag}-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dir) {
        eprintln!("skipped: cannot make a cgroup ({}): {e}", dir.display());
        return None;
    }
    Some(dir)
}

fn populated(cg: &Path) -> bool {
    read(&cg.join("cgroup.events"))
        .lines()
        .any(|l| l.trim() == "populated 1")
}

/// Kill everything in `cg` and below, then remove the directories, deepest
/// first.
fn remove_cgroup_tree(cg: &Path) {
    if !cg.exists() {
        return;
    }
    let _ = std::fs::write(cg.join("cgroup.kill"), "1");
    let t0 = Instant::now();
    while populated(cg) && t0.elapsed() < 3 * SEC {
        let _ = std::fs::write(cg.join("cgroup.kill"), "1");
        std::thread::sleep(10 * MS);
    }
    fn rm(d: &Path) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rm(&e.path());
                }
            }
        }
        let t0 = Instant::now();
        while std::fs::remove_dir(d).is_err() && d.exists() && t0.elapsed() < 2 * SEC {
            std::thread::sleep(10 * MS);
        }
    }
    rm(cg);
}

/// The `leaderrun-*` directories directly in `cg`.
fn leaderrun_cgroups(cg: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(cg)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("leaderrun-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Freeze `pid` with the cgroup freezer: moved into `cg` (a private cgroup),
/// then `cgroup.freeze`. Unlike SIGSTOP this survives the death of its
/// parent: the kernel sends SIGHUP and SIGCONT to a stopped process whose
/// group is orphaned, which is what a watchdog's group becomes when
/// leaderrun dies.
fn cgroup_freeze(cg: &Path, pid: i32) {
    std::fs::write(cg.join("cgroup.procs"), pid.to_string()).expect("move into the freezer");
    std::fs::write(cg.join("cgroup.freeze"), "1").expect("cgroup.freeze");
    wait_for("the cgroup to freeze", 2 * SEC, || {
        read(&cg.join("cgroup.events")).contains("frozen 1")
    });
}

fn cgroup_thaw(cg: &Path) {
    std::fs::write(cg.join("cgroup.freeze"), "0").expect("cgroup.freeze");
}

/// `prog args…`, started by a shell that first moves itself into `cg`.
fn in_cgroup(cg: &Path, prog: &str, args: &[String]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(cg.join("cgroup.procs"))
        .arg(prog)
        .args(args)
        .stdin(Stdio::null());
    clean_env(&mut c);
    c
}

/// What a test started, killed and removed when it ends, passed or not.
#[derive(Default)]
struct Cleanup {
    children: Vec<Child>,
    procs: Vec<Proc>,
    marks: Vec<String>,
    /// Removed last, in reverse order (made parent first).
    cgroups: Vec<PathBuf>,
    /// leaderruns started in this process's own cgroup: the cgroup each
    /// made is removed too (its watchdog, killed here, cannot).
    leaderruns: Vec<u32>,
}

impl Cleanup {
    fn with_cgroup(cg: PathBuf) -> Cleanup {
        let mut c = Cleanup::default();
        c.cgroups.push(cg);
        c
    }
    fn with_mark(mark: String) -> Cleanup {
        let mut c = Cleanup::default();
        c.marks.push(mark);
        c
    }
    /// A leaderrun: killed, and its command's cgroup removed.
    fn leaderrun(&mut self, pid: u32) {
        self.proc(pid as i32);
        self.leaderruns.push(pid);
    }
    fn proc(&mut self, pid: i32) {
        if let Some(p) = Proc::of(pid) {
            self.procs.push(p);
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.procs {
            p.signal(Signal::SIGKILL);
            p.signal(Signal::SIGCONT);
        }
        // All killed before any is waited for: a leaderrun killed under
        // strace only finishes dying once strace is gone.
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        for m in &self.marks {
            kill_marked(m);
        }
        for lr in &self.leaderruns {
            if let Some(cg) = cgroup_left_by(*lr) {
                remove_cgroup_tree(&cg);
            }
        }
        for cg in self.cgroups.iter().rev() {
            remove_cgroup_tree(cg);
        }
    }
}

// ---------------------------------------------------------------------------
// strace.

/// `strace -f` running leaderrun with `args`, tracing only `syscalls`
/// (seccomp-filtered, so the rest runs at full speed), with `inject`. The
/// trace goes to `log`.
fn strace_args(log: &Path, syscalls: &str, inject: Option<&str>, args: &[String]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "-f".into(),
        "--seccomp-bpf".into(),
        "-o".into(),
        log.display().to_string(),
        "-e".into(),
        format!("trace={syscalls}"),
    ];
    if let Some(i) = inject {
        v.push("-e".into());
        v.push(format!("inject={i}"));
    }
    v.push("--".into());
    v.push(bin().into());
    v.extend(args.iter().cloned());
    v
}

/// Run leaderrun once under strace without tampering and find, among the
/// calls of `syscalls` that leaderrun's main process makes, the first whose
/// trace line satisfies `want`: its name and its 1-based rank among that
/// name's calls in that process (strace counts `when=` per system call and
/// per process). leaderrun's main process is the one whose execve starts
/// the trace.
fn calibrate(
    cg: &Path,
    dir: &TempDir,
    syscalls: &str,
    args: &[String],
    want: impl Fn(&str) -> bool,
) -> Option<(String, usize)> {
    let log = dir.file("calibrate.trace");
    let a = strace_args(&log, &format!("execve,{syscalls}"), None, args);
    let out = in_cgroup(cg, "strace", &a)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if out.is_err() {
        return None;
    }
    let trace = read(&log);
    let main = trace.lines().next()?.split_whitespace().next()?.to_string();
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for l in trace.lines() {
        let Some(rest) = l.strip_prefix(&format!("{main} ")).map(str::trim_start) else {
            continue;
        };
        let Some(name) = rest
            .split('(')
            .next()
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        else {
            continue;
        };
        let n = counts.entry(name.to_string()).or_default();
        *n += 1;
        if want(rest) {
            return Some((name.to_string(), *n));
        }
    }
    eprintln!("calibration found no matching call; trace:\n{trace}");
    None
}

/// A store of its own for the calibration run, so that the run under test
/// starts from the same state (no database yet) and makes the same calls.
fn calibration_store(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("calibration.db").display())
}

/// leaderrun under a started strace: the child of strace that runs the
/// leaderrun binary (strace forks short-lived children of its own first, to
/// probe what the kernel supports).
fn traced_leaderrun(strace: &Child) -> i32 {
    wait_until_some("leaderrun under strace", 5 * SEC, || {
        children_of(strace.id() as i32).into_iter().find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).next() == Some(bin().as_bytes()))
        })
    })
}

// ---------------------------------------------------------------------------
// F1

/// F1: a watchdog SIGSTOPped for longer than G while leaderrun renews
/// normally, then SIGCONT, must not stop the command: every renewal queued
/// in its pipe meanwhile moved the deadline, and it must act on the latest,
/// not on one of the first lines it happens to read.
#[test]
fn a_thawed_watchdog_acts_on_the_latest_renewal_not_a_stale_one() {
    let dir = TempDir::new("race-f1");
    let store = embedded(&dir);
    // L = 2 s: G = 1333 ms, K = 333 ms; a renewal every 50 ms, so that a
    // freeze of 3 s queues some 60 deadline lines (well over a kilobyte).
    let mut c = lr(
        &store,
        "f1",
        &["--lease", "2s", "--renew", "50ms"],
        &worker(&dir, "a"),
    );
    c.process_group(0);
    let mut clean = Cleanup::default();
    let mut a = spawn(c, &dir.file("a.log"));
    clean.leaderrun(a.id());
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let cmd = pid_in(&dir.file("a.pid"));
    clean.proc(cmd);
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    clean.proc(w);
    freeze(w);
    std::thread::sleep(3 * SEC);
    signal(w as u32, Signal::SIGCONT);
    // A stale deadline is acted on at once; G + K covers any deadline the
    // thawed watchdog could hold while renewals keep coming.
    let t0 = Instant::now();
    while t0.elapsed() < 1333 * MS + 333 * MS + SLACK {
        assert!(
            alive(cmd),
            "the command was stopped {:?} after the watchdog was thawed, while leaderrun renewed: {}",
            t0.elapsed(),
            read(&dir.file("a.log"))
        );
        std::thread::sleep(10 * MS);
    }
    assert!(
        a.try_wait().expect("try_wait").is_none(),
        "{}",
        read(&dir.file("a.log"))
    );
    assert!(
        !read(&dir.file("a.log")).contains("watchdog_stop")
            && !read(&dir.file("a.log")).contains("no renewal reached the watchdog"),
        "{}",
        read(&dir.file("a.log"))
    );
    signal(a.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut a, 5 * SEC).code(), Some(143));
}

// ---------------------------------------------------------------------------
// F2, F3: leaderrun frozen around the fork that starts the command.

/// L = 3 s: R = 1 s, G = 2 s, K = 500 ms.
const G3: Duration = Duration::from_millis(2000);
const K3: Duration = Duration::from_millis(500);

/// The calibrated `SYSCALL:when=N` of the system call that starts the
/// command (clone3 into its cgroup, or a plain fork's clone where there is
/// no clone3), for leaderrun moved into `cg`.
fn command_fork(cg: &Path, dir: &TempDir, name: &str) -> Option<(String, usize)> {
    let args = strs(&[
        "--store",
        &calibration_store(dir),
        "--name",
        &format!("{name}-cal"),
        "--lease",
        "3s",
        "--",
        "true",
    ]);
    let found = calibrate(cg, dir, "clone,clone3", &args, |l| {
        l.starts_with("clone3(") && l.contains("CLONE_INTO_CGROUP")
    });
    if found.is_none() {
        eprintln!("skipped: could not find the clone3 that starts the command");
    }
    found
}

/// F2: leaderrun frozen after it told the watchdog `spawning` but before
/// `child` (held by strace on the way out of the clone3 that started the
/// command, for longer than the lease): the watchdog alone must stop the
/// command by the give-up deadline plus K.
#[test]
fn leaderrun_frozen_between_spawning_and_child_its_watchdog_still_stops_the_command() {
    if !is_root() || !strace_works() {
        return;
    }
    let Some(cg) = private_cgroup("f2") else {
        return;
    };
    let mut clean = Cleanup::with_cgroup(cg.clone());
    let dir = TempDir::new("race-f2");
    let Some((sys, n)) = command_fork(&cg, &dir, "f2") else {
        return;
    };
    let args = strs(&[
        "--store",
        &embedded(&dir),
        "--name",
        "f2",
        "--lease",
        "3s",
        "--",
        "sh",
        "-c",
        &format!("trap '' TERM; {}", worker(&dir, "a")),
    ]);
    let inject = format!("{sys}:delay_exit=8000000:when={n}");
    let st = strace_args(&dir.file("f2.trace"), &sys, Some(&inject), &args);
    let log = std::fs::File::create(dir.file("a.log")).expect("log");
    let strace = in_cgroup(&cg, "strace", &st)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("strace");
    clean.children.push(strace);
    let lr_pid = traced_leaderrun(&clean.children[0]);
    clean.proc(lr_pid);
    // The command's cgroup appears only after the acquisition, and so does
    // its pid file: the first of the two is an upper bound on `sent`.
    wait_for("the command's cgroup or pid file", 10 * SEC, || {
        !leaderrun_cgroups(&cg).is_empty() || dir.file("a.pid").exists()
    });
    let t_ref = Instant::now();
    let mine = leaderrun_cgroups(&cg);
    std::thread::sleep(G3 + K3 + SLACK);
    let pid = dir
        .file("a.pid")
        .exists()
        .then(|| pid_in(&dir.file("a.pid")));
    let running = pid.is_some_and(alive) || mine.iter().any(|c| populated(c));
    assert!(
        !running,
        "the command {pid:?} still ran {:?} after the acquisition, leaderrun frozen before \
         `child` (G + K = {:?}): {}",
        t_ref.elapsed(),
        G3 + K3,
        read(&dir.file("a.log"))
    );
}

/// leaderrun with `args` under strace (tracing `traced` into `trace`, with
/// the fault `inject`), in `cg`, stderr to `a.log`; waits for it to exit
/// (15 s at most). Its exit code, and when the wait began (before the
/// acquisition: what has passed since is an upper bound on the time since it).
fn held_by_strace_until_exit(
    cg: &Path,
    clean: &mut Cleanup,
    dir: &TempDir,
    trace: &Path,
    traced: &str,
    inject: &str,
    args: &[String],
) -> (Option<i32>, Instant) {
    let st = strace_args(trace, traced, Some(inject), args);
    let strace = in_cgroup(cg, "strace", &st)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.file("a.log")).expect("log"))
        .spawn()
        .expect("strace");
    clean.children.push(strace);
    let lr_pid = traced_leaderrun(&clean.children[0]);
    clean.proc(lr_pid);
    let t0 = Instant::now();
    let code = loop {
        if let Some(st) = clean.children[0].try_wait().expect("try_wait") {
            break st.code();
        }
        assert!(
            t0.elapsed() < 15 * SEC,
            "leaderrun did not exit: {}",
            read(&dir.file("a.log"))
        );
        std::thread::sleep(10 * MS);
    };
    (code, t0)
}

/// F3: leaderrun frozen just before the fork (held by strace on the way
/// into it) until past the give-up deadline: the command must not start at
/// all, and leaderrun exits 75.
#[test]
fn leaderrun_frozen_before_the_fork_past_the_deadline_never_starts_the_command() {
    if !is_root() || !strace_works() {
        return;
    }
    let Some(cg) = private_cgroup("f3") else {
        return;
    };
    let mut clean = Cleanup::with_cgroup(cg.clone());
    let dir = TempDir::new("race-f3");
    let Some((sys, n)) = command_fork(&cg, &dir, "f3") else {
        return;
    };
    let marker = dir.file("started");
    let args = strs(&[
        "--store",
        &embedded(&dir),
        "--name",
        "f3",
        "--lease",
        "3s",
        "--",
        "touch",
        &marker.display().to_string(),
    ]);
    // G = 2 s: held 3.5 s, it resumes past the give-up deadline (and past
    // the watchdog's G + K), before the lease's end.
    let inject = format!("{sys}:delay_enter=3500000:when={n}");
    // execve is traced too: the command's exec is in the trace whether or
    // not it got as far as its first file before leaderrun's SIGKILL.
    let trace = dir.file("f3.trace");
    let traced = format!("execve,{sys}");
    let (code, _) =
        held_by_strace_until_exit(&cg, &mut clean, &dir, &trace, &traced, &inject, &args);
    let execs: Vec<String> = read(&trace)
        .lines()
        .filter(|l| {
            l.split_once("execve(\"")
                .and_then(|(_, rest)| rest.split('"').next())
                .is_some_and(|path| path.ends_with("/touch"))
        })
        .map(str::to_string)
        .collect();
    assert!(
        execs.is_empty() && !marker.exists(),
        "the command started after leaderrun resumed past its give-up deadline: {execs:?}: {}",
        read(&dir.file("a.log"))
    );
    assert_eq!(code, Some(75), "{}", read(&dir.file("a.log")));
}

/// F3b: as F3, but resumed past the give-up deadline and before the
/// lease's end (L = 6 s, G = 4 s, held 4.5 s): nothing ran on that lease,
/// so it is handed back at its epoch, and a rival's try-once that follows
/// leaderrun's exit leads at once instead of skipping until the lease runs
/// out (the next firing would skip a job that ran nowhere).
#[test]
fn a_start_lost_to_a_freeze_hands_the_lease_back() {
    if !is_root() || !strace_works() {
        return;
    }
    let Some(cg) = private_cgroup("f3b") else {
        return;
    };
    let mut clean = Cleanup::with_cgroup(cg.clone());
    let dir = TempDir::new("race-f3b");
    let Some((sys, n)) = command_fork(&cg, &dir, "f3b") else {
        return;
    };
    let store = embedded(&dir);
    let marker = dir.file("started");
    let args = strs(&[
        "--store",
        &store,
        "--name",
        "f3b",
        "--lease",
        "6s",
        "--",
        "touch",
        &marker.display().to_string(),
    ]);
    let inject = format!("{sys}:delay_enter=4500000:when={n}");
    let trace = dir.file("f3b.trace");
    let (code, t0) = held_by_strace_until_exit(&cg, &mut clean, &dir, &trace, &sys, &inject, &args);
    assert_eq!(code, Some(75), "{}", read(&dir.file("a.log")));
    assert!(!marker.exists(), "the command started past the deadline");
    // Under 6 s since the acquisition: the lease would still be held.
    let rival = run({
        let mut c = leaderrun();
        c.args([
            "--store",
            &store,
            "--name",
            "f3b",
            "--conflict-exit-code",
            "9",
        ])
        .args(["--", "true"]);
        c
    });
    assert!(
        t0.elapsed() < 6 * SEC,
        "too slow to tell: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        rival.code,
        Some(0),
        "the rival did not lead right after a start lost to a freeze (9: held): {}\n{}",
        rival.stderr,
        read(&dir.file("a.log"))
    );
}

// ---------------------------------------------------------------------------
// F4

/// Whether the chain still runs: a generation is added to `gens` every
/// ~100 ms while it does (a scan of /proc alone can miss a chain whose
/// processes live that briefly), or a marked process is still there.
fn chain_runs(gens: &Path, mark: &str) -> bool {
    let n = read(gens).lines().count();
    let t0 = Instant::now();
    while t0.elapsed() < 400 * MS {
        if read(gens).lines().count() > n {
            return true;
        }
        std::thread::sleep(10 * MS);
    }
    !marked(mark).is_empty()
}

/// F4: without a writable cgroup (run as nobody), the command leaves a
/// chain behind in a session of its own in which each process forks its
/// successor and exits, so every process the watchdog's last look saw is
/// gone by the time leaderrun is killed, and the live one is init's child,
/// out of sight. What the contract promises (§11) is that the watchdog
/// then cannot vouch that everything is gone and does not hand the lease
/// back: a rival waits out the lease instead of starting at once beside the
/// survivor. (Stopping such a chain needs the cgroup.) The test also says
/// whether the chain outlived the lease, for the record.
#[test]
fn without_a_cgroup_a_fast_forking_chain_left_behind_keeps_the_lease_from_being_handed_back() {
    if !is_root() {
        return;
    }
    let dir = TempDir::new("race-f4");
    let store = embedded(&dir);
    let mark = format!("RACEMARK{}f4", std::process::id());
    let chain = dir.file("chain.sh");
    // Each generation lives ~100 ms, then forks the next and exits; the
    // marker is in every generation's argv.
    let gens = dir.file("gens");
    std::fs::write(
        &chain,
        format!(
            "echo $$ >> {}\nsleep 0.1\nsh \"$0\" \"$1\" &\nexit 0\n",
            gens.display()
        ),
    )
    .expect("chain");
    // Started from a file, so that the marker is in no argv but the
    // chain's (not leaderrun's, not the command's).
    let start = dir.file("start.sh");
    std::fs::write(&start, format!("setsid sh {} {mark} &\n", chain.display())).expect("start");
    let script = format!(
        "sh {start} & echo $$ > {p}.tmp && mv {p}.tmp {p}; \
         while :; do sleep 0.05; done",
        start = start.display(),
        p = dir.file("cmd.pid").display(),
    );
    let mut c = leaderrun_unprivileged(&dir);
    c.args(["--store", &store, "--name", "f4", "--lease", "3s", "-vv"])
        .args(["--", "sh", "-c", &script]);
    let mut clean = Cleanup::with_mark(mark.clone());
    let log = dir.file("a.log");
    let mut a = spawn(c, &log);
    clean.proc(a.id() as i32);
    wait_file(&dir.file("cmd.pid"), 10 * SEC);
    clean.proc(pid_in(&dir.file("cmd.pid")));
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    clean.proc(w);
    // A renewal (R = 1 s) reached the watchdog: it has had a look. Then
    // every process of the chain it can have seen is gone, replaced by
    // later ones, before the next renewal: a look that caught the chain's
    // current generation would stop it by chance.
    let renewals = || read(&log).lines().filter(|l| l.contains("renewed")).count();
    loop {
        let n = renewals();
        wait_for("a renewal", 5 * SEC, || renewals() > n);
        std::thread::sleep(100 * MS);
        let seen = marked(&mark);
        assert!(!seen.is_empty(), "the chain did not start: {}", read(&log));
        wait_for("the chain to move on", 2 * SEC, || {
            seen.iter().all(|p| !alive(*p))
        });
        if renewals() == n + 1 && chain_runs(&gens, &mark) {
            break;
        }
    }
    let t0 = Instant::now();
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    wait_for("the watchdog to finish", 10 * SEC, || !alive(w));
    let said = read(&log);
    let lease = 3 * SEC;
    let gone = (|| {
        while t0.elapsed() < lease + SLACK {
            if !chain_runs(&gens, &mark) {
                return true;
            }
        }
        false
    })();
    eprintln!(
        "F4: the chain {} {:?} after leaderrun's kill -9 (L = {lease:?})",
        if gone { "was gone" } else { "still ran" },
        t0.elapsed()
    );
    assert!(
        !said.contains("lease released"),
        "the watchdog handed the lease back while it could not vouch for the chain: {said}"
    );
    assert!(said.contains("left to expire"), "{said}");
}

// ---------------------------------------------------------------------------
// F5

/// F5: the watchdog is SIGKILLed while leaderrun stops the command (at
/// `--max-term`; the command ignores SIGTERM and lingers until K), and then
/// leaderrun freezes: the command must still be dead by the give-up
/// deadline plus K, as "either process suffices" promises: a replacement
/// watchdog is started, or the stop does not depend on leaderrun alone.
#[test]
fn the_watchdog_killed_during_a_stop_the_command_still_dies_by_the_kill_deadline() {
    let dir = TempDir::new("race-f5");
    let store = embedded(&dir);
    // G = 3 s, K = 2 s: the stop starts at 1 s and lasts up to K.
    let timing = [
        "--lease",
        "6s",
        "--give-up",
        "3s",
        "--kill-after",
        "2s",
        "--max-term",
        "1s",
    ];
    let (g, k) = (3 * SEC, 2 * SEC);
    let script = format!(
        "trap 'echo T >> {t}' TERM; echo $$ > {p}.tmp && mv {p}.tmp {p}; \
         while :; do sleep 0.02; done",
        t = dir.file("terms").display(),
        p = dir.file("a.pid").display(),
    );
    let mut clean = Cleanup::default();
    let mut a = spawn(lr(&store, "f5", &timing, &script), &dir.file("a.log"));
    clean.leaderrun(a.id());
    wait_file(&dir.file("a.pid"), 10 * SEC);
    // The pid file is written after `sent`: deadlines are bounded from it.
    let t_ref = Instant::now();
    let cmd = pid_in(&dir.file("a.pid"));
    clean.proc(cmd);
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    clean.proc(w);
    wait_file(&dir.file("terms"), 5 * SEC);
    signal(w as u32, Signal::SIGKILL);
    // A replacement (or the end of the command) in a moment; then only it
    // guards the stop.
    let dt = Instant::now();
    while dt.elapsed() < 500 * MS && alive(cmd) {
        if watchdog_of(a.id()).is_some_and(|n| n != w && alive(n)) {
            break;
        }
        std::thread::sleep(5 * MS);
    }
    if let Some(n) = watchdog_of(a.id()) {
        clean.proc(n);
    }
    freeze(a.id() as i32);
    let bound = g + k + SLACK;
    while alive(cmd) && t_ref.elapsed() < bound + SEC {
        std::thread::sleep(10 * MS);
    }
    let died = t_ref.elapsed();
    let still = alive(cmd);
    signal(a.id(), Signal::SIGCONT);
    assert!(
        !still && died <= bound,
        "the command ran {died:?} after the acquisition (G + K = {:?}) with its watchdog \
         killed during the stop and leaderrun frozen: {}",
        g + k,
        read(&dir.file("a.log"))
    );
    // leaderrun, thawed, would now wait for a successor to take over
    // (`--max-term`'s handover): not what this test is about.
    let _ = a.kill();
    let _ = a.wait();
}

// ---------------------------------------------------------------------------
// F7

/// F7: leaderrun runs in a cgroup whose path contains a space
/// (`…/races-f7-N space`), beside a stranger's cgroup named by the part
/// before the space (`…/races-f7-N`) that holds a `sleep`. leaderrun is
/// killed: its watchdog kills the command, and the stranger survives.
#[test]
fn a_cgroup_path_with_a_space_never_leads_the_watchdog_to_a_strangers_cgroup() {
    if !is_root() {
        return;
    }
    let Some(stranger_cg) = private_cgroup("f7") else {
        return;
    };
    let spaced = PathBuf::from(format!("{} space", stranger_cg.display()));
    let mut clean = Cleanup::with_cgroup(stranger_cg.clone());
    std::fs::create_dir(&spaced).expect("the spaced cgroup");
    clean.cgroups.push(spaced.clone());
    let stranger = in_cgroup(&stranger_cg, "sleep", &["1000".into()])
        .spawn()
        .expect("the stranger");
    let sp = stranger.id() as i32;
    clean.children.push(stranger);
    wait_for("the stranger in its cgroup", 5 * SEC, || {
        read(&stranger_cg.join("cgroup.procs")).contains(&sp.to_string())
    });
    let dir = TempDir::new("race-f7");
    let args = strs(&[
        "--store",
        &embedded(&dir),
        "--name",
        "f7",
        "--lease",
        "3s",
        "--",
        "sh",
        "-c",
        &worker(&dir, "a"),
    ]);
    let log = std::fs::File::create(dir.file("a.log")).expect("log");
    let mut a = in_cgroup(&spaced, bin(), &args)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("leaderrun");
    clean.proc(a.id() as i32);
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let cmd = pid_in(&dir.file("a.pid"));
    clean.proc(cmd);
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    clean.proc(w);
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    wait_for("the watchdog to finish", 5 * SEC, || !alive(w));
    wait_for("the command to die", 2 * SEC, || !alive(cmd));
    assert!(
        alive(sp),
        "the stranger in {} was killed by leaderrun's watchdog: {}",
        stranger_cg.display(),
        read(&dir.file("a.log"))
    );
}

// ---------------------------------------------------------------------------
// F8

/// F8: leaderrun A is killed while its watchdog is frozen (by the cgroup
/// freezer, see [`cgroup_freeze`]; its command dies with it); the next leaderrun B gets A's pid, and so would make a cgroup
/// of the same name. A's watchdog, thawed, must not kill B's command.
#[test]
fn a_late_watchdog_never_kills_the_command_of_the_next_leaderrun_with_its_pid() {
    if !is_root() || !can_force_pids() {
        return;
    }
    let Some(freezer) = private_cgroup("f8") else {
        return;
    };
    let mut clean = Cleanup::with_cgroup(freezer.clone());
    let dir = TempDir::new("race-f8");
    let store = embedded(&dir);
    let mut a = spawn(
        lr(&store, "f8a", &["--lease", "3s"], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    clean.leaderrun(a.id());
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let a_cmd = pid_in(&dir.file("a.pid"));
    clean.proc(a_cmd);
    let w = wait_until_some("A's watchdog", 5 * SEC, || watchdog_of(a.id()));
    clean.proc(w);
    cgroup_freeze(&freezer, w);
    let a_pid = a.id() as i32;
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    wait_for("A's command to die with it", 2 * SEC, || !alive(a_cmd));
    let b_log = dir.file("b.log");
    let b = with_pid(a_pid, || {
        spawn(
            lr(&store, "f8b", &["--lease", "3s"], &worker(&dir, "b")),
            &b_log,
        )
    });
    let Some(mut b) = b else {
        eprintln!("skipped: could not get pid {a_pid} for the next leaderrun");
        return;
    };
    clean.leaderrun(b.id());
    wait_file(&dir.file("b.pid"), 10 * SEC);
    let b_cmd = pid_in(&dir.file("b.pid"));
    clean.proc(b_cmd);
    cgroup_thaw(&freezer);
    // The watchdog of a dead leaderrun waits at most until A's lease
    // expires (L = 3 s), and a second for the last of its processes.
    wait_for("A's watchdog to finish", 5 * SEC, || !alive(w));
    std::thread::sleep(200 * MS);
    assert!(
        alive(b_cmd),
        "A's late watchdog killed the command of B, which took A's pid {a_pid}: {}\n{}",
        read(&dir.file("a.log")),
        read(&b_log)
    );
    signal(b.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut b, 5 * SEC).code(), Some(143));
}

// ---------------------------------------------------------------------------
// F9

/// F9: a `--store` holding a newline or another control character is
/// refused before anything runs: exit 2, one line, the value not echoed
/// (it may hold a password, and it would forge lines in the watchdog's
/// orders).
#[test]
fn a_store_with_a_control_character_is_refused_in_one_line() {
    let dir = TempDir::new("race-f9");
    let marker = dir.file("ran");
    for (i, bad) in ["\n", "\r", "\u{1b}", "\t", "\u{7f}"].iter().enumerate() {
        let store = format!(
            "sqlite://{}/a{bad}Zq9SecretPart{i}.db",
            dir.path().display()
        );
        let r = run(lr(
            &store,
            "f9",
            &[],
            &format!("touch {}", marker.display()),
        ));
        assert_eq!(r.code, Some(2), "{bad:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{bad:?}: {}", r.stderr);
        assert!(!marker.exists(), "{bad:?}: the command started");
        assert!(
            !r.stderr.contains("Zq9SecretPart"),
            "{bad:?}: the store was echoed: {}",
            r.stderr
        );
    }
}

// ---------------------------------------------------------------------------
// F11

/// F11: the watchdog is killed; leaderrun starts a replacement and is held
/// (by strace, attached to it) on its way out of the `poll` that waits for
/// the replacement's `ready`, before it can replay `spawning`/`child`: the
/// replacement must already know the command and stop it by the give-up
/// deadline plus K.
///
/// The `poll` is leaderrun's only one after the command started: its event
/// loop waits in epoll, and `poll` is what waits for a watchdog's answer.
#[test]
fn a_replacement_watchdog_guards_the_command_before_leaderrun_replays_anything() {
    if !is_root() || !strace_works() {
        return;
    }
    let dir = TempDir::new("race-f11");
    let store = embedded(&dir);
    let mut clean = Cleanup::default();
    let a = spawn(
        lr(&store, "f11", &["--lease", "3s"], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    let lr_pid = a.id();
    clean.leaderrun(lr_pid);
    clean.children.push(a);
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let cmd = pid_in(&dir.file("a.pid"));
    clean.proc(cmd);
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(lr_pid));
    clean.proc(w);
    // Attached to leaderrun's main thread only: the replacement runs free.
    let err = dir.file("strace.err");
    let strace = Command::new("strace")
        .args(["-p", &lr_pid.to_string(), "-o"])
        .arg(dir.file("f11.trace"))
        .args([
            "-e",
            "trace=poll,ppoll",
            "-e",
            "inject=poll,ppoll:delay_exit=8000000:when=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).expect("strace log"))
        .spawn()
        .expect("strace");
    clean.children.push(strace);
    wait_for("strace to attach", 5 * SEC, || {
        read(&err).contains("attached")
    });
    signal(w as u32, Signal::SIGKILL);
    let n = wait_until_some("the replacement", 5 * SEC, || {
        watchdog_of(lr_pid).filter(|n| *n != w && alive(*n))
    });
    // No renewal can have been sent after the replacement appeared:
    // leaderrun was busy starting it, then held.
    let t_ref = Instant::now();
    clean.proc(n);
    while alive(cmd) && t_ref.elapsed() < G3 + K3 + SLACK + SEC {
        std::thread::sleep(10 * MS);
    }
    let died = t_ref.elapsed();
    assert!(
        !alive(cmd) && died <= G3 + K3 + SLACK,
        "the command ran {died:?} after the replacement started (G + K = {:?}), leaderrun \
         held before replaying `child`: {}\n{}",
        G3 + K3,
        read(&dir.file("a.log")),
        read(&dir.file("f11.trace"))
    );
}

// ---------------------------------------------------------------------------
// F12

/// F12: leaderrun is killed between making the command's cgroup directory
/// and telling the watchdog `spawning` (held by strace on its way out of
/// that mkdir): once the watchdog has finished, no `leaderrun-*` cgroup is
/// left.
#[test]
fn leaderrun_killed_right_after_making_the_cgroup_leaves_no_cgroup_behind() {
    if !is_root() || !strace_works() {
        return;
    }
    let Some(cg) = private_cgroup("f12") else {
        return;
    };
    let mut clean = Cleanup::with_cgroup(cg.clone());
    let dir = TempDir::new("race-f12");
    let cal = strs(&[
        "--store",
        &calibration_store(&dir),
        "--name",
        "f12-cal",
        "--lease",
        "3s",
        "--",
        "true",
    ]);
    // The database's directory is named leaderrun-test-…: only a path in
    // the cgroup the test made counts.
    let inside = format!("{}/leaderrun-", cg.display());
    let Some((sys, n)) = calibrate(&cg, &dir, "mkdir,mkdirat", &cal, |l| l.contains(&inside))
    else {
        eprintln!("skipped: could not find the mkdir of the command's cgroup");
        return;
    };
    let args = strs(&[
        "--store",
        &embedded(&dir),
        "--name",
        "f12",
        "--lease",
        "3s",
        "--",
        "sh",
        "-c",
        &worker(&dir, "a"),
    ]);
    let inject = format!("{sys}:delay_exit=20000000:when={n}");
    let st = strace_args(&dir.file("f12.trace"), &sys, Some(&inject), &args);
    let strace = in_cgroup(&cg, "strace", &st)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.file("a.log")).expect("log"))
        .spawn()
        .expect("strace");
    clean.children.push(strace);
    let lr_pid = traced_leaderrun(&clean.children[0]);
    clean.proc(lr_pid);
    wait_for("the command's cgroup", 10 * SEC, || {
        !leaderrun_cgroups(&cg).is_empty()
    });
    let t0 = Instant::now();
    let w = loop {
        if let Some(w) = watchdog_of(lr_pid as u32) {
            break w;
        }
        assert!(
            t0.elapsed() < 5 * SEC,
            "no watchdog for leaderrun {lr_pid}: {:?}\n{}\n{}",
            leaderrun_cgroups(&cg),
            read(&dir.file("a.log")),
            read(&dir.file("f12.trace"))
        );
        std::thread::sleep(10 * MS);
    };
    clean.proc(w);
    signal(lr_pid as u32, Signal::SIGKILL);
    // strace holds a killed tracee in its exit until the delay ends; gone,
    // it lets leaderrun die at once (and lets the watchdog run untraced).
    let _ = clean.children[0].kill();
    let _ = clean.children[0].wait();
    // A watchdog orphaned with the lease in hand waits at most until the
    // lease would expire (L = 3 s from the acquisition) for what it stops.
    wait_for("the watchdog to finish", 3 * SEC + 2 * SEC, || !alive(w));
    let left = leaderrun_cgroups(&cg);
    assert!(
        left.is_empty(),
        "left behind: {left:?}: {}",
        read(&dir.file("a.log"))
    );
    assert!(!dir.file("a.pid").exists(), "the command started");
}

// ---------------------------------------------------------------------------
// F10

/// F10: without a cgroup, a watchdog delayed across a single renewal's look
/// cannot vouch that leaderrun's descendants are all gone when leaderrun
/// dies (one may have left the command's group in that renewal), so it must
/// leave the lease to expire rather than hand it back.
#[test]
fn a_watchdog_that_missed_one_look_does_not_hand_the_lease_back() {
    if !is_root() {
        return;
    }
    let dir = TempDir::new("race-f10");
    let store = embedded(&dir);
    let script = escapes_on_go(&dir);
    let base = |dir: &TempDir| {
        let mut c = leaderrun_unprivileged(dir);
        c.args(["--store", &store, "--name", "f10", "--lease", "3s"]);
        c
    };
    let mut c = base(&dir);
    c.args(["-vv", "--", "sh", "-c", &script]);
    let log = dir.file("a.log");
    let mut clean = Cleanup::default();
    let mut a = spawn(c, &log);
    clean.proc(a.id() as i32);
    wait_file(&dir.file("cmd.pid"), 10 * SEC);
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    clean.proc(w);
    let renewals = || read(&log).lines().filter(|l| l.contains("renewed")).count();
    wait_for("a renewal", 10 * SEC, || renewals() >= 1);
    std::thread::sleep(100 * MS);
    freeze(w);
    std::fs::write(dir.file("go"), "").expect("go");
    wait_file(&dir.file("esc.pid"), 5 * SEC);
    let esc = pid_in(&dir.file("esc.pid"));
    clean.proc(esc);
    // One renewal the watchdog does not read, the escaped one running.
    let n = renewals();
    wait_for("one more renewal", 10 * SEC, || renewals() > n);
    std::thread::sleep(100 * MS);
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    signal(w as u32, Signal::SIGCONT);
    wait_for("the watchdog to finish", 5 * SEC, || !alive(w));
    let mut rival = base(&dir);
    rival.args(["--conflict-exit-code", "99", "--", "true"]);
    let r = run(rival);
    assert_eq!(
        r.code,
        Some(99),
        "the lease was handed back while {esc}, unseen by the watchdog, may have run: {}\n{}",
        r.stderr,
        read(&log)
    );
}

// ---------------------------------------------------------------------------
// F6

/// F6: as PID 1 of a pid namespace (a container's entry point) leaderrun
/// names its command's cgroup after pid 1, a pid that always exists. Its
/// cgroup is removed at the end of a run; and when the whole namespace is
/// killed (leaderrun, its watchdog and the command at once), the cgroup left
/// behind is swept by a later leaderrun once it is old, like any other
/// (the existing sweep is by age: an hour-old directory is made so here).
#[test]
fn as_init_of_a_pid_namespace_the_commands_cgroup_is_removed_at_the_end() {
    if !is_root() {
        return;
    }
    let Some(cg) = private_cgroup("f6") else {
        return;
    };
    let mut clean = Cleanup::with_cgroup(cg.clone());
    let dir = TempDir::new("race-f6");
    let probe = dir.file("cgroup");
    let in_ns = |name: &str, script: &str| {
        strs(&[
            "--pid",
            "--fork",
            "--mount-proc",
            bin(),
            "--store",
            &embedded(&dir),
            "--name",
            name,
            "--lease",
            "2s",
            "--",
            "sh",
            "-c",
            script,
        ])
    };
    // 1. A run to its end.
    let script = format!(
        "test $PPID = 1 && cat /proc/self/cgroup > {}",
        probe.display()
    );
    let out = in_cgroup(&cg, "unshare", &in_ns("f6", &script))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.file("a.log")).expect("log"))
        .status()
        .expect("unshare");
    assert_eq!(out.code(), Some(0), "{}", read(&dir.file("a.log")));
    assert!(
        read(&probe).contains("/leaderrun-"),
        "the command was not in a cgroup of its own: {}",
        read(&probe)
    );
    let left = leaderrun_cgroups(&cg);
    assert!(
        left.is_empty(),
        "left behind after the run: {left:?}: {}",
        read(&dir.file("a.log"))
    );
    // 2. The namespace killed whole: its PID 1 (unshare's child) gets
    // SIGKILL, and the kernel kills everything else in it.
    let unshare = in_cgroup(&cg, "unshare", &in_ns("f6b", &worker(&dir, "b")))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.file("b.log")).expect("log"))
        .spawn()
        .expect("unshare");
    let u = unshare.id() as i32;
    clean.children.push(unshare);
    wait_file(&dir.file("b.pid"), 10 * SEC);
    let init = wait_until_some("the namespace's PID 1", 5 * SEC, || {
        children_of(u).first().copied()
    });
    // Its watchdog, frozen first: it would otherwise see leaderrun's end in
    // the instant before the kernel kills it too, and remove the cgroup.
    let w = wait_until_some("the namespace's watchdog", 5 * SEC, || {
        read(&cg.join("cgroup.procs"))
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(&b"--be-watchdog"[..]))
            })
    });
    let freezer = cg.join("freezer");
    std::fs::create_dir(&freezer).expect("freezer cgroup");
    cgroup_freeze(&freezer, w);
    signal(init as u32, Signal::SIGKILL);
    let _ = clean.children[0].wait();
    wait_for("the namespace to die", 2 * SEC, || !populated(&freezer));
    let _ = std::fs::remove_dir(&freezer);
    let stale = leaderrun_cgroups(&cg);
    assert_eq!(stale.len(), 1, "{stale:?}");
    wait_for("the left cgroup to empty", 2 * SEC, || {
        !populated(&stale[0])
    });
    // An hour old, as by the next run of a cron job.
    let st = Command::new("touch")
        .args(["-d", "1 hour ago"])
        .arg(&stale[0])
        .status()
        .expect("touch");
    assert!(st.success());
    let out = in_cgroup(
        &cg,
        bin(),
        &strs(&["--store", &embedded(&dir), "--name", "f6c", "--", "true"]),
    )
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(dir.file("c.log")).expect("log"))
    .status()
    .expect("leaderrun");
    assert_eq!(out.code(), Some(0), "{}", read(&dir.file("c.log")));
    let left = leaderrun_cgroups(&cg);
    assert!(
        left.is_empty(),
        "the cgroup of a killed PID-1 leaderrun, an hour old, was not swept: {left:?}"
    );
}
