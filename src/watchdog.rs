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
//! holds leaderrun's pid; its fd 3 is leaderrun's pidfd, its fd 4 the
//! SIGTERM token, tree.rs). It is started through an intermediate
//! (fork.rs) and adopted by leaderrun, a subreaper, which reaps it when it
//! is done: a PID 1 that reaps nothing is never left its zombie. It
//! says `ready` on its stdout once it holds its orders, and keeps that pipe
//! open until it dies, so that leaderrun learns of its death at once and
//! starts another. It runs in a process group of its own with terminal and
//! job-control signals ignored, so a Ctrl-C, a hangup or a SIGKILL to
//! leaderrun's group does not reach it. It holds no store connection until
//! it must release, and sleeps in `poll` between messages.
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
use crate::tree::{Cgroup, Held, Root, TermToken, Tree};

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

fn stamp_ns(t: Stamp) -> u128 {
    t.since_origin().as_nanos()
}

fn stamp_from_ns(s: &str) -> Option<Stamp> {
    from_ns(s).map(Stamp::from_origin)
}

fn from_ns(s: &str) -> Option<Duration> {
    let n: u128 = s.parse().ok()?;
    let secs = u64::try_from(n / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (n % 1_000_000_000) as u32))
}

/// A cgroup path as one field of a line: `-` for none, else its bytes in
/// hex. A path is whatever the hierarchy allows (spaces, newlines, any
/// byte): split at a space, `/sys/fs/cgroup/a b/leaderrun-…` would name
/// `/sys/fs/cgroup/a`, a stranger's cgroup, to be killed.
fn path_field(cg: Option<&Cgroup>) -> String {
    use std::os::unix::ffi::OsStrExt;
    match cg {
        None => "-".into(),
        Some(c) => c
            .path()
            .as_os_str()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    }
}

