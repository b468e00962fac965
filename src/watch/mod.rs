//! `leaderrun watch`: who holds a lease now, then one line for every change.
//!
//! It only looks: nothing here takes, renews or clears a lease, so a watcher
//! can neither delay nor disturb the holders it reports on, and what it
//! prints is a report, not a decision (a script that must act only while it
//! leads runs under leaderrun, or asks `check`).
//!
//! Changes are found by comparing successive reads. With `--name`, on a
//! store that pushes, the watcher subscribes to "this lease was freed or
//! taken" before every read (store/wake.rs, `Heard::Changes`), so a release
//! or an acquisition is printed as soon as the push arrives (a waiting
//! contender hears of releases only); otherwise (MySQL, or no `--name`) it
//! reads every `--retry`, which stays the fallback everywhere. No tenure is left out: every tenure seen held gets a line for
//! its end, and epochs that began and ended between two reads (the epoch
//! rises by one per acquisition) get an `unseen` line, or the end line the
//! store still has the facts for (the last one's holder, where the store
//! keeps it).

mod runs;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use tokio::signal::unix::{signal, SignalKind};

use crate::error::Error;
use crate::exit::Exit;
use crate::store::{LeaseInfo, Store, StoreError, Subscription, Wakeups};

/// What one read said about one lease, and when (on this host's monotonic
/// clock: only used to tell an expiry from a release).
#[derive(Debug, Clone)]
struct Seen {
    info: LeaseInfo,
    at: Instant,
}

/// A change between two reads of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// A holder took the lease (or took it again: a new epoch).
    Acquired { previous_epoch: Option<i64> },
    /// The lease was given back (by its holder, its watchdog or `release`)
    /// before its time ran out. `holder` is `None` for a tenure that began
    /// and ended between two reads on a store that forgets the holder.
    Released { holder: Option<String>, epoch: i64 },
    /// The lease ran out, or was gone after the time it had left.
    Expired { holder: Option<String>, epoch: i64 },
    /// Epochs `first..=last` were taken and ended between two reads, their
    /// holders never seen.
    Unseen { first: i64, last: i64 },
}

/// Epochs rise by one per acquisition, except where a store starts a new
/// range (a Postgres promotion: `(timeline - 1) * 2^32 + 1`). The epochs
/// between `from` (seen) and `to` (seen) that were handed out and never
/// seen, as far as the store's numbering tells: a jump to a new range is
/// not two billion tenures.
fn unseen_between(from: i64, to: i64) -> Option<Change> {
    const RANGE: i64 = 1 << 32;
    let range_start = (to - 1).div_euclid(RANGE) * RANGE + 1;
    let first = from.saturating_add(1).max(range_start);
    let last = to - 1;
    (first <= last).then_some(Change::Unseen { first, last })
}

/// How a tenure seen held at `p` ended, judged by the time it had left at
/// that read (a store that deletes the key keeps no other trace): gone
/// before its time, a release; after, an expiry.
fn ended(p: &Seen, now: Instant) -> Change {
    let holder = p.info.holder.clone();
    let epoch = p.info.epoch;
    let ran_out = p
        .info
        .expires_in_ms
        .is_some_and(|ms| now.duration_since(p.at) >= Duration::from_millis(ms.unsigned_abs()));
    if ran_out {
        Change::Expired { holder, epoch }
    } else {
        Change::Released { holder, epoch }
    }
}

/// A tenure at `c.epoch` that began and ended between two reads, with what
/// the store still knows of it: a SQL store keeps the holder of a lease
/// that ran out and clears it on a release.
fn ended_unseen(c: &LeaseInfo) -> Change {
    let holder = c.holder.clone();
    if holder.is_some() {
        Change::Expired {
            holder,
            epoch: c.epoch,
        }
    } else {
        Change::Released {
            holder,
            epoch: c.epoch,
        }
    }
}

/// Held as far as a reader can tell: a holder, and time left (or a store
/// that keeps a key only while it is held, and says no time).
fn held(l: &LeaseInfo) -> bool {
    l.holder.is_some() && l.expires_in_ms.is_none_or(|ms| ms > 0)
}

