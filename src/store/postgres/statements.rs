//! The statements: each call is one simple-protocol message (see
//! `PgStore::run`), with values written into it as escaped literals.

use crate::store::Schema;

/// The lease table (as `TABLE_SQL`, and inside `SCHEMA`).
macro_rules! table_sql {
    () => {
        "CREATE TABLE IF NOT EXISTS leader_lease (
    name       text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    timeline   bigint,
    run_started_at timestamptz,
    run_ended_at   timestamptz,
    run_holder     text,
    run_epoch      bigint,
    run_outcome    text,
    advertised       text,
    advertised_epoch bigint,
    kept_epoch       bigint,
    slots            bigint
)"
    };
}

/// Brings a table made by an older release (without `timeline`, without
/// the run record's columns, `run_*`, that `--once-per` keeps, or without
/// the lease's values, the values `sql::lease_info` reads) up to date, in one statement;
/// idempotent. Needs the table's owner (ALTER); a role with only SELECT,
/// INSERT, UPDATE keeps working without it for every run but a
/// `--once-per`, `--advertise` or `--slots` one (see [`Columns`]), which names this
/// statement.
macro_rules! upgrade_sql {
    () => {
        "ALTER TABLE leader_lease ADD COLUMN IF NOT EXISTS timeline bigint, \
ADD COLUMN IF NOT EXISTS run_started_at timestamptz, \
ADD COLUMN IF NOT EXISTS run_ended_at timestamptz, \
ADD COLUMN IF NOT EXISTS run_holder text, \
ADD COLUMN IF NOT EXISTS run_epoch bigint, \
ADD COLUMN IF NOT EXISTS run_outcome text, \
ADD COLUMN IF NOT EXISTS advertised text, \
ADD COLUMN IF NOT EXISTS advertised_epoch bigint, \
ADD COLUMN IF NOT EXISTS kept_epoch bigint, \
ADD COLUMN IF NOT EXISTS slots bigint"
    };
}

pub const TABLE_SQL: &str = table_sql!();
pub const UPGRADE_SQL: &str = upgrade_sql!();

/// `init --print`: the table, and the upgrade of one that already exists
/// (`CREATE TABLE IF NOT EXISTS` leaves an old table as it is).
pub const SCHEMA: Schema = Schema {
    dialect: "PostgreSQL",
    sql: concat!(table_sql!(), ";\n", upgrade_sql!()),
};

pub(super) const EXISTS_SQL: &str =
    "SELECT CASE WHEN to_regclass('leader_lease') IS NULL THEN 0::int8 ELSE 1::int8 END";

/// How many of the columns [`UPGRADE_SQL`] adds the table has: all of
/// them ([`UPGRADE_COLUMNS`]) or fewer.
pub(super) const HAS_COLUMNS_SQL: &str = "SELECT count(*)::int8 FROM pg_attribute
    WHERE attrelid = to_regclass('leader_lease') AND NOT attisdropped
      AND attname IN ('timeline', 'run_started_at', 'run_ended_at', 'run_holder', 'run_epoch',
                      'run_outcome', 'advertised', 'advertised_epoch', 'kept_epoch', 'slots')";
pub(super) const UPGRADE_COLUMNS: i64 = 10;

/// The server's WAL timeline: the first 8 hex digits of the name of the WAL
/// file being written. It changes the moment a standby is promoted (the
/// checkpoint's timeline, `pg_control_checkpoint()`, only at the next
/// checkpoint). Both functions may be called by any role; on a standby they
/// fail, but so does every write there, and the write's error (read-only,
/// 25006) comes first.
pub(super) const TIMELINE: &str =
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint";

/// What a write returns beside its own columns: whether this session's
/// commit waits for a synchronous standby (see [`PgStore::not_durable`]).
pub(super) const SYNC_COLUMNS: &str =
    "current_setting('synchronous_commit'), current_setting('synchronous_standby_names')";

