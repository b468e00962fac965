//! What a store says and promises: the value types every store shares.

use std::time::Duration;

/// What the store says about a lease, by the store's own clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseInfo {
    pub name: String,
    pub holder: Option<String>,
    pub epoch: i64,
    /// Milliseconds until expiry; negative when already expired (for a
    /// free lease on a SQL store: how long ago it was freed). `None` where
    /// the store cannot know: a free lease on a store that deletes the
    /// lease key (Redis, etcd) keeps no time of its end.
    pub expires_in_ms: Option<i64>,
    /// The holder's `--advertise` value: this tenure's only, never an
    /// earlier holder's (stores tie it to the epoch it was written at).
    pub advertised: Option<String>,
    /// This tenure's run has ended (its command exited and its leaderrun
    /// released the lease with a keep): only `--min-hold` still holds it.
    /// `false` where the store or its table cannot record it.
    pub kept: bool,
    /// The holder's `--slots` N, where it gave one above 1 (this tenure's,
    /// tied to its epoch like `advertised`); `None`: a plain run (N = 1),
    /// or a store that keeps no such value.
    pub slots: Option<u32>,
}

impl LeaseInfo {
    /// The N this tenure was taken with: 1 for a plain run.
    pub fn slots_of_tenure(&self) -> u32 {
        self.slots.unwrap_or(1)
    }

    pub fn is_live(&self) -> bool {
        self.holder.is_some() && self.expires_in_ms.is_some_and(|ms| ms > 0)
    }

    /// `expires_in_ms` as `--json` shows it: `null` for a free lease on
    /// every store. A SQL store keeps when a released lease ended (a
    /// negative time, which the text of `status` uses), Redis and etcd
    /// delete the key and keep nothing; a script must not have to know
    /// which. A held lease that ran out keeps its negative time.
    pub fn expires_in_ms_shown(&self) -> Option<i64> {
        self.expires_in_ms.filter(|_| self.holder.is_some())
    }
}

/// The lease's values as the key-value stores keep them, in a key (or
/// node) of their own beside the lease: `EPOCH:rN:TEXT` while the tenure at
/// `EPOCH` runs, `EPOCH:kN:TEXT` once its run has ended and only
/// `--min-hold` keeps it (`N` the tenure's `--slots` above 1, empty for a
/// plain run; `TEXT` the advertised value, empty for none).
#[cfg(feature = "etcd")]
pub(crate) fn values_text(
    epoch: i64,
    kept: bool,
    advertised: Option<&str>,
    slots: Option<u32>,
) -> String {
    let flag = if kept { 'k' } else { 'r' };
    let n = slots.map_or(String::new(), |n| n.to_string());
    format!("{epoch}:{flag}{n}:{}", advertised.unwrap_or_default())
}

/// What follows `EPOCH:r` in `values_text` (`N:TEXT`), or empty when
/// there is nothing to keep: the Redis scripts are given this.
#[cfg(feature = "redis")]
pub(crate) fn values_suffix(advertised: Option<&str>, slots: Option<u32>) -> String {
    if advertised.is_none() && slots.is_none() {
        return String::new();
    }
    let n = slots.map_or(String::new(), |n| n.to_string());
    format!("{n}:{}", advertised.unwrap_or_default())
}

#[cfg(any(feature = "redis", feature = "etcd"))]
/// The values of one tenure, as [`parse_values`] reads them back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Values {
    pub advertised: Option<String>,
    pub kept: bool,
    pub slots: Option<u32>,
}

/// [`values_text`] read back for the tenure at `epoch`. Another tenure's
/// values, or a value that does not parse (written by hand), are none.
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) fn parse_values(v: &str, epoch: i64) -> Values {
    let mut parts = v.splitn(3, ':');
    let (Some(e), Some(flag), Some(text)) = (parts.next(), parts.next(), parts.next()) else {
        return Values::default();
    };
    if e.parse::<i64>().ok() != Some(epoch) {
        return Values::default();
    }
    let (kept, n) = match flag.split_at_checked(1) {
        Some(("r", n)) => (false, n),
        Some(("k", n)) => (true, n),
        _ => return Values::default(),
    };
    let slots = match n {
        "" => None,
        t => match t.parse::<u32>() {
            // Written by values_text only: above 1, no sign, no leading zero.
            Ok(k) if k > 1 && k.to_string() == t => Some(k),
            _ => return Values::default(),
        },
    };
    Values {
        advertised: Some(text.to_string()).filter(|t| !t.is_empty()),
        kept,
        slots,
    }
}

/// What a store can promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Leases are granted in whole multiples of this (a request is rounded up).
    pub granularity: Duration,
    /// The shortest lease the store grants.
    pub min_lease: Duration,
    /// The longest lease (and `--min-hold` keep) the store records; longer
    /// requests are clamped on write.
    pub max_lease: Duration,
    /// Whether the store can wake a waiting contender when the lease is
    /// freed (instead of the contender polling every `P`).
    pub pushes_wakeups: bool,
    /// Whether a failover of the store may extend a lease by up to its full
    /// length (etcd: a new leader re-extends every lease by its TTL), so a
    /// lease that could not be handed back may outlive `sent + L`.
    pub failover_extends_lease: bool,
}

