//! leaderrun's side: starting a watchdog, giving it its orders, waiting for
//! its `ready`, telling it what happens, and replacing it when it dies.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::orders::{Msg, Orders, Start};
use super::{ARG, READY};
use crate::clock::{boottime_now, Stamp};
use crate::stop::StopPlan;
use crate::tree::{Cgroup, TermToken};

/// Why leaderrun has no watchdog: the command must then not start (or,
/// when a replacement cannot be had, must be stopped).
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    /// The process could not be created (fork, exec, or its pipes).
    #[error(transparent)]
    Start(#[from] crate::fork::ForkError),
    /// Its pipes could not be set up or written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The orders could not be put into words (a duration past the wire's
    /// range; timing.rs bounds them far below).
    #[error("the orders could not be encoded: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the watchdog did not confirm its orders before the give-up deadline")]
    NoAnswer,
    #[error("the watchdog exited before confirming its orders")]
    Exited,
    #[error("the watchdog answered nonsense")]
    Nonsense,
    /// A replacement was asked for before any orders were given.
    #[error("there are no orders to give a replacement")]
    NoOrders,
    /// The SIGTERM token cannot be handed to a replacement.
    #[error("the SIGTERM token cannot be shared")]
    NoToken,
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
    /// The orders, with the latest renewal: what a replacement is given.
    orders: Option<Orders>,
    /// What was said since that a replacement must know: the last
    /// `spawning` or `child`, and `stopping`.
    said: Vec<Msg>,
}

impl Watchdog {
    /// Start the watchdog and give it its orders. An error means leaderrun
    /// must not start the command: it would run with one guard, not two.
    pub fn start(orders: &Orders) -> Result<Watchdog, WatchdogError> {
        Watchdog::spawn(&orders.name)?.give(orders)
    }

    /// Start the watchdog process without orders, so that its exec and
    /// start-up overlap the first acquire. Until [`Watchdog::give`] it only
    /// waits on its pipe; dropped unused (the lease was held elsewhere), it
    /// is killed and reaped. What the contract needs is unchanged: the
    /// command starts only after `give` returned, which is after the
    /// watchdog said it holds its orders (§10).
    pub fn spawn(name: &str) -> Result<Watchdog, WatchdogError> {
        let (token, theirs) = TermToken::new()?;
        Watchdog::spawn_with(name, token, theirs.as_fd())
    }

