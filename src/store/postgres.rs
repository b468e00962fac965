//! The Postgres store: one row per lease, expiry by the database's `now()`.
//!
//! Why these statements are safe under concurrency (READ COMMITTED):
//!
//! * `acquire` is one `INSERT … ON CONFLICT DO UPDATE … WHERE`. For an
//!   existing row Postgres takes the row lock and evaluates the `WHERE` on the
//!   *latest committed* version, not on the statement's snapshot; a racer that
//!   waited for the lock therefore sees the winner's holder and future expiry
//!   and updates nothing. Two racers inserting a missing row meet on the
//!   primary key: one inserts, the other falls through to the conflict branch
//!   and, again, sees a live lease. The epoch is raised in the same statement.
//! * `renew` is an `UPDATE` naming holder *and* epoch and requiring the lease
//!   to be unexpired; it never touches the epoch. After a takeover it matches
//!   no row, which the elector treats as a loss.
//! * `now()` is the transaction's start, which is after the holder sent the
//!   statement, so the expiry written is at least `sent + L` — the fact the
//!   holder's give-up arithmetic relies on.
//!
//! A server in read-only mode (`default_transaction_read_only`, a standby,
//! a primary demoted during a failover: SQLSTATE 25006) may take writes
//! again soon, so it is "may heal": a waiting contender keeps trying.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};

use super::push::{AnyWakeups, PgWakeups};
use super::sql::{self, lease_info, millis, Dialect, Session};
use super::{
    AnyStore, Capabilities, Init, LeaseInfo, Schema, Store, StoreAdmin, StoreError, Target,
};
use crate::redact::Redacted;

pub const TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
)";

pub const SCHEMA: Schema = Schema {
    dialect: "PostgreSQL",
    sql: TABLE_SQL,
};

const EXISTS_SQL: &str =
    "SELECT CASE WHEN to_regclass('leader_lease') IS NULL THEN 0::int8 ELSE 1::int8 END";

const ACQUIRE_SQL: &str = "INSERT INTO leader_lease AS l (name, holder, epoch, expires_at)
     VALUES ($1, $2, 1, now() + make_interval(secs => $3::float8 / 1000))
     ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
      WHERE l.holder IS NULL OR l.expires_at <= now()
     RETURNING epoch";

const RENEW_SQL: &str = "UPDATE leader_lease
        SET expires_at = now() + make_interval(secs => $4::float8 / 1000)
      WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()";

// With keep > 0 the holder stays and the lease runs `keep` more from now
// (`--min-hold`); with keep = 0 the lease is free at once. The epoch is
// untouched either way: the next acquisition raises it. A lease freed here
// notifies waiters (src/store/push.rs) in the same statement, so the
// NOTIFY is delivered at the commit that frees the lease, never before it
// and never without it. The first column is the number of rows released.
const RELEASE_SQL: &str = "WITH r AS (UPDATE leader_lease
        SET holder = CASE WHEN $4::bigint > 0 THEN holder END,
            expires_at = now() + make_interval(secs => $4::float8 / 1000)
      WHERE name = $1 AND holder = $2 AND epoch = $3
     RETURNING name, holder),
     n AS (SELECT pg_notify('leaderrun_released', name) FROM r WHERE holder IS NULL)
     SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM n)";

/// What `LeaseInfo` is read from (see `sql::lease_info`). The remaining time
/// is clamped to ±10 years, so a row holding `infinity` (written by hand)
/// still lists.
macro_rules! columns {
    () => {
        "name, holder, epoch,
        (extract(epoch FROM (least(greatest(expires_at, now() - interval '10 years'),
                                   now() + interval '10 years') - now())) * 1000)::bigint"
    };
}

const INSPECT_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = $1");
const LIST_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");

