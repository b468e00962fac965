//! What a lease name and a holder id may look like.
//!
//! Names end up in SQL (always as bound parameters), in file paths of other
//! backends, in logs and in environment variables, so they are restricted to
//! a set that is safe and unambiguous everywhere: 1 to 128 characters from
//! `A-Z a-z 0-9 . _ -`, not starting with `-` or `.`.

pub const MAX_NAME: usize = 128;
pub const MAX_HOLDER: usize = 256;

pub fn parse_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("lease name must not be empty".into());
    }
    if s.len() > MAX_NAME {
        return Err(format!(
            "lease name is {} characters long; at most {MAX_NAME} allowed",
            s.len()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "lease name contains {c:?}; allowed are letters, digits, '.', '_' and '-'"
        ));
    }
    if s.starts_with(['-', '.']) {
        return Err("lease name must not start with '-' or '.'".into());
    }
    Ok(s.to_string())
}

/// Holder ids are free text for humans (hostnames, pod names), but bounded and
/// printable so they cannot break a log line or a status table.
pub fn parse_holder(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("holder id must not be empty".into());
    }
    if s.len() > MAX_HOLDER {
        return Err(format!(
            "holder id is {} bytes long; at most {MAX_HOLDER} allowed",
            s.len()
        ));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err("holder id must not contain control characters".into());
    }
    Ok(s.to_string())
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
    }

    #[test]
    fn holders() {
        assert!(parse_holder("host-b:812").is_ok());
        assert!(parse_holder("").is_err());
        assert!(parse_holder("a\nb").is_err());
        assert!(parse_holder(&"h".repeat(257)).is_err());
        let d = default_holder();
        assert_eq!(d.split(':').count(), 3, "{d}");
        assert!(parse_holder(&d).is_ok());
        assert_ne!(default_holder(), d, "random part must differ between calls");
    }
}
