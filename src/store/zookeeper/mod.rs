//! The ZooKeeper store: an ephemeral node owned by the holder's session,
//! and a counter beside it.
//!
//! The lease *is* a ZooKeeper session: `--lease L` asks for a session
//! timeout of `L`, and the lease node (lease.rs) is ephemeral, so the
//! ensemble deletes it when the session expires, by the ZooKeeper
//! leader's clock, never ours. The server clamps the timeout to its
//! `minSessionTimeout`..`maxSessionTimeout` (by default 2 to 20 × its
//! `tickTime`); a session granted any other timeout than `L` is refused,
//! naming the one it would grant, because the holder's give-up is timed
//! against `L`.
//!
//! **Why every call of the lease loop starts with a handshake.** A session
//! lives as long as the ZooKeeper *leader* keeps hearing of it. A server
//! that is a follower does not tell the leader of a request when it
//! forwards it: it hands on the sessions it heard from when it answers
//! the leader's next ping (every `tickTime / 2`). So a renewal answered
//! through a follower that is cut off just after may never reach the
//! leader's session table, and the leader would expire the session `L`
//! after an *earlier* renewal, before `sent + L`. A handshake that resumes
//! a session is different: a follower revalidates it with the leader
//! before it answers, and the leader restarts the session's timeout when
//! it does; the leader itself does the same on its own. So `acquire` and
//! `renew` each connect anew, resuming the session, and only then write:
//! the timeout restarts no earlier than the call was sent, whichever
//! server answers. A new leader restarts every session's full timeout
//! when it takes over, which only lengthens the lease (hence
//! `failover_extends_lease`).
//!
//! Renewal is a `multi` of a check of the counter at the version of our
//! grant and a rewrite of the lease node, unchanged, at its version, which
//! the leader runs through its quorum after checking that the session is
//! alive: a `true` means a quorum agreed, after the revalidation, that the
//! lease is ours. The rewrite stamps the node with the renewal's time by
//! the leader's clock, from which `inspect` tells how long is left.
//!
//! A server behind what this client has already seen refuses to resume
//! its session (conn.rs), so moving between servers never shows older
//! state; `status` and `list` also `sync` first.
//!
//! `--min-hold` leaves a persistent node that ends `keep` after its
//! creation by the ZooKeeper leader's clock, compared with that same
//! clock (lease.rs, `leader_now`): across a failover of the ensemble
//! it is a different machine's clock. That node is the keep's "kept" mark,
//! and the lease node carries the `--advertise` value (lease.rs says why
//! there, not in a node of their own). `--once-per`'s rule and record are
//! a node made anew by the acquiring `multi`, by that same clock (once.rs).
//!
//! With `zk://user:password@…`, every node is created with the creator's
//! ACL (digest authentication), so only the same credentials may touch a
//! lease; a wrong password shows as `NoAuth` and will not heal.

use std::time::Duration;

use super::session::{Connect, Session};
use super::wake::{Heard, Subscription};
use super::{
    Acquired, Backend, Capabilities, Init, LeaseInfo, LeaseKey, Outcome, Replication, RunRecord,
    Store, StoreError, Target, UrlError,
};

mod conn;
mod ensemble;
mod lease;
mod once;
mod proto;
mod url;
pub(crate) mod wake;

use self::conn::{Conn, Creds, Res, ZkError};
use self::ensemble::Ensemble;
use self::lease::{Grant, Paths};
use self::proto::Acl;

pub struct ZkStore {
    /// The lease's session: its timeout is the lease, and only the lease
    /// loop's calls touch it.
    s: Session<Ensemble>,
    /// A session of its own for reads and operators' calls: a call on the
    /// lease's session would keep it alive, so `status` run by the holder
    /// would extend its own lease.
    ops: Session<Ensemble>,
    /// `CHROOT/leaderrun`: where the leases are.
    root: String,
}

impl ZkStore {
    fn new(url: &::url::Url) -> Result<ZkStore, UrlError> {
        let p = url::from_url(url)?;
        let lease = Ensemble::new(p.hosts, p.user, p.shown);
        Ok(ZkStore {
            root: format!("{}/leaderrun", p.chroot),
            ops: Session::new(lease.detached()),
            s: Session::new(lease),
        })
    }

    /// Nodes are the credentials' own when the URL names a user.
    fn acl(&self) -> Acl {
        if self.s.c.user.is_some() {
            Acl::Creator
        } else {
            Acl::Open
        }
    }

    /// A call on the lease's session.
    async fn call<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: impl AsyncFnOnce(&mut Conn) -> Res<T>,
    ) -> Result<T, StoreError> {
        self.s
            .call(timeout, what, async move |c, _deadline| f(c).await)
            .await
    }

    /// A call on the operators' session, never the lease's.
    async fn op<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: impl AsyncFnOnce(&mut Conn) -> Res<T>,
    ) -> Result<T, StoreError> {
        self.ops
            .call(timeout, what, async move |c, _deadline| f(c).await)
            .await
    }

    /// For the lease loop: a session whose timeout is the lease, made or
    /// resumed by a fresh handshake (the module's doc says why).
    fn for_lease(&mut self, lease: Duration) {
        let ms = i32::try_from(lease.as_millis()).unwrap_or(i32::MAX);
        self.s.c.ask(ms, true);
        self.s.reset();
    }
}

