//! The watchdog process: a thin loop around the machine (machine.rs) that
//! does its I/O. It reads the orders pipe (fd 0) and the boot clock, waits
//! in `poll` on the pipe and a timerfd armed at the machine's next
//! deadline, and performs the machine's actions on the command's tree
//! (tree.rs: pidfds, /proc, the cgroup) and, after leaderrun's death, on
//! the store.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use super::handle::wait_readable;
use super::machine::{self, Flow, Input, Look, Machine, Why, World};
use super::orders::{Msg, Orders, Start};
use super::READY;
use crate::clock::{boot_timer, boottime_now, Stamp};
use crate::tree::{Cgroup, Held, Root, TermToken, Tree};

/// The longest first line (the orders) taken: far above any real one, and
/// a bound on what a writer that never ends its line can make us hold.
const MAX_START: usize = 1 << 20;

/// The orders pipe, read raw: a line held in a user-space buffer would
/// never wake `poll`.
struct Pipe {
    buf: Vec<u8>,
    open: bool,
}

impl Pipe {
    fn fd() -> BorrowedFd<'static> {
        // SAFETY: fd 0 is the orders pipe and stays open for the whole
        // process.
        unsafe { BorrowedFd::borrow_raw(0) }
    }

    /// Read what is there and split off whole lines; everything already in
    /// the pipe is read before returning: a watchdog stopped (SIGSTOP)
    /// while leaderrun went on renewing wakes to a backlog of renewals, and
    /// acting on the first of them alone would stop a command whose lease
    /// is held and renewed.
    fn read_lines(&mut self) -> Vec<Vec<u8>> {
        let mut chunk = [0u8; 4096];
        // The pipe holds at most its buffer (64 KiB by default); the bound
        // only keeps a writer that never stops from holding us here.
        for _ in 0..64 {
            let n = loop {
                match nix::unistd::read(Pipe::fd().as_raw_fd(), &mut chunk) {
                    Ok(n) => break n,
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => break 0,
                }
            };
            self.buf.extend_from_slice(&chunk[..n]);
            if n == 0 {
                self.open = false;
                break;
            }
            if !wait_readable(&Pipe::fd(), Some(Duration::ZERO)) {
                break;
            }
        }
        let mut lines = Vec::new();
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=i).collect();
            line.pop();
            lines.push(line);
        }
        lines
    }
}

/// Updates, decoded; a line that is not one (none should be) is skipped:
/// the watchdog never acts on what it cannot read.
fn decode(lines: &[Vec<u8>]) -> Vec<Msg> {
    lines
        .iter()
        .filter_map(|l| match Msg::decode(l) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::debug!("an update the watchdog cannot read ({e})");
                None
            }
        })
        .collect()
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
    let mut pipe = Pipe {
        buf: Vec::new(),
        open: true,
    };
    // The orders: the first whole line. Until it is there and decodes, no
    // `ready`: leaderrun then starts no command (§10).
    let mut lines = Vec::new();
    while lines.is_empty() && pipe.open && pipe.buf.len() <= MAX_START {
        lines = pipe.read_lines();
    }
    let Some(first) = lines.first() else {
        return crate::exit::USAGE;
    };
    let start = match Start::decode(first) {
        Ok(s) => s,
        Err(e) => {
            crate::stderr::line(&format!("error: the watchdog cannot take its orders ({e})"));
            return crate::exit::USAGE;
        }
    };
    let later = decode(&lines[1..]);
    let o = start.orders;
    crate::logging::init(crate::logging::Settings {
        verbose: o.verbose,
        quiet: o.quiet,
        format: if o.json {
            crate::logging::LogFormat::Json
        } else {
            crate::logging::LogFormat::Text
        },
    });
    crate::logging::set_context(&o.name, &o.holder);
    crate::logging::set_epoch(o.epoch);
    let mut m = Machine::new(&o);
    let mut w = Real {
        o,
        tree: None,
        leaderrun,
        token: TermToken::from_fd(token_fd),
        me: std::process::id() as i32,
        lr_pid: pid,
    };
    let now = boottime_now;
    if let Flow::Exit(code) = machine::run(&mut m, &mut w, &now, Input::Start(start.said)) {
        return code;
    }
    let mut input = Input::Said {
        msgs: later,
        open: pipe.open,
    };
    loop {
        if let Flow::Exit(code) = machine::run(&mut m, &mut w, &now, input) {
            return code;
        }
        input = wait(&mut pipe, m.wake());
    }
}

