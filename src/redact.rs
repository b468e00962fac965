//! Keeping passwords out of logs, errors and cron mail.
//!
//! A store URL may carry a password in its userinfo (`postgres://u:pw@h/db`)
//! or as a query parameter (`?password=pw`). Redaction works on the *parsed*
//! URL: the password fields are replaced, and only the result is ever shown.
//! Nothing searches error text for the password: a string that does not
//! parse is never shown at all (the caller names where it came from), and a
//! search for a short password would star out ordinary words and so reveal
//! it.

use std::fmt;

/// Query parameters that carry a secret, in any store's URL.
const SECRET_PARAMS: [&str; 3] = ["password", "sslpassword", "pass"];

/// A store URL with every password replaced by `***`, ready to show.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(String);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Redacted {
    pub fn new(url: &url::Url) -> Redacted {
        let mut shown = url.clone();
        if shown.password().is_some() {
            // Only fails for URLs that cannot have a password at all, which
            // then have none to hide.
            let _ = shown.set_password(Some("***"));
        }
        if shown.query().is_some() {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let secret = SECRET_PARAMS.iter().any(|s| k.eq_ignore_ascii_case(s));
                    (
                        k.into_owned(),
                        if secret { "***".into() } else { v.into_owned() },
                    )
                })
                .collect();
            let mut q = shown.query_pairs_mut();
            q.clear();
            for (k, v) in &pairs {
                q.append_pair(k, v);
            }
        }
        // `***` is percent-encoded by the setters; show it as typed.
        Redacted(shown.as_str().replace("%2A%2A%2A", "***"))
    }

    pub fn url(&self) -> &str {
        &self.0
    }
}

/// A store string as given (`--store`, `LEADERRUN_STORE`), which may hold
/// a password. Its `Debug` shows the redacted URL when the string parses as
/// one, else `<hidden>`, so a `{:?}` of the command line or of a
/// configuration never prints the password; it has no `Display`. The text
/// itself is had only by asking for it ([`Secret::expose`]), where the
/// store is opened.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn into_exposed(self) -> String {
        self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            // The embedded store: nothing to hide, and worth telling apart.
            return f.write_str("\"\"");
        }
        match url::Url::parse(&self.0) {
            Ok(u) => fmt::Debug::fmt(Redacted::new(&u).url(), f),
            Err(_) => f.write_str("<hidden>"),
        }
    }
}

/// The scheme of `raw` when it plainly starts with one (`[a-z][a-z0-9+.-]*`
/// followed by `://`), else `None`. This is the only part of a store string
/// that is shown when the string is not understood.
pub fn plain_scheme(raw: &str) -> Option<&str> {
    let (scheme, _) = raw.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let plain = first.is_ascii_lowercase()
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '.' | '-'));
    plain.then_some(scheme)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(s: &str) -> String {
        Redacted::new(&url::Url::parse(s).expect("parses")).to_string()
    }

    #[test]
    fn userinfo_password_is_hidden() {
        assert_eq!(
            shown("postgres://app:s3cret@db.example:5432/jobs?sslmode=require"),
            "postgres://app:***@db.example:5432/jobs?sslmode=require"
        );
    }

    #[test]
    fn query_password_is_hidden() {
        assert_eq!(
            shown("postgres://db/jobs?user=app&password=hunter2&sslmode=disable"),
            "postgres://db/jobs?user=app&password=***&sslmode=disable"
        );
    }

    #[test]
    fn encoded_and_one_letter_passwords_are_hidden() {
        assert_eq!(
            shown("postgres://app:p%40s%2Fs%23@db/jobs"),
            "postgres://app:***@db/jobs"
        );
        // A one-letter password leaves every other letter alone.
        assert_eq!(
            shown("postgres://a:a@authentication/a?application_name=a"),
            "postgres://a:***@authentication/a?application_name=a"
        );
    }

    #[test]
    fn url_without_password_is_unchanged() {
        for u in [
            "postgres://app@db/jobs",
            "postgres://db/jobs",
            "sqlite:///tmp/x.db",
        ] {
            assert_eq!(shown(u), u);
        }
    }

    #[test]
    fn a_secret_debugs_without_its_password() {
        let d = |s: &str| format!("{:?}", Secret::from(s.to_string()));
        assert_eq!(
            d("postgres://app:hunter2@db/jobs?password=hunter3"),
            r#""postgres://app:***@db/jobs?password=***""#
        );
        assert_eq!(d("host=db password=hunter2"), "<hidden>");
        assert_eq!(d("etcd://u:hunter2@a:2379,b:2379"), "<hidden>");
        assert_eq!(d("sqlite:///var/lib/x.db"), r#""sqlite:///var/lib/x.db""#);
        assert_eq!(d(""), r#""""#);
        let s = Secret::from("redis://:hunter2@h".to_string());
        assert_eq!(s.expose(), "redis://:hunter2@h");
    }

    #[test]
    fn only_plain_schemes_are_shown() {
        assert_eq!(plain_scheme("redis://:pw@h"), Some("redis"));
        assert_eq!(plain_scheme("my-sql+x.1://h"), Some("my-sql+x.1"));
        for raw in [
            "host=db password=hunter2",
            "Pg://x",
            "1x://x",
            "://x",
            "pass word://x",
            "host=x password=a://b",
        ] {
            assert_eq!(plain_scheme(raw), None, "{raw}");
        }
    }
}
