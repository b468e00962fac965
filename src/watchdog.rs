//! The watchdog: a second process that stops the command on time by itself
//! (docs/contract.md §10, "either process suffices").
//!
//! leaderrun enforces the give-up deadline with a timer, but a process can
//! stop running: frozen by SIGSTOP or a debugger, blocked in the kernel,
//! stuck in a bug, or killed outright. The watchdog holds the same deadlines
//! on the same boot clock and acts alone when they pass:
//!
//! * at `sent + G` (plus a short grace, unless leaderrun said it is already
//!   stopping) it sends SIGTERM, then SIGCONT, to everything the command
//!   started; at `sent + G + K`, SIGKILL. Since `G + K < L`, the command is
//!   dead before the store lets a rival acquire, whatever leaderrun is doing;
//! * if leaderrun dies (the pipe below reads end-of-file without a "done"
//!   first), it kills everything the command started at once and, once all
//!   of it is gone, hands the lease back at that epoch (only at that epoch),
//!   so a standby takes over within its retry interval instead of waiting
//!   out the lease.
//!
//! It is `/proc/self/exe` started again (a fork alone could not safely run
//! a store client), with its orders on a pipe as its stdin: the store URL,
//! which may hold a password, is never in its argv or environment (its argv
//! holds leaderrun's pid). It is started detached (fork.rs), adopted by
//! init rather than leaderrun, so that leaderrun, once its command exits,
//! can tell it has no descendant left without reading `/proc`. It runs
//! in a process group of its own with terminal and job-control signals
//! ignored, so a Ctrl-C, a hangup or a SIGKILL to leaderrun's group does not
//! reach it. It holds no store connection until it must release, and sleeps
//! in `poll` between messages.
//!
//! leaderrun's side of the pipe is non-blocking: a frozen watchdog can never
//! stall leaderrun. A deadline it misses that way is an *earlier* one, so a
//! stale watchdog errs towards stopping the command, never towards running
//! it too long.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::clock::{boot_timer, boottime_now, Stamp};
use crate::tree::{Cgroup, Proc, Tree};

/// `argv[1]` that makes `leaderrun` a watchdog; argv[0] names it in `ps`.
pub const ARG: &str = "--be-watchdog";
const MAGIC: &str = "leaderrun-watchdog 1";

/// Everything the watchdog needs to know, sent once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orders {
    /// The `--store` value as given (the watchdog resolves it exactly as
    /// leaderrun did, from the same environment).
    pub store: Option<String>,
    pub origin: crate::store::Origin,
    pub name: String,
    pub holder: String,
    pub epoch: i64,
    pub lease: Duration,
    /// `R` and `P`: the release after leaderrun's death is retried on the
    /// renewal's schedule (elector.rs, `hand_back_until`).
    pub renew: Duration,
    pub give_up: Duration,
    pub kill_after: Duration,
    pub retry: Duration,
    pub min_hold: Option<Duration>,
    pub acquired_at: Stamp,
    /// `sent + G` of the acquisition.
    pub deadline: Stamp,
    pub verbose: u8,
    pub quiet: bool,
    pub json: bool,
}

fn ns(d: Duration) -> u128 {
    d.as_nanos()
}

fn from_ns(s: &str) -> Option<Duration> {
    let n: u128 = s.parse().ok()?;
    let secs = u64::try_from(n / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (n % 1_000_000_000) as u32))
}

fn origin_code(o: crate::store::Origin) -> &'static str {
    use crate::store::Origin::*;
    match o {
        Flag => "flag",
        LeaderrunStore => "env",
        DatabaseUrl => "database_url",
    }
}

fn origin_from(s: &str) -> Option<crate::store::Origin> {
    use crate::store::Origin::*;
    Some(match s {
        "flag" => Flag,
        "env" => LeaderrunStore,
        "database_url" => DatabaseUrl,
        _ => return None,
    })
}

impl Orders {
    fn encode(&self) -> String {
        format!(
            "{MAGIC}\nstore {}\norigin {}\nname {}\nholder {}\nepoch {}\nlease {}\nrenew {}\n\
             give_up {}\nkill_after {}\nretry {}\nmin_hold {}\nacquired {}\ndeadline {}\n\
             log {} {} {}\nend\n",
            self.store.as_deref().unwrap_or("-"),
            origin_code(self.origin),
            self.name,
            self.holder,
            self.epoch,
            ns(self.lease),
            ns(self.renew),
            ns(self.give_up),
            ns(self.kill_after),
            ns(self.retry),
            self.min_hold.map_or("-".into(), |d| ns(d).to_string()),
            ns(self.acquired_at),
            ns(self.deadline),
            self.verbose,
            u8::from(self.quiet),
            u8::from(self.json),
        )
    }

