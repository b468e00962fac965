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

use sqlx::postgres::{PgConnectOptions, PgConnection, PgRow};
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

fn acquire_sql(name: &str, holder: &str, ms: i64) -> Result<String, sqlx::Error> {
    let (name, holder) = (text(name)?, text(holder)?);
    Ok(format!(
        "INSERT INTO leader_lease AS l (name, holder, epoch, expires_at)
     VALUES ({name}, {holder}, 1, now() + make_interval(secs => {ms}::float8 / 1000))
     ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
      WHERE l.holder IS NULL OR l.expires_at <= now()
     RETURNING epoch"
    ))
}

fn renew_sql(name: &str, holder: &str, epoch: i64, ms: i64) -> Result<String, sqlx::Error> {
    let (name, holder) = (text(name)?, text(holder)?);
    Ok(format!(
        "UPDATE leader_lease
        SET expires_at = now() + make_interval(secs => {ms}::float8 / 1000)
      WHERE name = {name} AND holder = {holder} AND epoch = {epoch} AND expires_at > now()
     RETURNING epoch"
    ))
}

// With keep > 0 the holder stays and the lease runs `keep` more from now
// (`--min-hold`); with keep = 0 the lease is free at once. The epoch is
// untouched either way: the next acquisition raises it. A lease freed here
// notifies waiters (src/store/push.rs) in the same statement, so the
// NOTIFY is delivered at the commit that frees the lease, never before it
// and never without it. (A SELECT in a WITH runs only when it is used: the
// final join makes it run.) One row per lease released.
fn release_sql(name: &str, holder: &str, epoch: i64, keep: i64) -> Result<String, sqlx::Error> {
    let (name, holder) = (text(name)?, text(holder)?);
    Ok(format!(
        "WITH r AS (UPDATE leader_lease
        SET holder = CASE WHEN {keep}::bigint > 0 THEN holder END,
            expires_at = now() + make_interval(secs => {keep}::float8 / 1000)
      WHERE name = {name} AND holder = {holder} AND epoch = {epoch}
     RETURNING name, holder, epoch),
     n AS (SELECT pg_notify('leaderrun_released', name) FROM r WHERE holder IS NULL)
     SELECT r.epoch FROM r CROSS JOIN (SELECT count(*) FROM n) notified"
    ))
}

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

const LIST_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");

fn inspect_sql(name: &str) -> Result<String, sqlx::Error> {
    Ok(format!(
        concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = {}"),
        text(name)?
    ))
}

// The row is locked and read as it was, then cleared; `epoch` is untouched.
// Waiters are notified in the same statement (see `release_sql`).
fn clear_sql(name: &str, epoch: Option<i64>) -> Result<String, sqlx::Error> {
    let name = text(name)?;
    let epoch = epoch.map_or("NULL".to_string(), |e| e.to_string());
    Ok(format!(
        "WITH c AS (UPDATE leader_lease l SET holder = NULL, expires_at = now()
       FROM (SELECT name, holder, expires_at FROM leader_lease WHERE name = {name} FOR UPDATE) old
      WHERE l.name = old.name AND l.holder IS NOT NULL AND ({epoch}::bigint IS NULL OR l.epoch = {epoch})
     RETURNING l.name, old.holder, l.epoch,
        (extract(epoch FROM (least(greatest(old.expires_at, now() - interval '10 years'),
                                   now() + interval '10 years') - now())) * 1000)::bigint AS left_ms),
     n AS (SELECT pg_notify('leaderrun_released', name) FROM c)
     SELECT c.name, c.holder, c.epoch, c.left_ms FROM c CROSS JOIN (SELECT count(*) FROM n) notified"
    ))
}

