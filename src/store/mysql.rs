//! The MySQL / MariaDB store: one InnoDB row per lease, expiry by the
//! server's clock.
//!
//! **Clock.** Expiry is written and compared with `UTC_TIMESTAMP(6)` into a
//! `DATETIME(6)` column. `NOW(6)` would follow the session's `time_zone`: a
//! server on `SYSTEM` time in a zone with daylight saving would step every
//! expiry by an hour twice a year, and two sessions with different
//! `time_zone` settings would disagree on the same row. `UTC_TIMESTAMP` is the
//! server's clock in UTC whatever the session says. Like `NOW()`, it is the
//! statement's start time, which is after the holder sent the statement, so
//! an expiry written as `UTC_TIMESTAMP(6) + L` is at least `sent + L`.
//!
//! **Acquire** is one transaction:
//!
//! 1. `INSERT … ON DUPLICATE KEY UPDATE name = name` makes sure the row
//!    exists (a missing one is created free, at epoch 0) and takes its
//!    exclusive row lock: InnoDB locks a duplicate row exclusively for
//!    `ON DUPLICATE KEY UPDATE` (a plain `INSERT IGNORE` takes a shared lock,
//!    and two racers each holding one and both wanting the exclusive lock
//!    would deadlock).
//! 2. `UPDATE … SET epoch = epoch + 1, holder = ?, expires_at = … WHERE name = ?
//!    AND (holder IS NULL OR expires_at <= UTC_TIMESTAMP(6))`. An InnoDB
//!    `UPDATE` reads the latest committed row version under its lock (a
//!    "current read"), not the transaction's REPEATABLE READ snapshot, so a
//!    racer that waited for the lock in step 1 sees the winner's holder and
//!    future expiry and matches nothing. Exactly one racer gets an affected
//!    row; the epoch is raised by one in the same statement.
//! 3. The winner reads its epoch back (its own write is visible to it).
//!
//! The conditional cannot be folded into the `ON DUPLICATE KEY UPDATE`
//! itself: MySQL applies its assignments left to right, each seeing the
//! columns already assigned, so once `holder` or `expires_at` is changed the
//! condition can no longer be evaluated on the old row.
//!
//! **Timeouts.** Every call is bounded client-side (the connection is dropped
//! at the deadline). Server-side: `innodb_lock_wait_timeout` is whole
//! seconds, so it is set to G rounded up (at least 1 s); MariaDB's
//! `max_statement_time` bounds every statement by G; MySQL's
//! `max_execution_time` bounds SELECTs only, so there the lock wait timeout is
//! what ends a stuck UPDATE. Both are set when the server has them.
//!
//! **Errors.** 1045 (access denied), 1044, 1049, 1142 … will not heal; the
//! network, lock waits (1205), deadlocks (1213), a server shutting down, a
//! read-only server (1290, 1792, 1836: a replica or a demoted primary) may.
//! The server's messages never contain the password.

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use sqlx::{ConnectOptions, Connection, Row};

use super::sql::{self, lease_info, millis, Dialect, Session};
use super::{
    AnyStore, Capabilities, Init, LeaseInfo, Schema, Store, StoreAdmin, StoreError, Target,
};
use crate::redact::Redacted;

/// The same shape as the Postgres table. Names and holders compare byte for
/// byte (`utf8mb4_bin`): the default collations are case-insensitive, which
/// would make `Sweep` and `sweep` one lease here and two on Postgres.
pub const TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    holder     VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00' -- UTC
) ENGINE = InnoDB";

pub const SCHEMA: Schema = Schema {
    dialect: "MySQL/MariaDB",
    sql: TABLE_SQL,
};

const EXISTS_SQL: &str = "SELECT COUNT(*) FROM information_schema.tables
      WHERE table_schema = DATABASE() AND table_name = 'leader_lease'";

const ENSURE_ROW_SQL: &str =
    "INSERT INTO leader_lease (name) VALUES (?) ON DUPLICATE KEY UPDATE name = name";

