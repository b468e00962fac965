//! A stopped leaderrun that holds a lease file's write lock, found and ended.
//!
//! SQLite's locks are POSIX record locks (`fcntl`): the kernel keeps one for
//! as long as the process that took it lives, and a stopped process (SIGSTOP,
//! Ctrl-Z, a debugger, a frozen cgroup) lives on. Nobody can take such a lock
//! away; the process can only be ended, and its locks go with it. A lease
//! file's write lock is held for well under a millisecond per call, so a
//! process found stopped while holding it will not let go before it is
//! continued, which may be never.
//!
//! Who ends it, and when, is the caller's choice (unblock.rs, `may_end`); this
//! file only finds the holder and ends it safely:
//!
//! * the holder is read from `/proc/locks`, never by opening the file and
//!   asking `fcntl(F_GETLK)`: closing any descriptor of a file drops every
//!   POSIX lock *this* process holds on it, including the ones SQLite holds
//!   for its own connections (the `-shm` file's), which would let another
//!   process reset the WAL index under them;
//! * only a leaderrun process is ended (the same executable as ours, or one
//!   named `leaderrun`, as an older leaderrun during an upgrade is): an
//!   operator's `sqlite3` shell stopped inside a transaction is waited for,
//!   never killed;
//! * "stopped" is state `T` or `t` in `/proc/PID/stat`, or a cgroup v2
//!   freezer that says `frozen 1`;
//! * the process is held by pidfd, and the facts that made it a target (it
//!   holds the lock, it is stopped) are checked again after the pidfd was
//!   opened, so a pid recycled in between is never hit (tree.rs explains the
//!   pattern).
//!
//! Ending a leaderrun by SIGKILL is a case the contract is built for (§10):
//! its watchdog stops its command and hands back its lease; SQLite rolls back
//! the transaction it was in.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::libc;

/// SQLite's WAL write lock: byte 120 of the `-shm` file (its unix VFS puts
/// the eight WAL locks at 120..127, `WAL_WRITE_LOCK` first). Rebuilding
/// the WAL index takes it too.
const WAL_WRITE_BYTE: u64 = 120;

/// The pid of another process that holds SQLite's write lock on `db`: the
/// WAL write lock in its `-shm` file, or a write lock on the file itself
/// (creating it and switching it to WAL mode take one). Not the other WAL
/// locks: a checkpoint's lock, held by a process stopped while it copies
/// the WAL back, holds up no writer.
pub(super) fn write_lock_holder(db: &Path) -> Option<i32> {
    let mut shm = db.as_os_str().to_owned();
    shm.push("-shm");
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let (db_id, shm_id) = (id(db), id(Path::new(&shm)));
    if db_id.is_none() && shm_id.is_none() {
        return None;
    }
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let me = std::process::id() as i32;
    locks
        .lines()
        .filter_map(parse_lock)
        .filter(|l| l.write && l.pid != me)
        .find(|l| {
            let on = Some((l.dev, l.ino));
            on == db_id
                || (on == shm_id
                    && l.start <= WAL_WRITE_BYTE
                    && l.end.is_none_or(|e| e >= WAL_WRITE_BYTE))
        })
        .map(|l| l.pid)
}

struct LockLine {
    write: bool,
    pid: i32,
    dev: u64,
    ino: u64,
    start: u64,
    /// `None`: to the end of the file.
    end: Option<u64>,
}

/// One line of `/proc/locks`: `1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120`.
/// Lines of waiters (`1: -> POSIX …`) and of OFD locks (pid -1) hold nothing
/// we can end.
fn parse_lock(line: &str) -> Option<LockLine> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.get(1) != Some(&"POSIX") {
        return None;
    }
    let pid: i32 = f.get(4)?.parse().ok().filter(|p| *p > 0)?;
    let mut id = f.get(5)?.split(':');
    let major = u32::from_str_radix(id.next()?, 16).ok()?;
    let minor = u32::from_str_radix(id.next()?, 16).ok()?;
    let ino: u64 = id.next()?.parse().ok()?;
    let start: u64 = f.get(6)?.parse().ok()?;
    let end = match *f.get(7)? {
        "EOF" => None,
        e => Some(e.parse().ok()?),
    };
    Some(LockLine {
        write: f.get(3) == Some(&"WRITE"),
        pid,
        dev: libc::makedev(major, minor),
        ino,
        start,
        end,
    })
}

/// Whether `pid` is stopped: by a signal or a tracer, or in a frozen cgroup.
pub(super) fn is_stopped(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name, field 2, is in parentheses and may hold anything,
    // spaces and parentheses included: the state follows the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    if matches!(state, Some("T" | "t")) {
        return true;
    }
    let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .and_then(|path| {
            std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cgroup.events")).ok()
        })
        .is_some_and(|events| events.lines().any(|l| l == "frozen 1"))
}

/// Whether `pid` is a leaderrun: our own executable, or a process named
/// `leaderrun` (an older release, still running after an upgrade replaced
/// the file).
fn is_leaderrun(pid: i32) -> bool {
    let id = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    if let (Some(theirs), Some(ours)) = (id(&format!("/proc/{pid}/exe")), id("/proc/self/exe")) {
        if theirs == ours {
            return true;
        }
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "leaderrun")
}

/// A stopped leaderrun that holds `db`'s write lock, if there is one.
pub(super) fn stopped_holder(db: &Path) -> Option<i32> {
    write_lock_holder(db).filter(|&pid| is_stopped(pid) && is_leaderrun(pid))
}

/// End `pid` with SIGKILL if it still is a stopped leaderrun holding `db`'s
/// write lock once held by pidfd. True when the signal was sent.
pub(super) fn end(db: &Path, pid: i32) -> bool {
    let Ok(fd) = pidfd_open(pid) else {
        return false;
    };
    if stopped_holder(db) != Some(pid) {
        return false;
    }
    // Still there after the checks: the /proc files read were its own.
    pidfd_send_signal(fd.as_fd(), 0).is_ok() && pidfd_send_signal(fd.as_fd(), libc::SIGKILL).is_ok()
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: two integers in; the result is a new descriptor (or -1) that
    // nothing else owns, so OwnedFd may take it.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if rc < 0 {
        return Err(Errno::last());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
}

/// `sig` 0 only checks that the process has not exited.
fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: i32) -> Result<(), Errno> {
    // SAFETY: a descriptor valid for the call, integers, and a null siginfo,
    // which means kill(2)'s defaults.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_lines_are_read_and_waiters_skipped() {
        let l = parse_lock("1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120").unwrap();
        assert!(l.write);
        assert_eq!((l.pid, l.ino, l.start, l.end), (1234, 5678, 120, Some(120)));
        assert_eq!(l.dev, libc::makedev(8, 1));
        let l = parse_lock("2: POSIX  ADVISORY  READ 99 00:2a:7 1073741826 EOF").unwrap();
        assert!(!l.write);
        assert_eq!((l.start, l.end), (1073741826, None));
        assert_eq!(l.dev, libc::makedev(0, 0x2a));
        assert!(parse_lock("1: -> POSIX  ADVISORY  WRITE 1235 08:01:5678 120 120").is_none());
        assert!(parse_lock("3: OFDLCK ADVISORY  WRITE -1 08:01:5678 0 EOF").is_none());
        assert!(parse_lock("4: FLOCK  ADVISORY  WRITE 12 08:01:5678 0 EOF").is_none());
        assert!(parse_lock("garbage").is_none());
    }

    #[test]
    fn this_process_is_not_stopped() {
        assert!(!is_stopped(std::process::id() as i32));
    }
}
