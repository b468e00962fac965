//! Test support: throwaway servers, a fault proxy, and helpers to run the
//! real `leaderrun` binary. Each test gets its own server; nothing here talks
//! to the machine's shared services.

pub mod chaos_child;
pub mod chaos_store;
pub mod checker;
pub mod etcd;
pub mod mysql;
pub mod pg;
pub mod pgbouncer;
pub mod proxy;
pub mod pty;
pub mod redis;
pub mod stores;
pub mod zookeeper;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use pg::Pg;
pub use proxy::Proxy;

/// A temporary directory, removed when dropped. Readable by everyone
/// (0755, as a directory made under the usual umask): the servers the
/// harness starts as another user read their files from it.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::Builder::new()
            .prefix(&format!("leaderrun-test-{tag}-"))
            .tempdir()
            .expect("create temp dir");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod temp dir");
        TempDir(d)
    }
    pub fn path(&self) -> &Path {
        self.0.path()
    }
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// A child script that records its epoch (`TAG.epoch`), then its pid
/// (`TAG.pid`, atomically: the pid file's appearance is the event tests wait
/// for), then works forever.
pub fn worker(dir: &TempDir, tag: &str) -> String {
    format!(
        "echo $LEASE_EPOCH > {e}; echo $$ > {p}.tmp && mv {p}.tmp {p}; while :; do sleep 0.02; done",
        p = dir.file(&format!("{tag}.pid")).display(),
        e = dir.file(&format!("{tag}.epoch")).display(),
    )
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The variables through which the machine's own settings could reach a
/// test's leaderrun, removed from `c`.
pub fn clean_env(c: &mut Command) {
    for v in [
        "LEADERRUN_NAME",
        "LEADERRUN_STORE",
        "DATABASE_URL",
        "LEADERRUN_STATE_DIR",
    ] {
        c.env_remove(v);
    }
}

/// `leaderrun` with an environment that cannot leak in from the machine.
pub fn leaderrun() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leaderrun"));
    clean_env(&mut c);
    c.stdin(Stdio::null());
    c
}

/// `leaderrun --store URL --name NAME <extra> -- sh -c SCRIPT`.
pub fn lr(url: &str, name: &str, extra: &[&str], script: &str) -> Command {
    let mut c = leaderrun();
    c.args(["--store", url, "--name", name])
        .args(extra)
        .args(["--", "sh", "-c", script]);
    c
}

pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(mut c: Command) -> Output {
    let out = c.output().expect("run leaderrun");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Start in the background, in a process group of its own (so a test can
/// freeze it as a whole), stderr captured to a file for diagnostics.
pub fn spawn(mut c: Command, log: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    let f = std::fs::File::create(log).expect("log file");
    c.stdout(f.try_clone().expect("log"))
        .stderr(f)
        .process_group(0);
    c.spawn().expect("spawn leaderrun")
}

/// Wait for `f` to return true, checking every 10 ms, failing after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        if f() {
            return t0.elapsed();
        }
        if t0.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn wait_file(path: &Path, limit: Duration) -> Duration {
    wait_for(&format!("{}", path.display()), limit, || path.exists())
}

pub fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            // Every leaderrun that exits by itself has removed the cgroup it
            // made for its command (nothing else ever would).
            if st.code().is_some() {
                if let Some(left) = cgroup_left_by(child.id()) {
                    panic!(
                        "leaderrun {} exited and left {} behind",
                        child.id(),
                        left.display()
                    );
                }
            }
            return st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("leaderrun did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

pub fn alive(pid: i32) -> bool {
    // A zombie still "exists"; look at its state instead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// The pid a shell wrote to `path`. `echo $! > f` creates the file before
/// it writes to it: a file that exists may still be empty for a moment.
pub fn pid_in(path: &Path) -> i32 {
    let mut pid = None;
    wait_for(
        &format!("a pid in {}", path.display()),
        Duration::from_secs(2),
        || {
            pid = read(path).trim().parse().ok();
            pid.is_some()
        },
    );
    pid.unwrap_or_else(|| panic!("no pid in {}", path.display()))
}

pub fn signal_group(pgid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid as i32), sig);
}

pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// Run as an unprivileged user when the tests run as root (root ignores file
/// permissions, and its default store path is system-wide). The binary is
/// copied into `dir` so the user can execute it wherever the checkout lives,
/// and `dir` is opened to that user.
pub fn leaderrun_unprivileged(dir: &TempDir) -> Command {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        let mut c = leaderrun();
        c.env_remove("XDG_STATE_HOME");
        return c;
    }
    let user = nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .expect("user nobody exists");
    let bin = dir.file("leaderrun");
    if !bin.exists() {
        std::fs::copy(env!("CARGO_BIN_EXE_leaderrun"), &bin).expect("copy binary");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod dir");
    }
    let mut c = Command::new(&bin);
    for v in [
        "LEADERRUN_NAME",
        "LEADERRUN_STORE",
        "DATABASE_URL",
        "LEADERRUN_STATE_DIR",
        "XDG_STATE_HOME",
    ] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null())
        .uid(user.uid.as_raw())
        .gid(user.gid.as_raw());
    c
}