/// Sleep until leaderrun says something (or its end closes) or `wake`
/// comes: what was said, read in full, or a tick.
fn wait(pipe: &mut Pipe, wake: Option<Stamp>) -> Input {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    if pipe.open {
        // A timer that cannot be had (no timerfd): a short poll instead,
        // so that deadlines still hold.
        let timer = wake.map(|at| boot_timer(at).ok());
        let fallback = match timer {
            Some(None) => PollTimeout::from(10u8),
            _ => PollTimeout::NONE,
        };
        let mut fds = vec![PollFd::new(Pipe::fd(), PollFlags::POLLIN)];
        if let Some(Some(t)) = &timer {
            fds.push(PollFd::new(t.as_fd(), PollFlags::POLLIN));
        }
        let said = match poll(&mut fds, fallback) {
            Ok(_) => fds[0].revents().is_some_and(|r| !r.is_empty()),
            Err(nix::errno::Errno::EINTR) => false,
            Err(_) => {
                // Cannot wait: a short sleep so deadlines still hold.
                std::thread::sleep(Duration::from_millis(10));
                false
            }
        };
        if said {
            let msgs = decode(&pipe.read_lines());
            return Input::Said {
                msgs,
                open: pipe.open,
            };
        }
        return Input::Tick;
    }
    // The pipe is closed (leaderrun is gone): only time brings news. (A
    // machine with nothing to wait for then would be a bug: it is not
    // left to spin.)
    let left = wake.map_or(crate::stop::ROUND, |at| at - boottime_now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
    Input::Tick
}

/// The watchdog's world: the command's tree, the token, leaderrun's pidfd,
/// the `ready` pipe and the store.
struct Real {
    o: Orders,
    /// What to stop, from the first `spawning` (a command may run from then).
    tree: Option<Tree>,
    /// leaderrun, held by the pidfd it handed down; moved into the tree as
    /// its root once there is one.
    leaderrun: Option<Held>,
    token: TermToken,
    me: i32,
    /// leaderrun's pid (from argv), to end it when it is stopped holding
    /// its lease's file (`end_stopped_leaderrun`).
    lr_pid: i32,
}

impl Real {
    /// The tree to stop, made at the first `spawning` or `child`: from the
    /// moment leaderrun may fork, its descendants (and the cgroup, once
    /// there is one) are what the deadlines act on, even if leaderrun
    /// freezes before it can say which process the command is.
    fn tree(&mut self) -> &mut Tree {
        let (me, token) = (self.me, self.token.clone());
        let root = &mut self.leaderrun;
        self.tree.get_or_insert_with(|| {
            let mut t = Tree::new(None, None, root.take().map(Root::Other));
            t.skip.set(Some(me));
            t.token = token;
            t
        })
    }

    /// The log line for a SIGTERM the watchdog sent itself.
    fn said_terminate(&self, stopping: bool) {
        let epoch = self.o.epoch;
        if stopping {
            tracing::warn!(
                event = "watchdog_stop",
                epoch,
                "leaderrun said it was stopping the command but sent no SIGTERM \
                 (frozen?): SIGTERM to the command"
            );
        } else {
            tracing::warn!(
                event = "watchdog_stop",
                epoch,
                "no renewal reached the watchdog before the give-up deadline \
                 (leaderrun frozen or blocked?): SIGTERM to the command"
            );
        }
    }
}

impl World for Real {
    fn ready(&mut self) -> bool {
        // The orders are decoded and held: only now may the command start.
        // The write end stays open until this process ends, which is how
        // leaderrun learns of its death.
        // SAFETY: fd 1 is the ack pipe leaderrun placed there, open for the
        // whole process.
        let out = unsafe { BorrowedFd::borrow_raw(1) };
        nix::unistd::write(out, READY) == Ok(READY.len())
    }

    fn watch(&mut self) {
        self.tree();
    }

    fn set_cgroup(&mut self, cgroup: Option<PathBuf>) {
        self.tree().cgroup = cgroup.map(Cgroup::from_path);
    }

    fn hold_leader(&mut self, pid: i32, start: u64) -> bool {
        // Held only if the pid still names the process leaderrun started
        // (it may have exited and been reaped since).
        let leader = Held::leader(pid, start);
        let held = leader.is_some();
        self.tree().leader = leader;
        held
    }

    fn look(&mut self) -> Look {
        let t = self.tree();
        // A planned cgroup that is not there holds nothing: look.
        if t.cgroup.as_ref().is_some_and(Cgroup::exists) {
            Look::Cgroup
        } else if t.look() {
            Look::Taken
        } else {
            Look::Missed
        }
    }

    fn terminate(&mut self, stopping: bool) {
        // Tried even after `stopping`: should leaderrun have frozen between
        // saying so and sending its SIGTERM, the token is still there and
        // the command still gets exactly one.
        if self.tree().terminate() {
            self.said_terminate(stopping);
        }
        end_stopped_leaderrun(&self.o, self.lr_pid);
    }

    fn kill(&mut self, report: bool) {
        let epoch = self.o.epoch;
        let t = self.tree();
        if report && t.alive() {
            tracing::warn!(
                event = "watchdog_stop",
                epoch,
                "the command still runs at the kill deadline: SIGKILL"
            );
        }
        t.kill();
    }

    fn freeze_and_kill(&mut self) -> bool {
        self.tree().freeze_and_kill()
    }

    fn alive(&mut self) -> bool {
        self.tree().alive()
    }

    fn orphaned(&mut self) -> bool {
        let t = self.tree();
        // leaderrun's descendants have passed to init: the cgroup, the
        // group (by its leader's pidfd) and the last good look are what is
        // left to find them by.
        t.root = None;
        // A cgroup that was planned but is not there (leaderrun died before
        // making it, or could not make it and its word of that was lost)
        // proves nothing about where the command runs.
        if !t.cgroup.as_ref().is_some_and(Cgroup::exists) {
            t.cgroup = None;
        }
        t.cgroup.is_some()
    }

    fn remove_cgroup(&mut self) {
        if let Some(cg) = self.tree.as_ref().and_then(|t| t.cgroup.as_ref()) {
            cg.remove();
        }
    }

    fn release(&mut self, until: Stamp, keep: Duration) {
        let epoch = self.o.epoch;
        match hand_back(&self.o, until, keep) {
            Ok(true) => tracing::warn!(
                event = "watchdog_release",
                epoch,
                "leaderrun died; the command was stopped and the lease released"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                event = "watchdog_release",
                epoch,
                "leaderrun died; the command was stopped, but the lease could not be released ({e}); it will expire"
            ),
        }
    }

    fn leave_to_expire(&mut self, why: Why) {
        let epoch = self.o.epoch;
        match why {
            Why::Survived => tracing::warn!(
                event = "watchdog_release",
                epoch,
                "leaderrun died and the command's processes would not die in time; \
                 the lease is left to expire"
            ),
            // Without a cgroup, only what the watchdog saw was stopped: with
            // its view of the command lost, a renewal's look missed (the
            // last good look is then more than `R` old), or a process of
            // that look gone by itself since (a child it forked went to
            // init, unseen), a descendant may run on.
            Why::Unseen => tracing::warn!(
                event = "watchdog_release",
                epoch,
                "leaderrun died while the watchdog could not see the command's processes \
                 (it was delayed, or the command had not started); what it saw was stopped, \
                 and the lease is left to expire"
            ),
        }
    }
}

/// The give-up deadline has passed without a renewal: if leaderrun is
/// stopped while it holds its lease's file on the embedded store (a SIGSTOP
/// in the half millisecond of a renewal), nobody can use that lease until it
/// is continued, which may be never. Its lease is lost from now on anyway,
/// so it is ended as a kill -9 would end it, and the watchdog's own path
/// after leaderrun's death stops the command and hands the lease back: a
/// rival leads at about `G`, not at the lease's end (docs/stores.md, "The
/// embedded store in detail"). A leaderrun stopped anywhere else is left
/// alone: it holds up nobody, and after SIGCONT its run ends as a loss.
fn end_stopped_leaderrun(o: &Orders, pid: i32) {
    if pid <= 0 {
        return;
    }
    let store = crate::store::resolve(
        o.store.clone().map(crate::redact::Secret::into_exposed),
        o.origin,
        "leaderrun watchdog",
        o.timing.call_cap(),
    );
    if let Ok(crate::store::Store::Sqlite(s)) = store {
        if s.end_stopped_holder(&o.name, pid) {
            tracing::warn!(
                event = "watchdog_stop",
                epoch = o.epoch,
                "leaderrun was stopped while it held the file of lease {}: ended, so that the lease can be handed back",
                o.name
            );
        }
    }
}

/// Why the watchdog could not try to hand the lease back.
#[derive(Debug, thiserror::Error)]
enum ReleaseError {
    #[error("cannot start a runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::store::ResolveError),
}

/// Hand the lease back at the orders' epoch, retried as leaderrun retries
/// it (elector.rs, `hand_back_until`), until `until` (on a store whose
/// failover re-extends leases, a lease later), keeping it `keep` longer.
/// The watchdog's one store call: true when the lease was freed.
fn hand_back(o: &Orders, until: Stamp, keep: Duration) -> Result<bool, ReleaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ReleaseError::Runtime)?;
    rt.block_on(async {
        let t = o.timing;
        let store = crate::store::resolve(
            o.store.clone().map(crate::redact::Secret::into_exposed),
            o.origin,
            "leaderrun watchdog",
            t.call_cap(),
        )?;
        let mut until = until;
        if store.capabilities().failover_extends_lease {
            until += t.lease;
        }
        let clock = crate::clock::BootClock;
        let lock = store.lock(o.name.clone(), o.holder.clone());
        let mut e = crate::elector::Elector::new(lock, clock, t);
        Ok(e.hand_back_until(o.epoch, keep, until).await)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn world(token: TermToken) -> Real {
        Real {
            o: Orders {
                store: None,
                origin: crate::store::Origin::Flag,
                name: "n".into(),
                holder: "h".into(),
                epoch: 1,
                timing: crate::timing::Timing::resolve(Default::default()).expect("defaults"),
                min_hold: None,
                acquired_at: Stamp::ORIGIN,
                sent: Stamp::ORIGIN,
                verbose: 0,
                quiet: true,
                json: false,
            },
            tree: None,
            leaderrun: None,
            token,
            me: std::process::id() as i32,
            lr_pid: 0,
        }
    }

    /// The watchdog's SIGTERM goes out only when it wins the token: once
    /// leaderrun has taken it (it is stopping the command itself), the
    /// command gets no second SIGTERM from the watchdog.
    #[test]
    fn the_watchdogs_sigterm_goes_out_only_with_the_token() {
        for leaderrun_took_it in [true, false] {
            let (mut ours, theirs) = TermToken::new().expect("a token");
            let mut c = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("sleep");
            let pid = c.id() as i32;
            let start = crate::tree::proc_entry(pid).expect("in /proc").start;
            let mut w = world(TermToken::from_fd(theirs));
            w.watch();
            assert!(w.hold_leader(pid, start));
            if leaderrun_took_it {
                assert!(ours.take());
            }
            w.terminate(leaderrun_took_it);
            std::thread::sleep(Duration::from_millis(100));
            let st = c.try_wait().expect("wait");
            if leaderrun_took_it {
                assert_eq!(st, None, "the watchdog sent SIGTERM without the token");
                let _ = c.kill();
                let _ = c.wait();
            } else {
                let st = st.or_else(|| c.wait().ok());
                assert_eq!(st.and_then(|s| s.signal()), Some(nix::libc::SIGTERM));
                assert!(!ours.take(), "leaderrun still got the token");
            }
        }
    }
}
