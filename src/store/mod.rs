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
//!    every acquisition, whoever acquires; it rises by exactly one, in the
//!    acquisition's own atomic step (every store here does; Postgres also
//!    jumps it past what an older WAL timeline handed out). Renewals never
//!    change it.
//! 4. **Renew and release are refused for anything but the current grant.**
//!    Both name holder *and* epoch; after a takeover, an expiry or a release
//!    they match nothing and change nothing.
//! 5. **Errors are classified** ([`StoreError::kind`]).
//!    [`ErrorKind::MayHeal`]: may heal by itself (network, restarting or
//!    read-only server, lock timeout): a waiting contender retries.
//!    [`ErrorKind::WillNotHeal`]: will not heal (wrong password, missing
//!    permission, unusable configuration), nor does [`ErrorKind::NoTable`]:
//!    retrying is pointless. *Superseded* is not an error: `renew`/`release`
//!    return `Ok(false)` and `acquire` returns `Ok(None)`, and the elector
//!    acts on that at once.
//!
//! A store also says what it can promise ([`Capabilities`]): the lease it
//! really grants for a requested `L` (granularity, minimum, maximum), and
//! whether it can push wake-ups. The run form validates its timing against
//! the granted lease ([`Capabilities::grant`]), not the requested one.
//!
//! Calls take a `timeout` as a second guard; the elector also races every
//! call against its own give-up timer, so a hung call never delays step-down.
//!
//! # The shape
//!
//! A [`Store`] is what a store string names: one of the backends below, not
//! yet connected. The operators' side (`status`, `release`, `init`) calls it
//! directly; the lease loop takes a [`Lock`] from it, bound to one lease name
//! and one holder (like client-go's resource lock), through the small
//! [`LeaseLock`] trait the elector is generic over.
//!
//! # Adding a store
//!
//! A folder (ZooKeeper's would be `zookeeper/`) whose `mod.rs` implements
//! `Backend` once, on a `Session` (session.rs) whose `Connect` says how to
//! connect and what its driver's errors mean; `url.rs` for its URL's own
//! parameters, `wake.rs` if it pushes wake-ups. Then, here: a variant of
//! [`Store`] with its arm in `each!`, and one line in [`REGISTRY`] (its
//! schemes, its Cargo feature, its constructor); a variant of
//! [`Subscription`] if it pushes; its feature in `Cargo.toml`; and one line
//! in the `conformance!` list of `tests/conformance.rs` (with its server in
//! `tests/support/stores.rs`), which checks this contract against it.
//! docs/stores.md, "Adding a store", says the same at length.

mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod lease;
#[cfg(feature = "mysql")]
pub mod mysql;
mod once;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
mod session;
mod slots;
mod sql;
pub mod sqlite;
mod target;
pub mod wake;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

use std::time::Duration;

pub use error::{ErrorKind, StoreError, UrlError};
pub use lease::{Capabilities, GrantError, Init, LeaseInfo, Replication, Schema, MAX_STORED};
pub use once::{
    known_outcome, unreadable, Acquired, Outcome, Period, RunRecord, FUTURE_LIMIT, NOT_STARTED,
    SUCCEEDED,
};
use target::parse;
pub use target::{choose, Origin, ResolveError, Target};
pub use wake::{Heard, Subscription, Wakeups};

/// `Some(open)` when the store's Cargo feature is built, else `None`.
macro_rules! built {
    ($feature:literal, $open:path) => {{
        #[cfg(feature = $feature)]
        let open: Option<Open> = Some($open);
        #[cfg(not(feature = $feature))]
        let open: Option<Open> = None;
        open
    }};
}

/// One line per store: the URL schemes it answers to, the Cargo feature
/// that builds it, whether its URL may name a host list, and how to open it
/// (`None` where this build left it out). `open` checks the URL's syntax
/// and connects to nothing.
pub const REGISTRY: &[Entry] = &[
    Entry {
        schemes: &["postgres", "postgresql"],
        feature: "postgres",
        host_list: true,
        open: built!("postgres", postgres::open),
    },
    Entry {
        schemes: &["mysql", "mariadb"],
        feature: "mysql",
        host_list: false,
        open: built!("mysql", mysql::open),
    },
    Entry {
        schemes: &["etcd", "etcds"],
        feature: "etcd",
        host_list: true,
        open: built!("etcd", etcd::open),
    },
    Entry {
        schemes: &["redis", "rediss"],
        feature: "redis",
        host_list: false,
        open: built!("redis", redis::open),
    },
    Entry {
        schemes: &["zk", "zookeeper", "zks"],
        feature: "zookeeper",
        host_list: true,
        open: built!("zookeeper", zookeeper::open),
    },
    Entry {
        schemes: &["sqlite"],
        feature: "(always built)",
        host_list: false,
        open: Some(sqlite::open),
    },
];