/// What changed from `prev` to `cur` (read at `now`), oldest first.
/// Renewals are not changes: a leader that renews is the same leader.
fn change(prev: Option<&Seen>, cur: Option<&LeaseInfo>, now: Instant) -> Vec<Change> {
    let was = prev.filter(|p| held(&p.info));
    let mut out = Vec::new();
    match (was, cur) {
        (Some(p), Some(c)) if held(c) => {
            if c.holder == p.info.holder && c.epoch == p.info.epoch {
                return out;
            }
            // Another tenure now: the one seen ended, and any between.
            out.push(ended(p, now));
            out.extend(unseen_between(p.info.epoch, c.epoch));
            out.push(Change::Acquired {
                previous_epoch: Some(p.info.epoch),
            });
        }
        (None, Some(c)) if held(c) => {
            if let Some(p) = prev {
                out.extend(unseen_between(p.info.epoch, c.epoch));
            }
            out.push(Change::Acquired {
                previous_epoch: prev.map(|p| p.info.epoch),
            });
        }
        (Some(p), Some(c)) if c.epoch > p.info.epoch => {
            // Free now at a later epoch: the tenure seen ended, and every
            // one after it began and ended before this read.
            out.push(ended(p, now));
            out.extend(unseen_between(p.info.epoch, c.epoch));
            out.push(ended_unseen(c));
        }
        (Some(p), cur) => {
            // The tenure seen ended, and none began since. A SQL store
            // keeps the holder of a lease that ran out and clears it on a
            // release; a store that deletes the key (Redis, etcd) does
            // both alike, so there the time it had left decides.
            out.push(match cur {
                Some(c) if c.holder.is_some() => Change::Expired {
                    holder: p.info.holder.clone(),
                    epoch: p.info.epoch,
                },
                _ => ended(p, now),
            });
        }
        // Free at both reads, at a higher epoch: tenures began and ended in
        // between. Said, with what the store still knows of the last.
        (None, Some(c)) if prev.is_none_or(|p| c.epoch > p.info.epoch) && c.epoch > 0 => {
            if let Some(p) = prev {
                out.extend(unseen_between(p.info.epoch, c.epoch));
            }
            out.push(ended_unseen(c));
        }
        (None, _) => {}
    }
    out
}

/// One line of `watch --json`. Scripts parse these names: fields are added,
/// never renamed.
#[derive(serde::Serialize)]
struct Line<'a> {
    time: String,
    /// `state` (the first lines), `acquired`, `released`, `expired` or
    /// `unseen`.
    event: &'static str,
    /// The lease's name as runs give it; a slot's lease `NAME#i` is `NAME`
    /// here, with `slot` i (the text lines say `NAME#i`).
    name: &'a str,
    /// The holder now (`state`, `acquired`), or the one whose tenure ended.
    holder: Option<&'a str>,
    /// `null` for a name the store has never seen.
    epoch: Option<i64>,
    /// For `acquired`: the epoch before, if the lease was known.
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_epoch: Option<i64>,
    /// For `unseen`: the first of the epochs never seen (`epoch` is the
    /// last).
    #[serde(skip_serializing_if = "Option::is_none")]
    first_epoch: Option<i64>,
    /// For `run_ended`: how the `--once-per` run ended, as its record says.
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'a str>,
    live: bool,
    expires_in_ms: Option<i64>,
    /// For `state` and `acquired`: the holder's `--advertise` value.
    #[serde(skip_serializing_if = "Option::is_none")]
    advertised: Option<&'a str>,
    /// The slot (`--slots`): 0 for the lease `NAME` itself.
    slot: u32,
}

/// The lines for one read: `state` lines the first time, changes after.
struct Printer {
    json: bool,
}

impl Printer {
    fn state(&self, name: &str, l: Option<&LeaseInfo>) -> String {
        let time = now_text();
        if self.json {
            let (name, slot) = crate::names::split_slot(name);
            return self.json_line(Line {
                time,
                event: "state",
                name,
                slot,
                holder: l.and_then(|l| l.holder.as_deref()),
                epoch: l.map(|l| l.epoch),
                previous_epoch: None,
                first_epoch: None,
                outcome: None,
                live: l.is_some_and(held),
                expires_in_ms: l.and_then(LeaseInfo::expires_in_ms_shown),
                advertised: l.and_then(|l| l.advertised.as_deref()),
            });
        }
        let name = crate::names::printable(name);
        match l {
            None => format!("{time} {name}: no such lease yet"),
            Some(l) => match (&l.holder, held(l)) {
                (Some(h), true) => format!(
                    "{time} {name} held by {} at epoch {}{}",
                    crate::names::printable(h),
                    l.epoch,
                    advertising(l)
                ),
                _ => format!("{time} {name} free (last epoch {})", l.epoch),
            },
        }
    }

