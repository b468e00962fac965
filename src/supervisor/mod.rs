//! The child: spawn, environment, signals, TERM→KILL, exit status.
//!
//! The supervisor knows nothing of stores or leases; it is told an
//! environment to add and, on loss, when SIGKILL is due.
//!
//! docs/contract.md §7 and §11, enforced in [`spawn`]:
//! * the command runs from argv, never through a shell;
//! * in its own process group, so the *whole* group can be signalled (a shell
//!   script's own children included), and in a cgroup of its own where one
//!   can be made, so that descendants which leave the group are found too
//!   (tree.rs). It starts inside the cgroup (fork.rs), before it can
//!   start anything;
//! * with `PR_SET_PDEATHSIG = SIGKILL`, so it dies with leaderrun even on
//!   `kill -9`. Linux delivers that signal when the *thread* that forked the
//!   child exits, not the process: leaderrun therefore spawns from the main
//!   thread, which lives as long as the process. The parent pid is
//!   re-checked after arming it, closing the race where leaderrun died
//!   between fork and prctl. What the command starts is the watchdog's
//!   (src/watchdog/) to stop;
//! * in the foreground of leaderrun's terminal, if leaderrun has one
//!   (terminal.rs);
//! * with default dispositions for every signal and an empty signal mask:
//!   dispositions set to "ignore" survive `exec` (a shell's background job
//!   starts with SIGINT and SIGQUIT ignored), and a child that cannot trap
//!   SIGTERM cannot clean up. The one exception is SIGHUP ignored by
//!   `nohup`, which is kept, as `nohup ./job` alone would keep it.
//!
//! leaderrun reaps its children itself (`waitpid(-1)` on SIGCHLD) rather
//! than through tokio: as a child subreaper it must also reap the orphans it
//! adopts, and it must see the command *stop* (job control), not only exit.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::clock::Clock;
use crate::exit::{self, Exit};
use crate::fork::{self, Program};
use crate::stop::{Step, Stop, ROUND};
use crate::terminal::Terminal;
use crate::tree::{Cgroup, Held, Root, TermToken, Tree};

mod lookup;
pub use lookup::check_command;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("command not found: {0}")]
    NotFound(String),
    #[error("command not executable: {0}")]
    NotExecutable(String),
    /// The file exists but its `#!` line names an interpreter that cannot
    /// run: the status a shell gives (127 missing, 126 not executable) with
    /// what is wrong, never a bare "command not found".
    #[error("cannot run {0}")]
    Interpreter(String, i32),
    /// The give-up deadline passed between the fork and the exec: the
    /// lease may already be someone else's, so the command never ran.
    #[error("the give-up deadline passed before the command could start (frozen?)")]
    PastDeadline,
    /// The system refused a step of the start (`what` says which).
    #[error("command not executable: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The command could not be put into an exec's terms (`what`: it).
    #[error("command not executable: {what}: {source}")]
    Prepare {
        what: String,
        #[source]
        source: fork::ForkError,
    },
}

impl SpawnError {
    pub fn exit(&self) -> Exit {
        match self {
            SpawnError::NotFound(_) => Exit::NotFound,
            SpawnError::NotExecutable(_) | SpawnError::Io { .. } | SpawnError::Prepare { .. } => {
                Exit::NotExecutable
            }
            SpawnError::Interpreter(_, code) if *code == exit::NOT_FOUND => Exit::NotFound,
            SpawnError::Interpreter(..) => Exit::NotExecutable,
            SpawnError::PastDeadline => Exit::Lost,
        }
    }
}

pub struct Child {
    /// The child's pid, which is also its process group id.
    pid: Pid,
    /// Everything it started.
    tree: Tree,
    exited: Option<ExitStatus>,
    stopped: bool,
    sigchld: tokio::signal::unix::Signal,
    terminal: Option<Terminal>,
}

