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
//!
//! **The table** is created by the first acquire that finds it missing (or
//! by `init`); every other call only looks, and a missing table is an error
//! that names the database.
//!
//! **`?require=sync`** refuses to lead unless an acknowledged acquisition
//! is on a replica (see [`Sync`]).

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use sqlx::{ConnectOptions, Connection, Row};

use super::sql::{self, lease_info, millis, Dialect, Session};
use super::{
    AnyStore, Capabilities, Init, LeaseInfo, Replication, Schema, Store, StoreAdmin, StoreError,
    Target,
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

/// Idempotent statements that bring a table made by an older leaderrun up
/// to date, run by `init` in order once the table exists, before the
/// privilege check; a login that may not alter the table skips them.
const UPGRADE_SQL: &[&str] = &[];

/// What a run does to the table, one statement per privilege, none of which
/// reads or changes a row; `init` sends each and lists those refused (1142,
/// 1143). Trying is the only check that counts roles, wildcards and partial
/// revokes the way the server does. The UPDATE assigns a constant: reading
/// a column would need SELECT too, and blame the wrong privilege.
const PRIVILEGE_PROBES: &[(&str, &str)] = &[
    ("SELECT", "SELECT name FROM leader_lease LIMIT 0"),
    (
        "INSERT",
        "INSERT INTO leader_lease (name) SELECT 'x' FROM DUAL WHERE FALSE",
    ),
    (
        "UPDATE",
        "UPDATE leader_lease SET holder = NULL WHERE FALSE",
    ),
];

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
    "require",
];

pub struct MySqlStore {
    s: Session<My>,
}

struct My {
    opts: MySqlConnectOptions,
    call_timeout: Duration,
    redacted: Redacted,
    /// `?require=sync`: lead only on what a replica acknowledged.
    require_sync: bool,
}

