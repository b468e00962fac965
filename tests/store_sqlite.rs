//! What the embedded SQLite store does beyond the contract
//! (tests/conformance.rs checks that against every store), on real files:
//! a lease from another boot, another process's write lock, a corrupt file,
//! a lease file per name, and the move of leases an older release kept in
//! the store's one file.

use std::path::Path;
use std::time::Duration;

use crate::support::TempDir;
use leaderrun::store::sqlite::{lease_file, MOVED};
use leaderrun::store::{open, LeaseLock, Lock, Origin, Store};
use sqlx::Connection;

const L: Duration = Duration::from_secs(5);
const T: Duration = Duration::from_secs(5);

/// The store whose file is `path`.
fn store(path: &Path) -> Store {
    let url = format!("sqlite://{}", path.display());
    match open(
        Some((&url, Origin::Flag)),
        "leaderrun-test",
        Duration::from_secs(2),
    ) {
        Ok(s) => s,
        Err(e) => panic!("cannot open {url}: {e}"),
    }
}

/// A lock on `name` for `holder` in the store whose file is `path`.
fn lock(path: &Path, name: &str, holder: &str) -> Lock {
    store(path).lock(name, holder)
}

/// The file lease `name` lives in.
fn file_of(db: &Path, name: &str) -> std::path::PathBuf {
    lease_file(db, name).expect("a file name")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Change rows behind the store's back, as an operator (or a reboot) would.
async fn sql(path: &Path, q: &str) {
    let url = format!("sqlite://{}", path.display());
    let mut c = sqlx::SqliteConnection::connect(&url).await.expect("open");
    sqlx::raw_sql(q).execute(&mut c).await.expect("sql");
}

/// The table as the releases before `--once-per` created it (their store
/// file has no run record columns).
const PREVIOUS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT,
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0,
    boot_id    TEXT NOT NULL DEFAULT ''
)";

/// Boot-clock values from another boot mean nothing: a row written under a
/// different boot id is free, however far in the future its expiry looks.
#[test]
fn a_different_boot_id_frees_the_lease() {
    let dir = TempDir::new("sqboot");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let (mut a, mut b) = (lock(&db, "n", "a"), lock(&db, "n", "b"));
        assert_eq!(
            a.acquire(Duration::from_secs(3600), T).await.unwrap(),
            Some(1)
        );
        assert_eq!(b.acquire(L, T).await.unwrap(), None);
        sql(
            &file_of(&db, "n"),
            "UPDATE leader_lease SET boot_id = '00000000-0000-0000-0000-000000000000'",
        )
        .await;
        assert_eq!(
            b.acquire(L, T).await.unwrap(),
            Some(2),
            "lease from another boot is free"
        );
        // ...and the old holder's renewal names a boot that is gone.
        assert!(!a.renew(1, L, T).await.unwrap());
    });
}

#[test]
fn a_held_write_lock_is_waited_for_within_the_timeout_only() {
    let dir = TempDir::new("sqbusy");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let mut a = lock(&db, "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        assert!(a.release(1, Duration::ZERO, T).await.unwrap());
        // Another process holds the lease file's write lock and does not
        // let go (it runs: it is not ended, it is waited for).
        let url = format!("sqlite://{}", file_of(&db, "n").display());
        let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap();
        let t0 = std::time::Instant::now();
        let err = a.acquire(L, Duration::from_millis(400)).await.unwrap_err();
        assert!(err.may_heal(), "{err:?}");
        assert!(
            t0.elapsed() < Duration::from_millis(900),
            "{:?}",
            t0.elapsed()
        );
        sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(2));
    });
}

#[test]
fn a_corrupt_file_is_a_fatal_error_naming_the_path() {
    let dir = TempDir::new("sqbad");
    let db = dir.file("leases.db");
    std::fs::write(&db, vec![0x5a; 8192]).unwrap();
    rt().block_on(async {
        let err = lock(&db, "n", "a").acquire(L, T).await.unwrap_err();
        assert!(!err.may_heal(), "{err:?}");
        assert!(err.to_string().contains(&db.display().to_string()), "{err}");
    });
}

/// What the previous release ran to acquire, in the store's one file.
const OLD_ACQUIRE: &str = "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id)
     VALUES (?1, ?2, 1, ?3 + ?4, ?5)
     ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder, epoch = CAST(leader_lease.epoch AS INTEGER) + 1,
            expires_at = excluded.expires_at, boot_id = excluded.boot_id
      WHERE leader_lease.holder IS NULL OR leader_lease.boot_id <> excluded.boot_id
         OR CAST(leader_lease.expires_at AS INTEGER) <= ?3
     RETURNING epoch";

