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

pub mod etcd;
pub mod mysql;
pub mod postgres;
pub mod push;
pub mod redis;
mod sql;
pub mod sqlite;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::redact;

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

/// What a constructor gets.
pub struct Target<'a> {
    /// The parsed store URL (scheme lowercased by the parser).
    pub url: &'a url::Url,
    /// Shown to the server where it can show it (Postgres `application_name`).
    pub app_name: &'a str,
    /// Server-side bound for one call, where the server has one.
    pub call_timeout: Duration,
}

/// Why a store call failed. The caller must tell these apart: a waiting
/// contender retries `Unavailable` but gives up on `Fatal`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// May heal: network trouble, a timeout, a restarting or read-only
    /// server, a lock held too long.
    #[error("{0}")]
    Unavailable(String),
    /// Will not heal: wrong password, missing permission, unusable
    /// configuration.
    #[error("{0}")]
    Fatal(String),
}

impl StoreError {
    pub fn may_heal(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// What the store says about a lease, by the store's own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    pub name: String,
    pub holder: Option<String>,
    pub epoch: i64,
    /// Milliseconds until expiry; negative when already expired (for a
    /// free lease on a SQL store: how long ago it was freed). `None` where
    /// the store cannot know: a free lease on a store that deletes the
    /// lease key (Redis, etcd) keeps no time of its end.
    pub expires_in_ms: Option<i64>,
}

impl LeaseInfo {
    pub fn is_live(&self) -> bool {
        self.holder.is_some() && self.expires_in_ms.is_some_and(|ms| ms > 0)
    }
}

/// What a store can promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Leases are granted in whole multiples of this (a request is rounded up).
    pub granularity: Duration,
    /// The shortest lease the store grants.
    pub min_lease: Duration,
    /// The longest lease (and `--min-hold` keep) the store records; longer
    /// requests are clamped on write.
    pub max_lease: Duration,
    /// Whether the store can wake a waiting contender when the lease is
    /// freed (instead of the contender polling every `P`).
    pub pushes_wakeups: bool,
    /// Whether a failover of the store may extend a lease by up to its full
    /// length (etcd: a new leader re-extends every lease by its TTL), so a
    /// lease that could not be handed back may outlive `sent + L`.
    pub failover_extends_lease: bool,
}

/// Ten years: far beyond any sensible lease or `--min-hold`, far inside the
/// range of every store's time type, so no sum of "now" and a duration can
/// overflow a column.
pub const MAX_STORED: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl Capabilities {
    /// Millisecond leases computed by the server (the SQL stores).
    pub const MILLIS: Capabilities = Capabilities {
        granularity: Duration::from_millis(1),
        min_lease: Duration::from_millis(1),
        max_lease: MAX_STORED,
        pushes_wakeups: false,
        failover_extends_lease: false,
    };

    /// The lease the store will really grant for `requested`: rounded up to
    /// the granularity; refused when below the minimum or above the maximum
    /// (silently lengthening a short lease would slow failover without the
    /// user knowing; shortening a long one would break the timing).
    pub fn grant(&self, requested: Duration) -> Result<Duration, String> {
        let g = self.granularity.as_nanos().max(1);
        let granted = requested
            .as_nanos()
            .div_ceil(g)
            .checked_mul(g)
            .and_then(|n| u64::try_from(n).ok())
            .map(Duration::from_nanos);
        let show = |d: Duration| humantime::format_duration(d).to_string();
        match granted {
            Some(d) if d < self.min_lease => Err(format!(
                "--lease ({}) is shorter than the shortest lease this store grants ({})",
                show(requested),
                show(self.min_lease)
            )),
            Some(d) if d <= self.max_lease => Ok(d),
            _ => Err(format!(
                "--lease ({}) is longer than the longest lease this store grants ({})",
                show(requested),
                show(self.max_lease)
            )),
        }
    }
}

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

/// The table a SQL store keeps its leases in, for `init --print`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schema {
    /// Shown in the leading SQL comment: "PostgreSQL", "MySQL/MariaDB", …
    pub dialect: &'static str,
    pub sql: &'static str,
}

/// What `init` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// The lease table exists now (created or already there).
    Ready,
    /// This store keeps no table; there is nothing to create.
    NothingToDo,
}

