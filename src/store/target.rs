//! The store string: where it comes from, how it is parsed, and how it is
//! refused (one line, never echoed). Each store's own parameters are read
//! in its folder (`url.rs`); the rules every store string follows are here.

use crate::store::UrlError;
use std::time::Duration;

use super::REGISTRY;
use crate::redact;

/// What a constructor gets.
pub struct Target<'a> {
    /// The parsed store URL (scheme lowercased by the parser).
    pub url: &'a url::Url,
    /// Shown to the server where it can show it (Postgres `application_name`).
    pub app_name: &'a str,
    /// Server-side bound for one call, where the server has one.
    pub call_timeout: Duration,
}

/// Where a store string came from; errors name it instead of echoing the
/// string (which may hold a password).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// `--store`
    #[default]
    Flag,
    /// `LEADERRUN_STORE` (clap reads it for `--store`)
    LeaderrunStore,
    /// `DATABASE_URL`
    DatabaseUrl,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::Flag => "--store",
            Origin::LeaderrunStore => "LEADERRUN_STORE",
            Origin::DatabaseUrl => "DATABASE_URL",
        })
    }
}

/// Why no store could be opened. Usage errors exit 2; a failure of the
/// environment (no `HOME` for the embedded store) exits 125. None of them
/// contains the store string.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("the store string from {0} contains a control character (a newline or tab?)")]
    ControlCharacter(Origin),
    #[error(
        "the store string from {0} is not a URL leaderrun understands (expected {known})",
        known = known_schemes()
    )]
    NotAUrl(Origin),
    #[error(
        "the store URL from {origin} has an unknown scheme {scheme}:// (expected {known})",
        known = known_schemes()
    )]
    UnknownScheme { origin: Origin, scheme: String },
    /// A store this build left out (its Cargo feature was not enabled).
    #[error(
        "the store URL from {origin} names a {scheme}:// store, which this leaderrun was built \
         without (its Cargo feature {feature} was not enabled)"
    )]
    NotBuilt {
        origin: Origin,
        scheme: String,
        feature: &'static str,
    },
    /// A URL its store cannot use (each store's own rules).
    #[error("the store URL from {origin} {error}")]
    Url {
        origin: Origin,
        #[source]
        error: UrlError,
    },
    #[error(
        "LEADERRUN_STATE_DIR must be an absolute path (a relative one would name a different \
         file in every working directory)"
    )]
    RelativeStateDir,
    /// No place for the embedded store: a failure of the environment.
    #[error(
        "no store configured, and no place for the embedded one: HOME is not set to an \
         absolute path (set LEADERRUN_STATE_DIR or --store)"
    )]
    NoHome,
}

impl ResolveError {
    pub fn exit(&self) -> crate::exit::Exit {
        match self {
            ResolveError::NoHome => crate::exit::Exit::Failure,
            _ => crate::exit::Exit::Usage,
        }
    }
}

/// The store string to use: `given` (from `--store` or `LEADERRUN_STORE`, as
/// `origin` says), else a non-empty `DATABASE_URL`. `None` means the embedded
/// default; an explicitly empty `--store ''` or `LEADERRUN_STORE=` asks for
/// it too, even when `DATABASE_URL` is set.
pub fn choose(given: Option<String>, origin: Origin) -> Option<(String, Origin)> {
    match given {
        Some(s) if s.trim().is_empty() => None,
        Some(s) => Some((s, origin)),
        None => std::env::var("DATABASE_URL")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| (s, Origin::DatabaseUrl)),
    }
}
/// The schemes of the stores this build has, for errors.
pub(crate) fn known_schemes() -> String {
    let all: Vec<String> = REGISTRY
        .iter()
        .filter(|e| e.open.is_some())
        .flat_map(|e| e.schemes.iter())
        .map(|s| format!("{s}://"))
        .collect();
    all.join(", ")
}

