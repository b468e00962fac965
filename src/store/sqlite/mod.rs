//! The embedded store: SQLite files, for one host and no server.
//!
//! There is no server clock here, and the wall clock can be stepped by hours
//! (NTP, `date -s`, a VM restored from a snapshot). So expiry is kept on
//! `CLOCK_BOOTTIME` — the same clock the elector's deadlines use, shared by
//! every process on the host, never stepped — together with the kernel's
//! boot id. Boot-clock values from another boot mean nothing, so a row whose
//! boot id differs from the current one is free: after a reboot no holder's
//! process can still be running.
//!
//! **A file per lease.** The store's file (`leases.db`, or the path of a
//! `sqlite://` URL) no longer holds the leases: each lease has a file of its
//! own, `leases.db-leases/NAME.db` (path.rs, `lease_file`), with the same
//! table. A SQLite write lock is the whole file's, and a process stopped
//! (SIGSTOP, Ctrl-Z, a debugger, a frozen cgroup) while it holds one keeps
//! it for as long as it stays stopped; with one file for every lease, that
//! stopped every other lease on the host. Now it can only hold up its own
//! lease, and there it is ended by whoever has a better claim to the file
//! (`may_end`, stopped.rs). docs/stores.md, "The embedded store in detail",
//! gives the reasoning and the bounds.
//!
//! **Writes** run in `BEGIN IMMEDIATE`, which takes the file's write lock
//! *before* reading. Racing processes queue on that lock instead of reading
//! a snapshot and failing to upgrade it, and "now" is read from the boot
//! clock after the lock is held. SQLite waits for the lock [`SLICE`] at a
//! time; between slices the caller looks at who holds it (`unblock`).
//! **Reads** (`inspect`, `list`) take no lock at all: in WAL mode a reader
//! sees the last commit while a writer, stopped or not, holds the write
//! lock, so `status`, `watch` and a waiter's look at the lease are never
//! held up by a stopped writer.
//! `synchronous = NORMAL` can lose the last commits on power loss only, and a
//! power loss is a reboot, after which every lease is free anyway.
//!
//! **Moving in.** A lease that was never used under this layout may still
//! have a row in the store's file, written by an older leaderrun, which may
//! even be running and holding it during a package upgrade. The first
//! acquisition of the name moves it, under both files' write locks: while
//! the old row is held and live, the lease is held (and read from there);
//! otherwise the old row is marked moved for good (a holder that no older
//! leaderrun takes, for ten years of uptime) and the lease file's row starts
//! at the old epoch, so no epoch is handed out twice and an older leaderrun
//! can no longer acquire the name.
//!
//! **`--once-per`** (docs/stores.md, "Once per period"): the rule and the
//! run record are `run_*` columns of the lease row, by the same boot clock
//! and boot id as expiry; the wall clock is written beside them for
//! `status` to show, never compared. A run of another boot counts as
//! started long ago (a reboot opens the period). A lease file made before
//! `--once-per` gets the columns at its first `--once-per` acquire
//! (once.rs); a plain run names none of them. The lease's values (values.rs)
//! get their columns likewise, where a value is first written.
//!
//! Each run opens its lease's file, writes twice and closes it. By default
//! SQLite's last connection to close copies the WAL into the database,
//! fsyncs both and deletes the WAL, which the next run creates again: fsyncs
//! on every run that no clause of the contract needs (a lost commit is the
//! power-loss case above). So the WAL is kept at close
//! (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`) and copied back only once it holds
//! `wal_autocheckpoint` pages, by the commit that crosses that mark; kept
//! small, so that the next opener's scan of it (SQLite rebuilds its index
//! when it is the first to open the file) stays short.

use crate::store::UrlError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::time::Instant;

mod once;
mod path;
mod statements;
mod stopped;
mod unblock;
mod values;

use self::once::acquire_once_in;
use self::unblock::{begin_on_store_file, end_stopped_on_store_file, unblock, Blocked};
use self::values::{released_values, taken_values};
pub(crate) mod wake;

use self::path::{create_private_dir, make_lease_dir, why_unopenable};
pub use self::path::{default_path, lease_dir, lease_file};
use self::statements::*;
pub use self::statements::{MOVED, SCHEMA, TABLE_SQL};

