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
//!   signalled as a whole through its leader's pidfd.
//!
//! Every process is signalled through a pidfd, never by a number that may
//! have been handed to a stranger since (see "Processes held by pidfd"
//! below). A stop sends each process one SIGTERM, however many of the three
//! mechanisms find it, and only the side (leaderrun or its watchdog) that
//! holds the SIGTERM token sends any ([`TermToken`]).
//!
//! Without a writable cgroup one gap remains, and only when leaderrun itself
//! dies: its re-parented descendants pass to init at that moment. The
//! watchdog then kills the group and the descendants it saw in its last good
//! look at `/proc` (taken whenever leaderrun renews, and only while
//! leaderrun's pidfd says it runs), held by pidfd since. A descendant that
//! left the group after that look escapes.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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

/// Remove what a leaderrun killed together with its watchdog left behind
/// (nothing else can): an empty `leaderrun-PID-…` beside the one about to
/// be made, whose PID names no process here and that was made over a
/// minute ago. The age is what makes this safe for a live leaderrun whose
/// pid means something else here (another pid namespace under the same
/// cgroup): its cgroup is empty and in use only between its creation and
/// its command's start, moments; later it holds the command (removal
/// fails, EBUSY) or is about to be removed by its owner anyway.
fn remove_stale(parent: &Path, mine: &str) {
    const AGE: std::time::Duration = std::time::Duration::from_secs(60);
    let Ok(dir) = std::fs::read_dir(parent) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| *n != mine)
            .and_then(|n| n.strip_prefix("leaderrun-"))
            .map(|rest| rest.split('-').next().unwrap_or(rest))
            .and_then(|p| p.parse::<i32>().ok())
            .filter(|p| *p > 0)
        else {
            continue;
        };
        // Pid 1 is always there, so it says nothing: a leaderrun that ran
        // as PID 1 of a pid namespace (`unshare -fp`, a container's entry
        // point) and was killed left its cgroup named `leaderrun-1-…`, and
        // its namespace, watchdog included, died with it. The age rule
        // below is what keeps a live one's cgroup.
        if pid != 1 && kill(Pid::from_raw(pid), None) != Err(Errno::ESRCH) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > AGE);
        if old {
            // Only an empty cgroup can be removed: a populated one stays.
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// 64 bits from the kernel's random pool; the boot clock where it cannot
/// be read (then still unique among this pid's runs).
fn nonce() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { nix::libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        u64::from_ne_bytes(b)
    } else {
        crate::clock::boottime_now().since_origin().as_nanos() as u64
    }
}

impl Cgroup {
    /// Where the command's cgroup will be, below leaderrun's own, under a
    /// name no other run uses: `leaderrun-PID-NONCE`. Never reused: a
    /// watchdog that acts late (it was frozen, its leaderrun long dead)
    /// names only the cgroup of its own run, even when a later leaderrun
    /// got the same pid (a name made of the pid alone would then be that
    /// run's). Nothing is created yet: the watchdog is told this path
    /// first (run/mod.rs), so that a leaderrun killed right after the
    /// `mkdir` leaves nothing that no one would remove. `None` where there
    /// is no cgroup v2 to use.
    pub fn plan() -> Option<Cgroup> {
        let mount = cgroup2_mount()?;
        let own = read_small("/proc/self/cgroup")?;
        let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        let parent = mount.join(rel.trim_start_matches('/'));
        let tag = format!("leaderrun-{}-{:016x}", std::process::id(), nonce());
        remove_stale(&parent, &tag);
        Some(Cgroup {
            dir: parent.join(tag),
        })
    }

    /// Make the planned directory. False where cgroup v2 is not writable
    /// here (an unprivileged user outside a delegated unit): the other
    /// mechanisms still apply. A directory that already exists is not
    /// ours (the name is never reused), so it is not taken.
    pub fn make(&self) -> bool {
        std::fs::create_dir(&self.dir).is_ok()
    }

