//! The statements, each with its bound parameters in order.

use crate::store::Schema;

/// The same shape as the Postgres table. Names and holders compare byte for
/// byte (`utf8mb4_bin`): the default collations are case-insensitive, which
/// would make `Sweep` and `sweep` one lease here and two on Postgres.
/// The run record's columns (`--once-per`) come last: an earlier release
/// made the table without them, and [`UPGRADE_SQL`] adds them there.
macro_rules! table_sql {
    () => {
        "CREATE TABLE IF NOT EXISTS leader_lease (
    name       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    holder     VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', -- UTC
    run_started_at DATETIME(6) NULL, -- UTC
    run_ended_at   DATETIME(6) NULL, -- UTC
    run_holder     VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    run_epoch      BIGINT NULL,
    run_outcome    VARCHAR(64) CHARACTER SET utf8mb4 NULL,
    advertised       VARCHAR(256) CHARACTER SET utf8mb4 NULL,
    advertised_epoch BIGINT NULL,
    kept_epoch       BIGINT NULL,
    slots            BIGINT NULL
) ENGINE = InnoDB"
    };
}

/// Adds the lease's values (`--advertise`, `--slots`' N, and the mark of a
/// `--min-hold` keep: see `sql::lease_info`) to a table made by an earlier
/// release, as [`UPGRADE_SQL`] adds the run record's. A table made by a
/// development build may have some of them: [`values_upgrade`] adds only
/// those missing (MySQL has no `ADD COLUMN IF NOT EXISTS`). A login
/// without ALTER keeps working for every run but an `--advertise` or
/// `--slots` one, which names the statement.
macro_rules! values_upgrade_sql {
    () => {
        "ALTER TABLE leader_lease \
ADD COLUMN advertised VARCHAR(256) CHARACTER SET utf8mb4 NULL, \
ADD COLUMN advertised_epoch BIGINT NULL, \
ADD COLUMN kept_epoch BIGINT NULL, \
ADD COLUMN slots BIGINT NULL"
    };
}
pub const VALUES_UPGRADE_SQL: &str = values_upgrade_sql!();

/// The columns [`VALUES_UPGRADE_SQL`] adds, with their definitions.
pub(super) const VALUE_COLUMNS: [(&str, &str); 4] = [
    ("advertised", "VARCHAR(256) CHARACTER SET utf8mb4 NULL"),
    ("advertised_epoch", "BIGINT NULL"),
    ("kept_epoch", "BIGINT NULL"),
    ("slots", "BIGINT NULL"),
];

/// Which of [`VALUE_COLUMNS`] the table has.
pub(super) const HAS_VALUE_COLUMNS_SQL: &str = "SELECT column_name FROM information_schema.columns
      WHERE table_schema = DATABASE() AND table_name = 'leader_lease'
        AND column_name IN ('advertised', 'advertised_epoch', 'kept_epoch', 'slots')";

/// The statement that adds the value columns `has` lacks, or `None`.
pub(super) fn values_upgrade(has: &[String]) -> Option<String> {
    let missing: Vec<String> = VALUE_COLUMNS
        .iter()
        .filter(|(c, _)| !has.iter().any(|h| h.eq_ignore_ascii_case(c)))
        .map(|(c, def)| format!("ADD COLUMN {c} {def}"))
        .collect();
    (!missing.is_empty()).then(|| format!("ALTER TABLE leader_lease {}", missing.join(", ")))
}

/// Adds the run record's columns to a table made by an earlier release, in
/// one statement. MySQL has no `ADD COLUMN IF NOT EXISTS` (MariaDB has), so
/// it is sent only when [`HAS_COLUMNS_SQL`] counts fewer than
/// [`UPGRADE_COLUMNS`]. Needs ALTER on the table; a login with only SELECT,
/// INSERT, UPDATE keeps working without it for every run but a
/// `--once-per` one, which names this statement.
macro_rules! upgrade_sql {
    () => {
        "ALTER TABLE leader_lease \
ADD COLUMN run_started_at DATETIME(6) NULL, \
ADD COLUMN run_ended_at DATETIME(6) NULL, \
ADD COLUMN run_holder VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, \
ADD COLUMN run_epoch BIGINT NULL, \
ADD COLUMN run_outcome VARCHAR(64) CHARACTER SET utf8mb4 NULL"
    };
}

