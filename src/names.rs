//! What a lease name and a holder id may look like.
//!
//! Names end up in SQL (always as bound parameters), in file paths of other
//! backends, in logs and in environment variables, so they are restricted to
//! a set that is safe and unambiguous everywhere: 1 to 128 characters from
//! `A-Z a-z 0-9 . _ -`, not starting with `-` or `.`.

pub const MAX_NAME: usize = 128;
pub const MAX_HOLDER: usize = 256;

/// Why a lease name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("lease name must not be empty")]
    Empty,
    #[error("lease name is {len} characters long; at most {MAX_NAME} allowed")]
    TooLong { len: usize },
    #[error("lease name contains {found:?}; allowed are letters, digits, '.', '_' and '-'")]
    Character { found: char },
    #[error("lease name must not start with '-' or '.'")]
    Start,
}

pub fn parse_name(s: &str) -> Result<String, NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    if s.len() > MAX_NAME {
        return Err(NameError::TooLong { len: s.len() });
    }
    if let Some(found) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::Character { found });
    }
    if s.starts_with(['-', '.']) {
        return Err(NameError::Start);
    }
    Ok(s.to_string())
}

/// Why a holder id is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HolderError {
    #[error("holder id must not be empty")]
    Empty,
    #[error("holder id is {len} bytes long; at most {MAX_HOLDER} allowed")]
    TooLong { len: usize },
    #[error("holder id must not contain control characters")]
    Control,
}

/// Holder ids are free text for humans (hostnames, pod names), but bounded and
/// printable so they cannot break a log line or a status table.
pub fn parse_holder(s: &str) -> Result<String, HolderError> {
    if s.is_empty() {
        return Err(HolderError::Empty);
    }
    if s.len() > MAX_HOLDER {
        return Err(HolderError::TooLong { len: s.len() });
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(HolderError::Control);
    }
    Ok(s.to_string())
}

/// The longest `--advertise` value, in bytes.
pub const MAX_ADVERTISE: usize = 256;

/// Why an `--advertise` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvertiseError {
    #[error("--advertise must not be empty")]
    Empty,
    #[error("--advertise is {len} bytes long; at most {MAX_ADVERTISE} allowed")]
    TooLong { len: usize },
    #[error("--advertise must not contain control characters")]
    Control,
}

/// An `--advertise` value: free text (an address, a URL, a build id),
/// bounded and printable like a holder id, since `status` and `watch` print
/// it for whoever asks. (clap refuses a value that is not UTF-8 before this
/// sees it.) Nothing in it is treated as secret: the docs say anyone who
/// can run `status` reads it.
pub fn parse_advertise(s: &str) -> Result<String, AdvertiseError> {
    if s.is_empty() {
        return Err(AdvertiseError::Empty);
    }
    if s.len() > MAX_ADVERTISE {
        return Err(AdvertiseError::TooLong { len: s.len() });
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(AdvertiseError::Control);
    }
    Ok(s.to_string())
}

/// The most holders `--slots` allows for one name. Each slot is a lease of
/// its own, and a contender tries them in turn and reads them all when it
/// has taken one (to find contenders that disagree on N): 64 round trips is
/// where a poll stops being cheap, and far above any use seen (`consul lock
/// -n` users run 2 to 10).
pub const MAX_SLOTS: u32 = 64;

/// `--slots N`: 1 to [`MAX_SLOTS`].
pub fn parse_slots(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=MAX_SLOTS).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{n} is out of range: 1 to {MAX_SLOTS}")),
        Err(_) => Err(format!("not a whole number from 1 to {MAX_SLOTS}")),
    }
}

/// A slot number (`release --slot`, `check`'s `LEASE_SLOT`): 0 to
/// [`MAX_SLOTS`] - 1.
pub fn parse_slot(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(i) if i < MAX_SLOTS => Ok(i),
        Ok(i) => Err(format!("{i} is out of range: 0 to {}", MAX_SLOTS - 1)),
        Err(_) => Err(format!("not a whole number from 0 to {}", MAX_SLOTS - 1)),
    }
}

/// The lease that is slot `slot` of `name`: slot 0 is the lease `name`
/// itself (so `--slots 1`, and slot 0 of any N, is the lease a plain run
/// takes), slot `i` the lease `name#i`. Names cannot contain `#`, so no
/// user's name is a slot of another's.
pub fn slot_name(name: &str, slot: u32) -> String {
    if slot == 0 {
        name.to_string()
    } else {
        format!("{name}#{slot}")
    }
}

/// Which slot of `name` the lease `lease` is, if any (the inverse of
/// [`slot_name`]).
pub fn slot_of(lease: &str, name: &str) -> Option<u32> {
    match lease.strip_prefix(name)? {
        "" => Some(0),
        rest => {
            let n = rest.strip_prefix('#')?;
            // Written by slot_name only: no sign, no leading zero.
            if n.starts_with(['0', '+']) {
                return None;
            }
            n.parse::<u32>().ok().filter(|&i| i > 0)
        }
    }
}