/// The statements for a table with the `timeline` column, or for one made
/// by an older release, which has none. The first write tries the former;
/// SQLSTATE 42703 (undefined column) switches the store to the latter for
/// the rest of the process, which then keeps today's behaviour (epochs still
/// jump with the timeline, since that needs no column) without adoption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Columns {
    WithTimeline,
    Legacy,
}

/// A lease `ms` milliseconds from the transaction's start.
pub(super) fn lease_end(ms: i64) -> String {
    format!("now() + make_interval(secs => {ms}::float8 / 1000)")
}

// Two statements, one transaction (one simple-protocol message, see
// `PgStore::run`). The first adopts a held lease last written on another
// timeline (or by a release that did not record one): under the row lock it
// pushes the expiry to at least L from now by this server's clock and marks
// the row as this timeline's, holder and epoch untouched. The second is the
// acquisition proper; after an adoption it sees the row (this transaction's
// own write) held until at least now + L and takes nothing. It also refuses
// an expired row from another timeline that the first did not adopt (one
// freed and taken again between the two statements by an older leaderrun
// that does not record the timeline): held, never taken on a foreign clock.
//
// The epoch: `greatest(old + 1, (timeline − 1) · 2³² + 1)`.
pub(super) fn acquire_sql(
    name: &str,
    holder: &str,
    ms: i64,
    cols: Columns,
) -> Result<String, sqlx::Error> {
    let (name, holder) = (text(name)?, text(holder)?);
    let end = lease_end(ms);
    Ok(match cols {
        Columns::WithTimeline => format!(
            "WITH t AS (SELECT {TIMELINE} AS tl)
     UPDATE leader_lease l SET expires_at = greatest(l.expires_at, {end}), timeline = t.tl
       FROM t
      WHERE l.name = {name} AND l.holder IS NOT NULL AND l.timeline IS DISTINCT FROM t.tl
     RETURNING 'adopted'::text, l.epoch;
     {}",
            taking(&format!(
                "INSERT INTO leader_lease AS l (name, holder, epoch, expires_at, timeline)
     SELECT {name}, {holder}, (t.tl - 1) * 4294967296 + 1, {end}, t.tl FROM t
     ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = greatest(l.epoch + 1, EXCLUDED.epoch),
            expires_at = EXCLUDED.expires_at, timeline = EXCLUDED.timeline
      WHERE l.holder IS NULL
         OR (l.expires_at <= now() AND l.timeline IS NOT DISTINCT FROM EXCLUDED.timeline)"
            ))
        ),
        Columns::Legacy => taking(&format!(
            "INSERT INTO leader_lease AS l (name, holder, epoch, expires_at)
     SELECT {name}, {holder}, (t.tl - 1) * 4294967296 + 1, {end} FROM t
     ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = greatest(l.epoch + 1, EXCLUDED.epoch),
            expires_at = EXCLUDED.expires_at
      WHERE l.holder IS NULL OR l.expires_at <= now()"
        )),
    })
}

/// The taking statement around `insert` (an `INSERT … ON CONFLICT … DO
/// UPDATE … WHERE`, reading the timeline from `t`): it answers `'taken'`,
/// the epoch and [`SYNC_COLUMNS`] for a lease it took, nothing otherwise,
/// and notifies `watch` (wake.rs, `PG_ACQUIRED_CHANNEL`) of what it took
/// in the same statement, so the `NOTIFY` is delivered at the commit that
/// takes the lease, never before it and never without it. (A `SELECT` in a
/// `WITH` runs only when it is used: the final join makes it run, once per
/// lease taken, as in [`release_sql`].)
fn taking(insert: &str) -> String {
    format!(
        "WITH t AS (SELECT {TIMELINE} AS tl),
     a AS ({insert}
     RETURNING l.name, l.epoch),
     n AS (SELECT pg_notify('{}', name) FROM a)
     SELECT 'taken'::text, a.epoch, {SYNC_COLUMNS} FROM a CROSS JOIN (SELECT count(*) FROM n) notified",
        super::wake::PG_ACQUIRED_CHANNEL
    )
}