/// A text value as an SQL string literal. Every call goes out as one
/// simple-protocol message (see [`PgStore::run`]), so values are written
/// into the statement instead of bound. `E'…'` reads the same whatever
/// `standard_conforming_strings` says, and with `client_encoding` UTF8 (the
/// driver always asks for it) no byte of a multi-byte character can be a
/// quote or a backslash; doubling both is then a complete escape. A NUL
/// cannot be stored in Postgres text at all and is refused.
fn text(s: &str) -> Result<String, sqlx::Error> {
    if s.contains('\0') {
        return Err(sqlx::Error::Encode(
            "a lease name or holder id with a NUL byte".into(),
        ));
    }
    let mut out = String::with_capacity(s.len() + 3);
    out.push_str("E'");
    for c in s.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    Ok(out)
}

pub struct PgStore {
    s: Session<Pg>,
}

/// How to reach the server.
struct Pg {
    opts: PgConnectOptions,
    /// `SET LOCAL` of the server-side timeouts, put before every statement.
    timeouts: String,
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
        // Respect an application_name the user put in the URL.
        let opts = if url.query_pairs().any(|(k, _)| k == "application_name") {
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
        let opts = opts
            .extra_float_digits(None)
            // Our own log lines say what matters; SQL text in a cron mail does not.
            .disable_statement_logging();
        let ms = millis(statement_timeout).max(1);
        Ok(PgStore {
            s: Session::new(Pg {
                opts,
                timeouts: format!(
                    "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}; "
                ),
                redacted: Redacted::new(url),
            }),
        })
    }

    /// One call: the statement built by `build`, after the `SET LOCAL`s of
    /// the timeouts, sent as *one* simple-protocol message. Postgres runs a
    /// multi-statement message as one implicit transaction, so:
    ///
    /// * it is one round trip, with nothing prepared: no named statement
    ///   to collide in a pooler's shared server connection, and no unnamed
    ///   one that a transaction pooler could lose between parse and execute
    ///   (sqlx's extended protocol syncs in between);
    /// * the timeouts hold for this statement only and end with its
    ///   transaction (Postgres 13 and newer arm `statement_timeout` per
    ///   statement of a message), so nothing is left on a server connection
    ///   that a pooler hands to someone else next.
    ///
    /// With `create`, a missing table is created on the spot and the
    /// statement sent again, instead of asking whether it exists before
    /// every first call. Only the acquire creates: looking (status, check,
    /// release, and a run's renewals) never does, and says the table is
    /// missing instead.
    async fn run(
        &mut self,
        timeout: Duration,
        what: &str,
        create: bool,
        build: impl FnOnce() -> Result<String, sqlx::Error>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let q = match build() {
            Ok(stmt) => format!("{UNLISTEN_SQL}{}{stmt}", self.s.d.timeouts),
            Err(e) => return Err(self.s.error(what, &e)),
        };
        let create = create.then(|| format!("{}{TABLE_SQL}", self.s.d.timeouts));
        let out = self
            .s
            .call(timeout, what, move |c| {
                Box::pin(async move {
                    match sqlx::Executor::fetch_all(&mut *c, sqlx::raw_sql(&q)).await {
                        Err(e) if is_code(&e, UNDEFINED_TABLE) => {}
                        done => return done.map(Ok),
                    }
                    let Some(create) = create else {
                        return Ok(Err(Missing::NotCreated));
                    };
                    // Two first users may race to create it: `IF NOT EXISTS`
                    // is not atomic against another creator, so whatever the
                    // create says, the statement is tried again, and only if
                    // the table is still missing is the create's error shown.
                    let created = sqlx::Executor::execute(&mut *c, sqlx::raw_sql(&create)).await;
                    match sqlx::Executor::fetch_all(&mut *c, sqlx::raw_sql(&q)).await {
                        Err(e) if is_code(&e, UNDEFINED_TABLE) => {
                            Ok(Err(Missing::CreateFailed(created.err())))
                        }
                        done => done.map(Ok),
                    }
                })
            })
            .await?;
        out.map_err(|missing| {
            let create_err = match missing {
                Missing::NotCreated => return sql::no_table(&self.s.d.shown()),
                Missing::CreateFailed(e) => e,
            };
            let Some(e) = create_err else {
                return StoreError::Fatal(format!(
                    "table leader_lease is missing in the store {}",
                    self.s.d.shown()
                ));
            };
            sql::cannot_create(sql::classify::<Pg>(
                &format!(
                    "table leader_lease is missing in the store {}",
                    self.s.d.shown()
                ),
                &e,
            ))
        })
    }