    /// Whether the directory exists (a planned one may never have been
    /// made, or be gone).
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
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

    /// The members, each held by pidfd and proven a member after the open
    /// (a pid read from `cgroup.procs` may have been recycled since).
    fn held_members(&self) -> Vec<Held> {
        read_small(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .filter_map(proc_entry)
            .filter_map(|p| Held::of(&p, |pid| self.contains(Pid::from_raw(pid))))
            .collect()
    }

    /// SIGKILL to every member at once (Linux 5.14), or to each member.
    pub fn kill(&self) {
        if std::fs::write(self.dir.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for h in self.held_members() {
            h.signal(Signal::SIGKILL);
        }
    }

    /// Remove the directory; only an empty cgroup can go (a failure leaves
    /// it to the watchdog, or to a later run's stale sweep).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// Processes held by pidfd.
//
// A pid is a number the kernel hands out again once its process has been
// reaped, and leaderrun runs as root in many of its homes: a signal sent to
// a number is a signal to whoever holds that number *now*. A pidfd names one
// process for as long as the descriptor is open: a signal through it reaches
// that process or nobody (ESRCH once it has been reaped), and polling it says
// whether the process has exited. So every process stopped here is held by
// pidfd, obtained in one of two ways that prove the identity:
//
// * our own child, not yet reaped (its pid cannot be recycled until we reap
//   it), or a pidfd inherited from the process itself (the watchdog's view
//   of leaderrun);
// * a pid seen somewhere (/proc, cgroup.procs, a message): pidfd_open, then
//   the fact that made it a target is checked again through /proc *after*
//   the open, and the pidfd must still say "running" after that check. A
//   process that runs at the end has held its pid throughout, so the /proc
//   files read in between were its own.
//
// A process group is signalled through its leader's pidfd with
// PIDFD_SIGNAL_PROCESS_GROUP (Linux 6.9): the kernel then names the group by
// the leader's `struct pid`, not by the number, so once the group is empty
// the call fails with ESRCH even if another process has taken the number
// and made itself a group leader with it.
//
// Older kernels: without that flag (5.3 to 6.8), a group is signalled by
// number only while its leader is provably unreaped (leaderrun, its parent,
// has not reaped it) or, in the watchdog, still running by its pidfd, which
// leaves the instant between that check and the kill; without pidfds at all
// (before 5.3) processes are named by pid and start time, checked before
// each signal, as before pidfds existed.

const PIDFD_SIGNAL_PROCESS_GROUP: u32 = 1 << 2;

/// The three pidfd system calls, the only unsafe code for pidfds.
mod sys {
    use nix::errno::Errno;
    use nix::libc;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

    pub fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
        // SAFETY: two integers in; the result is a new descriptor (or -1)
        // that nothing else owns, so OwnedFd may take it.
        let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if rc < 0 {
            return Err(Errno::last());
        }
        Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
    }

    /// `sig` 0 only checks that the target exists.
    pub fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: i32, flags: u32) -> Result<(), Errno> {
        // SAFETY: a descriptor valid for the call, integers, and a null
        // siginfo, which means kill(2)'s defaults.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                flags,
            )
        };
        if rc < 0 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }
}

/// A pidfd polls readable once its process has exited (zombie or reaped).
fn pidfd_exited(fd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut p = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    loop {
        match poll(&mut p, PollTimeout::ZERO) {
            Ok(n) => return n > 0,
            Err(Errno::EINTR) => continue,
            // A pidfd that cannot be polled is no proof of life.
            Err(_) => return true,
        }
    }
}

/// Open a pidfd for the process that holds `pid` now. `Err(None)`: the
/// kernel has no pidfds (before 5.3) or refused one (a seccomp filter, no
/// descriptors left), and the caller falls back to pid and start time.
fn open_pidfd(pid: i32) -> Result<OwnedFd, Option<Errno>> {
    match sys::pidfd_open(pid) {
        Ok(fd) => Ok(fd),
        Err(Errno::ESRCH) => Err(Some(Errno::ESRCH)),
        Err(_) => Err(None),
    }
}