/// The inverse of [`path_field`]; `None` for `-` and for anything that is
/// not whole hex bytes of an absolute path.
fn field_path(f: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    if f == "-" || f.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..f.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(f.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let p = PathBuf::from(std::ffi::OsString::from_vec(bytes));
    p.is_absolute().then_some(p)
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
    /// The orders, then `state` (what leaderrun has said since: `spawning`,
    /// `child`, `stopping`, `look`), inside one block: a watchdog says
    /// `ready` only once it holds all of it.
    fn encode_with(&self, state: &[String]) -> String {
        let mut s = self.encode();
        let end = s.len() - "end\n".len();
        let tail = s.split_off(end);
        for l in state {
            s.push_str(l);
        }
        s + &tail
    }

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
            stamp_ns(self.acquired_at),
            stamp_ns(self.deadline),
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
            acquired_at: get("acquired").and_then(|v| stamp_from_ns(&v))?,
            deadline: get("deadline").and_then(|v| stamp_from_ns(&v))?,
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
    /// The read end of the watchdog's stdout: `ready` once it holds its
    /// orders, then nothing until end-of-file, which means it has died (no
    /// other process holds the write end).
    ack: Option<OwnedFd>,
    /// The right to send a stop's SIGTERM, shared with the watchdog.
    token: TermToken,
    /// The orders, with the latest deadline: what a replacement is given.
    orders: Option<Orders>,
    /// The last `spawning` or `child` line, replayed to a replacement.
    said: Vec<String>,
}

/// The line a watchdog writes on its stdout once it holds its orders.
const READY: &[u8] = b"ready\n";

impl Watchdog {
    /// Start the watchdog and give it its orders. An error means leaderrun
    /// must not start the command: it would run with one guard, not two.
    pub fn start(orders: &Orders) -> std::io::Result<Watchdog> {
        Watchdog::spawn(&orders.name)?.give(orders)
    }

    /// Start the watchdog process without orders, so that its exec and
    /// start-up overlap the first acquire. Until [`Watchdog::give`] it only
    /// waits on its pipe; dropped unused (the lease was held elsewhere), it
    /// is killed and reaped. What the contract needs is unchanged: the
    /// command starts only after `give` returned, which is after the
    /// watchdog said it holds its orders (§10).
    pub fn spawn(name: &str) -> std::io::Result<Watchdog> {
        let (token, theirs) = TermToken::new()?;
        Watchdog::spawn_with(name, token, theirs.as_fd())
    }

    fn spawn_with(
        name: &str,
        token: TermToken,
        theirs: std::os::fd::BorrowedFd<'_>,
    ) -> std::io::Result<Watchdog> {
        let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (ack_rd, ack_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        // leaderrun's own pidfd, inherited: the watchdog knows leaderrun by
        // identity from its first instant, with no pid to race against.
        let me = crate::tree::pidfd_self();
        let prog = crate::fork::Program::new(
            std::path::Path::new("/proc/self/exe"),
            &[
                format!("leaderrun-watchdog {name}").into(),
                ARG.into(),
                std::process::id().to_string().into(),
                if me.is_some() { "pidfd" } else { "-" }.into(),
            ],
            std::env::vars_os(),
        )
        .map_err(std::io::Error::other)?;
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
            Signal::SIGPIPE,
        ]
        .map(|s| s as i32);
        let extra = [
            me.as_ref().map_or(-1, |f| f.as_raw_fd()),
            theirs.as_raw_fd(),
        ];
        let starting =
            crate::fork::spawn_detached(&prog, rd.as_raw_fd(), ack_wr.as_raw_fd(), &extra, &deaf)
                .map_err(std::io::Error::other)?;
        Ok(Watchdog {
            starting: Some(starting),
            pid: None,
            pipe: Some(wr),
            ack: Some(ack_rd),
            token,
            orders: None,
            said: Vec::new(),
        })
    }

    /// Hand a started watchdog its orders and wait until it says it holds
    /// them (at the latest until the give-up deadline, after which the
    /// command could not start anyway). An error means leaderrun must not
    /// start the command.
    pub fn give(self, orders: &Orders) -> std::io::Result<Watchdog> {
        self.give_with(orders, &[])
    }

    /// [`Watchdog::give`], with what leaderrun has said since the orders
    /// (a replacement's case) in the same block, before `ready`.
    fn give_with(mut self, orders: &Orders, state: &[String]) -> std::io::Result<Watchdog> {
        if let Some(s) = self.starting.take() {
            self.pid = Some(s.confirm().map_err(std::io::Error::other)?);
        }
        // The orders fit in the pipe's buffer; write them while the pipe is
        // still blocking, then make it non-blocking for the updates.
        self.send_blocking(&orders.encode_with(state))?;
        self.orders = Some(orders.clone());
        if let Some(p) = &self.pipe {
            set_nonblocking(p)?;
        }
        let Some(ack) = &self.ack else {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        };
        let mut got = Vec::new();
        while got.len() < READY.len() {
            let left = orders.deadline.saturating_since(boottime_now());
            if left.is_zero() || !wait_readable(ack, Some(left)) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the watchdog did not confirm its orders before the give-up deadline",
                ));
            }
            let mut b = [0u8; 16];
            match nix::unistd::read(ack.as_raw_fd(), &mut b[..READY.len() - got.len()]) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::BrokenPipe,
                        "the watchdog exited before confirming its orders",
                    ))
                }
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if got != READY {
            return Err(std::io::Error::other("the watchdog answered nonsense"));
        }
        set_nonblocking(ack)?;
        Ok(self)
    }

    /// Start a replacement with the current orders (latest deadline) and
    /// everything said since; the same SIGTERM token goes with it.
    pub fn replace(&self) -> std::io::Result<Watchdog> {
        let Some(orders) = &self.orders else {
            return Err(std::io::ErrorKind::NotFound.into());
        };
        let Some(theirs) = self.token.share() else {
            return Err(std::io::ErrorKind::NotFound.into());
        };
        // What was said goes inside the orders, so that `ready` means the
        // replacement knows the command (a line sent after it could meet a
        // leaderrun frozen in between). The first watchdog's first look
        // comes with the first renewal, while the command has only just
        // started; a replacement's would come an `R` into a command that
        // may long have started others: it looks at once.
        let mut state = self.said.clone();
        state.push("look\n".into());
        let mut w = Watchdog::spawn_with(&orders.name, self.token.clone(), theirs)?
            .give_with(orders, &state)?;
        w.said = self.said.clone();
        Ok(w)
    }

    /// The watchdog's pid: a child of leaderrun, as subreaper, to be left
    /// out of the command's tree.
    pub fn pid(&self) -> Option<Pid> {
        self.pid
    }

    /// The SIGTERM token, for the command's tree.
    pub fn token(&self) -> TermToken {
        self.token.clone()
    }

    /// Whether the watchdog still runs: its end of the ack pipe is open.
    pub fn alive(&self) -> bool {
        self.ack
            .as_ref()
            .is_some_and(|a| !wait_readable(a, Some(Duration::ZERO)))
    }

    /// A copy of the ack pipe's read end, readable once the watchdog dies.
    pub fn gone_fd(&self) -> Option<OwnedFd> {
        self.ack.as_ref().and_then(|a| a.try_clone().ok())
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
                // Its death is acted on where the ack pipe is watched
                // (run/guard.rs): replaced, or the command stopped.
                tracing::debug!("the watchdog's pipe is closed ({e})");
                self.pipe = None;
            }
        }
    }

    /// The command is about to start (in `cgroup`, if any). Should leaderrun
    /// die before it can say `child`, the watchdog then knows a command may
    /// be running: it stops the cgroup, or, without one, leaves the lease to
    /// expire rather than hand it back under a command it cannot see.
    pub fn spawning(&mut self, cgroup: Option<&Cgroup>) {
        let line = format!("spawning {}\n", path_field(cgroup));
        self.send(&line);
        self.said = vec![line];
    }

    /// The command started: what to stop. Its start time goes with its pid,
    /// so that the watchdog can tell it from a process that took the pid
    /// after it was reaped.
    pub fn child(&mut self, pid: Pid, start: u64, cgroup: Option<&Cgroup>) {
        let line = format!("child {pid} {start} {}\n", path_field(cgroup));
        self.send(&line);
        self.said = vec![line];
    }

    /// A renewal succeeded: the new give-up deadline (`sent + G`).
    pub fn deadline(&mut self, at: Stamp) {
        if let Some(o) = &mut self.orders {
            o.deadline = o.deadline.max(at);
        }
        self.send(&format!("deadline {}\n", stamp_ns(at)));
    }

    /// leaderrun has started stopping the command itself: the watchdog
    /// keeps the kill deadline, and (the SIGTERM token being leaderrun's)
    /// sends no SIGTERM of its own.
    pub fn stopping(&mut self) {
        self.send("stopping\n");
        self.said.push("stopping\n".into());
    }

    /// Everything the command started is gone: the watchdog leaves without
    /// touching anything. leaderrun, its reaper, waits for it to exit and
    /// reaps it when this handle is dropped.
    pub fn done(&mut self) {
        self.send("done\n");
        self.pipe = None;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.pipe = None;
        if let Some(s) = self.starting.take() {
            // Never given its orders (the lease was held elsewhere, or
            // leaderrun is leaving early): it has nothing to guard.
            s.abandon(crate::tree::is_subreaper());
            return;
        }
        // Told `done`, or its pipe just closed (which it takes for
        // leaderrun's death: with nothing started, it leaves at once). It
        // exits within milliseconds; its stdout closing says it has.
        if let Some(a) = &self.ack {
            wait_readable(a, Some(Duration::from_secs(1)));
        }
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        let Some(pid) = self.pid.take() else { return };
        // A watchdog that is not our child (no subreaper) is not ours to
        // reap: ECHILD at once.
        for _ in 0..200 {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => return,
            }
        }
    }
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let fl = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
    let fl = OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(fl))?;
    Ok(())
}

