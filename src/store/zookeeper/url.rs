//! The URL: `zk://[user:password@]host[:port][,host[:port]…][/chroot]`
//! (or `zookeeper://`), default port 2181.

use crate::store::target::{check_params, host_port, ENDPOINT_PARAM};
use crate::store::UrlError;

const DEFAULT_PORT: u16 = 2181;

pub(super) struct ParsedUrl {
    /// `host:port` of every server (`[v6]:port` for IPv6).
    pub hosts: Vec<String>,
    /// Digest authentication, decoded.
    pub user: Option<(String, String)>,
    /// Where leaderrun's nodes live: `""` for the root, else `/a/b`.
    pub chroot: String,
    /// For logs and errors, rebuilt from the parts, password hidden.
    pub shown: String,
}

/// The URL as the registry parsed it (the host list folded into
/// `endpoint=` parameters by `fold_hosts`).
pub(super) fn from_url(url: &url::Url) -> Result<ParsedUrl, UrlError> {
    // Known, so that it is refused for what it is rather than as an
    // unknown scheme: this store speaks plain TCP only.
    if url.scheme() == "zks" {
        return Err(
            "asks for TLS (zks://), which leaderrun's ZooKeeper store does not support: \
                    use zk:// on a trusted network"
                .into(),
        );
    }
    check_params(url, &[ENDPOINT_PARAM])?;
    let first = match url.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_string(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => a.to_string(),
        _ => return Err("has no host (zk://host:2181[,host:2181…][/chroot])".into()),
    };
    let mut endpoints = vec![(first, url.port().unwrap_or(DEFAULT_PORT))];
    for (_, v) in url.query_pairs() {
        endpoints.push(host_port(&v, DEFAULT_PORT)?);
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
    let chroot = chroot(url.path())?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| "has a user or password that is not valid UTF-8 once decoded".to_string())
    };
    let user = match (url.username(), url.password()) {
        ("", None) => None,
        ("", Some(_)) => return Err("has a password but no user (zk://user:password@…)".into()),
        (name, pw) => Some((decode(name)?, decode(pw.unwrap_or(""))?)),
    };
    let mut shown = format!("{}://", url.scheme());
    if !url.username().is_empty() {
        shown.push_str(url.username());
        if url.password().is_some() {
            shown.push_str(":***");
        }
        shown.push('@');
    }
    shown.push_str(&hosts.join(","));
    shown.push_str(&chroot);
    Ok(ParsedUrl {
        hosts,
        user,
        chroot,
        shown,
    })
}

/// The chroot from the URL's path: `/` or nothing for the root, else
/// absolute without a trailing `/`, each part a valid node name.
fn chroot(path: &str) -> Result<String, UrlError> {
    let path = path.trim_end_matches('/');
    if path.is_empty() {
        return Ok(String::new());
    }
    let decoded = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| "has a chroot that is not valid UTF-8 once decoded".to_string())?;
    for part in decoded.split('/').skip(1) {
        if part.is_empty() || part == "." || part == ".." || part.chars().any(char::is_control) {
            return Err(
                "has a chroot that is not a ZooKeeper path (/a/b: no empty, '.' or '..' parts)"
                    .into(),
            );
        }
    }
    Ok(decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Result<ParsedUrl, String> {
        let url =
            ::url::Url::parse(&crate::store::target::fold_hosts(raw)).map_err(|e| e.to_string())?;
        from_url(&url).map_err(|e| e.to_string())
    }

    #[test]
    fn hosts_chroot_and_user() {
        let p = parsed("zk://a:1,b,[::1]:3/apps/x").expect("parses");
        assert_eq!(p.hosts, ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(p.chroot, "/apps/x");
        assert!(p.user.is_none());
        assert_eq!(p.shown, "zk://a:1,b:2181,[::1]:3/apps/x");

        let p = parsed("zookeeper://lr:p%40ss,w@h/").expect("parses");
        assert_eq!(p.hosts, ["h:2181"]);
        assert_eq!(p.chroot, "");
        assert_eq!(p.user, Some(("lr".into(), "p@ss,w".into())));
        assert_eq!(p.shown, "zookeeper://lr:***@h:2181");
        assert!(!p.shown.contains("ss,w"));
    }

    #[test]
    fn what_is_refused() {
        for (raw, says) in [
            ("zk:///x", "no host"),
            ("zk://h/a//b", "not a ZooKeeper path"),
            // (`a/../b` never gets here: the URL parser resolves dot
            // segments, as for every store's URL.)
            ("zk://h:1?x=1", "unknown parameter x"),
            ("zk://:pw@h", "no user"),
            ("zk://h,:1", "without a host"),
            ("zks://h:2281", "TLS (zks://)"),
        ] {
            match parsed(raw) {
                Ok(_) => panic!("{raw} parsed"),
                Err(e) => assert!(e.contains(says), "{raw}: {e}"),
            }
        }
    }
}