// The row is locked and read as it was, then cleared; `epoch` is untouched.
// Waiters are notified in the same statement (see RELEASE_SQL).
const CLEAR_SQL: &str = "WITH c AS (UPDATE leader_lease l SET holder = NULL, expires_at = now()
       FROM (SELECT name, holder, expires_at FROM leader_lease WHERE name = $1 FOR UPDATE) old
      WHERE l.name = old.name AND l.holder IS NOT NULL AND ($2::bigint IS NULL OR l.epoch = $2)
     RETURNING l.name, old.holder, l.epoch,
        (extract(epoch FROM (least(greatest(old.expires_at, now() - interval '10 years'),
                                   now() + interval '10 years') - now())) * 1000)::bigint AS left_ms),
     n AS (SELECT pg_notify('leaderrun_released', name) FROM c)
     SELECT c.name, c.holder, c.epoch, c.left_ms, (SELECT count(*) FROM n) FROM c";

pub struct PgStore {
    s: Session<Pg>,
}

/// How to reach the server, and whether the table was seen already.
struct Pg {
    opts: PgConnectOptions,
    table_checked: bool,
    redacted: Redacted,
}

/// Query parameters sqlx understands; anything else would be logged by the
/// driver with its value, so it is refused here instead (by name only).
const KNOWN_PARAMS: &[&str] = &[
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

/// The registry's constructor for `postgres://` and `postgresql://`.
pub fn open(t: &Target<'_>) -> Result<AnyStore, String> {
    Ok(Box::new(PgStore::from_url(
        t.url,
        t.app_name,
        t.call_timeout,
    )?))
}

impl PgStore {
    /// Parse the URL; nothing is connected until the first call.
    /// `statement_timeout` is also set server-side (statement and lock
    /// timeouts), so a statement stuck behind someone's row lock is
    /// cancelled by the server too, not only abandoned by us.
    pub fn new(url: &str, app_name: &str, statement_timeout: Duration) -> Result<PgStore, String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("is not valid: {e}"))?;
        PgStore::from_url(&parsed, app_name, statement_timeout)
    }

    fn from_url(
        url: &url::Url,
        app_name: &str,
        statement_timeout: Duration,
    ) -> Result<PgStore, String> {
        sql::check_params(url, KNOWN_PARAMS)?;
        let opts = PgConnectOptions::from_url(url)
            .map_err(|e| format!("is not valid: {}", sql::message(&e)))?;
        let ms = millis(statement_timeout).max(1).to_string();
        // Respect an application_name the user put in the URL.
        let opts = if url.query_pairs().any(|(k, _)| k == "application_name") {
            opts
        } else {
            opts.application_name(app_name)
        };
        let opts = opts
            .options([
                ("statement_timeout", ms.as_str()),
                ("lock_timeout", ms.as_str()),
            ])
            // Our own log lines say what matters; SQL text in a cron mail does not.
            .disable_statement_logging();
        Ok(PgStore {
            s: Session::new(Pg {
                opts,
                table_checked: false,
                redacted: Redacted::new(url),
            }),
        })
    }

    /// Renew: one UPDATE naming name, holder and epoch, plus a duration in
    /// ms; true when it matched the lease.
    async fn update(
        &mut self,
        sql: &'static str,
        what: &str,
        (name, holder, epoch, d): (&str, &str, i64, Duration),
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder, ms) = (name.to_string(), holder.to_string(), millis(d));
        self.s
            .call(timeout, what, move |c| {
                Box::pin(async move {
                    let done = sqlx::query(sql)
                        .bind(name)
                        .bind(holder)
                        .bind(epoch)
                        .bind(ms)
                        .execute(c)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await
    }
}

impl Dialect for Pg {
    type Conn = PgConnection;

    fn shown(&self) -> String {
        self.redacted.to_string()
    }

    async fn connect(&mut self) -> Result<PgConnection, StoreError> {
        let mut conn = PgConnection::connect_with(&self.opts).await.map_err(|e| {
            sql::classify::<Pg>(
                &format!("cannot connect to the store {}", self.redacted),
                &e,
            )
        })?;
        if !self.table_checked {
            sql::ensure_table(self, &mut conn, EXISTS_SQL, TABLE_SQL).await?;
            self.table_checked = true;
        }
        Ok(conn)
    }

    /// 08 connection, 40 rollback, 53 resources, 55 lock not available,
    /// 57 operator intervention (shutdown, cancel), 58 system, and 25006
    /// read-only transaction (a standby or a demoted primary).
    fn may_heal(e: &sqlx::Error) -> bool {
        match e {
            sqlx::Error::Database(d) => d.code().is_some_and(|c| {
                c == "25006"
                    || ["08", "40", "53", "55", "57", "58"]
                        .iter()
                        .any(|p| c.starts_with(p))
            }),
            _ => false,
        }
    }
}

impl Store for PgStore {
    async fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let ms = millis(lease);
        let (name, holder) = (name.to_string(), holder.to_string());
        self.s
            .call(timeout, "cannot acquire in", move |c| {
                Box::pin(async move {
                    let row = sqlx::query(ACQUIRE_SQL)
                        .bind(name)
                        .bind(holder)
                        .bind(ms)
                        .fetch_optional(c)
                        .await?;
                    row.map(|r| sqlx::Row::try_get::<i64, _>(&r, 0)).transpose()
                })
            })
            .await
    }

    async fn renew(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.update(
            RENEW_SQL,
            "cannot renew in",
            (name, holder, epoch, lease),
            timeout,
        )
        .await
    }

    async fn release(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder, ms) = (name.to_string(), holder.to_string(), millis(keep));
        self.s
            .call(timeout, "cannot release in", move |c| {
                Box::pin(async move {
                    let row = sqlx::query(RELEASE_SQL)
                        .bind(name)
                        .bind(holder)
                        .bind(epoch)
                        .bind(ms)
                        .fetch_one(c)
                        .await?;
                    Ok(sqlx::Row::try_get::<i64, _>(&row, 0)? == 1)
                })
            })
            .await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let name = name.to_string();
        self.s
            .call(timeout, "cannot read", move |c| {
                Box::pin(async move {
                    let row = sqlx::query(INSPECT_SQL)
                        .bind(name)
                        .fetch_optional(c)
                        .await?;
                    row.map(|r| lease_info(&r)).transpose()
                })
            })
            .await
    }
}

