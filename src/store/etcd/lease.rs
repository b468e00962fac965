//! The store's operations as requests to the cluster's members: take,
//! renew, give back, read and clear a lease. Every request here may reach
//! etcd more than once (members.rs hedges and retries across members), so
//! each is one that is safe to apply twice, in any order with its copies;
//! each says why, next to it.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::api::*;
use super::members::{EtcdError, Member, Members, Res};
use crate::store::lease::{parse_values, values_text};
use crate::store::sql::millis;
use crate::store::LeaseInfo;

/// Whole seconds, rounded up, at least one.
pub(super) fn ttl_secs(d: Duration) -> i64 {
    let ms = millis(d).max(1) as u64;
    i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX)
}

/// A lease ID for a grant, chosen here rather than by etcd (see
/// `Members::grant`): 63 random bits, never 0 (which asks etcd to
/// choose). The randomness is std's per-process hash keys (from the
/// operating system), applied to a counter and the time.
pub(super) fn fresh_lease_id() -> i64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let keys = RandomState::new();
    loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let id = (keys.hash_one((n, t, std::process::id())) >> 1) as i64;
        if id != 0 {
            return id;
        }
    }
}

/// One renewal on one member (one connection): a `LeaseKeepAlive`, then a
/// linearizable read that the key still holds our value on our etcd lease.
/// `Ok(false)` when the lease or the key is no longer ours.
///
/// **Why the member's Raft term must not move.** A keepalive restores the
/// TTL in the lessor of whichever member believes it leads. A leader that
/// was replaced without knowing it (cut off from its peers, or frozen and
/// just thawed, or stuck on a slow disk: etcd issue 15247) still renews
/// from its own table and answers with a full TTL, while the real leader
/// lets the lease run out: believing that reply would let a rival in
/// before `sent + L`. So the renewal counts only when the reply before the
/// keepalive (a lower bound of the member's term when it handled it), the
/// keepalive's own reply and the read's reply after it all carry the same
/// term T. The read is linearizable: its member (or, for a follower, the
/// leader it forwards to) confirmed with a quorum in term T, after the
/// keepalive was handled, that it still leads; a quorum that had already
/// elected a leader of a later term would not have confirmed it. So the
/// keepalive was handled by the leader of the cluster at that time, and
/// any later leader, on taking over, renews every lease in full from
/// then. Both requests go to this one member for the same reason: a read
/// answered by another member says nothing about who handled the
/// keepalive. Both are safe to repeat: another keepalive only moves the
/// expiry later, a read changes nothing.
async fn renew_on(s: &mut Member, lk: &str, value: &str, id: i64) -> Res<bool> {
    let read = json!({"key": b64(lk)});
    if s.term().is_none() {
        // A new connection: the member's term to start from.
        s.call("/v3/kv/range", &read).await?;
    }
    for _ in 0..3 {
        let before = s.term();
        let r = match s
            .call("/v3/lease/keepalive", &json!({"ID": id.to_string()}))
            .await
        {
            Err(e) if e.is_not_found() => return Ok(false),
            r => reply::<KeepAlive>(r?)?,
        };
        // TTL 0: etcd no longer has the lease (revoked or expired).
        if r.ttl <= 0 {
            return Ok(false);
        }
        let during = s.term();
        // The etcd lease lives; is the key on it still ours? (`leaderrun
        // release` deletes the key and revokes the lease, but either step
        // alone must also count as a loss.)
        let r: Range = reply(s.call("/v3/kv/range", &read).await?)?;
        if before == during && during == s.term() {
            let kv = r.kvs.into_iter().next();
            return Ok(kv.is_some_and(|kv| kv.value == value && kv.lease == id));
        }
        // The term moved under the renewal: whose table it renewed is not
        // known. Again, in the new term.
    }
    Err(EtcdError::Transport(
        "the cluster's leader kept changing during the renewal".into(),
    ))
}

/// The store's operations as requests to the cluster's members (each safe
/// to send more than once, see members.rs).
impl Members {
    pub(super) async fn txn(&mut self, compare: Value, success: Value, failure: Value) -> Res<Txn> {
        let body = json!({"compare": compare, "success": success, "failure": failure});
        reply(self.rpc("/v3/kv/txn", &body).await?)
    }

