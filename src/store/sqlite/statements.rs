//! The embedded store's statements and its one table (in the store's file
//! and in every lease file alike). Why each is safe is said beside it;
//! mod.rs runs them inside `BEGIN IMMEDIATE` on the lease's own file.

use std::time::Duration;

use crate::store::Schema;

pub const TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT,
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0, -- CLOCK_BOOTTIME in ms, of boot `boot_id`
    boot_id    TEXT NOT NULL DEFAULT '',
    run_started_at   INTEGER, -- --once-per's last run: CLOCK_BOOTTIME in ms, of boot `run_boot_id`
    run_boot_id      TEXT,
    run_started_wall INTEGER, -- the wall clock at the start, Unix ms: shown, never compared
    run_ended_at     INTEGER, -- CLOCK_BOOTTIME in ms, of boot `run_boot_id`
    run_ended_wall   INTEGER,
    run_holder       TEXT,
    run_epoch        INTEGER,
    run_outcome      TEXT,
    advertised       TEXT,    -- --advertise, of the tenure at advertised_epoch
    advertised_epoch INTEGER,
    kept_epoch       INTEGER, -- the tenure whose run ended: only --min-hold keeps it
    slots            INTEGER  -- --slots N above 1, of the tenure at advertised_epoch
)";

/// The lease's values (`sql::lease_info`) and their types: a lease file
/// made before them gets them at its next acquire or release by this
/// release that writes one (values.rs), inside that write's transaction; an
/// older leaderrun's statements name none of them.
pub(super) const VALUE_COLUMNS: [(&str, &str); 4] = [
    ("advertised", "TEXT"),
    ("advertised_epoch", "INTEGER"),
    ("kept_epoch", "INTEGER"),
    ("slots", "INTEGER"),
];

// After a take, in the same transaction: this tenure's values (or none),
// and no end yet. ?1 name, ?2 the `--advertise` value or NULL, ?3 `--slots`
// N or NULL (a plain run).
pub(super) const TAKEN_VALUES_SQL: &str = "UPDATE leader_lease
        SET advertised = ?2, slots = ?3,
            advertised_epoch = CASE WHEN ?2 IS NULL AND ?3 IS NULL THEN NULL ELSE epoch END,
            kept_epoch = NULL
      WHERE name = ?1";

// After a release that matched, in the same transaction: with a keep
// (`--min-hold`) the tenure is marked ended and keeps its value, which goes
// with the lease; freed, the value goes at once. ?1 name, ?2 epoch, ?3 keep ms.
pub(super) const RELEASED_VALUES_SQL: &str = "UPDATE leader_lease
        SET kept_epoch = CASE WHEN ?3 > 0 THEN ?2 END,
            advertised = CASE WHEN ?3 > 0 THEN advertised END,
            slots = CASE WHEN ?3 > 0 THEN slots END,
            advertised_epoch = CASE WHEN ?3 > 0 THEN advertised_epoch END
      WHERE name = ?1 AND CAST(epoch AS INTEGER) = ?2";

/// The run record's columns (`--once-per`) and their types: a lease file
/// made before `--once-per` lacks them, and its first `--once-per` acquire
/// adds the missing ones (`add_run_columns`). Nothing else names them.
pub(super) const RUN_COLUMNS: [(&str, &str); 8] = [
    ("run_started_at", "INTEGER"),
    ("run_boot_id", "TEXT"),
    ("run_started_wall", "INTEGER"),
    ("run_ended_at", "INTEGER"),
    ("run_ended_wall", "INTEGER"),
    ("run_holder", "TEXT"),
    ("run_epoch", "INTEGER"),
    ("run_outcome", "TEXT"),
];

pub const SCHEMA: Schema = Schema {
    dialect: "SQLite (the embedded store; leaderrun creates it by itself)",
    sql: TABLE_SQL,
};

/// The holder of a row in the store's file whose lease moved to a file of
/// its own. An older leaderrun reads it as held (for ten years of uptime),
/// and its `status` shows why.
pub const MOVED: &str = "(moved to a file of its own by a newer leaderrun)";

/// How long SQLite waits for a lock by itself before the caller looks at
/// who holds it: a live writer holds it for well under a millisecond.
pub(super) const SLICE: Duration = Duration::from_millis(25);

