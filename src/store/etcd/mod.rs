//! The etcd store: a key bound to an etcd lease, and a counter beside it.
//!
//! **Why the JSON gateway and a small HTTP/1.1 client.** etcd's gRPC clients
//! for Rust generate their code with `protoc` at build time, and
//! `cargo install --path .` must keep working on a machine that has only
//! Rust. etcd serves the same v3 API as JSON over plain HTTP (its gRPC
//! gateway, `/v3/...`; 3.4 also answers on the older `/v3beta/`, which 3.5
//! dropped, so `/v3/` is the one that works on both). The calls needed here
//! are a handful of request/response POSTs on keep-alive connections, so
//! the client is a small one over tokio (and tokio-rustls for `etcds://`):
//! http.rs speaks HTTP/1.1 to one member, parsing with `httparse` within
//! fixed bounds; members.rs spreads a call over the members; api.rs reads
//! the replies into typed structs.
//!
//! For lease `NAME`:
//!
//! * `leaderrun/lease/NAME` holds `EPOCH:HOLDER` and is attached to an etcd
//!   lease (a server-side TTL). When the TTL runs out etcd deletes the key:
//!   expiry is decided by the etcd leader's clock, never ours.
//! * `leaderrun/epoch/NAME` is a counter without a lease. An acquisition is
//!   one transaction: *if* the lease key does not exist (`create_revision ==
//!   0`) *and* the counter is unchanged since we read it (`mod_revision`),
//!   put the lease key and the counter + 1. Two racers that read the same
//!   counter cannot both pass the compare, so the epoch rises by exactly one
//!   per acquisition.
//!
//! etcd grants whole seconds with a server-side minimum (`1.5 ×` the
//! election timeout, 2 s with the defaults). The requested lease is rounded
//! *up* to whole seconds (a longer lease on the server only delays a rival),
//! the granted TTL is read back, and a grant longer than that (the minimum)
//! is refused: the holder would time its give-up against a lease the server
//! does not keep to.
//!
//! Renewal is one `LeaseKeepAlive` (checked: TTL > 0) and a read of the key
//! (checked: still ours at our epoch), on one member whose Raft term must
//! not move meanwhile (`renew_on` in lease.rs says why). Release deletes the key only
//! if its value is still ours, then revokes our etcd lease.
//!
//! Several endpoints (`etcd://a:2379,b:2379`): a member that refuses, fails
//! or hangs is passed over within the call, and a call abandoned at its
//! deadline moves the next one to another member (members.rs).
//! Everything sent that way may reach etcd more than once, so every write
//! here is one that is safe to apply twice; each says why, next to it.
//! Every request is linearizable (no `serializable` reads), so any member
//! answers with the quorum's view.
//!
//! `--once-per`: a period key on an etcd lease of half the period, put by
//! the acquiring transaction only where it does not exist, and the run
//! record (once.rs).
//!
//! Push wake-ups: a `Watch` on `leaderrun/lease/NAME`, made before each
//! attempt, fires on delete, whether by release, revocation or expiry. The
//! gateway streams it as `/v3/watch`, one JSON object per event, on a
//! connection of its own (wake.rs).
//!
//! A connection is taken out for a request and put back only once its
//! reply was read whole, so a call abandoned by the elector's timer leaves
//! nothing half-read behind.

use crate::store::UrlError;
use std::rc::Rc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::session::{Connect, Session};
use super::wake::{Heard, Subscription};
use super::{
    Acquired, Backend, Capabilities, Init, LeaseInfo, LeaseKey, Outcome, Period, Replication,
    RunRecord, Store, StoreError, Target, MAX_STORED,
};

mod api;
mod http;
mod lease;
mod members;
mod once;
mod url;
pub(crate) mod wake;

use self::api::*;
use self::lease::ttl_secs;
use self::members::{Cursor, EtcdError, Members, Reach, Res};
use self::url::from_url;

pub struct EtcdStore {
    s: Session<Cluster>,
    /// The etcd lease behind the grant this lock took: (epoch, lease ID).
    /// (A store is bound to one lease name and holder once it is a lock.)
    granted: Option<(i64, i64)>,
}

