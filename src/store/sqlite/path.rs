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

/// The directory of the lease files, beside the store's file:
/// `leases.db-leases/` for `leases.db`.
pub fn lease_dir(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-leases");
    PathBuf::from(s)
}

/// The longest file name written for a lease (most file systems allow 255
/// bytes; SQLite appends `-wal` and `-shm`).
const MAX_FILE_NAME: usize = 240;

/// The file of lease `name`: `leases.db-leases/NAME.db`.
///
/// A name a run accepts (names.rs: letters, digits, `.`, `_`, `-`, not
/// starting with `.` or `-`, at most 128 characters) is used as it is. Any
/// other byte, and a leading `.`, is written `%XX`, so that no string (a
/// row written by hand, a name from an older release) can name `..`, a
/// path with `/`, a hidden file, or anything outside the directory. Two
/// names that a case-insensitive file system takes for one file share it
/// safely: every file holds a table keyed by name, as the single file did.
/// `None` when the name does not fit in a file name.
pub fn lease_file(db: &Path, name: &str) -> Option<PathBuf> {
    let mut file = String::with_capacity(name.len() + 3);
    for (i, b) in name.bytes().enumerate() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
            file.push(char::from(b));
        } else {
            file.push_str(&format!("%{b:02X}"));
        }
    }
    file.push_str(".db");
    (!name.is_empty() && file.len() <= MAX_FILE_NAME).then(|| lease_dir(db).join(file))
}

/// Create the lease directory (and the store's own directory first, where
/// the store may create files), with the store directory's permissions:
/// whoever may use the store may use its leases.
pub(super) fn make_lease_dir(db: &Path, create: bool) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = lease_dir(db);
    if dir.is_dir() {
        return Ok(dir);
    }
    let parent = db.parent().filter(|d| !d.as_os_str().is_empty());
    if let (true, Some(p)) = (create, parent) {
        create_private_dir(p)?;
    }
    let mode = parent
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0o700, |m| m.permissions().mode() & 0o7777);
    match std::fs::DirBuilder::new().mode(mode).create(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(dir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_files_stay_in_their_directory() {
        let db = Path::new("/s/leases.db");
        let dir = Path::new("/s/leases.db-leases");
        assert_eq!(lease_file(db, "nightly"), Some(dir.join("nightly.db")));
        assert_eq!(lease_file(db, "a.b_c-D9"), Some(dir.join("a.b_c-D9.db")));
        for hostile in [
            "..",
            ".",
            "../x",
            "a/../../b",
            "/etc/passwd",
            "x\0y",
            "\n",
            "é",
            "%41",
        ] {
            let f = lease_file(db, hostile).unwrap();
            assert_eq!(f.parent(), Some(dir), "{hostile:?}");
            let n = f.file_name().unwrap().to_str().unwrap();
            assert!(
                !n.starts_with('.') && !n.contains('/'),
                "{hostile:?} -> {n}"
            );
        }
        // Distinct names, distinct files.
        assert_ne!(lease_file(db, "%41"), lease_file(db, "A"));
        assert_ne!(lease_file(db, ".a"), lease_file(db, "%2Ea"));
        assert_eq!(lease_file(db, ""), None);
        assert!(lease_file(db, &"n".repeat(128)).is_some());
        assert_eq!(lease_file(db, &"/".repeat(100)), None);
    }
}