/// A period's window: `half` milliseconds.
fn window(half_ms: i64) -> String {
    format!("make_interval(secs => {half_ms}::float8 / 1000)")
}

/// What a statement built for `--once-per` says when the store has fallen
/// back to an older release's table: it needs the columns that table lacks.
fn needs_run_columns() -> sqlx::Error {
    sqlx::Error::Encode("--once-per on a table without its columns".into())
}

// `--once-per`: the acquire above (a table with every column: `run_*`
// come with `timeline`), whose takeover also requires that no run of this
// name started less than `half` ago by this server's clock, and which
// writes the run record's start (start, holder, epoch; no end, no outcome)
// in the same statement. The conflict branch evaluates both conditions on
// the latest committed row under its lock, so of racers in one period one
// takes it, whichever way the row lock falls; a racer that waited sees the
// winner's start. A new row is a first run. The third statement tells the
// two ways of not taking apart: it answers only when the period's run
// started less than `half` ago (`now()` is the transaction's start in all
// three, so it is the exact complement of the second's condition), and
// only when nothing was taken is it looked at. A run whose command never
// started (its record's outcome `not started`: handed back after a freeze,
// a late confirmation, a commit not durable) does not count: the period is
// still to run. With `--retry-failed` neither does a run that did not end
// `exit 0`: a failed outcome, or none while the lease is free or expired
// (the takeover's own condition), which is a run that never ended.
//
// A record this release cannot read (`readable`: an outcome it does not
// write, a start more than FUTURE_LIMIT ahead of the server's clock) is
// never taken over, and the third statement answers `unreadable` with the
// outcome instead, whatever the period: the run refuses rather than guess.
pub(super) fn acquire_once_sql(
    name: &str,
    holder: &str,
    ms: i64,
    period: crate::store::Period,
    cols: Columns,
) -> Result<String, sqlx::Error> {
    if cols == Columns::Legacy {
        return Err(needs_run_columns());
    }
    let (name, holder) = (text(name)?, text(holder)?);
    let end = lease_end(ms);
    let ahead = window(millis(crate::store::FUTURE_LIMIT));
    let window = window(millis(period.half));
    let not_started = text(crate::store::NOT_STARTED)?;
    let succeeded = text(crate::store::SUCCEEDED)?;
    let started = clamped("run_started_at");
    let retry = if period.retry_failed { "true" } else { "false" };
    let readable = |l: &str| {
        format!(
            "({l}run_started_at IS NULL
              OR ({l}run_started_at <= now() + {ahead}
                  AND ({l}run_outcome IS NULL
                       OR {l}run_outcome IN ('lost', 'killed', {not_started})
                       OR {l}run_outcome ~ '^(exit|signal) [0-9]{{1,10}}$')))",
        )
    };
    let (readable_l, readable_row) = (readable("l."), readable(""));
    let taken = taking(&format!(
        "INSERT INTO leader_lease AS l (name, holder, epoch, expires_at, timeline,
                                    run_started_at, run_ended_at, run_holder, run_epoch, run_outcome)
     SELECT {name}, {holder}, (t.tl - 1) * 4294967296 + 1, {end}, t.tl,
            now(), NULL, {holder}, (t.tl - 1) * 4294967296 + 1, NULL FROM t
     ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = greatest(l.epoch + 1, EXCLUDED.epoch),
            expires_at = EXCLUDED.expires_at, timeline = EXCLUDED.timeline,
            run_started_at = now(), run_ended_at = NULL, run_holder = EXCLUDED.holder,
            run_epoch = greatest(l.epoch + 1, EXCLUDED.epoch), run_outcome = NULL
      WHERE (l.holder IS NULL
             OR (l.expires_at <= now() AND l.timeline IS NOT DISTINCT FROM EXCLUDED.timeline))
        AND {readable_l}
        AND (l.run_started_at IS NULL OR l.run_started_at <= now() - {window}
             OR l.run_outcome IS NOT DISTINCT FROM {not_started}
             OR ({retry} AND l.run_outcome IS DISTINCT FROM {succeeded}))"
    ));
    Ok(format!(
        "WITH t AS (SELECT {TIMELINE} AS tl)
     UPDATE leader_lease l SET expires_at = greatest(l.expires_at, {end}), timeline = t.tl
       FROM t
      WHERE l.name = {name} AND l.holder IS NOT NULL AND l.timeline IS DISTINCT FROM t.tl
     RETURNING 'adopted'::text, l.epoch;
     {taken};
     SELECT CASE WHEN {readable_row} THEN 'done' ELSE 'unreadable' END,
            greatest(0, least(extract(epoch FROM now() - {started}) * 1000, {MAX_MS}))::bigint,
            run_outcome
       FROM leader_lease WHERE name = {name}
        AND (NOT {readable_row}
             OR (run_started_at > now() - {window}
                 AND run_outcome IS DISTINCT FROM {not_started}
                 AND NOT ({retry} AND run_outcome IS DISTINCT FROM {succeeded})))"
    ))
}

