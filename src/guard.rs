//! The guard: the child's process group dies even when leaderrun is
//! `kill -9`ed.
//!
//! The parent-death signal (see supervisor.rs) reaches only the child itself.
//! A shell script's own children — the `python job.py` it is waiting for —
//! would be orphaned and keep running without a lease. So next to the child
//! leaderrun forks a tiny guard process that blocks reading a pipe whose only
//! write end leaderrun holds. When leaderrun dies, however it dies, the kernel
//! closes that end, the guard reads end-of-file and SIGKILLs the child's whole
//! process group. On a normal exit leaderrun first writes one byte ("disarm")
//! and the guard leaves without signalling anything, so a recycled process
//! group id is never hit.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::signal::{killpg, signal, SigHandler, Signal};
use nix::unistd::{fork, ForkResult, Pid};

pub struct Guard {
    disarm: Option<OwnedFd>,
}

impl Guard {
    /// Start a guard for process group `pgid`. Returns `None` (and leaderrun
    /// carries on, with the parent-death signal alone) when the pipe or the
    /// fork fails.
    pub fn start(pgid: Pid) -> Option<Guard> {
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
        // SAFETY: leaderrun may have other threads (tokio's blocking pool), so
        // between fork and _exit the guard calls only async-signal-safe
        // functions: close, sigaction, read, kill, _exit. It allocates nothing.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                // Hold nothing of leaderrun's: not the write end (or EOF would
                // never come), not stdout/stderr (a cron job's output pipe
                // would stay open), not the store connection.
                let keep = read_end.as_raw_fd();
                for fd in 0..1024 {
                    if fd != keep {
                        // SAFETY: close is async-signal-safe; these fds are
                        // this process's copies, owned by nothing here.
                        unsafe { nix::libc::close(fd) };
                    }
                }
                std::mem::forget(write_end);
                for sig in crate::signals::FORWARDED {
                    // SAFETY: sigaction is async-signal-safe.
                    let _ = unsafe { signal(sig, SigHandler::SigDfl) };
                }
                let mut buf = [0u8; 1];
                let disarmed = loop {
                    match nix::unistd::read(read_end.as_raw_fd(), &mut buf) {
                        Ok(0) => break false,
                        Ok(_) => break true,
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(_) => break false,
                    }
                };
                if !disarmed {
                    let _ = killpg(pgid, Signal::SIGKILL);
                }
                // SAFETY: _exit skips atexit handlers and stdio flushing,
                // which belong to leaderrun, not to this copy of it.
                unsafe { nix::libc::_exit(0) }
            }
            Ok(ForkResult::Parent { .. }) => Some(Guard {
                disarm: Some(write_end),
            }),
            Err(e) => {
                tracing::warn!(event = "guard_failed", "cannot start the guard process ({e}); relying on the parent-death signal alone");
                None
            }
        }
    }

    /// The child's group is gone or stopped on purpose: let the guard go.
    pub fn disarm(&mut self) {
        if let Some(fd) = self.disarm.take() {
            let _ = nix::unistd::write(&fd, b"d");
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.disarm();
    }
}
