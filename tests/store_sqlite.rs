//! What the embedded SQLite store does beyond the contract
//! (tests/conformance.rs checks that against every store), on real files:
//! a lease from another boot, another process's write lock, a corrupt file.

use std::path::Path;
use std::time::Duration;

use crate::support::TempDir;
use leaderrun::store::{open, LeaseLock, Lock, Origin};
use sqlx::Connection;

const L: Duration = Duration::from_secs(5);
const T: Duration = Duration::from_secs(5);

/// A lock on `name` for `holder` in the file at `path`; a call waits up to
/// 2 s for another process's write lock.
fn lock(path: &Path, name: &str, holder: &str) -> Lock {
    let url = format!("sqlite://{}", path.display());
    match open(
        Some((&url, Origin::Flag)),
        "leaderrun-test",
        Duration::from_secs(2),
    ) {
        Ok(s) => s.lock(name, holder),
        Err(e) => panic!("cannot open {url}: {e}"),
    }
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
            &db,
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
        a.inspect(T).await.unwrap();
        // Another process holds the write lock and does not let go.
        let url = format!("sqlite://{}", db.display());
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
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
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
