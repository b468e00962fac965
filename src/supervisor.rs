//! The child: spawn, environment, signals, TERM→KILL, exit status.
//!
//! The supervisor knows nothing of stores or leases; it is told an
//! environment to add and, on loss, when SIGKILL is due.
//!
//! Contract §2.7, enforced in [`spawn`]:
//! * the command runs from argv, never through a shell;
//! * in its own process group, so the *whole* group can be signalled (a shell
//!   script's own children included), and a terminal's Ctrl-C reaches it only
//!   through leaderrun, once;
//! * with `PR_SET_PDEATHSIG = SIGKILL`, so it dies with leaderrun even on
//!   `kill -9`. Linux delivers that signal when the *thread* that forked the
//!   child exits, not the process: leaderrun therefore runs a single-threaded
//!   runtime and spawns from the main thread, which lives as long as the
//!   process. The parent pid is re-checked after arming it, closing the race
//!   where leaderrun died between fork and prctl;
//! * with a guard process (guard.rs) that kills the whole group should
//!   leaderrun itself be killed, since the parent-death signal reaches only
//!   the child, not what the child started;
//! * with default dispositions for every signal and an empty signal mask:
//!   dispositions set to "ignore" survive `exec` (a shell's background job
//!   starts with SIGINT and SIGQUIT ignored), and a child that cannot trap
//!   SIGTERM cannot clean up.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::clock::{Clock, Stamp};
use crate::exit;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("command not found: {0}")]
    NotFound(String),
    #[error("command not executable: {0}")]
    NotExecutable(String),
}

impl SpawnError {
    pub fn exit_code(&self) -> i32 {
        match self {
            SpawnError::NotFound(_) => exit::NOT_FOUND,
            SpawnError::NotExecutable(_) => exit::NOT_EXECUTABLE,
        }
    }
}

pub struct Child {
    inner: tokio::process::Child,
    /// The child's pid, which is also its process group id.
    pgid: Pid,
    /// Kills the group should leaderrun die without cleaning up.
    _guard: Option<crate::guard::Guard>,
}

/// Find out, before any lease is taken, whether `argv[0]` can be run at all,
/// so a typo in a crontab costs no epoch and holds no lease. (The spawn
/// itself still reports 126/127 for what changes in between.)
pub fn check_command(argv: &[OsString]) -> Result<(), SpawnError> {
    use nix::unistd::{access, AccessFlags};
    use std::path::{Path, PathBuf};
    let Some(program) = argv.first().filter(|p| !p.is_empty()) else {
        return Err(SpawnError::NotFound("(empty command)".into()));
    };
    let shown = program.to_string_lossy().into_owned();
    let runnable = |p: &Path| p.is_file() && access(p, AccessFlags::X_OK).is_ok();
    if program.as_encoded_bytes().contains(&b'/') {
        let p = Path::new(program);
        return if !p.exists() {
            Err(SpawnError::NotFound(shown))
        } else if runnable(p) {
            Ok(())
        } else {
            Err(SpawnError::NotExecutable(format!(
                "{shown}: permission denied or not a file"
            )))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let candidates: Vec<PathBuf> = std::env::split_paths(&path)
        .map(|d| d.join(program))
        .collect();
    if candidates.iter().any(|c| runnable(c)) {
        Ok(())
    } else if candidates.iter().any(|c| c.exists()) {
        Err(SpawnError::NotExecutable(format!(
            "{shown}: permission denied"
        )))
    } else {
        Err(SpawnError::NotFound(shown))
    }
}

/// Start `argv` with `env` added to leaderrun's own environment.
pub fn spawn(argv: &[OsString], env: &[(&str, String)]) -> Result<Child, SpawnError> {
    let shown = argv
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((program, args)) = argv.split_first() else {
        return Err(SpawnError::NotFound("(empty command)".into()));
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // leaderrun speaks to systemd for the unit; the child must not (its
    // READY=1 would be taken as leaderrun's under NotifyAccess=all).
    cmd.env_remove("NOTIFY_SOCKET");
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs between fork and exec in the child and calls
    // only async-signal-safe functions (prctl, getppid, sigaction,
    // sigprocmask, kill); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                // leaderrun is already gone: do not run unsupervised.
                let _ = nix::sys::signal::raise(Signal::SIGKILL);
            }
            for sig in Signal::iterator() {
                if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
                    let _ = nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl);
                }
            }
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&nix::sys::signal::SigSet::empty()),
                None,
            )?;
            Ok(())
        });
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(false);
    match cmd.spawn() {
        Ok(inner) => {
            let pgid = Pid::from_raw(inner.id().map(|p| p as i32).unwrap_or(0));
            Ok(Child {
                inner,
                pgid,
                _guard: crate::guard::Guard::start(pgid),
            })
        }
        Err(e) => Err(match (e.kind(), e.raw_os_error()) {
            (std::io::ErrorKind::NotFound, _) => SpawnError::NotFound(shown),
            (_, Some(code)) if code == Errno::ENOTDIR as i32 => SpawnError::NotFound(shown),
            _ => SpawnError::NotExecutable(format!("{shown}: {e}")),
        }),
    }
}