use self::wake::{touch, touch_taken, FileWakeups};
use super::session::{Connect, Session};
use super::sql::{self, lease_info, millis, Dialect};
use super::wake::{Heard, Subscription};
use super::{
    Acquired, Backend, Capabilities, Init, LeaseInfo, LeaseKey, Outcome, Period, ResolveError,
    RunRecord, Schema, Store, StoreError, Target,
};
use crate::clock::{BootClock, Clock};

pub struct SqliteStore {
    /// The store's own file, one connection kept between calls (used to
    /// move leases out of it, and to read and release the leases an older
    /// leaderrun keeps there); its `c` is the store's settings.
    legacy: Session<Lite>,
    /// One lease file's connection, kept between calls (a `Lock` uses one
    /// name, so a run opens its file once); dropped when a call failed.
    conn: Option<(PathBuf, SqliteConnection)>,
    /// The connections `list` read every file through, kept for the next
    /// `list` (`watch` lists every `--retry`): the first process to open a
    /// file that nobody has open rebuilds its WAL index, under the file's
    /// write lock, and a watcher need not do that for every lease at
    /// every look.
    readers: BTreeMap<PathBuf, SqliteConnection>,
}

/// The store's file, and what is learnt once per process.
struct Lite {
    path: PathBuf,
    /// `mode=rw` in the URL: use an existing store file, never create one.
    create: bool,
}

/// Who asks for a lease file's write lock, which decides whether a stopped
/// leaderrun holding it may be ended (`may_end`).
#[derive(Clone, Copy)]
enum Claim<'a> {
    /// A contender or an operator: only once the lease is free or over.
    Lease,
    /// The lease's current grant (renew, release): also while it is ours.
    Grant { holder: &'a str, epoch: i64 },
}

/// A lease row's state as the lock rules read it.
struct State {
    holder: Option<String>,
    epoch: i64,
    expires_at: i64,
    boot: String,
}

impl State {
    /// Held by someone, from this boot, and not over at `now`.
    fn live(&self, now: i64, boot: &str) -> bool {
        self.holder.is_some() && self.boot == boot && self.expires_at > now
    }
}

/// The registry's constructor for `sqlite:///absolute/path`.
///
/// Relative paths are refused: a cron job and a shell in another directory
/// would use different files and both run. `?mode=rwc` (the default) and
/// `?mode=rw` (never create the file) are the only parameters; a `?` or `#`
/// in a file name is written `%3F` / `%23`.
pub fn open(t: &Target<'_>) -> Result<Store, UrlError> {
    let abs = "needs an absolute file path, as in sqlite:///var/lib/leaderrun/leases.db \
               (three slashes; relative paths are refused so that every run uses the same file)";
    let path = t.url.to_file_path().map_err(|()| abs.to_string())?;
    if !path.is_absolute() || path.as_os_str().len() <= 1 || t.url.path().ends_with('/') {
        return Err(abs.into());
    }
    let mut create = true;
    for (k, v) in t.url.query_pairs() {
        match (k.as_ref(), v.as_ref()) {
            ("mode", "rwc") => create = true,
            ("mode", "rw") => create = false,
            ("mode", _) => return Err("has a mode other than rwc or rw".into()),
            _ => return Err(
                "has a parameter other than mode=rwc or mode=rw (write '?' in a file name as %3F)"
                    .into(),
            ),
        }
    }
    let mut store = SqliteStore::new(path);
    store.legacy.c.create = create;
    Ok(Store::Sqlite(store))
}

/// The embedded default store (no store configured).
pub fn open_default(_busy: Duration) -> Result<Store, ResolveError> {
    Ok(Store::Sqlite(SqliteStore::new(default_path()?)))
}

/// The kernel's boot id, read once per process (it cannot change while we run).
fn boot_id() -> Result<String, StoreError> {
    static BOOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    const P: &str = "/proc/sys/kernel/random/boot_id";
    if let Some(b) = BOOT.get() {
        return Ok(b.clone());
    }
    let b = std::fs::read_to_string(P)
        .map(|s| s.trim().to_string())
        .map_err(|e| {
            StoreError::fatal(format!("cannot read the boot id from {P}: {e}")).with_source(e)
        })?;
    Ok(BOOT.get_or_init(|| b).clone())
}

fn now_ms() -> i64 {
    millis(BootClock.now().since_origin())
}

/// The wall clock as Unix ms, written into a run record only to show when
/// it started and ended: the rule never reads it (it can be stepped).
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