    fn decode(lines: &[String]) -> Option<Orders> {
        let get = |k: &str| {
            lines.iter().find_map(|l| {
                l.strip_prefix(k)
                    .and_then(|rest| rest.strip_prefix(' '))
                    .map(str::to_string)
            })
        };
        let dur = |k: &str| get(k).and_then(|v| from_ns(&v));
        let log = get("log")?;
        let mut log = log.split(' ');
        Some(Orders {
            store: get("store").filter(|s| s != "-"),
            origin: origin_from(&get("origin")?)?,
            name: get("name")?,
            holder: get("holder")?,
            epoch: get("epoch")?.parse().ok()?,
            lease: dur("lease")?,
            renew: dur("renew")?,
            give_up: dur("give_up")?,
            kill_after: dur("kill_after")?,
            retry: dur("retry")?,
            min_hold: get("min_hold").and_then(|v| from_ns(&v)),
            acquired_at: dur("acquired")?,
            deadline: dur("deadline")?,
            verbose: log.next()?.parse().ok()?,
            quiet: log.next()? == "1",
            json: log.next()? == "1",
        })
    }
}

/// leaderrun's handle on its watchdog.
pub struct Watchdog {
    /// Until `give`: the process being started, not yet known to run.
    starting: Option<crate::fork::Detached>,
    /// Known once `give` confirmed the start.
    pid: Option<Pid>,
    pipe: Option<OwnedFd>,
}

impl Watchdog {
    /// Start the watchdog and give it its orders. An error means leaderrun
    /// must not start the command: it would run with one guard, not two.
    pub fn start(orders: &Orders) -> std::io::Result<Watchdog> {
        Watchdog::spawn(&orders.name)?.give(orders)
    }

    /// Start the watchdog process without orders, so that its exec and
    /// start-up overlap the first acquire. Until [`Watchdog::give`] it only
    /// waits on its pipe; dropped unused (the lease was held elsewhere), the
    /// pipe closes and it leaves without doing anything. What the contract
    /// needs is unchanged: the command starts only after `give` returned,
    /// with the orders in the watchdog's pipe (§10).
    pub fn spawn(name: &str) -> std::io::Result<Watchdog> {
        let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let prog = crate::fork::Program::new(
            std::path::Path::new("/proc/self/exe"),
            &[
                format!("leaderrun-watchdog {name}").into(),
                ARG.into(),
                std::process::id().to_string().into(),
            ],
            std::env::vars_os(),
        )?;
        // Ignored dispositions survive exec: the watchdog is deaf to the
        // terminal, to job control and to signals meant for leaderrun. It
        // ends when leaderrun tells it or dies.
        let deaf = [
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGTSTP,
            Signal::SIGTTIN,
            Signal::SIGTTOU,
            Signal::SIGHUP,
            Signal::SIGTERM,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
        ]
        .map(|s| s as i32);
        let starting = crate::fork::spawn_detached(&prog, rd.as_raw_fd(), &deaf)?;
        Ok(Watchdog {
            starting: Some(starting),
            pid: None,
            pipe: Some(wr),
        })
    }

