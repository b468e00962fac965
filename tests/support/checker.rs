//! The chaos suite's checker: reads what the children logged and what the
//! fenced resource accepted, and finds every way the guarantees broke.

use std::collections::BTreeMap;
use std::fmt::Write;

/// A fault the nemesis injected, on the boot clock (ns).
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: &'static str,
    /// The contender frozen together with its child (`freeze holder`).
    pub frozen: Option<String>,
    /// For freezes: from SIGCONT until the frozen holder's child was dead.
    pub stopped_after: Option<u128>,
    pub start: u128,
    pub heal: u128,
}

/// One child process, as its log lines show it.
#[derive(Debug, Default, Clone)]
pub struct Run {
    pub who: String,
    pub epoch: i64,
    pub pid: i32,
    pub times: Vec<u128>,
    pub ok: usize,
    pub stale: usize,
}

pub struct Limits {
    /// A thawed holder's child may run this long after SIGCONT ("at once").
    pub thaw: u128,
    /// After a fault heals, a leader's child must be running within this.
    pub recovery: u128,
}

#[derive(Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub summary: String,
}

pub fn parse(log: &str) -> Vec<Run> {
    let mut runs: BTreeMap<(String, i64, i32), Run> = BTreeMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 5 {
            continue;
        }
        let (Ok(t), Ok(epoch), Ok(pid)) = (
            f[0].parse::<u128>(),
            f[2].parse::<i64>(),
            f[3].parse::<i32>(),
        ) else {
            continue;
        };
        let r = runs
            .entry((f[1].to_string(), epoch, pid))
            .or_insert_with(|| Run {
                who: f[1].to_string(),
                epoch,
                pid,
                ..Default::default()
            });
        r.times.push(t);
        match f[4] {
            "ok" => r.ok += 1,
            "stale" => r.stale += 1,
            _ => {}
        }
    }
    let mut v: Vec<Run> = runs.into_values().collect();
    for r in v.iter_mut() {
        r.times.sort();
    }
    v.sort_by_key(|r| r.times[0]);
    v
}

/// Active stretches of a run: its log split at the thaws of the freezes it
/// was in. A stretch after a thaw starts at the SIGCONT and is flagged.
pub fn segments(r: &Run, faults: &[Fault]) -> Vec<(u128, u128, bool)> {
    let mut heals: Vec<u128> = faults
        .iter()
        .filter(|f| f.frozen.as_deref() == Some(r.who.as_str()))
        .map(|f| f.heal)
        .collect();
    heals.sort();
    let mut out: Vec<(usize, u128, u128)> = Vec::new();
    for &t in &r.times {
        let k = heals.iter().filter(|&&h| h <= t).count();
        match out.last_mut() {
            Some((kk, _, e)) if *kk == k => *e = t,
            _ => out.push((k, if k == 0 { t } else { heals[k - 1] }, t)),
        }
    }
    out.into_iter().map(|(k, s, e)| (s, e, k > 0)).collect()
}