    /// Renew and release: true when the UPDATE matched the lease.
    async fn update(
        &mut self,
        what: &str,
        timeout: Duration,
        build: impl FnOnce() -> Result<String, sqlx::Error>,
    ) -> Result<bool, StoreError> {
        Ok(self.run(timeout, what, false, build).await?.len() == 1)
    }

    /// Whether the login owns the lease table (and so may alter it).
    async fn owns_table(&mut self, timeout: Duration) -> Result<bool, StoreError> {
        let rows = self
            .run(timeout, "cannot use", false, || Ok(OWNS_SQL.to_string()))
            .await?;
        Ok(first_i64(&rows) != 0)
    }
}

/// A table `PgStore::run` found missing.
enum Missing {
    /// The call may not create it (it only looks).
    NotCreated,
    /// Creating it failed, with this error if the create said why.
    CreateFailed(Option<sqlx::Error>),
}

/// Why every call's message starts with `UNLISTEN *`: behind PgBouncer in
/// transaction pooling, a waiter's `LISTEN` stays on whichever server
/// connection ran it, and that connection then serves other clients. A
/// session that listens gets, just before the `ReadyForQuery` that ends each
/// of its transactions, every notification on its channels, its own
/// `pg_notify` at commit included. On a connection that never asked for
/// notifications, sqlx hands such a message to the statement being run,
/// which fails with "unexpected message: NotificationResponse" *after* the
/// commit: a release that freed the lease reported as failed, on every run
/// that happens to get that server connection.
///
/// `UNLISTEN *` in the same one-message transaction ends the listening at
/// that commit, before the server looks for notifications to send (it sends
/// only those on channels it still listens on), so no reply to a lease call
/// carries one, and the stray `LISTEN` is gone for every later user of that
/// server connection too. It is a no-op on a session that never listened
/// (every direct or session-pooled lease connection), and is allowed in a
/// read-only transaction and on a hot standby. The waiter's own connection
/// (src/store/push.rs) is never a lease connection.
const UNLISTEN_SQL: &str = "UNLISTEN *; ";

/// The first column of the first row as an integer (0 when there is none).
fn first_i64(rows: &[PgRow]) -> i64 {
    rows.first()
        .and_then(|r| sqlx::Row::try_get::<i64, _>(r, 0).ok())
        .unwrap_or(0)
}

/// What a run needs beyond the table itself, each with the privilege that
/// grants it; `init` lists the ones the login lacks. `LISTEN` needs no
/// privilege; `pg_notify` (called by release and clear) is executable by
/// everyone unless revoked.
const PRIVILEGES_SQL: &str = "SELECT need FROM (VALUES
        ('SELECT on leader_lease', has_table_privilege('leader_lease', 'SELECT')),
        ('INSERT on leader_lease', has_table_privilege('leader_lease', 'INSERT')),
        ('UPDATE on leader_lease', has_table_privilege('leader_lease', 'UPDATE')),
        ('EXECUTE on pg_notify(text, text)',
            has_function_privilege('pg_notify(text, text)', 'EXECUTE'))) v(need, ok)
      WHERE NOT ok";

const OWNS_SQL: &str = "SELECT pg_has_role(relowner, 'USAGE')::int::int8 FROM pg_class
      WHERE oid = 'leader_lease'::regclass";

/// Idempotent statements that bring a table made by an older leaderrun up to
/// date (`ALTER TABLE leader_lease ADD COLUMN IF NOT EXISTS …`), run by
/// `init` in order, after the table exists and before the privilege check.
/// Only the table's owner may alter it: a login that does not own the table
/// skips them (the run form must then work with the table as it is).
const UPGRADE_SQL: &[&str] = &[];

const UNDEFINED_TABLE: &str = "42P01";

