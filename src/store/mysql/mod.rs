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
//! **`--once-per`** (docs/stores.md, "Once per period") adds, between
//! steps 1 and 2, a locking read of whether this period's run started less
//! than half a period ago by `UTC_TIMESTAMP(6)` ("done this period": nothing
//! is written), and step 2 becomes `TAKE_ONCE_SQL`, which repeats that
//! condition and writes the run's start. Under the row lock nothing can
//! change the row between the two, so the check and the claim are one
//! step. The record lives in five `run_*` columns that a table made by an
//! earlier release lacks: only `--once-per` statements name them.
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

mod semisync;
mod statements;
mod url;

use crate::store::UrlError;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use sqlx::{Connection, Row};
use tokio::time::Instant;

use self::semisync::*;
use self::statements::*;
pub use self::statements::{SCHEMA, TABLE_SQL, UPGRADE_SQL, VALUES_UPGRADE_SQL};
use super::session::{Connect, Session};
use super::sql::{self, lease_info, millis, Dialect};
use super::{
    Acquired, Backend, Capabilities, Init, LeaseInfo, LeaseKey, Outcome, Period, Replication,
    RunRecord, Schema, Store, StoreError, Target, NOT_STARTED, SUCCEEDED,
};
use crate::redact::Redacted;

/// The registry's constructor for `mysql://` and `mariadb://`.
pub fn open(t: &Target<'_>) -> Result<Store, UrlError> {
    let p = url::parse(t.url)?;
    Ok(Store::MySql(MySqlStore {
        s: Session::new(My {
            opts: p.opts,
            call_timeout: t.call_timeout,
            redacted: Redacted::new(t.url),
            require_sync: p.require_sync,
        }),
    }))
}

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

impl Connect for My {
    type Conn = MySqlConnection;
    type Error = sqlx::Error;

    fn shown(&self) -> String {
        self.redacted.to_string()
    }

    async fn connect(&mut self, _deadline: Instant) -> Result<MySqlConnection, StoreError> {
        let mut conn = MySqlConnection::connect_with(&self.opts)
            .await
            .map_err(|e| {
                // 1044: no privilege at all in the URL's database.
                let no_privilege = number(&e) == Some(1044);
                match sql::connect_failed(self, e) {
                    err if no_privilege && !err.may_heal() => {
                        err.reworded(|m| format!("{m} (a run needs {GRANT})"))
                    }
                    other => other,
                }
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
                        e,
                    ));
                }
            }
        }
        Ok(conn)
    }

    fn classify(&self, what: &str, e: sqlx::Error) -> StoreError {
        sql::error(self, what, e)
    }
}

