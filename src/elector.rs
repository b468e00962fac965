//! The lease loop: waiting → leading(epoch) → lost / released.
//!
//! The elector knows nothing of processes. It answers two questions for the
//! caller: "do we lead now, at which epoch?" and "when must we stop?".
//!
//! Safety reasoning (docs/contract.md §3–§6), enforced here and only here:
//!
//! * `sent` is read from the boot clock *before* a renewal is sent. The store
//!   executes it later and sets expiry to `≥ sent + L` on its own clock. So
//!   while the two clocks agree on the *rate* of time over one lease, no rival
//!   can acquire before `sent + L`, and stopping at `sent + G` (SIGKILL at
//!   `sent + G + K`, with `G + K < L`) leaves the child dead first.
//! * The give-up deadline is a timer on the boot clock, raced against every
//!   store call (`select!`, deadline branch first). A hung call, a blackholed
//!   connection or a slow reconnect cannot delay step-down.
//! * After any wake-up — a timer, a reply — the deadline is checked *before*
//!   a reply is believed. A process frozen past its deadline (SIGSTOP, VM
//!   pause, suspend) sees the deadline first and gives up without talking to
//!   the store; a renewal reply that arrives after the deadline is ignored.
//! * A renewal that matches nothing means someone else holds the lease (or it
//!   expired): that is a loss at once, never retried.

use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use crate::clock::{Clock, Stamp};
use crate::duration::{about, show};
use crate::store::{Acquired, LeaseInfo, LeaseLock, Outcome, StoreError, Wakeups};
use crate::timing::Timing;

