//! Creating processes: the command (forked straight into its cgroup where
//! the kernel can, prepared, exec'd, and known to have exec'd) and the
//! watchdog (started through an intermediate that exits at once, so that
//! its exec overlaps leaderrun's work; leaderrun adopts and reaps it).
//!
//! std's `Command` cannot start a child inside a cgroup. The child would
//! have to move itself by writing to `cgroup.procs` between fork and exec,
//! and that write takes the cgroup hierarchy's thread-group lock for
//! writing, which waits for an RCU grace period: 5–15 ms on every run of a
//! command that lasts milliseconds. `clone3(CLONE_INTO_CGROUP)` (Linux 5.7)
//! creates the child in the cgroup instead, under the read side of that
//! lock. Where clone3 is refused (an older kernel, a seccomp filter that
//! answers ENOSYS or EPERM), the child is forked and moves itself as before.
//!
//! Between fork and exec the child is a copy of a multi-threaded process: it
//! may only make async-signal-safe calls, so everything it needs (paths,
//! argv, envp) is built before the fork, and nothing in the child allocates.
//! A raw clone3 also bypasses the C library's fork bookkeeping (its cached
//! thread id is the parent's), so the child signals itself with `kill` on
//! its own pid, never `raise`.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::libc;
use nix::unistd::Pid;

use crate::tree::Cgroup;

