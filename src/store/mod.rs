//! The lease store: where the lease lives and whose clock decides expiry.
//!
//! # The contract every store keeps
//!
//! (The same text, with the per-store table, is in `docs/stores.md`.)
//!
//! 1. **Acquire is atomic, with exactly one winner.** `acquire` succeeds only
//!    when the lease has no holder or has expired *by the store's own clock*,
//!    and it takes the lease in the same atomic step; of any number of racers,
//!    at most one gets `Some(epoch)`, the others `None`.
//! 2. **Expiry is decided by the store's clock, and never earlier than
//!    `sent + L`.** `sent` is when the elector *sent* the call (on its boot
//!    clock); the store starts counting `L` no earlier than it received the
//!    call, so with clocks that agree on the rate of time the lease cannot
//!    end before `sent + L`. No store compares a host's wall clock with its
//!    own.
//! 3. **The epoch is strictly increasing per name and never reused**, across
//!    every acquisition, whoever acquires; it rises by exactly one where the
//!    store can do that atomically (all SQL stores do). Renewals never change
//!    it.
//! 4. **Renew and release are refused for anything but the current grant.**
//!    Both name holder *and* epoch; after a takeover, an expiry or a release
//!    they match nothing and change nothing.
//! 5. **Errors are classified.** [`StoreError::Unavailable`]: may heal by
//!    itself (network, restarting or read-only server, lock timeout): a
//!    waiting contender retries. [`StoreError::Fatal`]: will not heal (wrong
//!    password, missing permission, unusable configuration): retrying is
//!    pointless. *Superseded* is not an error: `renew`/`release` return
//!    `Ok(false)` and `acquire` returns `Ok(None)`, and the elector acts on
//!    that at once.
//!
//! A store also says what it can promise ([`Capabilities`]): the lease it
//! really grants for a requested `L` (granularity, minimum, maximum), and
//! whether it can push wake-ups. The run form validates its timing against
//! the granted lease ([`Capabilities::grant`]), not the requested one.
//!
//! Calls take a `timeout` as a second guard; the elector also races every
//! call against its own give-up timer, so a hung call never delays step-down.
//!
//! # Adding a store
//!
//! One file implementing [`Store`] and [`StoreAdmin`], and one line in
//! [`REGISTRY`] naming its URL schemes and its constructor.

mod error;
pub mod etcd;
mod lease;
pub mod mysql;
pub mod postgres;
pub mod redis;
mod sql;
pub mod sqlite;
mod target;
pub mod wake;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use error::StoreError;
pub use lease::{Capabilities, Init, LeaseInfo, Replication, Schema, MAX_STORED};
pub use target::{choose, Origin, ResolveError, Target};
use target::{known_schemes, parse};

/// One line per store: the URL schemes it answers to and how to open it.
/// `open` checks the URL's syntax and connects to nothing.
pub const REGISTRY: &[(&[&str], Open)] = &[
    (&["postgres", "postgresql"], postgres::open),
    (&["mysql", "mariadb"], mysql::open),
    (&["etcd", "etcds"], etcd::open),
    (&["redis", "rediss"], redis::open),
    (&["sqlite"], sqlite::open),
];