/// What the store's replication can do to an acknowledged write, as
/// `leaderrun status` shows it (docs/stores.md, "what a failover of the
/// store can break").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    /// `Some(true)`: a failover can lose an acknowledged acquisition (an
    /// asynchronous replica promoted); `Some(false)`: it cannot (synchronous
    /// replication, a quorum, a single host); `None`: the store cannot tell.
    pub can_lose_acknowledged: Option<bool>,
    /// One line for people: "asynchronous, 2 standbys", "single host", …
    pub detail: String,
}

impl Replication {
    pub fn unknown(detail: impl Into<String>) -> Replication {
        Replication {
            can_lose_acknowledged: None,
            detail: detail.into(),
        }
    }
}

/// Everything beyond the lease loop: what the store is, what it promises,
/// and the operators' subcommands. Every store implements all of it.
pub trait StoreAdmin: Store {
    /// The store as shown in logs and errors; never contains a password.
    fn describe(&self) -> String;

    fn capabilities(&self) -> Capabilities;

    /// A subscription to "this lease was freed" on a connection of its own
    /// (src/store/push.rs), for stores whose capabilities say they push
    /// wake-ups; `None` elsewhere. Connects to nothing until armed.
    fn wakeups(&self) -> Option<push::AnyWakeups> {
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
    fn wakeups_dyn(&self) -> Option<push::AnyWakeups>;
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
    fn wakeups_dyn(&self) -> Option<push::AnyWakeups> {
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
    fn wakeups(&self) -> Option<push::AnyWakeups> {
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

/// Where a store string came from; errors name it instead of echoing the
/// string (which may hold a password).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// `--store`
    #[default]
    Flag,
    /// `LEADERRUN_STORE` (clap reads it for `--store`)
    LeaderrunStore,
    /// `DATABASE_URL`
    DatabaseUrl,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::Flag => "--store",
            Origin::LeaderrunStore => "LEADERRUN_STORE",
            Origin::DatabaseUrl => "DATABASE_URL",
        })
    }
}

/// Why no store could be opened. Usage errors exit 2; a failure of the
/// environment (no `HOME` for the embedded store) exits 125.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failure(String),
}

impl ResolveError {
    pub fn exit_code(&self) -> i32 {
        match self {
            ResolveError::Usage(_) => crate::exit::USAGE,
            ResolveError::Failure(_) => crate::exit::FAILURE,
        }
    }
}