fn ms(ns: u128) -> f64 {
    ns as f64 / 1e6
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn check(
    runs: &[Run],
    accepted: &[i64],
    faults: &[Fault],
    end: u128,
    limits: &Limits,
) -> Report {
    let mut rep = Report::default();

    // 1. No two children active at once, but for bounded thaw windows.
    let segs: Vec<(usize, (u128, u128, bool))> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, r)| segments(r, faults).into_iter().map(move |s| (i, s)))
        .collect();
    let mut thaws: Vec<f64> = Vec::new();
    let mut overlaps = 0usize;
    for f in faults {
        if let Some(d) = f.stopped_after {
            thaws.push(ms(d));
            if d > limits.thaw {
                rep.violations.push(format!(
                    "after {} the child was stopped {:.0} ms after SIGCONT; the bound is {:.0} ms",
                    f.kind,
                    ms(d),
                    ms(limits.thaw)
                ));
            }
        }
    }
    for (i, (s, e, thawed)) in &segs {
        if *thawed {
            thaws.push(ms(e - s));
            if e - s > limits.thaw {
                rep.violations.push(format!(
                    "{} (epoch {}) ran {:.0} ms after being thawed; the bound is {:.0} ms",
                    runs[*i].who,
                    runs[*i].epoch,
                    ms(e - s),
                    ms(limits.thaw)
                ));
            }
        }
    }
    for (a, (i, (s1, e1, t1))) in segs.iter().enumerate() {
        for (j, (s2, e2, t2)) in &segs[a + 1..] {
            if i == j || s2 > e1 || s1 > e2 {
                continue;
            }
            if *t1 || *t2 {
                continue; // within a thaw window, bounded above
            }
            overlaps += 1;
            rep.violations.push(format!(
                "overlap: {} (epoch {}) and {} (epoch {}) both ran for {:.0} ms",
                runs[*i].who,
                runs[*i].epoch,
                runs[*j].who,
                runs[*j].epoch,
                ms(e1.min(e2) - s1.max(s2))
            ));
        }
    }

    // 2. Accepted writes never go backwards in epoch.
    for w in accepted.windows(2) {
        if w[1] < w[0] {
            rep.violations.push(format!(
                "accepted write at epoch {} after epoch {}",
                w[1], w[0]
            ));
        }
    }
    let mut epochs: Vec<i64> = runs.iter().map(|r| r.epoch).collect();
    epochs.sort();
    epochs.dedup();
    if epochs.len() != runs.len() {
        rep.violations
            .push("two children ran with the same epoch".into());
    }

    // 3. After each fault heals, a child is active within the recovery bound.
    let mut takeovers: Vec<f64> = Vec::new();
    for f in faults {
        if f.heal + limits.recovery > end {
            continue;
        }
        let active = runs.iter().any(|r| {
            r.times
                .iter()
                .any(|&t| t >= f.heal && t <= f.heal + limits.recovery)
        });
        if !active {
            rep.violations.push(format!(
                "no leader within {:.0} ms after {} healed",
                ms(limits.recovery),
                f.kind
            ));
        }
        // Takeover time: from the fault to the first child started after it,
        // when leadership changed hands.
        if let Some(next) = runs.iter().find(|r| r.times[0] >= f.start) {
            if next.times[0] <= f.heal + limits.recovery {
                takeovers.push(ms(next.times[0] - f.start));
            }
        }
    }

    let stale: usize = runs.iter().map(|r| r.stale).sum();
    let ok: usize = runs.iter().map(|r| r.ok).sum();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in faults {
        *kinds.entry(f.kind).or_default() += 1;
    }
    let worst = takeovers.iter().cloned().fold(f64::NAN, f64::max);
    let max_thaw = thaws.iter().cloned().fold(0.0, f64::max);
    let s = &mut rep.summary;
    let _ = writeln!(s, "faults: {kinds:?}");
    let _ = writeln!(
        s,
        "children (leaderships): {}, takeovers: {}",
        runs.len(),
        runs.len().saturating_sub(1)
    );
    if takeovers.is_empty() {
        // No leadership followed a fault: a median of nothing is not a figure.
        let _ = writeln!(s, "takeover after a fault: none (n = 0)");
    } else {
        let _ = writeln!(
            s,
            "takeover after a fault: median {:.0} ms, worst {:.0} ms (n = {})",
            median(&mut takeovers.clone()),
            worst,
            takeovers.len()
        );
    }
    let _ = writeln!(s, "writes accepted: {ok}, stale writes rejected: {stale}");
    let _ = writeln!(s, "thaw windows (SIGCONT to the child's death, or its last step): {}, longest {max_thaw:.0} ms", thaws.len());
    let _ = writeln!(s, "overlaps: {overlaps} (must be 0)");
    let _ = writeln!(s, "violations, overlaps included: {}", rep.violations.len());
    rep
}
