//! Keeping passwords out of logs, errors and cron mail.
//!
//! A store URL may carry a password in its userinfo (`postgres://u:pw@h/db`)
//! or as a query parameter (`?password=pw`). Every place that shows a URL
//! shows [`Redacted::url`]; every error text that leaves the store passes
//! through [`Redacted::scrub`], which also removes the raw password should a
//! driver ever echo it.

use std::fmt;

#[derive(Clone)]
pub struct Redacted {
    shown: String,
    secrets: Vec<String>,
}

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl Redacted {
    pub fn new(url: &str) -> Redacted {
        let mut secrets = Vec::new();
        let mut shown = url.to_string();

        // userinfo: scheme://user:password@host...
        if let Some(scheme_end) = url.find("://") {
            let rest = &url[scheme_end + 3..];
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &rest[..authority_end];
            if let Some(at) = authority.rfind('@') {
                let userinfo = &authority[..at];
                if let Some(colon) = userinfo.find(':') {
                    let pw = &userinfo[colon + 1..];
                    if !pw.is_empty() {
                        secrets.push(pw.to_string());
                        let start = scheme_end + 3 + colon + 1;
                        shown = format!("{}***{}", &url[..start], &url[start + pw.len()..]);
                    }
                }
            }
        }
        // query parameters named password / sslpassword
        if let Some(q) = shown.find('?') {
            let (head, query) = shown.split_at(q + 1);
            let parts: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, v))
                        if k.eq_ignore_ascii_case("password")
                            || k.eq_ignore_ascii_case("sslpassword") =>
                    {
                        if !v.is_empty() {
                            secrets.push(v.to_string());
                        }
                        format!("{k}=***")
                    }
                    _ => kv.to_string(),
                })
                .collect();
            shown = format!("{head}{}", parts.join("&"));
        }
        // A password is also shown percent-decoded by some drivers.
        let decoded: Vec<String> = secrets
            .iter()
            .filter_map(|s| percent_decode(s).filter(|d| d != s))
            .collect();
        secrets.extend(decoded);
        secrets.retain(|s| !s.is_empty());
        Redacted { shown, secrets }
    }

    /// The URL with any password replaced by `***`.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// `text` with every occurrence of a password replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            out = out.replace(s.as_str(), "***");
        }
        out
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_password_is_hidden() {
        let r = Redacted::new("postgres://app:s3cret@db.example:5432/jobs?sslmode=require");
        assert_eq!(
            r.url(),
            "postgres://app:***@db.example:5432/jobs?sslmode=require"
        );
        assert_eq!(r.scrub("auth failed with s3cret"), "auth failed with ***");
    }

    #[test]
    fn query_password_is_hidden() {
        let r = Redacted::new("postgres://db/jobs?user=app&password=hunter2&sslmode=disable");
        assert_eq!(
            r.url(),
            "postgres://db/jobs?user=app&password=***&sslmode=disable"
        );
        assert!(!r.scrub("x hunter2 y").contains("hunter2"));
    }

    #[test]
    fn encoded_password_is_hidden_in_both_forms() {
        let r = Redacted::new("postgres://app:p%40ss@db/jobs");
        assert_eq!(r.url(), "postgres://app:***@db/jobs");
        assert_eq!(r.scrub("p@ss and p%40ss"), "*** and ***");
    }

    #[test]
    fn url_without_password_is_unchanged() {
        for u in [
            "postgres://app@db/jobs",
            "postgres://db/jobs",
            "sqlite:///tmp/x.db",
            "garbage",
        ] {
            assert_eq!(Redacted::new(u).url(), u);
        }
    }
}