impl StoreAdmin for PgStore {
    fn describe(&self) -> String {
        self.s.d.shown()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pushes_wakeups: true,
            ..Capabilities::MILLIS
        }
    }

    fn wakeups(&self) -> Option<AnyWakeups> {
        Some(Box::new(PgWakeups::new(self.s.d.opts.clone())))
    }

    fn schema(&self) -> Option<Schema> {
        Some(SCHEMA)
    }

    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.s.d.table_checked = false;
        self.s.reset();
        self.s
            .call(timeout, "cannot use", |_| {
                Box::pin(async { Ok(Init::Ready) })
            })
            .await
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        self.s
            .call(timeout, "cannot read", |c| {
                Box::pin(async move {
                    let rows = sqlx::query(LIST_SQL).fetch_all(c).await?;
                    rows.iter().map(lease_info).collect()
                })
            })
            .await
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let name = name.to_string();
        self.s
            .call(timeout, "cannot release in", move |c| {
                Box::pin(async move {
                    let row = sqlx::query(CLEAR_SQL)
                        .bind(name)
                        .bind(epoch)
                        .fetch_optional(c)
                        .await?;
                    row.map(|r| lease_info(&r)).transpose()
                })
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiters LISTEN on the channel the statements that free a lease notify.
    #[test]
    fn release_and_clear_notify_the_channel_waiters_listen_on() {
        let notify = format!("pg_notify('{}', name)", super::super::push::PG_CHANNEL);
        assert!(RELEASE_SQL.contains(&notify));
        assert!(CLEAR_SQL.contains(&notify));
    }
}