// ? holder, ? lease µs, ? name
const TAKE_SQL: &str = "UPDATE leader_lease
        SET epoch = epoch + 1, holder = ?,
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND (holder IS NULL OR expires_at <= UTC_TIMESTAMP(6))";

const EPOCH_SQL: &str = "SELECT epoch FROM leader_lease WHERE name = ?";

// ? lease µs, ? name, ? holder, ? epoch
const RENEW_SQL: &str = "UPDATE leader_lease
        SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > UTC_TIMESTAMP(6)";

// ? keep µs, ? keep µs, ? name, ? holder, ? epoch. With keep > 0 the holder
// stays and the lease runs `keep` more (`--min-hold`); the epoch is untouched.
const RELEASE_SQL: &str = "UPDATE leader_lease
        SET holder = IF(? > 0, holder, NULL),
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND holder = ? AND epoch = ?";

/// What `LeaseInfo` is read from (see `sql::lease_info`). Name and holder
/// are converted to a non-binary collation, which the driver decodes as
/// text (a `_bin` column reaches it flagged binary); the remaining time is
/// clamped to ±10 years, and a zero date (possible under a lax `sql_mode`)
/// reads as long expired rather than failing the listing.
macro_rules! columns {
    () => {
        "CONVERT(name USING utf8mb4), CONVERT(holder USING utf8mb4), epoch,
         CAST(COALESCE(GREATEST(LEAST(
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000,
             315360000000), -315360000000), -315360000000) AS SIGNED)"
    };
}

const INSPECT_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = ?");
const LIST_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");
// ? name, ? epoch, ? epoch
const CLEARABLE_SQL: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM leader_lease WHERE name = ? AND holder IS NOT NULL AND (? IS NULL OR epoch = ?)
      FOR UPDATE"
);
const CLEAR_SQL: &str =
    "UPDATE leader_lease SET holder = NULL, expires_at = UTC_TIMESTAMP(6) WHERE name = ?";

/// Query parameters sqlx understands (see postgres.rs for why others are
/// refused).
const KNOWN_PARAMS: &[&str] = &[
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
];

pub struct MySqlStore {
    s: Session<My>,
}

struct My {
    opts: MySqlConnectOptions,
    call_timeout: Duration,
    table_checked: bool,
    redacted: Redacted,
}

/// The registry's constructor for `mysql://` and `mariadb://`.
pub fn open(t: &Target<'_>) -> Result<AnyStore, String> {
    sql::check_params(t.url, KNOWN_PARAMS)?;
    // sqlx reads the URL the same way for both schemes; `mariadb://` is
    // only a name people use.
    let opts = MySqlConnectOptions::from_url(t.url)
        .map_err(|e| format!("is not valid: {}", sql::message(&e)))?
        .disable_statement_logging();
    Ok(Box::new(MySqlStore {
        s: Session::new(My {
            opts,
            call_timeout: t.call_timeout,
            table_checked: false,
            redacted: Redacted::new(t.url),
        }),
    }))
}

/// Microseconds for `INTERVAL ? MICROSECOND`, clamped like every stored
/// duration.
fn micros(d: Duration) -> i64 {
    millis(d).saturating_mul(1000)
}

/// The server's error number (1045 …), when it is a server error.
fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

impl Dialect for My {
    type Conn = MySqlConnection;

    fn shown(&self) -> String {
        self.redacted.to_string()
    }

    async fn connect(&mut self) -> Result<MySqlConnection, StoreError> {
        let context = format!("cannot connect to the store {}", self.redacted);
        let mut conn = MySqlConnection::connect_with(&self.opts)
            .await
            .map_err(|e| sql::classify::<My>(&context, &e))?;
        let g = self.call_timeout;
        let lock_wait = g.as_secs_f64().ceil().max(1.0) as u64;
        let settings = [
            format!("SET SESSION innodb_lock_wait_timeout = {lock_wait}"),
            // MariaDB: every statement, in (fractional) seconds.
            format!("SET SESSION max_statement_time = {:.3}", g.as_secs_f64()),
            // MySQL: SELECTs only, in milliseconds.
            format!("SET SESSION max_execution_time = {}", millis(g).max(1)),
        ];
        for set in settings {
            if let Err(e) = sqlx::query(&set).execute(&mut conn).await {
                // 1193: unknown system variable (the other server's name).
                if number(&e) != Some(1193) {
                    return Err(sql::classify::<My>(
                        &format!("cannot set up the store {}", self.redacted),
                        &e,
                    ));
                }
            }
        }
        if !self.table_checked {
            sql::ensure_table(self, &mut conn, EXISTS_SQL, TABLE_SQL).await?;
            self.table_checked = true;
        }
        Ok(conn)
    }