/// A [`REGISTRY`] line.
pub struct Entry {
    /// The URL schemes the store answers to (lowercase).
    pub schemes: &'static [&'static str],
    /// The Cargo feature that builds it.
    pub feature: &'static str,
    /// Its URL may name several hosts (`zk://a:2181,b:2181`), which URL
    /// syntax has no room for: the list is folded into parameters first
    /// ([`target::fold_hosts`]).
    pub host_list: bool,
    /// Its constructor, where this build has it.
    pub open: Option<Open>,
}

/// A store constructor: the parsed URL in, a store (not yet connected) out,
/// or a one-line usage error that never contains the password.
pub type Open = fn(&Target<'_>) -> Result<Store, UrlError>;

/// Any store the registry can open, not yet connected. A store left out
/// by its Cargo feature has no variant.
// A process opens one or two stores and moves them a handful of times:
// their sizes do not matter, boxing them would only add a step.
#[allow(clippy::large_enum_variant)]
pub enum Store {
    #[cfg(feature = "postgres")]
    Postgres(postgres::PgStore),
    #[cfg(feature = "mysql")]
    MySql(mysql::MySqlStore),
    #[cfg(feature = "redis")]
    Redis(redis::RedisStore),
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdStore),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(zookeeper::ZkStore),
    Sqlite(sqlite::SqliteStore),
}

/// `$e` with `$b` bound to the store behind `$s`, whichever it is.
macro_rules! each {
    ($s:expr, $b:ident => $e:expr) => {
        match $s {
            #[cfg(feature = "postgres")]
            Store::Postgres($b) => $e,
            #[cfg(feature = "mysql")]
            Store::MySql($b) => $e,
            #[cfg(feature = "redis")]
            Store::Redis($b) => $e,
            #[cfg(feature = "etcd")]
            Store::Etcd($b) => $e,
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper($b) => $e,
            Store::Sqlite($b) => $e,
        }
    };
}

/// The identity a lock is built for: which lease, held by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKey {
    pub name: String,
    pub holder: String,
    /// `--advertise`: stored with each grant this key takes, for that
    /// tenure only, and shown by `status` and `watch`.
    pub advertise: Option<String>,
    /// `--slots` N (1 for a plain run): stored with each grant above 1, so
    /// that contenders that disagree on N find out from the store.
    pub slots: u32,
}

impl LeaseKey {
    /// N as the stores keep it: `None` for a plain run, whose rows stay as
    /// they were before `--slots`.
    pub fn slots_value(&self) -> Option<u32> {
        Some(self.slots).filter(|&n| n > 1)
    }
}

/// What every store implements, once: the lease loop's calls for a key,
/// and the operators' calls. Reached through [`Store`] and [`Lock`].
pub(crate) trait Backend {
    /// The store as shown in logs and errors; never contains a password.
    fn describe(&self) -> String;

    fn capabilities(&self) -> Capabilities;

    /// A subscription to "lease `name` was freed" (with [`Heard::Changes`],
    /// "or taken") on a connection of its own (src/store/wake.rs), for
    /// stores whose capabilities say they push wake-ups; `None` elsewhere.
    /// Connects to nothing until armed.
    fn wakeups(&self, _name: &str, _heard: Heard) -> Option<Subscription> {
        None
    }

    /// The table's SQL, for stores that keep one.
    fn schema(&self) -> Option<Schema> {
        None
    }

    /// Take the lease for `lease`; `Some(epoch)` when taken, `None` when held.
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError>;

    /// Whether the store keeps `--advertise`'s value with the lease (written
    /// by `acquire` from [`LeaseKey::advertise`], read by `inspect` and
    /// `list`). The run form refuses the flag on a store that does not.
    fn advertises(&self) -> bool {
        false
    }

    /// Whether the store keeps `--slots`' N with each grant (written by
    /// `acquire` from [`LeaseKey::slots`], read by `inspect` and `list`),
    /// which contenders need to find that they disagree on N. The run form
    /// refuses `--slots` above 1 on a store that does not.
    fn slots(&self) -> bool {
        false
    }

    /// Whether the store keeps `--retry-failed` with `--once-per`'s rule.
    fn retry_failed(&self) -> bool {
        self.once_per()
    }