/// Why a process could not be prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error("an argument or environment variable holds a NUL byte")]
    Nul(#[from] std::ffi::NulError),
    /// The intermediate of [`spawn_detached`] could not fork.
    #[error("the watchdog could not be forked")]
    NotForked,
    #[error(transparent)]
    Os(#[from] std::io::Error),
}

/// The program to execute, as the C strings the child passes to exec.
pub struct Program {
    file: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Program {
    /// `file` run with `argv` (whose first element the program sees as its
    /// name) and exactly the environment `env`.
    pub fn new(
        file: &Path,
        argv: &[OsString],
        env: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Program, ForkError> {
        let c = |b: &[u8]| CString::new(b).map_err(ForkError::Nul);
        let argv = argv
            .iter()
            .map(|a| c(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let envp = env
            .into_iter()
            .map(|(k, v)| {
                let mut kv = k.into_encoded_bytes();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                c(&kv)
            })
            .collect::<Result<_, _>>()?;
        Ok(Program {
            file: c(file.as_os_str().as_bytes())?,
            argv,
            envp,
        })
    }

    /// argv and envp as exec takes them: pointers into `self`, each list
    /// ending in a null pointer. Built before the fork (the child may not
    /// allocate), valid while `self` lives.
    fn pointers(&self) -> (Vec<*const libc::c_char>, Vec<*const libc::c_char>) {
        let list = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        (list(&self.argv), list(&self.envp))
    }
}

/// One `i32` on a status pipe: a pid, or an errno. Async-signal-safe, and
/// atomic (far below PIPE_BUF).
///
/// # Safety
/// Any fd; nothing is allocated.
unsafe fn say(fd: RawFd, v: i32) {
    let b = v.to_ne_bytes();
    libc::write(fd, b.as_ptr().cast(), b.len());
}

/// The next `i32` from a status pipe; None at end-of-file (every write end
/// closed: at exec, or at exit).
fn hear(fd: &OwnedFd) -> Option<i32> {
    let mut buf = [0u8; 4];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(4) => return Some(i32::from_ne_bytes(buf)),
            _ => return None,
        }
    }
}

/// Wait for a child of ours to end.
fn reap(pid: Pid) -> nix::Result<nix::sys::wait::WaitStatus> {
    loop {
        match nix::sys::wait::waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => return other,
        }
    }
}

/// What the child does before exec, beyond leading a process group of its
/// own (src/supervisor/ says why each step is there).
pub struct Setup<'a> {
    pub cgroup: Option<&'a Cgroup>,
    /// The terminal to take the foreground of, or -1.
    pub tty_fd: RawFd,
    /// Leave SIGHUP ignored (`nohup`); every other signal goes to default.
    pub keep_hup_ignored: bool,
    /// leaderrun: the child must not run on once it is gone.
    pub parent: Pid,
    /// The give-up deadline (boot clock): not exec'd at or after it.
    pub deadline: crate::clock::Stamp,
}

/// What the child reports, in place of an exec's errno, when it reached
/// the exec past the give-up deadline (ETIME: no exec returns it).
pub const PAST_DEADLINE: i32 = libc::ETIME;

/// A started command: its pid, and whether it started inside the cgroup
/// (false: no cgroup asked for, or the child failed to move into it).
pub struct Started {
    pub pid: Pid,
    pub in_cgroup: bool,
}

/// `struct clone_args` of the kernel's ABI, up to `cgroup` (version 2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Start `prog` as `setup` says. An error means no command runs: either no
/// child was created, or it failed before or at exec and has been reaped.
pub fn spawn(prog: &Program, setup: &Setup<'_>) -> std::io::Result<Started> {
    let (argv, envp) = prog.pointers();
    let (err_rd, err_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let dir = setup.cgroup.and_then(Cgroup::dir_fd);

    // SAFETY: in the child (pid 0) only `child` runs, which makes
    // async-signal-safe calls on memory prepared above and never returns.
    let mut placed = false;
    let mut pid = -1;
    if let Some(d) = &dir {
        let mut args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: d.as_raw_fd() as u64,
            ..CloneArgs::default()
        };
        // SAFETY: clone3 without CLONE_VM is fork; the struct outlives the
        // call and its size is passed with it.
        pid = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &mut args as *mut CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        } as i32;
        if pid == 0 {
            // SAFETY: see `child`.
            unsafe { child(prog, &argv, &envp, setup, -1, err_wr.as_raw_fd()) }
        }
        placed = pid > 0;
    }
    let mut join = None;
    if pid < 0 {
        // No cgroup, or clone3 refused: fork, and let the child move itself.
        join = setup.cgroup.and_then(Cgroup::procs_for_join);
        let join_fd = join.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: as above; the C library's fork keeps its own state sane.
        pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: see `child`.
            unsafe { child(prog, &argv, &envp, setup, join_fd, err_wr.as_raw_fd()) }
        }
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    drop((err_wr, join, dir));
    let pid = Pid::from_raw(pid);
    // The write end closes at exec (CLOEXEC) or carries the errno of a
    // failed one: a successful start reads end-of-file.
    if let Some(errno) = hear(&err_rd) {
        let _ = reap(pid);
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    let in_cgroup = placed || setup.cgroup.is_some_and(|cg| cg.contains(pid));
    Ok(Started { pid, in_cgroup })
}

/// The child, from fork to exec; reports a failed exec's errno on `err`.
///
/// # Safety
/// Only in the child of a fork or clone3 of this process. Every call here is
/// async-signal-safe (setpgid, write, prctl, getppid, getpid, kill, ioctl,
/// sigaction, sigprocmask, clock_gettime, execvpe, _exit) and nothing
/// allocates.
unsafe fn child(
    prog: &Program,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    setup: &Setup<'_>,
    join_fd: RawFd,
    err: RawFd,
) -> ! {
    let fail = |e: i32| -> ! {
        say(err, e);
        libc::_exit(127)
    };
    let errno = || *libc::__errno_location();
    if libc::setpgid(0, 0) != 0 {
        fail(errno());
    }
    if join_fd >= 0 {
        // "0" moves the writing process; a failure is found by the parent
        // (Cgroup::contains) and handled there.
        libc::write(join_fd, b"0".as_ptr().cast(), 1);
    }
    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
        fail(errno());
    }
    if libc::getppid() != setup.parent.as_raw() {
        // leaderrun is already gone: do not run unsupervised.
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    if setup.tty_fd >= 0 {
        // SIGTTOU is still ignored here (inherited from leaderrun).
        libc::tcsetpgrp(setup.tty_fd, libc::getpid());
    }
    let mut act: libc::sigaction = std::mem::zeroed();
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        act.sa_sigaction = if sig == libc::SIGHUP && setup.keep_hup_ignored {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        // Signals the C library reserves for itself refuse; that is fine.
        libc::sigaction(sig, &act, std::ptr::null_mut());
    }
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
        fail(errno());
    }
    // The last check before the command exists: leaderrun checked the
    // deadline before forking, but it can be frozen (or descheduled) for
    // any time between that check and here. Past the give-up deadline the
    // lease may already be someone else's: do not exec. The clock is read
    // by the raw system call, as clock.rs reads it: a preloaded library
    // that fakes time (libfaketime) interposes on the libc wrapper, and
    // would otherwise move this one deadline check off the boot clock every
    // other one is made on. A system call is async-signal-safe; the
    // comparison allocates nothing.
    let mut ts: libc::timespec = std::mem::zeroed();
    if libc::syscall(
        libc::SYS_clock_gettime,
        libc::CLOCK_BOOTTIME,
        &mut ts as *mut libc::timespec,
    ) == 0
    {
        let now = ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128;
        if now >= setup.deadline.since_origin().as_nanos() {
            fail(PAST_DEADLINE);
        }
    }
    // execvpe: a file without `#!` is run with /bin/sh, as a shell would.
    libc::execvpe(prog.file.as_ptr(), argv.as_ptr(), envp.as_ptr());
    fail(errno())
}

/// leaderrun's environment for the command: its own, without
/// `NOTIFY_SOCKET` (the command's READY=1 would count as leaderrun's under
/// `NotifyAccess=all`), with `add` set over whatever was there.
pub fn command_env(add: &[(&str, String)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            k != OsStr::new("NOTIFY_SOCKET") && !add.iter().any(|(a, _)| k == OsStr::new(a))
        })
        .collect();
    env.extend(add.iter().map(|(k, v)| (k.into(), v.into())));
    env
}

/// A process started by [`spawn_detached`], until [`Detached::confirm`].
pub struct Detached {
    /// The intermediate process, which exits as soon as it has forked.
    middle: Pid,
    /// The pid, then end-of-file once the exec succeeded (or an errno).
    status: OwnedFd,
}