/// The registry's constructor for `mysql://` and `mariadb://`.
pub fn open(t: &Target<'_>) -> Result<AnyStore, String> {
    sql::check_params(t.url, KNOWN_PARAMS)?;
    // sqlx would connect without selecting a database, and every statement
    // would then fail as if the table were missing.
    if t.url.path().trim_start_matches('/').is_empty() {
        return Err("names no database: put it after the host \
             (mysql://user:password@host:port/DATABASE)"
            .to_string());
    }
    let mut require_sync = false;
    for (_, v) in t.url.query_pairs().filter(|(k, _)| k == "require") {
        match v.as_ref() {
            "sync" => require_sync = true,
            "none" => require_sync = false,
            other => {
                return Err(format!(
                    "has require={} (expected require=sync or require=none)",
                    crate::names::printable(other)
                ))
            }
        }
    }
    // `require` is leaderrun's, not the driver's: sqlx is given the URL
    // without it.
    let mut for_driver = t.url.clone();
    let kept: Vec<(String, String)> = t
        .url
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
        .map_err(|e| format!("is not valid: {}", sql::message(&e)))?
        .disable_statement_logging();
    Ok(Box::new(MySqlStore {
        s: Session::new(My {
            opts,
            call_timeout: t.call_timeout,
            redacted: Redacted::new(t.url),
            require_sync,
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
        let mut conn = MySqlConnection::connect_with(&self.opts)
            .await
            .map_err(|e| match sql::connect_failed(self, &e) {
                // 1044: no privilege at all in the URL's database.
                StoreError::Fatal(m) if number(&e) == Some(1044) => {
                    StoreError::Fatal(format!("{m} (a run needs {GRANT})"))
                }
                other => other,
            })?;
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
        Ok(conn)
    }

    fn no_table(e: &sqlx::Error) -> bool {
        number(e) == Some(NO_SUCH_TABLE)
    }

    const TLS_FILES: &'static [&'static str] = &[
        "sslca", "ssl-ca", "sslcert", "ssl-cert", "sslkey", "ssl-key",
    ];

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

/// What a run needs, as an operator types it.
const GRANT: &str = "GRANT SELECT, INSERT, UPDATE ON <database>.leader_lease TO <login>";

/// ER_NO_SUCH_TABLE.
const NO_SUCH_TABLE: u16 = 1146;

/// Refused for lack of a privilege: 1142 (table), 1143 (column), 1227
/// (a global privilege such as PROCESS or REPLICATION CLIENT).
fn denied(e: &sqlx::Error) -> bool {
    matches!(number(e), Some(1142 | 1143 | 1227))
}

/// # `?require=sync`
///
/// MySQL and MariaDB replicate asynchronously by default: a primary that
/// fails right after acknowledging an acquisition may leave it on no
/// replica, and a promoted replica hands the same epoch out again while the
/// first holder runs. With semi-synchronous replication the primary waits,
/// at commit, until a replica has the transaction, *unless* no replica
/// acknowledges within `rpl_semi_sync_master_timeout` (10 s by default):
/// then it switches to asynchronous replication and returns success to the
/// client all the same. The commit's reply cannot tell the two apart.
///
/// What the client can see is the server's count of commits that were not
/// acknowledged (`Rpl_semi_sync_master_no_tx`, `…_source_no_tx` on MySQL
/// 8), which the server raises before it replies to such a commit. So with
/// `require=sync`, each acquire, in one call on one connection:
///
/// 1. reads the semi-sync status and refuses unless it is ON with at least
///    one semi-sync replica connected (nothing is written then);
/// 2. acquires, and reads the count again: if it rose, some commit in that
///    window went unacknowledged, possibly this one. The lease is handed
///    back at once and the attempt reported as failed (may heal: `--wait`
///    keeps trying), so the command is never started on an acquisition
///    that may exist on the primary alone.
///
/// A renewal is checked the same way (step 2): one that may not be on a
/// replica does not count, so the holder's deadline stays where the last
/// acknowledged renewal put it, which is what a promoted replica would
/// enforce. A release is not checked: losing one only delays a rival.
///
/// Nothing is cached: the count read before the statement must be fresh to
/// mean anything, and a cached "ON" would let an acquisition through in the
/// very window after a fallback that this check is for. It costs two reads
/// of `SHOW GLOBAL STATUS` per acquire and one per renewal (each a round
/// trip, no privilege needed). The count is server-wide, so another
/// client's unacknowledged commit in the same moment also fails this
/// attempt: a false alarm costs a retry, never safety. What remains: the
/// replica that acknowledged must be the one promoted (a failover tool's
/// job), and with MariaDB's default `rpl_semi_sync_master_wait_point =
/// AFTER_COMMIT` other clients see the acquisition before it is
/// acknowledged (harmless here: they see it held).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct SemiSync {
    /// `Rpl_semi_sync_…_status`; `None` when the server has no such
    /// variable (the semi-sync plugin is not loaded).
    on: Option<bool>,
    /// Semi-sync replicas connected.
    clients: i64,
    /// Commits not acknowledged by a replica, since the server started.
    no_tx: i64,
}

const SEMI_SYNC_STATUS_SQL: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN (
    'Rpl_semi_sync_master_status', 'Rpl_semi_sync_master_clients', 'Rpl_semi_sync_master_no_tx',
    'Rpl_semi_sync_source_status', 'Rpl_semi_sync_source_clients', 'Rpl_semi_sync_source_no_tx')";

const REPLICATION_VARS_SQL: &str = "SHOW GLOBAL VARIABLES WHERE Variable_name IN (
    'rpl_semi_sync_master_enabled', 'rpl_semi_sync_source_enabled',
    'rpl_semi_sync_master_timeout', 'rpl_semi_sync_source_timeout', 'log_bin', 'wsrep_on')";

/// `SHOW …` rows as (lowercased name without the master/source prefix,
/// value).
async fn show(c: &mut MySqlConnection, sql: &str) -> Result<Vec<(String, String)>, sqlx::Error> {
    let text = |r: &sqlx::mysql::MySqlRow, i: usize| -> Result<String, sqlx::Error> {
        r.try_get::<String, _>(i).or_else(|_| {
            r.try_get::<Vec<u8>, _>(i)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
    };
    let rows = sqlx::query(sql).fetch_all(&mut *c).await?;
    rows.iter()
        .map(|r| {
            let name = text(r, 0)?.to_ascii_lowercase();
            let name = name
                .replace("rpl_semi_sync_master_", "")
                .replace("rpl_semi_sync_source_", "");
            Ok((name, text(r, 1)?))
        })
        .collect()
}

fn value<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
    vars.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn is_on(v: Option<&str>) -> bool {
    v.is_some_and(|v| v.eq_ignore_ascii_case("ON") || v == "1")
}

async fn semi_sync(c: &mut MySqlConnection) -> Result<SemiSync, sqlx::Error> {
    let st = show(c, SEMI_SYNC_STATUS_SQL).await?;
    let int = |n: &str| value(&st, n).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(SemiSync {
        on: value(&st, "status").map(|v| is_on(Some(v))),
        clients: int("clients"),
        no_tx: int("no_tx"),
    })
}

/// Why a call did not go ahead (or was undone).
enum Refusal {
    /// The lease table is missing and could not be created (with the
    /// create's error, when it gave one).
    Table(Option<sqlx::Error>),
    /// `require=sync`: the server has no semi-synchronous replication.
    NoSemiSync,
    /// `require=sync`: semi-sync is configured off.
    SemiSyncOff,
    /// `require=sync`: semi-sync is on but has fallen back to asynchronous.
    FellBack,
    /// `require=sync`: no semi-sync replica is connected.
    NoReplica,
    /// `require=sync`: the commit may not be on a replica.
    NotAcknowledged { acquired: bool },
    /// `require=sync`: the login may not read what the check needs.
    CannotSee(String),
}

/// Step 1 of the `require=sync` check: `None` when an acquisition may go
/// ahead.
async fn sync_refusal(
    c: &mut MySqlConnection,
    st: &SemiSync,
) -> Result<Option<Refusal>, sqlx::Error> {
    Ok(match st.on {
        None => Some(Refusal::NoSemiSync),
        Some(true) if st.clients >= 1 => None,
        Some(true) => Some(Refusal::NoReplica),
        Some(false) => {
            let vars = show(c, REPLICATION_VARS_SQL).await?;
            Some(if is_on(value(&vars, "enabled")) {
                Refusal::FellBack
            } else {
                Refusal::SemiSyncOff
            })
        }
    })
}

/// The acquiring transaction (see the module's comment); `Some(epoch)`
/// when taken.
async fn take(
    c: &mut MySqlConnection,
    name: &str,
    holder: &str,
    us: i64,
) -> Result<Option<i64>, sqlx::Error> {
    let mut tx = c.begin().await?;
    sqlx::query(ENSURE_ROW_SQL)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    let took = sqlx::query(TAKE_SQL)
        .bind(holder)
        .bind(us)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    if took.rows_affected() != 1 {
        tx.commit().await?;
        return Ok(None);
    }
    let epoch: i64 = sqlx::query(EPOCH_SQL)
        .bind(name)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    tx.commit().await?;
    Ok(Some(epoch))
}

async fn table_visible(c: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
    let n: i64 = sqlx::query(EXISTS_SQL)
        .fetch_one(&mut *c)
        .await?
        .try_get(0)?;
    Ok(n != 0)
}

/// Acquire, creating the table on first use. A missing table shows as 1146,
/// or as 1142 to a login without privileges on the database (the server
/// does not say whether a table it may not see exists): either way, when
/// the table is not visible, it is created and the acquire tried again;
/// whatever the create says, the acquire decides (a concurrent first user
/// may have created it).
async fn take_or_create(
    c: &mut MySqlConnection,
    name: &str,
    holder: &str,
    us: i64,
) -> Result<Result<Option<i64>, Refusal>, sqlx::Error> {
    match take(c, name, holder, us).await {
        Err(e) if matches!(number(&e), Some(NO_SUCH_TABLE | 1142)) => {
            if table_visible(c).await? {
                return Err(e);
            }
        }
        done => return done.map(Ok),
    }
    let created = sqlx::query(TABLE_SQL).execute(&mut *c).await;
    match take(c, name, holder, us).await {
        Err(e) if matches!(number(&e), Some(NO_SUCH_TABLE | 1142)) => {
            Ok(Err(Refusal::Table(created.err())))
        }
        done => done.map(Ok),
    }
}

impl MySqlStore {
    /// One statement naming holder and epoch, true when it matched a row.
    /// (With sqlx's CLIENT_FOUND_ROWS, "affected" counts matched rows, so a
    /// renewal that happens to write the same expiry still counts.) With
    /// `acknowledged`, under `require=sync`, a match that may not be on a
    /// replica is refused.
    async fn update(
        &mut self,
        what: &str,
        sql: &'static str,
        durations: Vec<i64>,
        (name, holder, epoch): (&str, &str, i64),
        acknowledged: bool,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (name.to_string(), holder.to_string());
        let check = acknowledged && self.s.d.require_sync;
        let out = self
            .s
            .call(timeout, what, move |c| {
                Box::pin(async move {
                    let before = match check {
                        true => match semi_sync(c).await {
                            Ok(st) => Some(st.no_tx),
                            Err(e) if denied(&e) => {
                                return Ok(Err(Refusal::CannotSee(sql::message(&e))))
                            }
                            Err(e) => return Err(e),
                        },
                        false => None,
                    };
                    let mut q = sqlx::query(sql);
                    for d in durations {
                        q = q.bind(d);
                    }
                    let done = q
                        .bind(name)
                        .bind(holder)
                        .bind(epoch)
                        .execute(&mut *c)
                        .await?;
                    let matched = done.rows_affected() == 1;
                    if let (true, Some(before)) = (matched, before) {
                        if semi_sync(c).await?.no_tx != before {
                            return Ok(Err(Refusal::NotAcknowledged { acquired: false }));
                        }
                    }
                    Ok(Ok(matched))
                })
            })
            .await?;
        out.map_err(|r| self.refused(what, r))
    }

    /// A [`Refusal`] as the error the caller reports.
    fn refused(&self, what: &str, r: Refusal) -> StoreError {
        let shown = self.s.d.shown();
        let sync = |m: &str| format!("{what} the store {shown} (require=sync): {m}");
        match r {
            // The server does not show a table to a login without any
            // privilege on it, so "missing" may also mean "not yours".
            Refusal::Table(Some(e)) => sql::cannot_create(sql::classify::<My>(
                &format!(
                    "table leader_lease is missing in the store {shown} \
                     (or this login has no privilege on it)"
                ),
                &e,
            )),
            Refusal::Table(None) => StoreError::Fatal(format!(
                "table leader_lease is missing in the store {shown}"
            )),
            Refusal::NoSemiSync => StoreError::Fatal(sync(
                "the server has no semi-synchronous replication \
                 (no Rpl_semi_sync_master_status: the semisync plugin is not loaded)",
            )),
            Refusal::SemiSyncOff => StoreError::Fatal(sync(
                "semi-synchronous replication is off \
                 (rpl_semi_sync_master_enabled, or rpl_semi_sync_source_enabled, is OFF)",
            )),
            Refusal::FellBack => StoreError::Unavailable(sync(
                "semi-synchronous replication has fallen back to asynchronous \
                 (Rpl_semi_sync_master_status is OFF: no replica acknowledged within \
                 rpl_semi_sync_master_timeout)",
            )),
            Refusal::NoReplica => StoreError::Unavailable(sync(
                "no semi-synchronous replica is connected (Rpl_semi_sync_master_clients is 0)",
            )),
            Refusal::NotAcknowledged { acquired } => StoreError::Unavailable(sync(&format!(
                "a commit was not acknowledged by a replica (Rpl_semi_sync_master_no_tx rose), \
                 so {}",
                if acquired {
                    "this acquisition may exist on the primary alone; it was handed back"
                } else {
                    "this renewal may exist on the primary alone and does not count"
                }
            ))),
            Refusal::CannotSee(m) => StoreError::Fatal(sync(&format!(
                "cannot read the semi-synchronous replication status: {m} \
                 (SHOW GLOBAL STATUS needs no privilege on MariaDB and MySQL 8; \
                 where it is restricted, grant what the server names)"
            ))),
        }
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
        let check = self.s.d.require_sync;
        let what = "cannot acquire in";
        let out = self
            .s
            .call(timeout, what, move |c| {
                Box::pin(async move {
                    let mut before = None;
                    if check {
                        let st = match semi_sync(c).await {
                            Ok(st) => st,
                            Err(e) if denied(&e) => {
                                return Ok(Err(Refusal::CannotSee(sql::message(&e))))
                            }
                            Err(e) => return Err(e),
                        };
                        if let Some(why) = sync_refusal(c, &st).await? {
                            return Ok(Err(why));
                        }
                        before = Some(st.no_tx);
                    }
                    let got = match take_or_create(c, &name, &holder, us).await? {
                        Ok(got) => got,
                        Err(r) => return Ok(Err(r)),
                    };
                    if let (Some(epoch), Some(before)) = (got, before) {
                        if semi_sync(c).await?.no_tx != before {
                            sqlx::query(RELEASE_SQL)
                                .bind(0i64)
                                .bind(0i64)
                                .bind(&name)
                                .bind(&holder)
                                .bind(epoch)
                                .execute(&mut *c)
                                .await?;
                            return Ok(Err(Refusal::NotAcknowledged { acquired: true }));
                        }
                    }
                    Ok(Ok(got))
                })
            })
            .await?;
        out.map_err(|r| self.refused(what, r))
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
            true,
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
            false,
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

    /// Create the table when missing, then try each privilege a run needs:
    /// "ready" only when a run would work.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.s.reset();
        let what = "cannot use";
        let out = self
            .s
            .call(timeout, what, |c| {
                Box::pin(async move {
                    let probe = sqlx::query(PRIVILEGE_PROBES[0].1).execute(&mut *c).await;
                    if matches!(&probe, Err(e) if number(e) == Some(NO_SUCH_TABLE)) {
                        if let Err(e) = sqlx::query(TABLE_SQL).execute(&mut *c).await {
                            if !table_visible(c).await? {
                                return Ok(Err(Refusal::Table(Some(e))));
                            }
                        }
                    }
                    for stmt in UPGRADE_SQL {
                        match sqlx::query(stmt).execute(&mut *c).await {
                            Err(e) if denied(&e) => break,
                            done => done.map(|_| ())?,
                        }
                    }
                    let mut missing = Vec::new();
                    for (privilege, probe) in PRIVILEGE_PROBES {
                        match sqlx::query(probe).execute(&mut *c).await {
                            Ok(_) => {}
                            Err(e) if denied(&e) => {
                                missing.push(format!("{privilege} on leader_lease"))
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(Ok(missing))
                })
            })
            .await?;
        let missing = out.map_err(|r| self.refused(what, r))?;
        if !missing.is_empty() {
            return Err(sql::lacking(&self.s.d.shown(), &missing, GRANT));
        }
        Ok(Init::Ready)
    }

    /// From the server's own status: Galera, semi-synchronous (and whether
    /// it is working now), asynchronous, or no binary log at all.
    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        self.s
            .call(timeout, "cannot read the replication status of", |c| {
                Box::pin(async move {
                    let vars = show(c, REPLICATION_VARS_SQL).await?;
                    let st = semi_sync(c).await?;
                    Ok(describe_replication(&vars, &st))
                })
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

/// What `status` shows for the server's replication.
fn describe_replication(vars: &[(String, String)], st: &SemiSync) -> Replication {
    let timeout = value(vars, "timeout").unwrap_or("?");
    if is_on(value(vars, "wsrep_on")) {
        // A Galera commit returns once the cluster has certified it.
        return Replication {
            can_lose_acknowledged: Some(false),
            detail: "Galera (wsrep_on)".into(),
        };
    }
    match st.on {
        Some(true) if st.clients >= 1 => Replication {
            can_lose_acknowledged: Some(false),
            detail: format!(
                "semi-synchronous, {} replica(s) connected; falls back to asynchronous after \
                 rpl_semi_sync_master_timeout ({timeout} ms) without an acknowledgement",
                st.clients
            ),
        },
        Some(true) => Replication {
            can_lose_acknowledged: Some(true),
            detail: "semi-synchronous, but no replica connected".into(),
        },
        Some(false) if is_on(value(vars, "enabled")) => Replication {
            can_lose_acknowledged: Some(true),
            detail: "semi-synchronous, fallen back to asynchronous (no replica acknowledged)"
                .into(),
        },
        _ if is_on(value(vars, "log_bin")) => Replication {
            can_lose_acknowledged: Some(true),
            detail: "asynchronous (binary log on, semi-synchronous replication off)".into(),
        },
        // Storage-level replication (a replicated disk, a cloud service's
        // standby) is invisible from here.
        _ => Replication::unknown("binary log off: no replica is fed from this server"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What `status` says follows what the server reports, and only a
    /// working semi-sync (or Galera) is "cannot lose".
    #[test]
    fn replication_is_told_from_the_servers_own_variables() {
        let sync = |on, clients| SemiSync {
            on,
            clients,
            no_tx: 0,
        };
        let cases = [
            (vars(&[("wsrep_on", "ON")]), sync(None, 0), Some(false)),
            (vars(&[("enabled", "ON")]), sync(Some(true), 2), Some(false)),
            (vars(&[("enabled", "ON")]), sync(Some(true), 0), Some(true)),
            (vars(&[("enabled", "ON")]), sync(Some(false), 1), Some(true)),
            (vars(&[("log_bin", "ON")]), sync(Some(false), 0), Some(true)),
            (vars(&[("log_bin", "OFF")]), sync(Some(false), 0), None),
            (vars(&[]), sync(None, 0), None),
        ];
        for (v, st, want) in cases {
            let r = describe_replication(&v, &st);
            assert_eq!(r.can_lose_acknowledged, want, "{v:?} {st:?}: {}", r.detail);
        }
    }

    fn opened(url: &str) -> Result<AnyStore, String> {
        let url = url::Url::parse(url).expect("parses");
        open(&Target {
            url: &url,
            app_name: "t",
            call_timeout: Duration::from_secs(1),
        })
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