/// A duration in whole milliseconds, for a statement.
fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Ten years in milliseconds: a time shown is clamped to it.
const MAX_MS: i64 = 10 * 366 * 24 * 3600 * 1000;

/// Column `c` clamped to ten years either side of now, so that arithmetic
/// on a row written by hand (`infinity`) cannot fail the statement.
fn clamped(c: &str) -> String {
    format!("least(greatest({c}, now() - interval '10 years'), now() + interval '10 years')")
}

/// `, timeline = <this server's>` where the table records it.
pub(super) fn set_timeline(cols: Columns) -> String {
    match cols {
        Columns::WithTimeline => format!(", timeline = {TIMELINE}"),
        Columns::Legacy => String::new(),
    }
}

// The lease must be unexpired, except that a lease last written on another
// timeline is renewed whatever its expiry says: that expiry was written by
// another server's clock, and holder and epoch match only the grant this
// holder got, which no one has taken on this timeline (taking records the
// timeline). The holder renews only before its own give-up deadline, which
// is earlier than that lease's end on the clock that wrote it.
pub(super) fn renew_sql(
    name: &str,
    holder: &str,
    epoch: i64,
    ms: i64,
    cols: Columns,
) -> Result<String, sqlx::Error> {
    let (name, holder) = (text(name)?, text(holder)?);
    let live = match cols {
        Columns::WithTimeline => {
            format!("(expires_at > now() OR timeline IS DISTINCT FROM {TIMELINE})")
        }
        Columns::Legacy => "expires_at > now()".to_string(),
    };
    Ok(format!(
        "UPDATE leader_lease
        SET expires_at = {end}{tl}
      WHERE name = {name} AND holder = {holder} AND epoch = {epoch} AND {live}
     RETURNING epoch, {SYNC_COLUMNS}",
        end = lease_end(ms),
        tl = set_timeline(cols),
    ))
}