/// Ten years in ms: how long a moved row stays held for an older leaderrun.
pub(super) const TEN_YEARS_MS: i64 = 315_360_000_000;

// SQLite stores whatever it is given in any column, so a row written by hand
// (or by an older leaderrun that did not clamp) may hold a REAL, a huge
// integer or text where a time should be. Every read and every condition
// goes through CAST (text becomes 0, a huge REAL the largest integer), and
// remaining times are clamped to ±MAX_MS, so such a row can neither fail a
// listing nor look live forever.

// ?1 name, ?2 holder, ?3 now (boot ms), ?4 lease ms, ?5 boot id
pub(super) const ACQUIRE_SQL: &str =
    "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id)
     VALUES (?1, ?2, 1, ?3 + ?4, ?5)
     ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder, epoch = CAST(leader_lease.epoch AS INTEGER) + 1,
            expires_at = excluded.expires_at, boot_id = excluded.boot_id
      WHERE leader_lease.holder IS NULL OR leader_lease.boot_id <> excluded.boot_id
         OR CAST(leader_lease.expires_at AS INTEGER) <= ?3
     RETURNING epoch";

/// Whether the record's start is one this release wrote: none, or an
/// integer of the boot clock not more than ?11 ms ahead of it (a record of
/// another boot cannot be ahead of anything). SQLite keeps whatever it is
/// given, so a hand edit or a newer release may have left text or a REAL.
macro_rules! start_readable {
    () => {
        "(leader_lease.run_started_at IS NULL
          OR (typeof(leader_lease.run_started_at) = 'integer'
              AND (leader_lease.run_boot_id IS NOT ?5 OR leader_lease.run_started_at <= ?3 + ?11)))"
    };
}

/// Whether the record's outcome is one this release writes (as
/// `crate::store::known_outcome` says): none, `lost`, `killed`, `not
/// started`, or `exit`/`signal` and one to ten digits.
macro_rules! outcome_readable {
    () => {
        "(leader_lease.run_outcome IS NULL
          OR (typeof(leader_lease.run_outcome) = 'text'
              AND (leader_lease.run_outcome IN ('lost', 'killed', ?8)
                   OR (leader_lease.run_outcome GLOB 'exit [0-9]*'
                       AND length(leader_lease.run_outcome) <= 15
                       AND substr(leader_lease.run_outcome, 6) NOT GLOB '*[^0-9]*')
                   OR (leader_lease.run_outcome GLOB 'signal [0-9]*'
                       AND length(leader_lease.run_outcome) <= 17
                       AND substr(leader_lease.run_outcome, 8) NOT GLOB '*[^0-9]*'))))"
    };
}

// `--once-per` (docs/stores.md, "Once per period"): the acquire above,
// whose takeover also requires that no run of this name started less than
// `half` ago by the boot clock of this boot, and which writes the run
// record's start in the same statement, inside the same `BEGIN IMMEDIATE`,
// so of racers one takes the period and the others see its start. A record
// from another boot counts as started long ago: boot-clock values of
// another boot mean nothing, and a reboot opens the period (the docs say
// why). A run handed back `not started` does not count. With
// `--retry-failed` (?9 = 1) neither does one that did not end `exit 0`:
// its outcome says it failed, or it has none while the lease is free or
// expired (the lease condition), so it never ended. The epoch and the
// record's epoch are the same expression on the old row. A record this
// release cannot read (`readable!`) is never taken over: the statement
// after it says why, and the run refuses.
//
// ?1 name, ?2 holder, ?3 now (boot ms), ?4 lease ms, ?5 boot id, ?6 half
// ms, ?7 wall clock (Unix ms, shown only), ?8 `not started`, ?9 retry
// failed (0 or 1), ?10 `exit 0`, ?11 how far ahead a start may be (ms)
pub(super) const ACQUIRE_ONCE_SQL: &str = concat!(
    "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id,
         run_started_at, run_boot_id, run_started_wall, run_ended_at, run_ended_wall,
         run_holder, run_epoch, run_outcome)
     VALUES (?1, ?2, 1, ?3 + ?4, ?5, ?3, ?5, ?7, NULL, NULL, ?2, 1, NULL)
     ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder, epoch = CAST(leader_lease.epoch AS INTEGER) + 1,
            expires_at = excluded.expires_at, boot_id = excluded.boot_id,
            run_started_at = ?3, run_boot_id = ?5, run_started_wall = ?7,
            run_ended_at = NULL, run_ended_wall = NULL, run_holder = excluded.holder,
            run_epoch = CAST(leader_lease.epoch AS INTEGER) + 1, run_outcome = NULL
      WHERE (leader_lease.holder IS NULL OR leader_lease.boot_id <> excluded.boot_id
             OR CAST(leader_lease.expires_at AS INTEGER) <= ?3)
        AND ",
    start_readable!(),
    " AND ",
    outcome_readable!(),
    "
        AND (leader_lease.run_started_at IS NULL OR leader_lease.run_boot_id IS NOT ?5
             OR CAST(leader_lease.run_started_at AS INTEGER) <= ?3 - ?6
             OR leader_lease.run_outcome IS ?8
             OR (?9 AND leader_lease.run_outcome IS NOT ?10))
     RETURNING epoch"
);

