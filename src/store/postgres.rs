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
//! Across a failover (docs/stores.md, "Postgres across a promotion"):
//!
//! * **Epochs jump with the WAL timeline.** A promoted standby starts a new
//!   timeline at once; the acquiring statement reads it and never hands out
//!   less than `(timeline − 1) · 2³² + 1`. What the old timeline handed out
//!   (even a split-brain old primary still on it) stays below that for its
//!   first 2³² acquisitions, so an epoch the promoted server hands out is
//!   higher than every epoch the old one handed out, whether or not the
//!   standby received them.
//! * **A lease from another timeline is adopted, not taken.** Its expiry was
//!   written by another server's clock; an acquire that meets it held does not
//!   take it but sets `expires_at = greatest(expires_at, now() + L)` and the
//!   current timeline, holder and epoch untouched, in the same transaction,
//!   and reports it held. No rival gets it before L has passed on *this*
//!   server's clock since it first saw it, whatever the two clocks said.
//! * **A commit is a commit.** A write whose commit came back with a warning
//!   (Postgres warns, and still reports success, when a wait for a synchronous
//!   standby is cancelled: "committed locally") or during which synchronous
//!   replication was switched off counts as failed: an acquire hands the
//!   lease back at once, a renew does not extend the deadline.
//!
//! A server in read-only mode (`default_transaction_read_only`, a standby,
//! a primary demoted during a failover: SQLSTATE 25006) may take writes
//! again soon, so it is "may heal": a waiting contender keeps trying.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgRow};
use sqlx::{ConnectOptions, Connection, Row};
use tracing::instrument::WithSubscriber;

use super::push::{AnyWakeups, Fut, PgWakeups, Wakeups};
use super::sql::{self, lease_info, millis, Dialect, Session};
use super::{
    AnyStore, Capabilities, Init, LeaseInfo, Replication, Schema, Store, StoreAdmin, StoreError,
    Target,
};
use crate::redact::Redacted;

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

const EXISTS_SQL: &str =
    "SELECT CASE WHEN to_regclass('leader_lease') IS NULL THEN 0::int8 ELSE 1::int8 END";

/// Whether the table has the `timeline` column (1) or not (0).
const HAS_TIMELINE_SQL: &str = "SELECT count(*)::int8 FROM pg_attribute
    WHERE attrelid = to_regclass('leader_lease') AND attname = 'timeline' AND NOT attisdropped";

/// The server's WAL timeline: the first 8 hex digits of the name of the WAL
/// file being written. It changes the moment a standby is promoted (the
/// checkpoint's timeline, `pg_control_checkpoint()`, only at the next
/// checkpoint). Both functions may be called by any role; on a standby they
/// fail, but so does every write there, and the write's error (read-only,
/// 25006) comes first.
const TIMELINE: &str =
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint";

/// What a write returns beside its own columns: whether this session's
/// commit waits for a synchronous standby (see [`PgStore::not_durable`]).
const SYNC_COLUMNS: &str =
    "current_setting('synchronous_commit'), current_setting('synchronous_standby_names')";

/// The statements for a table with the `timeline` column, or for one made
/// by an older release, which has none. The first write tries the former;
/// SQLSTATE 42703 (undefined column) switches the store to the latter for
/// the rest of the process, which then keeps today's behaviour (epochs still
/// jump with the timeline, since that needs no column) without adoption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Columns {
    WithTimeline,
    Legacy,
}

