//! `--once-per` on etcd (docs/stores.md, "Once per period"). etcd has no
//! clock a client can read, and expiry by its leader's clock is what the
//! lease already trusts, so "a run started less than half a period ago" is
//! a key: `leaderrun/period/NAME`, on an etcd lease of exactly half the
//! period (whole seconds, at least 2: the run form refuses a period etcd
//! cannot keep half of), created by the acquiring transaction beside the
//! lease key, only where it does not exist. The run record,
//! `leaderrun/run/NAME`, is on no etcd lease; its times are the writing
//! host's clock (the only one there is), said so in the docs.
//!
//! Every request here may reach etcd more than once (members.rs), as in
//! lease.rs; each says why it is safe to.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::api::*;
use super::lease::fresh_lease_id;
use super::members::{EtcdError, Members, Res};
use crate::store::{known_outcome, Acquired, Period, RunRecord, NOT_STARTED, SUCCEEDED};

/// The run record as stored (JSON). Times are milliseconds since the Unix
/// epoch by the clock of the host that wrote them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct Stored {
    pub started_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    pub holder: String,
    pub epoch: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// This host's clock, in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Ten years in milliseconds: a time shown is clamped to it.
const MAX_MS: i64 = 10 * 366 * 24 * 3600 * 1000;

fn rfc3339(ms: i64) -> String {
    let t = match u64::try_from(ms) {
        Ok(ms) => std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        Err(_) => std::time::UNIX_EPOCH,
    };
    humantime::format_rfc3339_millis(t).to_string()
}

/// A stored record as `status` shows it, by this host's clock.
pub(super) fn record(name: &str, r: Stored) -> RunRecord {
    let now = now_ms();
    let at = |ms: i64| ms.clamp(now - MAX_MS, now + MAX_MS);
    let started = at(r.started_ms);
    let ended = r.ended_ms.map(at);
    RunRecord {
        name: name.to_string(),
        started_at: rfc3339(started),
        started_ms_ago: now - started,
        ended_at: ended.map(rfc3339),
        ended_ms_ago: ended.map(|e| now - e),
        holder: Some(r.holder),
        epoch: r.epoch,
        outcome: r.outcome,
    }
}

/// The record as the rule reads it: `Err(why)` for one this release
/// cannot make sense of (not its JSON, an outcome it does not write). Its
/// times are not judged: they are the writing host's clock, which the rule
/// never reads (it is etcd's expiry), and a host whose clock is wrong (one
/// without an RTC, booted in 1970) must not refuse every record.
pub(super) fn readable(value: &str) -> Result<Stored, String> {
    let s = serde_json::from_str::<Stored>(value)
        .map_err(|_| "is not a run record this release reads".to_string())?;
    if let Some(o) = s.outcome.as_deref().filter(|o| !known_outcome(o)) {
        return Err(format!(
            "says its run ended \"{}\"",
            crate::names::printable(o)
        ));
    }
    Ok(s)
}

/// What an acquire under the rule found: taken (with the etcd lease
/// behind the lease key), held or done; or a record it cannot read (why).
pub(super) type Took = Result<(Acquired, Option<i64>), String>;

impl Members {
    /// How long ago the period key's run started, from what is left of
    /// its etcd lease (whole seconds, truncated, as etcd reports them).
    async fn started_ms_ago(&mut self, period: &Kv) -> Res<i64> {
        if period.lease == 0 {
            return Ok(0); // put by hand, without a lease
        }
        let body = json!({"ID": period.lease.to_string()});
        let r: TimeToLive = reply(self.rpc("/v3/lease/timetolive", &body).await?)?;
        Ok((r.granted_ttl - r.ttl.max(0)).max(0).saturating_mul(1000))
    }

    /// Take the lease and the period: its epoch and the etcd lease behind
    /// the lease key, or why not. Unused grants are revoked.
    pub(super) async fn take_once(
        &mut self,
        name: &str,
        holder: &str,
        ttl: i64,
        half: i64,
        period: Period,
    ) -> Res<Took> {
        let mut ids = (None, None);
        let res = self
            .try_take_once(name, holder, ttl, half, period, &mut ids)
            .await;
        let taken = matches!(res, Ok(Ok((Acquired::Taken(_), _))));
        if !taken {
            for id in [ids.0, ids.1].into_iter().flatten() {
                let _ = self.revoke(id).await;
            }
        }
        res
    }

