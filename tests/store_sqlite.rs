//! The embedded SQLite store's semantics, on real files.

use std::path::Path;
use std::time::Duration;

use crate::support::{join_all, TempDir};
use leaderrun::store::sqlite::SqliteStore;
use leaderrun::store::{Store, StoreError};
use sqlx::Connection;

const L: Duration = Duration::from_secs(5);
const T: Duration = Duration::from_secs(5);

fn store(path: &Path) -> SqliteStore {
    SqliteStore::new(path.to_path_buf(), Duration::from_secs(2))
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

#[test]
fn seed_five_steps() {
    let dir = TempDir::new("sq5");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let (mut a, mut b) = (store(&db), store(&db));
        assert_eq!(a.acquire("sweeper", "node-a", L, T).await.unwrap(), Some(1));
        assert_eq!(b.acquire("sweeper", "node-b", L, T).await.unwrap(), None);
        let before = b
            .inspect("sweeper", T)
            .await
            .unwrap()
            .unwrap()
            .expires_in_ms
            .expect("an expiry");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(a.renew("sweeper", "node-a", 1, L, T).await.unwrap());
        let after = b.inspect("sweeper", T).await.unwrap().unwrap();
        assert_eq!(after.epoch, 1, "renewal keeps the epoch");
        assert!(
            after.expires_in_ms.expect("an expiry") > before - 20 + 10,
            "renewal moves expiry: {before} -> {after:?}"
        );
        sql(&db, "UPDATE leader_lease SET expires_at = 0").await;
        assert_eq!(b.acquire("sweeper", "node-b", L, T).await.unwrap(), Some(2));
        assert!(!a.renew("sweeper", "node-a", 1, L, T).await.unwrap());
        let info = a.inspect("sweeper", T).await.unwrap().unwrap();
        assert_eq!((info.holder.as_deref(), info.epoch), (Some("node-b"), 2));
    });
}

/// Boot-clock values from another boot mean nothing: a row written under a
/// different boot id is free, however far in the future its expiry looks.
#[test]
fn a_different_boot_id_frees_the_lease() {
    let dir = TempDir::new("sqboot");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let (mut a, mut b) = (store(&db), store(&db));
        assert_eq!(
            a.acquire("n", "a", Duration::from_secs(3600), T)
                .await
                .unwrap(),
            Some(1)
        );
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), None);
        sql(
            &db,
            "UPDATE leader_lease SET boot_id = '00000000-0000-0000-0000-000000000000'",
        )
        .await;
        assert_eq!(
            b.acquire("n", "b", L, T).await.unwrap(),
            Some(2),
            "lease from another boot is free"
        );
        // ...and the old holder's renewal names a boot that is gone.
        assert!(!a.renew("n", "a", 1, L, T).await.unwrap());
    });
}

#[test]
fn release_and_min_hold() {
    let dir = TempDir::new("sqrel");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let (mut a, mut b) = (store(&db), store(&db));
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
        assert!(
            !b.release("n", "a", 9, Duration::ZERO, T).await.unwrap(),
            "stale epoch"
        );
        assert!(a
            .release("n", "a", 1, Duration::from_millis(300), T)
            .await
            .unwrap());
        assert_eq!(
            b.acquire("n", "b", L, T).await.unwrap(),
            None,
            "kept for min-hold"
        );
        tokio::time::sleep(Duration::from_millis(320)).await;
        assert_eq!(b.acquire("n", "b", L, T).await.unwrap(), Some(2));
        assert!(b.release("n", "b", 2, Duration::ZERO, T).await.unwrap());
        assert_eq!(
            a.acquire("n", "a", L, T).await.unwrap(),
            Some(3),
            "free at once"
        );
    });
}

#[test]
fn racing_acquires_have_one_winner() {
    let dir = TempDir::new("sqrace");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let mut stores: Vec<SqliteStore> = (0..8).map(|_| store(&db)).collect();
        for s in stores.iter_mut() {
            s.inspect("warmup", T).await.unwrap();
        }
        for round in 1..=5i64 {
            let mut won = Vec::new();
            let futs: Vec<_> = stores
                .iter_mut()
                .enumerate()
                .map(|(i, s)| {
                    Box::pin(
                        async move { s.acquire("race", &format!("c{i}"), L, T).await.unwrap() },
                    )
                })
                .collect();
            for r in join_all(futs).await {
                won.extend(r);
            }
            assert_eq!(won, vec![round], "round {round}");
            sql(&db, "UPDATE leader_lease SET expires_at = 0").await;
        }
    });
}

#[test]
fn names_are_parameters_not_sql() {
    let dir = TempDir::new("sqinj");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let mut a = store(&db);
        let evil = "x'); DROP TABLE leader_lease; --";
        assert_eq!(a.acquire(evil, "h", L, T).await.unwrap(), Some(1));
        assert_eq!(a.inspect(evil, T).await.unwrap().unwrap().name, evil);
        assert_eq!(a.acquire("other", "h", L, T).await.unwrap(), Some(1));
    });
}

#[test]
fn a_held_write_lock_is_waited_for_within_the_timeout_only() {
    let dir = TempDir::new("sqbusy");
    let db = dir.file("leases.db");
    rt().block_on(async {
        let mut a = store(&db);
        a.inspect("n", T).await.unwrap();
        // Another process holds the write lock and does not let go.
        let url = format!("sqlite://{}", db.display());
        let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap();
        let t0 = std::time::Instant::now();
        let err = a
            .acquire("n", "a", L, Duration::from_millis(400))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            t0.elapsed() < Duration::from_millis(900),
            "{:?}",
            t0.elapsed()
        );
        sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
        assert_eq!(a.acquire("n", "a", L, T).await.unwrap(), Some(1));
    });
}

#[test]
fn a_corrupt_file_is_a_fatal_error_naming_the_path() {
    let dir = TempDir::new("sqbad");
    let db = dir.file("leases.db");
    std::fs::write(&db, vec![0x5a; 8192]).unwrap();
    rt().block_on(async {
        let err = store(&db).acquire("n", "a", L, T).await.unwrap_err();
        assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
        assert!(err.to_string().contains(&db.display().to_string()), "{err}");
    });
}