    /// Whether the store keeps `--once-per`'s rule and run record. The run
    /// form refuses `--once-per` on a store that does not, before anything
    /// runs; only such a store's default methods below are never called.
    fn once_per(&self) -> bool {
        false
    }

    /// Take the lease *and the period* in one atomic step: taken only when
    /// the lease is free or expired and no run of this name started less
    /// than `period.half` ago by the store's clock (or, with
    /// `period.retry_failed`, that run failed); the run record's start is
    /// written in that step. Tells "held" from "done this period". A run
    /// record the store cannot make sense of is an error that will not
    /// heal ([`unreadable`]), never a guess.
    async fn acquire_once(
        &mut self,
        _key: &LeaseKey,
        _lease: Duration,
        _period: Period,
        _timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        Err(StoreError::fatal(
            "--once-per is not supported on this store",
        ))
    }

    /// Release (as `release`) and write the run record's end and outcome
    /// in the same step, where the record is this holder's at `epoch`.
    async fn release_ending(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        _outcome: Outcome,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.release(key, epoch, keep, timeout).await
    }

    /// The run records (of `name`, or every name that has one). A store
    /// or table that keeps none has none.
    async fn run_records(
        &mut self,
        _name: Option<&str>,
        _timeout: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    /// Extend the lease to `lease` from now; `false` when it is no longer
    /// `key`'s at `epoch`.
    async fn renew(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError>;

    /// Give the lease up. With `keep` > 0 the holder stays recorded and the
    /// lease ends `keep` from now (for `--min-hold`), marked as kept (the
    /// run has ended: [`LeaseInfo::kept`]) where the store can record it;
    /// otherwise it is free at once. `false` when it was no longer `key`'s
    /// at `epoch`.
    async fn release(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError>;

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError>;

    /// Create what the store needs (the lease table), when missing.
    async fn init(&mut self, _timeout: Duration) -> Result<Init, StoreError> {
        Ok(Init::NothingToDo)
    }

    /// What the store's replication can lose (for `status`). Stores that
    /// cannot tell keep the default.
    async fn replication(&mut self, _timeout: Duration) -> Result<Replication, StoreError> {
        Ok(Replication::unknown("not known"))
    }

    /// Every lease, by name. A row a store cannot make sense of is shown
    /// clamped, never fails the whole list.
    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError>;

    /// Clear the holder (optionally only at `epoch`); the lease is free at
    /// once and the next acquisition still raises the epoch. Returns the
    /// lease as it was, or `None` when there was nothing to clear.
    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError>;
}

/// The operators' side, and what the run form asks before it takes a lock.
impl Store {
    /// The store as shown in logs and errors; never contains a password.
    pub fn describe(&self) -> String {
        each!(self, b => b.describe())
    }

    pub fn capabilities(&self) -> Capabilities {
        each!(self, b => b.capabilities())
    }

    /// A subscription to "lease `name` was freed", where the store pushes.
    pub fn wakeups(&self, name: &str) -> Option<Subscription> {
        each!(self, b => b.wakeups(name, Heard::Releases))
    }

    /// `watch`'s subscription: "lease `name` was freed or taken", where the
    /// store pushes. (On a store whose subscription names one lease, watch
    /// makes one per slot as it finds slots: src/watch.)
    pub fn watch_wakeups(&self, name: &str) -> Option<Subscription> {
        each!(self, b => b.wakeups(name, Heard::Changes))
    }

    /// Whether the store keeps `--once-per`'s rule and record.
    pub fn once_per(&self) -> bool {
        each!(self, b => b.once_per())
    }

    /// Whether the store keeps `--retry-failed`.
    pub fn retry_failed(&self) -> bool {
        each!(self, b => b.retry_failed())
    }

    /// Whether one subscription to "lease `name` was freed" also hears of
    /// every slot of it (`NAME#i`): the embedded store and Postgres, whose
    /// wake-ups name the lease and are matched by name.
    pub fn wakes_for_every_slot(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => true,
            Store::Sqlite(_) => true,
            #[allow(unreachable_patterns)] // a build with neither of the others
            _ => false,
        }
    }

    /// Whether the store keeps an `--advertise` value with the lease.
    pub fn advertises(&self) -> bool {
        each!(self, b => b.advertises())
    }

    /// Whether the store keeps `--slots`' N with each grant.
    pub fn slots(&self) -> bool {
        each!(self, b => b.slots())
    }

    /// The kind of store, as the refusal of a flag it lacks names it.
    pub fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "Postgres",
            #[cfg(feature = "mysql")]
            Store::MySql(_) => "MySQL/MariaDB",
            #[cfg(feature = "redis")]
            Store::Redis(_) => "Redis",
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => "etcd",
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(_) => "ZooKeeper",
            Store::Sqlite(_) => "embedded",
        }
    }

