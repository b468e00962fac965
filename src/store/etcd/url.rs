//! The URL: `etcd://[user:password@]host[:port][,host[:port]…][?cacert=PATH]`.

use crate::store::target::{check_params, host_port, ENDPOINT_PARAM};
use crate::store::UrlError;

pub(super) const DEFAULT_PORT: u16 = 2379;

/// One `host[:port]` (`[v6]:port` for IPv6), default port 2379.
pub(super) fn endpoint(h: &str) -> Result<(String, u16), UrlError> {
    host_port(h, DEFAULT_PORT)
}

/// `etcd://[user:password@]host[:port][,host[:port]…][/][?cacert=PATH]`
/// (the host list folded into `endpoint=` parameters by [`fold_hosts`]);
/// `etcds://` for TLS.
pub(super) fn from_url(url: &url::Url) -> Result<ParsedUrl, UrlError> {
    check_params(url, &["cacert", ENDPOINT_PARAM])?;
    let tls = url.scheme() == "etcds";
    let first = match url.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_string(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => a.to_string(),
        _ => return Err("has no host (etcd://host:2379[,host:2379…])".into()),
    };
    let mut endpoints = vec![(first, url.port().unwrap_or(DEFAULT_PORT))];
    let mut ca_file = None;
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "cacert" if !v.is_empty() => ca_file = Some(std::path::PathBuf::from(v.as_ref())),
            ENDPOINT_PARAM => endpoints.push(endpoint(&v)?),
            _ => return Err(format!("has an empty {k}").into()),
        }
    }
    if !matches!(url.path(), "" | "/") {
        return Err("has a path; etcd:// takes none (etcd://host:2379[,host:2379…])".into());
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| "has a user or password that is not valid UTF-8 once decoded".to_string())
    };
    let user = match (url.username(), url.password()) {
        ("", None) => None,
        (name, pw) => Some((decode(name)?, decode(pw.unwrap_or(""))?)),
    };
    // Shown in logs and errors: rebuilt from the parts, so the password
    // is never part of it whatever it contains.
    let mut shown = format!("{}://", url.scheme());
    if !url.username().is_empty() || url.password().is_some() {
        shown.push_str(url.username());
        if url.password().is_some() {
            shown.push_str(":***");
        }
        shown.push('@');
    }
    let hosts: Vec<String> = endpoints
        .iter()
        .map(|(h, p)| {
            if h.contains(':') {
                format!("[{h}]:{p}")
            } else {
                format!("{h}:{p}")
            }
        })
        .collect();
    shown.push_str(&hosts.join(","));
    if let Some(ca) = &ca_file {
        shown.push_str(&format!("/?cacert={}", ca.display()));
    }
    Ok(ParsedUrl {
        tls,
        endpoints,
        user,
        ca_file,
        shown,
    })
}

pub(super) struct ParsedUrl {
    pub(super) tls: bool,
    pub(super) endpoints: Vec<(String, u16)>,
    pub(super) user: Option<(String, String)>,
    pub(super) ca_file: Option<std::path::PathBuf>,
    pub(super) shown: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parsed(raw: &str) -> Result<ParsedUrl, String> {
        let url =
            ::url::Url::parse(&crate::store::target::fold_hosts(raw)).map_err(|e| e.to_string())?;
        from_url(&url).map_err(|e| e.to_string())
    }

    #[test]
    fn urls() {
        let p = parsed("etcd://a:1,b,[::1]:3/").expect("parses");
        assert!(!p.tls && p.user.is_none());
        assert_eq!(
            p.endpoints,
            vec![
                ("a".to_string(), 1),
                ("b".to_string(), 2379),
                ("::1".to_string(), 3)
            ]
        );
        assert_eq!(p.shown, "etcd://a:1,b:2379,[::1]:3");
        let p = parsed("etcds://u:p%40ss@h:2379?cacert=/tmp/ca.pem").expect("parses");
        assert!(p.tls);
        assert_eq!(p.user, Some(("u".to_string(), "p@ss".to_string())));
        assert_eq!(p.ca_file, Some("/tmp/ca.pem".into()));
        for bad in [
            "etcd://",
            "etcd://h:notaport",
            "etcd://h?what=1",
            "etcd://a:1,b:x",
            "etcd://h/some/path",
        ] {
            assert!(parsed(bad).is_err(), "{bad}");
        }
    }

    /// A password is never shown, with one host or many, whatever it holds
    /// (commas and colons included, which the host list also uses).
    #[test]
    fn passwords_are_never_shown() {
        for (raw, shown) in [
            ("etcd://u:Hunter2x@h:1", "etcd://u:***@h:1"),
            ("etcd://u:Hun,ter2x@a:1,b:2", "etcd://u:***@a:1,b:2"),
            ("etcds://u:Hun:ter2x@a,b", "etcds://u:***@a:2379,b:2379"),
            (
                "etcd://u:Hunter2x@a:1,b:2?cacert=/ca.pem",
                "etcd://u:***@a:1,b:2/?cacert=/ca.pem",
            ),
        ] {
            let p = parsed(raw).expect(raw);
            assert_eq!(p.shown, shown);
        }
        // Through the registry, as the binary opens it: an unusable host
        // list is refused without the string.
        for raw in ["etcd://u:Hunter2x@a:1,b:bad", "etcd://u:Hunter2x@a:1,"] {
            let e = match crate::store::open(
                Some((raw, crate::store::Origin::Flag)),
                "t",
                Duration::from_secs(1),
            ) {
                Ok(s) => panic!("{raw} opened as {}", s.describe()),
                Err(e) => e.to_string(),
            };
            assert!(!e.contains("Hunter2x"), "{e}");
            assert!(e.contains("--store"), "{e}");
        }
        let s = crate::store::open(
            Some(("etcd://u:Hun,ter2x@a:1,b:2", crate::store::Origin::Flag)),
            "t",
            Duration::from_secs(1),
        )
        .expect("opens");
        assert_eq!(s.describe(), "etcd://u:***@a:1,b:2");
    }
}