/// A store constructor: the parsed URL in, a store (not yet connected) out,
/// or a one-line usage error that never contains the password.
pub type Open = fn(&Target<'_>) -> Result<AnyStore, String>;

/// The lease loop's calls (the elector's view of a store).
pub trait Store {
    /// Take the lease for `lease`; `Some(epoch)` when taken, `None` when held.
    fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// Extend the lease to `lease` from now; `false` when it is no longer ours.
    fn renew(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>>;

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
    ) -> impl Future<Output = Result<bool, StoreError>>;

    fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<LeaseInfo>, StoreError>>;
}

/// Everything beyond the lease loop: what the store is, what it promises,
/// and the operators' subcommands. Every store implements all of it.
pub trait StoreAdmin: Store {
    /// The store as shown in logs and errors; never contains a password.
    fn describe(&self) -> String;

    fn capabilities(&self) -> Capabilities;

    /// A subscription to "this lease was freed" on a connection of its own
    /// (src/store/wake.rs), for stores whose capabilities say they push
    /// wake-ups; `None` elsewhere. Connects to nothing until armed.
    fn wakeups(&self) -> Option<wake::AnyWakeups> {
        None
    }

    /// The table's SQL, for stores that keep one.
    fn schema(&self) -> Option<Schema> {
        None
    }

    /// Create what the store needs (the lease table), when missing.
    fn init(&mut self, _timeout: Duration) -> impl Future<Output = Result<Init, StoreError>> {
        async { Ok(Init::NothingToDo) }
    }

    /// What the store's replication can lose (for `status`). Stores that
    /// cannot tell keep the default.
    fn replication(
        &mut self,
        _timeout: Duration,
    ) -> impl Future<Output = Result<Replication, StoreError>> {
        async { Ok(Replication::unknown("not known")) }
    }

    /// Every lease, by name. A row a store cannot make sense of is shown
    /// clamped, never fails the whole list.
    fn list(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<LeaseInfo>, StoreError>>;

    /// Clear the holder (optionally only at `epoch`); the lease is free at
    /// once and the next acquisition still raises the epoch. Returns the
    /// lease as it was, or `None` when there was nothing to clear.
    fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<LeaseInfo>, StoreError>>;
}

type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + 'a>>;

/// [`Store`] + [`StoreAdmin`] as a trait object, so the registry can hand out
/// any store as one type. Implemented for every store; call it through
/// [`AnyStore`]'s `Store`/`StoreAdmin` impls.
pub trait DynStore {
    fn acquire_dyn<'a>(
        &'a mut self,
        n: &'a str,
        h: &'a str,
        l: Duration,
        t: Duration,
    ) -> Fut<'a, Option<i64>>;
    fn renew_dyn<'a>(
        &'a mut self,
        n: &'a str,
        h: &'a str,
        e: i64,
        l: Duration,
        t: Duration,
    ) -> Fut<'a, bool>;
    fn release_dyn<'a>(
        &'a mut self,
        n: &'a str,
        h: &'a str,
        e: i64,
        k: Duration,
        t: Duration,
    ) -> Fut<'a, bool>;
    fn inspect_dyn<'a>(&'a mut self, n: &'a str, t: Duration) -> Fut<'a, Option<LeaseInfo>>;
    fn describe_dyn(&self) -> String;
    fn capabilities_dyn(&self) -> Capabilities;
    fn wakeups_dyn(&self) -> Option<wake::AnyWakeups>;
    fn schema_dyn(&self) -> Option<Schema>;
    fn init_dyn(&mut self, t: Duration) -> Fut<'_, Init>;
    fn replication_dyn(&mut self, t: Duration) -> Fut<'_, Replication>;
    fn list_dyn(&mut self, t: Duration) -> Fut<'_, Vec<LeaseInfo>>;
    fn clear_dyn<'a>(
        &'a mut self,
        n: &'a str,
        e: Option<i64>,
        t: Duration,
    ) -> Fut<'a, Option<LeaseInfo>>;
}

impl<S: StoreAdmin> DynStore for S {
    fn acquire_dyn<'a>(
        &'a mut self,
        n: &'a str,
        h: &'a str,
        l: Duration,
        t: Duration,
    ) -> Fut<'a, Option<i64>> {
        Box::pin(self.acquire(n, h, l, t))
    }
    fn renew_dyn<'a>(
        &'a mut self,
        n: &'a str,
        h: &'a str,
        e: i64,
        l: Duration,
        t: Duration,
    ) -> Fut<'a, bool> {
        Box::pin(self.renew(n, h, e, l, t))
    }
    fn release_dyn<'a>(
        &'a mut self,
        n: &'a str,
        h: &'a str,
        e: i64,
        k: Duration,
        t: Duration,
    ) -> Fut<'a, bool> {
        Box::pin(self.release(n, h, e, k, t))
    }
    fn inspect_dyn<'a>(&'a mut self, n: &'a str, t: Duration) -> Fut<'a, Option<LeaseInfo>> {
        Box::pin(self.inspect(n, t))
    }
    fn describe_dyn(&self) -> String {
        self.describe()
    }
    fn capabilities_dyn(&self) -> Capabilities {
        self.capabilities()
    }
    fn wakeups_dyn(&self) -> Option<wake::AnyWakeups> {
        self.wakeups()
    }
    fn schema_dyn(&self) -> Option<Schema> {
        self.schema()
    }
    fn init_dyn(&mut self, t: Duration) -> Fut<'_, Init> {
        Box::pin(self.init(t))
    }
    fn replication_dyn(&mut self, t: Duration) -> Fut<'_, Replication> {
        Box::pin(self.replication(t))
    }
    fn list_dyn(&mut self, t: Duration) -> Fut<'_, Vec<LeaseInfo>> {
        Box::pin(self.list(t))
    }
    fn clear_dyn<'a>(
        &'a mut self,
        n: &'a str,
        e: Option<i64>,
        t: Duration,
    ) -> Fut<'a, Option<LeaseInfo>> {
        Box::pin(self.clear(n, e, t))
    }
}

