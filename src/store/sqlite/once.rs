//! `--once-per` on the embedded store: the acquire that takes lease and
//! period together, the run records, and the columns a lease file made
//! before `--once-per` gets at its first `--once-per` acquire
//! (docs/stores.md, "Once per period").

use super::*;

impl SqliteStore {
    /// The run records (`--once-per`) of `name`'s file, or of every lease
    /// file, read without a lock. A file made before `--once-per` has the
    /// columns only once a `--once-per` run used it: until then it keeps
    /// no record. The store's own file keeps none (leases moved out of it
    /// before `--once-per` ran on them).
    pub(super) async fn read_records(
        &mut self,
        name: Option<&str>,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let what = "cannot read";
        let boot = boot_id()?;
        let files = match name {
            Some(n) => vec![self.file(n)?],
            None => self.lease_files(),
        };
        let mut all = Vec::new();
        for file in files {
            if !file.exists() {
                continue;
            }
            let mut conn = match self.readers.remove(&file) {
                Some(c) => c,
                None => self.legacy.c.open_file(&file, false).await?,
            };
            let rows = read_all_until_answered(&mut conn, || {
                sqlx::query(RUN_RECORDS_SQL)
                    .bind(now_ms())
                    .bind(&boot)
                    .bind(wall_ms())
                    .bind(name)
            })
            .await;
            let rows = match rows {
                Ok(rows) => {
                    self.readers.insert(file.clone(), conn);
                    rows
                }
                Err(e) if no_table(&e) || no_column(&e) => {
                    self.readers.insert(file.clone(), conn);
                    Vec::new()
                }
                Err(e) => return Err(self.legacy.c.classify(what, e)),
            };
            for r in &rows {
                all.push(run_record(r).map_err(|e| self.legacy.c.classify(what, e))?);
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }
}

/// `--once-per`'s acquire inside the caller's `BEGIN IMMEDIATE` on lease
/// file `file`: the columns added where missing, then the acquire that
/// takes lease and period together, then (only when it took nothing) why.
/// `Ok(Err(why))`: the record is not one this release can decide on.
pub(super) async fn acquire_once_in(
    conn: &mut SqliteConnection,
    key: &LeaseKey,
    ms: i64,
    period: Period,
    boot: &str,
    file: &Path,
) -> Result<Result<Acquired, String>, sqlx::Error> {
    add_run_columns(conn, file).await?;
    // One instant for both statements, so that "done" is the exact
    // complement of the acquire's condition on the period.
    let now = now_ms();
    let wall = wall_ms();
    let bound = |sql| {
        sqlx::query(sql)
            .bind(&key.name)
            .bind(&key.holder)
            .bind(now)
            .bind(ms)
            .bind(boot)
            .bind(millis(period.half))
            .bind(wall)
            .bind(crate::store::NOT_STARTED)
            .bind(i64::from(period.retry_failed))
            .bind(crate::store::SUCCEEDED)
            .bind(millis(crate::store::FUTURE_LIMIT))
    };
    if let Some(r) = bound(ACQUIRE_ONCE_SQL).fetch_optional(&mut *conn).await? {
        return Ok(Ok(Acquired::Taken(r.try_get::<i64, _>(0)?)));
    }
    let Some(r) = bound(DONE_SQL).fetch_optional(&mut *conn).await? else {
        return Ok(Ok(Acquired::Held));
    };
    let (start_ok, outcome_ok): (bool, bool) = (r.try_get(0)?, r.try_get(1)?);
    let outcome: Option<String> = r.try_get(2)?;
    if !outcome_ok {
        let shown = crate::names::printable(outcome.as_deref().unwrap_or_default());
        return Ok(Err(format!("says its run ended \"{shown}\"")));
    }
    if !start_ok {
        return Ok(Err(format!(
            "has a start that is not a boot-clock time, or is more than {} ahead of it",
            crate::duration::show(crate::store::FUTURE_LIMIT)
        )));
    }
    Ok(Ok(match r.try_get::<bool, _>(4)? {
        true => Acquired::DoneThisPeriod {
            started_ms_ago: r.try_get::<i64, _>(3)?,
        },
        false => Acquired::Held,
    }))
}

/// Give a lease file made before `--once-per` the run record's columns
/// (`columns`, inside the caller's write transaction). A plain run never
/// calls this: its statements name none of these columns.
pub(super) async fn add_run_columns(
    conn: &mut SqliteConnection,
    file: &Path,
) -> Result<(), sqlx::Error> {
    let (_, added) = columns(conn, &RUN_COLUMNS, true).await?;
    if !added.is_empty() {
        tracing::info!(
            event = "store_schema",
            "added the run record's columns to {} (for --once-per): {}",
            file.display(),
            added.join(", ")
        );
    }
    Ok(())
}

/// A run record from a row of `RUN_RECORDS_SQL`.
pub(super) fn run_record(r: &sqlx::sqlite::SqliteRow) -> Result<RunRecord, sqlx::Error> {
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
}