/// Whether `e` is SQLite's "another process holds the lock".
fn busy(e: &sqlx::Error) -> bool {
    <Lite as Dialect>::may_heal(e)
}

impl SqliteStore {
    fn new(path: PathBuf) -> SqliteStore {
        SqliteStore {
            legacy: Session::new(Lite { path, create: true }),
            conn: None,
            readers: BTreeMap::new(),
        }
    }

    /// End `pid` if it is a leaderrun stopped while it holds the write
    /// lock of lease `name`'s file: for the watchdog, whose leaderrun's
    /// lease is lost once the give-up deadline has passed
    /// (watchdog/process.rs, `end_stopped_leaderrun`). True when ended.
    pub fn end_stopped_holder(&self, name: &str, pid: i32) -> bool {
        match lease_file(&self.legacy.c.path, name) {
            Some(file) => stopped::stopped_holder(&file) == Some(pid) && stopped::end(&file, pid),
            None => false,
        }
    }

    /// The file of lease `name`; a name no file can be named after (only
    /// a row written by hand can hold one) is refused.
    fn file(&self, name: &str) -> Result<PathBuf, StoreError> {
        lease_file(&self.legacy.c.path, name).ok_or_else(|| {
            StoreError::fatal(format!(
                "the lease name {} is too long for a file name in {}",
                crate::names::printable(name),
                self.legacy.c.shown()
            ))
        })
    }

    /// A connection to `file`: the kept one, or a new one (the file created
    /// when `create`).
    async fn conn_to(&mut self, file: &Path, create: bool) -> Result<SqliteConnection, StoreError> {
        match self.conn.take() {
            Some((f, c)) if f == file => Ok(c),
            _ => self.legacy.c.open_file(file, create).await,
        }
    }

    /// `BEGIN IMMEDIATE` on lease file `file` (created if missing), waiting
    /// for the write lock a [`SLICE`] at a time; between slices a stopped
    /// leaderrun that holds it is ended when `claim` allows (`may_end`).
    /// The caller's timeout bounds the whole wait.
    async fn begin(
        &mut self,
        file: &Path,
        name: &str,
        claim: Claim<'_>,
        what: &str,
    ) -> Result<SqliteConnection, StoreError> {
        // Never `None`: `held` is answered only when asked for.
        self.begin_or_held(file, name, claim, what, false)
            .await?
            .ok_or_else(|| StoreError::unavailable(format!("{what} the store: its file is held")))
    }

