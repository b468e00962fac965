//! Where the store's file is, and what the file system says about it.

use std::path::{Path, PathBuf};

use crate::store::ResolveError;

/// Where the embedded store lives when none is configured:
/// `$LEADERRUN_STATE_DIR/leases.db` (must be absolute); for root
/// `/var/lib/leaderrun/leases.db`; otherwise `$XDG_STATE_HOME/leaderrun/leases.db`
/// (a relative `XDG_STATE_HOME` is ignored, as the XDG spec says), falling
/// back to `$HOME/.local/state/leaderrun/leases.db`. No usable `HOME` is a
/// failure of the environment (exit 125), not a usage error.
pub fn default_path() -> Result<PathBuf, ResolveError> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("LEADERRUN_STATE_DIR") {
        if d.is_relative() {
            return Err(ResolveError::RelativeStateDir);
        }
        return Ok(d.join("leases.db"));
    }
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/leaderrun/leases.db"));
    }
    if let Some(d) = var("XDG_STATE_HOME").filter(|d| d.is_absolute()) {
        return Ok(d.join("leaderrun").join("leases.db"));
    }
    match var("HOME").filter(|h| h.is_absolute()) {
        Some(h) => Ok(h.join(".local/state/leaderrun/leases.db")),
        None => Err(ResolveError::NoHome),
    }
}

/// SQLite says only "unable to open database file"; the file system can
/// say why. In WAL mode SQLite writes `-wal` and `-shm` files beside the
/// database, so the directory must be writable too, even when the file is.
pub(super) fn why_unopenable(path: &Path) -> Option<String> {
    use nix::unistd::{access, AccessFlags};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    let rw = AccessFlags::R_OK | AccessFlags::W_OK;
    let said =
        |p: &Path, e: nix::errno::Errno| format!("{}: {}", p.display(), e.desc().to_lowercase());
    if path.exists() {
        if let Err(e) = access(path, rw) {
            return Some(said(path, e));
        }
    } else if !dir.is_dir() {
        return Some(format!("{}: no such directory", dir.display()));
    }
    match access(dir, rw | AccessFlags::X_OK) {
        Err(e) => Some(format!(
            "{} (SQLite needs to write {} and its -wal and -shm files there)",
            said(dir, e),
            path.file_name()
                .map_or("the database".into(), |n| n.to_string_lossy())
        )),
        Ok(()) => None,
    }
}

/// Create `dir` and its parents; directories leaderrun creates are private
/// to their owner (0700), except the system-wide one, which others may read.
pub(super) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    let mode = if dir.starts_with("/var/lib") {
        0o755
    } else {
        0o700
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
}