    fn spawn_with(
        name: &str,
        token: TermToken,
        theirs: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Watchdog, WatchdogError> {
        let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let (ack_rd, ack_wr) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
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
            Signal::SIGPIPE,
        ]
        .map(|s| s as i32);
        let extra = [
            me.as_ref().map_or(-1, |f| f.as_raw_fd()),
            theirs.as_raw_fd(),
        ];
        let starting =
            crate::fork::spawn_detached(&prog, rd.as_raw_fd(), ack_wr.as_raw_fd(), &extra, &deaf)?;
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
    pub fn give(self, orders: &Orders) -> Result<Watchdog, WatchdogError> {
        self.give_with(orders, Vec::new())
    }

    /// [`Watchdog::give`], with what leaderrun has said since the orders
    /// (a replacement's case) in the same line, applied before `ready`.
    fn give_with(mut self, orders: &Orders, said: Vec<Msg>) -> Result<Watchdog, WatchdogError> {
        if let Some(s) = self.starting.take() {
            self.pid = Some(s.confirm()?);
        }
        let line = Start::new(orders.clone(), said)
            .encode()
            .map_err(WatchdogError::Encode)?;
        // The orders fit in the pipe's buffer; write them while the pipe is
        // still blocking, then make it non-blocking for the updates.
        self.send_blocking(&line)?;
        self.orders = Some(orders.clone());
        if let Some(p) = &self.pipe {
            set_nonblocking(p)?;
        }
        let Some(ack) = &self.ack else {
            return Err(WatchdogError::Exited);
        };
        let deadline = StopPlan::new(orders.sent, orders.timing).give_up_at();
        await_ready(ack, deadline)?;
        set_nonblocking(ack)?;
        Ok(self)
    }

    /// Start a replacement with the current orders (latest renewal) and
    /// everything said since; the same SIGTERM token goes with it.
    pub fn replace(&self) -> Result<Watchdog, WatchdogError> {
        let Some(orders) = &self.orders else {
            return Err(WatchdogError::NoOrders);
        };
        let Some(theirs) = self.token.share() else {
            return Err(WatchdogError::NoToken);
        };
        // What was said goes inside the orders, so that `ready` means the
        // replacement knows the command (a line sent after it could meet a
        // leaderrun frozen in between). The first watchdog's first look
        // comes with the first renewal, while the command has only just
        // started; a replacement's would come an `R` into a command that
        // may long have started others: it looks at once.
        let mut said = self.said.clone();
        said.push(Msg::Look);
        let mut w = Watchdog::spawn_with(&orders.name, self.token.clone(), theirs)?
            .give_with(orders, said)?;
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

    /// One message; never blocks (each is far below PIPE_BUF, so it is
    /// written whole or not at all).
    fn send(&mut self, msg: &Msg) {
        let Some(p) = &self.pipe else { return };
        let line = match msg.encode() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(event = "watchdog_failed", "cannot tell the watchdog ({e})");
                return;
            }
        };
        match nix::unistd::write(p.as_fd(), line.as_bytes()) {
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
        let m = Msg::Spawning {
            cgroup: cgroup.map(|c| c.path().to_path_buf()),
        };
        self.send(&m);
        self.said = vec![m];
    }

    /// The command started: what to stop. Its start time goes with its pid,
    /// so that the watchdog can tell it from a process that took the pid
    /// after it was reaped.
    pub fn child(&mut self, pid: Pid, start: u64, cgroup: Option<&Cgroup>) {
        let m = Msg::Child {
            pid: pid.as_raw(),
            start,
            cgroup: cgroup.map(|c| c.path().to_path_buf()),
        };
        self.send(&m);
        self.said = vec![m];
    }

    /// A renewal succeeded: it was sent at `sent`, and the deadlines count
    /// from there.
    pub fn renewed(&mut self, sent: Stamp) {
        if let Some(o) = &mut self.orders {
            o.sent = o.sent.max(sent);
        }
        self.send(&Msg::Renewed { sent });
    }

    /// leaderrun has started stopping the command itself: the watchdog
    /// keeps the kill deadline, and (the SIGTERM token being leaderrun's)
    /// sends no SIGTERM of its own.
    pub fn stopping(&mut self) {
        self.send(&Msg::Stopping);
        self.said.push(Msg::Stopping);
    }

    /// Everything the command started is gone: the watchdog leaves without
    /// touching anything. leaderrun, its reaper, waits for it to exit and
    /// reaps it when this handle is dropped.
    pub fn done(&mut self) {
        self.send(&Msg::Done);
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

/// Wait on `ack` for the watchdog's `ready`, until `deadline` (the give-up
/// deadline: past it the command could not start anyway). Anything else
/// (end-of-file, other bytes, no answer in time) means no command.
pub(super) fn await_ready(ack: &OwnedFd, deadline: Stamp) -> Result<(), WatchdogError> {
    let mut got = Vec::new();
    while got.len() < READY.len() {
        let left = deadline - boottime_now();
        if left.is_zero() || !wait_readable(ack, Some(left)) {
            return Err(WatchdogError::NoAnswer);
        }
        let mut b = [0u8; 16];
        match nix::unistd::read(ack.as_raw_fd(), &mut b[..READY.len() - got.len()]) {
            Ok(0) => return Err(WatchdogError::Exited),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    if got != READY {
        return Err(WatchdogError::Nonsense);
    }
    Ok(())
}

pub(super) fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let fl = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
    let fl = OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(fl))?;
    Ok(())
}

/// Wait until `fd` is readable (data, end-of-file or error), for at most
/// `limit` (None: no limit). True when it is.
pub(super) fn wait_readable(fd: &impl AsFd, limit: Option<Duration>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let until = limit.map(|l| boottime_now() + l);
    loop {
        let t = match until {
            None => PollTimeout::NONE,
            Some(u) => {
                let left = (u - boottime_now()).as_millis();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("a pipe")
    }

    fn soon() -> Stamp {
        boottime_now() + Duration::from_secs(5)
    }

    /// `ready` is the only answer that lets the command start: a watchdog
    /// that exits without it (it could not take its orders), one that says
    /// something else, and one that says nothing before the give-up
    /// deadline all mean no command.
    #[test]
    fn only_ready_lets_the_command_start() {
        let (rd, wr) = pipe();
        nix::unistd::write(&wr, READY).expect("write");
        assert!(await_ready(&rd, soon()).is_ok());

        // In pieces, as a pipe may deliver it.
        let (rd, wr) = pipe();
        nix::unistd::write(&wr, b"rea").expect("write");
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            nix::unistd::write(&wr, b"dy\n").expect("write");
        });
        assert!(await_ready(&rd, soon()).is_ok());
        t.join().expect("writer");

        let (rd, wr) = pipe();
        drop(wr);
        assert!(matches!(
            await_ready(&rd, soon()),
            Err(WatchdogError::Exited)
        ));

        let (rd, wr) = pipe();
        nix::unistd::write(&wr, b"ready?").expect("write");
        assert!(matches!(
            await_ready(&rd, soon()),
            Err(WatchdogError::Nonsense)
        ));

        let (rd, _wr) = pipe();
        let t0 = boottime_now();
        let r = await_ready(&rd, t0 + Duration::from_millis(50));
        assert!(matches!(r, Err(WatchdogError::NoAnswer)), "{r:?}");
        assert!(boottime_now() - t0 >= Duration::from_millis(50));
        // Already past the deadline: no wait at all.
        let (rd, wr) = pipe();
        nix::unistd::write(&wr, READY).expect("write");
        assert!(matches!(await_ready(&rd, t0), Err(WatchdogError::NoAnswer)));
    }

    /// The messages users see are the ones they saw before the errors had
    /// a type.
    #[test]
    fn the_errors_read_as_before() {
        assert_eq!(
            WatchdogError::NoAnswer.to_string(),
            "the watchdog did not confirm its orders before the give-up deadline"
        );
        assert_eq!(
            WatchdogError::Exited.to_string(),
            "the watchdog exited before confirming its orders"
        );
        let io = std::io::Error::from_raw_os_error(nix::libc::EPIPE);
        let shown = io.to_string();
        assert_eq!(WatchdogError::from(io).to_string(), shown);
    }
}