    /// Hand a started watchdog its orders. An error means leaderrun must
    /// not start the command.
    pub fn give(mut self, orders: &Orders) -> std::io::Result<Watchdog> {
        if let Some(s) = self.starting.take() {
            self.pid = Some(s.confirm()?);
        }
        let w = &mut self;
        // The orders fit in the pipe's buffer; write them while the pipe is
        // still blocking, then make it non-blocking for the updates.
        w.send_blocking(&orders.encode())?;
        if let Some(p) = &w.pipe {
            let fl = nix::fcntl::fcntl(p.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
            let fl = OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK;
            nix::fcntl::fcntl(p.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(fl))?;
        }
        Ok(self)
    }

    /// Where leaderrun is its reaper all the same (as pid 1 of a
    /// container), the watchdog is among its descendants: to be skipped.
    pub fn pid(&self) -> Option<Pid> {
        self.pid
    }

    fn send_blocking(&mut self, msg: &str) -> std::io::Result<()> {
        let Some(p) = &self.pipe else {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        };
        let mut rest = msg.as_bytes();
        while !rest.is_empty() {
            match nix::unistd::write(p.as_fd(), rest) {
                Ok(n) => rest = &rest[n..],
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// One short message; never blocks (each is far below PIPE_BUF, so it
    /// is written whole or not at all).
    fn send(&mut self, msg: &str) {
        let Some(p) = &self.pipe else { return };
        match nix::unistd::write(p.as_fd(), msg.as_bytes()) {
            Ok(_) => {}
            Err(nix::errno::Errno::EAGAIN) => {
                tracing::warn!(
                    event = "watchdog_failed",
                    "the watchdog is not reading its orders (frozen?); it keeps the older, earlier deadline"
                );
            }
            Err(e) => {
                tracing::warn!(
                    event = "watchdog_failed",
                    "the watchdog is gone ({e}); leaderrun alone enforces the deadline now"
                );
                self.pipe = None;
            }
        }
    }

    /// The command is about to start (in `cgroup`, if any). Should leaderrun
    /// die before it can say `child`, the watchdog then knows a command may
    /// be running: it stops the cgroup, or, without one, leaves the lease to
    /// expire rather than hand it back under a command it cannot see.
    pub fn spawning(&mut self, cgroup: Option<&Cgroup>) {
        let cg = cgroup.map_or_else(|| "-".into(), |c| c.path().display().to_string());
        self.send(&format!("spawning {cg}\n"));
    }

    /// The command started: what to stop.
    pub fn child(&mut self, pgid: Pid, cgroup: Option<&Cgroup>) {
        let cg = cgroup.map_or_else(|| "-".into(), |c| c.path().display().to_string());
        self.send(&format!("child {pgid} {cg}\n"));
    }

    /// A renewal succeeded: the new give-up deadline (`sent + G`).
    pub fn deadline(&mut self, at: Stamp) {
        self.send(&format!("deadline {}\n", ns(at)));
    }

    /// leaderrun has started stopping the command itself (SIGTERM sent):
    /// the watchdog need not send its own, but keeps the kill deadline.
    pub fn stopping(&mut self) {
        self.send("stopping\n");
    }

    /// Everything the command started is gone: the watchdog leaves without
    /// touching anything.
    pub fn done(mut self) {
        self.send("done\n");
        self.pipe = None;
    }
}

// ---------------------------------------------------------------------------
// The watchdog process.

/// What the watchdog knows and has done.
struct State {
    o: Orders,
    tree: Option<Tree>,
    /// `spawning` was said (with the cgroup the command starts in, if any).
    spawning: Option<Option<Cgroup>>,
    /// Descendants of leaderrun seen at the last update (no cgroup only).
    seen: Vec<Proc>,
    stopping: bool,
    termed: bool,
    killed: bool,
    leaderrun: i32,
    me: i32,
}

impl State {
    /// SIGTERM a little after `G`: leaderrun, when it runs, sends its own
    /// at `G` exactly; this keeps the command from getting two.
    fn term_at(&self) -> Stamp {
        let grace = (self.o.kill_after / 4).min(Duration::from_millis(100));
        self.o.deadline + grace
    }

    fn kill_at(&self) -> Stamp {
        self.o.deadline + self.o.kill_after
    }

    fn next_wake(&self) -> Option<Stamp> {
        self.tree.as_ref()?;
        if !self.termed && !self.stopping {
            Some(self.term_at())
        } else if !self.killed {
            Some(self.kill_at())
        } else {
            None
        }
    }

    fn look(&mut self) {
        if let Some(t) = &self.tree {
            if t.cgroup.is_none() {
                self.seen = crate::tree::descendants(self.leaderrun, Some(self.me));
            }
        }
    }

    /// Act on deadlines that have passed.
    fn enforce(&mut self) {
        let Some(tree) = self.tree.clone() else {
            return;
        };
        let now = boottime_now();
        if !self.termed && !self.stopping && now >= self.term_at() {
            self.termed = true;
            tracing::warn!(
                event = "watchdog_stop",
                epoch = self.o.epoch,
                "no renewal reached the watchdog before the give-up deadline \
                 (leaderrun frozen or blocked?): SIGTERM to the command"
            );
            tree.signal(Signal::SIGTERM);
        }
        if !self.killed && now >= self.kill_at() {
            self.killed = true;
            if tree.alive() {
                tracing::warn!(
                    event = "watchdog_stop",
                    epoch = self.o.epoch,
                    "the command still runs at the kill deadline: SIGKILL"
                );
            }
            tree.signal(Signal::SIGKILL);
        }
    }

    fn apply(&mut self, line: &str) -> bool {
        let mut f = line.split(' ');
        match f.next() {
            Some("child") => {
                let pgid = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                let cg = f.next().filter(|c| *c != "-").map(PathBuf::from);
                if pgid > 0 {
                    self.tree = Some(Tree {
                        pgid: Some(Pid::from_raw(pgid)),
                        cgroup: cg.map(Cgroup::from_path),
                        root: Some(self.leaderrun),
                        skip: Some(self.me),
                    });
                    // No look yet: the command has only just started, and
                    // it is in its group. The first renewal takes one.
                }
            }
            Some("deadline") => {
                if let Some(d) = f.next().and_then(from_ns) {
                    self.o.deadline = self.o.deadline.max(d);
                }
                self.look();
            }
            Some("spawning") => {
                let cg = f.next().filter(|c| *c != "-").map(PathBuf::from);
                self.spawning = Some(cg.map(Cgroup::from_path));
            }
            Some("stopping") => self.stopping = true,
            Some("done") => return true,
            _ => {}
        }
        false
    }

    /// Act on the lines read, in order; then, if the pipe closed, on
    /// leaderrun's death. True when the watchdog's work is over.
    fn feed(&mut self, lines: &[String], open: bool) -> bool {
        if lines.iter().any(|l| self.apply(l)) {
            return true;
        }
        if !open {
            self.orphaned();
            return true;
        }
        false
    }

    /// leaderrun died: stop everything at once, and once all of it is gone,
    /// hand the lease back.
    fn orphaned(&mut self) {
        let expires = self.o.deadline - self.o.give_up + self.o.lease;
        if self.tree.is_none() {
            match self.spawning.take() {
                // Died before starting anything: nothing to stop.
                None => {}
                // Died between fork and `child`: the command's cgroup is
                // all there is to find it by.
                Some(Some(cg)) => {
                    self.tree = Some(Tree {
                        pgid: None,
                        cgroup: Some(cg),
                        root: None,
                        skip: None,
                    })
                }
                Some(None) => {
                    tracing::warn!(
                        event = "watchdog_release",
                        epoch = self.o.epoch,
                        "leaderrun died while starting the command; the lease is left to expire"
                    );
                    return;
                }
            }
        }
        if let Some(tree) = &mut self.tree {
            // leaderrun's descendants have passed to init: the group, the
            // cgroup and the last look are what is left to find them by.
            tree.root = None;
            tree.signal(Signal::SIGKILL);
            for p in &self.seen {
                if crate::tree::proc_entry(p.pid).is_some_and(|now| now.start == p.start) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(p.pid), Signal::SIGKILL);
                }
            }
            while tree.alive() {
                if boottime_now() >= expires {
                    tracing::warn!(
                        event = "watchdog_release",
                        epoch = self.o.epoch,
                        "leaderrun died and the command's processes would not die; the lease is left to expire"
                    );
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            if let Some(cg) = &tree.cgroup {
                cg.remove();
            }
        }
        self.release(expires);
    }

    /// Hand the lease back at our epoch, retried as leaderrun retries it
    /// (elector.rs, `hand_back_until`), until the lease would have expired
    /// anyway (on a store whose failover re-extends leases, a lease later).
    fn release(&self, expires: Stamp) {
        let o = &self.o;
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(_) => return,
        };
        let t = crate::timing::Timing {
            lease: o.lease,
            renew: o.renew,
            give_up: o.give_up,
            kill_after: o.kill_after,
            retry: o.retry,
        };
        let res = rt.block_on(async {
            use crate::store::StoreAdmin;
            let store = crate::store::resolve(
                o.store.clone(),
                o.origin,
                "leaderrun watchdog",
                t.call_cap(),
            )
            .map_err(|e| e.to_string())?;
            let mut until = expires;
            if store.capabilities().failover_extends_lease {
                until += o.lease;
            }
            let clock = crate::clock::BootClock;
            let now = crate::clock::Clock::now(&clock);
            let keep = o
                .min_hold
                .map(|m| m.saturating_sub(now.saturating_sub(o.acquired_at)))
                .unwrap_or_default();
            let mut e =
                crate::elector::Elector::new(store, clock, o.name.clone(), o.holder.clone(), t);
            Ok::<bool, String>(e.hand_back_until(o.epoch, keep, until).await)
        });
        match res {
            Ok(true) => tracing::warn!(
                event = "watchdog_release",
                epoch = o.epoch,
                "leaderrun died; the command was stopped and the lease released"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                event = "watchdog_release",
                epoch = o.epoch,
                "leaderrun died; the command was stopped, but the lease could not be released ({e}); it will expire"
            ),
        }
    }
}

/// Read what is there on fd 0 (the orders pipe) and split off whole lines
/// into `lines`; false on end-of-file. Raw reads, not std's buffered stdin:
/// a line held in a user-space buffer would never wake `poll`.
fn read_lines(buf: &mut Vec<u8>, lines: &mut Vec<String>) -> bool {
    let mut chunk = [0u8; 512];
    // SAFETY: fd 0 is the orders pipe and stays open for the whole process.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let n = loop {
        match nix::unistd::read(stdin.as_raw_fd(), &mut chunk) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break 0,
        }
    };
    buf.extend_from_slice(&chunk[..n]);
    while let Some(i) = buf.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = buf.drain(..=i).collect();
        lines.push(String::from_utf8_lossy(&line[..i]).into_owned());
    }
    n > 0
}

