//! The statements, each with its bound parameters in order.

use crate::store::Schema;

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

pub(super) const EXISTS_SQL: &str = "SELECT COUNT(*) FROM information_schema.tables
      WHERE table_schema = DATABASE() AND table_name = 'leader_lease'";

/// Idempotent statements that bring a table made by an older leaderrun up
/// to date, run by `init` in order once the table exists, before the
/// privilege check; a login that may not alter the table skips them.
pub(super) const UPGRADE_SQL: &[&str] = &[];

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