/// How to reach the cluster. Its "connection" is the set of members
/// ([`Members`]): the connection to the one that answered last, kept while
/// calls succeed; the cursor (where the next call starts, the auth token)
/// is shared with every connection made, so that it outlives one dropped
/// with a failed or abandoned call.
struct Cluster {
    reach: Rc<Reach>,
    cursor: Rc<Cursor>,
    /// Built from the parsed URL, password hidden.
    shown: String,
}

impl Connect for Cluster {
    type Conn = Members;
    type Error = EtcdError;

    fn shown(&self) -> String {
        self.shown.clone()
    }

    /// Nothing to wait for: each request connects to a member when it
    /// needs one (members.rs).
    async fn connect(&mut self, _deadline: Instant) -> Result<Members, StoreError> {
        Ok(Members::new(self.reach.clone(), self.cursor.clone()))
    }

    fn classify(&self, what: &str, e: EtcdError) -> StoreError {
        // etcd's own messages ("authentication failed, invalid user ID or
        // password") and ours name no password.
        let msg = format!("{what} the store {}: {e}", self.shown);
        StoreError::healing(e.is_transient(), msg).with_source(e)
    }
}

impl EtcdStore {
    fn new(url: &::url::Url) -> Result<EtcdStore, UrlError> {
        let p = from_url(url)?;
        Ok(EtcdStore {
            s: Session::new(Cluster {
                reach: Rc::new(Reach::new(p.endpoints, p.tls, p.ca_file, p.user)),
                cursor: Rc::default(),
                shown: p.shown,
            }),
            granted: None,
        })
    }

    /// A call on the session: `f`'s requests, hedged across the members
    /// within the call's deadline.
    async fn call<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: impl AsyncFnOnce(&mut Members) -> Res<T>,
    ) -> Result<T, StoreError> {
        self.s
            .call(timeout, what, async move |m, deadline| {
                m.deadline(deadline);
                f(m).await
            })
            .await
    }
}

impl Backend for EtcdStore {
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let ttl = ttl_secs(lease);
        let k = (
            key.name.as_str(),
            key.holder.as_str(),
            key.advertise.as_deref(),
            key.slots_value(),
        );
        let taken = self
            .call(timeout, "cannot acquire in", async |m| m.take(k, ttl).await)
            .await?;
        Ok(taken.map(|(epoch, id)| {
            self.granted = Some((epoch, id));
            epoch
        }))
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

    /// The period is a key on an etcd lease of `half` (whole seconds: the
    /// run form refuses a period etcd cannot keep half of), created by the
    /// acquiring transaction only where it does not exist (once.rs).
    async fn acquire_once(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: Period,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        let (ttl, half) = (ttl_secs(lease), ttl_secs(period.half));
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        let advertise = key.advertise.as_deref();
        let (got, id) = self
            .call(timeout, "cannot acquire in", async |m| {
                let r = m.take_once(name, holder, ttl, half, period).await?;
                // The advertised value follows the take here, on the same
                // etcd lease, in a step of its own (the take's transaction
                // is once.rs's): a reader may see the lease a round trip
                // before it.
                if let (Ok((Acquired::Taken(epoch), Some(id))), Some(a)) = (&r, advertise) {
                    m.put_values(name, &lease_value(*epoch, holder), *epoch, *id, a)
                        .await?;
                }
                Ok(r)
            })
            .await?
            .map_err(|why| crate::store::unreadable(&self.describe(), name, &why))?;
        if let (Acquired::Taken(epoch), Some(id)) = (got, id) {
            self.granted = Some((epoch, id));
        }
        Ok(got)
    }