    /// [`Self::begin`]; with `held_answers`, `None` instead of waiting when
    /// a stopped leaderrun holds the file and the lease is live by its last
    /// commit: an acquisition then has its answer (the lease was held at an
    /// instant of the call), and a contender goes on to wait for the
    /// lease's end by the store's clock instead of a lock that may never be
    /// let go.
    async fn begin_or_held(
        &mut self,
        file: &Path,
        name: &str,
        claim: Claim<'_>,
        what: &str,
        held_answers: bool,
    ) -> Result<Option<SqliteConnection>, StoreError> {
        let mut conn = None;
        loop {
            let mut c = match conn.take() {
                Some(c) => c,
                None => match self.conn_to(file, true).await {
                    Ok(c) => c,
                    Err(e) if e.may_heal() => {
                        // Opening takes locks too (the first opener rebuilds
                        // the WAL index): the same rules apply.
                        let _ = unblock(file, None, name, claim).await;
                        tokio::time::sleep(SLICE).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            match sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut c).await {
                Ok(_) => return Ok(Some(c)),
                Err(e) if busy(&e) => {
                    if unblock(file, Some(&mut c), name, claim).await == Blocked::ByLiveLease
                        && held_answers
                    {
                        self.conn = Some((file.to_path_buf(), c));
                        return Ok(None);
                    }
                    conn = Some(c);
                }
                Err(e) => return Err(self.legacy.c.classify(what, e)),
            }
        }
    }

    /// `COMMIT`, and keep the connection for the next call.
    async fn commit(
        &mut self,
        file: PathBuf,
        mut conn: SqliteConnection,
        what: &str,
    ) -> Result<(), StoreError> {
        sqlx::raw_sql("COMMIT")
            .execute(&mut conn)
            .await
            .map_err(|e| self.legacy.c.classify(what, e))?;
        self.conn = Some((file, conn));
        Ok(())
    }

    /// Renew and release: one UPDATE naming name, holder, epoch and boot,
    /// with now and a duration in ms; true when it matched the lease. A
    /// lease whose file has no row is not ours.
    async fn update(
        &mut self,
        sql: &'static str,
        what: &str,
        (key, epoch, d): (&LeaseKey, i64, Duration),
        ending: Option<&str>,
        release: bool,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let ms = millis(d);
        let boot = boot_id()?;
        let file = self.file(&key.name)?;
        let claim = Claim::Grant {
            holder: &key.holder,
            epoch,
        };
        let shown = self.legacy.c.shown();
        let work = async {
            let mut conn = self.begin(&file, &key.name, claim, what).await?;
            let mut q = sqlx::query(sql)
                .bind(&key.name)
                .bind(&key.holder)
                .bind(epoch)
                .bind(now_ms())
                .bind(ms)
                .bind(&boot);
            if let Some(outcome) = ending {
                q = q.bind(outcome).bind(wall_ms());
            }
            let done = q
                .execute(&mut conn)
                .await
                .map_err(|e| self.legacy.c.classify(what, e))?;
            let matched = done.rows_affected() == 1;
            if matched && release {
                released_values(&mut conn, key, epoch, ms, &file)
                    .await
                    .map_err(|e| self.legacy.c.classify(what, e))?;
            }
            self.commit(file.clone(), conn, what).await?;
            Ok(matched)
        };
        bounded(&shown, timeout, work).await
    }

    /// Move lease `name` out of the store's file (module docs, "Moving
    /// in"), called with the lease file's write lock held and no row for
    /// the name in it: `Some(epoch)` to start the lease file's row at, or
    /// `None` while an older leaderrun's row holds the lease.
    async fn move_in(
        &mut self,
        name: &str,
        boot: &str,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let path = self.legacy.c.path.clone();
        loop {
            let path = &path;
            let moved = self
                .legacy
                .call(timeout, "cannot move a lease out of", async |conn, _| {
                    begin_on_store_file(conn, path).await?;
                    let now = now_ms();
                    let old = read_state(conn, name).await?;
                    if let Some(old) = &old {
                        if old.holder.as_deref() != Some(MOVED) && old.live(now, boot) {
                            sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await?;
                            return Ok(None);
                        }
                    }
                    let epoch = old.map_or(0, |o| o.epoch);
                    sqlx::query(MARK_MOVED_SQL)
                        .bind(name)
                        .bind(MOVED)
                        .bind(epoch)
                        .bind(now.saturating_add(TEN_YEARS_MS))
                        .bind(boot)
                        .execute(&mut *conn)
                        .await?;
                    sqlx::raw_sql("COMMIT").execute(&mut *conn).await?;
                    Ok(Some(epoch))
                })
                .await;
            match moved {
                // Opening the file takes locks too (the first opener
                // rebuilds the WAL index).
                Err(e) if e.may_heal() && end_stopped_on_store_file(path) => continue,
                r => return r,
            }
        }
    }

    /// A lock-free read of lease `name`: its file's row, else the row an
    /// older leaderrun keeps in the store's file (a moved one reads free).
    async fn read_one(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let what = "cannot read";
        let boot = boot_id()?;
        let file = self.file(name)?;
        if file.exists() {
            let mut conn = self.conn_to(&file, false).await?;
            let row = read_until_answered(&mut conn, || {
                sqlx::query(INSPECT_SQL)
                    .bind(now_ms())
                    .bind(&boot)
                    .bind(name)
            })
            .await;
            match row {
                Ok(Some(r)) => {
                    let info = lease_info(&r).map_err(|e| self.legacy.c.classify(what, e))?;
                    self.conn = Some((file, conn));
                    return Ok(Some(info));
                }
                Ok(None) => self.conn = Some((file, conn)),
                Err(e) if no_table(&e) => {}
                Err(e) => return Err(self.legacy.c.classify(what, e)),
            }
        }
        if !self.legacy.c.path.exists() {
            return Ok(None);
        }
        let row = self
            .legacy
            .call(timeout, what, async |conn, _| {
                let row = read_until_answered(conn, || {
                    sqlx::query(INSPECT_SQL)
                        .bind(now_ms())
                        .bind(&boot)
                        .bind(name)
                })
                .await?;
                row.map(|r| lease_info(&r)).transpose()
            })
            .await?;
        Ok(row.map(unmoved))
    }

    /// Every lease, read without a lock: the store's file's rows that were
    /// not moved, then every lease file's, which win.
    async fn read_all(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let what = "cannot read";
        let boot = boot_id()?;
        let mut all = BTreeMap::new();
        if self.legacy.c.path.exists() {
            let rows = self
                .legacy
                .call(timeout, what, async |conn, _| {
                    let rows = read_all_until_answered(conn, || {
                        sqlx::query(LIST_SQL).bind(now_ms()).bind(&boot)
                    })
                    .await?;
                    rows.iter().map(lease_info).collect::<Result<Vec<_>, _>>()
                })
                .await?;
            for info in rows {
                if info.holder.as_deref() != Some(MOVED) {
                    all.insert(info.name.clone(), info);
                }
            }
        }
        for file in self.lease_files() {
            let mut conn = match self.readers.remove(&file) {
                Some(c) => c,
                None => self.legacy.c.open_file(&file, false).await?,
            };
            let rows = read_all_until_answered(&mut conn, || {
                sqlx::query(LIST_SQL).bind(now_ms()).bind(&boot)
            })
            .await;
            let rows = match rows {
                Ok(rows) => {
                    self.readers.insert(file.clone(), conn);
                    rows
                }
                // A lease file that was created but never got its table.
                Err(e) if no_table(&e) => Vec::new(),
                Err(e) => return Err(self.legacy.c.classify(what, e)),
            };
            for r in &rows {
                let info = lease_info(r).map_err(|e| self.legacy.c.classify(what, e))?;
                all.insert(info.name.clone(), info);
            }
        }
        Ok(all.into_values().collect())
    }

    /// Every lease file, sorted.
    fn lease_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(lease_dir(&self.legacy.c.path)) {
            Ok(dir) => dir
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.ends_with(".db") && !n.starts_with('.'))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        files.sort();
        files
    }

    /// Clear lease `name` in its file: `Ok(None)` when the file has no row
    /// for it (it may still be in the store's file).
    async fn clear_file(
        &mut self,
        name: &str,
        epoch: Option<i64>,
    ) -> Result<Option<Option<LeaseInfo>>, StoreError> {
        let what = "cannot release in";
        let file = self.file(name)?;
        if !file.exists() {
            return Ok(None);
        }
        let boot = boot_id()?;
        let mut conn = self.begin(&file, name, Claim::Lease, what).await?;
        let fail = |e| sql::error(&self.legacy.c, what, e);
        let row = read_state(&mut conn, name).await.map_err(fail)?;
        if row.is_none() {
            self.commit(file, conn, what).await?;
            return Ok(None);
        }
        let cleared = clear_row(&mut conn, name, epoch, &boot)
            .await
            .map_err(|e| sql::error(&self.legacy.c, what, e))?;
        self.commit(file, conn, what).await?;
        Ok(Some(cleared))
    }

    /// Clear lease `name` where an older leaderrun keeps it, in the
    /// store's file (never a moved row).
    async fn clear_legacy(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        if !self.legacy.c.path.exists() {
            return Ok(None);
        }
        let boot = boot_id()?;
        let path = self.legacy.c.path.clone();
        self.legacy
            .call(timeout, "cannot release in", async |conn, _| {
                begin_on_store_file(conn, &path).await?;
                let cleared = clear_row(conn, name, epoch, &boot).await?;
                sqlx::raw_sql("COMMIT").execute(&mut *conn).await?;
                Ok(cleared)
            })
            .await
    }
}

/// `work` within `timeout`, or the store's "did not answer".
async fn bounded<T>(
    shown: &str,
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::unavailable(format!(
            "the store {shown} did not answer within {}",
            crate::duration::show(timeout)
        ))),
    }
}

