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
//! The connection is taken out of `self` for the duration of a call and put
//! back only on success: a call that fails, or whose future is dropped by the
//! elector's give-up timer mid-flight, leaves no half-used connection behind,
//! and the next call reconnects.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};

use super::{lease_info, millis, LeaseInfo, Store, StoreAdmin, StoreError};
use crate::redact::Redacted;

pub const TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
)";

const EXISTS_SQL: &str = "SELECT to_regclass('leader_lease') IS NOT NULL";

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
// untouched either way: the next acquisition raises it.
const RELEASE_SQL: &str = "UPDATE leader_lease
        SET holder = CASE WHEN $4::bigint > 0 THEN holder END,
            expires_at = now() + make_interval(secs => $4::float8 / 1000)
      WHERE name = $1 AND holder = $2 AND epoch = $3";

/// What `LeaseInfo` is read from (see `store::lease_info`).
macro_rules! columns {
    () => {
        "name, holder, epoch,
        (extract(epoch FROM (greatest(expires_at, now() - interval '100 years') - now())) * 1000)::bigint"
    };
}

const INSPECT_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = $1");
const LIST_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");

// The row is locked and read as it was, then cleared; `epoch` is untouched.
const CLEAR_SQL: &str = "UPDATE leader_lease l SET holder = NULL, expires_at = now()
       FROM (SELECT name, holder, expires_at FROM leader_lease WHERE name = $1 FOR UPDATE) old
      WHERE l.name = old.name AND l.holder IS NOT NULL AND ($2::bigint IS NULL OR l.epoch = $2)
     RETURNING l.name, old.holder, l.epoch,
        (extract(epoch FROM (greatest(old.expires_at, now() - interval '100 years') - now())) * 1000)::bigint";

/// A query borrowed from the call site, run on a connection it lends.
type BoxFut<'c, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

pub struct PgStore {
    opts: PgConnectOptions,
    conn: Option<PgConnection>,
    table_checked: bool,
    redacted: Redacted,
}

impl PgStore {
    /// Parse the URL; nothing is connected until the first call.
    /// `statement_timeout` is also set server-side (statement and lock
    /// timeouts), so a statement stuck behind someone's row lock is
    /// cancelled by the server too, not only abandoned by us.
    pub fn new(url: &str, app_name: &str, statement_timeout: Duration) -> Result<PgStore, String> {
        let redacted = Redacted::new(url);
        let opts = PgConnectOptions::from_str(url).map_err(|e| {
            format!(
                "invalid store URL {}: {}",
                redacted,
                redacted.scrub(&e.to_string())
            )
        })?;
        let ms = millis(statement_timeout).max(1).to_string();
        // Respect an application_name the user put in the URL.
        let opts = if url.contains("application_name=") {
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
            opts,
            conn: None,
            table_checked: false,
            redacted,
        })
    }

    pub fn redacted(&self) -> &Redacted {
        &self.redacted
    }

    /// The open connection, or a new one (creating the table on first use).
    async fn take_conn(&mut self) -> Result<PgConnection, StoreError> {
        if let Some(c) = self.conn.take() {
            return Ok(c);
        }
        let mut conn = PgConnection::connect_with(&self.opts)
            .await
            .map_err(|e| self.classify("cannot connect to", e))?;
        if !self.table_checked {
            self.ensure_table(&mut conn).await?;
            self.table_checked = true;
        }
        Ok(conn)
    }

    /// Create `leader_lease` when missing. A concurrent creator may win the
    /// race (CREATE … IF NOT EXISTS is not atomic against another one), so a
    /// failed create is followed by a second look before it counts.
    async fn ensure_table(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        let row = sqlx::query(EXISTS_SQL)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.classify("cannot query", e))?;
        if row.try_get::<bool, _>(0).unwrap_or(false) {
            return Ok(());
        }
        if let Err(e) = sqlx::query(TABLE_SQL).execute(&mut *conn).await {
            let again = sqlx::query(EXISTS_SQL)
                .fetch_one(&mut *conn)
                .await
                .ok()
                .and_then(|r| r.try_get::<bool, _>(0).ok())
                .unwrap_or(false);
            if !again {
                return Err(StoreError::Fatal(format!(
                    "table leader_lease is missing in {} and could not be created: {} \
                     (create it with the SQL in the README, or grant CREATE on the schema)",
                    self.redacted,
                    self.redacted.scrub(&db_message(&e))
                )));
            }
        }
        Ok(())
    }

    /// Renew and release: one UPDATE naming name, holder and epoch, plus a
    /// duration in ms; true when it matched the lease.
    async fn update(
        &mut self,
        sql: &'static str,
        what: &str,
        (name, holder, epoch, d): (&str, &str, i64, Duration),
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder, ms) = (name.to_string(), holder.to_string(), millis(d));
        self.call(timeout, what, move |c| {
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

    fn classify(&self, what: &str, e: sqlx::Error) -> StoreError {
        let msg = format!(
            "{what} the store {}: {}",
            self.redacted,
            self.redacted.scrub(&db_message(&e))
        );
        if is_transient(&e) {
            StoreError::Unavailable(msg)
        } else {
            StoreError::Fatal(msg)
        }
    }

    /// Run `f` on a connection within `timeout`; keep the connection only
    /// when the call succeeded.
    async fn call<T, F>(&mut self, timeout: Duration, what: &str, f: F) -> Result<T, StoreError>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFut<'c, T>,
    {
        let work = async {
            let mut conn = self.take_conn().await?;
            match f(&mut conn).await {
                Ok(v) => {
                    self.conn = Some(conn);
                    Ok(v)
                }
                Err(e) => Err(self.classify(what, e)),
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the store {} did not answer within {}",
                self.redacted,
                humantime::format_duration(timeout)
            ))),
        }
    }
}

/// The server's own words for a database error, the driver's otherwise.
fn db_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d.message().to_string(),
        other => other.to_string(),
    }
}

/// Errors that may heal by themselves (the network, a restarting or
/// overloaded server, a lock or statement timeout). Authentication,
/// permissions, a missing database or bad TLS settings will not.
fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(d) => match d.code() {
            // 08 connection, 40 rollback, 53 resources, 55 lock not
            // available, 57 operator intervention (shutdown, cancel), 58 system.
            Some(c) => ["08", "40", "53", "55", "57", "58"]
                .iter()
                .any(|p| c.starts_with(p)),
            None => false,
        },
        _ => false,
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
        self.call(timeout, "cannot acquire in", move |c| {
            Box::pin(async move {
                let row = sqlx::query(ACQUIRE_SQL)
                    .bind(name)
                    .bind(holder)
                    .bind(ms)
                    .fetch_optional(c)
                    .await?;
                row.map(|r| r.try_get::<i64, _>(0)).transpose()
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
        self.update(
            RELEASE_SQL,
            "cannot release in",
            (name, holder, epoch, keep),
            timeout,
        )
        .await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let name = name.to_string();
        self.call(timeout, "cannot read", move |c| {
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
    async fn init(&mut self, timeout: Duration) -> Result<(), StoreError> {
        self.table_checked = false;
        self.conn = None;
        self.call(timeout, "cannot use", |_| Box::pin(async { Ok(()) }))
            .await
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        self.call(timeout, "cannot read", |c| {
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
        self.call(timeout, "cannot release in", move |c| {
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

    fn table_sql(&self) -> &'static str {
        TABLE_SQL
    }
}