    /// A change's line; `cur` is what the read found, `None` for a change
    /// that is not the read's last (an earlier tenure's end).
    fn change(&self, name: &str, cur: Option<&LeaseInfo>, c: &Change) -> String {
        let time = now_text();
        let (event, holder, epoch, previous_epoch, first_epoch) = match c {
            Change::Acquired { previous_epoch } => (
                "acquired",
                cur.and_then(|l| l.holder.as_deref()),
                cur.map_or(0, |l| l.epoch),
                *previous_epoch,
                None,
            ),
            Change::Released { holder, epoch } => {
                ("released", holder.as_deref(), *epoch, None, None)
            }
            Change::Expired { holder, epoch } => ("expired", holder.as_deref(), *epoch, None, None),
            Change::Unseen { first, last } => ("unseen", None, *last, None, Some(*first)),
        };
        if self.json {
            let (name, slot) = crate::names::split_slot(name);
            return self.json_line(Line {
                time,
                event,
                name,
                slot,
                holder,
                epoch: Some(epoch),
                previous_epoch,
                first_epoch,
                outcome: None,
                live: cur.is_some_and(held),
                expires_in_ms: cur.and_then(LeaseInfo::expires_in_ms_shown),
                advertised: match c {
                    Change::Acquired { .. } => cur.and_then(|l| l.advertised.as_deref()),
                    _ => None,
                },
            });
        }
        let name = crate::names::printable(name);
        let holder = holder.map_or("an unseen holder".into(), crate::names::printable);
        match c {
            Change::Acquired { .. } => {
                let adv = cur.map_or(String::new(), advertising);
                format!("{time} {name} acquired by {holder} at epoch {epoch}{adv}")
            }
            Change::Released { .. } => {
                format!("{time} {name} released by {holder} at epoch {epoch}")
            }
            Change::Expired { .. } => {
                format!("{time} {name} expired: {holder} at epoch {epoch} did not renew")
            }
            Change::Unseen { first, last } if first == last => {
                format!("{time} {name} at epoch {last}: taken and ended between two reads")
            }
            Change::Unseen { first, last } => {
                format!("{time} {name} at epochs {first} to {last}: each taken and ended between two reads")
            }
        }
    }

    fn json_line(&self, line: Line<'_>) -> String {
        // Every field is a string, a number, a bool or null: this cannot
        // fail, and a line is never dropped for it.
        serde_json::to_string(&line).unwrap_or_default()
    }
}

/// `, advertising VALUE` where the holder advertises one.
fn advertising(l: &LeaseInfo) -> String {
    l.advertised.as_deref().map_or(String::new(), |a| {
        format!(", advertising {}", crate::names::printable(a))
    })
}

fn now_text() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Print lines; `false` once nobody reads them (`watch | head -n 2`).
fn print(lines: &[String]) -> bool {
    if lines.is_empty() {
        return true;
    }
    let mut o = std::io::stdout().lock();
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .is_ok()
}