/// A lease we hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub epoch: i64,
    /// When the last successful acquire/renew was sent (boot clock).
    pub sent: Stamp,
    /// When the acquisition was confirmed; `--min-hold` counts from here.
    pub acquired_at: Stamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// No renewal succeeded before the give-up deadline.
    GaveUp,
    /// The process woke up (or a reply arrived) past the give-up deadline.
    WokeLate(Duration),
    /// A renewal matched nothing: the lease is someone else's now.
    Superseded,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::GaveUp => f.write_str("no renewal succeeded before the give-up deadline"),
            LossReason::WokeLate(by) => write!(
                f,
                "woke up {} past the give-up deadline (frozen or suspended)",
                show(*by)
            ),
            LossReason::Superseded => f.write_str(
                "the renewal matched nothing: the lease is no longer ours at this epoch \
                     (another holder took it, or it was released)",
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost {
    pub reason: LossReason,
    /// The give-up deadline of the lease that was lost.
    pub deadline: Stamp,
}

/// How the waiting phase ended.
#[derive(Debug)]
pub enum Waited<I> {
    Acquired(Lease),
    /// Try-once found the lease held.
    Held(Option<LeaseInfo>),
    /// `--once-per`: a run of this name started this long ago by the
    /// store's clock, less than half a period: this firing's run is done.
    DoneThisPeriod {
        started_ms_ago: i64,
    },
    /// `--timeout` passed.
    TimedOut,
    /// Something arrived on the interrupt channel (a signal, for the CLI).
    Interrupted(I),
    Failed(StoreError),
}

/// What one acquisition attempt came to.
enum Attempted {
    Lease(Lease),
    Held,
    Done { started_ms_ago: i64 },
}

/// Told what the elector sees, for status reporting (systemd, metrics).
/// Every method has a no-op default.
pub trait Observer {
    /// A wait attempt found the lease held; `held` is who holds it, when the
    /// store could say (the elector always asks; `wants_holder` is not
    /// consulted).
    fn waiting(&mut self, _held: Option<&LeaseInfo>) {}
    fn wants_holder(&self) -> bool {
        false
    }
    fn renewed(&mut self, _lease: &Lease) {}
    fn renew_failed(&mut self, _epoch: i64) {}
}

pub struct Elector<L: LeaseLock, C> {
    /// The lease this elector takes and holds, for its one holder.
    pub lock: L,
    clock: C,
    timing: Timing,
    observer: Option<Box<dyn Observer>>,
    /// Push wake-ups, when the store has them and they are not switched off.
    wakeups: Option<L::Wakeups>,
    /// The subscription is known broken (logged once per outage).
    push_broken: bool,
    /// A failover of the store may extend a lease by up to its full length
    /// (etcd re-extends every lease when a new leader takes over), so a
    /// lease that could not be handed back may outlive `sent + L`.
    failover_extends_lease: bool,
}

/// Added to a lease's time to expiry when scheduling the next attempt for
/// it: the stores report whole milliseconds (rounded), and a timer may fire
/// a little early by the store's reckoning. Too early costs one more
/// attempt; this keeps that rare.
const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

impl<L: LeaseLock, C: Clock> Elector<L, C> {
    pub fn new(lock: L, clock: C, timing: Timing) -> Self {
        Elector {
            lock,
            clock,
            timing,
            observer: None,
            wakeups: None,
            push_broken: false,
            failover_extends_lease: false,
        }
    }

    /// The store's failover may extend a lease by up to its full length
    /// (see [`Elector::release_after_loss`]).
    pub fn failover_extends_lease(&mut self, yes: bool) {
        self.failover_extends_lease = yes;
    }

    /// Wake up for a release instead of waiting for the next poll.
    pub fn push(&mut self, w: L::Wakeups) {
        self.wakeups = Some(w);
    }

    /// Subscribe before an attempt (src/store/wake.rs); false when there is
    /// no subscription to wait on, and the next wait is a plain poll. Bounded
    /// like one call: a subscription that cannot be made must not hold up
    /// the attempt it precedes.
    async fn arm(&mut self) -> bool {
        let Some(w) = self.wakeups.as_mut() else {
            return false;
        };
        let budget = self.timing.call_cap().min(self.timing.retry);
        let until = self.clock.now() + budget;
        let res = tokio::select! {
            biased;
            _ = self.clock.sleep_until(until) => Err(StoreError::unavailable(format!(
                "no subscription within {}", show(budget)))),
            r = w.arm() => r,
        };
        match res {
            Ok(()) => {
                if self.push_broken {
                    tracing::debug!(event = "push_restored", "push wake-ups work again");
                    self.push_broken = false;
                }
                true
            }
            Err(e) => {
                self.subscription_broke(&e);
                false
            }
        }
    }

    fn subscription_broke(&mut self, e: &StoreError) {
        if self.push_broken {
            tracing::debug!(
                event = "push_broken",
                "push wake-ups still unavailable: {e}"
            );
        } else {
            // Info, not a warning: nothing is lost but speed, polling
            // carries on, and the subscription is rebuilt before every
            // attempt.
            tracing::info!(
                event = "push_broken",
                "push wake-ups unavailable ({e}); polling every {} until they work again",
                show(self.timing.retry)
            );
            self.push_broken = true;
        }
    }

    pub fn observe(&mut self, o: Box<dyn Observer>) {
        self.observer = Some(o);
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// One acquisition attempt, bounded by the give-up interval (and by
    /// `until`, when given). A lease confirmed only after its own give-up
    /// deadline is useless: it is handed back and reported as unavailable.
    async fn attempt(&mut self, until: Option<Stamp>) -> Result<Attempted, StoreError> {
        let sent = self.clock.now();
        let mut deadline = sent + self.timing.give_up;
        if let Some(u) = until {
            deadline = deadline.min(u);
        }
        let budget = deadline.saturating_since(sent);
        let res = tokio::select! {
            biased;
            _ = self.clock.sleep_until(deadline) => Err(StoreError::unavailable(format!(
                "no answer from {} within {}", self.lock.shown(), show(budget)))),
            r = self.lock.take(self.timing.lease, budget) => r,
        };
        let epoch = match res? {
            Acquired::Taken(epoch) => epoch,
            Acquired::Held => return Ok(Attempted::Held),
            Acquired::DoneThisPeriod { started_ms_ago } => {
                return Ok(Attempted::Done { started_ms_ago })
            }
        };
        let now = self.clock.now();
        if now >= sent + self.timing.give_up {
            let late = now - sent;
            // Nothing ran on it: under `--once-per` the period is still to run.
            self.lock.ending(Outcome::NotStarted);
            self.hand_back_until(epoch, Duration::ZERO, sent + self.timing.lease)
                .await;
            return Err(StoreError::unavailable(format!(
                "the store confirmed the lease only after {}, too late to use it",
                show(late)
            )));
        }
        Ok(Attempted::Lease(Lease {
            epoch,
            sent,
            acquired_at: now,
        }))
    }

    /// Try once, or (with `wait`) every `P` until leading, `timeout`, an
    /// interrupt or a fatal store error; with push wake-ups also the moment
    /// the lease is released, and in any case when the lease expires by the
    /// store's clock, if that is before the next poll. Interrupts are looked at between
    /// attempts, never in the middle of one, so an acquisition the store has
    /// already granted is handed back rather than left to expire.
    pub async fn wait_for_lease<I>(
        &mut self,
        wait: bool,
        timeout: Option<Duration>,
        interrupt: &mut UnboundedReceiver<I>,
    ) -> Waited<I> {
        let until = timeout.map(|t| self.clock.now() + t);
        let mut failing = false;
        let mut seen_held = false;
        let mut first = true;
        // Consecutive attempts made at a lease's expiry that still found it
        // held (a store that deletes expired keys a little late): each one
        // doubles the least wait, so such a store is not hammered.
        let mut early = 0u32;
        loop {
            // Subscribe before the attempt, so a release after it is seen.
            // Not before the very first one: an uncontended start pays
            // nothing, and a contended one subscribes and tries once more
            // at once (below).
            let armed = wait && !first && self.arm().await;
            let started = self.clock.now();
            let res = match self.attempt(until).await {
                Ok(Attempted::Lease(l)) => Ok(Some(l)),
                Ok(Attempted::Held) => Ok(None),
                // The run form refuses `--once-per` with `--wait`: a
                // standby has no firing, so this ends a try-once.
                Ok(Attempted::Done { started_ms_ago }) => {
                    return Waited::DoneThisPeriod { started_ms_ago }
                }
                Err(e) => Err(e),
            };
            if let Ok(sig) = interrupt.try_recv() {
                if let Ok(Some(lease)) = res {
                    self.lock.ending(Outcome::NotStarted);
                    self.hand_back_until(
                        lease.epoch,
                        Duration::ZERO,
                        lease.sent + self.timing.lease,
                    )
                    .await;
                }
                return Waited::Interrupted(sig);
            }
            let mut expires_at = None;
            match res {
                Ok(Some(lease)) => {
                    if failing {
                        // The retry that found the store healed also won:
                        // the trouble a cron mail shows must still end.
                        tracing::warn!(event = "store_recovered", "the store answers again");
                    }
                    return Waited::Acquired(lease);
                }
                Ok(None) if !wait => {
                    let info = self
                        .who_holds(tracing::enabled!(tracing::Level::INFO))
                        .await;
                    return Waited::Held(info);
                }
                Ok(None) if first && self.wakeups.is_some() => {
                    first = false;
                    continue;
                }
                Ok(None) => {
                    let log_it = !seen_held && tracing::enabled!(tracing::Level::INFO);
                    // Always asked: when the lease expires decides when the
                    // next attempt goes out.
                    let held = self.who_holds(true).await;
                    if let Some(info) = held.as_ref().filter(|i| i.holder.is_some()) {
                        // The store's own count of the time left, added to
                        // our clock after the answer arrived: the answer
                        // took time to come back, so this is no earlier
                        // than the store's expiry.
                        let left =
                            Duration::from_millis(info.expires_in_ms.unwrap_or(0).max(0) as u64);
                        expires_at = Some(self.clock.now() + left + EXPIRY_MARGIN);
                    }
                    if log_it {
                        seen_held = true;
                        if let Some(info) = &held {
                            tracing::info!(event = "waiting", "waiting: {}", describe_held(info));
                        }
                    }
                    if let Some(o) = self.observer.as_mut() {
                        o.waiting(held.as_ref());
                    }
                    if failing {
                        // At the level of the warning it ends: whoever saw
                        // the trouble (a cron mail, -q aside) sees it end.
                        tracing::warn!(event = "store_recovered", "the store answers again");
                        failing = false;
                    }
                }
                Err(e) if !e.may_heal() => return Waited::Failed(e),
                Err(e) if !wait => return Waited::Failed(e),
                Err(e) => {
                    // One warning per outage, not one per retry.
                    if !failing {
                        tracing::warn!(
                            event = "store_error",
                            "{e}; retrying every {}",
                            show(self.timing.retry)
                        );
                        failing = true;
                    } else {
                        tracing::debug!(event = "store_error", "{e}");
                    }
                }
            }
            first = false;
            // The next attempt: at the next poll, or when the lease expires
            // by the store's clock if that is sooner (no polling tax on a
            // holder that died or froze), or on a wake-up, whichever comes
            // first.
            let mut next = started + self.timing.retry;
            match expires_at {
                Some(at) if at < next => {
                    let least = EXPIRY_MARGIN * 2u32.saturating_pow(early.min(16));
                    next = next.min(at.max(self.clock.now() + least));
                    early += 1;
                }
                _ => early = 0,
            }
            if let Some(u) = until {
                if self.clock.now() >= u {
                    return Waited::TimedOut;
                }
                next = next.min(u);
            }
            let mut armed = armed;
            loop {
                tokio::select! {
                    biased;
                    sig = interrupt.recv() => if let Some(sig) = sig { return Waited::Interrupted(sig) },
                    _ = self.clock.sleep_until(next) => break,
                    r = async {
                        match self.wakeups.as_mut() {
                            Some(w) => w.wake().await,
                            None => std::future::pending().await,
                        }
                    }, if armed => match r {
                        Ok(()) => {
                            tracing::debug!(event = "woken", "the lease was released; trying now");
                            early = 0;
                            break;
                        }
                        Err(e) => {
                            // Polling carries on; the next attempt
                            // subscribes again.
                            self.subscription_broke(&e);
                            armed = false;
                        }
                    },
                }
            }
            if until.is_some_and(|u| self.clock.now() >= u) {
                return Waited::TimedOut;
            }
        }
    }

    /// Renew every `R` until the lease is lost. Never returns while the lease
    /// is safely ours; dropping the future simply stops renewing.
    pub async fn hold(&mut self, lease: &mut Lease) -> Lost {
        let t = self.timing;
        // A call that takes longer than this is abandoned and retried on a
        // fresh connection, so one blackholed connection cannot use up the
        // whole give-up budget.
        let attempt_cap = t.call_cap();
        let mut next = lease.sent + t.renew;
        let mut failures = 0u32;
        loop {
            let deadline = lease.sent + t.give_up;
            let lost = |reason| Lost { reason, deadline };
            tokio::select! {
                biased;
                _ = self.clock.sleep_until(deadline) => return lost(self.late_or_gave_up(deadline)),
                _ = self.clock.sleep_until(next) => {}
            }
            let sent = self.clock.now();
            if sent >= deadline {
                return lost(self.late_or_gave_up(deadline));
            }
            let budget = (deadline - sent).min(attempt_cap);
            let res = tokio::select! {
                biased;
                _ = self.clock.sleep_until(deadline) => return lost(self.late_or_gave_up(deadline)),
                _ = self.clock.sleep_until(sent + budget) => Err(StoreError::unavailable(format!(
                    "no answer within {}", show(budget)))),
                r = self.lock.renew(lease.epoch, t.lease, budget) => r,
            };
            let now = self.clock.now();
            if now >= deadline {
                return lost(self.late_or_gave_up(deadline));
            }
            match res {
                Ok(true) => {
                    tracing::debug!(event = "renewed", epoch = lease.epoch, "renewed");
                    lease.sent = sent;
                    if let Some(o) = self.observer.as_mut() {
                        o.renewed(lease);
                    }
                    next = sent + t.renew;
                    if failures > 0 {
                        // Warn, like the renew_failed it ends: a cron mail
                        // with the trouble also shows that it passed.
                        tracing::warn!(
                            event = "store_recovered",
                            epoch = lease.epoch,
                            "renewed again after {failures} failed attempt(s)"
                        );
                        failures = 0;
                    }
                }
                Ok(false) => return lost(LossReason::Superseded),
                Err(e) => {
                    if let Some(o) = self.observer.as_mut() {
                        o.renew_failed(lease.epoch);
                    }
                    let left = deadline - now;
                    tracing::warn!(
                        event = "renew_failed",
                        epoch = lease.epoch,
                        "renewal failed ({e}); giving up in {} unless a retry succeeds",
                        show(left)
                    );
                    // The first retry goes out at once: the failed call's
                    // connection is gone, and a fresh one often works (a
                    // restarted server, a reset link). Later retries come
                    // every `renew_retry`, so several fit before `G`.
                    next = if failures == 0 {
                        now
                    } else {
                        (sent + t.renew_retry()).max(now)
                    };
                    failures += 1;
                }
            }
        }
    }

    /// After stepping down (`--max-term`): wait until another contender
    /// leads, so that leaderrun's exit (and a supervisor restarting it as a
    /// standby at once) cannot race the rival for the lease it just freed.
    /// Bounded by one lease length: a rival that waits polls at least that
    /// often in any sane setup, and with no rival at all the lease stays free
    /// for the next run to take. The new holder, if any.
    pub async fn sit_out(&mut self, epoch: i64) -> Option<String> {
        let until = self.clock.now() + self.timing.lease;
        let step = self.timing.retry.min(Duration::from_millis(50));
        loop {
            let now = self.clock.now();
            if now >= until {
                return None;
            }
            let budget = (until - now).min(self.timing.call_cap());
            let seen = tokio::select! {
                biased;
                _ = self.clock.sleep_until(now + budget) => None,
                r = self.lock.inspect(budget) => r.ok().flatten(),
            };
            if let Some(info) = seen.filter(|i| i.is_live() && i.epoch > epoch) {
                return info.holder;
            }
            self.clock
                .sleep_until((self.clock.now() + step).min(until))
                .await;
        }
    }

    /// Who holds the lease, when someone wants to know (a status line, a log
    /// line); lookup failures are not worth reporting here.
    async fn who_holds(&mut self, wanted: bool) -> Option<LeaseInfo> {
        if !wanted {
            return None;
        }
        self.lock.inspect(self.timing.give_up).await.ok().flatten()
    }

    /// Why a lease whose give-up deadline has passed is lost: the process
    /// woke late, or no renewal succeeded in time.
    pub fn late_or_gave_up(&self, deadline: Stamp) -> LossReason {
        // Timers fire within milliseconds; anything much later means this
        // process did not run (frozen, suspended) around the deadline.
        let late = self.clock.now().saturating_since(deadline);
        if late > Duration::from_millis(250) {
            LossReason::WokeLate(late)
        } else {
            LossReason::GaveUp
        }
    }

    /// Release after the child has been reaped. With `min_hold`, the lease is
    /// kept (holder recorded) until `min_hold` after acquisition. Retried
    /// like a renewal (see [`Elector::hand_back_until`]) until the lease
    /// would have expired anyway: a store that restarted under us must not
    /// leave a standby waiting out the lease after a clean stop.
    pub async fn release(&mut self, lease: &Lease, min_hold: Option<Duration>) -> bool {
        let elapsed = self.clock.now().saturating_since(lease.acquired_at);
        let keep = min_hold
            .map(|m| m.saturating_sub(elapsed))
            .unwrap_or_default();
        self.hand_back_until(lease.epoch, keep, lease.sent + self.timing.lease)
            .await
    }

    /// Hand the lease back after it was lost to the store's silence (the
    /// give-up deadline passed, or the process woke too late), once
    /// everything the command started is gone. The store may still hold the
    /// lease for us: until `sent + L` by our reckoning, and on a store whose
    /// failover re-extends leases (etcd) up to a lease longer. Trying until
    /// then lets the next holder start as soon as the store answers again,
    /// instead of a whole (possibly re-extended) lease later. The release
    /// names our epoch, so it frees nothing that someone else took since.
    pub async fn release_after_loss(&mut self, lease: &Lease) -> bool {
        let mut until = lease.sent + self.timing.lease;
        if self.failover_extends_lease {
            until += self.timing.lease;
        }
        self.hand_back_until(lease.epoch, Duration::ZERO, until)
            .await
    }

    /// Release at `epoch`, retried like a renewal (docs/contract.md §3): the
    /// first retry at once (the failed call's connection is gone, and a
    /// fresh one often works), later ones every `min(P, R, (G − R)/4)`, each
    /// call abandoned after `min(R/2, (G − R)/2)`, until `until`, past which
    /// the lease ends by itself and talking to the store gains nothing.
    /// True when this call freed (or, with `keep`, shortened) the lease.
    pub async fn hand_back_until(&mut self, epoch: i64, keep: Duration, until: Stamp) -> bool {
        let t = self.timing;
        let mut failures = 0u32;
        let mut last = None;
        loop {
            let sent = self.clock.now();
            if sent >= until {
                break;
            }
            let budget = (until - sent).min(t.call_cap());
            let res = tokio::select! {
                biased;
                _ = self.clock.sleep_until(sent + budget) => Err(StoreError::unavailable(format!(
                    "no answer within {}", show(budget)))),
                r = self.lock.release(epoch, keep, budget) => r,
            };
            let e = match res {
                Ok(freed) => {
                    if failures > 0 {
                        // At the level of the warning it ends.
                        tracing::warn!(
                            event = "store_recovered",
                            epoch,
                            "the store answers again after {failures} failed release attempt(s)"
                        );
                    }
                    if freed {
                        self.log_released(epoch, keep);
                    }
                    return freed;
                }
                Err(e) => e,
            };
            if !e.may_heal() {
                // A wrong password or a missing grant will not heal within
                // a lease; the lease ends by itself.
                last = Some(e);
                break;
            }
            if failures == 0 {
                let left = until.saturating_since(self.clock.now());
                tracing::warn!(
                    event = "release_failed",
                    epoch,
                    "could not release ({e}); retrying for up to {}",
                    show(left)
                );
            } else {
                tracing::debug!(event = "release_failed", epoch, "{e}");
            }
            last = Some(e);
            failures += 1;
            if failures > 1 {
                self.clock
                    .sleep_until((sent + t.renew_retry()).min(until))
                    .await;
            }
        }
        if let Some(e) = last {
            tracing::warn!(
                event = "release_failed",
                epoch,
                "could not release ({e}); the lease will expire by itself"
            );
        }
        false
    }

    fn log_released(&self, epoch: i64, keep: Duration) {
        if keep.is_zero() {
            tracing::info!(event = "released", epoch, "released");
        } else {
            tracing::info!(
                event = "released",
                epoch,
                "released; kept for another {} (--min-hold)",
                show(keep)
            );
        }
    }
}

pub fn describe_held(info: &LeaseInfo) -> String {
    // The holder comes from the store: a row written by hand may hold
    // anything, and this line goes to a terminal or a journal.
    let holder = info.holder.as_deref().map(crate::names::printable);
    match (&holder, info.expires_in_ms.unwrap_or(0)) {
        (Some(h), ms) if ms > 0 => format!(
            "lease {} held by {h} (epoch {}) for another {}",
            info.name,
            info.epoch,
            // whole seconds, rounded up, in two or three figures: a status
            // line, not a measurement
            show(about(Duration::from_secs((ms as u64).div_ceil(1000))))
        ),
        (Some(h), _) => format!(
            "lease {} held by {h} (epoch {}), expired",
            info.name, info.epoch
        ),
        (None, _) => format!("lease {} is free (epoch {})", info.name, info.epoch),
    }
}

#[cfg(test)]
#[path = "elector_tests.rs"]
mod tests;