pub const TABLE_SQL: &str = table_sql!();
pub const UPGRADE_SQL: &str = upgrade_sql!();

/// `init --print`: the table, after (as a comment, since MySQL cannot make
/// it idempotent, and printed first so that the output stays one statement
/// for a client that splits at `;`) the upgrade of a table an earlier
/// release made.
pub const SCHEMA: Schema = Schema {
    dialect: "MySQL/MariaDB",
    sql: concat!(
        "-- a table made by an earlier release lacks the run record's columns (--once-per)\n\
         -- or the lease's values (--advertise, --slots). Add what it lacks with (as a login with\n\
         -- ALTER on it, once each):\n-- ",
        upgrade_sql!(),
        "\n-- ",
        values_upgrade_sql!(),
        "\n",
        table_sql!()
    ),
};

/// How many of the columns [`UPGRADE_SQL`] adds the table has.
pub(super) const HAS_COLUMNS_SQL: &str = "SELECT COUNT(*) FROM information_schema.columns
      WHERE table_schema = DATABASE() AND table_name = 'leader_lease'
        AND column_name IN ('run_started_at', 'run_ended_at', 'run_holder', 'run_epoch',
                            'run_outcome')";
pub(super) const UPGRADE_COLUMNS: i64 = 5;

/// ER_BAD_FIELD_ERROR: a statement naming a column the table lacks (one
/// made by an earlier release, met by a `--once-per` statement).
pub(super) const UNKNOWN_COLUMN: u16 = 1054;

pub(super) const EXISTS_SQL: &str = "SELECT COUNT(*) FROM information_schema.tables
      WHERE table_schema = DATABASE() AND table_name = 'leader_lease'";

