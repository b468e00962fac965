//! `--once-per` on ZooKeeper (docs/stores.md, "Once per period").
//!
//! The rule and the record are one persistent node, `CHROOT/leaderrun/NAME/run`,
//! made anew by the acquiring `multi` (lease.rs, `take`): its creation time
//! (`ctime`) is the run's start by the ZooKeeper leader's clock, which
//! stamps every transaction; its data names epoch, holder and, once the
//! release wrote it, the outcome, and that write stamps the node's `mtime`:
//! the end. A firing takes the lease only when there is no record, the last
//! one says `not started`, or it was created at least half a period ago by
//! that same clock (read as the stamp of a write, `leader_now`), never a
//! host's. The check and the claim are one step: the `multi` that takes the
//! lease deletes the record at the version read and sets the counter at its
//! version, so of racers that read the same record one passes and the
//! others read again and find its start. The leader's clock only moves on
//! between the read and the `multi`, so a record old enough when read is
//! old enough when replaced.
//!
//! `--retry-failed` reads the same record in the same step: a run of this
//! period whose outcome is anything but `exit 0`, or that has none, leaves
//! the period open to a retrying firing, which then meets the lease check
//! like any take: a run with no end that still holds the lease (its
//! ephemeral node, or a `--min-hold` hold) is held, never run beside; one
//! whose node is gone (its session expired before it wrote an end) failed.
//! The `multi` deletes the record at the version read, and an end written
//! meanwhile (`end_run`) moves that version, so a run that succeeds between
//! the read and the `multi` is never repeated: the `multi` fails and the
//! next read finds `exit 0`.
//!
//! A record this release cannot read (not `EPOCH\nOUTCOME\nHOLDER`, an
//! outcome it does not write, a creation time more than `FUTURE_LIMIT`
//! ahead of the leader's clock) is never decided on: the firing refuses
//! (exit 125), with or without `--retry-failed`.
//!
//! Not an ephemeral node (it must outlive the run's session), nor a TTL
//! node (those need the server's `extendedTypesEnabled`, off by default, and
//! are deleted by a sweep): a creation time compared with the same clock is
//! exact and needs nothing of the server.

use std::time::Duration;

use super::conn::{Conn, Res, ZkError};
use super::lease::Paths;
use super::proto::{code, op};
use crate::store::sql::millis;
use crate::store::{known_outcome, RunRecord, FUTURE_LIMIT, NOT_STARTED, SUCCEEDED};

/// The record's data: `EPOCH\nOUTCOME\nHOLDER`, the outcome `-` until the
/// release writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Run {
    pub epoch: i64,
    pub outcome: Option<String>,
    pub holder: String,
}

impl Run {
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "{}\n{}\n{}",
            self.epoch,
            self.outcome.as_deref().unwrap_or("-"),
            self.holder
        )
        .into_bytes()
    }

    pub fn decode(data: &[u8]) -> Option<Run> {
        let text = std::str::from_utf8(data).ok()?;
        let mut parts = text.splitn(3, '\n');
        let epoch = parts.next()?.parse().ok()?;
        let outcome = match parts.next()? {
            "-" => None,
            o => Some(o.to_string()),
        };
        Some(Run {
            epoch,
            outcome,
            holder: parts.next()?.to_string(),
        })
    }
}

/// What the record says of this firing's period.
pub(super) enum Found {
    /// A run started less than half a period ago (and, under
    /// `--retry-failed`, exited 0).
    Done { started_ms_ago: i64 },
    /// This firing may run, if the lease is free; the last record's
    /// version, to replace it.
    Open { record: Option<i32> },
    /// A record no run of this release writes: why, for
    /// `crate::store::unreadable`.
    Unreadable(String),
}

/// The record's data as the rule reads it: `Err(why)` for data this
/// release does not write (its start is checked against the leader's
/// clock by the caller: it is the node's `ctime`, not in the data).
pub(super) fn readable(data: &[u8]) -> Result<Run, String> {
    let run = Run::decode(data).ok_or("is not a run record this release reads")?;
    if let Some(o) = run.outcome.as_deref().filter(|o| !known_outcome(o)) {
        return Err(format!(
            "says its run ended \"{}\"",
            crate::names::printable(o)
        ));
    }
    Ok(run)
}

/// A time by the leader's clock, in milliseconds since 1970, as RFC 3339.
fn rfc3339(ms: i64) -> String {
    let t = match u64::try_from(ms) {
        Ok(ms) => std::time::UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => std::time::UNIX_EPOCH,
    };
    humantime::format_rfc3339_millis(t).to_string()
}

