//! The embedded store: a SQLite file, for one host and no server.
//!
//! There is no server clock here, and the wall clock can be stepped by hours
//! (NTP, `date -s`, a VM restored from a snapshot). So expiry is kept on
//! `CLOCK_BOOTTIME` — the same clock the elector's deadlines use, shared by
//! every process on the host, never stepped — together with the kernel's
//! boot id. Boot-clock values from another boot mean nothing, so a row whose
//! boot id differs from the current one is free: after a reboot no holder's
//! process can still be running.
//!
//! Every call runs in `BEGIN IMMEDIATE`, which takes the database's write
//! lock *before* reading. Racing processes queue on that lock (bounded by the
//! busy timeout, itself bounded by the give-up interval) instead of reading a
//! snapshot and failing to upgrade it, and "now" is read from the boot clock
//! after the lock is held. WAL mode keeps other readers of the file (the
//! sqlite3 shell, a backup) from blocking or being blocked.
//! `synchronous = NORMAL` can lose the last commits on power loss only, and a
//! power loss is a reboot, after which every lease is free anyway.
//!
//! Each run opens the file, writes twice and closes it. By default SQLite's
//! last connection to close copies the WAL into the database, fsyncs both
//! and deletes the WAL, which the next run creates again: fsyncs on every
//! run that no clause of the contract needs (a lost commit is the power-loss
//! case above). So the WAL is kept at close (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`)
//! and copied back only once it holds `wal_autocheckpoint` pages, by the
//! commit that crosses that mark; kept small, so that the next opener's
//! scan of it (SQLite rebuilds its index when it is the first to open the
//! file) stays short.

use crate::store::UrlError;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::time::Instant;

mod path;
pub(crate) mod wake;

pub use self::path::default_path;
use self::path::{create_private_dir, why_unopenable};

use self::wake::{touch, FileWakeups};
use super::session::{Connect, Session};
use super::sql::{self, lease_info, millis, Dialect};
use super::wake::Subscription;
use super::{
    Backend, Capabilities, Init, LeaseInfo, LeaseKey, ResolveError, Schema, Store, StoreError,
    Target,
};
use crate::clock::{BootClock, Clock};

pub const TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT,
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0, -- CLOCK_BOOTTIME in ms, of boot `boot_id`
    boot_id    TEXT NOT NULL DEFAULT ''
)";

pub const SCHEMA: Schema = Schema {
    dialect: "SQLite (the embedded store; leaderrun creates it by itself)",
    sql: TABLE_SQL,
};

// SQLite stores whatever it is given in any column, so a row written by hand
// (or by an older leaderrun that did not clamp) may hold a REAL, a huge
// integer or text where a time should be. Every read and every condition
// goes through CAST (text becomes 0, a huge REAL the largest integer), and
// remaining times are clamped to ±MAX_MS, so such a row can neither fail a
// listing nor look live forever.

// ?1 name, ?2 holder, ?3 now (boot ms), ?4 lease ms, ?5 boot id
const ACQUIRE_SQL: &str = "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id)
     VALUES (?1, ?2, 1, ?3 + ?4, ?5)
     ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder, epoch = CAST(leader_lease.epoch AS INTEGER) + 1,
            expires_at = excluded.expires_at, boot_id = excluded.boot_id
      WHERE leader_lease.holder IS NULL OR leader_lease.boot_id <> excluded.boot_id
         OR CAST(leader_lease.expires_at AS INTEGER) <= ?3
     RETURNING epoch";

// ?1 name, ?2 holder, ?3 epoch, ?4 now, ?5 lease ms, ?6 boot id
const RENEW_SQL: &str = "UPDATE leader_lease SET expires_at = ?4 + ?5
      WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND boot_id = ?6
        AND CAST(expires_at AS INTEGER) > ?4";

// ?1 name, ?2 holder, ?3 epoch, ?4 now, ?5 keep ms, ?6 boot id
const RELEASE_SQL: &str = "UPDATE leader_lease
        SET holder = CASE WHEN ?5 > 0 THEN holder END, expires_at = ?4 + ?5
      WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND boot_id = ?6";

/// What `LeaseInfo` is read from (see `sql::lease_info`); ?1 now, ?2 boot
/// id: a lease from another boot has expired.
macro_rules! columns {
    () => {
        "CAST(name AS TEXT), CAST(holder AS TEXT), CAST(epoch AS INTEGER),
         CASE WHEN boot_id = ?2
              THEN min(max(CAST(expires_at AS INTEGER), ?1 - 315360000000), ?1 + 315360000000) - ?1
              ELSE -1 END"
    };
}

// ?1 now, ?2 boot id, ?3 name, ?4 epoch or NULL
const INSPECT_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease WHERE name = ?3");
const LIST_SQL: &str = concat!("SELECT ", columns!(), " FROM leader_lease ORDER BY name");
const CLEARABLE_SQL: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM leader_lease WHERE name = ?3 AND holder IS NOT NULL
        AND (?4 IS NULL OR CAST(epoch AS INTEGER) = ?4)"
);

pub struct SqliteStore {
    s: Session<Lite>,
}

/// The file, and what is learnt once per process.
struct Lite {
    path: PathBuf,
    busy: Duration,
    /// `mode=rw` in the URL: use an existing file, never create one.
    create: bool,
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
    let mut store = SqliteStore::new(path, t.call_timeout);
    store.s.c.create = create;
    Ok(Store::Sqlite(store))
}

