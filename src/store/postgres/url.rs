//! The URL: libpq's host lists and parameters, read into what sqlx needs.

use crate::store::UrlError;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use crate::redact::Redacted;
use crate::store::sql;
use crate::store::target::{check_params, ENDPOINT_PARAM};

// ---------------------------------------------------------------------------
// The URL: hosts and libpq's parameters.

/// libpq's `target_session_attrs` (libpq 14 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attrs {
    Any,
    ReadWrite,
    ReadOnly,
    Primary,
    Standby,
    PreferStandby,
}

impl Attrs {
    pub(super) fn parse(v: &str) -> Option<Attrs> {
        Some(match v {
            "any" => Attrs::Any,
            "read-write" => Attrs::ReadWrite,
            "read-only" => Attrs::ReadOnly,
            "primary" => Attrs::Primary,
            "standby" => Attrs::Standby,
            "prefer-standby" => Attrs::PreferStandby,
            _ => return None,
        })
    }

    /// Whether a server that says `in_recovery`, `read_only` will do.
    pub(super) fn accepts(self, in_recovery: bool, read_only: bool) -> bool {
        match self {
            Attrs::Any => true,
            Attrs::ReadWrite => !read_only,
            Attrs::ReadOnly => read_only,
            Attrs::Primary => !in_recovery,
            Attrs::Standby | Attrs::PreferStandby => in_recovery,
        }
    }
}

/// Query parameters sqlx understands; anything else would be logged by the
/// driver with its value, so it is refused here instead (by name only).
pub(super) const SQLX_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// libpq's parameters that leaderrun reads itself, and its own. They are
/// taken out of the URL before sqlx sees it.
///
/// * `keepalives*` are accepted and have no effect: every call is bounded by
///   its own timeout, so a dead connection costs one call, not a hang.
/// * `fallback_application_name` is accepted and has no effect: leaderrun
///   always names itself (`application_name` in the URL wins).
/// * `endpoint` carries the hosts after the first (see [`super::etcd::fold_hosts`]).
pub(super) const OWN_PARAMS: &[&str] = &[
    "target_session_attrs",
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "channel_binding",
    "fallback_application_name",
    "require",
    ENDPOINT_PARAM,
];

pub(super) const DEFAULT_PORT: u16 = 5432;
/// One `host[:port]` (`[v6]:port` for IPv6), default port 5432.
pub(super) fn host_port(h: &str) -> Result<(String, u16), UrlError> {
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
            let port = port
                .parse::<u16>()
                .map_err(|_| "has a host with an invalid port number".to_string())?;
            (host, port)
        }
        _ => (h, DEFAULT_PORT),
    };
    if host.is_empty() {
        return Err("has an empty host in its host list".into());
    }
    Ok((host.to_string(), port))
}

/// One server to try.
pub(super) struct Host {
    /// `host:port`, for errors.
    pub(super) shown: String,
    pub(super) opts: PgConnectOptions,
}

/// What the URL says beyond sqlx's options.
pub(super) struct Parsed {
    pub(super) hosts: Vec<Host>,
    pub(super) attrs: Attrs,
    pub(super) connect_timeout: Option<Duration>,
    pub(super) require_sync: bool,
    pub(super) shown: String,
}