    /// The run records of `name`, or of every name (see `Backend::run_records`).
    pub async fn run_records(
        &mut self,
        name: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        each!(self, b => b.run_records(name, timeout).await)
    }

    /// The table's SQL, for stores that keep one.
    pub fn schema(&self) -> Option<Schema> {
        each!(self, b => b.schema())
    }

    pub async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        each!(self, b => b.inspect(name, timeout).await)
    }

    pub async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        each!(self, b => b.init(timeout).await)
    }

    pub async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        each!(self, b => b.replication(timeout).await)
    }

    pub async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        each!(self, b => b.list(timeout).await)
    }

    pub async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        each!(self, b => b.clear(name, epoch, timeout).await)
    }

    /// The lock on lease `name` for `holder`: what the lease loop uses.
    pub fn lock(self, name: impl Into<String>, holder: impl Into<String>) -> Lock {
        let name = name.into();
        Lock {
            store: self,
            name: name.clone(),
            slotted: false,
            slot: None,
            key: LeaseKey {
                name,
                holder: holder.into(),
                advertise: None,
                slots: 1,
            },
            period: None,
            ending: None,
        }
    }
}

/// The lease loop's calls (the elector's view of a lock). Implemented by
/// [`Lock`], and by the elector tests' scripted store.
#[allow(async_fn_in_trait)] // one thread: no caller needs the futures to be Send
pub trait LeaseLock {
    /// The push wake-ups this lock can hand out.
    type Wakeups: Wakeups;

