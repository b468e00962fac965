//! `watch`'s line for a `--once-per` run: one when its end is recorded,
//! with its outcome (docs/stores.md, "Once per period").
//!
//! Found, like everything `watch` says, by comparing successive reads: the
//! records of the names watched, remembered by epoch and whether they had
//! an end. A run that started and ended between two reads is said once,
//! when its end is first seen; a run that never gets an end (its leaderrun
//! was killed) gets no line, never a made-up outcome. A store keeps the last
//! run of a name only: an end overwritten by the next run's start between
//! two reads is not said (a short `--retry` makes that unlikely; the lease
//! lines still show both tenures).

use std::collections::BTreeMap;

use super::{now_text, Line, Printer};
use crate::store::RunRecord;

/// The records seen at the last read: per name, the run's epoch and
/// whether its end was recorded.
#[derive(Default)]
pub(super) struct Runs {
    seen: BTreeMap<String, (i64, bool)>,
}

impl Runs {
    /// The lines one read of the records makes. The first read only
    /// remembers: the runs that had ended by then are history.
    pub(super) fn diff(
        &mut self,
        p: &Printer,
        records: Vec<RunRecord>,
        first: bool,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        for r in &records {
            let ended = r.ended_at.is_some();
            let before = self.seen.get(&r.name).copied();
            let new_end = match before {
                _ if !ended || first => false,
                Some((epoch, was_ended)) => epoch != r.epoch || !was_ended,
                None => true,
            };
            if new_end {
                lines.push(p.run_ended(r));
            }
        }
        self.seen = records
            .into_iter()
            .map(|r| {
                let ended = r.ended_at.is_some();
                (r.name, (r.epoch, ended))
            })
            .collect();
        lines
    }
}

impl Printer {
    fn run_ended(&self, r: &RunRecord) -> String {
        let outcome = r.outcome.as_deref().unwrap_or("ended");
        if self.json {
            return self.json_line(Line {
                time: now_text(),
                event: "run_ended",
                name: &r.name,
                slot: 0,
                holder: r.holder.as_deref(),
                epoch: Some(r.epoch),
                previous_epoch: None,
                first_epoch: None,
                outcome: Some(outcome),
                live: false,
                expires_in_ms: None,
                advertised: None,
            });
        }
        format!(
            "{} {} run at epoch {} by {} ended: {}",
            now_text(),
            crate::names::printable(&r.name),
            r.epoch,
            r.holder
                .as_deref()
                .map_or("an unseen holder".into(), crate::names::printable),
            crate::names::printable(outcome)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(epoch: i64, outcome: Option<&str>) -> RunRecord {
        RunRecord {
            name: "n".into(),
            started_at: "2026-12-06T00:00:00Z".into(),
            started_ms_ago: 10,
            ended_at: outcome.map(|_| "2026-12-06T00:00:01Z".into()),
            ended_ms_ago: outcome.map(|_| 5),
            holder: Some("h".into()),
            epoch,
            outcome: outcome.map(str::to_string),
        }
    }

    #[test]
    fn an_end_is_said_once_and_a_run_without_one_never() {
        let p = Printer { json: false };
        let mut runs = Runs::default();
        // History at the first read: nothing said.
        assert!(runs.diff(&p, vec![rec(1, Some("exit 0"))], true).is_empty());
        assert!(runs
            .diff(&p, vec![rec(1, Some("exit 0"))], false)
            .is_empty());
        // A new run, running: nothing yet; its end: one line.
        assert!(runs.diff(&p, vec![rec(2, None)], false).is_empty());
        let l = runs.diff(&p, vec![rec(2, Some("exit 3"))], false);
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].ends_with("n run at epoch 2 by h ended: exit 3"),
            "{l:?}"
        );
        assert!(runs
            .diff(&p, vec![rec(2, Some("exit 3"))], false)
            .is_empty());
        // A whole run between two reads: said when its end is seen.
        let l = runs.diff(&p, vec![rec(4, Some("lost"))], false);
        assert!(l[0].ends_with("ended: lost"), "{l:?}");
        // Killed before writing an end: no line, whatever comes after.
        assert!(runs.diff(&p, vec![rec(5, None)], false).is_empty());
        assert!(runs.diff(&p, vec![rec(5, None)], false).is_empty());
    }

    #[test]
    fn the_json_line_names_the_outcome() {
        let p = Printer { json: true };
        let line = p.run_ended(&rec(7, Some("signal 9")));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "run_ended");
        assert_eq!(v["epoch"], 7);
        assert_eq!(v["outcome"], "signal 9");
        assert_eq!(v["holder"], "h");
    }
}
