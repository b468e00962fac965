//! Whether the command can be run at all, found out before any lease is
//! taken: `argv[0]` on `PATH`, executable, and a `#!` interpreter that
//! exists, with the status a shell gives (126, 127) and what is wrong.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use super::SpawnError;
use crate::exit;

/// Find out, before any lease is taken, whether `argv[0]` can be run at all,
/// so a typo in a crontab costs no epoch and holds no lease. (The spawn
/// itself still reports 126/127 for what changes in between.) Returns the
/// file to execute, found once here so that [`spawn`] does not search
/// `PATH` a second time.
pub fn check_command(argv: &[OsString]) -> Result<std::path::PathBuf, SpawnError> {
    use nix::unistd::{access, AccessFlags};
    use std::path::{Path, PathBuf};
    let Some(program) = argv.first().filter(|p| !p.is_empty()) else {
        return Err(SpawnError::NotFound("(empty command)".into()));
    };
    let shown = program.to_string_lossy().into_owned();
    let runnable = |p: &Path| p.is_file() && access(p, AccessFlags::X_OK).is_ok();
    if program.as_encoded_bytes().contains(&b'/') {
        let p = Path::new(program);
        // A symlink loop (or a chain too long) is not a missing file: say
        // what it is, with the status a shell gives it (126).
        if let Err(e) = std::fs::metadata(p) {
            if e.raw_os_error() == Some(nix::libc::ELOOP) {
                return Err(SpawnError::NotExecutable(format!(
                    "{shown}: too many levels of symbolic links (a symlink loop?)"
                )));
            }
        }
        return if !p.exists() {
            Err(SpawnError::NotFound(shown))
        } else if runnable(p) {
            check_interpreter(p, &shown).map(|()| p.to_path_buf())
        } else {
            Err(SpawnError::NotExecutable(format!(
                "{shown}: permission denied or not a file"
            )))
        };
    }
    let candidates: Vec<PathBuf> = std::env::split_paths(&search_path())
        .map(|d| d.join(program))
        .collect();
    if let Some(found) = candidates.iter().find(|c| runnable(c)) {
        check_interpreter(found, &shown).map(|()| found.clone())
    } else if candidates.iter().any(|c| c.exists()) {
        Err(SpawnError::NotExecutable(format!(
            "{shown}: permission denied"
        )))
    } else {
        Err(SpawnError::NotFound(shown))
    }
}

/// `$PATH`, or the default a shell would search without one.
fn search_path() -> OsString {
    std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into())
}

/// A script's `#!` line, read as the kernel reads it, checked for what a
/// shell would report only after exec: an interpreter that does not exist
/// (127, as bash, dash and zsh say) or cannot be executed (126), and
/// `#!/usr/bin/env NAME` with NAME nowhere on PATH (127, as env says).
/// A trailing carriage return is named as such: it is the usual cause (a
/// script saved with Windows line endings), and invisible in any listing.
/// Files that cannot be read, or have no `#!`, are left to exec.
fn check_interpreter(file: &std::path::Path, shown: &str) -> Result<(), SpawnError> {
    use std::io::Read;
    use std::path::Path;
    // The kernel looks at no more than the first 256 bytes.
    let mut head = [0u8; 256];
    let n = match std::fs::File::open(file).and_then(|mut f| f.read(&mut head)) {
        Ok(n) => n,
        Err(_) => return Ok(()),
    };
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Ok(());
    };
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    // Like the kernel: blanks around the interpreter go, a '\r' stays.
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let line = line.trim_ascii_start();
    let end = line.iter().position(blank).unwrap_or(line.len());
    let (interp, rest) = line.split_at(end);
    let rest = rest
        .iter()
        .position(|b| !blank(b))
        .map_or(&[][..], |i| &rest[i..]);
    let rest = &rest[..rest.iter().rposition(|b| !blank(b)).map_or(0, |i| i + 1)];
    let crlf = |b: &[u8]| {
        if b.ends_with(b"\r") {
            " (the script has Windows line endings; remove the carriage returns, e.g. with dos2unix)"
        } else {
            ""
        }
    };
    let bad = |b: &[u8], why: &str, code: i32| {
        Err(SpawnError::Interpreter(
            format!("{shown}: bad interpreter {}: {why}{}", visible(b), crlf(b)),
            code,
        ))
    };
    if interp.is_empty() {
        // The kernel refuses it (ENOEXEC) and the C library then runs the
        // file with /bin/sh, as a shell would: not an error here.
        return Ok(());
    }
    let ipath = Path::new(std::ffi::OsStr::from_bytes(interp));
    if !ipath.exists() {
        return bad(interp, "no such file", exit::NOT_FOUND);
    }
    if !ipath.is_file() || nix::unistd::access(ipath, nix::unistd::AccessFlags::X_OK).is_err() {
        return bad(
            interp,
            "permission denied or not a file",
            exit::NOT_EXECUTABLE,
        );
    }
    // `#!/usr/bin/env NAME`: env searches PATH for NAME. Options (`-S …`)
    // and anything with a blank in it are left to env.
    if ipath.file_name() == Some(std::ffi::OsStr::new("env"))
        && !rest.is_empty()
        && !rest.starts_with(b"-")
        && !rest.iter().any(blank)
        && !rest.contains(&b'/')
    {
        let name = std::ffi::OsStr::from_bytes(rest);
        let found = std::env::split_paths(&search_path()).any(|d| d.join(name).is_file());
        if !found {
            return Err(SpawnError::Interpreter(
                format!(
                    "{shown}: interpreter {} (from #!{} {}) is not on PATH{}",
                    visible(rest),
                    visible(interp),
                    visible(rest),
                    crlf(rest)
                ),
                exit::NOT_FOUND,
            ));
        }
    }
    Ok(())
}

/// Bytes from a file, for a message: control characters as `^M`, `^@`, …
/// (as `cat -v` shows them), invalid UTF-8 replaced.
fn visible(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .chars()
        .map(|c| match c {
            c if (c as u32) < 0x20 => format!("^{}", char::from(b'@' + c as u8)),
            '\u{7f}' => "^?".to_string(),
            c => c.to_string(),
        })
        .collect()
}