    async fn try_take_once(
        &mut self,
        name: &str,
        holder: &str,
        ttl: i64,
        half: i64,
        period: Period,
        ids: &mut (Option<i64>, Option<i64>),
    ) -> Res<Took> {
        let (lk, ek, pk, rk) = (
            lease_key(name),
            epoch_key(name),
            period_key(name),
            run_key(name),
        );
        loop {
            let r = self
                .txn(
                    json!([]),
                    json!([range_op(&lk), range_op(&ek), range_op(&pk), range_op(&rk)]),
                    json!([]),
                )
                .await?;
            let (lease, counter, period_kv, rec) = (
                r.range(0)?.kvs.first().cloned(),
                r.range(1)?.kvs.first().cloned(),
                r.range(2)?.kvs.first().cloned(),
                r.range(3)?.kvs.first().cloned(),
            );
            // A record this release cannot read is never decided on.
            let stored = match &rec {
                Some(kv) => match readable(&kv.value) {
                    Ok(s) => Some(s),
                    Err(why) => return Ok(Err(why)),
                },
                None => None,
            };
            // This period's run has started, whether or not it still holds
            // the lease; unless --retry-failed and that run (the record
            // names the period key's holder and epoch) did not end `exit
            // 0`: failed, or no end, which with the lease key gone (below)
            // is a run that never ended. Then the period is taken again,
            // at the revisions read of the period key and the record.
            let mut again = None;
            if let Some(p) = period_kv {
                let failed = period.retry_failed
                    && stored.as_ref().is_some_and(|s| {
                        lease_value(s.epoch, &s.holder) == p.value
                            && s.outcome.as_deref() != Some(SUCCEEDED)
                    });
                if !failed {
                    let started_ms_ago = self.started_ms_ago(&p).await?;
                    return Ok(Ok((Acquired::DoneThisPeriod { started_ms_ago }, None)));
                }
                let rec_rev = rec.as_ref().map_or(0, |kv| kv.mod_revision);
                again = Some((p, rec_rev));
            }
            if lease.is_some() {
                return Ok(Ok((Acquired::Held, None)));
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
            // Granted only once both look free, remembered before sent
            // (see `try_take`).
            let lease_id = match ids.0 {
                Some(i) => i,
                None => {
                    let i = fresh_lease_id();
                    ids.0 = Some(i);
                    self.grant(ttl, i).await?;
                    i
                }
            };
            let period_id = match ids.1 {
                Some(i) => i,
                None => {
                    let i = fresh_lease_id();
                    ids.1 = Some(i);
                    self.grant(half, i).await.map_err(|e| match e {
                        EtcdError::Refused(m) => EtcdError::Refused(format!(
                            "{m} (for --once-per's period, half of it: use a longer --once-per)"
                        )),
                        e => e,
                    })?;
                    i
                }
            };
            let epoch = current + 1;
            let value = lease_value(epoch, holder);
            let stored = Stored {
                started_ms: now_ms(),
                ended_ms: None,
                holder: holder.to_string(),
                epoch,
                outcome: None,
            };
            let stored = serde_json::to_string(&stored)
                .map_err(|e| EtcdError::Refused(format!("cannot write the run record: {e}")))?;
            // The period key as read: absent, or (a retry) the failed run's,
            // with its record unchanged since.
            let period_cmp = match &again {
                None => json!([
                    {"key": b64(&pk), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
                ]),
                Some((p, rec_rev)) => json!([
                    {"key": b64(&pk), "target": "MOD", "result": "EQUAL", "mod_revision": p.mod_revision.to_string()},
                    {"key": b64(&rk), "target": "MOD", "result": "EQUAL", "mod_revision": rec_rev.to_string()},
                ]),
            };
            let mut compare = vec![
                json!({"key": b64(&lk), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}),
                json!({"key": b64(&ek), "target": "MOD", "result": "EQUAL", "mod_revision": rev.to_string()}),
            ];
            if let serde_json::Value::Array(more) = period_cmp {
                compare.extend(more);
            }
            // Safe to send to several members, as `try_take`'s: the
            // counter's mod_revision lets at most one copy put anything,
            // and a copy that fails reads the lease key back: ours (our
            // value on our etcd lease) means taken, period and record with
            // it, since one transaction put all four.
            let r = self
                .txn(
                    serde_json::Value::Array(compare),
                    json!([
                        {"request_put": {"key": b64(&lk), "value": b64(&value), "lease": lease_id.to_string()}},
                        {"request_put": {"key": b64(&ek), "value": b64(&epoch.to_string())}},
                        {"request_put": {"key": b64(&pk), "value": b64(&value), "lease": period_id.to_string()}},
                        {"request_put": {"key": b64(&rk), "value": b64(&stored)}},
                    ]),
                    json!([range_op(&lk)]),
                )
                .await;
            let r = match r {
                // A grant is gone (it ran out, or was revoked, while this
                // call went on): take new ones.
                Err(e) if e.is_not_found() => {
                    for id in [ids.0.take(), ids.1.take()].into_iter().flatten() {
                        let _ = self.revoke(id).await;
                    }
                    continue;
                }
                r => r?,
            };
            let ours = r.succeeded
                || r.range(0)?
                    .kvs
                    .first()
                    .is_some_and(|kv| kv.value == value && kv.lease == lease_id);
            if ours {
                if let Some((p, _)) = again.filter(|(p, _)| p.lease != 0) {
                    // The failed run's period lease now holds no key: end
                    // it rather than leave it to run out (best effort).
                    let _ = self.revoke(p.lease).await;
                }
                return Ok(Ok((Acquired::Taken(epoch), Some(lease_id))));
            }
            // Someone else's write came between: look again.
        }
    }

    /// Write the run's end and outcome into its record, where the record
    /// is this holder's at `epoch` (a later run's take rewrote it
    /// otherwise); for a run that never started, also delete the period
    /// key, if it is this run's, so the period's next firing runs.
    pub(super) async fn end_run(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        outcome: &str,
    ) -> Res<()> {
        let (pk, rk) = (period_key(name), run_key(name));
        let r = self
            .txn(json!([]), json!([range_op(&rk), range_op(&pk)]), json!([]))
            .await?;
        let (rec, period) = (
            r.range(0)?.kvs.first().cloned(),
            r.range(1)?.kvs.first().cloned(),
        );
        let Some(rec) = rec else { return Ok(()) };
        let Ok(mut stored) = serde_json::from_str::<Stored>(&rec.value) else {
            return Ok(()); // not a record this release wrote: not ours
        };
        if stored.holder != holder || stored.epoch != epoch {
            return Ok(());
        }
        stored.ended_ms = Some(now_ms());
        stored.outcome = Some(outcome.to_string());
        let text = serde_json::to_string(&stored)
            .map_err(|e| EtcdError::Refused(format!("cannot write the run record: {e}")))?;
        // Safe to send to several members: it writes only at the revision
        // read, which the first copy applied moves on.
        self.txn(
            json!([{"key": b64(&rk), "target": "MOD", "result": "EQUAL", "mod_revision": rec.mod_revision.to_string()}]),
            json!([{"request_put": {"key": b64(&rk), "value": b64(&text)}}]),
            json!([]),
        )
        .await?;
        if outcome == NOT_STARTED {
            if let Some(p) = period.filter(|p| p.value == lease_value(epoch, holder)) {
                // Revoking the period's own etcd lease deletes the key with
                // it; safe to repeat (a revoked lease is "not found").
                if p.lease != 0 {
                    self.revoke(p.lease).await?;
                } else {
                    self.txn(
                        json!([{"key": b64(&pk), "target": "MOD", "result": "EQUAL", "mod_revision": p.mod_revision.to_string()}]),
                        json!([{"request_delete_range": {"key": b64(&pk)}}]),
                        json!([]),
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// The run records, of `name` or of every name.
    pub(super) async fn run_records(&mut self, name: Option<&str>) -> Res<Vec<RunRecord>> {
        let op = match name {
            Some(n) => range_op(&run_key(n)),
            None => prefix_op(RUN_PREFIX),
        };
        let r = self.txn(json!([]), json!([op]), json!([])).await?;
        let mut out: Vec<RunRecord> = r
            .range(0)?
            .kvs
            .iter()
            .filter_map(|kv| {
                let name = kv.key.strip_prefix(RUN_PREFIX)?;
                // A value written by hand that is not a record is skipped,
                // as `status` shows a lease it cannot read clamped.
                let stored = serde_json::from_str::<Stored>(&kv.value).ok()?;
                Some(record(name, stored))
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the rule refuses to decide on: not its JSON, an outcome this
    /// release does not write; not a time of another host's clock.
    #[test]
    fn only_a_record_this_release_writes_is_readable() {
        let now = now_ms();
        let rec = |outcome: Option<&str>, started_ms: i64| {
            serde_json::to_string(&Stored {
                started_ms,
                ended_ms: outcome.map(|_| started_ms),
                holder: "h".into(),
                epoch: 1,
                outcome: outcome.map(str::to_string),
            })
            .expect("json")
        };
        for good in [
            rec(None, now),
            rec(Some("exit 0"), now),
            rec(Some("signal 9"), now - 1000),
            rec(Some("not started"), now + 5 * 365 * 86_400_000),
        ] {
            assert!(readable(&good).is_ok(), "{good}");
        }
        for (bad, says) in [
            ("garbage".to_string(), "is not a run record"),
            (
                r#"{"started_ms":"x","holder":"h","epoch":1}"#.to_string(),
                "is not a run record",
            ),
            (
                rec(Some("exploded"), now),
                "says its run ended \"exploded\"",
            ),
        ] {
            let why = readable(&bad).expect_err(&bad);
            assert!(why.contains(says), "{bad}: {why}");
        }
    }

    #[test]
    fn a_record_reads_back_and_an_unended_one_has_no_end() {
        let s = Stored {
            started_ms: now_ms() - 1500,
            ended_ms: None,
            holder: "h".into(),
            epoch: 3,
            outcome: None,
        };
        let text = serde_json::to_string(&s).expect("json");
        assert!(!text.contains("ended_ms"), "{text}");
        let back: Stored = serde_json::from_str(&text).expect("read");
        assert_eq!(back, s);
        let r = record("n", back);
        assert!((1500..5000).contains(&r.started_ms_ago), "{r:?}");
        assert!(r.started_at.ends_with('Z'), "{r:?}");
        assert_eq!((r.ended_at, r.outcome), (None, None));
    }
}
