//! How to reach the server: each host of the list in order, as libpq
//! does, and which of its errors may heal.

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};
use tokio::time::Instant;

use super::url::{Attrs, Host};
use super::Pg;
use crate::store::session::Connect;
use crate::store::sql::{self, Dialect};
use crate::store::StoreError;

/// What PgBouncer says, with SQLSTATE 08P01 (a protocol violation, which
/// from a server means a broken link and may heal), when its own
/// configuration or the client's refuses the login: retrying cannot help.
pub(super) const POOLER_REFUSALS: &[&str] = &[
    "unsupported startup parameter",
    "no such database",
    "no such user",
    "authentication failed",
    "server login failed",
    "not allowed",
    "unsupported pkt type",
];

impl Pg {
    /// A connection to `h` that `want` accepts, or why not (and whether
    /// that may heal).
    pub(super) async fn try_host(
        &self,
        h: &Host,
        want: Attrs,
    ) -> Result<PgConnection, (String, bool)> {
        let connect = PgConnection::connect_with(&h.opts);
        let conn = match self.connect_timeout {
            Some(t) => match tokio::time::timeout(t, connect).await {
                Ok(r) => r,
                Err(_) => {
                    return Err((
                        format!(
                            "no connection within connect_timeout ({})",
                            crate::duration::show(t)
                        ),
                        true,
                    ))
                }
            },
            None => connect.await,
        };
        // A TLS refusal or an unreadable TLS file will not heal on any host.
        let mut conn =
            conn.map_err(|e| (sql::message(&e), sql::connect_failed(self, e).may_heal()))?;
        if want == Attrs::Any {
            return Ok(conn);
        }
        // libpq asks the same: `transaction_read_only` for read-write and
        // read-only, `pg_is_in_recovery()` for primary and standby.
        let row = sqlx::Executor::fetch_one(
            &mut conn,
            sqlx::raw_sql(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
            ),
        )
        .await
        .map_err(|e| (sql::message(&e), Pg::heals(&e)))?;
        let (in_recovery, read_only): (bool, bool) = (
            row.try_get(0).map_err(|e| (sql::message(&e), false))?,
            row.try_get(1).map_err(|e| (sql::message(&e), false))?,
        );
        if want.accepts(in_recovery, read_only) {
            Ok(conn)
        } else {
            let is = if in_recovery {
                "a standby"
            } else if read_only {
                "read-only"
            } else {
                "a read-write primary"
            };
            // A standby may be promoted, a primary demoted: may heal.
            Err((format!("the server is {is} (target_session_attrs)"), true))
        }
    }

    pub(super) fn heals(e: &sqlx::Error) -> bool {
        sql::heals::<Pg>(e)
    }
}

impl Connect for Pg {
    type Conn = PgConnection;
    type Error = sqlx::Error;

    fn shown(&self) -> String {
        self.shown.clone()
    }

    /// Each host in order, as libpq does: the first that answers and
    /// matches `target_session_attrs` (with `prefer-standby`, a standby
    /// first, then any). One host keeps the driver's own error.
    async fn connect(&mut self, _deadline: Instant) -> Result<PgConnection, StoreError> {
        let context = format!("cannot connect to the store {}", self.shown);
        if self.hosts.len() == 1 && self.attrs == Attrs::Any && self.connect_timeout.is_none() {
            return PgConnection::connect_with(&self.hosts[0].opts)
                .await
                .map_err(|e| sql::connect_failed(self, e));
        }
        let passes: &[Attrs] = match self.attrs {
            Attrs::PreferStandby => &[Attrs::Standby, Attrs::Any],
            a => &[a],
        };
        let mut why = Vec::new();
        let mut heals = false;
        for want in passes {
            for h in &self.hosts {
                match self.try_host(h, *want).await {
                    Ok(c) => return Ok(c),
                    Err((m, may_heal)) => {
                        heals |= may_heal;
                        why.push(format!("{}: {m}", h.shown));
                    }
                }
            }
        }
        let msg = format!("{context}: {}", why.join("; "));
        Err(StoreError::healing(heals, msg))
    }

    fn classify(&self, what: &str, e: sqlx::Error) -> StoreError {
        sql::error(self, what, e)
    }
}

impl Dialect for Pg {
    const TLS_FILES: &'static [&'static str] = &[
        "sslrootcert",
        "ssl-root-cert",
        "ssl-ca",
        "sslcert",
        "ssl-cert",
        "sslkey",
        "ssl-key",
    ];

    /// 08 connection, 40 rollback, 53 resources, 55 lock not available,
    /// 57 operator intervention (shutdown, cancel), 58 system, and 25006
    /// read-only transaction (a standby or a demoted primary).
    /// A pooler's refusal of the login (see [`POOLER_REFUSALS`]) will not
    /// heal, whatever its code says.
    fn may_heal(e: &sqlx::Error) -> bool {
        match e {
            sqlx::Error::Database(d) => {
                if d.code().as_deref() == Some("08P01")
                    && POOLER_REFUSALS.iter().any(|m| d.message().contains(m))
                {
                    return false;
                }
                d.code().is_some_and(|c| {
                    c == "25006"
                        || ["08", "40", "53", "55", "57", "58"]
                            .iter()
                            .any(|p| c.starts_with(p))
                })
            }
            _ => false,
        }
    }
}