/// Any store the registry can open.
pub type AnyStore = Box<dyn DynStore>;

impl Store for AnyStore {
    async fn acquire(
        &mut self,
        n: &str,
        h: &str,
        l: Duration,
        t: Duration,
    ) -> Result<Option<i64>, StoreError> {
        self.as_mut().acquire_dyn(n, h, l, t).await
    }
    async fn renew(
        &mut self,
        n: &str,
        h: &str,
        e: i64,
        l: Duration,
        t: Duration,
    ) -> Result<bool, StoreError> {
        self.as_mut().renew_dyn(n, h, e, l, t).await
    }
    async fn release(
        &mut self,
        n: &str,
        h: &str,
        e: i64,
        k: Duration,
        t: Duration,
    ) -> Result<bool, StoreError> {
        self.as_mut().release_dyn(n, h, e, k, t).await
    }
    async fn inspect(&mut self, n: &str, t: Duration) -> Result<Option<LeaseInfo>, StoreError> {
        self.as_mut().inspect_dyn(n, t).await
    }
}

impl StoreAdmin for AnyStore {
    fn describe(&self) -> String {
        self.as_ref().describe_dyn()
    }
    fn capabilities(&self) -> Capabilities {
        self.as_ref().capabilities_dyn()
    }
    fn wakeups(&self) -> Option<wake::AnyWakeups> {
        self.as_ref().wakeups_dyn()
    }
    fn schema(&self) -> Option<Schema> {
        self.as_ref().schema_dyn()
    }
    async fn init(&mut self, t: Duration) -> Result<Init, StoreError> {
        self.as_mut().init_dyn(t).await
    }
    async fn replication(&mut self, t: Duration) -> Result<Replication, StoreError> {
        self.as_mut().replication_dyn(t).await
    }
    async fn list(&mut self, t: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        self.as_mut().list_dyn(t).await
    }
    async fn clear(
        &mut self,
        n: &str,
        e: Option<i64>,
        t: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        self.as_mut().clear_dyn(n, e, t).await
    }
}

/// Open the store a string names (or the embedded default for `None`),
/// checking its syntax only; nothing is connected until the first call.
/// Errors never contain the string itself.
pub fn open(
    choice: Option<(&str, Origin)>,
    app_name: &str,
    call_timeout: Duration,
) -> Result<AnyStore, ResolveError> {
    let mut app_name = app_name.to_string();
    app_name.truncate(63);
    let Some((raw, origin)) = choice else {
        return sqlite::open_default(call_timeout);
    };
    let url = parse(raw, origin)?;
    let open = REGISTRY
        .iter()
        .find(|(schemes, _)| schemes.contains(&url.scheme()))
        .map(|(_, open)| *open)
        .ok_or_else(|| {
            ResolveError::Usage(format!(
                "the store URL from {origin} has an unknown scheme {}:// (expected {})",
                url.scheme(),
                known_schemes()
            ))
        })?;
    let target = Target {
        url: &url,
        app_name: &app_name,
        call_timeout,
    };
    open(&target).map_err(|e| ResolveError::Usage(format!("the store URL from {origin} {e}")))
}

/// [`choose`] then [`open`]: what the run form and the subcommands call.
pub fn resolve(
    given: Option<String>,
    origin: Origin,
    app_name: &str,
    call_timeout: Duration,
) -> Result<AnyStore, ResolveError> {
    let choice = choose(given, origin);
    open(
        choice.as_ref().map(|(s, o)| (s.as_str(), *o)),
        app_name,
        call_timeout,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store says it pushes wake-ups exactly when it hands out a
    /// subscription: the docs' push column and the run form agree.
    #[test]
    fn stores_that_push_offer_a_subscription() {
        for (raw, pushes) in [
            ("postgres://u@h/db", true),
            ("redis://h:6379/0", true),
            ("etcd://h:2379", true),
            ("sqlite:///tmp/x.db", true),
            ("mysql://u@h/db", false),
        ] {
            let s = open(Some((raw, Origin::Flag)), "t", Duration::from_secs(1)).expect(raw);
            assert_eq!(s.capabilities().pushes_wakeups, pushes, "{raw}");
            assert_eq!(s.wakeups().is_some(), pushes, "{raw}");
        }
    }
}