/// The row of `name` as the lock rules read it.
async fn read_state(conn: &mut SqliteConnection, name: &str) -> Result<Option<State>, sqlx::Error> {
    let row = sqlx::query(STATE_SQL)
        .bind(name)
        .fetch_optional(conn)
        .await?;
    row.map(|r| {
        Ok(State {
            holder: r.try_get(0)?,
            epoch: r.try_get(1)?,
            expires_at: r.try_get(2)?,
            boot: r.try_get::<Option<String>, _>(3)?.unwrap_or_default(),
        })
    })
    .transpose()
}

/// Clear a held row of `name` (at `epoch`, if given) inside the caller's
/// transaction: what it held before, or `None`.
async fn clear_row(
    conn: &mut SqliteConnection,
    name: &str,
    epoch: Option<i64>,
    boot: &str,
) -> Result<Option<LeaseInfo>, sqlx::Error> {
    let now = now_ms();
    let row = sqlx::query(CLEARABLE_SQL)
        .bind(now)
        .bind(boot)
        .bind(name)
        .bind(epoch)
        .bind(MOVED)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let before = lease_info(&row)?;
    sqlx::query(CLEAR_SQL)
        .bind(name)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(Some(before))
}

/// A moved row in the store's file reads as free: its lease lives in its
/// own file now, which has no row yet only between the move and the
/// lease file's commit.
fn unmoved(mut info: LeaseInfo) -> LeaseInfo {
    if info.holder.as_deref() == Some(MOVED) {
        info.holder = None;
        info.expires_in_ms = Some(-1);
    }
    info
}