fn is_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some(code))
}

/// What PgBouncer says, with SQLSTATE 08P01 (a protocol violation, which
/// from a server means a broken link and may heal), when its own
/// configuration or the client's refuses the login: retrying cannot help.
const POOLER_REFUSALS: &[&str] = &[
    "unsupported startup parameter",
    "no such database",
    "no such user",
    "authentication failed",
    "server login failed",
    "not allowed",
    "unsupported pkt type",
];

impl Dialect for Pg {
    type Conn = PgConnection;

    fn shown(&self) -> String {
        self.redacted.to_string()
    }

    async fn connect(&mut self) -> Result<PgConnection, StoreError> {
        PgConnection::connect_with(&self.opts)
            .await
            .map_err(|e| sql::connect_failed(self, &e))
    }

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

impl Store for PgStore {
    async fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let rows = self
            .run(timeout, "cannot acquire in", true, || {
                acquire_sql(name, holder, millis(lease))
            })
            .await?;
        rows.first()
            .map(|r| sqlx::Row::try_get::<i64, _>(r, 0))
            .transpose()
            .map_err(|e| self.s.error("cannot acquire in", &e))
    }

    async fn renew(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.update("cannot renew in", timeout, || {
            renew_sql(name, holder, epoch, millis(lease))
        })
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
        self.update("cannot release in", timeout, || {
            release_sql(name, holder, epoch, millis(keep))
        })
        .await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let rows = self
            .run(timeout, "cannot read", false, || inspect_sql(name))
            .await?;
        rows.first()
            .map(lease_info)
            .transpose()
            .map_err(|e| self.s.error("cannot read", &e))
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

    /// Look first and create only when missing, so that `init` on a
    /// read-only server whose table exists succeeds; then make sure the
    /// login may do what a run does, so that "ready" means a run works.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.s.reset();
        let rows = self
            .run(timeout, "cannot use", false, || Ok(EXISTS_SQL.to_string()))
            .await?;
        if first_i64(&rows) == 0 {
            self.run(timeout, "cannot use", false, || Ok(TABLE_SQL.to_string()))
                .await
                .map_err(sql::cannot_create)?;
        }
        let mut owner = None;
        for stmt in UPGRADE_SQL {
            let may = match owner {
                Some(may) => may,
                None => *owner.insert(self.owns_table(timeout).await?),
            };
            if !may {
                break;
            }
            self.run(timeout, "cannot upgrade the table in", false, || {
                Ok(stmt.to_string())
            })
            .await?;
        }
        let rows = self
            .run(timeout, "cannot check privileges in", false, || {
                Ok(PRIVILEGES_SQL.to_string())
            })
            .await?;
        let missing: Vec<String> = rows
            .iter()
            .filter_map(|r| sqlx::Row::try_get::<String, _>(r, 0).ok())
            .collect();
        if !missing.is_empty() {
            return Err(sql::lacking(
                &self.s.d.shown(),
                &missing,
                "GRANT SELECT, INSERT, UPDATE ON leader_lease TO <login>",
            ));
        }
        Ok(Init::Ready)
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let rows = self
            .run(timeout, "cannot read", false, || Ok(LIST_SQL.to_string()))
            .await?;
        rows.iter()
            .map(lease_info)
            .collect::<Result<_, _>>()
            .map_err(|e| self.s.error("cannot read", &e))
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let rows = self
            .run(timeout, "cannot release in", false, || {
                clear_sql(name, epoch)
            })
            .await?;
        rows.first()
            .map(lease_info)
            .transpose()
            .map_err(|e| self.s.error("cannot release in", &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiters LISTEN on the channel the statements that free a lease notify.
    #[test]
    fn release_and_clear_notify_the_channel_waiters_listen_on() {
        let notify = format!("pg_notify('{}', name)", super::super::push::PG_CHANNEL);
        assert!(release_sql("n", "h", 1, 0).unwrap().contains(&notify));
        assert!(clear_sql("n", None).unwrap().contains(&notify));
    }
}