    pub(super) async fn revoke(&mut self, id: i64) -> Res<()> {
        match self
            .rpc("/v3/lease/revoke", &json!({"ID": id.to_string()}))
            .await
        {
            Err(e) if e.is_not_found() => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Seconds left on an etcd lease; -1 when it is gone.
    pub(super) async fn ttl_left(&mut self, id: i64) -> Res<i64> {
        let body = json!({"ID": id.to_string()});
        let r: TimeToLive = reply(self.rpc("/v3/lease/timetolive", &body).await?)?;
        Ok(r.ttl)
    }

    /// A lease of `ttl` whole seconds, exactly, under the ID `id`, or a
    /// refusal.
    ///
    /// The ID is ours ([`fresh_lease_id`]) rather than etcd's, so that the
    /// grant can be repeated: a copy sent to a second member while the
    /// first hangs (members.rs), or an attempt whose reply
    /// was lost, is told "lease already exists", which here means granted.
    /// With an ID etcd picked, every repeat would leave a lease behind, and
    /// one whose reply was lost could not even be revoked.
    pub(super) async fn grant(&mut self, ttl: i64, id: i64) -> Res<()> {
        let body = json!({"TTL": ttl.to_string(), "ID": id.to_string()});
        let granted = match self.rpc("/v3/lease/grant", &body).await {
            Ok(r) => match reply::<Grant>(r)? {
                g if g.id == id => g.ttl,
                g => {
                    return Err(EtcdError::Refused(format!(
                        "etcd granted no lease: {}",
                        g.error
                    )))
                }
            },
            // Granted by an earlier copy of this request. (Another client
            // choosing the same random 63-bit ID is not a case worth a
            // branch.)
            Err(e) if e.is_exists() => {
                let body = json!({"ID": id.to_string()});
                let r: TimeToLive = reply(self.rpc("/v3/lease/timetolive", &body).await?)?;
                match r.granted_ttl {
                    // Gone again already (revoked, or a call slower than
                    // the TTL): not a minimum to report.
                    0 => {
                        return Err(EtcdError::Transport(
                            "the etcd lease just granted is gone".into(),
                        ))
                    }
                    granted => granted,
                }
            }
            Err(e) => return Err(e),
        };
        if granted != ttl {
            let _ = self.revoke(id).await;
            return Err(EtcdError::Refused(format!(
                "etcd grants leases of at least {granted}s here, not {ttl}s: use --lease {granted}s \
                 or more (its minimum is 1.5 × the cluster's election timeout)"
            )));
        }
        Ok(())
    }

    /// The lease key and the counter, read together (one linearizable txn).
    pub(super) async fn read(&mut self, name: &str) -> Res<(Option<Kv>, Option<Kv>)> {
        let (lease, epoch, _) = self.read_all(name).await?;
        Ok((lease, epoch))
    }

    /// The lease key, the counter and the values, read together.
    async fn read_all(&mut self, name: &str) -> Res<(Option<Kv>, Option<Kv>, Option<Kv>)> {
        let r = self
            .txn(
                json!([]),
                json!([
                    range_op(&lease_key(name)),
                    range_op(&epoch_key(name)),
                    range_op(&value_key(name))
                ]),
                json!([]),
            )
            .await?;
        let lease = r.range(0)?.kvs.first().cloned();
        let epoch = r.range(1)?.kvs.first().cloned();
        let values = r.range(2)?.kvs.first().cloned();
        Ok((lease, epoch, values))
    }

    /// Put the values of the tenure at `epoch` on etcd lease `id`, where
    /// the lease key still holds `value` (ours): for a take that could not
    /// write them in its own transaction (`--once-per`'s, once.rs).
    pub(super) async fn put_values(
        &mut self,
        name: &str,
        value: &str,
        epoch: i64,
        id: i64,
        advertised: &str,
    ) -> Res<()> {
        let (lk, vk) = (lease_key(name), value_key(name));
        let text = values_text(epoch, false, Some(advertised), None);
        self.txn(
            json!([{"key": b64(&lk), "target": "VALUE", "result": "EQUAL", "value": b64(value)}]),
            json!([{"request_put": {"key": b64(&vk), "value": b64(&text), "lease": id.to_string()}}]),
            json!([]),
        )
        .await
        .map(|_| ())
    }

    /// Take the lease: its epoch and the etcd lease behind it.
    pub(super) async fn take(
        &mut self,
        (name, holder, advertise, slots): (&str, &str, Option<&str>, Option<u32>),
        ttl: i64,
    ) -> Res<Option<(i64, i64)>> {
        let mut id = None;
        let res = self
            .try_take(name, holder, (advertise, slots), ttl, &mut id)
            .await;
        // A grant we did not use: hand it back rather than let it linger.
        if !matches!(res, Ok(Some(_))) {
            if let Some(id) = id {
                let _ = self.revoke(id).await;
            }
        }
        res
    }

    pub(super) async fn try_take(
        &mut self,
        name: &str,
        holder: &str,
        (advertise, slots): (Option<&str>, Option<u32>),
        ttl: i64,
        id: &mut Option<i64>,
    ) -> Res<Option<(i64, i64)>> {
        let (lk, ek, vk) = (lease_key(name), epoch_key(name), value_key(name));
        // Bounded by the caller's timeout; more than one round only when a
        // whole acquire-and-release slipped in between our read and write.
        loop {
            let (lease, counter) = self.read(name).await?;
            if lease.is_some() {
                return Ok(None);
            }
            let (current, rev) = match &counter {
                Some(kv) => (
                    kv.value.parse::<i64>().map_err(|_| {
                        EtcdError::Refused(format!("the counter {ek} holds {:?}", kv.value))
                    })?,
                    kv.mod_revision,
                ),
                None => (0, 0),
            };
            // Granted only once the lease looks free, so a waiting
            // contender's polls write nothing. Remembered before it is
            // sent, so that a grant whose reply never came is revoked too.
            let lease_id = match *id {
                Some(i) => i,
                None => {
                    let i = fresh_lease_id();
                    *id = Some(i);
                    self.grant(ttl, i).await?;
                    i
                }
            };
            let epoch = current + 1;
            let value = lease_value(epoch, holder);
            // Safe to send to several members (members.rs):
            // every copy compares the counter's mod_revision with the one
            // read, and the first copy applied changes it, so at most one
            // copy puts anything. A copy applied after another one (or
            // after an earlier attempt whose reply was lost) fails its
            // compare and reads the key back: our value on our etcd lease,
            // which no one else can have put, means the lease is ours.
            let mut puts = vec![
                json!({"request_put": {"key": b64(&lk), "value": b64(&value), "lease": lease_id.to_string()}}),
                json!({"request_put": {"key": b64(&ek), "value": b64(&epoch.to_string())}}),
            ];
            // The values on the same etcd lease, in the same step: there
            // from the moment the lease is, gone when it is. (Without a
            // value there is nothing to put: an earlier tenure's went with
            // its etcd lease.)
            if advertise.is_some() || slots.is_some() {
                let text = values_text(epoch, false, advertise, slots);
                puts.push(json!({"request_put": {"key": b64(&vk), "value": b64(&text), "lease": lease_id.to_string()}}));
            }
            let r = self
                .txn(
                    json!([
                        {"key": b64(&lk), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
                        {"key": b64(&ek), "target": "MOD", "result": "EQUAL", "mod_revision": rev.to_string()},
                    ]),
                    Value::Array(puts),
                    json!([range_op(&lk)]),
                )
                .await;
            let r = match r {
                // Our grant is gone (it ran out, or was revoked, while this
                // call went on): take a new one.
                Err(e) if e.is_not_found() => {
                    *id = None;
                    continue;
                }
                r => r?,
            };
            let ours = r.succeeded || {
                match r.range(0)?.kvs.first() {
                    Some(kv) if kv.value == value && kv.lease == lease_id => true,
                    Some(_) => return Ok(None),
                    None => false,
                }
            };
            if ours {
                return Ok(Some((epoch, lease_id)));
            }
        }
    }

    /// The etcd lease behind our grant: remembered (`known`, the grant
    /// this lock took), or read from the key.
    pub(super) async fn grant_of(
        &mut self,
        name: &str,
        value: &str,
        epoch: i64,
        known: Option<(i64, i64)>,
    ) -> Res<Option<i64>> {
        if let Some((e, id)) = known {
            if e == epoch {
                return Ok(Some(id));
            }
        }
        let (lease, _) = self.read(name).await?;
        Ok(lease.filter(|kv| kv.value == value).map(|kv| kv.lease))
    }

    pub(super) async fn renew_grant(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        known: Option<(i64, i64)>,
    ) -> Res<bool> {
        let value = lease_value(epoch, holder);
        let Some(id) = self.grant_of(name, &value, epoch, known).await? else {
            return Ok(false);
        };
        let lk = lease_key(name);
        let (lk, value) = (lk.as_str(), value.as_str());
        let step = move |mut s: Member| async move {
            let r = renew_on(&mut s, lk, value, id).await;
            (s, r)
        };
        self.call(&step).await
    }

    pub(super) async fn give_back(
        &mut self,
        (name, holder, advertise, slots): (&str, &str, Option<&str>, Option<u32>),
        epoch: i64,
        keep: Duration,
        known: Option<(i64, i64)>,
    ) -> Res<bool> {
        let (lk, vk) = (lease_key(name), value_key(name));
        let value = lease_value(epoch, holder);
        let ours =
            json!([{"key": b64(&lk), "target": "VALUE", "result": "EQUAL", "value": b64(&value)}]);
        let Some(old) = self.grant_of(name, &value, epoch, known).await? else {
            return Ok(false);
        };
        // Each write below is safe to send to several members, applied
        // any number of times in any order: it changes the key only while
        // it holds exactly our `EPOCH:HOLDER`, which no later holder's key
        // can (its epoch is higher), and a revocation of our own etcd lease
        // touches nothing but our key.
        if keep.is_zero() {
            let r = self
                .txn(
                    ours,
                    json!([
                        {"request_delete_range": {"key": b64(&lk)}},
                        {"request_delete_range": {"key": b64(&vk)}}
                    ]),
                    json!([]),
                )
                .await?;
            let done = r.succeeded;
            // Revoked whatever the delete found: our etcd lease holds
            // nothing of anyone else's, and a copy of the delete that was
            // applied first (its reply lost) leaves this one finding
            // nothing to delete.
            let _ = self.revoke(old).await;
            return Ok(done);
        }
        // `--min-hold`: etcd cannot shorten a lease, so the key moves to a
        // new one of `keep` (whole seconds, rounded up) and ours is revoked.
        let new = fresh_lease_id();
        let grant = self
            .rpc(
                "/v3/lease/grant",
                &json!({"TTL": ttl_secs(keep).to_string(), "ID": new.to_string()}),
            )
            .await;
        match grant {
            Err(e) if !e.is_exists() => return Err(e),
            _ => {}
        }
        // The values move with it, marked kept: the run has ended.
        let kept = values_text(epoch, true, advertise, slots);
        let r = self
            .txn(
                ours,
                json!([
                    {"request_put": {"key": b64(&lk), "value": b64(&value), "lease": new.to_string()}},
                    {"request_put": {"key": b64(&vk), "value": b64(&kept), "lease": new.to_string()}}
                ]),
                json!([]),
            )
            .await?;
        let done = r.succeeded;
        let _ = self.revoke(if done { old } else { new }).await;
        Ok(done)
    }

    /// A `LeaseInfo` from the lease key, the counter and the values.
    pub(super) async fn info(
        &mut self,
        name: &str,
        lease: Option<Kv>,
        counter: Option<Kv>,
        values: Option<&Kv>,
    ) -> Res<Option<LeaseInfo>> {
        let counter = counter.and_then(|kv| kv.value.parse::<i64>().ok());
        Ok(match lease {
            Some(kv) => {
                let (epoch, holder) = split_value(&kv.value).ok_or_else(|| {
                    EtcdError::Refused(format!("{} holds {:?}", kv.key, kv.value))
                })?;
                let left = if kv.lease != 0 {
                    self.ttl_left(kv.lease).await?
                } else {
                    i64::MAX / 1000 // a key put by hand, without a lease
                };
                let values = values
                    .map(|v| parse_values(&v.value, epoch))
                    .unwrap_or_default();
                Some(LeaseInfo {
                    name: name.to_string(),
                    holder: Some(holder.to_string()),
                    epoch,
                    // etcd reports the seconds left truncated: the lease
                    // ends within (TTL, TTL + 1] s. Shown as the latest
                    // end, so a key etcd still keeps never reads as expired
                    // (TTL 0 means under a second, not gone; -1 is gone).
                    expires_in_ms: Some(left.saturating_add(1).saturating_mul(1000)),
                    advertised: values.advertised,
                    kept: values.kept,
                    slots: values.slots,
                })
            }
            None => counter.map(|epoch| LeaseInfo {
                name: name.to_string(),
                holder: None,
                epoch,
                expires_in_ms: None,
                ..LeaseInfo::default()
            }),
        })
    }

    pub(super) async fn inspect_lease(&mut self, name: &str) -> Res<Option<LeaseInfo>> {
        let (lease, counter, values) = self.read_all(name).await?;
        self.info(name, lease, counter, values.as_ref()).await
    }

    pub(super) async fn list_leases(&mut self) -> Res<Vec<LeaseInfo>> {
        let r = self
            .txn(
                json!([]),
                json!([
                    prefix_op(LEASE_PREFIX),
                    prefix_op(EPOCH_PREFIX),
                    prefix_op(VALUE_PREFIX)
                ]),
                json!([]),
            )
            .await?;
        let values: HashMap<String, Kv> = r
            .range(2)?
            .kvs
            .iter()
            .cloned()
            .filter_map(|kv| Some((kv.key.strip_prefix(VALUE_PREFIX)?.to_string(), kv)))
            .collect();
        let mut leases: HashMap<String, Kv> = r
            .range(0)?
            .kvs
            .iter()
            .cloned()
            .filter_map(|kv| Some((kv.key.strip_prefix(LEASE_PREFIX)?.to_string(), kv)))
            .collect();
        let mut counters: Vec<Kv> = r.range(1)?.kvs.clone();
        counters.sort_by(|a, b| a.key.cmp(&b.key));
        let mut out = Vec::new();
        for c in counters {
            let Some(name) = c.key.strip_prefix(EPOCH_PREFIX).map(str::to_string) else {
                continue;
            };
            let lease = leases.remove(&name);
            if let Some(i) = self.info(&name, lease, Some(c), values.get(&name)).await? {
                out.push(i);
            }
        }
        Ok(out)
    }

    pub(super) async fn clear_lease(
        &mut self,
        name: &str,
        epoch: Option<i64>,
    ) -> Res<Option<LeaseInfo>> {
        let (lease, counter) = self.read(name).await?;
        let Some(kv) = lease else { return Ok(None) };
        if let Some(e) = epoch {
            if split_value(&kv.value).map(|(k, _)| k) != Some(e) {
                return Ok(None);
            }
        }
        let (lk, rev, id) = (lease_key(name), kv.mod_revision, kv.lease);
        let was = self.info(name, Some(kv), counter, None).await?;
        // Safe to send to several members: it deletes the key only at the
        // revision read, which the first delete applied ends.
        let r = self
            .txn(
                json!([{"key": b64(&lk), "target": "MOD", "result": "EQUAL", "mod_revision": rev.to_string()}]),
                json!([{"request_delete_range": {"key": b64(&lk)}}]),
                json!([range_op(&lk)]),
            )
            .await?;
        // A key still there (or back) has changed hands since the read;
        // gone, it went by this delete (a copy of it whose reply was lost)
        // or ended at that moment by itself: free either way.
        if !r.succeeded && !r.range(0)?.kvs.is_empty() {
            return Ok(None);
        }
        // Revoked too, so the old holder's next keepalive fails at once.
        if id != 0 {
            let _ = self.revoke(id).await;
        }
        Ok(was)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(15)), 15);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
    }
}
