//! Everything the command started, and how to stop all of it (docs/contract.md §11).
//!
//! A process group is not enough: a descendant can leave it (`setsid`, a
//! daemon's double fork) and would then outlive the lease. Three mechanisms,
//! used together where the system offers them:
//!
//! * **cgroup v2, where writable** (root, or a systemd unit with
//!   `Delegate=yes`): the command is started inside a cgroup of its own,
//!   which no unprivileged descendant can leave. Stopping is `cgroup.kill`
//!   (or signalling every member), and "all gone" is `populated 0` in
//!   `cgroup.events`. This covers everything, including leaderrun's death:
//!   the watchdog kills the cgroup without needing leaderrun.
//! * **child subreaper** (always): leaderrun marks itself with
//!   `PR_SET_CHILD_SUBREAPER`, so an orphaned descendant is re-parented to
//!   leaderrun instead of init and stays findable as a descendant in
//!   `/proc`. While leaderrun lives (on loss, after the command exits) every
//!   descendant is signalled, whatever its group.
//! * **the process group** (always): the command leads a group of its own,
//!   signalled as a whole with `killpg`.
//!
//! Without a writable cgroup one gap remains, and only when leaderrun itself
//! dies: its re-parented descendants pass to init at that moment. The
//! watchdog then kills the group and the descendants it saw in its last look
//! at `/proc` (taken whenever leaderrun renews), checked by start time so a
//! recycled pid is never hit. A descendant that left the group after that
//! look escapes.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// One line of `/proc/PID/stat`, the fields used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    pub zombie: bool,
    /// Start time in clock ticks since boot: with the pid, names a process
    /// uniquely (pids are recycled, this pair is not).
    pub start: u64,
}

fn parse_stat(pid: i32, stat: &str) -> Option<Proc> {
    // "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
    // majflt cmajflt utime stime cutime cstime priority nice threads
    // itrealvalue starttime ...": comm may hold spaces and parentheses, so
    // the fields are counted from the last ')'.
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Proc {
        pid,
        zombie: *f.first()? == "Z",
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

pub fn proc_entry(pid: i32) -> Option<Proc> {
    use std::io::Read;
    // procfs files report a size of 0, so `read_to_string` starts with a
    // 32-byte buffer and doubles it: six reads per file, for every process
    // on the host at every look. A buffer that fits any `stat` line (about
    // 300 bytes; `comm` is at most 64) takes it in one read: the line is
    // complete once it ends with its newline.
    let mut buf = [0u8; 1024];
    let mut f = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut len = 0;
    while len < buf.len() && !(len > 0 && buf[len - 1] == b'\n') {
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    // Lossy: a `comm` that is not UTF-8 (any program may set its own) must
    // not hide the process; the fields used come after it and are ASCII.
    parse_stat(pid, &String::from_utf8_lossy(&buf[..len]))
}

/// A procfs or cgroupfs file, whole. These report a size of 0, so
/// `read_to_string` probes with 32 bytes and doubles: eight reads for
/// mountinfo. A page-sized buffer takes most in one.
fn read_small(path: impl AsRef<Path>) -> Option<String> {
    use std::io::Read;
    let mut s = String::with_capacity(4096);
    std::fs::File::open(path)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

/// Every process this process may see.
pub fn proc_table() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_entry)
        .collect()
}

/// The live (non-zombie) descendants of `root`, not counting `root` itself,
/// `skip` or anything below `skip`.
pub fn descendants(root: i32, skip: Option<i32>) -> Vec<Proc> {
    let table = proc_table();
    let mut children: HashMap<i32, Vec<&Proc>> = HashMap::new();
    for p in &table {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        for c in children.get(&pid).into_iter().flatten() {
            if Some(c.pid) == skip || c.pid == root {
                continue;
            }
            todo.push(c.pid);
            if !c.zombie {
                out.push(**c);
            }
        }
    }
    out
}

/// Whether any process of group `pgid` is still running. Zombies do not
/// count: an orphan's zombie waits for its reaper and runs nothing, but it
/// still answers `kill(-pgid, 0)`.
pub fn group_alive(pgid: Pid) -> bool {
    if killpg(pgid, None).is_err() {
        return false;
    }
    proc_table()
        .iter()
        .any(|p| p.pgrp == pgid.as_raw() && !p.zombie)
}

/// A cgroup v2 directory leaderrun created for one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    dir: PathBuf,
}

/// The cgroup v2 mount point, when this process sees one whose root is the
/// hierarchy's root (so `/proc/self/cgroup` paths are relative to it).
fn cgroup2_mount() -> Option<PathBuf> {
    let info = read_small("/proc/self/mountinfo")?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        if f.get(3)? != &"/" {
            return None;
        }
        Some(PathBuf::from(f.get(4)?))
    })
}