/// "no such column": a lease file made before `--once-per`, read for its
/// run record.
/// Whether a lease file has every column of `cols`, after adding the
/// missing ones when `add`; and which were added. Inside the caller's write
/// transaction: under the file's write lock no other process can be adding
/// them at the same time, and one that added them before is seen here
/// (SQLite has no `ADD COLUMN IF NOT EXISTS`, so the table's columns are
/// read first). An older leaderrun's statements name none of them.
async fn columns(
    conn: &mut SqliteConnection,
    cols: &[(&'static str, &str)],
    add: bool,
) -> Result<(bool, Vec<&'static str>), sqlx::Error> {
    let have: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('leader_lease')")
            .fetch_all(&mut *conn)
            .await?;
    let missing: Vec<_> = cols
        .iter()
        .filter(|(c, _)| !have.iter().any(|h| h == c))
        .collect();
    if missing.is_empty() || !add {
        return Ok((missing.is_empty(), Vec::new()));
    }
    let mut added = Vec::new();
    for (col, ty) in missing {
        sqlx::raw_sql(&format!("ALTER TABLE leader_lease ADD COLUMN {col} {ty}"))
            .execute(&mut *conn)
            .await?;
        added.push(*col);
    }
    Ok((true, added))
}

fn no_column(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.message().starts_with("no such column"))
}

/// "no such table": a file created but never set up.
fn no_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.message().starts_with("no such table"))
}

/// One read, tried again while SQLite says busy (a reader waits only while
/// another process rebuilds the WAL index, as the first to open the file
/// does); the caller's timeout bounds it.
async fn read_until_answered<'q, F>(
    conn: &mut SqliteConnection,
    query: F,
) -> Result<Option<sqlx::sqlite::SqliteRow>, sqlx::Error>
where
    F: Fn() -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
{
    loop {
        match query().fetch_optional(&mut *conn).await {
            Err(e) if busy(&e) => tokio::time::sleep(SLICE).await,
            r => return r,
        }
    }
}

/// [`read_until_answered`] for every row.
async fn read_all_until_answered<'q, F>(
    conn: &mut SqliteConnection,
    query: F,
) -> Result<Vec<sqlx::sqlite::SqliteRow>, sqlx::Error>
where
    F: Fn() -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
{
    loop {
        match query().fetch_all(&mut *conn).await {
            Err(e) if busy(&e) => tokio::time::sleep(SLICE).await,
            r => return r,
        }
    }
}