    /// The record's end first, then the release: a `not started` run's
    /// period is deleted before the lease is free, so no racer finds the
    /// lease free and the period still taken. A record that could not be
    /// written does not keep the lease from being handed back.
    async fn release_ending(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        outcome: Outcome,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder, known) = (key.name.as_str(), key.holder.as_str(), self.granted);
        let k = (name, holder, key.advertise.as_deref(), key.slots_value());
        let outcome = outcome.to_string();
        let (ended, released) = self
            .call(timeout, "cannot release in", async |m| {
                let ended = m.end_run(name, holder, epoch, &outcome).await;
                let released = m.give_back(k, epoch, keep, known).await?;
                Ok((ended.err(), released))
            })
            .await?;
        self.granted = None;
        if let Some(e) = ended {
            tracing::warn!(
                event = "store_error",
                epoch,
                "could not write the end of the run of {name} into the store {}: {e}; its \
                 record shows no end",
                self.s.c.shown()
            );
        }
        Ok(released)
    }

    async fn run_records(
        &mut self,
        name: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        self.call(timeout, "cannot read", async |m| m.run_records(name).await)
            .await
    }

    async fn renew(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        _lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder, known) = (key.name.as_str(), key.holder.as_str(), self.granted);
        // The TTL was fixed at the grant; a keepalive restores it in full.
        let renewed = self
            .call(timeout, "cannot renew in", async |m| {
                m.renew_grant(name, holder, epoch, known).await
            })
            .await?;
        if !renewed {
            self.granted = None;
        }
        Ok(renewed)
    }

    async fn release(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let k = (
            key.name.as_str(),
            key.holder.as_str(),
            key.advertise.as_deref(),
            key.slots_value(),
        );
        let known = self.granted;
        let released = self
            .call(timeout, "cannot release in", async |m| {
                m.give_back(k, epoch, keep, known).await
            })
            .await?;
        self.granted = None;
        Ok(released)
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        self.call(timeout, "cannot read", async |m| {
            m.inspect_lease(name).await
        })
        .await
    }

    fn describe(&self) -> String {
        self.s.c.shown()
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn wakeups(&self, name: &str, heard: Heard) -> Option<Subscription> {
        let cursor = Rc::new(self.s.c.cursor.detached());
        Some(Subscription::Etcd(wake::EtcdWakeups::new(
            Members::new(self.s.c.reach.clone(), cursor),
            name,
            heard,
        )))
    }

    /// Nothing to create: keys appear on first use. Reaching the cluster
    /// (and authenticating) is still checked, so `init` fails on a wrong
    /// password.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        let body = json!({"key": b64(EPOCH_PREFIX)});
        self.call(timeout, "cannot use", async |m| {
            m.rpc("/v3/kv/range", &body)
                .await
                .map(|_| Init::NothingToDo)
        })
        .await
    }

    /// A Raft quorum: etcd acknowledges a write once a majority of the
    /// voting members has it in its log on disk, so no failover loses it.
    /// Learners (non-voting members) do not count towards that majority.
    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        let list: MemberList = self
            .call(timeout, "cannot read", async |m| {
                reply(m.rpc("/v3/cluster/member/list", &json!({})).await?)
            })
            .await?;
        let voters = list.members.iter().filter(|m| !m.is_learner).count();
        let detail = match voters {
            0 => "Raft, members not listed".to_string(),
            1 => "Raft, 1 voting member (a write is acknowledged once it is on its disk)".into(),
            n => format!(
                "Raft, {n} voting members (a write is acknowledged once {} have it)",
                n / 2 + 1
            ),
        };
        Ok(Replication {
            can_lose_acknowledged: (voters > 0).then_some(false),
            detail,
        })
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        self.call(timeout, "cannot read", async |m| m.list_leases().await)
            .await
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        self.call(timeout, "cannot release in", async |m| {
            m.clear_lease(name, epoch).await
        })
        .await
    }
}

/// The registry's constructor for `etcd://` and `etcds://` (TLS). Nothing
/// is connected until the first call.
pub fn open(t: &Target<'_>) -> Result<Store, UrlError> {
    Ok(Store::Etcd(EtcdStore::new(t.url)?))
}

/// etcd grants whole seconds, and none shorter than its minimum TTL: 1.5 ×
/// the election timeout, rounded up to a second, which is 2 s with the
/// default 1 s election timeout. A cluster tuned slower grants more than
/// asked; `grant` below refuses that at the first acquisition.
pub const CAPABILITIES: Capabilities = Capabilities {
    granularity: Duration::from_secs(1),
    min_lease: Duration::from_secs(2),
    max_lease: MAX_STORED,
    pushes_wakeups: true,
    failover_extends_lease: true,
};