    fn may_heal(e: &sqlx::Error) -> bool {
        matches!(
            number(e),
            Some(
                1040 // too many connections
                | 1053 // server shutdown in progress
                | 1205 // lock wait timeout
                | 1213 // deadlock
                | 1290 // --read-only
                | 1317 // query interrupted
                | 1792 // read-only transaction
                | 1836 // read-only mode
                | 1927 // connection killed (MariaDB)
                | 1969 // max_statement_time exceeded (MariaDB)
                | 3024 // max_execution_time exceeded (MySQL)
                | 4031 // disconnected for inactivity (MySQL)
            )
        )
    }
}

impl MySqlStore {
    /// One statement naming holder and epoch, true when it matched a row.
    /// (With sqlx's CLIENT_FOUND_ROWS, "affected" counts matched rows, so a
    /// renewal that happens to write the same expiry still counts.)
    async fn update(
        &mut self,
        what: &str,
        sql: &'static str,
        durations: Vec<i64>,
        (name, holder, epoch): (&str, &str, i64),
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (name.to_string(), holder.to_string());
        self.s
            .call(timeout, what, move |c| {
                Box::pin(async move {
                    let mut q = sqlx::query(sql);
                    for d in durations {
                        q = q.bind(d);
                    }
                    let done = q.bind(name).bind(holder).bind(epoch).execute(c).await?;
                    Ok(done.rows_affected() == 1)
                })
            })
            .await
    }
}

impl Store for MySqlStore {
    async fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let (name, holder, us) = (name.to_string(), holder.to_string(), micros(lease));
        self.s
            .call(timeout, "cannot acquire in", move |c| {
                Box::pin(async move {
                    let mut tx = c.begin().await?;
                    sqlx::query(ENSURE_ROW_SQL)
                        .bind(&name)
                        .execute(&mut *tx)
                        .await?;
                    let took = sqlx::query(TAKE_SQL)
                        .bind(&holder)
                        .bind(us)
                        .bind(&name)
                        .execute(&mut *tx)
                        .await?;
                    if took.rows_affected() != 1 {
                        tx.commit().await?;
                        return Ok(None);
                    }
                    let epoch: i64 = sqlx::query(EPOCH_SQL)
                        .bind(&name)
                        .fetch_one(&mut *tx)
                        .await?
                        .try_get(0)?;
                    tx.commit().await?;
                    Ok(Some(epoch))
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
            "cannot renew in",
            RENEW_SQL,
            vec![micros(lease)],
            (name, holder, epoch),
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
        let us = micros(keep);
        self.update(
            "cannot release in",
            RELEASE_SQL,
            vec![us, us],
            (name, holder, epoch),
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

impl StoreAdmin for MySqlStore {
    fn describe(&self) -> String {
        self.s.d.shown()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::MILLIS
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
                    let mut tx = c.begin().await?;
                    let row = sqlx::query(CLEARABLE_SQL)
                        .bind(&name)
                        .bind(epoch)
                        .bind(epoch)
                        .fetch_optional(&mut *tx)
                        .await?;
                    let Some(row) = row else {
                        tx.commit().await?;
                        return Ok(None);
                    };
                    let before = lease_info(&row)?;
                    sqlx::query(CLEAR_SQL).bind(&name).execute(&mut *tx).await?;
                    tx.commit().await?;
                    Ok(Some(before))
                })
            })
            .await
    }
}