/// Wait until `fd` is readable (data, end-of-file or error), for at most
/// `limit` (None: no limit). True when it is.
fn wait_readable(fd: &impl AsFd, limit: Option<Duration>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let until = limit.map(|l| boottime_now() + l);
    loop {
        let t = match until {
            None => PollTimeout::NONE,
            Some(u) => {
                let left = u.saturating_since(boottime_now()).as_millis();
                PollTimeout::try_from(left.min(60_000) as i32).unwrap_or(PollTimeout::ZERO)
            }
        };
        let mut p = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut p, t) {
            Ok(n) if n > 0 => return true,
            Ok(_) if until.is_some_and(|u| boottime_now() >= u) => return false,
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return true,
        }
    }
}

// ---------------------------------------------------------------------------
// The watchdog process.

/// What the watchdog knows and has done.
struct State {
    o: Orders,
    /// What to stop, from the first `spawning` (a command may run from then on).
    tree: Option<Tree>,
    /// leaderrun, held by the pidfd it handed down; moved into the tree as
    /// its root once there is one.
    leaderrun: Option<Held>,
    token: TermToken,
    stopping: bool,
    termed: bool,
    killed: bool,
    /// Renewals in a row whose look could not be taken: leaderrun was
    /// already gone when the watchdog read them (it was delayed).
    missed: u32,
    me: i32,
}