// When the acquire above took nothing, in the same transaction, with the
// same parameters: whether the record can be read (its start, its
// outcome, and the outcome as text, for the refusal), how long ago its
// run started (clamped to ten years) and whether that is why nothing was
// taken (the exact complement of the acquire's condition on the period,
// for a readable record). No row without a record: the lease is merely
// held. Parameters ?2, ?4 and ?7 are bound and unused.
pub(super) const DONE_SQL: &str = concat!(
    "SELECT ",
    start_readable!(),
    ", ",
    outcome_readable!(),
    ", CAST(leader_lease.run_outcome AS TEXT),
        max(0, ?3 - min(max(CAST(run_started_at AS INTEGER), ?3 - 315360000000),
                        ?3 + 315360000000)),
        (run_boot_id IS ?5 AND CAST(run_started_at AS INTEGER) > ?3 - ?6
         AND run_outcome IS NOT ?8 AND NOT (?9 AND run_outcome IS NOT ?10))
   FROM leader_lease
  WHERE name = ?1 AND run_started_at IS NOT NULL"
);

// ?1 name, ?2 holder, ?3 epoch, ?4 now, ?5 lease ms, ?6 boot id
pub(super) const RENEW_SQL: &str = "UPDATE leader_lease SET expires_at = ?4 + ?5
      WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND boot_id = ?6
        AND CAST(expires_at AS INTEGER) > ?4";

// ?1 name, ?2 holder, ?3 epoch, ?4 now, ?5 keep ms, ?6 boot id
pub(super) const RELEASE_SQL: &str = "UPDATE leader_lease
        SET holder = CASE WHEN ?5 > 0 THEN holder END, expires_at = ?4 + ?5
      WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND boot_id = ?6";

// The release with the run record's end and outcome (`--once-per`), where
// the record is this holder's at this epoch (it is: this grant's acquire
// wrote it, and no one else's can have since while the row names us).
//
// ?1 name, ?2 holder, ?3 epoch, ?4 now, ?5 keep ms, ?6 boot id, ?7 outcome,
// ?8 wall clock (Unix ms, shown only)
pub(super) const RELEASE_ENDING_SQL: &str = "UPDATE leader_lease
        SET holder = CASE WHEN ?5 > 0 THEN holder END, expires_at = ?4 + ?5,
            run_ended_at = CASE WHEN run_holder IS ?2 AND run_epoch IS ?3
                                THEN ?4 ELSE run_ended_at END,
            run_ended_wall = CASE WHEN run_holder IS ?2 AND run_epoch IS ?3
                                  THEN ?8 ELSE run_ended_wall END,
            run_outcome = CASE WHEN run_holder IS ?2 AND run_epoch IS ?3
                               THEN ?7 ELSE run_outcome END
      WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND boot_id = ?6";