// With keep > 0 the holder stays and the lease runs `keep` more from now
// (`--min-hold`); with keep = 0 the lease is free at once. The epoch is
// untouched either way: the next acquisition raises it. A lease freed here
// notifies waiters (wake.rs) in the same statement, so the
// NOTIFY is delivered at the commit that frees the lease, never before it
// and never without it. (A SELECT in a WITH runs only when it is used: the
// final join makes it run.) One row per lease released.
//
// With an `ending` (`--once-per`), the same statement writes the run
// record's end and outcome, where the record is this holder's at this
// epoch (it is: this holder's acquire wrote it, and no one else's can have
// since while the lease row still names us).
pub(super) fn release_sql(
    name: &str,
    holder: &str,
    epoch: i64,
    keep: i64,
    ending: Option<&str>,
    cols: Columns,
) -> Result<String, sqlx::Error> {
    let (name, holder) = (text(name)?, text(holder)?);
    let ended = match ending {
        None => String::new(),
        Some(_) if cols == Columns::Legacy => return Err(needs_run_columns()),
        Some(outcome) => {
            let mine = format!("run_holder = {holder} AND run_epoch = {epoch}");
            format!(
                ",
            run_ended_at = CASE WHEN {mine} THEN now() ELSE run_ended_at END,
            run_outcome = CASE WHEN {mine} THEN {} ELSE run_outcome END",
                text(outcome)?
            )
        }
    };
    Ok(format!(
        "WITH r AS (UPDATE leader_lease
        SET holder = CASE WHEN {keep}::bigint > 0 THEN holder END,
            expires_at = {end}{tl}{ended}
      WHERE name = {name} AND holder = {holder} AND epoch = {epoch}
     RETURNING name, holder, epoch),
     n AS (SELECT pg_notify('leaderrun_released', name) FROM r WHERE holder IS NULL)
     SELECT r.epoch, {SYNC_COLUMNS} FROM r CROSS JOIN (SELECT count(*) FROM n) notified",
        end = lease_end(keep),
        tl = set_timeline(cols),
    ))
}

/// What `LeaseInfo` is read from (see `sql::lease_info`: the table's own
/// columns follow, for the values a table may or may not have yet). The
/// remaining time is clamped to ±10 years, so a row holding `infinity`
/// (written by hand) still lists.
macro_rules! columns {
    () => {
        "name, holder, epoch,
        (extract(epoch FROM (least(greatest(expires_at, now() - interval '10 years'),
                                   now() + interval '10 years') - now())) * 1000)::bigint,
        leader_lease.*"
    };
}

// The lease's values (`sql::lease_info`), each a statement appended to
// an acquire or a release in the same one-message transaction, so the value
// is there from the commit that takes the lease and gone with the one that
// frees it. They name columns a table made by an older release lacks: only
// a run that needs them sends them (`--advertise`, a `--min-hold` keep).

/// After an acquire: the taken tenure's `--advertise` value and `--slots`
/// N (each `NULL` when not given). It matches only a row this holder
/// holds, which it does only if the acquire took it (a holder id is one
/// process's, and a process acquires only when it holds nothing).
pub(super) fn taken_values_sql(
    name: &str,
    holder: &str,
    advertise: Option<&str>,
    slots: Option<u32>,
) -> Result<String, sqlx::Error> {
    let advertise = match advertise {
        Some(a) => text(a)?,
        None => "NULL".to_string(),
    };
    let slots = slots.map_or("NULL".to_string(), |n| n.to_string());
    Ok(format!(
        ";
     UPDATE leader_lease SET advertised = {advertise}, slots = {slots},
            advertised_epoch = epoch, kept_epoch = NULL
      WHERE name = {} AND holder = {}",
        text(name)?,
        text(holder)?
    ))
}

/// After a release of the grant at `epoch`: kept (`keep` > 0) the tenure
/// is marked ended (its run is over; only `--min-hold` holds the lease);
/// freed, its advertised value goes with it.
pub(super) fn released_values_sql(
    name: &str,
    epoch: i64,
    keep: i64,
) -> Result<String, sqlx::Error> {
    Ok(format!(
        ";
     UPDATE leader_lease
        SET kept_epoch = CASE WHEN {keep}::bigint > 0 THEN epoch END,
            advertised = CASE WHEN {keep}::bigint > 0 THEN advertised END,
            slots = CASE WHEN {keep}::bigint > 0 THEN slots END,
            advertised_epoch = CASE WHEN {keep}::bigint > 0 THEN advertised_epoch END
      WHERE name = {} AND epoch = {epoch}",
        text(name)?
    ))
}