/// Ten years: far beyond any sensible lease or `--min-hold`, far inside the
/// range of every store's time type, so no sum of "now" and a duration can
/// overflow a column.
pub const MAX_STORED: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl Capabilities {
    /// Millisecond leases computed by the server (the SQL stores).
    pub const MILLIS: Capabilities = Capabilities {
        granularity: Duration::from_millis(1),
        min_lease: Duration::from_millis(1),
        max_lease: MAX_STORED,
        pushes_wakeups: false,
        failover_extends_lease: false,
    };

    /// The lease the store will really grant for `requested`: rounded up to
    /// the granularity; refused when below the minimum or above the maximum
    /// (silently lengthening a short lease would slow failover without the
    /// user knowing; shortening a long one would break the timing).
    pub fn grant(&self, requested: Duration) -> Result<Duration, GrantError> {
        let g = self.granularity.as_nanos().max(1);
        let granted = requested
            .as_nanos()
            .div_ceil(g)
            .checked_mul(g)
            .and_then(|n| u64::try_from(n).ok())
            .map(Duration::from_nanos);
        match granted {
            Some(d) if d < self.min_lease => Err(GrantError::TooShort {
                requested,
                least: self.min_lease,
            }),
            Some(d) if d <= self.max_lease => Ok(d),
            _ => Err(GrantError::TooLong {
                requested,
                most: self.max_lease,
            }),
        }
    }
}

/// A lease the store would not keep as asked (see [`Capabilities::grant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error(
        "--lease ({}) is shorter than the shortest lease this store grants ({})",
        show(*requested),
        show(*least)
    )]
    TooShort {
        requested: Duration,
        least: Duration,
    },
    #[error(
        "--lease ({}) is longer than the longest lease this store grants ({})",
        show(*requested),
        show(*most)
    )]
    TooLong { requested: Duration, most: Duration },
}

fn show(d: Duration) -> crate::duration::Shown {
    crate::duration::show(d)
}

/// The table a SQL store keeps its leases in, for `init --print`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schema {
    /// Shown in the leading SQL comment: "PostgreSQL", "MySQL/MariaDB", …
    pub dialect: &'static str,
    pub sql: &'static str,
}

/// What `init` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Init {
    /// The lease table exists now (created or already there).
    Ready,
    /// This store keeps no table; there is nothing to create.
    NothingToDo,
    /// What a store without a table made ready, in its own words (ZooKeeper:
    /// the base node, and who may use it).
    Done(String),
}

/// What the store's replication can do to an acknowledged write, as
/// `leaderrun status` shows it (docs/stores.md, "what a failover of the
/// store can break").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    /// `Some(true)`: a failover can lose an acknowledged acquisition (an
    /// asynchronous replica promoted); `Some(false)`: it cannot (synchronous
    /// replication, a quorum, a single host); `None`: the store cannot tell.
    pub can_lose_acknowledged: Option<bool>,
    /// One line for people: "asynchronous, 2 standbys", "single host", …
    pub detail: String,
}

impl Replication {
    pub fn unknown(detail: impl Into<String>) -> Replication {
        Replication {
            can_lose_acknowledged: None,
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "etcd")]
    fn values_are_the_tenures_own() {
        let v = |a: Option<&str>, kept, slots| Values {
            advertised: a.map(str::to_string),
            kept,
            slots,
        };
        assert_eq!(
            parse_values(&values_text(7, false, Some("10.0.0.7:80"), None), 7),
            v(Some("10.0.0.7:80"), false, None)
        );
        assert_eq!(
            parse_values(&values_text(7, true, None, Some(3)), 7),
            v(None, true, Some(3))
        );
        assert_eq!(values_text(7, false, Some("a:b"), Some(2)), "7:r2:a:b");
        assert_eq!(parse_values("7:r2:a:b", 7), v(Some("a:b"), false, Some(2)));
        #[cfg(feature = "redis")]
        assert_eq!(values_suffix(None, None), "");
        assert_eq!(values_text(7, true, None, None), "7:k:");
        assert_eq!(parse_values("7:k:", 7), v(None, true, None));
        assert_eq!(parse_values("7:k:a", 7), v(Some("a"), true, None));
        for other in [
            "6:r:a", "7:x:a", "junk", "7:r1:a", "7:r02:a", "7:rx:a", "7:", "7:r",
        ] {
            assert_eq!(parse_values(other, 7), Values::default(), "{other}");
        }
    }

    #[test]
    fn grant_rounds_up_and_refuses_what_it_cannot_honour() {
        let etcd_like = Capabilities {
            granularity: Duration::from_secs(1),
            min_lease: Duration::from_secs(2),
            max_lease: MAX_STORED,
            pushes_wakeups: true,
            failover_extends_lease: true,
        };
        assert_eq!(
            etcd_like.grant(Duration::from_millis(2500)),
            Ok(Duration::from_secs(3))
        );
        assert_eq!(
            etcd_like.grant(Duration::from_millis(1500)),
            Ok(Duration::from_secs(2))
        );
        assert!(etcd_like.grant(Duration::from_millis(900)).is_err());
        let sql = Capabilities::MILLIS;
        assert_eq!(
            sql.grant(Duration::from_micros(1500)),
            Ok(Duration::from_millis(2))
        );
        assert!(sql.grant(MAX_STORED * 2).is_err());
    }
}
