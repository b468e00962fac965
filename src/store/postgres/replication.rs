//! What the server says beside a call's rows: its notices (a commit that
//! warned), and its replication (for `require=sync` and `status`).

use std::sync::{Arc, Mutex};

use sqlx::postgres::PgRow;
use sqlx::Row;

use std::time::{Duration, Instant};

use super::{PgStore, REPLICATION_SQL, SYNC_CHECK_TTL, SYNC_COLUMNS};
use crate::store::session::Connect;
use crate::store::{Replication, StoreError};

// ---------------------------------------------------------------------------
// Notices: what the server said beside a call's result.

/// The `tracing` target sqlx 0.8 sends every `NoticeResponse` to (its only
/// way of surfacing them: the message text as the event's `message`, the
/// notice's severity as the event's level, no SQLSTATE). The level comes
/// from the notice's non-localized severity field (`V`, Postgres 9.6 and
/// later), so a WARNING is recognised whatever `lc_messages` says.
pub(super) const NOTICE_TARGET: &str = "sqlx::postgres::notice";

/// The warnings (and anything more severe) that arrived during one call.
#[derive(Clone, Default)]
pub(super) struct Notices(pub(super) Arc<Mutex<Vec<String>>>);

impl Notices {
    pub(super) fn take(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// A subscriber that only collects sqlx's notices. It is made the *scoped*
/// default while one call's future is polled ([`WithSubscriber`]), so it
/// sees exactly the notices read during that call: the LISTEN connection
/// (wake.rs) is polled on the same thread, but in futures of its
/// own, under the global subscriber. Everything else sqlx might log inside
/// a call (statement logging is off, see `from_url`) is dropped.
pub(super) struct NoticeSink(pub(super) Notices);

impl tracing::Subscriber for NoticeSink {
    fn register_callsite(
        &self,
        m: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if m.target() == NOTICE_TARGET {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target() == NOTICE_TARGET && *m.level() <= tracing::Level::WARN
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::WARN)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if e.metadata().target() != NOTICE_TARGET || *e.metadata().level() > tracing::Level::WARN {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                if f.name() == "message" {
                    self.0 = v.to_string();
                }
            }
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        e.record(&mut m);
        if let Ok(mut seen) = (self.0).0.lock() {
            seen.push(m.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// What one call brought back.
pub(super) struct Ran {
    pub(super) rows: Vec<PgRow>,
    /// Warnings the server sent during the call (see [`NoticeSink`]).
    pub(super) warnings: Vec<String>,
}

// ---------------------------------------------------------------------------
// Replication as the server reports it.

/// One row of [`REPLICATION_SQL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReplState {
    pub(super) in_recovery: bool,
    pub(super) commit: String,
    pub(super) names: String,
    pub(super) standbys: i64,
    pub(super) visible: i64,
    pub(super) sync: i64,
}

/// Whether a commit in a session with these settings waits for a
/// synchronous standby.
pub(super) fn waits_for_standby(commit: &str, names: &str) -> bool {
    !matches!(commit, "off" | "local") && !names.trim().is_empty()
}

impl ReplState {
    pub(super) fn from_row(r: &PgRow) -> Result<ReplState, sqlx::Error> {
        Ok(ReplState {
            in_recovery: r.try_get(0)?,
            commit: r.try_get(1)?,
            names: r.try_get(2)?,
            standbys: r.try_get(3)?,
            visible: r.try_get(4)?,
            sync: r.try_get(5)?,
        })
    }

    /// For `require=sync`: `None` when an acknowledged commit is on a
    /// synchronous standby, else what is missing and whether it may heal.
    pub(super) fn missing(&self) -> Option<(String, bool)> {
        if self.in_recovery {
            return Some(("the server is a standby (read-only)".into(), true));
        }
        if matches!(self.commit.as_str(), "off" | "local") {
            return Some((
                format!(
                    "synchronous_commit is {} for this role, so no commit waits for a standby",
                    self.commit
                ),
                true,
            ));
        }
        if self.names.trim().is_empty() {
            return Some((
                "synchronous_standby_names is empty, so no commit waits for a standby".into(),
                true,
            ));
        }
        if self.standbys > self.visible {
            return Some((
                "this role may not see pg_stat_replication's details \
                 (GRANT pg_monitor, or pg_read_all_stats, to it)"
                    .into(),
                false,
            ));
        }
        if self.sync == 0 {
            return Some((
                format!(
                    "no synchronous standby is connected ({} standby{} streaming, none synchronous)",
                    self.standbys,
                    if self.standbys == 1 { "" } else { "s" }
                ),
                true,
            ));
        }
        None
    }

    pub(super) fn replication(&self) -> Replication {
        let n = |k: i64| format!("{k} standby{}", if k == 1 { "" } else { "s" });
        if self.in_recovery {
            return Replication::unknown("this server is a standby (read-only)");
        }
        if self.standbys > self.visible {
            return Replication::unknown(format!(
                "{} connected; this role may not see their details \
                 (GRANT pg_monitor, or pg_read_all_stats, to it)",
                n(self.standbys)
            ));
        }
        let sync = waits_for_standby(&self.commit, &self.names);
        match (sync, self.standbys, self.sync) {
            (true, _, k) if k > 0 => Replication {
                can_lose_acknowledged: Some(false),
                detail: format!(
                    "synchronous, {k} of {} synchronous (synchronous_commit = {})",
                    n(self.standbys),
                    self.commit
                ),
            },
            (true, total, _) => Replication {
                can_lose_acknowledged: Some(false),
                detail: format!(
                    "synchronous, but none of {} is synchronous now: writes wait",
                    n(total)
                ),
            },
            (false, 0, _) => Replication::unknown(
                "asynchronous, no standby connected (a standby promoted later may lack the \
                 last acquisitions)",
            ),
            (false, total, _) => Replication {
                can_lose_acknowledged: Some(true),
                detail: format!("asynchronous, {}", n(total)),
            },
        }
    }
}

pub(super) fn sync_of_at(r: &PgRow, at: usize) -> Result<bool, sqlx::Error> {
    let commit: String = r.try_get(at)?;
    let names: String = r.try_get(at + 1)?;
    Ok(waits_for_standby(&commit, &names))
}

pub(super) fn sync_of(r: &PgRow) -> Result<bool, sqlx::Error> {
    sync_of_at(r, 0)
}

// ---------------------------------------------------------------------------
// What a write's commit and the server's replication say, asked by the store.

impl PgStore {
    /// Why a write that the server reported as committed may still be on no
    /// standby, or `None` when nothing says so:
    ///
    /// * the server sent a WARNING during the call. Postgres does that, and
    ///   then reports success, when a commit's wait for a synchronous
    ///   standby ends early (`pg_cancel_backend`, `statement_timeout`: "the
    ///   transaction has already committed locally, but might not have been
    ///   replicated"). What is relied on is the notice's severity, which
    ///   arrives unlocalized, not its text (shown only to people); any other
    ///   warning during a lease write fails it too, which is only ever
    ///   cautious.
    /// * the session's commits waited for a standby (`sync`, read in the
    ///   write itself) but no longer do now. Emptying
    ///   `synchronous_standby_names` releases every waiting commit with no
    ///   word at all; the session re-reads the setting before its next
    ///   command, which is this check. (Behind a transaction pooler the
    ///   check may run on another server connection that has not re-read
    ///   its configuration yet: docs/stores.md.)
    pub(super) async fn not_durable(
        &mut self,
        warnings: &[String],
        sync: bool,
        timeout: Duration,
    ) -> Option<String> {
        if !warnings.is_empty() {
            return Some(format!(
                "the server warned that its commit may not be durable ({})",
                warnings.join("; ")
            ));
        }
        if !sync {
            return None;
        }
        let q = format!("SELECT {SYNC_COLUMNS}");
        match self
            .run(timeout, "cannot read", false, |_| Ok(q.clone()))
            .await
        {
            Ok(ran) => match ran.rows.first().map(sync_of) {
                Some(Ok(true)) => None,
                Some(Ok(false)) => Some(
                    "synchronous replication was switched off while the commit waited for a \
                     standby, so the commit may be on no standby"
                        .into(),
                ),
                _ => {
                    Some("it could not be read back whether the commit waited for a standby".into())
                }
            },
            Err(e) => Some(format!(
                "it could not be checked that the commit reached a standby ({e})"
            )),
        }
    }

    /// `require=sync`: refuse to lead unless synchronous replication is
    /// active; a pass is trusted for [`SYNC_CHECK_TTL`].
    pub(super) async fn check_sync(&mut self, timeout: Duration) -> Result<(), StoreError> {
        if self
            .sync_checked
            .is_some_and(|t| t.elapsed() < SYNC_CHECK_TTL)
        {
            return Ok(());
        }
        let state = self.replication_state(timeout).await?;
        match state.missing() {
            None => {
                self.sync_checked = Some(Instant::now());
                Ok(())
            }
            Some((why, heals)) => {
                self.sync_checked = None;
                let msg = format!(
                    "the store {} does not replicate synchronously (require=sync): {why}",
                    self.s.c.shown
                );
                Err(if heals {
                    StoreError::unavailable(msg)
                } else {
                    StoreError::fatal(msg)
                })
            }
        }
    }

    pub(super) async fn replication_state(
        &mut self,
        timeout: Duration,
    ) -> Result<ReplState, StoreError> {
        let ran = self
            .run(timeout, "cannot read", false, |_| {
                Ok(REPLICATION_SQL.to_string())
            })
            .await?;
        ran.rows
            .first()
            .map(ReplState::from_row)
            .transpose()
            .map_err(|e| self.s.c.classify("cannot read", e))?
            .ok_or_else(|| {
                StoreError::unavailable(format!(
                    "the store {} said nothing about its replication",
                    self.s.c.shown
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_commit_that_waits_for_a_standby_counts_as_synchronous() {
        assert!(waits_for_standby("on", "s1"));
        assert!(waits_for_standby("remote_apply", "ANY 1 (a, b)"));
        assert!(!waits_for_standby("local", "s1"));
        assert!(!waits_for_standby("off", "s1"));
        assert!(!waits_for_standby("on", " "));
    }
}