/// What a run does to the table, one statement per privilege, none of which
/// reads or changes a row; `init` sends each and lists those refused (1142,
/// 1143). Trying is the only check that counts roles, wildcards and partial
/// revokes the way the server does. The UPDATE assigns a constant: reading
/// a column would need SELECT too, and blame the wrong privilege.
pub(super) const PRIVILEGE_PROBES: &[(&str, &str)] = &[
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

pub(super) const ENSURE_ROW_SQL: &str =
    "INSERT INTO leader_lease (name) VALUES (?) ON DUPLICATE KEY UPDATE name = name";

// ? holder, ? lease µs, ? name
pub(super) const TAKE_SQL: &str = "UPDATE leader_lease
        SET epoch = epoch + 1, holder = ?,
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND (holder IS NULL OR expires_at <= UTC_TIMESTAMP(6))";

pub(super) const EPOCH_SQL: &str = "SELECT epoch FROM leader_lease WHERE name = ?";

// `--once-per` (docs/stores.md, "Once per period"). In the acquiring
// transaction, after ENSURE_ROW_SQL took the row's exclusive lock, the
// record as the rule reads it (a locking read, so the latest committed
// row, as the UPDATE below sees it): whether its start and its outcome are
// ones this release writes (a start at most FUTURE_LIMIT ahead of the
// server's clock; an outcome of `crate::store::known_outcome`'s, compared
// under the binary collation, since the column's ignores case: not as
// BINARY, which MySQL 8 will not match against a text pattern), the
// outcome, the milliseconds since the start, and whether a run of this
// name started less than `half` ago. A run handed back `not started` does not count;
// with `--retry-failed` neither does one that did not end `exit 0` (a
// failed outcome, or none: then either it still holds the lease, and the
// UPDATE below finds it held, or it never ended). No row: no record.
// ? future µs, ? not started, ? half µs, ? not started, ? retry (0/1),
// ? exit 0, ? name
pub(super) const DONE_SQL: &str = "SELECT
        run_started_at <= UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
        run_outcome IS NULL OR run_outcome COLLATE utf8mb4_bin IN ('lost', 'killed', ?)
          OR run_outcome COLLATE utf8mb4_bin REGEXP '^(exit|signal) [0-9]{1,10}$',
        run_outcome,
        CAST(GREATEST(0, LEAST(
             TIMESTAMPDIFF(MICROSECOND, run_started_at, UTC_TIMESTAMP(6)) DIV 1000,
             315360000000)) AS SIGNED),
        run_started_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
          AND NOT (run_outcome <=> ?) AND NOT (? AND NOT (run_outcome <=> ?))
       FROM leader_lease
      WHERE name = ? AND run_started_at IS NOT NULL
      FOR UPDATE";

// TAKE_SQL's takeover that also claims the period and writes the run
// record's start (holder, epoch; no end, no outcome). The period condition
// is DONE_SQL's complement, repeated so that this statement alone never
// takes a period that is done; under the row lock nothing changed it in
// between, and a later `UTC_TIMESTAMP(6)` only makes a start older.
// `run_epoch` is assigned before `epoch`: MySQL assigns left to right, each
// seeing the ones before, while MariaDB under SIMULTANEOUS_ASSIGNMENT sees
// the old row; `epoch + 1` first is the new epoch under both.
// ? holder, ? lease µs, ? holder, ? name, ? half µs, ? not started,
// ? retry (0/1), ? exit 0
pub(super) const TAKE_ONCE_SQL: &str = "UPDATE leader_lease
        SET run_epoch = epoch + 1, epoch = epoch + 1, holder = ?,
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
            run_started_at = UTC_TIMESTAMP(6), run_ended_at = NULL, run_holder = ?,
            run_outcome = NULL
      WHERE name = ? AND (holder IS NULL OR expires_at <= UTC_TIMESTAMP(6))
        AND (run_started_at IS NULL
             OR run_started_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
             OR run_outcome <=> ?
             OR (? AND NOT (run_outcome <=> ?)))";

// ? lease µs, ? name, ? holder, ? epoch
pub(super) const RENEW_SQL: &str = "UPDATE leader_lease
        SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > UTC_TIMESTAMP(6)";

// ? keep µs, ? keep µs, ? name, ? holder, ? epoch. With keep > 0 the holder
// stays and the lease runs `keep` more (`--min-hold`); the epoch is untouched.
pub(super) const RELEASE_SQL: &str = "UPDATE leader_lease
        SET holder = IF(? > 0, holder, NULL),
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND holder = ? AND epoch = ?";

/// The lease's values as a release leaves them (before the release's own
/// assignments, while `holder` is still the old one): kept (`--min-hold`,
/// keep > 0) the tenure is marked ended and keeps its value, which goes
/// with the lease; freed, the value goes at once. ? keep µs, four times.
macro_rules! released_values {
    () => {
        "kept_epoch = IF(? > 0, epoch, NULL),
            advertised = IF(? > 0, advertised, NULL),
            slots = IF(? > 0, slots, NULL),
            advertised_epoch = IF(? > 0, advertised_epoch, NULL),
            "
    };
}

// RELEASE_SQL with the lease's values, for a run that has any to write (a
// keep, an advertised value, or N). ? keep µs ×4, then as RELEASE_SQL.
pub(super) const RELEASE_VALUES_SQL: &str = concat!(
    "UPDATE leader_lease
        SET ",
    released_values!(),
    "holder = IF(? > 0, holder, NULL),
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND holder = ? AND epoch = ?"
);

// After a take, in its transaction: the new tenure's `--advertise` value
// and `--slots` N (each NULL when not given). ? value, ? N, ? name
pub(super) const TAKEN_VALUES_SQL: &str = "UPDATE leader_lease
        SET advertised = ?, slots = ?, advertised_epoch = epoch, kept_epoch = NULL
      WHERE name = ?";

// RELEASE_SQL that also writes the run record's end and outcome, where the
// record is this holder's at this epoch (compared with the row's own
// `holder` and `epoch`, which the WHERE pins to ours). The record's columns
// are assigned first, while `holder` is still the old one.
// ? outcome, ? keep µs, ? keep µs, ? name, ? holder, ? epoch
pub(super) const RELEASE_ENDING_SQL: &str = "UPDATE leader_lease
        SET run_outcome = IF(run_holder <=> holder AND run_epoch <=> epoch, ?, run_outcome),
            run_ended_at = IF(run_holder <=> holder AND run_epoch <=> epoch,
                              UTC_TIMESTAMP(6), run_ended_at),
            holder = IF(? > 0, holder, NULL),
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND holder = ? AND epoch = ?";

// RELEASE_ENDING_SQL with the lease's values. ? keep µs ×4, then as
// RELEASE_ENDING_SQL.
pub(super) const RELEASE_ENDING_VALUES_SQL: &str = concat!(
    "UPDATE leader_lease
        SET ",
    released_values!(),
    "run_outcome = IF(run_holder <=> holder AND run_epoch <=> epoch, ?, run_outcome),
            run_ended_at = IF(run_holder <=> holder AND run_epoch <=> epoch,
                              UTC_TIMESTAMP(6), run_ended_at),
            holder = IF(? > 0, holder, NULL),
            expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
      WHERE name = ? AND holder = ? AND epoch = ?"
);

/// A `DATETIME(6)` column as RFC 3339 in UTC, to the millisecond.
macro_rules! rfc3339 {
    ($c:literal) => {
        concat!(
            "CONCAT(DATE_FORMAT(",
            $c,
            ", '%Y-%m-%dT%H:%i:%s.'), LPAD(MICROSECOND(",
            $c,
            ") DIV 1000, 3, '0'), 'Z')"
        )
    };
}

/// Milliseconds since a `DATETIME(6)` column, clamped to ten years.
macro_rules! ago {
    ($c:literal) => {
        concat!(
            "CAST(GREATEST(LEAST(TIMESTAMPDIFF(MICROSECOND, ",
            $c,
            ", UTC_TIMESTAMP(6)) DIV 1000, 315360000000), -315360000000) AS SIGNED)"
        )
    };
}

/// The run records (`--once-per`), every name's or (with `? IS NULL` false)
/// one name's. ? name, ? name
pub(super) const RUN_RECORDS_SQL: &str = concat!(
    "SELECT CONVERT(name USING utf8mb4), CONVERT(run_holder USING utf8mb4), run_epoch,
            run_outcome, ",
    rfc3339!("run_started_at"),
    ", ",
    ago!("run_started_at"),
    ", ",
    rfc3339!("run_ended_at"),
    ", ",
    ago!("run_ended_at"),
    " FROM leader_lease WHERE run_started_at IS NOT NULL AND (? IS NULL OR name = ?)
      ORDER BY name"
);

/// What `LeaseInfo` is read from (see `sql::lease_info`: the table's own
/// columns follow, for the values a table may or may not have). Name and holder
/// are converted to a non-binary collation, which the driver decodes as
/// text (a `_bin` column reaches it flagged binary); the remaining time is
/// clamped to ±10 years, and a zero date (possible under a lax `sql_mode`)
/// reads as long expired rather than failing the listing.
macro_rules! columns {
    () => {
        "CONVERT(name USING utf8mb4), CONVERT(holder USING utf8mb4), epoch,
         CAST(COALESCE(GREATEST(LEAST(
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000,
             315360000000), -315360000000), -315360000000) AS SIGNED),
         leader_lease.*"
    };
}

pub(super) const INSPECT_SQL: &str =
    concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = ?");
pub(super) const LIST_SQL: &str =
    concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");
// ? name, ? epoch, ? epoch
pub(super) const CLEARABLE_SQL: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM leader_lease WHERE name = ? AND holder IS NOT NULL AND (? IS NULL OR epoch = ?)
      FOR UPDATE"
);
pub(super) const CLEAR_SQL: &str =
    "UPDATE leader_lease SET holder = NULL, expires_at = UTC_TIMESTAMP(6) WHERE name = ?";

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole statement for a table without any value column is the one
    /// `init --print` shows; a table with some gets only what it lacks.
    #[test]
    fn the_values_upgrade_adds_what_is_missing() {
        assert_eq!(values_upgrade(&[]).as_deref(), Some(VALUES_UPGRADE_SQL));
        let some: Vec<String> = ["advertised", "ADVERTISED_EPOCH", "kept_epoch"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            values_upgrade(&some).as_deref(),
            Some("ALTER TABLE leader_lease ADD COLUMN slots BIGINT NULL")
        );
        let all: Vec<String> = VALUE_COLUMNS.iter().map(|(c, _)| c.to_string()).collect();
        assert_eq!(values_upgrade(&all), None);
    }
}