/// How to start the command, beyond its argv and environment.
pub struct Placement {
    /// A cgroup to start it in (created by the caller; removed here when the
    /// child turns out not to be in it).
    pub cgroup: Option<Cgroup>,
    /// The terminal to hand it, when leaderrun is in the foreground of one.
    pub terminal: Option<Terminal>,
    /// The watchdog, in case it is a descendant after all (tree.rs).
    pub skip: Option<Pid>,
    /// SIGHUP was ignored when leaderrun started (`nohup`): keep it so.
    pub keep_hup_ignored: bool,
    /// The right to send a stop's SIGTERM, shared with the watchdog.
    pub token: TermToken,
    /// The give-up deadline on the boot clock: a child that reaches its
    /// exec later (leaderrun was frozen around the fork) does not exec.
    pub deadline: crate::clock::Stamp,
}

/// Start `argv` with `env` added to leaderrun's own environment; `file` is
/// what [`check_command`] found for `argv[0]`, which the command still sees
/// as its `argv[0]`.
pub fn spawn(
    argv: &[OsString],
    file: &std::path::Path,
    env: &[(&str, String)],
    place: Placement,
) -> Result<Child, SpawnError> {
    let shown = argv
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The cgroup was made for this command: on every way out without one
    // it goes (an empty cgroup left behind is never removed by anyone).
    let unmade = |e: SpawnError| {
        if let Some(cg) = &place.cgroup {
            cg.remove();
        }
        e
    };
    if argv.is_empty() {
        return Err(unmade(SpawnError::NotFound("(empty command)".into())));
    }
    // Listen before the child exists, so that no SIGCHLD is missed.
    let sigchld =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).map_err(|e| {
            unmade(SpawnError::Io {
                what: "cannot watch for the child".into(),
                source: e,
            })
        })?;
    // The file check_command found, under the name the user gave; execvpe
    // still runs a script without `#!` with /bin/sh, as before.
    let prog = Program::new(file, argv, fork::command_env(env)).map_err(|e| {
        unmade(SpawnError::Prepare {
            what: shown.clone(),
            source: e,
        })
    })?;
    // The terminal is handed over only when leaderrun's job holds it.
    let tty_fd = place
        .terminal
        .filter(Terminal::is_ours)
        .map_or(-1, |t| t.fd());
    let parent = nix::unistd::getpid();
    let setup = fork::Setup {
        cgroup: place.cgroup.as_ref(),
        tty_fd,
        keep_hup_ignored: place.keep_hup_ignored,
        parent,
        deadline: place.deadline,
    };
    let started = match fork::spawn(&prog, &setup) {
        Ok(s) => s,
        Err(e) => {
            if let Some(cg) = &place.cgroup {
                cg.remove();
            }
            if e.raw_os_error() == Some(fork::PAST_DEADLINE) {
                return Err(SpawnError::PastDeadline);
            }
            // ENOENT for a file that exists is its #! interpreter missing
            // (it may have changed since check_command looked).
            if e.kind() == std::io::ErrorKind::NotFound {
                if let Err(why @ SpawnError::Interpreter(..)) = check_command(argv) {
                    return Err(why);
                }
            }
            return Err(match (e.kind(), e.raw_os_error()) {
                (std::io::ErrorKind::NotFound, _) => SpawnError::NotFound(shown),
                (_, Some(code)) if code == Errno::ENOTDIR as i32 => SpawnError::NotFound(shown),
                _ => SpawnError::Io {
                    what: shown,
                    source: e,
                },
            });
        }
    };
    let pid = started.pid;
    let cgroup = place.cgroup.and_then(|cg| {
        if started.in_cgroup {
            Some(cg)
        } else {
            cg.remove();
            None
        }
    });
    if let Some(t) = place.terminal.filter(Terminal::is_ours) {
        t.give(pid);
    }
    // Held while it is our unreaped child: its pid is still its own.
    let mut tree = Tree::new(Some(Held::child(pid.as_raw())), cgroup, Some(Root::Me));
    tree.unreaped = true;
    tree.skip.set(place.skip.map(Pid::as_raw));
    tree.token = place.token;
    Ok(Child {
        pid,
        tree,
        exited: None,
        stopped: false,
        sigchld,
        terminal: place.terminal,
    })
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
        self.pid.as_raw()
    }

    /// The command's start time (clock ticks since boot), which with its pid
    /// names it.
    pub fn start(&self) -> u64 {
        self.tree.leader.as_ref().map_or(0, |l| l.start)
    }

    pub fn cgroup(&self) -> Option<&Cgroup> {
        self.tree.cgroup.as_ref()
    }

    /// The shared skip, to update while a stop borrows this child.
    pub fn skip(&self) -> crate::tree::Skip {
        self.tree.skip.clone()
    }

    /// The watchdog was replaced: the new one is not to be swept.
    pub fn set_skip(&mut self, skip: Option<Pid>) {
        self.tree.skip.set(skip.map(Pid::as_raw));
    }

    /// Pass a signal to the command's group, as a shell passes one to a
    /// job; a group that is stopped is continued after it, so the signal is
    /// acted on. Once the command has been reaped its group is no longer
    /// named by it: nothing is sent (the stop and the sweep see to what it
    /// left behind).
    pub fn signal(&self, sig: Signal) {
        if self.exited.is_some() {
            return;
        }
        self.tree.signal_group(sig);
        if self.stopped {
            self.tree.signal_group(Signal::SIGCONT);
        }
    }

    /// Collect every child that changed state: the command (exit, stop,
    /// continue) and any orphan adopted as subreaper (reaped and forgotten).
    fn reap(&mut self) {
        let flags = WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED | WaitPidFlag::WCONTINUED;
        loop {
            match waitpid(None, Some(flags)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!(event = "wait_failed", "cannot wait for the child: {e}");
                    return;
                }
                Ok(WaitStatus::Exited(pid, code)) if pid == self.pid => {
                    self.exited = Some(ExitStatus::from_raw((code & 0xff) << 8));
                    self.tree.unreaped = false;
                }
                Ok(WaitStatus::Signaled(pid, sig, core)) if pid == self.pid => {
                    self.exited = Some(ExitStatus::from_raw(
                        sig as i32 | if core { 0x80 } else { 0 },
                    ));
                    self.tree.unreaped = false;
                }
                Ok(WaitStatus::Stopped(pid, sig)) if pid == self.pid => {
                    self.stopped = true;
                    let from_tty =
                        matches!(sig, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU);
                    if let (Some(t), true) = (&self.terminal, from_tty) {
                        t.suspend_with(self.pid, sig);
                    }
                }
                Ok(WaitStatus::Continued(pid)) if pid == self.pid => self.stopped = false,
                Ok(_) => {}
            }
        }
    }

    /// Wait for the command itself to exit (cancel-safe).
    pub async fn wait(&mut self) -> ExitStatus {
        loop {
            self.reap();
            if let Some(st) = self.exited {
                if let Some(t) = &self.terminal {
                    t.take_back(self.pid);
                }
                return st;
            }
            self.sigchld.recv().await;
        }
    }

    /// Stop the command as `stop` says (stop.rs): SIGTERM (and SIGCONT) to
    /// everything, unless the watchdog has already sent it; SIGKILL at the
    /// stop's kill deadline (at once when that has passed), again every
    /// round; then reap it and sweep what it left. Signals that arrive
    /// meanwhile are still forwarded. True when everything is gone.
    pub async fn stop<C: Clock>(
        &mut self,
        clock: &C,
        mut stop: Stop,
        forward: &mut UnboundedReceiver<Signal>,
    ) -> (ExitStatus, bool) {
        let st = loop {
            // A command that already ended (the watchdog stopped it while
            // leaderrun was frozen, and it waits unreaped) is not signalled
            // or said to still run: what it left is `finish`'s, below.
            self.reap();
            if self.exited.is_some() {
                break self.wait().await;
            }
            // Until the command is reaped it counts as running; a stuck one
            // (SIGKILL has not ended it) is waited for without more rounds.
            let wake = match stop.next(clock.now(), true) {
                Step::Term => {
                    self.tree.terminate();
                    continue;
                }
                Step::Kill { first } => {
                    if first {
                        tracing::warn!(event = "kill", pid = self.pid(), "the command still runs at the kill deadline: SIGKILL to everything it started");
                    }
                    self.tree.kill();
                    continue;
                }
                Step::Wait(at) => Some(at),
                Step::Gone | Step::Stuck => None,
            };
            tokio::select! {
                biased;
                st = self.wait() => break st,
                _ = async {
                    match wake {
                        Some(at) => clock.sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
                Some(sig) = forward.recv() => self.signal(sig),
            }
        };
        self.reap();
        let alive = self.tree.alive();
        let gone = self.finish(clock, &mut stop, alive).await;
        (st, gone)
    }

    /// After the command itself exited: what it left behind (a
    /// backgrounded `&` job, a daemon that left its group) must not outlive
    /// it unsupervised. A stop of its own (SIGTERM now, SIGKILL at the
    /// stop's deadline). True when everything is gone; false when something
    /// survived SIGKILL (uninterruptible sleep), and the lease must then not
    /// be handed back early.
    pub async fn sweep<C: Clock>(&mut self, clock: &C, mut stop: Stop) -> bool {
        self.reap();
        if !self.tree.alive() {
            return true;
        }
        tracing::warn!(
            event = "group_swept",
            pgid = self.pid(),
            "the command left processes behind; stopping them"
        );
        self.finish(clock, &mut stop, true).await
    }

    /// The rest of a stop once the command is reaped: its steps, with a
    /// look every round whether everything is gone. Whatever this stop
    /// already sent SIGTERM to is not sent another (tree.rs).
    async fn finish<C: Clock>(&mut self, clock: &C, stop: &mut Stop, mut alive: bool) -> bool {
        loop {
            let now = clock.now();
            match stop.next(now, alive) {
                Step::Term => {
                    self.tree.terminate();
                }
                Step::Kill { .. } => self.tree.kill(),
                Step::Wait(at) => {
                    clock.sleep_until(at.min(now + ROUND)).await;
                    self.reap();
                    alive = self.tree.alive();
                }
                Step::Gone => return true,
                Step::Stuck => return false,
            }
        }
    }

    /// Remove the cgroup once it is empty.
    pub fn cleanup(&self) {
        if let Some(cg) = &self.tree.cgroup {
            cg.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// The start's failures keep what caused them as their source, and
    /// read as they did when they were one string: the status a shell
    /// gives (126) and the system's own words.
    #[test]
    fn spawn_errors_keep_their_cause_and_their_words() {
        let e = SpawnError::Io {
            what: "cannot watch for the child".into(),
            source: std::io::Error::from_raw_os_error(nix::libc::EMFILE),
        };
        assert_eq!(
            e.to_string(),
            format!(
                "command not executable: cannot watch for the child: {}",
                std::io::Error::from_raw_os_error(nix::libc::EMFILE)
            )
        );
        assert!(e.source().is_some());
        assert_eq!(e.exit(), Exit::NotExecutable);
        let nul = match Program::new(
            std::path::Path::new("/bin/true"),
            &["a\0b".into()],
            Vec::new(),
        ) {
            Err(e) => e,
            Ok(_) => panic!("a NUL byte in argv was accepted"),
        };
        let e = SpawnError::Prepare {
            what: "./job".into(),
            source: nul,
        };
        assert_eq!(
            e.to_string(),
            "command not executable: ./job: an argument or environment variable holds a NUL byte"
        );
        assert!(e.source().and_then(|s| s.source()).is_some());
        assert_eq!(e.exit(), Exit::NotExecutable);
    }
}
