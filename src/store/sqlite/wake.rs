//! Push wake-ups on the embedded store: an inotify watch on a directory of
//! per-lease files.

use std::path::{Path, PathBuf};

use crate::store::wake::{Heard, Wakeups};
use crate::store::StoreError;

/// Why inotify on a file touched after the release, and not a `flock` the
/// holder keeps while leading: a lock dies with the process that holds it,
/// and when leaderrun is killed its command keeps running until the watchdog
/// has stopped it and released the lease. A waiter woken by the lock would
/// find the lease still held, and then have nothing left to wait on for the
/// watchdog's release (the lock is free, so blocking on it returns at once).
/// A file touched by whoever releases — leaderrun, its watchdog, `leaderrun
/// release` — wakes the waiter exactly when the lease is free. What is left,
/// leaderrun and its watchdog killed together, is an expiry, and the waiter
/// has already scheduled its next attempt for then.
///
/// The directory sits beside the database (`leases.db-wake/`), one empty file
/// per lease name; names cannot contain `/` or start with `.`, so they are
/// safe file names and cannot collide with the temporary files below.
pub fn wake_dir(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wake");
    PathBuf::from(s)
}

/// Tell waiters on this host that `name` was freed: a file renamed into
/// place, which inotify reports as `IN_MOVED_TO` with the lease's name.
/// Renaming needs only the directory to be writable, whoever created the
/// file before. Best effort: a waiter that misses it polls.
pub fn touch(db: &Path, name: &str) {
    let dir = wake_dir(db);
    let attempt = || -> std::io::Result<()> {
        if !dir.is_dir() {
            make_dir(db, &dir)?;
        }
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&tmp, b"")?;
        std::fs::rename(&tmp, dir.join(name))
    };
    if let Err(e) = attempt() {
        tracing::debug!(
            event = "push_failed",
            "cannot wake waiters ({e}); they poll"
        );
    }
}

/// What an acquisition's file is named: the lease's name after
/// [`TAKEN`]. No lease name starts with `+`, so it is never a release's.
const TAKEN: &str = "+";

/// Tell watchers on this host that `name` was taken, once the acquire
/// committed: the file `+NAME`, renamed into place as a release's. Only
/// `watch` listens for it ([`Heard::Changes`]); a waiting contender's
/// subscription skips it.
pub fn touch_taken(db: &Path, name: &str) {
    touch(db, &format!("{TAKEN}{name}"));
}

/// The wake directory, with the database directory's permissions: whoever
/// may use the database may wake and be woken.
fn make_dir(db: &Path, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mode = db
        .parent()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0o700, |m| m.permissions().mode() & 0o7777);
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// tokio wants `AsRawFd`; nix's inotify offers `AsFd`.
struct Ino(nix::sys::inotify::Inotify);

impl std::os::fd::AsRawFd for Ino {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

pub struct FileWakeups {
    db: PathBuf,
    /// The lease whose file is watched for.
    name: String,
    /// Whether its acquisitions' files wake too (`watch`).
    heard: Heard,
    fd: Option<tokio::io::unix::AsyncFd<Ino>>,
}

impl FileWakeups {
    pub(crate) fn new(db: PathBuf, name: &str, heard: Heard) -> FileWakeups {
        FileWakeups {
            db,
            name: name.to_string(),
            heard,
            fd: None,
        }
    }

    /// Read what is pending; `Ok(true)` when our lease was woken, an error when
    /// the watch is gone (the directory was removed).
    fn drain(&mut self) -> Result<bool, StoreError> {
        use nix::sys::inotify::AddWatchFlags as F;
        let Some(fd) = self.fd.as_ref() else {
            return Err(StoreError::unavailable("not watching"));
        };
        let mut woken = false;
        loop {
            match fd.get_ref().0.read_events() {
                Ok(evs) => {
                    for ev in evs {
                        if ev.mask.intersects(F::IN_IGNORED | F::IN_Q_OVERFLOW) {
                            // The watch is gone, or events were dropped:
                            // anything may have happened.
                            self.fd = None;
                            return Err(StoreError::unavailable(
                                "the wake-up directory watch ended",
                            ));
                        }
                        // Any slot of the name (`--slots`): a waiter
                        // takes whichever is freed. For a plain waiter, a
                        // slot's release is a wake-up for nothing.
                        let file = ev.name.as_deref().and_then(|n| n.to_str());
                        let lease = file.and_then(|f| match f.strip_prefix(TAKEN) {
                            Some(taken) => (self.heard == Heard::Changes).then_some(taken),
                            None => Some(f),
                        });
                        if lease.is_some_and(|n| crate::names::slot_of(n, &self.name).is_some()) {
                            woken = true;
                        }
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return Ok(woken),
                Err(e) => {
                    self.fd = None;
                    return Err(StoreError::unavailable(format!("inotify: {e}")));
                }
            }
        }
    }
}

impl Wakeups for FileWakeups {
    async fn arm(&mut self) -> Result<(), StoreError> {
        use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
        if self.fd.is_none() {
            let dir = wake_dir(&self.db);
            let fail = |e: &dyn std::fmt::Display| {
                StoreError::unavailable(format!("cannot watch {}: {e}", dir.display()))
            };
            if !dir.is_dir() {
                make_dir(&self.db, &dir).map_err(|e| fail(&e))?;
            }
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                .map_err(|e| fail(&e))?;
            ino.add_watch(&dir, F::IN_MOVED_TO | F::IN_CLOSE_WRITE)
                .map_err(|e| fail(&e))?;
            // SAFETY: `Ino` owns the descriptor, so it stays open (and
            // the same file) for as long as the registration lives.
            let fd = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    Ino(ino),
                    tokio::io::Interest::READABLE,
                )
            }
            .map_err(|e| fail(&e.into_parts().1))?;
            self.fd = Some(fd);
        }
        self.drain().map(|_| ())
    }

    async fn wake(&mut self) -> Result<(), StoreError> {
        loop {
            let Some(fd) = self.fd.as_ref() else {
                return Err(StoreError::unavailable("not watching"));
            };
            let mut ready = fd
                .readable()
                .await
                .map_err(|e| StoreError::unavailable(format!("inotify: {e}")))?;
            ready.clear_ready();
            drop(ready);
            if self.drain()? {
                return Ok(());
            }
        }
    }
}