/// A process that may be signalled: by pidfd where the kernel has them,
/// else by pid and start time (see above).
#[derive(Debug)]
pub struct Held {
    pub pid: i32,
    /// Start time in clock ticks: with the pid, names the process.
    pub start: u64,
    fd: Option<OwnedFd>,
}

impl Held {
    /// Hold `p`, a process seen in /proc, if `p.pid` still names it and it
    /// still runs (`also` is any further fact to check after the open, such
    /// as cgroup membership). None when it has gone.
    pub fn of(p: &Proc, also: impl Fn(i32) -> bool) -> Option<Held> {
        let same = |pid: i32| {
            proc_entry(pid).is_some_and(|now| now.start == p.start && !now.zombie) && also(pid)
        };
        match open_pidfd(p.pid) {
            Ok(fd) => (same(p.pid) && !pidfd_exited(&fd)).then_some(Held {
                pid: p.pid,
                start: p.start,
                fd: Some(fd),
            }),
            Err(Some(_)) => None,
            Err(None) => same(p.pid).then_some(Held {
                pid: p.pid,
                start: p.start,
                fd: None,
            }),
        }
    }

    /// Hold a child of this process that has not been reaped: its pid
    /// cannot name anyone else until it is.
    pub fn child(pid: i32) -> Held {
        let start = proc_entry(pid).map_or(0, |p| p.start);
        Held {
            pid,
            start,
            fd: sys::pidfd_open(pid).ok(),
        }
    }

    /// Hold the command leaderrun reported as `pid`, started at `start`:
    /// None when the pid no longer names it (it was reaped). A zombie is
    /// held: unreaped, it still names its group.
    pub fn leader(pid: i32, start: u64) -> Option<Held> {
        let same = || proc_entry(pid).is_some_and(|p| p.start == start);
        match open_pidfd(pid) {
            Ok(fd) => same().then_some(Held {
                pid,
                start,
                fd: Some(fd),
            }),
            Err(Some(_)) => None,
            Err(None) => same().then_some(Held {
                pid,
                start,
                fd: None,
            }),
        }
    }

    /// A pidfd received from elsewhere (inherited), for `pid`.
    pub fn from_pidfd(pid: i32, fd: OwnedFd) -> Held {
        let start = proc_entry(pid).map_or(0, |p| p.start);
        Held {
            pid,
            start,
            fd: Some(fd),
        }
    }

    /// Whether it has exited (a zombie has).
    pub fn exited(&self) -> bool {
        match &self.fd {
            Some(fd) => pidfd_exited(fd),
            None => !proc_entry(self.pid).is_some_and(|p| p.start == self.start && !p.zombie),
        }
    }

    /// Send `sig`; false when the process is gone (never sent to another).
    pub fn signal(&self, sig: Signal) -> bool {
        match &self.fd {
            Some(fd) => sys::pidfd_send_signal(fd.as_fd(), sig as i32, 0).is_ok(),
            None => !self.exited() && kill(Pid::from_raw(self.pid), sig).is_ok(),
        }
    }