impl State {
    /// The plan of the latest deadline (stop.rs): SIGTERM a little after
    /// `G`, SIGKILL at `G + K`.
    fn plan(&self) -> crate::stop::StopPlan {
        let t = crate::timing::Timing {
            lease: self.o.lease,
            renew: self.o.renew,
            give_up: self.o.give_up,
            kill_after: self.o.kill_after,
            retry: self.o.retry,
        };
        crate::stop::StopPlan::new(self.o.deadline - self.o.give_up, t)
    }

    fn term_at(&self) -> Stamp {
        self.plan().watchdog_term_at()
    }

    fn kill_at(&self) -> Stamp {
        self.plan().kill_at()
    }

    fn next_wake(&self) -> Option<Stamp> {
        self.tree.as_ref()?;
        if !self.termed {
            Some(self.term_at())
        } else if !self.killed {
            Some(self.kill_at())
        } else {
            None
        }
    }

    /// A renewal was announced: look at leaderrun's descendants (without a
    /// cgroup, the look is what finds them should leaderrun die). A look
    /// that cannot be taken (leaderrun is gone) leaves the last good one.
    fn look(&mut self) {
        if let Some(t) = &mut self.tree {
            // A planned cgroup that is not there holds nothing: look.
            if !t.cgroup.as_ref().is_some_and(Cgroup::exists) {
                if t.look() {
                    self.missed = 0;
                } else {
                    self.missed += 1;
                }
            }
        }
    }

    /// Act on deadlines that have passed.
    fn enforce(&mut self) {
        let now = boottime_now();
        let (term_at, kill_at) = (self.term_at(), self.kill_at());
        let Some(tree) = &mut self.tree else {
            return;
        };
        if !self.termed && now >= term_at {
            self.termed = true;
            // Tried even after `stopping`: should leaderrun have frozen
            // between saying so and sending its SIGTERM, the token is still
            // there and the command still gets exactly one.
            let sent = tree.terminate();
            if sent && self.stopping {
                tracing::warn!(
                    event = "watchdog_stop",
                    epoch = self.o.epoch,
                    "leaderrun said it was stopping the command but sent no SIGTERM \
                     (frozen?): SIGTERM to the command"
                );
            } else if sent {
                tracing::warn!(
                    event = "watchdog_stop",
                    epoch = self.o.epoch,
                    "no renewal reached the watchdog before the give-up deadline \
                     (leaderrun frozen or blocked?): SIGTERM to the command"
                );
            }
        }
        if !self.killed && now >= kill_at {
            self.killed = true;
            if tree.alive() {
                tracing::warn!(
                    event = "watchdog_stop",
                    epoch = self.o.epoch,
                    "the command still runs at the kill deadline: SIGKILL"
                );
            }
            tree.kill();
        }
    }