/// The store string to use: `given` (from `--store` or `LEADERRUN_STORE`, as
/// `origin` says), else a non-empty `DATABASE_URL`. `None` means the embedded
/// default; an explicitly empty `--store ''` or `LEADERRUN_STORE=` asks for
/// it too, even when `DATABASE_URL` is set.
pub fn choose(given: Option<String>, origin: Origin) -> Option<(String, Origin)> {
    match given {
        Some(s) if s.trim().is_empty() => None,
        Some(s) => Some((s, origin)),
        None => std::env::var("DATABASE_URL")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| (s, Origin::DatabaseUrl)),
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

fn known_schemes() -> String {
    let all: Vec<String> = REGISTRY
        .iter()
        .flat_map(|(s, _)| s.iter())
        .map(|s| format!("{s}://"))
        .collect();
    all.join(", ")
}

/// Parse a store string without ever echoing it: a URL that does not parse
/// is named by its origin, and its scheme is shown only when it is plainly a
/// scheme (`[a-z][a-z0-9+.-]*://`), never anything after it.
fn parse(raw: &str, origin: Origin) -> Result<url::Url, ResolveError> {
    // URL parsing drops tabs and newlines silently; the string itself goes
    // on to the watchdog as one line of its orders, where a newline would
    // end that line and begin another. No store string needs one.
    if raw.chars().any(char::is_control) {
        return Err(ResolveError::Usage(format!(
            "the store string from {origin} contains a control character (a newline or tab?)"
        )));
    }
    let Some(scheme) = redact::plain_scheme(raw) else {
        return Err(ResolveError::Usage(format!(
            "the store string from {origin} is not a URL leaderrun understands (expected {})",
            known_schemes()
        )));
    };
    if !REGISTRY.iter().any(|(k, _)| k.contains(&scheme)) {
        return Err(ResolveError::Usage(format!(
            "the store URL from {origin} has an unknown scheme {scheme}:// (expected {})",
            known_schemes()
        )));
    }
    // etcd clusters and libpq's multi-host URLs are named by a host list
    // (`etcd://a:2379,b:2379`), which URL syntax has no room for; it is
    // rewritten into one first.
    let folded;
    let raw = if matches!(scheme, "etcd" | "etcds" | "postgres" | "postgresql") {
        folded = etcd::fold_hosts(raw);
        folded.as_str()
    } else {
        raw
    };
    let url = url::Url::parse(raw).map_err(|e| {
        ResolveError::Usage(format!(
            "the store URL from {origin} is not valid: {e} \
             (a password containing '/', '?', '#' or '@' must be percent-encoded)"
        ))
    })?;
    // A '#' or an '@' after the host is what an unencoded '/', '?' or '#' in
    // a password leaves behind when the rest happens to parse (a numeric
    // "port"): refuse rather than connect somewhere odd and show it.
    if url.fragment().is_some() || url.path().contains('@') {
        return Err(ResolveError::Usage(format!(
            "the store URL from {origin} is not valid: it has a '#' part or an '@' after the host \
             (a password containing '/', '?', '#' or '@' must be percent-encoded)"
        )));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(raw: &str) -> String {
        match open(
            Some((raw, Origin::DatabaseUrl)),
            "t",
            Duration::from_secs(1),
        ) {
            Ok(s) => panic!("{raw} opened as {}", s.describe()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn unparsable_strings_are_named_by_origin_never_echoed() {
        for (raw, secret, want) in [
            (
                "postgres://u:pa/ss@h/db",
                "pa/ss",
                "from DATABASE_URL is not valid: invalid port number",
            ),
            ("postgres://u:p#ss@h/db", "p#ss", "is not valid"),
            ("postgres://u:p?ss@h/db", "p?ss", "is not valid"),
            ("mysql://u:12/34@h/db", "12/34", "is not valid"),
            ("postgres://u:12#34@h/db", "12#34", "is not valid"),
            (
                "host=db password=hunter2 dbname=x",
                "hunter2",
                "is not a URL leaderrun understands",
            ),
            (
                "memcache://:hunter2@h:11211/0",
                "hunter2",
                "unknown scheme memcache://",
            ),
            ("Xyz:hunter2@h", "hunter2", "is not a URL"),
            ("hunter2", "hunter2", "is not a URL"),
        ] {
            let e = err(raw);
            assert!(e.contains(want), "{raw}: {e}");
            assert!(!e.contains(secret), "{raw}: echoed: {e}");
            assert!(e.contains("DATABASE_URL"), "{e}");
        }
    }

    /// sqlx logs parameters it does not know together with their value.
    #[test]
    fn unknown_parameters_are_refused_by_name_only() {
        let e = err("postgres://u@h/db?pasword=Hunter2x");
        assert!(e.contains("unknown parameter pasword"), "{e}");
        let e = err("mysql://u@h/db?Hunter2x=1");
        assert!(
            e.contains("a query parameter that is not understood"),
            "{e}"
        );
        for e in [
            err("postgres://u@h/db?pasword=Hunter2x"),
            err("mysql://u@h/db?Hunter2x=1"),
        ] {
            assert!(!e.contains("Hunter2x"), "{e}");
        }
    }

    #[test]
    fn passwords_are_hidden_in_the_description() {
        for (raw, shown) in [
            ("postgres://u:x@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u:p%2Fs%23s@h:5/db?sslmode=disable",
                "postgres://u:***@h:5/db?sslmode=disable",
            ),
            (
                "mysql://u:x@h/db?password=y",
                "mysql://u:***@h/db?password=***",
            ),
        ] {
            let s = open(Some((raw, Origin::Flag)), "t", Duration::from_secs(1)).expect(raw);
            assert_eq!(s.describe(), shown);
        }
    }

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

    #[test]
    fn grant_rounds_up_and_refuses_what_it_cannot_honour() {
        let etcd_like = Capabilities {
            granularity: Duration::from_secs(1),
            min_lease: Duration::from_secs(2),
            max_lease: MAX_STORED,
            pushes_wakeups: true,
            failover_extends_lease: true,
        };
        assert_eq!(
            etcd_like.grant(Duration::from_millis(2500)),
            Ok(Duration::from_secs(3))
        );
        assert_eq!(
            etcd_like.grant(Duration::from_millis(1500)),
            Ok(Duration::from_secs(2))
        );
        assert!(etcd_like.grant(Duration::from_millis(900)).is_err());
        let sql = Capabilities::MILLIS;
        assert_eq!(
            sql.grant(Duration::from_micros(1500)),
            Ok(Duration::from_millis(2))
        );
        assert!(sql.grant(MAX_STORED * 2).is_err());
    }
}