/// A lease `ms` milliseconds from the transaction's start.
fn lease_end(ms: i64) -> String {
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
fn acquire_sql(name: &str, holder: &str, ms: i64, cols: Columns) -> Result<String, sqlx::Error> {
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
fn set_timeline(cols: Columns) -> String {
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
fn renew_sql(
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
// notifies waiters (src/store/push.rs) in the same statement, so the
// NOTIFY is delivered at the commit that frees the lease, never before it
// and never without it. (A SELECT in a WITH runs only when it is used: the
// final join makes it run.) One row per lease released.
fn release_sql(
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

/// What replication promises right now, as the server sees it: whether it
/// is a standby, this session's `synchronous_commit` and
/// `synchronous_standby_names`, and the streaming standbys: how many, how
/// many of them this role may see the details of (without
/// `pg_read_all_stats` every column but the pid is NULL), how many are
/// synchronous.
const REPLICATION_SQL: &str = "SELECT pg_is_in_recovery(), current_setting('synchronous_commit'),
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

// ---------------------------------------------------------------------------
// Notices: what the server said beside a call's result.

/// The `tracing` target sqlx 0.8 sends every `NoticeResponse` to (its only
/// way of surfacing them: the message text as the event's `message`, the
/// notice's severity as the event's level, no SQLSTATE). The level comes
/// from the notice's non-localized severity field (`V`, Postgres 9.6 and
/// later), so a WARNING is recognised whatever `lc_messages` says.
const NOTICE_TARGET: &str = "sqlx::postgres::notice";

/// The warnings (and anything more severe) that arrived during one call.
#[derive(Clone, Default)]
struct Notices(Arc<Mutex<Vec<String>>>);

impl Notices {
    fn take(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// A subscriber that only collects sqlx's notices. It is made the *scoped*
/// default while one call's future is polled ([`WithSubscriber`]), so it
/// sees exactly the notices read during that call: the LISTEN connection
/// (src/store/push.rs) is polled on the same thread, but in futures of its
/// own, under the global subscriber. Everything else sqlx might log inside
/// a call (statement logging is off, see `from_url`) is dropped.
struct NoticeSink(Notices);

impl tracing::Subscriber for NoticeSink {
    fn register_callsite(
        &self,
        m: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if m.target() == NOTICE_TARGET {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target() == NOTICE_TARGET && *m.level() <= tracing::Level::WARN
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::WARN)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if e.metadata().target() != NOTICE_TARGET || *e.metadata().level() > tracing::Level::WARN {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                if f.name() == "message" {
                    self.0 = v.to_string();
                }
            }
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        e.record(&mut m);
        if let Ok(mut seen) = (self.0).0.lock() {
            seen.push(m.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// What one call brought back.
struct Ran {
    rows: Vec<PgRow>,
    /// Warnings the server sent during the call (see [`NoticeSink`]).
    warnings: Vec<String>,
}

// ---------------------------------------------------------------------------
// Replication as the server reports it.

/// One row of [`REPLICATION_SQL`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct ReplState {
    in_recovery: bool,
    commit: String,
    names: String,
    standbys: i64,
    visible: i64,
    sync: i64,
}

/// Whether a commit in a session with these settings waits for a
/// synchronous standby.
fn waits_for_standby(commit: &str, names: &str) -> bool {
    !matches!(commit, "off" | "local") && !names.trim().is_empty()
}

impl ReplState {
    fn from_row(r: &PgRow) -> Result<ReplState, sqlx::Error> {
        Ok(ReplState {
            in_recovery: r.try_get(0)?,
            commit: r.try_get(1)?,
            names: r.try_get(2)?,
            standbys: r.try_get(3)?,
            visible: r.try_get(4)?,
            sync: r.try_get(5)?,
        })
    }

    /// For `require=sync`: `None` when an acknowledged commit is on a
    /// synchronous standby, else what is missing and whether it may heal.
    fn missing(&self) -> Option<(String, bool)> {
        if self.in_recovery {
            return Some(("the server is a standby (read-only)".into(), true));
        }
        if matches!(self.commit.as_str(), "off" | "local") {
            return Some((
                format!(
                    "synchronous_commit is {} for this role, so no commit waits for a standby",
                    self.commit
                ),
                true,
            ));
        }
        if self.names.trim().is_empty() {
            return Some((
                "synchronous_standby_names is empty, so no commit waits for a standby".into(),
                true,
            ));
        }
        if self.standbys > self.visible {
            return Some((
                "this role may not see pg_stat_replication's details \
                 (GRANT pg_monitor, or pg_read_all_stats, to it)"
                    .into(),
                false,
            ));
        }
        if self.sync == 0 {
            return Some((
                format!(
                    "no synchronous standby is connected ({} standby{} streaming, none synchronous)",
                    self.standbys,
                    if self.standbys == 1 { "" } else { "s" }
                ),
                true,
            ));
        }
        None
    }

    fn replication(&self) -> Replication {
        let n = |k: i64| format!("{k} standby{}", if k == 1 { "" } else { "s" });
        if self.in_recovery {
            return Replication::unknown("this server is a standby (read-only)");
        }
        if self.standbys > self.visible {
            return Replication::unknown(format!(
                "{} connected; this role may not see their details \
                 (GRANT pg_monitor, or pg_read_all_stats, to it)",
                n(self.standbys)
            ));
        }
        let sync = waits_for_standby(&self.commit, &self.names);
        match (sync, self.standbys, self.sync) {
            (true, _, k) if k > 0 => Replication {
                can_lose_acknowledged: Some(false),
                detail: format!(
                    "synchronous, {k} of {} synchronous (synchronous_commit = {})",
                    n(self.standbys),
                    self.commit
                ),
            },
            (true, total, _) => Replication {
                can_lose_acknowledged: Some(false),
                detail: format!(
                    "synchronous, but none of {} is synchronous now: writes wait",
                    n(total)
                ),
            },
            (false, 0, _) => Replication::unknown(
                "asynchronous, no standby connected (a standby promoted later may lack the \
                 last acquisitions)",
            ),
            (false, total, _) => Replication {
                can_lose_acknowledged: Some(true),
                detail: format!("asynchronous, {}", n(total)),
            },
        }
    }
}

// ---------------------------------------------------------------------------
// The URL: hosts and libpq's parameters.

/// libpq's `target_session_attrs` (libpq 14 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attrs {
    Any,
    ReadWrite,
    ReadOnly,
    Primary,
    Standby,
    PreferStandby,
}

impl Attrs {
    fn parse(v: &str) -> Option<Attrs> {
        Some(match v {
            "any" => Attrs::Any,
            "read-write" => Attrs::ReadWrite,
            "read-only" => Attrs::ReadOnly,
            "primary" => Attrs::Primary,
            "standby" => Attrs::Standby,
            "prefer-standby" => Attrs::PreferStandby,
            _ => return None,
        })
    }

    /// Whether a server that says `in_recovery`, `read_only` will do.
    fn accepts(self, in_recovery: bool, read_only: bool) -> bool {
        match self {
            Attrs::Any => true,
            Attrs::ReadWrite => !read_only,
            Attrs::ReadOnly => read_only,
            Attrs::Primary => !in_recovery,
            Attrs::Standby | Attrs::PreferStandby => in_recovery,
        }
    }
}

/// Query parameters sqlx understands; anything else would be logged by the
/// driver with its value, so it is refused here instead (by name only).
const SQLX_PARAMS: &[&str] = &[
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

/// libpq's parameters that leaderrun reads itself, and its own. They are
/// taken out of the URL before sqlx sees it.
///
/// * `keepalives*` are accepted and have no effect: every call is bounded by
///   its own timeout, so a dead connection costs one call, not a hang.
/// * `fallback_application_name` is accepted and has no effect: leaderrun
///   always names itself (`application_name` in the URL wins).
/// * `endpoint` carries the hosts after the first (see [`super::etcd::fold_hosts`]).
const OWN_PARAMS: &[&str] = &[
    "target_session_attrs",
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "channel_binding",
    "fallback_application_name",
    "require",
    ENDPOINT_PARAM,
];

const ENDPOINT_PARAM: &str = "endpoint";
const DEFAULT_PORT: u16 = 5432;

/// Rewrite `postgres://u:p@h1:p1,h2:p2/db` (libpq's host list, which URL
/// syntax has no room for) into one URL, the hosts after the first as
/// `endpoint=` parameters; see [`super::etcd::fold_hosts`], which does it
/// for etcd the same way.
pub fn fold_hosts(raw: &str) -> String {
    super::etcd::fold_hosts(raw)
}

/// One `host[:port]` (`[v6]:port` for IPv6), default port 5432.
fn host_port(h: &str) -> Result<(String, u16), String> {
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
            let port = port
                .parse::<u16>()
                .map_err(|_| "has a host with an invalid port number".to_string())?;
            (host, port)
        }
        _ => (h, DEFAULT_PORT),
    };
    if host.is_empty() {
        return Err("has an empty host in its host list".into());
    }
    Ok((host.to_string(), port))
}

/// One server to try.
struct Host {
    /// `host:port`, for errors.
    shown: String,
    opts: PgConnectOptions,
}

/// What the URL says beyond sqlx's options.
struct Parsed {
    hosts: Vec<Host>,
    attrs: Attrs,
    connect_timeout: Option<Duration>,
    require_sync: bool,
    shown: String,
}

fn parse_url(url: &url::Url, app_name: &str) -> Result<Parsed, String> {
    let known: Vec<&str> = SQLX_PARAMS.iter().chain(OWN_PARAMS).copied().collect();
    sql::check_params(url, &known)?;
    let mut attrs = Attrs::Any;
    let mut connect_timeout = None;
    let mut require_sync = false;
    let mut more = Vec::new();
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "target_session_attrs" => {
                attrs = Attrs::parse(&v).ok_or(
                    "has a target_session_attrs that is not one of any, read-write, read-only, \
                     primary, standby, prefer-standby",
                )?;
            }
            // libpq: whole seconds, 0 or less waits for ever, 1 means 2.
            "connect_timeout" => {
                let s: i64 = v
                    .trim()
                    .parse()
                    .map_err(|_| "has a connect_timeout that is not a whole number of seconds")?;
                connect_timeout = (s > 0).then(|| Duration::from_secs(s.max(2) as u64));
            }
            "keepalives" | "keepalives_idle" | "keepalives_interval" | "keepalives_count" => {
                v.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("has a {k} that is not a whole number"))?;
            }
            "channel_binding" => match v.as_ref() {
                "disable" | "prefer" => {}
                "require" => {
                    return Err(
                        "has channel_binding=require, which leaderrun cannot honour \
                                (its Postgres driver does not do SCRAM channel binding); \
                                use prefer or disable"
                            .into(),
                    )
                }
                _ => return Err("has a channel_binding that is not one of disable, prefer".into()),
            },
            "require" => match v.as_ref() {
                "sync" => require_sync = true,
                _ => return Err("has a require= that is not sync".into()),
            },
            ENDPOINT_PARAM => more.push(host_port(&v)?),
            _ => {}
        }
    }
    let first = match url.host() {
        Some(url::Host::Domain(d)) => Some(d.to_string()),
        Some(url::Host::Ipv4(a)) => Some(a.to_string()),
        Some(url::Host::Ipv6(a)) => Some(format!("[{a}]")),
        None => None,
    };
    if first.as_deref().is_none_or(str::is_empty) && !more.is_empty() {
        return Err("has a host list whose first host is empty".into());
    }
    // The URL sqlx sees: one host at a time, only its own parameters.
    let mut base = url.clone();
    let own: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !OWN_PARAMS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if own.is_empty() {
        base.set_query(None);
    } else {
        base.query_pairs_mut().clear().extend_pairs(own);
    }
    let user_named_itself = url.query_pairs().any(|(k, _)| k == "application_name");
    let opts_for = |u: &url::Url| -> Result<PgConnectOptions, String> {
        let opts = PgConnectOptions::from_url(u)
            .map_err(|e| format!("is not valid: {}", sql::message(&e)))?;
        // Respect an application_name the user put in the URL.
        let opts = if user_named_itself {
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
        Ok(opts
            .extra_float_digits(None)
            // Our own log lines say what matters; SQL text in a cron mail does not.
            .disable_statement_logging())
    };
    let mut hosts = vec![Host {
        shown: match (&first, url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.clone(),
            (None, _) => "the default host".into(),
        },
        opts: opts_for(&base)?,
    }];
    for (h, p) in &more {
        let mut u = base.clone();
        u.set_host(Some(h))
            .map_err(|_| "has a host in its host list that is not valid")?;
        u.set_port(Some(*p))
            .map_err(|_| "has a host in its host list that is not valid")?;
        hosts.push(Host {
            shown: format!("{h}:{p}"),
            opts: opts_for(&u)?,
        });
    }
    // Shown with its whole host list, the password starred by parsing.
    let mut plain = url.clone();
    let rest: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != ENDPOINT_PARAM)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if rest.is_empty() {
        plain.set_query(None);
    } else {
        plain.query_pairs_mut().clear().extend_pairs(rest);
    }
    let mut shown = Redacted::new(&plain).to_string();
    if !more.is_empty() {
        let list: String = more.iter().map(|(h, p)| format!(",{h}:{p}")).collect();
        // The authority ends at the first '/' after "://" (the password is
        // `***` by now, so it holds none).
        let start = shown.find("://").map_or(0, |i| i + 3);
        let end = shown[start..]
            .find(['/', '?'])
            .map_or(shown.len(), |i| start + i);
        shown.insert_str(end, &list);
    }
    Ok(Parsed {
        hosts,
        attrs,
        connect_timeout,
        require_sync,
        shown,
    })
}

// ---------------------------------------------------------------------------
// The store.

pub struct PgStore {
    s: Session<Pg>,
    /// Switched to `Legacy` by the first write that finds no `timeline`.
    cols: Columns,
    /// `?require=sync`: lead only while synchronous replication is active.
    require_sync: bool,
    /// When the last `require=sync` check passed (see [`SYNC_CHECK_TTL`]).
    sync_checked: Option<Instant>,
    notices: Notices,
    /// The [`NoticeSink`] on `notices`, made once: making a dispatcher
    /// re-registers every callsite.
    dispatch: tracing::Dispatch,
}

/// How long a passing `require=sync` check is trusted before the next
/// acquire asks again. Between two checks, a standby that goes away makes
/// the acquiring commit wait, and a cancelled or abandoned wait (or
/// synchronous replication switched off) fails the acquire anyway
/// ([`PgStore::not_durable`]); the check is there to say *what* is missing
/// before anything waits.
pub const SYNC_CHECK_TTL: Duration = Duration::from_secs(1);

/// How to reach the server.
struct Pg {
    hosts: Vec<Host>,
    attrs: Attrs,
    connect_timeout: Option<Duration>,
    /// `SET LOCAL` of the server-side timeouts, put before every statement.
    timeouts: String,
    shown: String,
}

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
        let parsed = url::Url::parse(&fold_hosts(url)).map_err(|e| format!("is not valid: {e}"))?;
        PgStore::from_url(&parsed, app_name, statement_timeout)
    }

    fn from_url(
        url: &url::Url,
        app_name: &str,
        statement_timeout: Duration,
    ) -> Result<PgStore, String> {
        let p = parse_url(url, app_name)?;
        let ms = millis(statement_timeout).max(1);
        let notices = Notices::default();
        Ok(PgStore {
            s: Session::new(Pg {
                hosts: p.hosts,
                attrs: p.attrs,
                connect_timeout: p.connect_timeout,
                timeouts: format!(
                    "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}; "
                ),
                shown: p.shown,
            }),
            cols: Columns::WithTimeline,
            require_sync: p.require_sync,
            sync_checked: None,
            dispatch: tracing::Dispatch::new(NoticeSink(notices.clone())),
            notices,
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
    /// missing instead. A table made by an older release (no `timeline`
    /// column, SQLSTATE 42703) gets the statement `build` makes for it, in
    /// the same call, and every later call too.
    async fn run(
        &mut self,
        timeout: Duration,
        what: &str,
        create: bool,
        build: impl Fn(Columns) -> Result<String, sqlx::Error>,
    ) -> Result<Ran, StoreError> {
        let stmt = |cols| build(cols).map(|s| format!("{UNLISTEN_SQL}{}{s}", self.s.d.timeouts));
        let (q, legacy) = match (stmt(self.cols), self.cols) {
            (Ok(q), Columns::WithTimeline) => (q, stmt(Columns::Legacy).ok()),
            (Ok(q), Columns::Legacy) => (q, None),
            (Err(e), _) => return Err(self.s.error(what, &e)),
        };
        let create = create.then(|| format!("{}{TABLE_SQL}", self.s.d.timeouts));
        let _ = self.notices.take();
        let out = self
            .s
            .call(timeout, what, move |c| {
                Box::pin(async move {
                    let first = match sqlx::Executor::fetch_all(&mut *c, sqlx::raw_sql(&q)).await {
                        Err(e) if is_code(&e, UNDEFINED_COLUMN) && legacy.is_some() => {
                            let legacy = legacy.as_deref().unwrap_or_default();
                            return sqlx::Executor::fetch_all(&mut *c, sqlx::raw_sql(legacy))
                                .await
                                .map(|rows| Ok((rows, true)));
                        }
                        Err(e) if is_code(&e, UNDEFINED_TABLE) => e,
                        done => return done.map(|rows| Ok((rows, false))),
                    };
                    drop(first);
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
                        done => done.map(|rows| Ok((rows, false))),
                    }
                })
            })
            .with_subscriber(self.dispatch.clone())
            .await;
        let warnings = self.notices.take();
        // A call that failed after a warning: the warning may be why (a
        // commit's wait for a standby cut short by a terminated backend
        // warns, then closes the connection), and says the commit may stand.
        let out = out.map_err(|e| {
            if warnings.is_empty() {
                return e;
            }
            let said = format!("{e} (the server had warned: {})", warnings.join("; "));
            match e {
                StoreError::Unavailable(_) => StoreError::Unavailable(said),
                StoreError::Fatal(_) => StoreError::Fatal(said),
            }
        });
        let (rows, legacy_used) = out?.map_err(|missing| {
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
        })?;
        if legacy_used {
            self.cols = Columns::Legacy;
            // An older release's table is not a fault of this run: one line
            // for whoever looks (-v), none in a cron mail.
            tracing::info!(
                event = "store_schema",
                "table leader_lease has no column timeline (made by an older release): a lease \
                 written on another timeline is not adopted after a failover; \
                 `leaderrun init` adds the column"
            );
        }
        Ok(Ran { rows, warnings })
    }

    /// Why a write that the server reported as committed may still be on no
    /// standby, or `None` when nothing says so:
    ///
    /// * the server sent a WARNING during the call. Postgres does that, and
    ///   then reports success, when a commit's wait for a synchronous
    ///   standby ends early (`pg_cancel_backend`, `statement_timeout`: "the
    ///   transaction has already committed locally, but might not have been
    ///   replicated"). What is relied on is the notice's severity, which
    ///   arrives unlocalized, not its text (shown only to people); any other
    ///   warning during a lease write fails it too, which is only ever
    ///   cautious.
    /// * the session's commits waited for a standby (`sync`, read in the
    ///   write itself) but no longer do now. Emptying
    ///   `synchronous_standby_names` releases every waiting commit with no
    ///   word at all; the session re-reads the setting before its next
    ///   command, which is this check. (Behind a transaction pooler the
    ///   check may run on another server connection that has not re-read
    ///   its configuration yet: docs/stores.md.)
    async fn not_durable(
        &mut self,
        warnings: &[String],
        sync: bool,
        timeout: Duration,
    ) -> Option<String> {
        if !warnings.is_empty() {
            return Some(format!(
                "the server warned that its commit may not be durable ({})",
                warnings.join("; ")
            ));
        }
        if !sync {
            return None;
        }
        let q = format!("SELECT {SYNC_COLUMNS}");
        match self
            .run(timeout, "cannot read", false, |_| Ok(q.clone()))
            .await
        {
            Ok(ran) => match ran.rows.first().map(sync_of) {
                Some(Ok(true)) => None,
                Some(Ok(false)) => Some(
                    "synchronous replication was switched off while the commit waited for a \
                     standby, so the commit may be on no standby"
                        .into(),
                ),
                _ => {
                    Some("it could not be read back whether the commit waited for a standby".into())
                }
            },
            Err(e) => Some(format!(
                "it could not be checked that the commit reached a standby ({e})"
            )),
        }
    }

    /// `require=sync`: refuse to lead unless synchronous replication is
    /// active; a pass is trusted for [`SYNC_CHECK_TTL`].
    async fn check_sync(&mut self, timeout: Duration) -> Result<(), StoreError> {
        if self
            .sync_checked
            .is_some_and(|t| t.elapsed() < SYNC_CHECK_TTL)
        {
            return Ok(());
        }
        let state = self.replication_state(timeout).await?;
        match state.missing() {
            None => {
                self.sync_checked = Some(Instant::now());
                Ok(())
            }
            Some((why, heals)) => {
                self.sync_checked = None;
                let msg = format!(
                    "the store {} does not replicate synchronously (require=sync): {why}",
                    self.s.d.shown()
                );
                Err(if heals {
                    StoreError::Unavailable(msg)
                } else {
                    StoreError::Fatal(msg)
                })
            }
        }
    }

    async fn replication_state(&mut self, timeout: Duration) -> Result<ReplState, StoreError> {
        let ran = self
            .run(timeout, "cannot read", false, |_| {
                Ok(REPLICATION_SQL.to_string())
            })
            .await?;
        ran.rows
            .first()
            .map(ReplState::from_row)
            .transpose()
            .map_err(|e| self.s.error("cannot read", &e))?
            .ok_or_else(|| {
                StoreError::Unavailable(format!(
                    "the store {} said nothing about its replication",
                    self.s.d.shown()
                ))
            })
    }

    /// Renew and release: whether the UPDATE matched the lease; a match whose
    /// commit may not be durable is an error (the deadline is not extended).
    async fn update(
        &mut self,
        what: &str,
        timeout: Duration,
        build: impl Fn(Columns) -> Result<String, sqlx::Error>,
    ) -> Result<bool, StoreError> {
        let ran = self.run(timeout, what, false, build).await?;
        let Some(row) = ran.rows.first() else {
            return Ok(false);
        };
        let sync = sync_of_at(row, 1).map_err(|e| self.s.error(what, &e))?;
        if let Some(why) = self.not_durable(&ran.warnings, sync, timeout).await {
            return Err(StoreError::Unavailable(format!(
                "{what} the store {}: {why}",
                self.s.d.shown()
            )));
        }
        if self.require_sync && !sync {
            return Err(StoreError::Unavailable(format!(
                "{what} the store {}: the commit did not wait for a synchronous standby \
                 (require=sync)",
                self.s.d.shown()
            )));
        }
        Ok(true)
    }
}

/// Whether the row's `synchronous_commit`, `synchronous_standby_names`
/// (from `at`) make commits wait for a standby.
fn sync_of_at(r: &PgRow, at: usize) -> Result<bool, sqlx::Error> {
    let commit: String = r.try_get(at)?;
    let names: String = r.try_get(at + 1)?;
    Ok(waits_for_standby(&commit, &names))
}

fn sync_of(r: &PgRow) -> Result<bool, sqlx::Error> {
    sync_of_at(r, 0)
}

const UNDEFINED_TABLE: &str = "42P01";
const UNDEFINED_COLUMN: &str = "42703";

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

impl Pg {
    /// A connection to `h` that `want` accepts, or why not (and whether
    /// that may heal).
    async fn try_host(&self, h: &Host, want: Attrs) -> Result<PgConnection, (String, bool)> {
        let connect = PgConnection::connect_with(&h.opts);
        let conn = match self.connect_timeout {
            Some(t) => match tokio::time::timeout(t, connect).await {
                Ok(r) => r,
                Err(_) => {
                    return Err((
                        format!(
                            "no connection within connect_timeout ({})",
                            humantime::format_duration(t)
                        ),
                        true,
                    ))
                }
            },
            None => connect.await,
        };
        // A TLS refusal or an unreadable TLS file will not heal on any host.
        let mut conn =
            conn.map_err(|e| (sql::message(&e), sql::connect_failed(self, &e).may_heal()))?;
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

    fn heals(e: &sqlx::Error) -> bool {
        matches!(sql::classify::<Pg>("", e), StoreError::Unavailable(_))
    }
}

impl Dialect for Pg {
    type Conn = PgConnection;

    const TLS_FILES: &'static [&'static str] = &[
        "sslrootcert",
        "ssl-root-cert",
        "ssl-ca",
        "sslcert",
        "ssl-cert",
        "sslkey",
        "ssl-key",
    ];

    fn shown(&self) -> String {
        self.shown.clone()
    }

    /// Each host in order, as libpq does: the first that answers and
    /// matches `target_session_attrs` (with `prefer-standby`, a standby
    /// first, then any). One host keeps the driver's own error.
    async fn connect(&mut self) -> Result<PgConnection, StoreError> {
        let context = format!("cannot connect to the store {}", self.shown);
        if self.hosts.len() == 1 && self.attrs == Attrs::Any && self.connect_timeout.is_none() {
            return PgConnection::connect_with(&self.hosts[0].opts)
                .await
                .map_err(|e| sql::connect_failed(self, &e));
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
        Err(if heals {
            StoreError::Unavailable(msg)
        } else {
            StoreError::Fatal(msg)
        })
    }

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

/// Push wake-ups over several hosts: LISTEN on one; when that fails (a host
/// down, or a standby, which refuses LISTEN), the next `arm` tries the next
/// host, round the list. Until then the contender polls, as with any broken
/// subscription.
struct HostsWakeups {
    hosts: Vec<PgConnectOptions>,
    at: usize,
    inner: PgWakeups,
}

impl Wakeups for HostsWakeups {
    fn arm<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            let r = self.inner.arm(name).await;
            if r.is_err() && self.hosts.len() > 1 {
                self.at = (self.at + 1) % self.hosts.len();
                self.inner = PgWakeups::new(self.hosts[self.at].clone());
            }
            r
        })
    }

    fn wake<'a>(&'a mut self, name: &'a str) -> Fut<'a, ()> {
        self.inner.wake(name)
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
        const WHAT: &str = "cannot acquire in";
        if self.require_sync {
            self.check_sync(timeout).await?;
        }
        let ms = millis(lease);
        let ran = self
            .run(timeout, WHAT, true, |cols| {
                acquire_sql(name, holder, ms, cols)
            })
            .await?;
        let tag = |r: &PgRow| r.try_get::<String, _>(0).unwrap_or_default();
        if let Some(r) = ran.rows.iter().find(|r| tag(r) == "adopted") {
            tracing::info!(
                event = "adopted",
                "the lease was written on another timeline (a failover of the store): \
                 held at least one lease from now by this server's clock, epoch {}",
                r.try_get::<i64, _>(1).unwrap_or_default()
            );
        }
        let Some(row) = ran.rows.iter().find(|r| tag(r) == "taken") else {
            return Ok(None);
        };
        let (epoch, sync) = row
            .try_get::<i64, _>(1)
            .and_then(|e| Ok((e, sync_of_at(row, 2)?)))
            .map_err(|e| self.s.error(WHAT, &e))?;
        let why = match self.not_durable(&ran.warnings, sync, timeout).await {
            Some(why) => why,
            None if self.require_sync && !sync => {
                "the commit did not wait for a synchronous standby (require=sync)".into()
            }
            None => return Ok(Some(epoch)),
        };
        // Not a lease to run on: handed back at once, at that epoch only,
        // so no one waits out L for it (a failure to hand back leaves it to
        // expire, which is only slower).
        let handed = self
            .run(timeout, "cannot release in", false, |cols| {
                release_sql(name, holder, epoch, 0, cols)
            })
            .await
            .is_ok_and(|r| r.rows.len() == 1);
        self.sync_checked = None;
        Err(StoreError::Unavailable(format!(
            "the store {} granted the lease at epoch {epoch}, but {why}; {}",
            self.s.d.shown(),
            if handed {
                "handed it back"
            } else {
                "it could not be handed back and expires by itself"
            }
        )))
    }

    async fn renew(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let ms = millis(lease);
        self.update("cannot renew in", timeout, |cols| {
            renew_sql(name, holder, epoch, ms, cols)
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
        let ms = millis(keep);
        self.update("cannot release in", timeout, |cols| {
            release_sql(name, holder, epoch, ms, cols)
        })
        .await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let ran = self
            .run(timeout, "cannot read", false, |_| inspect_sql(name))
            .await?;
        ran.rows
            .first()
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
        let hosts: Vec<PgConnectOptions> = self.s.d.hosts.iter().map(|h| h.opts.clone()).collect();
        let first = hosts.first()?.clone();
        Some(Box::new(HostsWakeups {
            hosts,
            at: 0,
            inner: PgWakeups::new(first),
        }))
    }

    fn schema(&self) -> Option<Schema> {
        Some(SCHEMA)
    }

    /// Look first and create only when missing, so that `init` on a
    /// read-only server whose table exists succeeds; then make sure the
    /// login may do what a run does, so that "ready" means a run works. A table made by an
    /// older release gets the `timeline` column where this role may add it
    /// ([`UPGRADE_SQL`]); where it may not, the table still works as it did.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.s.reset();
        let rows = self
            .run(timeout, "cannot use", false, |_| Ok(EXISTS_SQL.to_string()))
            .await?
            .rows;
        let there = rows
            .first()
            .and_then(|r| sqlx::Row::try_get::<i64, _>(r, 0).ok())
            .unwrap_or(0)
            != 0;
        if !there {
            self.run(timeout, "cannot use", false, |_| Ok(TABLE_SQL.to_string()))
                .await
                .map_err(sql::cannot_create)?;
        }
        self.upgrade(timeout).await;
        // "Ready" only when a run would work: the login may do all it does.
        let missing: Vec<String> = self
            .run(timeout, "cannot check privileges in", false, |_| {
                Ok(PRIVILEGES_SQL.to_string())
            })
            .await?
            .rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>(0).ok())
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

    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        Ok(self.replication_state(timeout).await?.replication())
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let ran = self
            .run(timeout, "cannot read", false, |_| Ok(LIST_SQL.to_string()))
            .await?;
        ran.rows
            .iter()
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
        let ran = self
            .run(timeout, "cannot release in", false, |_| {
                clear_sql(name, epoch)
            })
            .await?;
        ran.rows
            .first()
            .map(lease_info)
            .transpose()
            .map_err(|e| self.s.error("cannot release in", &e))
    }
}

impl PgStore {
    /// Add the `timeline` column to a table made by an older release, when
    /// it is missing and this role may (the table's owner); otherwise say
    /// so once and leave the table as it is: it keeps working.
    pub async fn upgrade(&mut self, timeout: Duration) {
        let has = self
            .run(timeout, "cannot read", false, |_| {
                Ok(HAS_TIMELINE_SQL.to_string())
            })
            .await
            .ok()
            .and_then(|r| r.rows.first().and_then(|r| r.try_get::<i64, _>(0).ok()));
        if has != Some(0) {
            return;
        }
        match self
            .run(timeout, "cannot upgrade the table in", false, |_| {
                Ok(UPGRADE_SQL.to_string())
            })
            .await
        {
            Ok(_) => {
                self.cols = Columns::WithTimeline;
                tracing::info!(
                    event = "store_schema",
                    "added column timeline to leader_lease"
                );
            }
            Err(e) => tracing::warn!(
                event = "store_schema",
                "{e} (the table works without it, but a lease written on another timeline is \
                 not adopted after a failover: run `{UPGRADE_SQL}` as the table's owner)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiters LISTEN on the channel the statements that free a lease notify.
    #[test]
    fn release_and_clear_notify_the_channel_waiters_listen_on() {
        let notify = format!("pg_notify('{}', name)", super::super::push::PG_CHANNEL);
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

    fn parsed(raw: &str) -> Result<Parsed, String> {
        let u = url::Url::parse(&fold_hosts(raw)).map_err(|e| e.to_string())?;
        parse_url(&u, "t")
    }

    #[test]
    fn host_lists_are_tried_in_order_and_shown_without_the_password() {
        let p = parsed(
            "postgres://u:s3cr%2Ct@h1:5433,h2,[::1]:5435/db?target_session_attrs=read-write\
             &connect_timeout=1&sslmode=disable",
        )
        .unwrap();
        let hosts: Vec<&str> = p.hosts.iter().map(|h| h.shown.as_str()).collect();
        assert_eq!(hosts, ["h1:5433", "h2:5432", "[::1]:5435"]);
        assert_eq!(p.attrs, Attrs::ReadWrite);
        assert_eq!(
            p.connect_timeout,
            Some(Duration::from_secs(2)),
            "libpq: 1 means 2"
        );
        assert_eq!(
            p.shown,
            "postgres://u:***@h1:5433,h2:5432,[::1]:5435/db?target_session_attrs=read-write\
             &connect_timeout=1&sslmode=disable"
        );
        assert!(!p.shown.contains("s3cr"));
    }

    #[test]
    fn libpq_parameters_are_accepted_or_refused_by_name() {
        for ok in [
            "postgres://u@h/db?application_name=app&keepalives=1&keepalives_idle=30\
             &keepalives_interval=5&keepalives_count=3&channel_binding=prefer\
             &fallback_application_name=x&connect_timeout=0",
            "postgres://u@h/db?target_session_attrs=prefer-standby",
            "postgres://u@h/db?require=sync",
        ] {
            assert!(parsed(ok).is_ok(), "{ok}");
        }
        for (bad, want) in [
            (
                "postgres://u@h/db?target_session_attrs=Hunter2x",
                "target_session_attrs",
            ),
            (
                "postgres://u@h/db?channel_binding=require",
                "channel binding",
            ),
            (
                "postgres://u@h/db?require=Hunter2x",
                "require= that is not sync",
            ),
            (
                "postgres://u@h/db?connect_timeout=Hunter2x",
                "connect_timeout",
            ),
            (
                "postgres://u@h/db?gssencmode=Hunter2x",
                "unknown parameter gssencmode",
            ),
            ("postgres://u@h1,h2:x/db", "invalid port"),
        ] {
            let e = parsed(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} was accepted"));
            assert!(e.contains(want), "{bad}: {e}");
            assert!(!e.contains("Hunter2x"), "{bad}: value echoed: {e}");
        }
    }

    #[test]
    fn only_a_commit_that_waits_for_a_standby_counts_as_synchronous() {
        assert!(waits_for_standby("on", "s1"));
        assert!(waits_for_standby("remote_apply", "ANY 1 (a, b)"));
        assert!(!waits_for_standby("local", "s1"));
        assert!(!waits_for_standby("off", "s1"));
        assert!(!waits_for_standby("on", " "));
    }
}