/// The run records (`--once-per`): start and end by the server's clock, as
/// RFC 3339 in UTC and as milliseconds ago (clamped as above).
pub(super) fn run_records_sql(name: Option<&str>) -> Result<String, sqlx::Error> {
    let only = match name {
        Some(n) => format!(" AND name = {}", text(n)?),
        None => String::new(),
    };
    let at =
        |c: &str| format!("to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')");
    let ago = |c: &str| {
        format!(
            "(extract(epoch FROM now() - {}) * 1000)::bigint",
            clamped(c)
        )
    };
    Ok(format!(
        "SELECT name, run_holder, run_epoch, run_outcome, {}, {}, {}, {}
       FROM leader_lease WHERE run_started_at IS NOT NULL{only} ORDER BY name",
        at("run_started_at"),
        ago("run_started_at"),
        at("run_ended_at"),
        ago("run_ended_at"),
    ))
}

pub(super) const LIST_SQL: &str =
    concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");

pub(super) fn inspect_sql(name: &str) -> Result<String, sqlx::Error> {
    Ok(format!(
        concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = {}"),
        text(name)?
    ))
}

// The row is locked and read as it was, then cleared; `epoch` is untouched.
// Waiters are notified in the same statement (see `release_sql`).
pub(super) fn clear_sql(name: &str, epoch: Option<i64>) -> Result<String, sqlx::Error> {
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

/// What replication promises right now, as the server sees it: whether it
/// is a standby, this session's `synchronous_commit` and
/// `synchronous_standby_names`, and the streaming standbys: how many, how
/// many of them this role may see the details of (without
/// `pg_read_all_stats` every column but the pid is NULL), how many are
/// synchronous.
pub(super) const REPLICATION_SQL: &str =
    "SELECT pg_is_in_recovery(), current_setting('synchronous_commit'),
        current_setting('synchronous_standby_names'),
        (SELECT count(*) FROM pg_stat_replication)::int8,
        (SELECT count(sync_state) FROM pg_stat_replication)::int8,
        (SELECT count(*) FROM pg_stat_replication
          WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))::int8";

/// A text value as an SQL string literal. Every call goes out as one
/// simple-protocol message (see [`PgStore::run`]), so values are written
/// into the statement instead of bound. `E'…'` reads the same whatever
/// `standard_conforming_strings` says, and with `client_encoding` UTF8 (the
/// driver always asks for it) no byte of a multi-byte character can be a
/// quote or a backslash; doubling both is then a complete escape. A NUL
/// cannot be stored in Postgres text at all and is refused.
pub(super) fn text(s: &str) -> Result<String, sqlx::Error> {
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
/// (wake.rs) is never a lease connection.
pub(super) const UNLISTEN_SQL: &str = "UNLISTEN *; ";

/// What a run needs beyond the table itself, each with the privilege that
/// grants it; `init` lists the ones the login lacks. `LISTEN` needs no
/// privilege; `pg_notify` (called by release and clear) is executable by
/// everyone unless revoked.
pub(super) const PRIVILEGES_SQL: &str = "SELECT need FROM (VALUES
        ('SELECT on leader_lease', has_table_privilege('leader_lease', 'SELECT')),
        ('INSERT on leader_lease', has_table_privilege('leader_lease', 'INSERT')),
        ('UPDATE on leader_lease', has_table_privilege('leader_lease', 'UPDATE')),
        ('EXECUTE on pg_notify(text, text)',
            has_function_privilege('pg_notify(text, text)', 'EXECUTE'))) v(need, ok)
      WHERE NOT ok";