/// Watch `name` (or every lease) until SIGINT or SIGTERM, or until stdout
/// is closed; both end it with success. Store trouble that may heal is
/// reported once and waited out, as a waiting contender does; trouble that
/// will not heal ends it with that error.
pub async fn run(
    store: &mut Store,
    name: Option<String>,
    json: bool,
    retry: Duration,
) -> Result<Exit, Error> {
    let start = |what| move |source| Error::Startup { what, source };
    let mut int = signal(SignalKind::interrupt()).map_err(start("handle SIGINT"))?;
    let mut term = signal(SignalKind::terminate()).map_err(start("handle SIGTERM"))?;
    // Each call is bounded by the poll interval (and at least a second, so a
    // short --retry does not turn a slow store into an unreachable one).
    let call = retry.clamp(Duration::from_secs(1), Duration::from_secs(10));
    // The slots subscribed to (`--slots`; see `slots_to_follow`).
    let mut followed: u32 = 1;
    let mut push: Option<Subscription> = name.as_deref().and_then(|n| store.watch_wakeups(n));
    let printer = Printer { json };
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut runs = runs::Runs::default();
    let mut first = true;
    let mut failing: Option<u32> = None;
    loop {
        // Subscribe before reading: a release after the read is then pushed
        // to this subscription, never lost between the two.
        let armed = match push.as_mut() {
            Some(p) => arm(p, call).await,
            None => false,
        };
        match read(store, name.as_deref(), call).await {
            Ok(leases) => {
                // Decided on this read, acted on once it is printed.
                let more = match name.as_deref() {
                    Some(n) if push.is_some() && !store.wakes_for_every_slot() => {
                        Some(slots_to_follow(n, &leases)).filter(|&want| want > followed)
                    }
                    _ => None,
                };
                if let Some(n) = failing.take() {
                    tracing::warn!(
                        event = "store_recovered",
                        "the store answers again after {n} failed read(s)"
                    );
                }
                let mut lines = diff(&printer, &mut seen, name.as_deref(), leases, first);
                // The `--once-per` records, read after the leases: an end
                // written with a release is seen in the same round as it.
                match store.run_records(name.as_deref(), call).await {
                    Ok(records) => lines.extend(runs.diff(&printer, records, first)),
                    Err(e) => {
                        tracing::debug!(event = "store_error", "cannot read the run records ({e})")
                    }
                }
                first = false;
                if !print(&lines) {
                    return Ok(Exit::Yes);
                }
                // More slots than subscribed to, on a store whose
                // subscription names one lease: subscribe to every one and
                // read again at once (arming first, as always, so nothing
                // between this read and the next is lost). Only ever more:
                // a slot is never forgotten by the store.
                if let (Some(n), Some(want)) = (name.as_deref(), more) {
                    push = follow_more(store, n, push.take(), followed..want);
                    followed = want;
                    continue;
                }
            }
            Err(e) if e.may_heal() => {
                let n = failing.get_or_insert(0);
                if *n == 0 {
                    tracing::warn!(
                        event = "store_error",
                        "cannot read the store ({e}); trying again every {}",
                        crate::duration::show(retry)
                    );
                }
                *n += 1;
            }
            Err(e) => return Err(e.into()),
        }
        tokio::select! {
            _ = int.recv() => return Ok(Exit::Yes),
            _ = term.recv() => return Ok(Exit::Yes),
            _ = tokio::time::sleep(retry) => {}
            r = wake(&mut push), if armed => {
                if let Err(e) = r {
                    tracing::debug!(event = "push_broken", "push wake-ups broke ({e}); polling");
                }
            }
        }
    }
}

/// How many slots of `name` to follow, from what a read found: the `--slots`
/// N a live grant carries, every slot seen, and once there are slots the
/// one above the highest seen too, so that the first acquisition of a slot
/// is pushed as well (a `--slots` run takes the lowest free slot, so a new
/// one is always the next).
fn slots_to_follow(name: &str, leases: &[LeaseInfo]) -> u32 {
    let ours = || {
        leases
            .iter()
            .filter_map(|l| Some((crate::names::slot_of(&l.name, name)?, l)))
    };
    let seen = ours()
        .map(|(i, _)| i)
        .max()
        .map_or(1, |top| top.saturating_add(1));
    let told = ours().filter_map(|(_, l)| l.slots).max().unwrap_or(1);
    let next = if seen > 1 {
        seen.saturating_add(1)
    } else {
        seen
    };
    next.max(told).min(crate::names::MAX_SLOTS)
}

/// `push` with a subscription for each slot of `name` in `more` added; the
/// ones it has are kept, connected (no reconnect, nothing missed on them).
fn follow_more(
    store: &Store,
    name: &str,
    push: Option<Subscription>,
    more: std::ops::Range<u32>,
) -> Option<Subscription> {
    let added: Vec<Subscription> = more
        .map(|i| store.watch_wakeups(&crate::names::slot_name(name, i)))
        .collect::<Option<_>>()?;
    Some(match push? {
        Subscription::Slots(mut all) => {
            all.extend(added);
            Subscription::Slots(all)
        }
        one => Subscription::Slots(std::iter::once(one).chain(added).collect()),
    })
}