impl Backend for ZkStore {
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        self.for_lease(lease);
        let (root, p, acl) = (
            self.root.clone(),
            Paths::new(&self.root, &key.name),
            self.acl(),
        );
        let got = self
            .call(timeout, "cannot acquire in", async |c| {
                c.take(&root, &p, key, lease, None, acl).await
            })
            .await?;
        // A plain take never reads the run record.
        Ok(got.ok().and_then(Acquired::epoch))
    }

    /// The advertised value and the keep mark are in the lease node
    /// (lease.rs says why).
    fn advertises(&self) -> bool {
        true
    }

    fn slots(&self) -> bool {
        true
    }

    fn once_per(&self) -> bool {
        true
    }

    /// The period is the run record's creation time by the ZooKeeper
    /// leader's clock, checked and replaced in the acquiring `multi`, with
    /// `--retry-failed` read from the same record (once.rs).
    async fn acquire_once(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: crate::store::Period,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        self.for_lease(lease);
        let (root, p, acl) = (
            self.root.clone(),
            Paths::new(&self.root, &key.name),
            self.acl(),
        );
        let got = self
            .call(timeout, "cannot acquire in", async |c| {
                c.take(&root, &p, key, lease, Some(period), acl).await
            })
            .await?;
        got.map_err(|why| crate::store::unreadable(&self.describe(), &key.name, &why))
    }

    /// The record's end first, then the release: a `not started` run's
    /// record says so before the lease is free, so no racer finds the lease
    /// free and the period taken. A record that could not be written does
    /// not keep the lease from being handed back.
    async fn release_ending(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        outcome: Outcome,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (p, acl) = (Paths::new(&self.root, &key.name), self.acl());
        let holder = key.holder.as_str();
        let outcome = outcome.to_string();
        let (ended, released) = self
            .op(timeout, "cannot release in", async |c| {
                let ended = c.end_run(&p, holder, epoch, &outcome).await;
                let released = c.give_back(&p, holder, epoch, keep, acl).await?;
                Ok((ended.err(), released))
            })
            .await?;
        if let Some(e) = ended {
            tracing::warn!(
                event = "store_error",
                epoch,
                "could not write the end of the run of {} into the store {}: {e}; its record \
                 shows no end",
                key.name,
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
        let root = self.root.clone();
        self.op(timeout, "cannot read", async |c| {
            let names = match name {
                Some(n) => vec![n.to_string()],
                None => {
                    let mut all: Vec<String> = c
                        .children(&root)
                        .await?
                        .iter()
                        .filter_map(|n| lease::lease_name(n))
                        .collect();
                    all.sort();
                    all
                }
            };
            let mut out = Vec::new();
            for n in names {
                if let Some(r) = c.run_record(&n, &Paths::new(&root, &n)).await? {
                    out.push(r);
                }
            }
            Ok(out)
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
        self.for_lease(lease);
        let p = Paths::new(&self.root, &key.name);
        let holder = key.holder.as_str();
        if self.s.c.creds.is_none() {
            // Not this lock's grant (another process names holder and
            // epoch): the session is the one the lease node names, resumed.
            let path = p.lease.clone();
            let node = self
                .op(timeout, "cannot renew in", async |c| c.get(&path).await)
                .await?;
            let grant = node.and_then(|(data, _)| Grant::decode(&data));
            match grant {
                Some(Grant {
                    epoch: e,
                    hold: false,
                    session: Some((id, passwd)),
                    holder: h,
                    ..
                }) if e == epoch && h == holder => {
                    self.s.c.creds = Some(Creds {
                        id,
                        passwd,
                        timeout_ms: i32::try_from(lease.as_millis()).unwrap_or(i32::MAX),
                    });
                }
                _ => return Ok(false),
            }
        }
        let had = self.s.c.creds.as_ref().map(|c| c.id);
        let (ours, expired) = self
            .call(timeout, "cannot renew in", async |c| {
                // A session that expired was replaced by a fresh one in the
                // handshake: the lease node went with the old one.
                if had != Some(c.creds.id) {
                    return Ok((false, true));
                }
                Ok((c.still_ours(&p, holder, epoch).await?, false))
            })
            .await?;
        if expired {
            // The loss that follows says only that the renewal matched
            // nothing; this is why, on this store.
            tracing::warn!(
                event = "session_expired",
                epoch,
                "the ZooKeeper session that held lease {} expired (or was closed) in {}: the \
                 ensemble deleted its lease node",
                key.name,
                self.s.c.shown()
            );
        }
        Ok(ours)
    }

    async fn release(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (p, acl) = (Paths::new(&self.root, &key.name), self.acl());
        let holder = key.holder.as_str();
        // From the operators' session: a release names holder and epoch and
        // deletes at the node's version, from whichever session (the
        // watchdog's own store has no lease session).
        self.op(timeout, "cannot release in", async |c| {
            c.give_back(&p, holder, epoch, keep, acl).await
        })
        .await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let p = Paths::new(&self.root, name);
        self.op(timeout, "cannot read", async |c| c.info(name, &p).await)
            .await
    }

    fn describe(&self) -> String {
        self.s.c.shown()
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn wakeups(&self, name: &str, heard: Heard) -> Option<Subscription> {
        let path = Paths::new(&self.root, name).lease;
        Some(Subscription::ZooKeeper(wake::ZkWakeups::new(
            self.s.c.detached(),
            path,
            heard,
        )))
    }

    /// The root node, with the credentials' ACL when the URL names a user:
    /// run once with the right credentials, it keeps every other identity
    /// out of the leases. Then what a run does under it is tried, so that
    /// the answer is "ready" only when a run would work; otherwise it names
    /// the permissions missing and the node's ACL (exit 125).
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        let (root, acl) = (self.root.clone(), self.acl());
        let (was, missing, entries) = self
            .op(timeout, "cannot use", async |c| {
                let was = c.exists(&root, false).await?;
                c.ensure_root(&root, acl).await?;
                let missing = c.lacks_under(&root).await?;
                // Reading an ACL needs read or admin: a node this identity
                // may not read shows none.
                let entries = match c.acl_of(&root).await {
                    Ok(e) => e,
                    Err(ZkError::Server(proto::code::NO_AUTH)) => Vec::new(),
                    Err(e) => return Err(e),
                };
                Ok((was, missing, entries))
            })
            .await?;
        let shown = self.s.c.shown();
        let acl_text = if entries.is_empty() {
            "not readable by this identity".to_string()
        } else {
            entries.join(", ")
        };
        let identity = match &self.s.c.user {
            Some((user, _)) => format!("digest user {user}"),
            None => "anyone (no user in the store URL)".to_string(),
        };
        if !missing.is_empty() {
            return Err(StoreError::fatal(format!(
                "{identity} may not {} under {root} in the store {shown} (its ACL: {acl_text}); \
                 a run creates a node there for each lease name and lists them: give this \
                 identity cr on it (zkCli: setAcl {root} …), or remove it and run leaderrun \
                 init with the credentials that are to own it",
                missing.join(" or "),
            )));
        }
        let open_to_all = entries.iter().any(|e| e.starts_with("world:anyone:"));
        let what = if was {
            format!("{root} was already in {shown}; {identity} may create and read under it")
        } else {
            format!("created {root} in {shown}")
        };
        let warn = if self.s.c.user.is_some() && open_to_all {
            "; anyone may create leases under it (world:anyone): to keep the node this identity's, \
             remove it and run leaderrun init again"
        } else {
            ""
        };
        Ok(Init::Done(format!("{what} (ACL: {acl_text}){warn}")))
    }

    /// ZAB: a write is acknowledged once a quorum of the voting servers
    /// logged it, so no failover of the ensemble loses it.
    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        let config = self
            .op(timeout, "cannot read", async |c| {
                Ok(c.get("/zookeeper/config").await?.map(|(d, _)| d))
            })
            .await?;
        let voters = config
            .as_deref()
            .map(String::from_utf8_lossy)
            .map_or(0, |text| {
                text.lines()
                    .filter(|l| l.starts_with("server.") && !l.contains(":observer"))
                    .count()
            });
        let detail = match voters {
            0 | 1 => "ZAB, a single server (a write is acknowledged once it is on its disk)".into(),
            n => format!(
                "ZAB, {n} voting servers (a write is acknowledged once {} have it)",
                n / 2 + 1
            ),
        };
        Ok(Replication {
            can_lose_acknowledged: Some(false),
            detail,
        })
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let root = self.root.clone();
        self.op(timeout, "cannot read", async |c| c.every(&root).await)
            .await
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let p = Paths::new(&self.root, name);
        self.op(timeout, "cannot release in", async |c| {
            c.clear(name, &p, epoch).await
        })
        .await
    }
}

/// The registry's constructor for `zk://` and `zookeeper://`. Nothing is
/// connected until the first call.
pub fn open(t: &Target<'_>) -> Result<Store, UrlError> {
    Ok(Store::ZooKeeper(ZkStore::new(t.url)?))
}

/// Session timeouts are milliseconds, an `int` on the wire. The server's
/// own bounds are learnt at the first handshake (ensemble.rs refuses a
/// timeout it would not grant).
pub const CAPABILITIES: Capabilities = Capabilities {
    granularity: Duration::from_millis(1),
    min_lease: Duration::from_millis(1),
    max_lease: Duration::from_millis(i32::MAX as u64),
    pushes_wakeups: true,
    failover_extends_lease: true,
};