impl Lite {
    fn shown(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    /// A connection to `file` (the store's file or a lease file), in WAL
    /// mode with the table created. A lease file is created when `create`;
    /// the store's file only when the URL allows (`mode=rw` never creates
    /// it, nor the leases of a store file that is not there).
    async fn open_file(&self, file: &Path, create: bool) -> Result<SqliteConnection, StoreError> {
        let lease = file != self.path;
        let create = create && (self.create || (lease && self.path.exists()));
        if lease && create {
            make_lease_dir(&self.path, self.create).map_err(|e| {
                // Most often the store's directory is not writable: say so
                // as for the store's own file.
                let why = why_unopenable(&self.path).unwrap_or_else(|| {
                    format!(
                        "cannot create the lease directory {}: {e}",
                        lease_dir(&self.path).display()
                    )
                });
                StoreError::fatal(format!("cannot open the store {}: {why}", self.shown()))
                    .with_source(e)
            })?;
        } else if create {
            if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                create_private_dir(dir).map_err(|e| {
                    let said = format!("cannot create the store directory {}: {e}", dir.display());
                    StoreError::fatal(said).with_source(e)
                })?;
            }
        }
        let opts = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|e| StoreError::fatal(e.to_string()))?
            .filename(file)
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .pragma("wal_autocheckpoint", WAL_PAGES)
            .busy_timeout(SLICE)
            .disable_statement_logging();
        let context = if lease {
            format!(
                "cannot open the store {} (lease file {})",
                self.shown(),
                file.display()
            )
        } else {
            format!("cannot open the store {}", self.shown())
        };
        let mut conn =
            SqliteConnection::connect_with(&opts).await.map_err(|e| {
                match why_unopenable(file) {
                    Some(why) if !busy(&e) => StoreError::fatal(format!("{context}: {why}")),
                    _ => sql::classify::<Lite>(&context, e),
                }
            })?;
        keep_wal_at_close(&mut conn)
            .await
            .map_err(|e| sql::classify::<Lite>(&context, e))?;
        sqlx::query(TABLE_SQL)
            .execute(&mut conn)
            .await
            .map_err(|e| {
                sql::classify::<Lite>(&format!("cannot set up the store {}", self.shown()), e)
            })?;
        Ok(conn)
    }
}

impl Connect for Lite {
    type Conn = SqliteConnection;
    type Error = sqlx::Error;

    fn shown(&self) -> String {
        Lite::shown(self)
    }

    async fn connect(&mut self, _deadline: Instant) -> Result<SqliteConnection, StoreError> {
        self.open_file(&self.path, true).await
    }

    fn classify(&self, what: &str, e: sqlx::Error) -> StoreError {
        sql::error(self, what, e)
    }
}

impl Dialect for Lite {
    /// SQLITE_BUSY (5) and SQLITE_LOCKED (6), with extended codes: another
    /// process holds the write lock. Nothing else heals by itself.
    fn may_heal(e: &sqlx::Error) -> bool {
        match e {
            sqlx::Error::Database(d) => d
                .code()
                .and_then(|c| c.parse::<i32>().ok())
                .is_some_and(|c| matches!(c & 0xff, 5 | 6)),
            _ => false,
        }
    }
}

/// The WAL is copied back into the database once it holds this many pages
/// (4 KiB each; a run adds about four).
const WAL_PAGES: &str = "128";

/// No checkpoint (and no fsync) when this connection closes: see the module
/// docs. An SQLite that does not know the option (older than 3.16) keeps its
/// default, which is only slower.
async fn keep_wal_at_close(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    use std::os::raw::c_int;
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the open connection, held by `lock_handle` so that no
    // other thread uses it during the call; this option takes an int and an
    // optional int* for the previous value (none asked for).
    unsafe {
        libsqlite3_sys::sqlite3_db_config(
            db,
            libsqlite3_sys::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            1 as c_int,
            std::ptr::null_mut::<c_int>(),
        );
    }
    Ok(())
}

impl SqliteStore {
    /// The acquire, plain or (with `half`) under `--once-per`'s rule, in
    /// one `BEGIN IMMEDIATE` on the lease's file.
    async fn acquire_in(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: Option<Period>,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        let what = "cannot acquire in";
        let ms = millis(lease);
        let boot = boot_id()?;
        let file = self.file(&key.name)?;
        let shown = self.legacy.c.shown();
        let work = async {
            let Some(mut conn) = self
                .begin_or_held(&file, &key.name, Claim::Lease, what, true)
                .await?
            else {
                return Ok(Acquired::Held);
            };
            let fail = |e| sql::error(&self.legacy.c, what, e);
            if read_state(&mut conn, &key.name)
                .await
                .map_err(fail)?
                .is_none()
            {
                // First use of the name in its file: move it in.
                let Some(epoch) = self.move_in(&key.name, &boot, timeout).await? else {
                    self.commit(file.clone(), conn, what).await?;
                    return Ok(Acquired::Held);
                };
                sqlx::query(MOVE_IN_SQL)
                    .bind(&key.name)
                    .bind(epoch)
                    .bind(&boot)
                    .execute(&mut conn)
                    .await
                    .map_err(|e| sql::error(&self.legacy.c, what, e))?;
            }
            let got = match period {
                None => sqlx::query(ACQUIRE_SQL)
                    .bind(&key.name)
                    .bind(&key.holder)
                    .bind(now_ms())
                    .bind(ms)
                    .bind(&boot)
                    .fetch_optional(&mut conn)
                    .await
                    .and_then(|row| row.map(|r| r.try_get::<i64, _>(0)).transpose())
                    .map(|e| Ok(e.map_or(Acquired::Held, Acquired::Taken))),
                Some(period) => acquire_once_in(&mut conn, key, ms, period, &boot, &file).await,
            }
            .map_err(|e| sql::error(&self.legacy.c, what, e))?;
            if let Ok(Acquired::Taken(_)) = got {
                taken_values(&mut conn, key, &file)
                    .await
                    .map_err(|e| sql::error(&self.legacy.c, what, e))?;
            }
            self.commit(file.clone(), conn, what).await?;
            got.map_err(|why| crate::store::unreadable(&self.legacy.c.shown(), &key.name, &why))
        };
        let got = bounded(&shown, timeout, work).await?;
        // After the commit: a watcher woken now finds the lease taken.
        if let Acquired::Taken(_) = got {
            touch_taken(&self.legacy.c.path, &key.name);
        }
        Ok(got)
    }