    /// Send `sig` (None: only look) to the process group this process
    /// leads, named by identity where the kernel can (see above).
    /// `unreaped`: the caller is its parent and has not reaped it, which
    /// pins the group's number. Ok(false): the group is empty.
    fn signal_group(&self, sig: Option<Signal>, unreaped: bool) -> Result<bool, Errno> {
        let raw = sig.map_or(0, |s| s as i32);
        if let Some(fd) = &self.fd {
            match sys::pidfd_send_signal(fd.as_fd(), raw, PIDFD_SIGNAL_PROCESS_GROUP) {
                Ok(()) => return Ok(true),
                Err(Errno::ESRCH) => return Ok(false),
                // Before Linux 6.9 the flag is refused: by number, below.
                Err(Errno::EINVAL) => {}
                Err(e) => return Err(e),
            }
            if !unreaped && pidfd_exited(fd) {
                // Its number may be anyone's now, and its members unproven.
                return Ok(false);
            }
        }
        match killpg(Pid::from_raw(self.pid), sig) {
            Ok(()) => Ok(true),
            Err(Errno::ESRCH) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The right to send a stop's SIGTERM, shared by leaderrun and its
/// watchdog so that no process gets one from each: one byte in a pipe whose
/// read end both hold (non-blocking). Reading a byte from a pipe is atomic,
/// so exactly one of the two reads it; that one sends the SIGTERMs (each
/// process once) and the other only ever sends SIGKILL. With no token at all
/// (`TermToken::own`) the holder always has the right.
#[derive(Debug, Clone)]
pub struct TermToken {
    fd: Option<std::rc::Rc<OwnedFd>>,
    mine: bool,
}

impl TermToken {
    /// A new token, and the read end to hand to the watchdog.
    pub fn new() -> std::io::Result<(TermToken, OwnedFd)> {
        use nix::fcntl::OFlag;
        let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        nix::unistd::write(&wr, b"T")?;
        let other = rd.try_clone()?;
        Ok((TermToken::from_fd(rd), other))
    }

    pub fn from_fd(fd: OwnedFd) -> TermToken {
        TermToken {
            fd: Some(std::rc::Rc::new(fd)),
            mine: false,
        }
    }

    /// The right, unshared: for a tree nobody else stops.
    pub fn own() -> TermToken {
        TermToken {
            fd: None,
            mine: true,
        }
    }

    /// The read end, to hand a new watchdog the same token.
    pub fn share(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.fd.as_deref().map(|f| f.as_fd())
    }

    /// Take the right if nobody has: true when this side holds it.
    pub fn take(&mut self) -> bool {
        if !self.mine {
            if let Some(fd) = &self.fd {
                let mut b = [0u8; 1];
                self.mine = matches!(nix::unistd::read(fd.as_raw_fd(), &mut b), Ok(1));
            }
        }
        self.mine
    }
}

/// Whose descendants are the command's: leaderrun's, walked by leaderrun
/// itself, or by the watchdog through its pidfd of leaderrun.
#[derive(Debug)]
pub enum Root {
    Me,
    Other(Held),
}

/// A pid to leave out of a tree (the watchdog), shared by every holder.
#[derive(Debug, Clone, Default)]
pub struct Skip(std::sync::Arc<std::sync::atomic::AtomicI32>);

impl Skip {
    pub fn get(&self) -> Option<i32> {
        Some(self.0.load(std::sync::atomic::Ordering::Relaxed)).filter(|p| *p > 0)
    }

    pub fn set(&self, pid: Option<i32>) {
        self.0
            .store(pid.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }
}

/// What to stop: the command (which leads its own group), its cgroup if
/// any, every descendant of `root` but `skip` (the watchdog) while `root`
/// lives, and processes found earlier and held by pidfd.
#[derive(Debug)]
pub struct Tree {
    /// The command; None when leaderrun died before the watchdog could be
    /// told (or shown) which process it is.
    pub leader: Option<Held>,
    /// The caller is the command's parent and has not reaped it, so its
    /// group's number is pinned: leaderrun's own view, until it reaps it.
    /// Never set in the watchdog, which cannot know.
    pub unreaped: bool,
    pub cgroup: Option<Cgroup>,
    pub root: Option<Root>,
    /// The watchdog's pid, left out of every walk; shared, so that a
    /// replacement started while a stop runs is left out at once.
    pub skip: Skip,
    /// Processes found outside a cgroup: the watchdog's last good look.
    pub held: Vec<Held>,
    pub token: TermToken,
    /// Processes sent this stop's SIGTERM, by pid and start time.
    termed: HashSet<(i32, u64)>,
}

impl Tree {
    pub fn new(leader: Option<Held>, cgroup: Option<Cgroup>, root: Option<Root>) -> Tree {
        Tree {
            leader,
            unreaped: false,
            cgroup,
            root,
            skip: Skip::default(),
            held: Vec::new(),
            token: TermToken::own(),
            termed: HashSet::new(),
        }
    }

    /// The live descendants of the root, held; None when the root cannot be
    /// proven alive across the walk (the walk would be of a stranger's pid).
    fn walk(&self) -> Option<Vec<Held>> {
        let (pid, other) = match self.root.as_ref()? {
            Root::Me => (std::process::id() as i32, None),
            Root::Other(h) => (h.pid, Some(h)),
        };
        if other.is_some_and(Held::exited) {
            return None;
        }
        if other.is_none() && !has_other_children(self.skip.get()) {
            return Some(Vec::new());
        }
        let found: Vec<Held> = descendants(pid, self.skip.get())
            .iter()
            .filter_map(|p| Held::of(p, |_| true))
            .collect();
        if other.is_some_and(Held::exited) {
            return None;
        }
        Some(found)
    }

    /// The watchdog's look, taken while leaderrun provably lives: what it
    /// finds replaces the last one. False (the last good look stands) when
    /// leaderrun is gone or there is no root.
    pub fn look(&mut self) -> bool {
        match self.walk() {
            Some(found) => {
                self.held = found;
                true
            }
            None => false,
        }
    }

    /// Everything that may be signalled now, each process once.
    fn targets(&self) -> Vec<Held> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut add = |h: Held, out: &mut Vec<Held>| {
            if seen.insert((h.pid, h.start)) {
                out.push(h);
            }
        };
        if let Some(cg) = &self.cgroup {
            for h in cg.held_members() {
                add(h, &mut out);
            }
        }
        for h in self.walk().unwrap_or_default() {
            add(h, &mut out);
        }
        // The leader and the held ones are borrowed, not moved: re-held by
        // the same proof (they are alive now, by their own pidfds).
        for h in self.leader.iter().chain(&self.held) {
            if !h.exited() && seen.insert((h.pid, h.start)) {
                out.push(Held {
                    pid: h.pid,
                    start: h.start,
                    fd: h.fd.as_ref().and_then(|f| f.try_clone().ok()),
                });
            }
        }
        out
    }

    /// The stop's SIGTERM, then SIGCONT (so that a stopped process acts on
    /// it at once): to each process at most once per stop, and only by the
    /// side that holds the token. Processes that appear later get SIGKILL
    /// at the kill deadline, not a SIGTERM of their own: a trap handler's
    /// cleanup helpers must not be terminated in turn. False when the other
    /// side holds the right (it has sent, or is sending, the SIGTERM).
    pub fn terminate(&mut self) -> bool {
        if !self.token.take() {
            return false;
        }
        for h in self.targets() {
            if self.termed.insert((h.pid, h.start)) && h.signal(Signal::SIGTERM) {
                h.signal(Signal::SIGCONT);
            }
        }
        true
    }

    /// A signal passed on from outside (`kill -TERM leaderrun`) to the
    /// command's group, as a shell passes one to a job: only while the
    /// command is unreaped, or its group is named by identity.
    pub fn signal_group(&self, sig: Signal) {
        if let Some(l) = &self.leader {
            if let Err(e) = l.signal_group(Some(sig), self.unreaped) {
                tracing::warn!(
                    event = "signal_failed",
                    "cannot send {sig} to process group {}: {e}",
                    l.pid
                );
            }
        }
    }

    /// SIGKILL to everything: the cgroup at once, the group by identity,
    /// every target by pidfd.
    pub fn kill(&self) {
        if let Some(cg) = &self.cgroup {
            cg.kill();
        }
        if let Some(l) = &self.leader {
            if let Err(e) = l.signal_group(Some(Signal::SIGKILL), self.unreaped) {
                tracing::warn!(
                    event = "signal_failed",
                    "cannot send SIGKILL to process group {}: {e}",
                    l.pid
                );
            }
        }
        for h in self.targets() {
            h.signal(Signal::SIGKILL);
        }
    }

    /// Without a cgroup, after leaderrun's death, before the SIGKILL: what
    /// the last look held is stopped (SIGSTOP) first, so that none of it
    /// can fork again, and what it started since that look is found among
    /// its children while it stands still, and stopped in turn, until a
    /// round finds nothing new. A process that forks as fast as it can
    /// would otherwise put a new child beyond each kill (the child of a
    /// killed parent goes to init, out of sight). Then SIGKILL to all of
    /// them (a stopped process dies of SIGKILL without being continued).
    /// What escaped before the look, or through a process that exited by
    /// itself since, is beyond reach: the contract's limit without cgroups.
    /// False when a process of the last look had exited by itself before it
    /// could be stopped: what it started since may run on, out of sight,
    /// so nothing here can vouch that everything is gone.
    pub fn freeze_and_kill(&mut self) -> bool {
        let vouched = self.held.iter().all(|h| !h.exited());
        let mut rounds = 0;
        loop {
            for h in &self.held {
                h.signal(Signal::SIGSTOP);
            }
            // Until each has stopped (or exited): a fork under way when the
            // SIGSTOP came completes first, and its child must be seen.
            let until = crate::clock::boottime_now() + std::time::Duration::from_millis(50);
            while self.held.iter().any(|h| !h.exited() && !stopped(h.pid))
                && crate::clock::boottime_now() < until
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let known: HashSet<(i32, u64)> = self.held.iter().map(|h| (h.pid, h.start)).collect();
            let parents: HashSet<i32> = self
                .held
                .iter()
                .filter(|h| !h.exited())
                .map(|h| h.pid)
                .collect();
            let found: Vec<(i32, Held)> = proc_table()
                .iter()
                .filter(|p| parents.contains(&p.ppid) && !p.zombie)
                .filter(|p| Some(p.pid) != self.skip.get() && !known.contains(&(p.pid, p.start)))
                .filter_map(|p| Held::of(p, |_| true).map(|h| (p.ppid, h)))
                .collect();
            // A parent held by pidfd that still runs after the scan had its
            // pid throughout, so the parent links read were to it; a child
            // of one that exited meanwhile is dropped (that pid may be
            // someone else's by now).
            let standing: HashSet<i32> = self
                .held
                .iter()
                .filter(|h| !h.exited())
                .map(|h| h.pid)
                .collect();
            let new: Vec<Held> = found
                .into_iter()
                .filter(|(ppid, _)| standing.contains(ppid))
                .map(|(_, h)| h)
                .collect();
            rounds += 1;
            if new.is_empty() || rounds > 100 {
                break;
            }
            self.held.extend(new);
        }
        for h in &self.held {
            h.signal(Signal::SIGKILL);
        }
        vouched
    }

    /// Whether anything that must be stopped still runs.
    pub fn alive(&self) -> bool {
        if self.cgroup.as_ref().is_some_and(Cgroup::populated) {
            return true;
        }
        if self.leader.as_ref().is_some_and(|l| !l.exited()) {
            return true;
        }
        if self.held.iter().any(|h| !h.exited()) {
            return true;
        }
        if matches!(self.root, Some(Root::Me)) && is_subreaper() {
            // leaderrun's own tree holds every member of the command's group
            // (they are its descendants, as subreaper), so the group need
            // not be looked up by number. With no child but the watchdog,
            // there is no descendant either, and /proc, which may list
            // thousands of processes, need not be read.
            return has_other_children(self.skip.get())
                && self.walk().is_some_and(|w| !w.is_empty());
        }
        // Not a subreaper (the prctl refused): orphans of the group went to
        // init, so the group is looked up as well.
        let mine = matches!(self.root, Some(Root::Me))
            && has_other_children(self.skip.get())
            && self.walk().is_some_and(|w| !w.is_empty());
        mine || self.leader.as_ref().is_some_and(group_runs)
    }
}

/// Whether `pid` is stopped (`T`, or `t` under a tracer).
fn stopped(pid: i32) -> bool {
    read_small(format!("/proc/{pid}/stat"))
        .and_then(|s| {
            let after = s.get(s.rfind(')')? + 1..)?;
            after
                .split_whitespace()
                .next()
                .map(|st| st == "T" || st == "t")
        })
        .unwrap_or(false)
}

/// Whether the group `leader` led has a member that is not a zombie (an
/// orphan's zombie waits for its reaper and runs nothing, but still counts
/// as a member). The members are found by number in /proc, which is sound
/// only while the group exists by identity: checked before and after.
fn group_runs(leader: &Held) -> bool {
    let exists = || leader.signal_group(None, false).unwrap_or(true);
    if !exists() {
        return false;
    }
    let running = proc_table()
        .iter()
        .any(|p| p.pgrp == leader.pid && !p.zombie);
    running && exists()
}

/// Whether this process has a child other than `skip`, running, stopped or
/// not yet reaped. Read from the main thread's `children` file, which is
/// complete here: this process forks only from its main thread (the
/// command, for its parent-death signal, and the watchdog), orphans are
/// re-parented to the first live thread, which is the main one, and an
/// entry leaves the list only when this process reaps it, which it does
/// from the same thread that reads. Without that file (a kernel built
/// without CONFIG_PROC_CHILDREN), any child at all counts.
fn has_other_children(skip: Option<i32>) -> bool {
    let me = std::process::id();
    match read_small(format!("/proc/self/task/{me}/children")) {
        Some(s) => s.split_whitespace().any(|p| p.parse::<i32>().ok() != skip),
        None => has_children(),
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

static SUBREAPER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Make this process the reaper of its orphaned descendants (see the
/// module docs), and so of its watchdog (fork.rs). Best effort: an error
/// leaves the other mechanisms.
pub fn become_subreaper() {
    match nix::sys::prctl::set_child_subreaper(true) {
        Ok(()) => SUBREAPER.store(true, std::sync::atomic::Ordering::Relaxed),
        Err(e) => tracing::debug!("PR_SET_CHILD_SUBREAPER failed: {e}"),
    }
}

/// Whether [`become_subreaper`] succeeded.
pub fn is_subreaper() -> bool {
    SUBREAPER.load(std::sync::atomic::Ordering::Relaxed)
}

/// A pidfd of this process, for the watchdog to inherit; None without
/// pidfds (before Linux 5.3).
pub fn pidfd_self() -> Option<OwnedFd> {
    sys::pidfd_open(std::process::id() as i32).ok()
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

    /// Of two holders of one token, exactly one gets the right, and keeps it.
    #[test]
    fn the_sigterm_token_goes_to_one_side_only() {
        let (mut a, theirs) = TermToken::new().unwrap();
        let mut b = TermToken::from_fd(theirs);
        assert!(b.take());
        assert!(!a.take());
        assert!(b.take(), "the holder keeps the right");
        assert!(!a.take());
        assert!(TermToken::own().take());
    }

    /// A reaped child's pidfd reaches nobody, whoever has its pid now.
    #[test]
    fn a_held_process_is_never_signalled_once_it_is_gone() {
        let mut c = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let h = Held::child(c.id() as i32);
        assert!(!h.exited());
        assert!(h.signal(Signal::SIGKILL));
        let _ = c.wait();
        assert!(h.exited());
        assert!(
            !h.signal(Signal::SIGKILL),
            "signalled through a reaped pidfd"
        );
        assert_eq!(h.signal_group(Some(Signal::SIGKILL), false), Ok(false));
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