/// The run records: times as RFC 3339 in UTC from the wall clock written
/// beside them (shown only), and as milliseconds ago by the boot clock
/// when the record is of this boot. A record of another boot has no
/// boot-clock age: it is shown by the wall clock, and at least the time
/// since this boot (which it is older than). Every time clamped to ten
/// years around now, as elsewhere; ?1 now (boot ms), ?2 boot id, ?3 the
/// wall clock (Unix ms), ?4 the name or NULL for every name.
pub(super) const RUN_RECORDS_SQL: &str = "SELECT CAST(name AS TEXT), CAST(run_holder AS TEXT),
        CAST(run_epoch AS INTEGER), CAST(run_outcome AS TEXT),
        strftime('%Y-%m-%dT%H:%M:%fZ', min(max(CAST(run_started_wall AS INTEGER),
                 ?3 - 315360000000), ?3 + 315360000000) / 1000.0, 'unixepoch'),
        CASE WHEN run_boot_id IS ?2
             THEN ?1 - min(max(CAST(run_started_at AS INTEGER), ?1 - 315360000000), ?1 + 315360000000)
             ELSE max(?1, ?3 - min(max(CAST(run_started_wall AS INTEGER), ?3 - 315360000000),
                                   ?3 + 315360000000)) END,
        CASE WHEN run_ended_at IS NULL THEN NULL
             ELSE strftime('%Y-%m-%dT%H:%M:%fZ', min(max(CAST(run_ended_wall AS INTEGER),
                           ?3 - 315360000000), ?3 + 315360000000) / 1000.0, 'unixepoch') END,
        CASE WHEN run_ended_at IS NULL THEN NULL
             WHEN run_boot_id IS ?2
             THEN ?1 - min(max(CAST(run_ended_at AS INTEGER), ?1 - 315360000000), ?1 + 315360000000)
             ELSE max(?1, ?3 - min(max(CAST(run_ended_wall AS INTEGER), ?3 - 315360000000),
                                   ?3 + 315360000000)) END
   FROM leader_lease WHERE run_started_at IS NOT NULL AND (?4 IS NULL OR name = ?4)
  ORDER BY name";

/// What `LeaseInfo` is read from (see `sql::lease_info`: the table's own
/// columns follow, for the values a file may or may not have yet); ?1 now,
/// ?2 boot id: a lease from another boot has expired.
macro_rules! columns {
    () => {
        "CAST(name AS TEXT), CAST(holder AS TEXT), CAST(epoch AS INTEGER),
         CASE WHEN boot_id = ?2
              THEN min(max(CAST(expires_at AS INTEGER), ?1 - 315360000000), ?1 + 315360000000) - ?1
              ELSE -1 END, *"
    };
}

// ?1 now, ?2 boot id, ?3 name, ?4 epoch or NULL
pub(super) const INSPECT_SQL: &str =
    concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = ?3");
pub(super) const LIST_SQL: &str =
    concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");
pub(super) const CLEARABLE_SQL: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM leader_lease WHERE name = ?3 AND holder IS NOT NULL AND holder IS NOT ?5
        AND (?4 IS NULL OR CAST(epoch AS INTEGER) = ?4)"
);
pub(super) const CLEAR_SQL: &str =
    "UPDATE leader_lease SET holder = NULL, expires_at = ?2 WHERE name = ?1";

// ?1 name: holder, epoch, expiry (boot ms) and boot id, as the lock rules
// and the move read them.
pub(super) const STATE_SQL: &str = "SELECT CAST(holder AS TEXT), CAST(epoch AS INTEGER),
        CAST(expires_at AS INTEGER), CAST(boot_id AS TEXT)
   FROM leader_lease WHERE name = ?1";

// ?1 name, ?2 moved marker, ?3 epoch, ?4 expiry, ?5 boot id
pub(super) const MARK_MOVED_SQL: &str =
    "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id)
     VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder, epoch = excluded.epoch,
            expires_at = excluded.expires_at, boot_id = excluded.boot_id";

// ?1 name, ?2 epoch, ?3 boot id: a free lease at the moved epoch.
pub(super) const MOVE_IN_SQL: &str =
    "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id)
     VALUES (?1, NULL, ?2, 0, ?3)";

/// `--once-per`'s two statements on a table of their own, with the clock
/// as a parameter: what the rule, `--retry-failed` and the readability
/// check take and answer, state by state.
#[cfg(test)]
mod once_per_tests {
    use super::*;
    use sqlx::{Connection, Row, SqliteConnection};