/// The exit status as a shell reports it: the code, or `128 + N` for a signal.
pub fn status_code(st: ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => exit::for_signal(s),
        (None, None) => exit::FAILURE,
    }
}

impl Child {
    pub fn pid(&self) -> i32 {
        self.pgid.as_raw()
    }

    /// Signal the whole group. A group that is already gone is fine.
    pub fn signal(&self, sig: Signal) {
        match killpg(self.pgid, sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(
                event = "signal_failed",
                "cannot send {sig} to process group {}: {e}",
                self.pgid
            ),
        }
    }

    /// Wait for the child itself to exit (cancel-safe).
    pub async fn wait(&mut self) -> ExitStatus {
        loop {
            match self.inner.wait().await {
                Ok(st) => return st,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!(event = "wait_failed", "cannot wait for the child: {e}");
                    return ExitStatus::from_raw(exit::FAILURE << 8);
                }
            }
        }
    }

    /// SIGTERM to the group now, SIGKILL at `kill_at` (at once when that has
    /// passed), then reap. Signals that arrive meanwhile are still forwarded.
    pub async fn stop<C: Clock>(
        &mut self,
        clock: &C,
        kill_at: Stamp,
        forward: &mut UnboundedReceiver<Signal>,
    ) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        let mut killed = false;
        loop {
            tokio::select! {
                biased;
                st = self.wait() => {
                    self.sweep_group(clock, kill_at).await;
                    return st;
                }
                _ = clock.sleep_until(kill_at), if !killed => {
                    tracing::warn!(event = "kill", pid = self.pid(), "child still running at the kill deadline: SIGKILL to its process group");
                    self.signal(Signal::SIGKILL);
                    killed = true;
                }
                Some(sig) = forward.recv() => self.signal(sig),
            }
        }
    }

    /// After the child itself exited: processes it left in its group (a
    /// backgrounded `&` job) must not outlive it unsupervised. TERM, then
    /// KILL at `kill_at`.
    pub async fn sweep_group<C: Clock>(&self, clock: &C, kill_at: Stamp) {
        if !group_alive(self.pgid) {
            return;
        }
        tracing::warn!(
            event = "group_swept",
            pgid = self.pgid.as_raw(),
            "the child left processes in its group; stopping them"
        );
        self.signal(Signal::SIGTERM);
        while group_alive(self.pgid) {
            if clock.now() >= kill_at {
                self.signal(Signal::SIGKILL);
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether any process of the group is still running. Zombies do not count:
/// an orphan's zombie waits for init to reap it and runs nothing, but it
/// still answers `kill(-pgid, 0)`.
fn group_alive(pgid: Pid) -> bool {
    if killpg(pgid, None).is_err() {
        return false;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .any(|stat| {
            // "pid (comm) state ppid pgrp ...": comm may contain spaces and
            // parentheses, so parse from the last ')'.
            let mut f = stat.rsplit(')').next().unwrap_or("").split_whitespace();
            let state = f.next();
            let pgrp = f.nth(1).and_then(|p| p.parse::<i32>().ok());
            pgrp == Some(pgid.as_raw()) && state != Some("Z")
        })
}