/// The embedded default store (no store configured).
pub fn open_default(busy: Duration) -> Result<Store, ResolveError> {
    Ok(Store::Sqlite(SqliteStore::new(default_path()?, busy)))
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

impl SqliteStore {
    /// `busy` bounds how long a call waits for another process's write lock.
    fn new(path: PathBuf, busy: Duration) -> SqliteStore {
        SqliteStore {
            s: Session::new(Lite {
                path,
                busy,
                create: true,
            }),
        }
    }

    /// Renew and release: one UPDATE naming name, holder, epoch and boot,
    /// with now and a duration in ms; true when it matched the lease.
    async fn update(
        &mut self,
        sql: &'static str,
        what: &str,
        (key, epoch, d): (&LeaseKey, i64, Duration),
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let ms = millis(d);
        self.write(timeout, what, async |c, now, boot| {
            let done = sqlx::query(sql)
                .bind(&key.name)
                .bind(&key.holder)
                .bind(epoch)
                .bind(now)
                .bind(ms)
                .bind(boot)
                .execute(c)
                .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Run one statement in a `BEGIN IMMEDIATE` transaction. `now` (boot
    /// clock, ms) is read once the write lock is held.
    async fn write<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: impl AsyncFnOnce(&mut SqliteConnection, i64, String) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        let boot = boot_id()?;
        self.s
            .call(timeout, what, async move |conn, _| {
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                let v = f(&mut *tx, now_ms(), boot).await?;
                tx.commit().await?;
                Ok(v)
            })
            .await
    }
}

impl Connect for Lite {
    type Conn = SqliteConnection;
    type Error = sqlx::Error;

    fn shown(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    async fn connect(&mut self, _deadline: Instant) -> Result<SqliteConnection, StoreError> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if self.create {
                create_private_dir(dir).map_err(|e| {
                    let said = format!("cannot create the store directory {}: {e}", dir.display());
                    StoreError::fatal(said).with_source(e)
                })?;
            }
        }
        let opts = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|e| StoreError::fatal(e.to_string()))?
            .filename(&self.path)
            .create_if_missing(self.create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .pragma("wal_autocheckpoint", WAL_PAGES)
            .busy_timeout(self.busy)
            .disable_statement_logging();
        let context = format!("cannot open the store {}", self.shown());
        let mut conn =
            SqliteConnection::connect_with(&opts).await.map_err(|e| {
                match why_unopenable(&self.path) {
                    Some(why) => StoreError::fatal(format!("{context}: {why}")),
                    None => sql::classify::<Lite>(&context, e),
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

impl Backend for SqliteStore {
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let ms = millis(lease);
        self.write(timeout, "cannot acquire in", async |c, now, boot| {
            let row = sqlx::query(ACQUIRE_SQL)
                .bind(&key.name)
                .bind(&key.holder)
                .bind(now)
                .bind(ms)
                .bind(boot)
                .fetch_optional(c)
                .await?;
            row.map(|r| r.try_get::<i64, _>(0)).transpose()
        })
        .await
    }

    async fn renew(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.update(RENEW_SQL, "cannot renew in", (key, epoch, lease), timeout)
            .await
    }

    async fn release(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let freed = self
            .update(
                RELEASE_SQL,
                "cannot release in",
                (key, epoch, keep),
                timeout,
            )
            .await?;
        // After the commit: a waiter woken now finds the lease free.
        if freed && keep.is_zero() {
            touch(&self.s.c.path, &key.name);
        }
        Ok(freed)
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        self.write(timeout, "cannot read", async |c, now, boot| {
            let row = sqlx::query(INSPECT_SQL)
                .bind(now)
                .bind(boot)
                .bind(name)
                .fetch_optional(c)
                .await?;
            row.map(|r| lease_info(&r)).transpose()
        })
        .await
    }

    fn describe(&self) -> String {
        self.s.c.shown()
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

    fn wakeups(&self, name: &str) -> Option<Subscription> {
        Some(Subscription::Sqlite(FileWakeups::new(
            self.s.c.path.clone(),
            name,
        )))
    }

    fn schema(&self) -> Option<Schema> {
        Some(SCHEMA)
    }

    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.write(timeout, "cannot use", async |_, _, _| Ok(Init::Ready))
            .await
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        self.write(timeout, "cannot read", async |c, now, boot| {
            let rows = sqlx::query(LIST_SQL)
                .bind(now)
                .bind(boot)
                .fetch_all(c)
                .await?;
            rows.iter().map(lease_info).collect()
        })
        .await
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let cleared = self
            .write(timeout, "cannot release in", async |c, now, boot| {
                let row = sqlx::query(CLEARABLE_SQL)
                    .bind(now)
                    .bind(boot)
                    .bind(name)
                    .bind(epoch)
                    .fetch_optional(&mut *c)
                    .await?;
                let Some(row) = row else { return Ok(None) };
                let before = lease_info(&row)?;
                sqlx::query(
                    "UPDATE leader_lease SET holder = NULL, expires_at = ?2 WHERE name = ?1",
                )
                .bind(name)
                .bind(now)
                .execute(&mut *c)
                .await?;
                Ok(Some(before))
            })
            .await?;
        if cleared.is_some() {
            touch(&self.s.c.path, name);
        }
        Ok(cleared)
    }
}