    const HALF: i64 = 1_000;
    const BOOT: &str = "boot";

    /// `(taken epoch, DONE_SQL's answer: start readable, outcome readable,
    /// done)` of one acquire by `holder` at boot-clock `now`.
    async fn take(
        c: &mut SqliteConnection,
        now: i64,
        retry: bool,
    ) -> (Option<i64>, Option<(bool, bool, bool)>) {
        let bound = |sql| {
            sqlx::query(sql)
                .bind("job")
                .bind("h")
                .bind(now)
                .bind(500i64)
                .bind(BOOT)
                .bind(HALF)
                .bind(0i64)
                .bind(crate::store::NOT_STARTED)
                .bind(i64::from(retry))
                .bind(crate::store::SUCCEEDED)
                .bind(86_400_000i64)
        };
        let taken = bound(ACQUIRE_ONCE_SQL)
            .fetch_optional(&mut *c)
            .await
            .expect("acquire")
            .map(|r| r.get::<i64, _>(0));
        let done = bound(DONE_SQL)
            .fetch_optional(&mut *c)
            .await
            .expect("done")
            .map(|r| (r.get(0), r.get(1), r.get(4)));
        (taken, done)
    }

    async fn set(c: &mut SqliteConnection, set: &str) {
        sqlx::raw_sql(&format!("UPDATE leader_lease SET {set}"))
            .execute(&mut *c)
            .await
            .expect("update");
    }

    #[test]
    fn retry_failed_and_unreadable_records_in_the_statements() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut c = SqliteConnection::connect("sqlite::memory:")
                .await
                .expect("open");
            sqlx::raw_sql(TABLE_SQL)
                .execute(&mut c)
                .await
                .expect("table");
            assert_eq!(take(&mut c, 10_000, false).await.0, Some(1));
            // Failed and released: done without the flag, taken with it.
            set(&mut c, "holder = NULL, run_outcome = 'exit 1'").await;
            assert_eq!(
                take(&mut c, 10_100, false).await,
                (None, Some((true, true, true)))
            );
            assert_eq!(take(&mut c, 10_200, true).await.0, Some(2));
            // Succeeded: done either way.
            set(&mut c, "holder = NULL, run_outcome = 'exit 0'").await;
            assert_eq!(
                take(&mut c, 10_300, true).await,
                (None, Some((true, true, true)))
            );
            // No end, lease still live: held (not done: it may yet fail);
            // lease expired: it never ended, and is retried.
            set(
                &mut c,
                "holder = 'x', run_outcome = NULL, expires_at = 10500",
            )
            .await;
            assert_eq!(
                take(&mut c, 10_400, true).await,
                (None, Some((true, true, false)))
            );
            assert_eq!(take(&mut c, 10_500, false).await.0, None);
            assert_eq!(take(&mut c, 10_500, true).await.0, Some(3));
            // Unreadable: never taken, whatever the period or the flag.
            for (bad, why) in [
                ("run_outcome = 'exploded'", (true, false)),
                ("run_outcome = 'exit 0 '", (true, false)),
                ("run_outcome = 'exit 12345678901'", (true, false)),
                ("run_outcome = 3", (true, false)),
                (
                    "run_started_at = 'soon', run_outcome = 'exit 1'",
                    (false, true),
                ),
                (
                    "run_started_at = 1000.5, run_outcome = 'exit 1'",
                    (false, true),
                ),
                (
                    "run_started_at = 99999999999, run_outcome = 'exit 1'",
                    (false, true),
                ),
            ] {
                set(&mut c, &format!("holder = NULL, {bad}")).await;
                for retry in [false, true] {
                    let (taken, done) = take(&mut c, 1_000_000, retry).await;
                    assert_eq!(taken, None, "{bad}");
                    assert_eq!(done.map(|d| (d.0, d.1)), Some(why), "{bad}");
                }
            }
            // Of another boot, a start is not compared with this boot's
            // clock: long ago, and readable.
            set(
                &mut c,
                "run_started_at = 99999999999, run_boot_id = 'old', run_outcome = 'exit 0'",
            )
            .await;
            assert_eq!(take(&mut c, 1_000_000, false).await.0, Some(4));
        });
    }
}