impl Conn {
    /// Whether a run of this name started less than `rule.half` ago by the
    /// leader's clock (a `not started` one does not count; under
    /// `rule.retry_failed`, neither does one that did not exit 0).
    pub(super) async fn period(&mut self, p: &Paths, rule: crate::store::Period) -> Res<Found> {
        let Some((data, stat)) = self.get(&p.run).await? else {
            return Ok(Found::Open { record: None });
        };
        let run = match readable(&data) {
            Ok(run) => run,
            Err(why) => return Ok(Found::Unreadable(why)),
        };
        let open = Found::Open {
            record: Some(stat.version),
        };
        if run.outcome.as_deref() == Some(NOT_STARTED) {
            return Ok(open);
        }
        let now = self.leader_now(&p.dir).await?;
        // The start is the leader's own stamp, so only a leader clock far
        // ahead once (then set right) puts it there; as on the other
        // stores, a start that far ahead would shut the period for longer
        // than any step an operator would miss, so it is refused.
        let ahead = stat.ctime.saturating_sub(now);
        if ahead > millis(FUTURE_LIMIT) {
            return Ok(Found::Unreadable(format!(
                "says its run started {} from now by the ZooKeeper leader's clock",
                crate::duration::show(Duration::from_millis(ahead.unsigned_abs()))
            )));
        }
        let ago = now.saturating_sub(stat.ctime);
        if ago >= millis(rule.half) {
            return Ok(open);
        }
        // This period's run. Retried only when it failed or has no end; a
        // run with no end that still holds the lease is found held by the
        // take's lease check, after this.
        let failed = run.outcome.as_deref() != Some(SUCCEEDED);
        if rule.retry_failed && failed {
            return Ok(open);
        }
        Ok(Found::Done {
            started_ms_ago: ago.max(0),
        })
    }

    /// Write the run's outcome (and with it, as the node's `mtime`, its
    /// end) where the record is this holder's at `epoch`; a later run's
    /// take replaced it otherwise, and nothing is written.
    pub(super) async fn end_run(
        &mut self,
        p: &Paths,
        holder: &str,
        epoch: i64,
        outcome: &str,
    ) -> Res<()> {
        let Some((data, stat)) = self.get(&p.run).await? else {
            return Ok(());
        };
        let Some(mut run) = Run::decode(&data) else {
            return Ok(());
        };
        if run.holder != holder || run.epoch != epoch {
            return Ok(());
        }
        run.outcome = Some(outcome.to_string());
        let data = run.encode();
        match self
            .request(op::SET_DATA, |w| {
                w.string(&p.run).buffer(&data).int(stat.version);
            })
            .await
        {
            Ok(_) | Err(ZkError::Server(code::BAD_VERSION | code::NO_NODE)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The last `--once-per` run of `name`, its times by the leader's clock
    /// ("ago" too); `None` when it has none.
    pub(super) async fn run_record(&mut self, name: &str, p: &Paths) -> Res<Option<RunRecord>> {
        self.sync(&p.dir).await?;
        let Some((data, stat)) = self.get(&p.run).await? else {
            return Ok(None);
        };
        let Some(run) = Run::decode(&data) else {
            return Ok(None);
        };
        let now = self.leader_now(&p.dir).await?;
        let ended = run.outcome.as_ref().map(|_| stat.mtime);
        Ok(Some(RunRecord {
            name: name.to_string(),
            started_at: rfc3339(stat.ctime),
            started_ms_ago: now.saturating_sub(stat.ctime).max(0),
            ended_at: ended.map(rfc3339),
            ended_ms_ago: ended.map(|e| now.saturating_sub(e).max(0)),
            holder: Some(run.holder),
            epoch: run.epoch,
            outcome: run.outcome,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_rejects_what_is_not_one() {
        for r in [
            Run {
                epoch: 3,
                outcome: None,
                holder: "h\nodd".into(),
            },
            Run {
                epoch: 4,
                outcome: Some(NOT_STARTED.into()),
                holder: "h".into(),
            },
        ] {
            assert_eq!(Run::decode(&r.encode()), Some(r));
        }
        for bad in [&b""[..], b"x\n-\nh", b"1\n-", b"\xff"] {
            assert_eq!(Run::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_rule_reads_only_records_this_release_writes() {
        for good in [&b"3\n-\nh"[..], b"3\nexit 1\nh", b"3\nnot started\nh"] {
            assert!(readable(good).is_ok(), "{good:?}");
        }
        let why = readable(b"3\nexploded\nh").expect_err("an unknown outcome");
        assert!(why.contains("exploded"), "{why}");
        assert!(readable(b"3\nEXIT 0\nh").is_err());
        assert!(readable(b"garbage").is_err());
    }
}