/// An acquisition by the previous release (its statement, on the store's
/// file, with the same boot clock and boot id): its epoch, or `None`.
async fn old_acquire(db: &Path, name: &str, holder: &str, lease_ms: i64) -> Option<i64> {
    use sqlx::Row;
    let url = format!("sqlite://{}", db.display());
    let mut c = sqlx::SqliteConnection::connect(&url).await.expect("open");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("boot clock");
    let now_ms = now.tv_sec() * 1000 + now.tv_nsec() / 1_000_000;
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut c)
        .await
        .expect("begin");
    let row = sqlx::query(OLD_ACQUIRE)
        .bind(name)
        .bind(holder)
        .bind(now_ms)
        .bind(lease_ms)
        .bind(boot.trim())
        .fetch_optional(&mut c)
        .await
        .expect("old acquire");
    sqlx::raw_sql("COMMIT")
        .execute(&mut c)
        .await
        .expect("commit");
    row.map(|r| r.get::<i64, _>(0))
}

/// An upgrade in place: leases the previous release kept in the store's one
/// file move to files of their own at their first acquisition, never below
/// their epoch; a lease an older leaderrun still holds stays its own until
/// it ends (read from the old file meanwhile), and once moved, an older
/// leaderrun can no longer acquire it.
#[test]
fn leases_of_the_previous_release_move_in_at_their_epoch() {
    let dir = TempDir::new("sqmove");
    let db = dir.file("leases.db");
    rt().block_on(async {
        // The previous release used "free" up to epoch 41 and holds "busy".
        std::fs::write(&db, "").expect("an empty database");
        sql(
            &db,
            &format!(
                "{PREVIOUS_TABLE_SQL}; INSERT INTO leader_lease VALUES ('free', NULL, 41, 0, '')"
            ),
        )
        .await;
        assert_eq!(old_acquire(&db, "busy", "old:1", 60_000).await, Some(1));
        assert!(!file_of(&db, "free").exists());

        let mut new = lock(&db, "free", "new");
        assert_eq!(new.acquire(L, T).await.unwrap(), Some(42));
        assert!(file_of(&db, "free").exists());
        // The previous release, still running during the upgrade, finds it held.
        assert_eq!(old_acquire(&db, "free", "old:2", 60_000).await, None);
        assert!(new.release(42, Duration::ZERO, T).await.unwrap());
        assert_eq!(old_acquire(&db, "free", "old:2", 60_000).await, None);
        assert_eq!(new.acquire(L, T).await.unwrap(), Some(43));

        // "busy" is held by the previous release: held for us too, and
        // shown as it is.
        let mut rival = lock(&db, "busy", "new");
        assert_eq!(rival.acquire(L, T).await.unwrap(), None);
        let seen = rival.inspect(T).await.unwrap().expect("busy is known");
        assert_eq!((seen.holder.as_deref(), seen.epoch), (Some("old:1"), 1));
        let mut s = store(&db);
        let names: Vec<(String, Option<String>)> = s
            .list(T)
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.name, l.holder))
            .collect();
        assert_eq!(
            names,
            [
                ("busy".to_string(), Some("old:1".to_string())),
                ("free".to_string(), Some("new".to_string()))
            ],
            "a moved row is not listed; the lease file's row is"
        );
        // An operator releases the old holder's lease where it is; the next
        // acquisition moves it.
        assert!(s.clear("busy", None, T).await.unwrap().is_some());
        assert_eq!(rival.acquire(L, T).await.unwrap(), Some(2));
        assert_eq!(old_acquire(&db, "busy", "old:1", 60_000).await, None);
        // A moved row is never cleared in the old file (that would let an
        // older leaderrun in beside the new holder).
        assert!(s.clear("busy", None, T).await.unwrap().is_some());
        assert_eq!(old_acquire(&db, "busy", "old:1", 60_000).await, None);
        let url = format!("sqlite://{}", db.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let holder: String =
            sqlx::query_scalar("SELECT holder FROM leader_lease WHERE name = 'busy'")
                .fetch_one(&mut c)
                .await
                .unwrap();
        assert_eq!(holder, MOVED);
    });
}