impl Cgroup {
    /// Create a cgroup for the command below leaderrun's own. `None` where
    /// there is no cgroup v2 or it is not writable (an unprivileged user
    /// outside a delegated unit): the other mechanisms still apply.
    pub fn create(tag: &str) -> Option<Cgroup> {
        let mount = cgroup2_mount()?;
        let own = read_small("/proc/self/cgroup")?;
        let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = mount.join(rel.trim_start_matches('/')).join(tag);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Left by an earlier process with this pid: reuse it only
                // when empty.
                let cg = Cgroup { dir: dir.clone() };
                if cg.populated() {
                    return None;
                }
            }
            Err(_) => return None,
        }
        Some(Cgroup { dir })
    }

    pub fn from_path(dir: PathBuf) -> Cgroup {
        Cgroup { dir }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs`, opened for the child to write `0` into between fork
    /// and exec, which moves the child before it can start anything (where
    /// clone3 cannot start it there: fork.rs).
    pub fn procs_for_join(&self) -> Option<OwnedFd> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"));
        f.ok().map(OwnedFd::from)
    }

    /// The directory, opened for `clone3(CLONE_INTO_CGROUP)` (fork.rs).
    pub fn dir_fd(&self) -> Option<OwnedFd> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECTORY)
            .open(&self.dir);
        f.ok().map(OwnedFd::from)
    }

    /// Whether `pid` is in this cgroup (the move between fork and exec is
    /// checked, not assumed).
    pub fn contains(&self, pid: Pid) -> bool {
        let want = self.dir.file_name();
        read_small(format!("/proc/{pid}/cgroup"))
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .map(|p| Path::new(p.trim()).file_name() == want)
            })
            .unwrap_or(false)
    }

    /// Any process (not zombie) still in the cgroup.
    pub fn populated(&self) -> bool {
        read_small(self.dir.join("cgroup.events"))
            .is_some_and(|ev| ev.lines().any(|l| l.trim() == "populated 1"))
    }

    fn members(&self) -> Vec<Pid> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .map(Pid::from_raw)
            .collect()
    }

    pub fn signal(&self, sig: Signal) {
        if sig == Signal::SIGKILL && std::fs::write(self.dir.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for pid in self.members() {
            let _ = kill(pid, sig);
        }
    }

    /// Remove the directory; only an empty cgroup can go, so a failure just
    /// leaves it for the next run with this pid to reuse.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// What to stop: the command's group, its cgroup if any, and (while
/// leaderrun lives) every descendant of `root` but `skip` (the watchdog).
#[derive(Debug, Clone)]
pub struct Tree {
    /// The command's process group (unknown only when leaderrun died
    /// between fork and telling the watchdog the pid).
    pub pgid: Option<Pid>,
    pub cgroup: Option<Cgroup>,
    pub root: Option<i32>,
    pub skip: Option<i32>,
}

impl Tree {
    /// Send `sig` to everything; a stopped process is continued after it,
    /// so a TERM is acted on at once and never waits for a SIGCONT that may
    /// never come.
    pub fn signal(&self, sig: Signal) {
        self.signal_only(sig);
        if sig != Signal::SIGKILL {
            self.signal_only(Signal::SIGCONT);
        }
    }

    fn signal_only(&self, sig: Signal) {
        if let Some(pgid) = self.pgid {
            match killpg(pgid, sig) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => tracing::warn!(
                    event = "signal_failed",
                    "cannot send {sig} to process group {pgid}: {e}"
                ),
            }
        }
        if let Some(cg) = &self.cgroup {
            cg.signal(sig);
        }
        if let Some(root) = self.root {
            for p in descendants(root, self.skip) {
                let _ = kill(Pid::from_raw(p.pid), sig);
            }
        }
    }

    /// Whether anything that must be stopped still runs.
    pub fn alive(&self) -> bool {
        if self.cgroup.as_ref().is_some_and(Cgroup::populated) || self.pgid.is_some_and(group_alive)
        {
            return true;
        }
        self.root.is_some_and(|root| {
            // leaderrun's own tree: with no child at all (the watchdog is
            // started detached, fork.rs) it has no descendant either, and
            // /proc, which may list thousands of processes, need not be
            // read. (As init of a pid namespace leaderrun adopts its
            // watchdog all the same: then it is `skip`.)
            if root == std::process::id() as i32 && !has_children() {
                return false;
            }
            !descendants(root, self.skip).is_empty()
        })
    }
}

/// Whether this process has any child, running, stopped or not yet reaped.
fn has_children() -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    let look = WaitPidFlag::WEXITED
        | WaitPidFlag::WSTOPPED
        | WaitPidFlag::WCONTINUED
        | WaitPidFlag::WNOHANG
        | WaitPidFlag::WNOWAIT;
    !matches!(waitid(Id::All, look), Err(Errno::ECHILD))
}

/// Make this process the reaper of its orphaned descendants (see the
/// module docs). Best effort: an error leaves the other mechanisms.
pub fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!("PR_SET_CHILD_SUBREAPER failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 96 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        let p = parse_stat(4242, line).unwrap();
        assert_eq!(
            p,
            Proc {
                pid: 4242,
                ppid: 1,
                pgrp: 4242,
                zombie: false,
                start: 987654
            }
        );
        let z = "7 (x) Z 3 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0 0";
        assert!(parse_stat(7, z).unwrap().zombie);
        assert_eq!(parse_stat(7, "garbage"), None);
    }

    #[test]
    fn descendants_follow_parents_and_skip_a_branch() {
        // this test process's own children: none it did not start
        let me = std::process::id() as i32;
        let mut c = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let d = descendants(me, None);
        assert!(d.iter().any(|p| p.pid == c.id() as i32), "{d:?}");
        assert!(descendants(me, Some(c.id() as i32))
            .iter()
            .all(|p| p.pid != c.id() as i32));
        let _ = c.kill();
        let _ = c.wait();
    }

    /// A program's name (`comm`) need not be UTF-8; such a process must
    /// still be found, or it would escape every sweep.
    #[test]
    fn a_process_whose_name_is_not_utf8_is_found() {
        use std::os::unix::ffi::OsStrExt;
        let dir = std::env::temp_dir().join(format!("leaderrun-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join(std::ffi::OsStr::from_bytes(b"sl\xff\xfeep"));
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap();
        std::os::unix::fs::symlink(sleep, &link).unwrap();
        let mut c = std::process::Command::new(&link).arg("5").spawn().unwrap();
        let pid = c.id() as i32;
        let seen = (0..200).any(|_| {
            let raw = std::fs::read(format!("/proc/{pid}/stat")).unwrap_or_default();
            if !raw.windows(2).any(|w| w == b"\xff\xfe") {
                std::thread::sleep(std::time::Duration::from_millis(5));
                return false; // not exec'd yet
            }
            descendants(std::process::id() as i32, None)
                .iter()
                .any(|p| p.pid == pid)
        });
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            seen,
            "pid {pid} with a non-UTF-8 name not among the descendants"
        );
    }
}