/// The libfaketime preload library, from Debian's `faketime` package. A
/// test that preloads it sets `FAKETIME_DONT_FAKE_MONOTONIC=1` too:
/// leaderrun's deadlines read `CLOCK_BOOTTIME` by the raw system call,
/// which no preload sees, but the async runtime's timers (call time-outs)
/// read `CLOCK_MONOTONIC` through libc, and a faked one moves them.
pub fn libfaketime() -> PathBuf {
    for dir in [
        "/usr/lib/x86_64-linux-gnu/faketime",
        "/usr/lib/aarch64-linux-gnu/faketime",
        "/usr/lib/faketime",
    ] {
        let p = Path::new(dir).join("libfaketime.so.1");
        if p.exists() {
            return p;
        }
    }
    panic!("libfaketime.so.1 not found: install the Debian package `faketime`");
}

/// Polls all futures on this thread until every one is done (no executor
/// crate needed for a race between a handful of store calls).
pub async fn join_all<F: std::future::Future + Unpin>(mut futs: Vec<F>) -> Vec<F::Output> {
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match std::pin::Pin::new(&mut *f).poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("done")).collect()
}

/// Children of `ppid` that lead a process group of their own (a command
/// leaderrun started), from /proc.
pub fn child_groups(ppid: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let f: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            f.len() > 2
                && f[1].parse::<u32>().ok() == Some(ppid)
                && f[2].parse::<i32>().ok() == Some(*pid)
        })
        .collect()
}

/// The watchdog process of the leaderrun with pid `lr`, found by its argv.
pub fn watchdog_of(lr: u32) -> Option<i32> {
    // Found by the pid leaderrun passes it (`--be-watchdog PID`), whoever
    // its parent is (leaderrun adopts it as subreaper; init, once
    // leaderrun is gone).
    let want = lr.to_string();
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                    args.get(1) == Some(&&b"--be-watchdog"[..])
                        && args.get(2) == Some(&want.as_bytes())
                })
                .unwrap_or(false)
        })
}

/// `kill -9` of a leaderrun *and* its watchdog: a holder gone without a
/// trace, whose lease only expiry frees. With both gone nothing can remove
/// the cgroup leaderrun made for its command: the test does, as an
/// operator would, once the command (killed with leaderrun) has left it.
pub fn kill_holder_and_watchdog(lr: &mut Child) {
    let w = wait_until_some("the watchdog", Duration::from_secs(5), || {
        watchdog_of(lr.id())
    });
    // Stopped first, so that leaderrun cannot replace its watchdog in the
    // instant between the two kills.
    signal(lr.id(), nix::sys::signal::Signal::SIGSTOP);
    signal(w as u32, nix::sys::signal::Signal::SIGKILL);
    signal(lr.id(), nix::sys::signal::Signal::SIGKILL);
    let _ = lr.wait();
    if let Some(cg) = cgroup_left_by(lr.id()) {
        let t0 = Instant::now();
        while std::fs::remove_dir(&cg).is_err() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The cgroup v2 mount point and this test process's own cgroup below it
/// (`/a/b`, no trailing slash; empty at the root), which leaderrun inherits.
pub fn cgroup2_and_own() -> Option<(String, String)> {
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4).map(str::to_string))?;
    let ours = std::fs::read_to_string("/proc/self/cgroup")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))?;
    Some((mount, ours.trim().trim_end_matches('/').to_string()))
}

/// The cgroup v2 directory the leaderrun with pid `lr` made for its command
/// (below this test process's own cgroup, which leaderrun inherited), if it
/// is still there.
pub fn cgroup_left_by(lr: u32) -> Option<PathBuf> {
    let (mount, ours) = cgroup2_and_own()?;
    let parent = PathBuf::from(format!("{mount}{ours}"));
    // `leaderrun-PID-NONCE`: the nonce makes every run's name its own.
    let prefix = format!("leaderrun-{lr}-");
    std::fs::read_dir(&parent)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
}

pub fn wait_until_some<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let mut out = None;
    wait_for(what, limit, || {
        out = f();
        out.is_some()
    });
    out.expect("checked")
}