    /// Take the lease for `lease`; `Some(epoch)` when taken, `None` when
    /// held (or, under `--once-per`, done this period).
    async fn acquire(
        &mut self,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError>;

    /// What the elector calls: `acquire`, telling (under `--once-per`)
    /// "held" from "done this period".
    async fn take(&mut self, lease: Duration, timeout: Duration) -> Result<Acquired, StoreError> {
        Ok(match self.acquire(lease, timeout).await? {
            Some(epoch) => Acquired::Taken(epoch),
            None => Acquired::Held,
        })
    }

    /// Extend the lease to `lease` from now; `false` when it is no longer ours.
    async fn renew(
        &mut self,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError>;

    /// Give the lease up (see `Backend::release` for `keep`); `false` when
    /// it was no longer ours.
    async fn release(
        &mut self,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError>;

    /// The lease as the store has it, whoever holds it.
    async fn inspect(&mut self, timeout: Duration) -> Result<Option<LeaseInfo>, StoreError>;

    /// How the run on this lease ended, for the run record the next
    /// release writes (`--once-per`); a lock that keeps none ignores it.
    fn ending(&mut self, _outcome: Outcome) {}

    /// The store as messages name it (no password).
    fn shown(&self) -> String {
        "the store".into()
    }
}

/// One store, bound to one lease name and one holder. Per-lease state a
/// store keeps (etcd's lease ID, the Redis primary that granted the lease)
/// lives in its backend, which the lock owns.
pub struct Lock {
    store: Store,
    /// The lease name the run was given.
    name: String,
    /// The key of the lease this lock takes: under `--slots`, the name is
    /// the slot's own lease (slots.rs).
    key: LeaseKey,
    /// `--slots` was given (even 1): takes go through slots.rs, which
    /// checks that every live slot of the name agrees on N.
    slotted: bool,
    /// The slot last taken (`--slots`).
    slot: Option<u32>,
    /// `--once-per`'s rule: acquires then take the period too.
    period: Option<Period>,
    /// How the run ended, written with the release (`--once-per` only).
    ending: Option<Outcome>,
}

impl Lock {
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    pub fn describe(&self) -> String {
        self.store.describe()
    }

    pub fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    /// A subscription to "this lease was freed" (any of its slots), where
    /// the store pushes.
    pub fn wakeups(&self) -> Option<Subscription> {
        if !self.slotted || self.store.wakes_for_every_slot() {
            return self.store.wakeups(&self.name);
        }
        let all: Option<Vec<Subscription>> = (0..self.key.slots)
            .map(|i| self.store.wakeups(&crate::names::slot_name(&self.name, i)))
            .collect();
        all.map(Subscription::Slots)
    }

    /// Store `value` with every grant this lock takes (`--advertise`). The
    /// run form has checked that the store keeps it.
    pub fn advertise(&mut self, value: String) {
        self.key.advertise = Some(value);
    }

    /// Acquire under `--once-per` with this rule: every acquire then also
    /// takes the period and writes the run record's start. The run form
    /// has checked that the store keeps the rule.
    pub fn once_per(&mut self, period: Period) {
        self.period = Some(period);
    }
}

impl Lock {
    /// One acquire of the lease `key` names (a slot's, under `--slots`).
    async fn take_one(
        &mut self,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        let key = &self.key;
        match self.period {
            Some(period) => {
                each!(&mut self.store, b => b.acquire_once(key, lease, period, timeout).await)
            }
            None => Ok(
                match each!(&mut self.store, b => b.acquire(key, lease, timeout).await)? {
                    Some(epoch) => Acquired::Taken(epoch),
                    None => Acquired::Held,
                },
            ),
        }
    }
}

impl LeaseLock for Lock {
    type Wakeups = Subscription;

    fn shown(&self) -> String {
        format!("the store {}", self.describe())
    }

    async fn acquire(
        &mut self,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        Ok(self.take(lease, timeout).await?.epoch())
    }

    async fn take(&mut self, lease: Duration, timeout: Duration) -> Result<Acquired, StoreError> {
        if self.slotted {
            return self.take_slot(lease, timeout).await;
        }
        self.take_one(lease, timeout).await
    }

    async fn renew(
        &mut self,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let key = &self.key;
        each!(&mut self.store, b => b.renew(key, epoch, lease, timeout).await)
    }

    async fn release(
        &mut self,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let key = &self.key;
        match self.ending {
            Some(outcome) => {
                each!(&mut self.store, b => b.release_ending(key, epoch, keep, outcome, timeout).await)
            }
            None => each!(&mut self.store, b => b.release(key, epoch, keep, timeout).await),
        }
    }

    async fn inspect(&mut self, timeout: Duration) -> Result<Option<LeaseInfo>, StoreError> {
        if self.slotted {
            return self.inspect_slots(timeout).await;
        }
        self.store.inspect(&self.key.name, timeout).await
    }

    /// Written into the run record by the release that follows (under
    /// `--once-per`; otherwise a release is a release).
    fn ending(&mut self, outcome: Outcome) {
        if self.period.is_some() {
            self.ending = Some(outcome);
        }
    }
}

/// Open the store a string names (or the embedded default for `None`),
/// checking its syntax only; nothing is connected until the first call.
/// Errors never contain the string itself.
pub fn open(
    choice: Option<(&str, Origin)>,
    app_name: &str,
    call_timeout: Duration,
) -> Result<Store, ResolveError> {
    let mut app_name = app_name.to_string();
    app_name.truncate(63);
    let Some((raw, origin)) = choice else {
        return sqlite::open_default(call_timeout);
    };
    let url = parse(raw, origin)?;
    // `parse` refused schemes that are not built or not known.
    let Some(open) = REGISTRY
        .iter()
        .find(|e| e.schemes.contains(&url.scheme()))
        .and_then(|e| e.open)
    else {
        return Err(ResolveError::UnknownScheme {
            origin,
            scheme: url.scheme().to_string(),
        });
    };
    let target = Target {
        url: &url,
        app_name: &app_name,
        call_timeout,
    };
    open(&target).map_err(|error| ResolveError::Url { origin, error })
}

/// [`choose`] then [`open`]: what the run form and the subcommands call.
pub fn resolve(
    given: Option<String>,
    origin: Origin,
    app_name: &str,
    call_timeout: Duration,
) -> Result<Store, ResolveError> {
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
    #[allow(clippy::single_element_loop)] // in a build with the embedded store alone
    fn stores_that_push_offer_a_subscription() {
        for (raw, pushes) in [
            #[cfg(feature = "postgres")]
            ("postgres://u@h/db", true),
            #[cfg(feature = "redis")]
            ("redis://h:6379/0", true),
            #[cfg(feature = "etcd")]
            ("etcd://h:2379", true),
            #[cfg(feature = "zookeeper")]
            ("zk://h:2181,i/apps", true),
            ("sqlite:///tmp/x.db", true),
            #[cfg(feature = "mysql")]
            ("mysql://u@h/db", false),
        ] {
            let s = open(Some((raw, Origin::Flag)), "t", Duration::from_secs(1)).expect(raw);
            assert_eq!(s.capabilities().pushes_wakeups, pushes, "{raw}");
            assert_eq!(s.wakeups("n").is_some(), pushes, "{raw}");
        }
    }
}