impl Dialect for My {
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

/// What [`MySqlStore::update`] binds before name, holder and epoch.
#[derive(Clone)]
enum Param {
    Micros(i64),
    Text(String),
}

/// ER_NO_SUCH_TABLE.
const NO_SUCH_TABLE: u16 = 1146;

/// Refused for lack of a privilege: 1142 (table), 1143 (column), 1227
/// (a global privilege such as PROCESS or REPLICATION CLIENT).
fn denied(e: &sqlx::Error) -> bool {
    matches!(number(e), Some(1142 | 1143 | 1227))
}

/// The acquiring transaction (see the module's comment): taken at an
/// epoch, or held. With `period` (`--once-per`), the period too: after the
/// row lock, [`DONE_SQL`] reads the record (one this release cannot read
/// is refused, and nothing is written) and says whether this period's run
/// has started, and [`TAKE_ONCE_SQL`] takes lease and period and writes
/// the run's start.
async fn take(
    c: &mut MySqlConnection,
    (name, holder, advertise, slots): (&str, &str, Option<&str>, Option<u32>),
    us: i64,
    period: Option<Period>,
) -> Result<Result<Acquired, Refusal>, sqlx::Error> {
    let mut tx = c.begin().await?;
    sqlx::query(ENSURE_ROW_SQL)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    let took = match period {
        None => {
            sqlx::query(TAKE_SQL)
                .bind(holder)
                .bind(us)
                .bind(name)
                .execute(&mut *tx)
                .await?
        }
        Some(period) => {
            let half = micros(period.half);
            let retry = i64::from(period.retry_failed);
            let record = sqlx::query(DONE_SQL)
                .bind(micros(crate::store::FUTURE_LIMIT))
                .bind(NOT_STARTED)
                .bind(half)
                .bind(NOT_STARTED)
                .bind(retry)
                .bind(SUCCEEDED)
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(row) = record {
                let (start_ok, outcome_ok): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
                if !(start_ok && outcome_ok) {
                    let outcome: Option<String> = row.try_get(2)?;
                    tx.commit().await?;
                    return Ok(Err(Refusal::Unreadable(match outcome {
                        Some(o) if !outcome_ok => {
                            format!("says its run ended \"{}\"", crate::names::printable(&o))
                        }
                        _ => format!(
                            "has a start more than {} ahead of the server's clock",
                            crate::duration::show(crate::store::FUTURE_LIMIT)
                        ),
                    })));
                }
                if row.try_get::<bool, _>(4)? {
                    let started_ms_ago: i64 = row.try_get(3)?;
                    tx.commit().await?;
                    return Ok(Ok(Acquired::DoneThisPeriod { started_ms_ago }));
                }
            }
            sqlx::query(TAKE_ONCE_SQL)
                .bind(holder)
                .bind(us)
                .bind(holder)
                .bind(name)
                .bind(half)
                .bind(NOT_STARTED)
                .bind(retry)
                .bind(SUCCEEDED)
                .execute(&mut *tx)
                .await?
        }
    };
    if took.rows_affected() != 1 {
        tx.commit().await?;
        return Ok(Ok(Acquired::Held));
    }
    let epoch: i64 = sqlx::query(EPOCH_SQL)
        .bind(name)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    if advertise.is_some() || slots.is_some() {
        sqlx::query(TAKEN_VALUES_SQL)
            .bind(advertise)
            .bind(slots.map(i64::from))
            .bind(name)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(Ok(Acquired::Taken(epoch)))
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
    key: (&str, &str, Option<&str>, Option<u32>),
    us: i64,
    period: Option<Period>,
) -> Result<Result<Acquired, Refusal>, sqlx::Error> {
    match take(c, key, us, period).await {
        Err(e) if matches!(number(&e), Some(NO_SUCH_TABLE | 1142)) => {
            if table_visible(c).await? {
                // Missing a moment ago and there now: a racing first user
                // created it (a cron fleet's first firing), so try again.
                // Seen but refused (1142) is no privilege on it.
                if number(&e) == Some(NO_SUCH_TABLE) {
                    return take(c, key, us, period).await;
                }
                return Err(e);
            }
        }
        done => return done,
    }
    let created = sqlx::query(TABLE_SQL).execute(&mut *c).await;
    match take(c, key, us, period).await {
        Err(e) if matches!(number(&e), Some(NO_SUCH_TABLE | 1142)) => {
            Ok(Err(Refusal::Table(created.err())))
        }
        done => done,
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
        params: Vec<Param>,
        (name, holder, epoch): (&str, &str, i64),
        acknowledged: bool,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let check = acknowledged && self.s.c.require_sync;
        let out = self
            .s
            .call(timeout, what, async move |c, _| {
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
                for p in params {
                    q = match p {
                        Param::Micros(d) => q.bind(d),
                        Param::Text(t) => q.bind(t),
                    };
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
            .await?;
        out.map_err(|r| self.refused(what, r))
    }

    /// A [`Refusal`] as the error the caller reports.
    fn refused(&self, what: &str, r: Refusal) -> StoreError {
        let shown = self.s.c.shown();
        let sync = |m: &str| format!("{what} the store {shown} (require=sync): {m}");
        match r {
            // The server does not show a table to a login without any
            // privilege on it, so "missing" may also mean "not yours".
            Refusal::Table(Some(e)) => sql::cannot_create(sql::classify::<My>(
                &format!(
                    "table leader_lease is missing in the store {shown} \
                     (or this login has no privilege on it)"
                ),
                e,
            )),
            Refusal::Table(None) => StoreError::fatal(format!(
                "table leader_lease is missing in the store {shown}"
            )),
            Refusal::NoSemiSync => StoreError::fatal(sync(
                "the server has no semi-synchronous replication \
                 (no Rpl_semi_sync_master_status: the semisync plugin is not loaded)",
            )),
            Refusal::SemiSyncOff => StoreError::fatal(sync(
                "semi-synchronous replication is off \
                 (rpl_semi_sync_master_enabled, or rpl_semi_sync_source_enabled, is OFF)",
            )),
            Refusal::FellBack => StoreError::unavailable(sync(
                "semi-synchronous replication has fallen back to asynchronous \
                 (Rpl_semi_sync_master_status is OFF: no replica acknowledged within \
                 rpl_semi_sync_master_timeout)",
            )),
            Refusal::NoReplica => StoreError::unavailable(sync(
                "no semi-synchronous replica is connected (Rpl_semi_sync_master_clients is 0)",
            )),
            Refusal::NotAcknowledged { acquired } => StoreError::unavailable(sync(&format!(
                "a commit was not acknowledged by a replica (Rpl_semi_sync_master_no_tx rose), \
                 so {}",
                if acquired {
                    "this acquisition may exist on the primary alone; it was handed back"
                } else {
                    "this renewal may exist on the primary alone and does not count"
                }
            ))),
            // Mapped by the acquire, which knows the name; not reached.
            Refusal::Unreadable(why) => StoreError::fatal(why),
            Refusal::CannotSee(m) => StoreError::fatal(sync(&format!(
                "cannot read the semi-synchronous replication status: {m} \
                 (SHOW GLOBAL STATUS needs no privilege on MariaDB and MySQL 8; \
                 where it is restricted, grant what the server names)"
            ))),
        }
    }
}

impl MySqlStore {
    /// Release with `plain` (its `params`, then name, holder, epoch), or,
    /// where the run has values to write (a `--min-hold` keep marks the
    /// tenure ended; an advertised value goes with a freed lease), with
    /// `with_values`, the same statement that also sets them. A table
    /// without their columns (an older release's, which only a plain run
    /// can have taken) gets the plain statement: `status` cannot tell a
    /// kept lease there, and says held.
    async fn release_in(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        (plain, with_values): (&'static str, &'static str),
        params: Vec<Param>,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        const WHAT: &str = "cannot release in";
        let grant = (key.name.as_str(), key.holder.as_str(), epoch);
        if keep.is_zero() && key.advertise.is_none() && key.slots_value().is_none() {
            return self
                .update(WHAT, plain, params, grant, false, timeout)
                .await;
        }
        let us = micros(keep);
        let mut all = vec![Param::Micros(us); 4];
        all.extend(params.iter().cloned());
        match self
            .update(WHAT, with_values, all, grant, false, timeout)
            .await
        {
            Err(e) if lacks_column(&e) => {
                self.update(WHAT, plain, params, grant, false, timeout)
                    .await
            }
            done => done,
        }
    }

    /// The acquire, plain or (with `half`) under `--once-per`'s rule.
    async fn acquire_in(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: Option<Period>,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        let (name, holder, us) = (key.name.as_str(), key.holder.as_str(), micros(lease));
        let (advertise, slots) = (key.advertise.as_deref(), key.slots_value());
        let check = self.s.c.require_sync;
        let what = "cannot acquire in";
        let out = self
            .s
            .call(timeout, what, async move |c, _| {
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
                let got =
                    match take_or_create(c, (name, holder, advertise, slots), us, period).await? {
                        Ok(got) => got,
                        Err(r) => return Ok(Err(r)),
                    };
                if let (Acquired::Taken(epoch), Some(before)) = (got, before) {
                    if semi_sync(c).await?.no_tx != before {
                        // Handed back; under --once-per nothing ran, so
                        // the period is not used up.
                        let q = match period {
                            Some(_) => sqlx::query(RELEASE_ENDING_SQL).bind(NOT_STARTED),
                            None => sqlx::query(RELEASE_SQL),
                        };
                        q.bind(0i64)
                            .bind(0i64)
                            .bind(name)
                            .bind(holder)
                            .bind(epoch)
                            .execute(&mut *c)
                            .await?;
                        return Ok(Err(Refusal::NotAcknowledged { acquired: true }));
                    }
                }
                Ok(Ok(got))
            })
            .await?;
        out.map_err(|r| match r {
            Refusal::Unreadable(why) => crate::store::unreadable(&self.s.c.shown(), name, &why),
            r => self.refused(what, r),
        })
    }

    /// A `--once-per` acquire that met a table without the run record's
    /// columns (made by an earlier release): add them where this login may
    /// (ALTER on the table), and say so; where it may not, a refusal that
    /// names the one statement to run. A run without `--once-per` never
    /// gets here: the table works for it as it is.
    async fn add_run_columns(&mut self, timeout: Duration) -> Result<(), StoreError> {
        let what = "cannot add columns to leader_lease in";
        let out = self
            .s
            .call(timeout, what, async move |c, _| upgrade(c).await)
            .await;
        match out {
            Ok(Ok(())) => {
                tracing::info!(
                    event = "store_schema",
                    "added the missing columns to leader_lease (for --once-per, --advertise, --slots)"
                );
                Ok(())
            }
            Ok(Err((e, statement))) => Err(StoreError::fatal(format!(
                "{what} the store {}: {e}: table leader_lease was made by an earlier release \
                 and lacks the columns --once-per, --advertise and --slots keep their values in; run \
                 `{statement}` as a login with ALTER on it (or `leaderrun init` as it)",
                self.s.c.shown()
            ))),
            Err(e) => Err(e),
        }
    }
}

/// Add the columns the table lacks: the run record's (a group added whole:
/// an earlier release's table has all of them or none) and the lease's
/// values (each missing one: a development build's table may have some).
/// MySQL has no `ADD COLUMN IF NOT EXISTS`, so each is sent only where the
/// table lacks it. `Err` inside is the server's refusal for lack of a
/// privilege, as it says it, with the statement it refused.
async fn upgrade(c: &mut MySqlConnection) -> Result<Result<(), (String, String)>, sqlx::Error> {
    let has: i64 = sqlx::query(HAS_COLUMNS_SQL)
        .fetch_one(&mut *c)
        .await?
        .try_get(0)?;
    let runs = (has < UPGRADE_COLUMNS).then(|| UPGRADE_SQL.to_string());
    let has: Vec<String> = sqlx::query_scalar(HAS_VALUE_COLUMNS_SQL)
        .fetch_all(&mut *c)
        .await?;
    for statement in [runs, values_upgrade(&has)].into_iter().flatten() {
        match sqlx::query(&statement).execute(&mut *c).await {
            Ok(_) => {}
            Err(e) if denied(&e) => return Ok(Err((sql::message(&e), statement))),
            // Another login added them between the look and the ALTER.
            Err(e) if number(&e) == Some(DUPLICATE_COLUMN) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Ok(()))
}

/// ER_DUP_FIELDNAME.
const DUPLICATE_COLUMN: u16 = 1060;

/// Whether `e` is the server's "unknown column" (1054): a table made by an
/// earlier release, met by a statement that names a newer column.
fn lacks_column(e: &StoreError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .is_some_and(|e| number(e) == Some(UNKNOWN_COLUMN))
}

impl Backend for MySqlStore {
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let got = match self.acquire_in(key, lease, None, timeout).await {
            // Only `--advertise` and `--slots` name columns a plain
            // acquire does not.
            Err(e) if (key.advertise.is_some() || key.slots > 1) && lacks_column(&e) => {
                self.add_run_columns(timeout).await?;
                self.acquire_in(key, lease, None, timeout).await
            }
            done => done,
        };
        Ok(got?.epoch())
    }

    fn advertises(&self) -> bool {
        true
    }

    fn slots(&self) -> bool {
        true
    }

    fn once_per(&self) -> bool {
        true
    }

    async fn acquire_once(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: Period,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        match self.acquire_in(key, lease, Some(period), timeout).await {
            Err(e) if lacks_column(&e) => {
                self.add_run_columns(timeout).await?;
                self.acquire_in(key, lease, Some(period), timeout).await
            }
            done => done,
        }
    }

    async fn release_ending(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        outcome: Outcome,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let us = micros(keep);
        let params = vec![
            Param::Text(outcome.to_string()),
            Param::Micros(us),
            Param::Micros(us),
        ];
        let sql = (RELEASE_ENDING_SQL, RELEASE_ENDING_VALUES_SQL);
        self.release_in(key, epoch, keep, sql, params, timeout)
            .await
    }

    async fn run_records(
        &mut self,
        name: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let out = self
            .s
            .call(timeout, "cannot read", async move |c, _| {
                let rows = match sqlx::query(RUN_RECORDS_SQL)
                    .bind(name)
                    .bind(name)
                    .fetch_all(c)
                    .await
                {
                    // A table made before the run record keeps none.
                    Err(e) if number(&e) == Some(UNKNOWN_COLUMN) => return Ok(Vec::new()),
                    rows => rows?,
                };
                rows.iter()
                    .map(|r| {
                        Ok(RunRecord {
                            name: r.try_get(0)?,
                            holder: r.try_get(1)?,
                            epoch: r.try_get::<Option<i64>, _>(2)?.unwrap_or_default(),
                            outcome: r.try_get(3)?,
                            started_at: r.try_get::<Option<String>, _>(4)?.unwrap_or_default(),
                            started_ms_ago: r.try_get::<Option<i64>, _>(5)?.unwrap_or_default(),
                            ended_at: r.try_get(6)?,
                            ended_ms_ago: r.try_get(7)?,
                        })
                    })
                    .collect()
            })
            .await;
        out
    }

    async fn renew(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        self.update(
            "cannot renew in",
            RENEW_SQL,
            vec![Param::Micros(micros(lease))],
            (name, holder, epoch),
            true,
            timeout,
        )
        .await
    }

    async fn release(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let us = micros(keep);
        let params = vec![Param::Micros(us), Param::Micros(us)];
        let sql = (RELEASE_SQL, RELEASE_VALUES_SQL);
        self.release_in(key, epoch, keep, sql, params, timeout)
            .await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        self.s
            .call(timeout, "cannot read", async |c, _| {
                let row = sqlx::query(INSPECT_SQL)
                    .bind(name)
                    .fetch_optional(c)
                    .await?;
                row.map(|r| lease_info(&r)).transpose()
            })
            .await
    }

    fn describe(&self) -> String {
        self.s.c.shown()
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
            .call(timeout, what, async move |c, _| {
                let probe = sqlx::query(PRIVILEGE_PROBES[0].1).execute(&mut *c).await;
                if matches!(&probe, Err(e) if number(e) == Some(NO_SUCH_TABLE)) {
                    if let Err(e) = sqlx::query(TABLE_SQL).execute(&mut *c).await {
                        if !table_visible(c).await? {
                            return Ok(Err(Refusal::Table(Some(e))));
                        }
                    }
                }
                // A login that may not alter the table keeps it as it is:
                // it works for every run but a --once-per one, which names
                // the statement.
                if let Err((why, statement)) = upgrade(c).await? {
                    tracing::info!(
                        event = "store_schema",
                        "cannot add the columns --once-per, --advertise and --slots need to \
                         leader_lease: {why}; run `{statement}` as a login with ALTER on it"
                    );
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
            .await?;
        let missing = out.map_err(|r| self.refused(what, r))?;
        if !missing.is_empty() {
            return Err(sql::lacking(&self.s.c.shown(), &missing, GRANT));
        }
        Ok(Init::Ready)
    }

    /// From the server's own status: Galera, semi-synchronous (and whether
    /// it is working now), asynchronous, or no binary log at all.
    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        self.s
            .call(
                timeout,
                "cannot read the replication status of",
                async move |c, _| {
                    let vars = show(c, REPLICATION_VARS_SQL).await?;
                    let st = semi_sync(c).await?;
                    Ok(describe_replication(&vars, &st))
                },
            )
            .await
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        self.s
            .call(timeout, "cannot read", async move |c, _| {
                let rows = sqlx::query(LIST_SQL).fetch_all(c).await?;
                rows.iter().map(lease_info).collect()
            })
            .await
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        self.s
            .call(timeout, "cannot release in", async |c, _| {
                let mut tx = c.begin().await?;
                let row = sqlx::query(CLEARABLE_SQL)
                    .bind(name)
                    .bind(epoch)
                    .bind(epoch)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(row) = row else {
                    tx.commit().await?;
                    return Ok(None);
                };
                let before = lease_info(&row)?;
                sqlx::query(CLEAR_SQL).bind(name).execute(&mut *tx).await?;
                tx.commit().await?;
                Ok(Some(before))
            })
            .await
    }
}
