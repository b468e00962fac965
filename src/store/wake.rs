//! Push wake-ups: a hint that a lease was freed, so a waiting contender tries
//! again at once instead of at its next poll (and, for `watch`, that it was
//! taken, so the watcher reads at once: [`Heard`]).
//!
//! A wake-up decides nothing (docs/contract.md): the atomic acquire still
//! does, and the poll every `P` stays as the fallback. So everything here may
//! fail, arrive twice, arrive for nothing, or not arrive, without any effect
//! on safety; the only thing it must never do is arrive *before* the lease is
//! free and then stay silent, and it cannot: every store publishes in the
//! same step as the release (a Postgres `NOTIFY` is delivered at commit, a
//! Redis `PUBLISH` runs inside the release script) or after it (the embedded
//! store touches a file once the transaction committed). Acquisitions are
//! published the same way, in the acquire's step or after its commit, so a
//! watcher woken by one reads the lease taken.
//!
//! The elector subscribes ([`Wakeups::arm`]) *before* every acquisition
//! attempt, so a release that lands after the attempt found the lease held
//! is always seen by the subscription, never between the two.
//!
//! Each subscription lives on a connection (or file descriptor) of its own,
//! never on the store's command connection: a subscriber that breaks must not
//! cost the lease loop a reconnect, and the command connection's reads must
//! not interleave with notifications.

#[cfg(feature = "etcd")]
use super::etcd;
#[cfg(feature = "postgres")]
use super::postgres;
#[cfg(feature = "redis")]
use super::redis;
#[cfg(feature = "zookeeper")]
use super::zookeeper;
use super::{sqlite, StoreError};

/// What wakes a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// The lease was freed: all a waiting contender acts on. It is never
    /// woken by an acquisition, which would only make every waiter try (and
    /// fail) once more each time the lease changes hands.
    Releases,
    /// The lease was freed or taken: what `watch` reports. Every store that
    /// pushes a release also pushes an acquisition, in the same step as the
    /// acquire or after its commit, never before.
    Changes,
}

/// A subscription to "lease NAME was freed" (and, for `watch`, "taken":
/// [`Heard`]), for the one lease it was made for.
#[allow(async_fn_in_trait)] // one thread: no caller needs the futures to be Send
pub trait Wakeups {
    /// Called before each acquisition attempt: subscribe when not subscribed
    /// (rebuilding a broken subscription), and forget wake-ups already
    /// received, which the attempt about to be made supersedes. An error
    /// leaves the contender polling until the next attempt arms again.
    async fn arm(&mut self) -> Result<(), StoreError>;

    /// Completes when a wake-up arrived since `arm`, or with an error when
    /// the subscription broke (the caller then polls). Never completes
    /// otherwise; dropping the future loses nothing.
    async fn wake(&mut self) -> Result<(), StoreError>;
}

/// The subscription of whichever store pushes.
// One subscription is made per run and moved a handful of times: sizes do
// not matter (a build with ZooKeeper alone beside the embedded store would
// otherwise be told to box it).
#[allow(clippy::large_enum_variant)]
pub enum Subscription {
    // Boxed: its listener is large, and only one subscription is made per run.
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::wake::HostsWakeups>),
    #[cfg(feature = "redis")]
    Redis(redis::wake::RedisWakeups),
    #[cfg(feature = "etcd")]
    Etcd(etcd::wake::EtcdWakeups),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(zookeeper::wake::ZkWakeups),
    Sqlite(sqlite::wake::FileWakeups),
    /// One subscription per slot (`--slots`), where a store's subscription
    /// is to one lease (Redis's channel, etcd's key, ZooKeeper's node): a
    /// wake-up from any of them is one. Each is a connection of its own,
    /// so N slots cost N subscription connections per waiting contender.
    Slots(Vec<Subscription>),
}

impl Wakeups for Subscription {
    async fn arm(&mut self) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            Subscription::Postgres(w) => w.arm().await,
            #[cfg(feature = "redis")]
            Subscription::Redis(w) => w.arm().await,
            #[cfg(feature = "etcd")]
            Subscription::Etcd(w) => w.arm().await,
            #[cfg(feature = "zookeeper")]
            Subscription::ZooKeeper(w) => w.arm().await,
            Subscription::Sqlite(w) => w.arm().await,
            Subscription::Slots(all) => {
                // Every one armed that can be; the first failure is told
                // (the caller then polls, until it arms again).
                let mut first = Ok(());
                for w in all.iter_mut() {
                    let r = Box::pin(w.arm()).await;
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            }
        }
    }

    async fn wake(&mut self) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            Subscription::Postgres(w) => w.wake().await,
            #[cfg(feature = "redis")]
            Subscription::Redis(w) => w.wake().await,
            #[cfg(feature = "etcd")]
            Subscription::Etcd(w) => w.wake().await,
            #[cfg(feature = "zookeeper")]
            Subscription::ZooKeeper(w) => w.wake().await,
            Subscription::Sqlite(w) => w.wake().await,
            Subscription::Slots(all) => {
                let mut waits: Vec<_> = all.iter_mut().map(|w| Box::pin(w.wake())).collect();
                std::future::poll_fn(|cx| {
                    for w in waits.iter_mut() {
                        if let std::task::Poll::Ready(r) = std::future::Future::poll(w.as_mut(), cx)
                        {
                            return std::task::Poll::Ready(r);
                        }
                    }
                    std::task::Poll::Pending
                })
                .await
            }
        }
    }
}
