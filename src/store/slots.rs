//! `--slots N`: up to N holders of one name, each in a lease of its own.
//!
//! Slot `i` of `NAME` is the lease `names::slot_name(NAME, i)`: `NAME`
//! itself for slot 0 (so `--slots 1`, and a plain run, use the lease they
//! always did, byte for byte), `NAME#i` above. Each slot is an ordinary
//! lease, so every clause of the contract holds per slot with no store
//! code of its own: one atomic acquire with one winner, expiry by the
//! store's clock, an epoch per slot that only rises (`LEASE_EPOCH` is that
//! slot's, and fences that slot's resource), renew and release naming
//! holder and epoch, the watchdog's hand-back. At most N commands run
//! because there are N leases and each has at most one holder.
//!
//! That holds only while every contender counts to the same N (a run
//! without `--slots` takes the lease `NAME` as it always did, and does not
//! look): one with
//! `--slots 3` would take `NAME#2`, which `--slots 2` never looks at. So each
//! grant stores its N (`LeaseInfo::slots`), and a contender that has just
//! taken a slot reads every slot of the name, and hands its own back and
//! refuses (exit 2, before the command starts) when a live one was taken
//! with another N. The take is written before the read, on a store whose
//! reads see every committed write: of two contenders that disagree, the
//! later one to take sees the earlier one's grant, so a disagreement
//! between two live holders is never missed by both.

use std::time::Duration;

use super::{Acquired, LeaseInfo, LeaseLock, Lock, StoreError};
use crate::names::{slot_name, slot_of};

impl Lock {
    /// Contend for one of `n` slots of this name (`--slots`). The run form
    /// has checked that the store keeps N with each grant.
    pub fn slots(&mut self, n: u32) {
        self.key.slots = n;
        self.slotted = true;
    }

    /// The slot this lock last took, under `--slots`.
    pub fn slot(&self) -> Option<u32> {
        self.slot.filter(|_| self.slotted)
    }

    /// The lease this lock last took (the slot's own name, `NAME#i`), or
    /// its name: what the watchdog hands back and `check` reads.
    pub fn lease_name(&self) -> &str {
        &self.key.name
    }

    /// Try each slot in turn, lowest first; the first free one is taken.
    pub(super) async fn take_slot(
        &mut self,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        self.slot = None;
        for i in 0..self.key.slots {
            self.key.name = slot_name(&self.name, i);
            match self.take_one(lease, timeout).await? {
                Acquired::Taken(epoch) => {
                    self.slot = Some(i);
                    self.agree(epoch, timeout).await?;
                    return Ok(Acquired::Taken(epoch));
                }
                Acquired::Held => {}
                // Not reached: `--once-per` with `--slots` is refused.
                done => return Ok(done),
            }
        }
        self.key.name = self.name.clone();
        Ok(Acquired::Held)
    }

    /// Having taken the slot at `epoch`: every other live slot of the name
    /// was taken with the same N, or the slot is handed back and the run
    /// refused. A store that cannot be read now gets the slot back too:
    /// unchecked, it is not a slot to run on.
    async fn agree(&mut self, epoch: i64, timeout: Duration) -> Result<(), StoreError> {
        let n = self.key.slots;
        let other = match self.store.list(timeout).await {
            Ok(all) => all.into_iter().find(|l| {
                l.name != self.key.name
                    && slot_of(&l.name, &self.name).is_some()
                    && l.is_live()
                    && l.slots_of_tenure() != n
            }),
            Err(e) => {
                self.hand_back(epoch, timeout).await;
                return Err(e);
            }
        };
        let Some(other) = other else {
            return Ok(());
        };
        self.hand_back(epoch, timeout).await;
        Err(StoreError::usage(format!(
            "lease {}: this run has --slots {n}, but {} holds {} (epoch {}) with --slots {}; \
             every contender for one name must give the same --slots",
            self.name,
            other
                .holder
                .as_deref()
                .map_or_else(|| "someone".into(), crate::names::printable),
            other.name,
            other.epoch,
            other.slots_of_tenure(),
        )))
    }

    /// Give back the slot at `epoch` that will not be run on; a failure
    /// leaves it to expire, which is only slower.
    async fn hand_back(&mut self, epoch: i64, timeout: Duration) {
        let _ = LeaseLock::release(self, epoch, Duration::ZERO, timeout).await;
        self.slot = None;
    }

    /// For a contender that holds no slot: the slot that frees first, as
    /// the waiting line and the schedule of the next try want it (a free
    /// one, else the one that expires soonest by the store's clock). For
    /// one that took a slot: that slot.
    pub(super) async fn inspect_slots(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        if self.slot.is_some() {
            return self.store.inspect(&self.key.name, timeout).await;
        }
        let mut soonest: Option<LeaseInfo> = None;
        for i in 0..self.key.slots {
            let Some(l) = self
                .store
                .inspect(&slot_name(&self.name, i), timeout)
                .await?
            else {
                // Never taken: free.
                return Ok(None);
            };
            if !l.is_live() {
                return Ok(Some(l));
            }
            let left = |l: &LeaseInfo| l.expires_in_ms.unwrap_or(i64::MAX);
            if soonest.as_ref().is_none_or(|s| left(&l) < left(s)) {
                soonest = Some(l);
            }
        }
        Ok(soonest)
    }
}

impl super::Store {
    /// Every slot of `name` the store has, lowest first: the lease `name`
    /// alone, or where a `--slots` run made more, `name#i` too. A run takes
    /// slots lowest first, so `name#1` exists wherever any higher slot
    /// does: a name without it costs one more read, not a list.
    pub async fn inspect_slots(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Vec<LeaseInfo>, StoreError> {
        let first = self.inspect(name, timeout).await?;
        if self.inspect(&slot_name(name, 1), timeout).await?.is_none() {
            return Ok(first.into_iter().collect());
        }
        let mut all: Vec<LeaseInfo> = self
            .list(timeout)
            .await?
            .into_iter()
            .filter(|l| slot_of(&l.name, name).is_some())
            .collect();
        all.sort_by_key(|l| slot_of(&l.name, name));
        Ok(all)
    }
}
