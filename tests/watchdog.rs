//! The command never outruns its lease, whatever happens to leaderrun
//! itself: frozen, blocked on a full stderr, killed with its whole group,
//! interrupted; descendants that leave the group are stopped too; broken
//! pipes and hostile numbers do not crash it; a blip is ridden out.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn embedded(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.file("leases.db").display())
}

/// A command that ignores SIGTERM (so only SIGKILL ends it), writes its pid
/// and starts a grandchild that ignores SIGTERM too.
fn stubborn(dir: &TempDir, tag: &str) -> String {
    format!(
        "trap '' TERM; echo $$ > {p}.tmp && mv {p}.tmp {p}; \
         sleep 1000 & echo $! > {g}.tmp && mv {g}.tmp {g}; wait",
        p = dir.file(&format!("{tag}.pid")).display(),
        g = dir.file(&format!("{tag}.grandchild")).display(),
    )
}

/// L = 2 s: R = 667 ms, G = 1333 ms, K = 333 ms.
const L2: [&str; 2] = ["--lease", "2s"];
const G_PLUS_K: Duration = Duration::from_millis(1667);

#[test]
fn leaderrun_frozen_alone_its_watchdog_stops_the_command_before_a_rival_leads() {
    let dir = TempDir::new("wd-frozen");
    let store = embedded(&dir);
    let mut a = spawn(
        lr(&store, "f", &L2, &stubborn(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.grandchild"), 10 * SEC);
    let (child, grandchild) = (
        pid_in(&dir.file("a.pid")),
        pid_in(&dir.file("a.grandchild")),
    );
    let mut b = spawn(
        lr(
            &store,
            "f",
            &[&L2[..], &["--wait", "--retry", "50ms"]].concat(),
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    // Freeze leaderrun alone: its command runs on, unsupervised by it.
    let t0 = Instant::now();
    signal(a.id(), Signal::SIGSTOP);
    let died = wait_for("the command to die", 5 * SEC, || {
        !alive(child) && !alive(grandchild)
    });
    // The last renewal was sent at most R before the freeze, so the
    // watchdog's SIGKILL comes at most G + K after it.
    assert!(
        died <= G_PLUS_K + 200 * MS,
        "command died {died:?} after the freeze"
    );
    assert!(
        died >= 1333 * MS - 667 * MS,
        "stopped before the deadline: {died:?}"
    );
    wait_file(&dir.file("b.pid"), 5 * SEC);
    let rival = t0.elapsed();
    assert!(
        rival > died,
        "the rival ran while the old command was alive"
    );
    assert_eq!(read(&dir.file("b.epoch")).trim(), "2");
    assert!(
        read(&dir.file("a.log")).contains("no renewal reached the watchdog"),
        "{}",
        read(&dir.file("a.log"))
    );
    // Thawed, leaderrun finds its lease lost and says so.
    signal(a.id(), Signal::SIGCONT);
    assert_eq!(wait_exit(&mut a, 5 * SEC).code(), Some(75));
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// A pipe for stderr that nobody reads, already full.
fn full_pipe() -> (std::fs::File, std::fs::File) {
    let (r, w) = nix::unistd::pipe().expect("pipe");
    // A second open file description of the same pipe, non-blocking, to
    // fill it without making leaderrun's copy non-blocking.
    let filler = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", w.as_raw_fd()))
        .expect("reopen pipe");
    use std::io::Write;
    let chunk = [b'.'; 4096];
    let mut f = &filler;
    while f.write(&chunk).is_ok() {}
    (std::fs::File::from(r), std::fs::File::from(w))
}

use std::os::unix::fs::OpenOptionsExt;

#[test]
fn a_full_stderr_does_not_delay_the_stop() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    let dir = TempDir::new("wd-stderr");
    let (_reader, writer) = full_pipe();
    let mut c = lr(
        &pg.url_via(proxy.port),
        "s",
        &[&L2[..], &["-vv"]].concat(),
        &stubborn(&dir, "a"),
    );
    c.stdout(Stdio::null()).stderr(writer).process_group(0);
    let mut a = c.spawn().expect("spawn");
    wait_file(&dir.file("a.grandchild"), 10 * SEC);
    let (child, grandchild) = (
        pid_in(&dir.file("a.pid")),
        pid_in(&dir.file("a.grandchild")),
    );
    // Cut the store off: every renewal now fails, and every failure is a
    // warning leaderrun cannot write.
    let t0 = Instant::now();
    proxy.blackhole();
    let died = wait_for("the command to die", 5 * SEC, || {
        !alive(child) && !alive(grandchild)
    });
    assert!(
        died <= G_PLUS_K + 200 * MS,
        "command died {died:?} after the cut"
    );
    // leaderrun itself was not stuck either: it exits 75, giving its last
    // log lines half a second to drain.
    let st = wait_exit(&mut a, G_PLUS_K + 2 * SEC);
    assert_eq!(st.code(), Some(75));
    assert!(t0.elapsed() < G_PLUS_K + 1500 * MS, "{:?}", t0.elapsed());
}

#[test]
fn ctrl_c_to_leaderrun_group_then_kill_9_leaves_nothing_running() {
    let dir = TempDir::new("wd-int");
    let store = embedded(&dir);
    let script = format!("trap '' INT; {}", stubborn(&dir, "a"));
    let mut a = spawn(lr(&store, "i", &[], &script), &dir.file("a.log"));
    wait_file(&dir.file("a.grandchild"), 10 * SEC);
    let (child, grandchild) = (
        pid_in(&dir.file("a.pid")),
        pid_in(&dir.file("a.grandchild")),
    );
    // A terminal's Ctrl-C reaches leaderrun's whole group (it runs in one
    // of its own here): it is passed on, and the command ignores it.
    signal_group(a.id(), Signal::SIGINT);
    std::thread::sleep(300 * MS);
    assert!(
        alive(child) && alive(grandchild),
        "the command did not ignore SIGINT"
    );
    let w = watchdog_of(a.id()).expect("the watchdog survived Ctrl-C");
    assert!(alive(w));
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    let died = wait_for("the command to die", 2 * SEC, || {
        !alive(child) && !alive(grandchild)
    });
    assert!(died < 500 * MS, "{died:?}");
}

#[test]
fn sigkill_to_leaderrun_whole_group_stops_everything_before_the_next_holder() {
    let dir = TempDir::new("wd-group");
    let store = embedded(&dir);
    let mut a = spawn(
        lr(&store, "g", &[], &stubborn(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.grandchild"), 10 * SEC);
    let grandchild = pid_in(&dir.file("a.grandchild"));
    let mut b = spawn(
        lr(
            &store,
            "g",
            &["--wait", "--retry", "50ms"],
            &worker(&dir, "b"),
        ),
        &dir.file("b.log"),
    );
    std::thread::sleep(200 * MS);
    // `timeout -k`, `kill -9 -- -PGID`: leaderrun's group, not the command's.
    let t0 = Instant::now();
    signal_group(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    let died = wait_for("the grandchild to die", 2 * SEC, || !alive(grandchild));
    wait_file(&dir.file("b.pid"), 5 * SEC);
    assert!(
        t0.elapsed() > died,
        "the next holder ran beside the old grandchild"
    );
    // Released by the watchdog: no waiting out the 15 s lease.
    assert!(t0.elapsed() < 2 * SEC, "{:?}", t0.elapsed());
    signal(b.id(), Signal::SIGTERM);
    wait_exit(&mut b, 5 * SEC);
}

/// A descendant that leaves the command's group: `setsid` and a daemon's
/// double fork.
fn escaping(dir: &TempDir, then: &str) -> String {
    format!(
        "setsid sh -c 'echo $$ > {e}.tmp && mv {e}.tmp {e}; exec sleep 1000' & \
         (sh -c 'echo $$ > {d}.tmp && mv {d}.tmp {d}; exec sleep 1000' &) ; \
         while [ ! -e {e} ] || [ ! -e {d} ]; do sleep 0.01; done; {then}",
        e = dir.file("escaped.pid").display(),
        d = dir.file("daemon.pid").display(),
    )
}

fn escapees(dir: &TempDir) -> [i32; 2] {
    wait_file(&dir.file("escaped.pid"), 10 * SEC);
    wait_file(&dir.file("daemon.pid"), 10 * SEC);
    [
        pid_in(&dir.file("escaped.pid")),
        pid_in(&dir.file("daemon.pid")),
    ]
}

fn escapees_are_stopped(unprivileged: bool) {
    let dir = TempDir::new(if unprivileged { "esc-user" } else { "esc-root" });
    let store = embedded(&dir);
    let base = || {
        let mut c = if unprivileged {
            leaderrun_unprivileged(&dir)
        } else {
            leaderrun()
        };
        c.args(["--store", &store, "--lease", "3s"]);
        c
    };
    let sh = |mut c: Command, name: &str, script: String| {
        c.args(["--name", name, "--", "sh", "-c", &script]);
        c
    };

    // 1. After the command exits.
    let mut a = spawn(
        sh(base(), "x", escaping(&dir, "exit 0")),
        &dir.file("x.log"),
    );
    let pids = escapees(&dir);
    assert_eq!(
        wait_exit(&mut a, 10 * SEC).code(),
        Some(0),
        "{}",
        read(&dir.file("x.log"))
    );
    for p in pids {
        assert!(!alive(p), "escaped descendant {p} outlived the command");
    }

    // 2. On loss: the lease is cleared under a running holder.
    for f in ["escaped.pid", "daemon.pid"] {
        let _ = std::fs::remove_file(dir.file(f));
    }
    let mut a = spawn(
        sh(base(), "y", escaping(&dir, "sleep 1000")),
        &dir.file("y.log"),
    );
    let pids = escapees(&dir);
    let mut rel = if unprivileged {
        leaderrun_unprivileged(&dir)
    } else {
        leaderrun()
    };
    rel.args(["release", "--name", "y", "--store", &store]);
    assert_eq!(run(rel).code, Some(0));
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(75));
    for p in pids {
        assert!(!alive(p), "escaped descendant {p} survived the loss");
    }

    // 3. On leaderrun's death (after one renewal, so that even without a
    // cgroup the watchdog has seen the escapees).
    for f in ["escaped.pid", "daemon.pid"] {
        let _ = std::fs::remove_file(dir.file(f));
    }
    let mut a = spawn(
        sh(base(), "z", escaping(&dir, "sleep 1000")),
        &dir.file("z.log"),
    );
    let pids = escapees(&dir);
    std::thread::sleep(1500 * MS);
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    for p in pids {
        wait_for(&format!("escaped descendant {p} to die"), 2 * SEC, || {
            !alive(p)
        });
    }
}

#[test]
fn escaping_descendants_are_stopped_with_a_cgroup_or_without() {
    // As root a cgroup of the command's own is used where cgroup v2 is
    // writable; as an unprivileged user, subreaper and the watchdog's look.
    escapees_are_stopped(false);
    if nix::unistd::geteuid().is_root() {
        escapees_are_stopped(true);
    }
}

#[test]
fn a_closed_stderr_or_stdout_never_crashes_anything() {
    let dir = TempDir::new("wd-epipe");
    let store = embedded(&dir);
    // The reader of stderr is gone before leaderrun writes a line.
    let (r, w) = nix::unistd::pipe().expect("pipe");
    drop(r);
    let mut c = lr(&store, "p", &["-vv", "--lease", "1s"], "sleep 1.2; exit 3");
    c.stderr(std::fs::File::from(w));
    let st = c.status().expect("run");
    assert_eq!(st.code(), Some(3), "the command's status must pass through");
    let r = run(lr(&store, "p", &[], "exit 0"));
    assert_eq!(r.code, Some(0), "the lease was not released: {}", r.stderr);
    // `leaderrun status | head -0`: stdout closed.
    let (r, w) = nix::unistd::pipe().expect("pipe");
    drop(r);
    let mut c = leaderrun();
    c.args(["status", "--store", &store])
        .stdout(std::fs::File::from(w));
    assert_eq!(c.status().expect("status").code(), Some(0));
}

#[test]
fn a_short_lease_rides_out_a_database_restart() {
    let mut pg = Pg::start();
    let dir = TempDir::new("wd-blip");
    let mut a = spawn(
        lr(
            &pg.url(),
            "blip",
            &["--lease", "3s", "-vv"],
            &worker(&dir, "a"),
        ),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    wait_for("a renewal", 5 * SEC, || {
        read(&dir.file("a.log")).contains("renewed")
    });
    // Right after a renewal (R = 1 s, G = 2 s): a crash and restart.
    let t0 = Instant::now();
    pg.crash();
    pg.boot();
    let down = t0.elapsed();
    wait_for("a renewal after the restart", 5 * SEC, || {
        read(&dir.file("a.log")).contains("renewed again after")
    });
    assert!(
        a.try_wait().expect("try_wait").is_none(),
        "leaderrun gave up after a {down:?} outage: {}",
        read(&dir.file("a.log"))
    );
    assert!(alive(pid_in(&dir.file("a.pid"))));
    signal(a.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut a, 5 * SEC).code(), Some(143));
}

#[test]
fn hostile_numbers_are_refused_in_one_line() {
    let dir = TempDir::new("wd-hostile");
    let store = embedded(&dir);
    for args in [
        &["--wait", "--timeout", "18446744073709551615s"][..],
        &["--min-hold", "1000000000y"],
        &["--lease", "99999999999999999999999s"],
        &["--retry", "1000000000y"],
        &["--renew", "1950ms", "--lease", "3s"],
        &["--conflict-exit-code", "256"],
        &["--conflict-exit-code", "-1"],
    ] {
        let r = run(lr(
            &store,
            "h",
            args,
            &format!("touch {}", dir.file("ran").display()),
        ));
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(!dir.file("ran").exists(), "{args:?} started the command");
    }
}

#[test]
fn the_store_url_is_in_no_argv_and_not_in_the_commands_environment() {
    let pg = Pg::start();
    let dir = TempDir::new("wd-secret");
    let script = format!(
        "env > {e}; cat /proc/$PPID/cmdline > /dev/null; {w}",
        e = dir.file("env").display(),
        w = worker(&dir, "a")
    );
    let mut a = spawn(lr(&pg.url(), "sec", &[], &script), &dir.file("a.log"));
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let w = watchdog_of(a.id()).expect("watchdog");
    let argv = std::fs::read(format!("/proc/{w}/cmdline")).expect("cmdline");
    assert!(
        !String::from_utf8_lossy(&argv).contains(crate::support::pg::PASSWORD),
        "the watchdog's argv shows the password"
    );
    let wenv = std::fs::read(format!("/proc/{w}/environ")).expect("environ");
    assert!(!String::from_utf8_lossy(&wenv).contains(crate::support::pg::PASSWORD));
    assert!(!read(&dir.file("env")).contains(crate::support::pg::PASSWORD));
    signal(a.id(), Signal::SIGTERM);
    wait_exit(&mut a, 5 * SEC);
}

/// As pid 1 of a pid namespace (a container's entry point) leaderrun is the
/// reaper of everything there, its detached watchdog included: the sweep
/// after the command exits must not take the watchdog for something the
/// command left behind (it would TERM it, wait `K`, and KILL it).
#[test]
fn as_init_of_a_pid_namespace_the_watchdog_is_not_swept() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: unshare --pid --mount-proc needs root");
        return;
    }
    let dir = TempDir::new("wd-pidns");
    let store = embedded(&dir);
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_leaderrun"))
        .args(["--store", &store, "--name", "ns"])
        .args(L2)
        .args(["--", "sh", "-c", "test $PPID = 1"])
        .stdin(Stdio::null());
    let out = run(c);
    assert_eq!(out.code, Some(0), "not pid 1, or failed: {}", out.stderr);
    assert!(
        !out.stderr.contains("left processes behind"),
        "the watchdog was swept as a leftover: {}",
        out.stderr
    );
}

/// The cgroup v2 mount, where this test process could create a cgroup below
/// its own, as leaderrun will (root, a writable hierarchy).
fn writable_cgroup2() -> Option<String> {
    let (mount, ours) = cgroup2_and_own()?;
    let probe = format!("{mount}{ours}/leaderrun-test-probe-{}", std::process::id());
    let ok = std::fs::create_dir(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    ok.then_some(mount)
}

/// Run `cat /proc/self/cgroup` under leaderrun (`c`), and check that the
/// command was in a cgroup of its own, removed after the run.
fn command_had_its_own_cgroup(mount: &str, c: Command) {
    let out = run(c);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let own = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 line in {}", out.stdout));
    let leaf = own.rsplit('/').next().unwrap_or("");
    assert!(
        leaf.starts_with("leaderrun-"),
        "the command ran in {own}, not a cgroup of its own"
    );
    let path = format!("{mount}{own}");
    assert!(
        !std::path::Path::new(&path).exists(),
        "{path} was left behind"
    );
}

/// As root, with cgroup v2 writable, the command runs in a cgroup of its
/// own from its first instant (it is created there, not moved after it
/// could have started anything), and the cgroup is gone after the run.
#[test]
fn the_command_starts_inside_its_own_cgroup() {
    let Some(mount) = writable_cgroup2() else {
        eprintln!("skipped: needs a writable cgroup v2 hierarchy (root)");
        return;
    };
    let dir = TempDir::new("wd-cgroup");
    let store = embedded(&dir);
    command_had_its_own_cgroup(&mount, lr(&store, "cg", &[], "cat /proc/self/cgroup"));
}

/// Where clone3 is refused (a kernel before 5.7, or a container whose
/// seccomp profile answers ENOSYS, as Docker's did), the command is forked
/// and moves itself into its cgroup before exec: same result. Here a
/// seccomp filter makes clone3 fail with ENOSYS for leaderrun and all it
/// starts.
#[cfg(target_arch = "x86_64")]
#[test]
fn without_clone3_the_command_still_starts_in_its_cgroup() {
    let Some(mount) = writable_cgroup2() else {
        eprintln!("skipped: needs a writable cgroup v2 hierarchy (root)");
        return;
    };
    let dir = TempDir::new("wd-noclone3");
    let store = embedded(&dir);
    let mut c = lr(&store, "cg", &[], "cat /proc/self/cgroup");
    // SAFETY: between fork and exec only prctl is called, on a filter
    // that lives on this stack frame until the call returns.
    unsafe {
        c.pre_exec(|| {
            use nix::libc;
            const LD_ABS_W: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
            const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
            const RET_K: u16 = 0x06; // BPF_RET | BPF_K
            const ALLOW: u32 = 0x7fff_0000;
            const ERRNO: u32 = 0x0005_0000;
            const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
            let f = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
            let mut prog = [
                f(LD_ABS_W, 0, 0, 4), // seccomp_data.arch
                f(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
                f(RET_K, 0, 0, ALLOW),
                f(LD_ABS_W, 0, 0, 0), // seccomp_data.nr
                f(JEQ_K, 0, 1, libc::SYS_clone3 as u32),
                f(RET_K, 0, 0, ERRNO | libc::ENOSYS as u32),
                f(RET_K, 0, 0, ALLOW),
            ];
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_mut_ptr(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, 2, &fprog as *const _) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command_had_its_own_cgroup(&mount, c);
}

/// A leaderrun killed together with its watchdog leaves its command's
/// cgroup behind, empty, with nobody left to remove it. The next leaderrun
/// that makes a cgroup beside it removes it, once it is old enough that no
/// live leaderrun can be about to start a command in it; a fresh one stays.
#[test]
fn a_cgroup_left_by_a_leaderrun_killed_with_its_watchdog_is_removed_later() {
    let Some(mount) = writable_cgroup2() else {
        eprintln!("skipped: needs a writable cgroup v2 hierarchy (root)");
        return;
    };
    let dir = TempDir::new("wd-stale-cg");
    let store = embedded(&dir);
    let mut a = spawn(
        lr(&store, "st", &[], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let child = pid_in(&dir.file("a.pid"));
    let w = wait_until_some("the watchdog", 5 * SEC, || watchdog_of(a.id()));
    signal(a.id(), Signal::SIGSTOP);
    signal(w as u32, Signal::SIGKILL);
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    wait_for("the command to die with leaderrun", 2 * SEC, || {
        !alive(child)
    });
    let left = cgroup_left_by(a.id()).expect("the killed leaderrun's cgroup is left behind");
    assert!(left.starts_with(&mount));
    // The worker's last `sleep 0.02` ends by itself: then it is empty.
    wait_for("the left cgroup to empty", 2 * SEC, || {
        read(&left.join("cgroup.events")).contains("populated 0")
    });
    // An hour old, as it would be by the next run of a cron job.
    let st = Command::new("touch")
        .args(["-d", "1 hour ago"])
        .arg(&left)
        .status()
        .expect("touch");
    assert!(st.success());
    // A fresh one, of a pid that runs nothing either: it stays.
    let mut gone = Command::new("true").spawn().expect("true");
    let _ = gone.wait();
    let fresh = left.with_file_name(format!("leaderrun-{}-00000000000000ff", gone.id()));
    std::fs::create_dir(&fresh).expect("a fresh cgroup");
    let out = run(lr(&store, "st2", &[], "exit 0"));
    let (stale_stayed, fresh_stayed) = (left.exists(), fresh.exists());
    let _ = std::fs::remove_dir(&fresh);
    let _ = std::fs::remove_dir(&left);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(!stale_stayed, "the stale cgroup {} stayed", left.display());
    assert!(fresh_stayed, "a cgroup made a moment ago was removed");
}

/// The watchdog says `ready` only once it holds orders it can read. Given a
/// line it cannot take (not orders of this version), it says nothing and
/// exits 2: leaderrun, which waits for `ready` before it starts the
/// command, then starts none (`stops::` checks that side, with a watchdog
/// that dies unconfirmed). Given good orders, it says `ready`.
#[test]
fn a_watchdog_that_cannot_take_its_orders_never_says_ready() {
    use leaderrun::clock::Stamp;
    use leaderrun::watchdog::orders::{Orders, Start};
    let dir = TempDir::new("wd-orders");
    let orders = Orders {
        store: None,
        origin: leaderrun::store::Origin::Flag,
        name: "orders".into(),
        holder: "h".into(),
        epoch: 1,
        timing: leaderrun::timing::Timing::resolve(Default::default()).expect("defaults"),
        min_hold: None,
        // Sent at boot: the lease is long expired, so the watchdog, whose
        // pipe then closes with nothing started, has nothing to hand back.
        acquired_at: Stamp::ORIGIN,
        sent: Stamp::ORIGIN,
        verbose: 0,
        quiet: true,
        json: false,
    };
    let good = Start::new(orders, vec![]).encode().expect("encodes");
    let other_version = good.replacen("\"watchdog\":1", "\"watchdog\":2", 1);
    assert_ne!(good, other_version);
    let cases: [(&str, &str, Option<i32>); 5] = [
        (&good, "ready\n", Some(0)),
        (&other_version, "", Some(2)),
        ("leaderrun-watchdog 1\nstore -\nend\n", "", Some(2)),
        ("{\"watchdog\":1}\n", "", Some(2)),
        ("", "", Some(2)),
    ];
    for (input, said, code) in cases {
        let (token, token_w) = nix::unistd::pipe().expect("pipe");
        let token_fd = token.as_raw_fd();
        let mut c = Command::new(env!("CARGO_BIN_EXE_leaderrun"));
        c.args(["--be-watchdog", &std::process::id().to_string(), "-"])
            .env("LEADERRUN_STATE_DIR", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: dup2 is async-signal-safe; fd 4 is the token's place.
        unsafe {
            c.pre_exec(move || {
                nix::unistd::dup2(token_fd, 4)?;
                Ok(())
            });
        }
        let mut w = c.spawn().expect("the watchdog");
        {
            use std::io::Write;
            let mut stdin = w.stdin.take().expect("stdin");
            stdin.write_all(input.as_bytes()).expect("orders");
        }
        let out = w.wait_with_output().expect("exit");
        drop((token, token_w));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            said,
            "{input:?}: {stderr}"
        );
        assert_eq!(out.status.code(), code, "{input:?}: {stderr}");
    }
}