    /// Release (`RELEASE_SQL`), or with `ending` also write the run
    /// record's end and outcome (`RELEASE_ENDING_SQL`).
    async fn release_in(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        ending: Option<&str>,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let sql = match ending {
            Some(_) => RELEASE_ENDING_SQL,
            None => RELEASE_SQL,
        };
        let freed = self
            .update(
                sql,
                "cannot release in",
                (key, epoch, keep),
                ending,
                true,
                timeout,
            )
            .await?;
        // After the commit: a waiter woken now finds the lease free.
        if freed && keep.is_zero() {
            touch(&self.legacy.c.path, &key.name);
        }
        Ok(freed)
    }
}

impl Backend for SqliteStore {
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        Ok(self.acquire_in(key, lease, None, timeout).await?.epoch())
    }

    async fn renew(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.update(
            RENEW_SQL,
            "cannot renew in",
            (key, epoch, lease),
            None,
            false,
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
        self.release_in(key, epoch, keep, None, timeout).await
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
        self.acquire_in(key, lease, Some(period), timeout).await
    }

    async fn release_ending(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        outcome: Outcome,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let outcome = outcome.to_string();
        self.release_in(key, epoch, keep, Some(&outcome), timeout)
            .await
    }

    async fn run_records(
        &mut self,
        name: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let shown = self.legacy.c.shown();
        bounded(&shown, timeout, self.read_records(name)).await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let shown = self.legacy.c.shown();
        bounded(&shown, timeout, self.read_one(name, timeout)).await
    }

    fn describe(&self) -> String {
        self.legacy.c.shown()
    }

    async fn replication(&mut self, _timeout: Duration) -> Result<super::Replication, StoreError> {
        Ok(super::Replication {
            can_lose_acknowledged: Some(false),
            detail: "none (one host, one file)".into(),
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pushes_wakeups: true,
            ..Capabilities::MILLIS
        }
    }

    fn wakeups(&self, name: &str, heard: Heard) -> Option<Subscription> {
        Some(Subscription::Sqlite(FileWakeups::new(
            self.legacy.c.path.clone(),
            name,
            heard,
        )))
    }

    fn schema(&self) -> Option<Schema> {
        Some(SCHEMA)
    }

    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        let shown = self.legacy.c.shown();
        let work = async {
            self.legacy
                .call(timeout, "cannot use", async |_, _| Ok(()))
                .await?;
            make_lease_dir(&self.legacy.c.path, self.legacy.c.create).map_err(|e| {
                StoreError::fatal(format!(
                    "cannot create the lease directory {}: {e}",
                    lease_dir(&self.legacy.c.path).display()
                ))
                .with_source(e)
            })?;
            Ok(Init::Ready)
        };
        bounded(&shown, timeout, work).await
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let shown = self.legacy.c.shown();
        bounded(&shown, timeout, self.read_all(timeout)).await
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let shown = self.legacy.c.shown();
        let work = async {
            match self.clear_file(name, epoch).await? {
                Some(cleared) => Ok(cleared),
                None => self.clear_legacy(name, epoch, timeout).await,
            }
        };
        let cleared = bounded(&shown, timeout, work).await?;
        if cleared.is_some() {
            touch(&self.legacy.c.path, name);
        }
        Ok(cleared)
    }
}
