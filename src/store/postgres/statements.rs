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
    timeline   bigint
)"
    };
}

/// Brings a table made by an older release (without `timeline`) up to
/// date; idempotent. Needs the table's owner (ALTER); a role with only
/// SELECT, INSERT, UPDATE keeps working without it (see [`Columns`]).
macro_rules! upgrade_sql {
    () => {
        "ALTER TABLE leader_lease ADD COLUMN IF NOT EXISTS timeline bigint"
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

/// Whether the table has the `timeline` column (1) or not (0).
pub(super) const HAS_TIMELINE_SQL: &str = "SELECT count(*)::int8 FROM pg_attribute
    WHERE attrelid = to_regclass('leader_lease') AND attname = 'timeline' AND NOT attisdropped";

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
     WITH t AS (SELECT {TIMELINE} AS tl)
     INSERT INTO leader_lease AS l (name, holder, epoch, expires_at, timeline)
     SELECT {name}, {holder}, (t.tl - 1) * 4294967296 + 1, {end}, t.tl FROM t
     ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = greatest(l.epoch + 1, EXCLUDED.epoch),
            expires_at = EXCLUDED.expires_at, timeline = EXCLUDED.timeline
      WHERE l.holder IS NULL
         OR (l.expires_at <= now() AND l.timeline IS NOT DISTINCT FROM EXCLUDED.timeline)
     RETURNING 'taken'::text, l.epoch, {SYNC_COLUMNS}"
        ),
        Columns::Legacy => format!(
            "WITH t AS (SELECT {TIMELINE} AS tl)
     INSERT INTO leader_lease AS l (name, holder, epoch, expires_at)
     SELECT {name}, {holder}, (t.tl - 1) * 4294967296 + 1, {end} FROM t
     ON CONFLICT (name) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = greatest(l.epoch + 1, EXCLUDED.epoch),
            expires_at = EXCLUDED.expires_at
      WHERE l.holder IS NULL OR l.expires_at <= now()
     RETURNING 'taken'::text, l.epoch, {SYNC_COLUMNS}"
        ),
    })
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
pub(super) fn release_sql(
    name: &str,
    holder: &str,
    epoch: i64,
    keep: i64,
    cols: Columns,
) -> Result<String, sqlx::Error> {
    let (name, holder) = (text(name)?, text(holder)?);
    Ok(format!(
        "WITH r AS (UPDATE leader_lease
        SET holder = CASE WHEN {keep}::bigint > 0 THEN holder END,
            expires_at = {end}{tl}
      WHERE name = {name} AND holder = {holder} AND epoch = {epoch}
     RETURNING name, holder, epoch),
     n AS (SELECT pg_notify('leaderrun_released', name) FROM r WHERE holder IS NULL)
     SELECT r.epoch, {SYNC_COLUMNS} FROM r CROSS JOIN (SELECT count(*) FROM n) notified",
        end = lease_end(keep),
        tl = set_timeline(cols),
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
            assert!(release_sql("n", "h", 1, 0, cols).unwrap().contains(&notify));
        }
        assert!(clear_sql("n", None).unwrap().contains(&notify));
    }

    /// The statements for a table made by an older release never name the
    /// column it does not have.
    #[test]
    fn legacy_statements_do_not_name_the_timeline_column() {
        let legacy = [
            acquire_sql("n", "h", 1, Columns::Legacy).unwrap(),
            renew_sql("n", "h", 1, 1, Columns::Legacy).unwrap(),
            release_sql("n", "h", 1, 1, Columns::Legacy).unwrap(),
        ];
        for s in legacy {
            assert!(!s.contains("timeline"), "{s}");
        }
    }
}