/// The watchdog process: `leaderrun --be-watchdog`, orders on stdin.
pub fn main() -> i32 {
    // leaderrun's pid, from argv: the watchdog is started detached (fork.rs),
    // so it is not leaderrun's child.
    let Some(leaderrun) = std::env::args()
        .nth(2)
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p > 0)
    else {
        crate::stderr::line("error: --be-watchdog is internal to leaderrun");
        return crate::exit::USAGE;
    };
    let mut buf = Vec::new();
    let mut lines = Vec::new();
    let mut open = true;
    while open && !lines.iter().any(|l| l == "end") {
        open = read_lines(&mut buf, &mut lines);
        if lines.first().is_some_and(|l| l != MAGIC) {
            crate::stderr::line("error: --be-watchdog is internal to leaderrun");
            return crate::exit::USAGE;
        }
    }
    let Some(end) = lines.iter().position(|l| l == "end") else {
        return crate::exit::USAGE;
    };
    let later = lines.split_off(end + 1);
    let Some(o) = Orders::decode(&lines[1..end]) else {
        return crate::exit::USAGE;
    };
    crate::logging::init(
        o.verbose,
        o.quiet,
        if o.json {
            crate::cli::LogFormat::Json
        } else {
            crate::cli::LogFormat::Text
        },
    );
    crate::logging::set_context(&o.name, &o.holder);
    crate::logging::set_epoch(o.epoch);
    let mut st = State {
        o,
        tree: None,
        spawning: None,
        seen: Vec::new(),
        stopping: false,
        termed: false,
        killed: false,
        leaderrun,
        me: std::process::id() as i32,
    };
    if st.feed(&later, open) {
        return 0;
    }
    loop {
        st.enforce();
        let timer = st.next_wake().and_then(|at| boot_timer(at).ok());
        let mut fds = vec![nix::libc::pollfd {
            fd: 0,
            events: nix::libc::POLLIN,
            revents: 0,
        }];
        if let Some(t) = &timer {
            fds.push(nix::libc::pollfd {
                fd: t.as_fd().as_raw_fd(),
                events: nix::libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: poll reads and writes `fds.len()` pollfd structs of a
        // live Vec.
        let rc = unsafe { nix::libc::poll(fds.as_mut_ptr(), fds.len() as _, -1) };
        if rc < 0 && nix::errno::Errno::last() != nix::errno::Errno::EINTR {
            // Cannot wait: fall back to a short sleep so deadlines still hold.
            std::thread::sleep(Duration::from_millis(10));
        }
        if fds[0].revents != 0 {
            let mut lines = Vec::new();
            let open = read_lines(&mut buf, &mut lines);
            if st.feed(&lines, open) {
                return 0;
            }
        }
    }
}

/// For tests: the orders as they go over the pipe.
#[doc(hidden)]
pub fn roundtrip(o: &Orders) -> Option<Orders> {
    let lines: Vec<String> = o
        .encode()
        .lines()
        .skip(1)
        .take_while(|l| *l != "end")
        .map(str::to_string)
        .collect();
    Orders::decode(&lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_survive_the_pipe() {
        let o = Orders {
            store: Some("postgres://u:p w@h/db".into()),
            origin: crate::store::Origin::LeaderrunStore,
            name: "x".into(),
            holder: "host:1:ab cd".into(),
            epoch: 7,
            lease: Duration::from_millis(3000),
            renew: Duration::from_millis(1000),
            give_up: Duration::from_millis(2000),
            kill_after: Duration::from_millis(500),
            retry: Duration::from_millis(400),
            min_hold: Some(Duration::from_secs(60)),
            acquired_at: Duration::new(12345, 678),
            deadline: Duration::new(12347, 678),
            verbose: 2,
            quiet: false,
            json: true,
        };
        assert_eq!(roundtrip(&o), Some(o.clone()));
        let none = Orders {
            store: None,
            min_hold: None,
            ..o
        };
        assert_eq!(roundtrip(&none), Some(none.clone()));
    }
}