pub(super) fn parse_url(url: &url::Url, app_name: &str) -> Result<Parsed, UrlError> {
    let known: Vec<&str> = SQLX_PARAMS.iter().chain(OWN_PARAMS).copied().collect();
    check_params(url, &known)?;
    let mut attrs = Attrs::Any;
    let mut connect_timeout = None;
    let mut require_sync = false;
    let mut more = Vec::new();
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "target_session_attrs" => {
                attrs = Attrs::parse(&v).ok_or(
                    "has a target_session_attrs that is not one of any, read-write, read-only, \
                     primary, standby, prefer-standby",
                )?;
            }
            // libpq: whole seconds, 0 or less waits for ever, 1 means 2.
            "connect_timeout" => {
                let s: i64 = v
                    .trim()
                    .parse()
                    .map_err(|_| "has a connect_timeout that is not a whole number of seconds")?;
                connect_timeout = (s > 0).then(|| Duration::from_secs(s.max(2) as u64));
            }
            "keepalives" | "keepalives_idle" | "keepalives_interval" | "keepalives_count" => {
                v.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("has a {k} that is not a whole number"))?;
            }
            "channel_binding" => match v.as_ref() {
                "disable" | "prefer" => {}
                "require" => {
                    return Err(
                        "has channel_binding=require, which leaderrun cannot honour \
                                (its Postgres driver does not do SCRAM channel binding); \
                                use prefer or disable"
                            .into(),
                    )
                }
                _ => return Err("has a channel_binding that is not one of disable, prefer".into()),
            },
            "require" => match v.as_ref() {
                "sync" => require_sync = true,
                _ => return Err("has a require= that is not sync".into()),
            },
            ENDPOINT_PARAM => more.push(host_port(&v)?),
            _ => {}
        }
    }
    let first = match url.host() {
        Some(url::Host::Domain(d)) => Some(d.to_string()),
        Some(url::Host::Ipv4(a)) => Some(a.to_string()),
        Some(url::Host::Ipv6(a)) => Some(format!("[{a}]")),
        None => None,
    };
    if first.as_deref().is_none_or(str::is_empty) && !more.is_empty() {
        return Err("has a host list whose first host is empty".into());
    }
    // The URL sqlx sees: one host at a time, only its own parameters.
    let mut base = url.clone();
    let own: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !OWN_PARAMS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if own.is_empty() {
        base.set_query(None);
    } else {
        base.query_pairs_mut().clear().extend_pairs(own);
    }
    let user_named_itself = url.query_pairs().any(|(k, _)| k == "application_name");
    let opts_for = |u: &url::Url| -> Result<PgConnectOptions, UrlError> {
        let opts = PgConnectOptions::from_url(u)
            .map_err(|e| UrlError::because(format!("is not valid: {}", sql::message(&e)), e))?;
        // Respect an application_name the user put in the URL.
        let opts = if user_named_itself {
            opts
        } else {
            opts.application_name(app_name)
        };
        // No `extra_float_digits` in the startup packet: PgBouncer refuses
        // any startup parameter it does not know, and we read no floats.
        // The timeouts are not sent as `options` either (PgBouncer refuses
        // that too, and in transaction pooling a session setting would land
        // on whichever server connection happens to serve the login): each
        // call sets them with SET LOCAL, in its own transaction.
        Ok(opts
            .extra_float_digits(None)
            // Our own log lines say what matters; SQL text in a cron mail does not.
            .disable_statement_logging())
    };
    let mut hosts = vec![Host {
        shown: match (&first, url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.clone(),
            (None, _) => "the default host".into(),
        },
        opts: opts_for(&base)?,
    }];
    for (h, p) in &more {
        let mut u = base.clone();
        u.set_host(Some(h))
            .map_err(|_| "has a host in its host list that is not valid")?;
        u.set_port(Some(*p))
            .map_err(|_| "has a host in its host list that is not valid")?;
        hosts.push(Host {
            shown: format!("{h}:{p}"),
            opts: opts_for(&u)?,
        });
    }
    // Shown with its whole host list, the password starred by parsing.
    let mut plain = url.clone();
    let rest: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != ENDPOINT_PARAM)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if rest.is_empty() {
        plain.set_query(None);
    } else {
        plain.query_pairs_mut().clear().extend_pairs(rest);
    }
    let mut shown = Redacted::new(&plain).to_string();
    if !more.is_empty() {
        let list: String = more.iter().map(|(h, p)| format!(",{h}:{p}")).collect();
        // The authority ends at the first '/' after "://" (the password is
        // `***` by now, so it holds none).
        let start = shown.find("://").map_or(0, |i| i + 3);
        let end = shown[start..]
            .find(['/', '?'])
            .map_or(shown.len(), |i| start + i);
        shown.insert_str(end, &list);
    }
    Ok(Parsed {
        hosts,
        attrs,
        connect_timeout,
        require_sync,
        shown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Result<Parsed, String> {
        let u =
            ::url::Url::parse(&crate::store::target::fold_hosts(raw)).map_err(|e| e.to_string())?;
        parse_url(&u, "t").map_err(|e| e.to_string())
    }

    #[test]
    fn host_lists_are_tried_in_order_and_shown_without_the_password() {
        let p = parsed(
            "postgres://u:s3cr%2Ct@h1:5433,h2,[::1]:5435/db?target_session_attrs=read-write\
             &connect_timeout=1&sslmode=disable",
        )
        .unwrap();
        let hosts: Vec<&str> = p.hosts.iter().map(|h| h.shown.as_str()).collect();
        assert_eq!(hosts, ["h1:5433", "h2:5432", "[::1]:5435"]);
        assert_eq!(p.attrs, Attrs::ReadWrite);
        assert_eq!(
            p.connect_timeout,
            Some(Duration::from_secs(2)),
            "libpq: 1 means 2"
        );
        assert_eq!(
            p.shown,
            "postgres://u:***@h1:5433,h2:5432,[::1]:5435/db?target_session_attrs=read-write\
             &connect_timeout=1&sslmode=disable"
        );
        assert!(!p.shown.contains("s3cr"));
    }

    #[test]
    fn libpq_parameters_are_accepted_or_refused_by_name() {
        for ok in [
            "postgres://u@h/db?application_name=app&keepalives=1&keepalives_idle=30\
             &keepalives_interval=5&keepalives_count=3&channel_binding=prefer\
             &fallback_application_name=x&connect_timeout=0",
            "postgres://u@h/db?target_session_attrs=prefer-standby",
            "postgres://u@h/db?require=sync",
        ] {
            assert!(parsed(ok).is_ok(), "{ok}");
        }
        for (bad, want) in [
            (
                "postgres://u@h/db?target_session_attrs=Hunter2x",
                "target_session_attrs",
            ),
            (
                "postgres://u@h/db?channel_binding=require",
                "channel binding",
            ),
            (
                "postgres://u@h/db?require=Hunter2x",
                "require= that is not sync",
            ),
            (
                "postgres://u@h/db?connect_timeout=Hunter2x",
                "connect_timeout",
            ),
            (
                "postgres://u@h/db?gssencmode=Hunter2x",
                "unknown parameter gssencmode",
            ),
            ("postgres://u@h1,h2:x/db", "invalid port"),
        ] {
            let e = parsed(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} was accepted"));
            assert!(e.contains(want), "{bad}: {e}");
            assert!(!e.contains("Hunter2x"), "{bad}: value echoed: {e}");
        }
    }
}