/// Parse a store string without ever echoing it: a URL that does not parse
/// is named by its origin, and its scheme is shown only when it is plainly a
/// scheme (`[a-z][a-z0-9+.-]*://`), never anything after it.
pub(crate) fn parse(raw: &str, origin: Origin) -> Result<url::Url, ResolveError> {
    // URL parsing drops tabs and newlines silently, so the URL used would
    // not be the string given (and the watchdog, which resolves the string
    // again, must reach the same store). No store string needs one.
    if raw.chars().any(char::is_control) {
        return Err(ResolveError::ControlCharacter(origin));
    }
    let Some(scheme) = redact::plain_scheme(raw) else {
        return Err(ResolveError::NotAUrl(origin));
    };
    let Some(entry) = REGISTRY.iter().find(|e| e.schemes.contains(&scheme)) else {
        return Err(ResolveError::UnknownScheme {
            origin,
            scheme: scheme.to_string(),
        });
    };
    if entry.open.is_none() {
        return Err(ResolveError::NotBuilt {
            origin,
            scheme: scheme.to_string(),
            feature: entry.feature,
        });
    }
    // Clusters are named by a host list (`etcd://a:2379,b:2379`, libpq's
    // multi-host URLs), which URL syntax has no room for; it is rewritten
    // into one first.
    let folded;
    let raw = if entry.host_list {
        folded = fold_hosts(raw);
        folded.as_str()
    } else {
        raw
    };
    let url = url::Url::parse(raw).map_err(|e| ResolveError::Url {
        origin,
        error: UrlError::because(
            format!(
                "is not valid: {e} \
                 (a password containing '/', '?', '#' or '@' must be percent-encoded)"
            ),
            e,
        ),
    })?;
    // A '#' or an '@' after the host is what an unencoded '/', '?' or '#' in
    // a password leaves behind when the rest happens to parse (a numeric
    // "port"): refuse rather than connect somewhere odd and show it.
    if url.fragment().is_some() || url.path().contains('@') {
        return Err(ResolveError::Url {
            origin,
            error: "is not valid: it has a '#' part or an '@' after the host \
                    (a password containing '/', '?', '#' or '@' must be percent-encoded)"
                .into(),
        });
    }
    Ok(url)
}

/// The query parameter that carries the hosts after the first (see
/// [`fold_hosts`]).
pub(crate) const ENDPOINT_PARAM: &str = "endpoint";

/// Rewrite a host list, `etcd://[userinfo@]h1:p1,h2:p2[/][?query]`, into a
/// URL the URL standard allows: the first host stays, each further one
/// becomes an `endpoint=h2:p2` query parameter (a form that may also be
/// written directly). The `url` crate would refuse the list ("invalid port
/// number" at the first comma).
///
/// Only the text after the last `@` of the authority is touched, so a
/// password (which may contain commas) is carried over unchanged and never
/// inspected; a string without a comma there is returned as it was.
pub(crate) fn fold_hosts(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return raw.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => authority.split_at(i + 1),
        None => ("", authority),
    };
    let Some((first, more)) = hosts.split_once(',') else {
        return raw.to_string();
    };
    let (path, query_and_fragment) = tail.split_at(tail.find(['?', '#']).unwrap_or(tail.len()));
    let (query, fragment) = match query_and_fragment.find('#') {
        Some(i) => query_and_fragment.split_at(i),
        None => (query_and_fragment, ""),
    };
    let mut query = query.trim_start_matches('?').to_string();
    for h in more.split(',') {
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str(ENDPOINT_PARAM);
        query.push('=');
        query.push_str(h);
    }
    let path = if path.is_empty() { "/" } else { path };
    format!("{scheme}://{userinfo}{first}{path}?{query}{fragment}")
}
/// One `host[:port]` of a host list (`[v6]:port` for IPv6), `default` when
/// it names no port.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn host_port(h: &str, default: u16) -> Result<(String, u16), UrlError> {
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
            let port = port
                .parse::<u16>()
                .map_err(|_| "has an endpoint with an invalid port number".to_string())?;
            (host, port)
        }
        _ => (h, default),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err("has an endpoint without a host".into());
    }
    Ok((host.to_string(), port))
}

