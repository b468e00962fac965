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
//! Not an ephemeral node (it must outlive the run's session), nor a TTL
//! node (those need the server's `extendedTypesEnabled`, off by default, and
//! are deleted by a sweep): a creation time compared with the same clock is
//! exact and needs nothing of the server.

use std::time::Duration;

use super::conn::{Conn, Res, ZkError};
use super::lease::Paths;
use super::proto::{code, op};
use crate::store::sql::millis;
use crate::store::{RunRecord, NOT_STARTED};

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
pub(super) enum Period {
    /// A run started less than half a period ago.
    Done { started_ms_ago: i64 },
    /// This firing may run; the last record's version, to replace it.
    Open { record: Option<i32> },
}

/// A time by the leader's clock, in milliseconds since 1970, as RFC 3339.
fn rfc3339(ms: i64) -> String {
    let t = match u64::try_from(ms) {
        Ok(ms) => std::time::UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => std::time::UNIX_EPOCH,
    };
    humantime::format_rfc3339_millis(t).to_string()
}

fn foreign() -> ZkError {
    ZkError::Refused("its run node was written by something else".into())
}

impl Conn {
    /// Whether a run of this name started less than `half` ago by the
    /// leader's clock (a `not started` one does not count).
    pub(super) async fn period(&mut self, p: &Paths, half: Duration) -> Res<Period> {
        let Some((data, stat)) = self.get(&p.run).await? else {
            return Ok(Period::Open { record: None });
        };
        let run = Run::decode(&data).ok_or_else(foreign)?;
        if run.outcome.as_deref() != Some(NOT_STARTED) {
            let ago = self.leader_now(&p.dir).await?.saturating_sub(stat.ctime);
            if ago < millis(half) {
                return Ok(Period::Done {
                    started_ms_ago: ago.max(0),
                });
            }
        }
        Ok(Period::Open {
            record: Some(stat.version),
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
}