/// Subscribe, within `call`; `false` (poll only, this round) when it
/// cannot.
async fn arm(p: &mut Subscription, call: Duration) -> bool {
    match tokio::time::timeout(call, p.arm()).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::debug!(event = "push_broken", "push wake-ups unavailable ({e})");
            false
        }
        Err(_) => false,
    }
}

/// The next push, for a subscription that was armed.
async fn wake(p: &mut Option<Subscription>) -> Result<(), StoreError> {
    match p {
        Some(p) => p.wake().await,
        None => std::future::pending().await,
    }
}

/// One lease, or all of them.
async fn read(
    store: &mut Store,
    name: Option<&str>,
    call: Duration,
) -> Result<Vec<LeaseInfo>, StoreError> {
    match name {
        Some(n) => store.inspect_slots(n, call).await,
        None => store.list(call).await,
    }
}

/// The lines one read makes, and what it saw remembered for the next.
fn diff(
    p: &Printer,
    seen: &mut BTreeMap<String, Seen>,
    name: Option<&str>,
    leases: Vec<LeaseInfo>,
    first: bool,
) -> Vec<String> {
    let at = Instant::now();
    let mut now: BTreeMap<String, LeaseInfo> =
        leases.into_iter().map(|l| (l.name.clone(), l)).collect();
    let mut lines = Vec::new();
    if first {
        if let (Some(n), true) = (name, now.is_empty()) {
            lines.push(p.state(n, None));
        }
        for (n, l) in &now {
            lines.push(p.state(n, Some(l)));
        }
    } else {
        let names: std::collections::BTreeSet<String> =
            seen.keys().chain(now.keys()).cloned().collect();
        for n in names {
            let changes = change(seen.get(&n), now.get(&n), at);
            let last = changes.len().saturating_sub(1);
            for (i, c) in changes.iter().enumerate() {
                let cur = if i == last { now.get(&n) } else { None };
                lines.push(p.change(&n, cur, c));
            }
        }
    }
    seen.clear();
    for (n, info) in std::mem::take(&mut now) {
        seen.insert(n, Seen { info, at });
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(holder: Option<&str>, epoch: i64, ms: Option<i64>) -> LeaseInfo {
        LeaseInfo {
            name: "n".into(),
            holder: holder.map(str::to_string),
            epoch,
            expires_in_ms: ms,
            ..LeaseInfo::default()
        }
    }

    fn seen(l: LeaseInfo, at: Instant) -> Seen {
        Seen { info: l, at }
    }

    /// Every slot seen, and the next; a plain lease is one subscription.
    #[test]
    fn the_slots_followed_are_those_seen_and_the_next() {
        let named = |n: &str| LeaseInfo {
            name: n.into(),
            ..LeaseInfo::default()
        };
        assert_eq!(slots_to_follow("n", &[]), 1);
        assert_eq!(slots_to_follow("n", &[named("n")]), 1);
        assert_eq!(slots_to_follow("n", &[named("n"), named("n#1")]), 3);
        assert_eq!(slots_to_follow("n", &[named("n#3"), named("other")]), 5);
        // A grant of `--slots 3`, alone so far: all three.
        let slotted = LeaseInfo {
            slots: Some(3),
            ..named("n")
        };
        assert_eq!(slots_to_follow("n", &[slotted]), 3);
        let elsewhere = LeaseInfo {
            slots: Some(9),
            ..named("other")
        };
        assert_eq!(slots_to_follow("n", &[named("n"), elsewhere]), 1);
        let top = crate::names::slot_name("n", crate::names::MAX_SLOTS - 1);
        assert_eq!(
            slots_to_follow("n", &[named(&top)]),
            crate::names::MAX_SLOTS
        );
    }

    #[test]
    fn a_renewal_is_not_a_change_and_a_new_epoch_is() {
        let t = Instant::now();
        let a1 = seen(info(Some("a"), 1, Some(3000)), t);
        assert_eq!(
            change(Some(&a1), Some(&info(Some("a"), 1, Some(2900))), t),
            vec![]
        );
        // The same holder at a new epoch took the lease again: the first
        // tenure ended (before its time: a release).
        let released_1 = Change::Released {
            holder: Some("a".into()),
            epoch: 1,
        };
        let acquired = Change::Acquired {
            previous_epoch: Some(1),
        };
        assert_eq!(
            change(Some(&a1), Some(&info(Some("a"), 2, Some(3000))), t),
            vec![released_1.clone(), acquired.clone()]
        );
        // Another holder, after the first one's time ran out.
        let late = t + Duration::from_millis(3000);
        assert_eq!(
            change(Some(&a1), Some(&info(Some("b"), 2, Some(3000))), late),
            vec![
                Change::Expired {
                    holder: Some("a".into()),
                    epoch: 1
                },
                acquired
            ]
        );
        // Two more tenures in between: each one said.
        assert_eq!(
            change(Some(&a1), Some(&info(Some("b"), 4, Some(3000))), t),
            vec![
                released_1,
                Change::Unseen { first: 2, last: 3 },
                Change::Acquired {
                    previous_epoch: Some(1)
                }
            ]
        );
    }

    #[test]
    fn a_first_holder_is_an_acquisition() {
        let t = Instant::now();
        assert_eq!(
            change(None, Some(&info(Some("a"), 1, Some(3000))), t),
            vec![Change::Acquired {
                previous_epoch: None
            }]
        );
        let free = seen(info(None, 4, Some(-10)), t);
        assert_eq!(
            change(Some(&free), Some(&info(Some("a"), 5, None)), t),
            vec![Change::Acquired {
                previous_epoch: Some(4)
            }]
        );
        assert_eq!(
            change(Some(&free), Some(&info(Some("a"), 7, None)), t),
            vec![
                Change::Unseen { first: 5, last: 6 },
                Change::Acquired {
                    previous_epoch: Some(4)
                }
            ]
        );
        // Free, then still free at that epoch, or gone: nothing to say.
        assert_eq!(
            change(Some(&free), Some(&info(None, 4, Some(-900))), t),
            vec![]
        );
        assert_eq!(change(Some(&free), None, t), vec![]);
        assert_eq!(change(None, None, t), vec![]);
        assert_eq!(change(None, Some(&info(None, 0, None)), t), vec![]);
        // Free at a higher epoch: tenures came and went between the reads.
        assert_eq!(
            change(Some(&free), Some(&info(None, 5, Some(-20))), t),
            vec![Change::Released {
                holder: None,
                epoch: 5
            }]
        );
        assert_eq!(
            change(Some(&free), Some(&info(Some("b"), 6, Some(-20))), t),
            vec![
                Change::Unseen { first: 5, last: 5 },
                Change::Expired {
                    holder: Some("b".into()),
                    epoch: 6
                }
            ]
        );
    }

    #[test]
    fn an_end_before_the_time_left_is_a_release_and_after_it_an_expiry() {
        let t = Instant::now();
        let a = seen(info(Some("a"), 3, Some(2000)), t);
        let released = vec![Change::Released {
            holder: Some("a".into()),
            epoch: 3,
        }];
        let expired = vec![Change::Expired {
            holder: Some("a".into()),
            epoch: 3,
        }];
        // A SQL store clears the holder on release and keeps it on expiry.
        assert_eq!(
            change(Some(&a), Some(&info(None, 3, Some(-5))), t),
            released
        );
        assert_eq!(
            change(Some(&a), Some(&info(Some("a"), 3, Some(-5))), t),
            expired
        );
        // A store that deletes the key: the time left decides.
        let soon = t + Duration::from_millis(1999);
        let late = t + Duration::from_millis(2000);
        assert_eq!(change(Some(&a), None, soon), released);
        assert_eq!(change(Some(&a), None, late), expired);
        assert_eq!(change(Some(&a), Some(&info(None, 3, None)), soon), released);
        // A lease with no time known ends by a release.
        let k = seen(info(Some("a"), 3, None), t);
        assert_eq!(change(Some(&k), None, late), released);
    }

    /// Held at 2, then free at 4: the end of 2, epoch 3 unseen, and the
    /// end of 4 with what the store kept of it. Missing any of them was a
    /// whole tenure left out.
    #[test]
    fn tenures_that_began_and_ended_between_two_reads_are_each_said() {
        let t = Instant::now();
        let a = seen(info(Some("a"), 2, Some(2000)), t);
        assert_eq!(
            change(Some(&a), Some(&info(None, 4, Some(-5))), t),
            vec![
                Change::Released {
                    holder: Some("a".into()),
                    epoch: 2
                },
                Change::Unseen { first: 3, last: 3 },
                Change::Released {
                    holder: None,
                    epoch: 4
                },
            ]
        );
        // A store that deletes the key says nothing of epoch 4 but that it
        // was handed out: the next acquisition names it.
        assert_eq!(
            change(Some(&a), Some(&info(Some("c"), 5, Some(900))), t),
            vec![
                Change::Released {
                    holder: Some("a".into()),
                    epoch: 2
                },
                Change::Unseen { first: 3, last: 4 },
                Change::Acquired {
                    previous_epoch: Some(2)
                },
            ]
        );
    }

    /// A Postgres promotion starts epochs at `(timeline - 1) * 2^32 + 1`:
    /// only the new range's skipped epochs are unseen tenures.
    #[test]
    fn a_jump_to_a_new_epoch_range_is_not_billions_of_tenures() {
        let base = 1_i64 << 32;
        assert_eq!(unseen_between(5, base + 1), None);
        assert_eq!(
            unseen_between(5, base + 3),
            Some(Change::Unseen {
                first: base + 1,
                last: base + 2
            })
        );
        assert_eq!(
            unseen_between(5, 8),
            Some(Change::Unseen { first: 6, last: 7 })
        );
        assert_eq!(unseen_between(5, 6), None);
        assert_eq!(unseen_between(7, 6), None);
    }

    #[test]
    fn json_lines_keep_their_field_names() {
        let p = Printer { json: true };
        let l = info(Some("h\"1"), 7, Some(1500));
        let line = p.change(
            "n",
            Some(&l),
            &Change::Acquired {
                previous_epoch: Some(6),
            },
        );
        // The order scripts see (serde_json's Value would sort the keys).
        let at = |k: &str| line.find(&format!("\"{k}\":")).unwrap();
        let order = [
            "time",
            "event",
            "name",
            "holder",
            "epoch",
            "previous_epoch",
            "live",
            "expires_in_ms",
        ];
        assert!(order.windows(2).all(|w| at(w[0]) < at(w[1])), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "acquired");
        assert_eq!(v["holder"], "h\"1");
        assert_eq!(v["epoch"], 7);
        let gone = p.state("n", None);
        let v: serde_json::Value = serde_json::from_str(&gone).unwrap();
        assert_eq!(v["event"], "state");
        assert!(v["epoch"].is_null() && v["holder"].is_null());
        assert_eq!(v["live"], false);
    }

    #[test]
    fn the_first_read_prints_state_and_later_ones_only_changes() {
        let p = Printer { json: false };
        let mut seen = BTreeMap::new();
        let held = vec![info(Some("a"), 1, Some(3000))];
        let first = diff(&p, &mut seen, Some("n"), held.clone(), true);
        assert_eq!(first.len(), 1);
        assert!(first[0].ends_with("n held by a at epoch 1"), "{first:?}");
        assert!(diff(&p, &mut seen, Some("n"), held, false).is_empty());
        let gone = diff(
            &p,
            &mut seen,
            Some("n"),
            vec![info(None, 1, Some(-1))],
            false,
        );
        assert!(gone[0].ends_with("n released by a at epoch 1"), "{gone:?}");
        // Three tenures between two reads: three lines, oldest first.
        let mut seen = BTreeMap::new();
        diff(
            &p,
            &mut seen,
            None,
            vec![info(Some("a"), 2, Some(3000))],
            true,
        );
        let lines = diff(&p, &mut seen, None, vec![info(None, 4, Some(-1))], false);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].ends_with("n released by a at epoch 2"),
            "{lines:?}"
        );
        assert!(
            lines[1].ends_with("n at epoch 3: taken and ended between two reads"),
            "{lines:?}"
        );
        assert!(
            lines[2].ends_with("n released by an unseen holder at epoch 4"),
            "{lines:?}"
        );
        // A name the store has never seen is said so, once.
        let mut fresh = BTreeMap::new();
        let none = diff(&p, &mut fresh, Some("x"), Vec::new(), true);
        assert!(none[0].ends_with("x: no such lease yet"), "{none:?}");
    }
}