/// The lease name and slot a stored lease name stands for: `job#2` is slot 2
/// of `job`; any other name is slot 0 of itself.
pub fn split_slot(lease: &str) -> (&str, u32) {
    if let Some((name, _)) = lease.rsplit_once('#') {
        if let Some(i) = slot_of(lease, name) {
            return (name, i);
        }
    }
    (lease, 0)
}

/// Text from a store or a file, safe to print on a terminal: control
/// characters, and the invisible marks that reorder or hide text (a
/// right-to-left override can make a table lie), are shown escaped as
/// `\n`, `\u{202e}`. Holders leaderrun writes never contain them; rows
/// written by hand may.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let hidden = c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}' | '\u{061c}' | '\u{feff}');
        if hidden {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Columns `s` takes on a terminal, for the common cases: East Asian wide
/// characters and emoji take two, combining marks none, everything else
/// one. (No table is needed for the rest: [`printable`] text has no control
/// characters, and a rare misjudged character costs one column.)
pub fn display_width(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

fn char_width(c: char) -> usize {
    match c as u32 {
        // combining marks
        0x0300..=0x036f
        | 0x0483..=0x0489
        | 0x0591..=0x05bd
        | 0x0610..=0x061a
        | 0x064b..=0x065f
        | 0x1ab0..=0x1aff
        | 0x1dc0..=0x1dff
        | 0x20d0..=0x20ff
        | 0xfe00..=0xfe0f
        | 0xfe20..=0xfe2f => 0,
        // Hangul Jamo, CJK, Hangul syllables, fullwidth forms, emoji
        0x1100..=0x115f
        | 0x2e80..=0x303e
        | 0x3041..=0x33ff
        | 0x3400..=0x4dbf
        | 0x4e00..=0x9fff
        | 0xa000..=0xa4cf
        | 0xac00..=0xd7a3
        | 0xf900..=0xfaff
        | 0xfe30..=0xfe4f
        | 0xff00..=0xff60
        | 0xffe0..=0xffe6
        | 0x1f300..=0x1f64f
        | 0x1f900..=0x1f9ff
        | 0x20000..=0x3fffd => 2,
        _ => 1,
    }
}

/// `<hostname>:<pid>:<random>`: unique per process, so a restarted process on
/// the same host never mistakes its predecessor's lease for its own.
pub fn default_holder() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    // RandomState is seeded from the OS's randomness per process.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{host}:{}:{:08x}", std::process::id(), h.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "invoice-sweeper",
            "a",
            "nightly_backup.v2",
            &"x".repeat(128),
        ] {
            assert_eq!(parse_name(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "",
            "-x",
            ".hidden",
            "a b",
            "x'; DROP TABLE leader_lease; --",
            "ü",
            "a/b",
            &"x".repeat(129),
        ] {
            assert!(parse_name(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            parse_name("a b").unwrap_err().to_string(),
            "lease name contains ' '; allowed are letters, digits, '.', '_' and '-'"
        );
        assert_eq!(
            parse_name(&"x".repeat(129)),
            Err(NameError::TooLong { len: 129 })
        );
    }

    #[test]
    fn printable_and_width() {
        assert_eq!(printable("a\nb\u{202e}c"), "a\\nb\\u{202e}c");
        assert_eq!(printable("host-ä:1"), "host-ä:1");
        assert_eq!(display_width("ab"), 2);
        assert_eq!(display_width("äö"), 2);
        assert_eq!(display_width("e\u{301}"), 1);
        assert_eq!(display_width("主机"), 4);
    }

    #[test]
    fn slots_are_leases_of_their_own() {
        assert_eq!(parse_slots("1"), Ok(1));
        assert_eq!(parse_slots("64"), Ok(MAX_SLOTS));
        for bad in ["0", "65", "-1", "two", "", "1.5"] {
            assert!(parse_slots(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_slots("0").unwrap_err(), "0 is out of range: 1 to 64");
        assert_eq!(parse_slot("0"), Ok(0));
        assert_eq!(parse_slot("63"), Ok(63));
        assert!(parse_slot("64").is_err() && parse_slot("-1").is_err());
        assert_eq!(slot_name("job", 0), "job");
        assert_eq!(slot_name("job", 3), "job#3");
        for i in [0, 1, 9, 10, 63] {
            assert_eq!(slot_of(&slot_name("job", i), "job"), Some(i));
            assert_eq!(split_slot(&slot_name("job", i)), ("job", i));
        }
        for other in [
            "jobs", "job#", "job#0", "job#01", "job#+1", "job#x", "jo", "job#1#2",
        ] {
            assert_eq!(slot_of(other, "job"), None, "{other}");
        }
        assert_eq!(split_slot("job#01"), ("job#01", 0));
        assert_eq!(split_slot("other"), ("other", 0));
    }

    #[test]
    fn holders() {
        assert!(parse_holder("host-b:812").is_ok());
        assert!(parse_holder("").is_err());
        assert_eq!(parse_holder("a\nb"), Err(HolderError::Control));
        assert!(parse_holder(&"h".repeat(257)).is_err());
        let d = default_holder();
        assert_eq!(d.split(':').count(), 3, "{d}");
        assert!(parse_holder(&d).is_ok());
        assert_ne!(default_holder(), d, "random part must differ between calls");
    }
}