/// Start a throwaway server: in a process group of its own (so that it can
/// be frozen or killed as a whole), sent `death` when the test process
/// dies, then polled every `every` until `ready` or `limit`. None, with the
/// server killed and reaped, when it exited first (its port taken, most
/// likely: the caller tries another) or never became ready.
pub fn start_server(
    cmd: &mut Command,
    what: &str,
    death: nix::sys::signal::Signal,
    limit: Duration,
    every: Duration,
    mut ready: impl FnMut() -> bool,
) -> Option<Child> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    // SAFETY: prctl only; the server must not outlive a killed test.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(death)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {what}: {e}"));
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if ready() {
            return Some(child);
        }
        std::thread::sleep(every);
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// SIGSTOP (`frozen`) or SIGCONT a server a test started: its process, or
/// with `group` its whole process group (a server that forks helpers).
pub fn freeze_server(server: Option<&Child>, frozen: bool, group: bool) {
    use nix::sys::signal::{kill, killpg, Signal};
    let Some(c) = server else { return };
    let sig = if frozen {
        Signal::SIGSTOP
    } else {
        Signal::SIGCONT
    };
    let pid = nix::unistd::Pid::from_raw(c.id() as i32);
    let _ = if group {
        killpg(pid, sig)
    } else {
        kill(pid, sig)
    };
}

/// Kill a server a test started at once (thawed first, so the kill is not
/// held up by a stop), and reap it.
pub fn kill_server(server: &mut Option<Child>, group: bool) {
    freeze_server(server.as_ref(), false, group);
    if let Some(mut c) = server.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// In `dir`: a CA (`ca.crt`) and a server certificate it signs (`server.crt`,
/// `server.key`) for localhost and 127.0.0.1, for the TLS tests of every
/// server (rustls refuses a self-signed certificate used directly as the
/// server's). Needs the Debian package `openssl`.
pub fn make_certs(dir: &Path) {
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("ext");
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=leaderrun test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext",
            "-out",
            "server.crt",
        ],
    ];
    for args in steps {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (Debian package `openssl`) is needed for the TLS test");
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

/// Whether pids can be forced here (root in the initial pid namespace);
/// prints why not.
pub fn can_force_pids() -> bool {
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .open(NS_LAST_PID)
        .is_ok();
    if !ok {
        eprintln!(
            "skipped: {NS_LAST_PID} is not writable (needs root in the initial pid namespace)"
        );
    }
    ok
}

pub fn pid_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Start a process that gets pid `want`, once `want` is free: the next pid
/// after `want - 1` is handed out, unless another process on the machine
/// forks in between, so this tries again. None when it never got it.
pub fn with_pid(want: i32, mut start: impl FnMut() -> Child) -> Option<Child> {
    wait_for(
        &format!("pid {want} to be free"),
        Duration::from_secs(5),
        || !pid_exists(want),
    );
    for _ in 0..200 {
        if pid_exists(want) {
            return None; // someone else took it
        }
        std::fs::write(NS_LAST_PID, (want - 1).to_string()).expect("write ns_last_pid");
        let mut c = start();
        if c.id() as i32 == want {
            return Some(c);
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    None
}

/// A command that writes its pid to `cmd.pid`, waits for a file `go`, then
/// leaves a descendant in a session of its own (`sleep 1000`, its pid in
/// `esc.pid`) and runs on: what only a look at the tree, or a cgroup, finds.
pub fn escapes_on_go(dir: &TempDir) -> String {
    format!(
        "echo $$ > {c}; while [ ! -e {go} ]; do sleep 0.01; done; \
         setsid sh -c 'echo $$ > {e}.tmp && mv {e}.tmp {e}; exec sleep 1000' & \
         while :; do sleep 0.05; done",
        c = dir.file("cmd.pid").display(),
        go = dir.file("go").display(),
        e = dir.file("esc.pid").display(),
    )
}

/// `leaderrun --store URL watch --json --name NAME --retry 200ms`, its
/// stderr in `DIR/w.log`, and its lines, parsed, as they come.
pub fn watch_json(
    url: &str,
    name: &str,
    dir: &TempDir,
) -> (Child, std::sync::mpsc::Receiver<serde_json::Value>) {
    use std::io::{BufRead, BufReader};
    let mut w = leaderrun();
    w.args(["--store", url, "watch", "--json", "--name", name])
        .args(["--retry", "200ms"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.file("w.log")).expect("log"));
    let mut watch = w.spawn().expect("spawn watch");
    let (tx, lines) = std::sync::mpsc::channel();
    let out = watch.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let v = serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    (watch, lines)
}
