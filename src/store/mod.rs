//! The lease store: where the lease lives and whose clock decides expiry.
//!
//! Every implementation must give these semantics (contract §2.2 and §2.5):
//!
//! * `acquire` succeeds only when the lease has no holder or has expired *by
//!   the store's own clock*, and then raises the epoch by exactly one, in one
//!   atomic step (two racers can never both succeed);
//! * `renew` names holder *and* epoch, never raises the epoch, and matches
//!   nothing once someone else has acquired or the lease has expired;
//! * `release` names holder and epoch, so a stale holder cannot release its
//!   successor's lease.
//!
//! Calls take a `timeout` as a second guard; the elector also races every
//! call against its own give-up timer, so a hung call never delays step-down.

pub mod postgres;
pub mod sqlite;

use std::time::Duration;

use crate::redact::Redacted;

/// Why a store call failed. The caller must tell these apart: a waiting
/// contender retries `Unavailable` but gives up on `Fatal`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Network trouble, a timeout, a restarting server: may heal by itself.
    #[error("{0}")]
    Unavailable(String),
    /// Wrong password, missing permission, unusable configuration: retrying
    /// will not help.
    #[error("{0}")]
    Fatal(String),
}

/// What the store says about a lease, by the store's own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    pub name: String,
    pub holder: Option<String>,
    pub epoch: i64,
    /// Milliseconds until expiry; negative when already expired.
    pub expires_in_ms: i64,
}

impl LeaseInfo {
    pub fn is_live(&self) -> bool {
        self.holder.is_some() && self.expires_in_ms > 0
    }
}

pub trait Store {
    /// Take the lease for `lease`; `Some(epoch)` when taken, `None` when held.
    fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<Option<i64>, StoreError>>;

    /// Extend the lease to `lease` from now; `false` when it is no longer ours.
    fn renew(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<bool, StoreError>>;

    /// Give the lease up. With `keep` > 0 the holder stays recorded and the
    /// lease ends `keep` from now (for `--min-hold`); otherwise it is free at
    /// once. `false` when it was no longer ours.
    fn release(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<bool, StoreError>>;

    fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<Option<LeaseInfo>, StoreError>>;
}

/// What operators need beyond the lease loop (the subcommands).
pub trait StoreAdmin {
    /// Create the lease table when missing (connecting does).
    fn init(
        &mut self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<(), StoreError>>;
    /// Every lease, by name.
    fn list(
        &mut self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<Vec<LeaseInfo>, StoreError>>;
    /// Clear the holder (optionally only at `epoch`); the lease is free at
    /// once and the next acquisition still raises the epoch. Returns the
    /// lease as it was, or `None` when there was nothing to clear.
    fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<Option<LeaseInfo>, StoreError>>;
    /// The SQL that creates the table, for `init --print`.
    fn table_sql(&self) -> &'static str;
}

/// The store a URL names, opened lazily (the first call connects).
pub enum AnyStore {
    Postgres(Box<postgres::PgStore>),
    Sqlite(sqlite::SqliteStore),
}

/// A store URL that was understood, before anything is connected.
#[derive(Debug)]
pub enum StoreUrl {
    Postgres(String),
    Sqlite(std::path::PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("unknown store scheme in {0} (expected postgres://, postgresql:// or sqlite://PATH)")]
    UnknownScheme(Redacted),
    #[error("sqlite:// needs a file path, as in sqlite:///var/lib/leaderrun/leases.db")]
    NoPath,
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl, UrlError> {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(url.to_string()))
        } else if lower.starts_with("sqlite://") {
            let path = &url["sqlite://".len()..];
            if path.is_empty() {
                return Err(UrlError::NoPath);
            }
            Ok(StoreUrl::Sqlite(std::path::PathBuf::from(path)))
        } else {
            Err(UrlError::UnknownScheme(Redacted::new(url)))
        }
    }
}

impl AnyStore {
    /// Check the URL's syntax without connecting; errors here are usage
    /// errors (exit 2), not store failures.
    pub fn open(
        url: &StoreUrl,
        app_name: &str,
        statement_timeout: Duration,
    ) -> Result<AnyStore, String> {
        match url {
            StoreUrl::Postgres(u) => postgres::PgStore::new(u, app_name, statement_timeout)
                .map(|s| AnyStore::Postgres(Box::new(s))),
            StoreUrl::Sqlite(p) => Ok(AnyStore::Sqlite(sqlite::SqliteStore::new(
                p.clone(),
                statement_timeout,
            ))),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            AnyStore::Postgres(s) => s.redacted().to_string(),
            AnyStore::Sqlite(s) => format!("sqlite://{}", s.path().display()),
        }
    }
}

/// The same call on whichever store this is.
macro_rules! each {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Postgres($s) => $call,
            AnyStore::Sqlite($s) => $call,
        }
    };
}

impl Store for AnyStore {
    async fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        each!(self, s => s.acquire(name, holder, lease, timeout).await)
    }

    async fn renew(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.renew(name, holder, epoch, lease, timeout).await)
    }

    async fn release(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.release(name, holder, epoch, keep, timeout).await)
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        each!(self, s => s.inspect(name, timeout).await)
    }
}

impl StoreAdmin for AnyStore {
    async fn init(&mut self, timeout: Duration) -> Result<(), StoreError> {
        each!(self, s => s.init(timeout).await)
    }
    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        each!(self, s => s.list(timeout).await)
    }
    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        each!(self, s => s.clear(name, epoch, timeout).await)
    }
    fn table_sql(&self) -> &'static str {
        each!(self, s => s.table_sql())
    }
}

/// The store for a `--store` value (or `DATABASE_URL`, or the embedded
/// default). Errors are usage errors (exit 2).
pub fn resolve(
    store: Option<String>,
    app_name: &str,
    call_timeout: Duration,
) -> Result<AnyStore, String> {
    let url = store
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()));
    let url = match url {
        Some(u) => StoreUrl::parse(&u).map_err(|e| e.to_string())?,
        None => StoreUrl::Sqlite(sqlite::default_path()?),
    };
    let mut app_name = app_name.to_string();
    app_name.truncate(63);
    AnyStore::open(&url, &app_name, call_timeout)
}

/// A `LeaseInfo` from a row whose first four columns are name, holder,
/// epoch and milliseconds to expiry (each store's `columns!()`).
pub(crate) fn lease_info<R: sqlx::Row>(r: &R) -> Result<LeaseInfo, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(LeaseInfo {
        name: r.try_get(0)?,
        holder: r.try_get(1)?,
        epoch: r.try_get(2)?,
        expires_in_ms: r.try_get(3)?,
    })
}

/// Milliseconds for the store, refusing what does not fit (never panics).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