    /// The tree to stop, made at the first `spawning` or `child`: from the
    /// moment leaderrun may fork, its descendants (and the cgroup, once
    /// there is one) are what the deadlines act on, even if leaderrun
    /// freezes before it can say which process the command is.
    fn tree_mut(&mut self) -> &mut Tree {
        let (me, token) = (self.me, self.token.clone());
        let root = &mut self.leaderrun;
        self.tree.get_or_insert_with(|| {
            let mut t = Tree::new(None, None, root.take().map(Root::Other));
            t.skip.set(Some(me));
            t.token = token;
            t
        })
    }

    /// One line from leaderrun; true on `done`. A `deadline` only notes
    /// that a look is due: a batch of them (read after a delay) takes one.
    fn apply(&mut self, line: &str, look: &mut bool) -> bool {
        let mut f = line.split(' ');
        match f.next() {
            Some("child") => {
                let pid = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                let start = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                let cg = f.next().and_then(field_path).map(Cgroup::from_path);
                if pid > 0 {
                    // Held only if the pid still names the process leaderrun
                    // started (it may have exited and been reaped since).
                    let leader = Held::leader(pid, start);
                    let tree = self.tree_mut();
                    tree.leader = leader;
                    tree.cgroup = cg;
                    // No look yet: the command has only just started, and
                    // it is in its group. The first renewal takes one.
                }
            }
            Some("deadline") => {
                if let Some(d) = f.next().and_then(stamp_from_ns) {
                    self.o.deadline = self.o.deadline.max(d);
                }
                *look = true;
            }
            Some("spawning") => {
                // Said again (with `-`) when the cgroup could not be made.
                let cg = f.next().and_then(field_path).map(Cgroup::from_path);
                self.tree_mut().cgroup = cg;
            }
            Some("look") => *look = true,
            Some("stopping") => self.stopping = true,
            Some("done") => return true,
            _ => {}
        }
        false
    }

