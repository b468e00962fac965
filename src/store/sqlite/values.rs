//! The lease's values on the embedded store (`--advertise`, `--slots`' N,
//! the mark of a `--min-hold` keep; docs/stores.md, "The lease's values"), written inside
//! the acquire's or the release's own `BEGIN IMMEDIATE`.

use super::*;

/// After a take, inside its transaction: the new tenure's `--advertise`
/// value (or none: an earlier tenure's must not linger), no end yet. A
/// file made before these columns gets them where a value is to be
/// written (an older leaderrun names none of them); a plain run leaves such
/// a file as it is.
pub(super) async fn taken_values(
    conn: &mut SqliteConnection,
    key: &LeaseKey,
    file: &Path,
) -> Result<(), sqlx::Error> {
    let needs = key.advertise.is_some() || key.slots_value().is_some();
    if !value_columns(conn, file, needs).await? {
        return Ok(());
    }
    sqlx::query(TAKEN_VALUES_SQL)
        .bind(&key.name)
        .bind(key.advertise.as_deref())
        .bind(key.slots_value().map(i64::from))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// After a release of `key`'s grant at `epoch`, inside its transaction:
/// kept (`--min-hold`, `keep_ms` > 0), the tenure is marked ended; freed,
/// its value goes with it.
pub(super) async fn released_values(
    conn: &mut SqliteConnection,
    key: &LeaseKey,
    epoch: i64,
    keep_ms: i64,
    file: &Path,
) -> Result<(), sqlx::Error> {
    if !value_columns(conn, file, keep_ms > 0).await? {
        return Ok(());
    }
    sqlx::query(RELEASED_VALUES_SQL)
        .bind(&key.name)
        .bind(epoch)
        .bind(keep_ms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Whether the file has the lease's value columns, after adding them when
/// `add` and a file made before them lacks them.
async fn value_columns(
    conn: &mut SqliteConnection,
    file: &Path,
    add: bool,
) -> Result<bool, sqlx::Error> {
    let (all, added) = columns(conn, &VALUE_COLUMNS, add).await?;
    if !added.is_empty() {
        tracing::debug!(
            event = "store_schema",
            "added the lease's value columns to {}: {}",
            file.display(),
            added.join(", ")
        );
    }
    Ok(all)
}