/// Start `prog` through an intermediate process that exits at once, so that
/// it is not leaderrun's own child but its grandchild: re-parented, once the
/// intermediate exits, to the nearest subreaper above the intermediate. Run
/// by a subreaper (leaderrun is one from its start, tree.rs), it becomes the
/// caller's child after all, which then reaps it: no zombie is left to a
/// PID 1 that reaps nothing. It runs in a process group of its own, with
/// `ignore` set to "ignore" (which survives exec), `stdin` and `stdout` as
/// its standard input and output, and `extra` as its fds 3, 4, … (a
/// negative entry leaves that number closed).
///
/// This returns as soon as the intermediate is forked: the exec runs while
/// leaderrun goes on. Call [`Detached::confirm`] before relying on it.
pub fn spawn_detached(
    prog: &Program,
    stdin: RawFd,
    stdout: RawFd,
    extra: &[RawFd],
    ignore: &[i32],
) -> Result<Detached, ForkError> {
    // Every source is first copied at or above this number, so that no
    // dup2 onto 0, 1, 3, 4, … can clobber a source not yet placed.
    const HIGH: RawFd = 16;
    const MAX_EXTRA: usize = 8;
    if extra.len() > MAX_EXTRA {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput).into());
    }
    let mut fixed = [-1; MAX_EXTRA];
    fixed[..extra.len()].copy_from_slice(extra);
    let (argv, envp) = prog.pointers();
    let (status_rd, status_wr) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    let status = status_wr.as_raw_fd();
    // SAFETY: both children make only async-signal-safe calls (fork, _exit,
    // setpgid, sigaction, fcntl, dup2, execve, write) on memory prepared
    // above, and never return.
    let middle = unsafe { libc::fork() };
    if middle == 0 {
        unsafe {
            let err = libc::fcntl(status, libc::F_DUPFD_CLOEXEC, HIGH);
            // The intermediate says the pid (positive), the process a
            // failed exec's errno (negated); each write is atomic.
            match libc::fork() {
                0 => {}
                -1 => libc::_exit(1),
                pid => {
                    say(err, pid);
                    libc::_exit(0)
                }
            }
            let fail = || -> ! {
                say(err, -*libc::__errno_location());
                libc::_exit(127)
            };
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = libc::SIG_IGN;
            for &sig in ignore {
                libc::sigaction(sig, &act, std::ptr::null_mut());
            }
            let high = |fd: RawFd| {
                if fd < 0 {
                    -1
                } else {
                    libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, HIGH)
                }
            };
            let input = high(stdin);
            let out = high(stdout);
            let mut moved = [-1; MAX_EXTRA];
            for (m, &f) in moved.iter_mut().zip(fixed.iter()) {
                *m = high(f);
                if f >= 0 && *m < 0 {
                    fail();
                }
            }
            if libc::setpgid(0, 0) != 0
                || err < 0
                || input < 0
                || out < 0
                || libc::dup2(input, 0) < 0
                || libc::dup2(out, 1) < 0
            {
                fail();
            }
            for (i, &fd) in moved.iter().enumerate() {
                if fd >= 0 && libc::dup2(fd, 3 + i as RawFd) < 0 {
                    fail();
                }
            }
            libc::execve(prog.file.as_ptr(), argv.as_ptr(), envp.as_ptr());
            fail()
        }
    }
    if middle < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(Detached {
        middle: Pid::from_raw(middle),
        status: status_rd,
    })
}

impl Detached {
    /// Give up on a process not yet relied on (its orders never came):
    /// SIGKILL it and reap it. Its pid names it until it is reaped, and
    /// only the caller can reap it (its parent, the intermediate, never
    /// waits, and the caller, a subreaper, adopts it), so the pid is safe
    /// to signal. Without the subreaper nothing is signalled: closing its
    /// pipe ends it as surely, only later.
    pub fn abandon(self, subreaper: bool) {
        let first = hear(&self.status);
        let _ = reap(self.middle);
        if let (Some(pid), true) = (first.filter(|p| *p > 0), subreaper) {
            let pid = Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = reap(pid);
        }
    }

    /// Wait until the process has been exec'd (or failed to be) and the
    /// intermediate is reaped. Ok is the pid of the running program.
    pub fn confirm(self) -> Result<Pid, ForkError> {
        let (mut pid, mut errno) = (None, None);
        while let Some(v) = hear(&self.status) {
            if v > 0 {
                pid = Some(Pid::from_raw(v));
            } else {
                errno = Some(-v);
            }
        }
        let middle = reap(self.middle);
        if let Some(e) = errno {
            return Err(std::io::Error::from_raw_os_error(e).into());
        }
        match (middle, pid) {
            (Ok(nix::sys::wait::WaitStatus::Exited(_, 0)), Some(pid)) => Ok(pid),
            // The intermediate could not fork: nothing was started.
            _ => Err(ForkError::NotForked),
        }
    }
}