/// Refuse query parameters the driver would not understand, naming the
/// parameter only when it looks like one: sqlx logs unknown parameters with
/// their value, which may be a secret.
#[cfg(any(
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]
pub(crate) fn check_params(url: &url::Url, known: &[&str]) -> Result<(), UrlError> {
    for (k, _) in url.query_pairs() {
        let options_entry = known.contains(&"options") && k.starts_with("options[");
        if !known.contains(&k.as_ref()) && !options_entry {
            let plain = !k.is_empty()
                && k.len() <= 40
                && k.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '-');
            return Err(if plain {
                format!("has an unknown parameter {k}").into()
            } else {
                "has a query parameter that is not understood".into()
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::open;

    #[test]
    fn host_lists_are_folded_into_parameters() {
        assert_eq!(
            fold_hosts("etcd://a:1,b,[::1]:3"),
            "etcd://a:1/?endpoint=b&endpoint=[::1]:3"
        );
        assert_eq!(
            fold_hosts("etcds://u:p,w@a:1,b:2/?cacert=/ca.pem"),
            "etcds://u:p,w@a:1/?cacert=/ca.pem&endpoint=b:2"
        );
        // One host: untouched, commas in the password included.
        for one in ["etcd://u:a,b@h:2379", "etcd://h", "etcd://h:1/?cacert=/x,y"] {
            assert_eq!(fold_hosts(one), one);
        }
        // The url crate alone refuses a host list.
        assert!(url::Url::parse("etcd://a:1,b:2").is_err());
    }

    #[cfg(all(feature = "postgres", feature = "mysql"))]
    fn err(raw: &str) -> String {
        match open(
            Some((raw, Origin::DatabaseUrl)),
            "t",
            Duration::from_secs(1),
        ) {
            Ok(s) => panic!("{raw} opened as {}", s.describe()),
            Err(e) => e.to_string(),
        }
    }

    #[cfg(all(feature = "postgres", feature = "mysql"))]
    #[test]
    fn unparsable_strings_are_named_by_origin_never_echoed() {
        for (raw, secret, want) in [
            (
                "postgres://u:pa/ss@h/db",
                "pa/ss",
                "from DATABASE_URL is not valid: invalid port number",
            ),
            ("postgres://u:p#ss@h/db", "p#ss", "is not valid"),
            ("postgres://u:p?ss@h/db", "p?ss", "is not valid"),
            ("mysql://u:12/34@h/db", "12/34", "is not valid"),
            ("postgres://u:12#34@h/db", "12#34", "is not valid"),
            (
                "host=db password=hunter2 dbname=x",
                "hunter2",
                "is not a URL leaderrun understands",
            ),
            (
                "memcache://:hunter2@h:11211/0",
                "hunter2",
                "unknown scheme memcache://",
            ),
            ("Xyz:hunter2@h", "hunter2", "is not a URL"),
            ("hunter2", "hunter2", "is not a URL"),
        ] {
            let e = err(raw);
            assert!(e.contains(want), "{raw}: {e}");
            assert!(!e.contains(secret), "{raw}: echoed: {e}");
            assert!(e.contains("DATABASE_URL"), "{e}");
        }
    }

    /// sqlx logs parameters it does not know together with their value.
    #[cfg(all(feature = "postgres", feature = "mysql"))]
    #[test]
    fn unknown_parameters_are_refused_by_name_only() {
        let e = err("postgres://u@h/db?pasword=Hunter2x");
        assert!(e.contains("unknown parameter pasword"), "{e}");
        let e = err("mysql://u@h/db?Hunter2x=1");
        assert!(
            e.contains("a query parameter that is not understood"),
            "{e}"
        );
        for e in [
            err("postgres://u@h/db?pasword=Hunter2x"),
            err("mysql://u@h/db?Hunter2x=1"),
        ] {
            assert!(!e.contains("Hunter2x"), "{e}");
        }
    }

    #[cfg(all(feature = "postgres", feature = "mysql"))]
    #[test]
    fn passwords_are_hidden_in_the_description() {
        for (raw, shown) in [
            ("postgres://u:x@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u:p%2Fs%23s@h:5/db?sslmode=disable",
                "postgres://u:***@h:5/db?sslmode=disable",
            ),
            (
                "mysql://u:x@h/db?password=y",
                "mysql://u:***@h/db?password=***",
            ),
        ] {
            let s = open(Some((raw, Origin::Flag)), "t", Duration::from_secs(1)).expect(raw);
            assert_eq!(s.describe(), shown);
        }
    }

    #[test]
    fn a_store_left_out_of_the_build_is_named_with_its_feature() {
        let e = ResolveError::NotBuilt {
            origin: Origin::DatabaseUrl,
            scheme: "redis".into(),
            feature: "redis",
        };
        assert_eq!(
            e.to_string(),
            "the store URL from DATABASE_URL names a redis:// store, which this leaderrun was \
             built without (its Cargo feature redis was not enabled)"
        );
        assert_eq!(e.exit(), crate::exit::Exit::Usage);
    }

    /// Through the registry, as the binary opens it: every scheme of a
    /// store this build left out, before anything else is looked at.
    #[test]
    fn every_store_left_out_is_refused_by_its_feature() {
        for entry in REGISTRY.iter().filter(|e| e.open.is_none()) {
            let feature = entry.feature;
            for scheme in entry.schemes {
                let raw = format!("{scheme}://u:Hunter2x@h:1,h:2/db?x=1");
                let e = match open(Some((&raw, Origin::Flag)), "t", Duration::from_secs(1)) {
                    Ok(_) => panic!("{scheme}:// opened"),
                    Err(e) => e,
                };
                let said = e.to_string();
                assert!(matches!(e, ResolveError::NotBuilt { .. }), "{said}");
                assert!(
                    said.contains(&format!("Cargo feature {feature} ")),
                    "{said}"
                );
                assert!(!said.contains("Hunter2x"), "{said}");
            }
        }
    }
}
