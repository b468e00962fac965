//! Running in the foreground of a terminal.
//!
//! The command runs in a process group of its own (so that the whole group
//! can be stopped). Left alone, that group would be a *background* job of
//! the terminal: a `read` from the keyboard stops it with SIGTTIN, and the
//! terminal's Ctrl-C and Ctrl-Z would go to leaderrun instead. So when
//! leaderrun is the terminal's foreground job, it hands the terminal to the
//! command's group for as long as the command runs, exactly as a shell does
//! for a job, and takes it back afterwards.
//!
//! Ctrl-Z then stops the command. leaderrun takes the terminal back and
//! stops itself too, so that the shell sees the job as stopped and returns
//! to its prompt; `fg` continues leaderrun, which hands the terminal back
//! and continues the command. While leaderrun is stopped it cannot renew:
//! the watchdog stops the command at the give-up deadline as it would for
//! any frozen leaderrun, and leaderrun, continued, finds the lease lost.
//!
//! Started in the background (`leaderrun … &`), the command stays in the
//! background too; if it stops on a read from the terminal, leaderrun stops
//! with it, and `fg` brings both to the foreground.
//!
//! Under cron, systemd or a pipe there is no terminal and nothing here
//! applies.

use std::os::fd::{BorrowedFd, RawFd};

use nix::sys::signal::{killpg, signal, SigHandler, Signal};
use nix::unistd::{getpgrp, isatty, tcgetpgrp, tcsetpgrp, Pid};

#[derive(Debug, Clone, Copy)]
pub struct Terminal {
    fd: RawFd,
    own: Pid,
}

fn borrow(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: fds 0-2 stay open for the life of the process; leaderrun never
    // closes them.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Terminal {
    /// leaderrun's controlling terminal, on stdin, stdout or stderr, if it
    /// has one. leaderrun need not be its foreground job: started with `&`,
    /// it is handed the terminal later, by `fg`.
    pub fn attached() -> Option<Terminal> {
        let own = getpgrp();
        let fd = [0, 1, 2]
            .into_iter()
            .find(|&fd| isatty(fd).unwrap_or(false) && tcgetpgrp(borrow(fd)).is_ok())?;
        // Once the command's group holds the terminal, leaderrun is in the
        // background: taking the terminal back must not stop it. The child
        // resets this to the default before exec.
        // SAFETY: setting a disposition to SIG_IGN runs no code of ours.
        let _ = unsafe { signal(Signal::SIGTTOU, SigHandler::SigIgn) };
        Some(Terminal { fd, own })
    }

    /// Whether leaderrun's job is the terminal's foreground job now.
    pub fn is_ours(&self) -> bool {
        tcgetpgrp(borrow(self.fd)).ok() == Some(self.own)
    }

    /// The descriptor the child uses to take the terminal itself (between
    /// fork and exec, so that it never runs a moment in the background).
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    pub fn give(&self, pgid: Pid) {
        let _ = tcsetpgrp(borrow(self.fd), pgid);
    }

    /// Take the terminal back from `pgid`, if it has it.
    pub fn take_back(&self, pgid: Pid) {
        if tcgetpgrp(borrow(self.fd)).ok() == Some(pgid) {
            let _ = tcsetpgrp(borrow(self.fd), self.own);
        }
    }

    /// The command's group was stopped by the terminal (Ctrl-Z, or a read
    /// or write while in the background): stop leaderrun's own job the same
    /// way, so the shell sees the job stopped. When it is continued (`fg`
    /// or `bg`), continue the command, with the terminal if the shell gave
    /// it to leaderrun.
    pub fn suspend_with(&self, pgid: Pid, sig: Signal) {
        self.take_back(pgid);
        // leaderrun ignores SIGTTOU (see `attached`): a stop on output is
        // passed on as one on input.
        let sig = if sig == Signal::SIGTTOU {
            Signal::SIGTTIN
        } else {
            sig
        };
        // Delivered before kill() returns: this process stops here and runs
        // on once continued.
        let _ = killpg(self.own, sig);
        if self.is_ours() {
            self.give(pgid);
        }
        let _ = killpg(pgid, Signal::SIGCONT);
    }
}