    /// Act on the lines read, in order; then, if the pipe closed, on
    /// leaderrun's death. True when the watchdog's work is over.
    fn feed(&mut self, lines: &[String], open: bool) -> bool {
        let mut look = false;
        for l in lines {
            if self.apply(l, &mut look) {
                return true;
            }
        }
        if look {
            self.look();
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
        let missed = self.missed;
        let epoch = self.o.epoch;
        if let Some(tree) = &mut self.tree {
            // leaderrun's descendants have passed to init: the cgroup, the
            // group (by its leader's pidfd) and the last good look are what
            // is left to find them by.
            tree.root = None;
            // A cgroup that was planned but is not there (leaderrun died
            // before making it, or could not make it and its word of that
            // was lost) proves nothing about where the command runs.
            let cgroup_seen = tree.cgroup.as_ref().is_some_and(Cgroup::exists);
            if tree.cgroup.is_some() && !cgroup_seen {
                tree.cgroup = None;
            }
            // Without a cgroup, what the last look held may still fork:
            // stop it first, then what it started since (tree.rs).
            let vouched = tree.cgroup.is_some() || tree.freeze_and_kill();
            tree.kill();
            // Waited for past the lease's expiry if need be (a watchdog that
            // was itself delayed acts late): the lease is then not handed
            // back, but the cgroup, once empty, is still removed. Every
            // round kills again: a member forked between a round's look and
            // its kill is not left running.
            let give_up = expires.max(boottime_now() + Duration::from_secs(1));
            let mut gone = true;
            while tree.alive() {
                if boottime_now() >= give_up {
                    gone = false;
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
                if tree.cgroup.is_none() {
                    tree.freeze_and_kill();
                }
                tree.kill();
            }
            if let Some(cg) = &tree.cgroup {
                cg.remove();
            }
            if !gone || boottime_now() >= expires {
                tracing::warn!(
                    event = "watchdog_release",
                    epoch,
                    "leaderrun died and the command's processes would not die in time; \
                     the lease is left to expire"
                );
                return;
            }
            if tree.cgroup.is_none() && (tree.leader.is_none() || missed > 0 || !vouched) {
                // Without a cgroup, only what the watchdog saw was stopped:
                // with its view of the command lost, a renewal's look
                // missed (the last good look is then more than `R` old), or
                // a process of that look gone by itself since (a child it
                // forked went to init, unseen), a descendant may run on.
                tracing::warn!(
                    event = "watchdog_release",
                    epoch,
                    "leaderrun died while the watchdog could not see the command's processes \
                     (it was delayed, or the command had not started); what it saw was stopped, \
                     and the lease is left to expire"
                );
                return;
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
                .map(|m| m.saturating_sub(now.saturating_since(o.acquired_at)))
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
///
/// Everything already in the pipe is read before returning: a watchdog
/// stopped (SIGSTOP) while leaderrun went on renewing wakes to a backlog
/// of deadlines, and acting on the first of them alone would stop a
/// command whose lease is held and renewed.
fn read_lines(buf: &mut Vec<u8>, lines: &mut Vec<String>) -> bool {
    let mut chunk = [0u8; 4096];
    // SAFETY: fd 0 is the orders pipe and stays open for the whole process.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    // The pipe holds at most its buffer (64 KiB by default); the bound
    // only keeps a writer that never stops from holding the watchdog here.
    let mut open = true;
    for _ in 0..64 {
        let n = loop {
            match nix::unistd::read(stdin.as_raw_fd(), &mut chunk) {
                Ok(n) => break n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break 0,
            }
        };
        buf.extend_from_slice(&chunk[..n]);
        if n == 0 {
            open = false;
            break;
        }
        if !wait_readable(&stdin, Some(Duration::ZERO)) {
            break;
        }
    }
    while let Some(i) = buf.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = buf.drain(..=i).collect();
        lines.push(String::from_utf8_lossy(&line[..i]).into_owned());
    }
    open
}

/// The watchdog process: `leaderrun --be-watchdog PID pidfd|-`, orders on
/// stdin, `ready` on stdout once it holds them; fd 3 is leaderrun's pidfd
/// (when argv says `pidfd`), fd 4 the read end of the SIGTERM token.
pub fn main() -> i32 {
    let usage = || {
        crate::stderr::line("error: --be-watchdog is internal to leaderrun");
        crate::exit::USAGE
    };
    // leaderrun's pid, from argv: the watchdog was started through an
    // intermediate (fork.rs), so it cannot ask for its parent's.
    let Some(pid) = std::env::args()
        .nth(2)
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p > 0)
    else {
        return usage();
    };
    let with_pidfd = std::env::args().nth(3).as_deref() == Some("pidfd");
    let open_fd = |n: i32| nix::fcntl::fcntl(n, nix::fcntl::FcntlArg::F_GETFD).is_ok();
    if !open_fd(4) || (with_pidfd && !open_fd(3)) {
        return usage();
    }
    // SAFETY: fds 3 and 4 were placed in this process by leaderrun for it
    // alone (fork.rs, spawn_detached; checked open just above), and nothing
    // else here owns or closes them.
    let (lr_fd, token_fd) = unsafe {
        use std::os::fd::FromRawFd;
        (
            with_pidfd.then(|| OwnedFd::from_raw_fd(3)),
            OwnedFd::from_raw_fd(4),
        )
    };
    let leaderrun = match lr_fd {
        Some(fd) => Some(Held::from_pidfd(pid, fd)),
        // No pidfds (before Linux 5.3): by pid and start time.
        None => crate::tree::proc_entry(pid).and_then(|p| Held::of(&p, |_| true)),
    };
    let mut buf = Vec::new();
    let mut lines = Vec::new();
    let mut open = true;
    while open && !lines.iter().any(|l| l == "end") {
        open = read_lines(&mut buf, &mut lines);
        if lines.first().is_some_and(|l| l != MAGIC) {
            return usage();
        }
    }
    let Some(end) = lines.iter().position(|l| l == "end") else {
        return crate::exit::USAGE;
    };
    let later = lines.split_off(end + 1);
    let Some(o) = Orders::decode(&lines[1..end]) else {
        return crate::exit::USAGE;
    };
    // What leaderrun said before these orders were sent (a replacement's
    // case): applied before `ready`, so that `ready` means all of it is held.
    let state: Vec<String> = lines[1..end]
        .iter()
        .filter(|l| {
            let word = l.split(' ').next().unwrap_or("");
            matches!(word, "spawning" | "child" | "stopping" | "look")
        })
        .cloned()
        .collect();
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
        leaderrun,
        token: TermToken::from_fd(token_fd),
        stopping: false,
        termed: false,
        killed: false,
        missed: 0,
        me: std::process::id() as i32,
    };
    if st.feed(&state, true) {
        return 0;
    }
    // The orders are decoded and held: only now may the command start. The
    // write end stays open until this process ends, which is how leaderrun
    // learns of its death.
    // SAFETY: fd 1 is the ack pipe leaderrun placed there, open for the
    // whole process.
    let out = unsafe { std::os::fd::BorrowedFd::borrow_raw(1) };
    if nix::unistd::write(out, READY) != Ok(READY.len()) {
        return crate::exit::USAGE;
    }
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

    /// A cgroup path with a space, a newline or bytes that are not UTF-8
    /// comes back whole; anything else than whole hex of an absolute path
    /// names no cgroup at all.
    #[test]
    fn cgroup_paths_cross_the_pipe_whole() {
        use std::os::unix::ffi::OsStrExt;
        for raw in [
            &b"/sys/fs/cgroup/my service.slice/leaderrun-1-ab"[..],
            b"/sys/fs/cgroup/a\nchild 1 2 -/x",
            b"/sys/fs/cgroup/\xff\xfe",
        ] {
            let cg = Cgroup::from_path(PathBuf::from(std::ffi::OsStr::from_bytes(raw)));
            let f = path_field(Some(&cg));
            assert!(!f.contains(' ') && !f.contains('\n'), "{f}");
            assert_eq!(field_path(&f).as_deref(), Some(cg.path()));
        }
        assert_eq!(path_field(None), "-");
        for bad in ["-", "", "2f7", "zz", "7379732f"] {
            assert_eq!(field_path(bad), None, "{bad}");
        }
    }

    /// A replacement's state goes inside the orders, before `end`, and the
    /// orders still decode.
    #[test]
    fn state_rides_inside_the_orders() {
        let o = Orders {
            store: None,
            origin: crate::store::Origin::Flag,
            name: "x".into(),
            holder: "h".into(),
            epoch: 3,
            lease: Duration::from_secs(3),
            renew: Duration::from_secs(1),
            give_up: Duration::from_secs(2),
            kill_after: Duration::from_millis(500),
            retry: Duration::from_millis(400),
            min_hold: None,
            acquired_at: Stamp::from_origin(Duration::from_secs(5)),
            deadline: Stamp::from_origin(Duration::from_secs(7)),
            verbose: 0,
            quiet: false,
            json: false,
        };
        let text = o.encode_with(&["child 12 34 -\n".into(), "stopping\n".into()]);
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        let end = lines.iter().position(|l| l == "end").expect("end");
        assert_eq!(end, lines.len() - 1);
        assert_eq!(lines[end - 2..end], ["child 12 34 -", "stopping"]);
        assert_eq!(Orders::decode(&lines[1..end]), Some(o));
    }

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
            acquired_at: Stamp::from_origin(Duration::new(12345, 678)),
            deadline: Stamp::from_origin(Duration::new(12347, 678)),
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