pub(super) fn is_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some(code))
}
pub(super) const UNDEFINED_TABLE: &str = "42P01";
pub(super) const UNDEFINED_COLUMN: &str = "42703";

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiters LISTEN on the channel the statements that free a lease notify.
    #[test]
    fn release_and_clear_notify_the_channel_waiters_listen_on() {
        let notify = format!("pg_notify('{}', name)", super::super::wake::PG_CHANNEL);
        for cols in [Columns::WithTimeline, Columns::Legacy] {
            assert!(release_sql("n", "h", 1, 0, None, cols)
                .unwrap()
                .contains(&notify));
        }
        assert!(clear_sql("n", None).unwrap().contains(&notify));
    }

    /// `watch` listens for acquisitions on the channel every statement
    /// that takes a lease notifies.
    #[test]
    fn acquires_notify_the_channel_watchers_listen_on() {
        let notify = format!(
            "pg_notify('{}', name)",
            super::super::wake::PG_ACQUIRED_CHANNEL
        );
        let p = crate::store::Period::new(std::time::Duration::from_millis(500));
        for cols in [Columns::WithTimeline, Columns::Legacy] {
            assert!(acquire_sql("n", "h", 1, cols).unwrap().contains(&notify));
        }
        assert!(acquire_once_sql("n", "h", 1, p, Columns::WithTimeline)
            .unwrap()
            .contains(&notify));
    }

    /// The statements for a table made by an older release never name the
    /// column it does not have.
    #[test]
    fn legacy_statements_do_not_name_the_timeline_column() {
        let legacy = [
            acquire_sql("n", "h", 1, Columns::Legacy).unwrap(),
            renew_sql("n", "h", 1, 1, Columns::Legacy).unwrap(),
            release_sql("n", "h", 1, 1, None, Columns::Legacy).unwrap(),
        ];
        for s in legacy {
            assert!(!s.contains("timeline"), "{s}");
        }
    }

    /// A run without `--once-per` sends exactly the statements it sent
    /// before the run record existed: none of them names a `run_*` column,
    /// so a table made before them, with the grants it had, keeps working.
    #[test]
    fn statements_without_once_per_do_not_name_the_run_record() {
        for cols in [Columns::WithTimeline, Columns::Legacy] {
            for s in [
                acquire_sql("n", "h", 1, cols).unwrap(),
                renew_sql("n", "h", 1, 1, cols).unwrap(),
                release_sql("n", "h", 1, 1, None, cols).unwrap(),
            ] {
                // (`leaderrun_released`, the channel, is not a column.)
                assert!(!s.replace("leaderrun_", "").contains("run_"), "{s}");
            }
        }
        assert!(!LIST_SQL.contains("run_"));
        assert!(!inspect_sql("n").unwrap().contains("run_"));
    }

    /// The once-per statements refuse an older release's table rather than
    /// fall back to statements that would not keep the rule.
    #[test]
    fn once_per_statements_need_the_run_columns() {
        let p = crate::store::Period::new(std::time::Duration::from_millis(500));
        assert!(acquire_once_sql("n", "h", 1, p, Columns::Legacy).is_err());
        assert!(release_sql("n", "h", 1, 0, Some("exit 0"), Columns::Legacy).is_err());
        let s = acquire_once_sql("n", "h", 1000, p, Columns::WithTimeline).unwrap();
        assert!(
            s.contains("run_started_at <= now() - make_interval(secs => 500"),
            "{s}"
        );
        // --retry-failed is a term of the same statement, off unless asked.
        assert!(
            s.contains("(false AND l.run_outcome IS DISTINCT FROM E'exit 0')"),
            "{s}"
        );
        let retry = crate::store::Period {
            retry_failed: true,
            ..p
        };
        let s = acquire_once_sql("n", "h", 1000, retry, Columns::WithTimeline).unwrap();
        assert!(
            s.contains("(true AND l.run_outcome IS DISTINCT FROM E'exit 0')"),
            "{s}"
        );
        assert!(
            s.contains("NOT (true AND run_outcome IS DISTINCT FROM E'exit 0')"),
            "{s}"
        );
        let s = release_sql("n", "h", 7, 0, Some("exit 3"), Columns::WithTimeline).unwrap();
        assert!(s.contains("E'exit 3'"), "{s}");
    }
}
