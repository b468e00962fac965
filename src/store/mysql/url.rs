//! The URL: sqlx's parameters, the database it must name, and leaderrun's
//! own `require=`.

use crate::store::UrlError;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::ConnectOptions;

use crate::store::sql;
use crate::store::target::check_params;

/// Query parameters sqlx understands (see the Postgres store's url.rs for why others are
/// refused).
pub(super) const KNOWN_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "charset",
    "collation",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
    "password",
    "require",
];

/// What the URL says.
pub(super) struct Parsed {
    pub(super) opts: MySqlConnectOptions,
    /// `?require=sync`: lead only on what a replica acknowledged.
    pub(super) require_sync: bool,
}

pub(super) fn parse(url: &::url::Url) -> Result<Parsed, UrlError> {
    check_params(url, KNOWN_PARAMS)?;
    // sqlx would connect without selecting a database, and every statement
    // would then fail as if the table were missing.
    if url.path().trim_start_matches('/').is_empty() {
        return Err("names no database: put it after the host \
             (mysql://user:password@host:port/DATABASE)"
            .into());
    }
    let mut require_sync = false;
    for (_, v) in url.query_pairs().filter(|(k, _)| k == "require") {
        match v.as_ref() {
            "sync" => require_sync = true,
            "none" => require_sync = false,
            other => {
                return Err(format!(
                    "has require={} (expected require=sync or require=none)",
                    crate::names::printable(other)
                )
                .into())
            }
        }
    }
    // `require` is leaderrun's, not the driver's: sqlx is given the URL
    // without it.
    let mut for_driver = url.clone();
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "require")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        for_driver.set_query(None);
    } else {
        for_driver.query_pairs_mut().clear().extend_pairs(kept);
    }
    // sqlx reads the URL the same way for both schemes; `mariadb://` is
    // only a name people use.
    let opts = MySqlConnectOptions::from_url(&for_driver)
        .map_err(|e| UrlError::because(format!("is not valid: {}", sql::message(&e)), e))?
        .disable_statement_logging();
    Ok(Parsed { opts, require_sync })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(url: &str) -> Result<Parsed, String> {
        parse(&::url::Url::parse(url).expect("parses")).map_err(|e| e.to_string())
    }

    #[test]
    fn require_takes_sync_or_none_and_names_anything_else() {
        assert!(opened("mysql://u@h/db?require=sync").is_ok());
        assert!(opened("mysql://u@h/db?require=none&ssl-mode=DISABLED").is_ok());
        let e = opened("mysql://u@h/db?require=Sync")
            .err()
            .expect("refused");
        assert!(e.contains("require=Sync"), "{e}");
        let e = opened("mysql://u:pw@h").err().expect("refused");
        assert!(e.contains("names no database"), "{e}");
    }
}
