//! The Postgres store: one row per lease, expiry by the database's `now()`.
//!
//! Why these statements are safe under concurrency (READ COMMITTED):
//!
//! * `acquire` is one `INSERT … ON CONFLICT DO UPDATE … WHERE`. For an
//!   existing row Postgres takes the row lock and evaluates the `WHERE` on the
//!   *latest committed* version, not on the statement's snapshot; a racer that
//!   waited for the lock therefore sees the winner's holder and future expiry
//!   and updates nothing. Two racers inserting a missing row meet on the
//!   primary key: one inserts, the other falls through to the conflict branch
//!   and, again, sees a live lease. The epoch is raised in the same statement.
//! * `renew` is an `UPDATE` naming holder *and* epoch and requiring the lease
//!   to be unexpired; it never touches the epoch. After a takeover it matches
//!   no row, which the elector treats as a loss.
//! * `now()` is the transaction's start, which is after the holder sent the
//!   statement, so the expiry written is at least `sent + L` — the fact the
//!   holder's give-up arithmetic relies on.
//!
//! Across a failover (docs/stores.md, "Postgres across a promotion"):
//!
//! * **Epochs jump with the WAL timeline.** A promoted standby starts a new
//!   timeline at once; the acquiring statement reads it and never hands out
//!   less than `(timeline − 1) · 2³² + 1`. What the old timeline handed out
//!   (even a split-brain old primary still on it) stays below that for its
//!   first 2³² acquisitions, so an epoch the promoted server hands out is
//!   higher than every epoch the old one handed out, whether or not the
//!   standby received them.
//! * **A lease from another timeline is adopted, not taken.** Its expiry was
//!   written by another server's clock; an acquire that meets it held does not
//!   take it but sets `expires_at = greatest(expires_at, now() + L)` and the
//!   current timeline, holder and epoch untouched, in the same transaction,
//!   and reports it held. No rival gets it before L has passed on *this*
//!   server's clock since it first saw it, whatever the two clocks said.
//! * **A commit is a commit.** A write whose commit came back with a warning
//!   (Postgres warns, and still reports success, when a wait for a synchronous
//!   standby is cancelled: "committed locally") or during which synchronous
//!   replication was switched off counts as failed: an acquire hands the
//!   lease back at once, a renew does not extend the deadline.
//!
//! A server in read-only mode (`default_transaction_read_only`, a standby,
//! a primary demoted during a failover: SQLSTATE 25006) may take writes
//! again soon, so it is "may heal": a waiting contender keeps trying.

mod connect;
mod replication;
mod statements;
mod url;
pub(crate) mod wake;

use crate::store::UrlError;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::Row;
use tracing::instrument::WithSubscriber;

use self::replication::{sync_of_at, NoticeSink, Notices, Ran};
use self::statements::*;
use self::url::{parse_url, Attrs, Host};
use self::wake::HostsWakeups;
use super::session::{Connect, Session};
use super::sql::{self, lease_info, millis};
use super::wake::{Heard, Subscription};
use super::{
    Acquired, Backend, Capabilities, Init, LeaseInfo, LeaseKey, Outcome, Period, Replication,
    RunRecord, Schema, Store, StoreError, Target,
};

pub use self::statements::{SCHEMA, TABLE_SQL, UPGRADE_SQL};
pub use self::wake::PG_CHANNEL;

// ---------------------------------------------------------------------------
// The store.

/// A table `PgStore::run` found missing.
enum Missing {
    /// The call may not create it (it only looks).
    NotCreated,
    /// Creating it failed, with this error if the create said why.
    CreateFailed(Option<sqlx::Error>),
}

pub struct PgStore {
    s: Session<Pg>,
    /// Switched to `Legacy` by the first write that finds no `timeline`.
    cols: Columns,
    /// `?require=sync`: lead only while synchronous replication is active.
    require_sync: bool,
    /// When the last `require=sync` check passed (see [`SYNC_CHECK_TTL`]).
    sync_checked: Option<Instant>,
    notices: Notices,
    /// The [`NoticeSink`] on `notices`, made once: making a dispatcher
    /// re-registers every callsite.
    dispatch: tracing::Dispatch,
}

/// How long a passing `require=sync` check is trusted before the next
/// acquire asks again. Between two checks, a standby that goes away makes
/// the acquiring commit wait, and a cancelled or abandoned wait (or
/// synchronous replication switched off) fails the acquire anyway
/// ([`PgStore::not_durable`]); the check is there to say *what* is missing
/// before anything waits.
pub const SYNC_CHECK_TTL: Duration = Duration::from_secs(1);

/// How to reach the server.
struct Pg {
    hosts: Vec<Host>,
    attrs: Attrs,
    connect_timeout: Option<Duration>,
    /// `SET LOCAL` of the server-side timeouts, put before every statement.
    timeouts: String,
    shown: String,
}

/// The registry's constructor for `postgres://` and `postgresql://`.
pub fn open(t: &Target<'_>) -> Result<Store, UrlError> {
    Ok(Store::Postgres(PgStore::from_url(
        t.url,
        t.app_name,
        t.call_timeout,
    )?))
}

impl PgStore {
    /// Parse the URL; nothing is connected until the first call.
    /// `statement_timeout` is also set server-side (statement and lock
    /// timeouts), so a statement stuck behind someone's row lock is
    /// cancelled by the server too, not only abandoned by us.
    fn from_url(
        url: &::url::Url,
        app_name: &str,
        statement_timeout: Duration,
    ) -> Result<PgStore, UrlError> {
        let p = parse_url(url, app_name)?;
        let ms = millis(statement_timeout).max(1);
        let notices = Notices::default();
        Ok(PgStore {
            s: Session::new(Pg {
                hosts: p.hosts,
                attrs: p.attrs,
                connect_timeout: p.connect_timeout,
                timeouts: format!(
                    "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}; "
                ),
                shown: p.shown,
            }),
            cols: Columns::WithTimeline,
            require_sync: p.require_sync,
            sync_checked: None,
            dispatch: tracing::Dispatch::new(NoticeSink(notices.clone())),
            notices,
        })
    }

    /// One call: the statement built by `build`, after the `SET LOCAL`s of
    /// the timeouts, sent as *one* simple-protocol message. Postgres runs a
    /// multi-statement message as one implicit transaction, so:
    ///
    /// * it is one round trip, with nothing prepared: no named statement
    ///   to collide in a pooler's shared server connection, and no unnamed
    ///   one that a transaction pooler could lose between parse and execute
    ///   (sqlx's extended protocol syncs in between);
    /// * the timeouts hold for this statement only and end with its
    ///   transaction (Postgres 13 and newer arm `statement_timeout` per
    ///   statement of a message), so nothing is left on a server connection
    ///   that a pooler hands to someone else next.
    ///
    /// With `create`, a missing table is created on the spot and the
    /// statement sent again, instead of asking whether it exists before
    /// every first call. Only the acquire creates: looking (status, check,
    /// release, and a run's renewals) never does, and says the table is
    /// missing instead. A table made by an older release (no `timeline`
    /// column, SQLSTATE 42703) gets the statement `build` makes for it, in
    /// the same call, and every later call too.
    async fn run(
        &mut self,
        timeout: Duration,
        what: &str,
        create: bool,
        build: impl Fn(Columns) -> Result<String, sqlx::Error>,
    ) -> Result<Ran, StoreError> {
        let stmt = |cols| build(cols).map(|s| format!("{UNLISTEN_SQL}{}{s}", self.s.c.timeouts));
        let (q, legacy) = match (stmt(self.cols), self.cols) {
            (Ok(q), Columns::WithTimeline) => (q, stmt(Columns::Legacy).ok()),
            (Ok(q), Columns::Legacy) => (q, None),
            (Err(e), _) => return Err(self.s.c.classify(what, e)),
        };
        let create = create.then(|| format!("{}{TABLE_SQL}", self.s.c.timeouts));
        let _ = self.notices.take();
        let out = self
            .s
            .call(timeout, what, async move |c, _| {
                let first = match sqlx::Executor::fetch_all(&mut *c, sqlx::raw_sql(&q)).await {
                    Err(e) if is_code(&e, UNDEFINED_COLUMN) && legacy.is_some() => {
                        let legacy = legacy.as_deref().unwrap_or_default();
                        return sqlx::Executor::fetch_all(&mut *c, sqlx::raw_sql(legacy))
                            .await
                            .map(|rows| Ok((rows, true)));
                    }
                    Err(e) if is_code(&e, UNDEFINED_TABLE) => e,
                    done => return done.map(|rows| Ok((rows, false))),
                };
                drop(first);
                let Some(create) = create else {
                    return Ok(Err(Missing::NotCreated));
                };
                // Two first users may race to create it: `IF NOT EXISTS`
                // is not atomic against another creator, so whatever the
                // create says, the statement is tried again, and only if
                // the table is still missing is the create's error shown.
                let created = sqlx::Executor::execute(&mut *c, sqlx::raw_sql(&create)).await;
                match sqlx::Executor::fetch_all(&mut *c, sqlx::raw_sql(&q)).await {
                    Err(e) if is_code(&e, UNDEFINED_TABLE) => {
                        Ok(Err(Missing::CreateFailed(created.err())))
                    }
                    done => done.map(|rows| Ok((rows, false))),
                }
            })
            .with_subscriber(self.dispatch.clone())
            .await;
        let warnings = self.notices.take();
        // A call that failed after a warning: the warning may be why (a
        // commit's wait for a standby cut short by a terminated backend
        // warns, then closes the connection), and says the commit may stand.
        let out = out.map_err(|e| {
            if warnings.is_empty() {
                return e;
            }
            e.reworded(|m| format!("{m} (the server had warned: {})", warnings.join("; ")))
        });
        let (rows, legacy_used) = out?.map_err(|missing| {
            let create_err = match missing {
                Missing::NotCreated => return sql::no_table(&self.s.c.shown),
                Missing::CreateFailed(e) => e,
            };
            let Some(e) = create_err else {
                return StoreError::fatal(format!(
                    "table leader_lease is missing in the store {}",
                    self.s.c.shown
                ));
            };
            sql::cannot_create(sql::classify::<Pg>(
                &format!(
                    "table leader_lease is missing in the store {}",
                    self.s.c.shown
                ),
                e,
            ))
        })?;
        if legacy_used {
            self.cols = Columns::Legacy;
            // An older release's table is not a fault of this run: one line
            // for whoever looks (-v), none in a cron mail.
            tracing::info!(
                event = "store_schema",
                "table leader_lease has no column timeline (made by an older release): a lease \
                 written on another timeline is not adopted after a failover; \
                 `leaderrun init` adds the column"
            );
        }
        Ok(Ran { rows, warnings })
    }

    /// Renew and release: whether the UPDATE matched the lease; a match whose
    /// commit may not be durable is an error (the deadline is not extended).
    async fn update(
        &mut self,
        what: &str,
        timeout: Duration,
        build: impl Fn(Columns) -> Result<String, sqlx::Error>,
    ) -> Result<bool, StoreError> {
        let ran = self.run(timeout, what, false, build).await?;
        let Some(row) = ran.rows.first() else {
            return Ok(false);
        };
        let sync = sync_of_at(row, 1).map_err(|e| self.s.c.classify(what, e))?;
        if let Some(why) = self.not_durable(&ran.warnings, sync, timeout).await {
            return Err(StoreError::unavailable(format!(
                "{what} the store {}: {why}",
                self.s.c.shown
            )));
        }
        if self.require_sync && !sync {
            return Err(StoreError::unavailable(format!(
                "{what} the store {}: the commit did not wait for a synchronous standby \
                 (require=sync)",
                self.s.c.shown
            )));
        }
        Ok(true)
    }
}

/// Whether the row's `synchronous_commit`, `synchronous_standby_names`
/// (from `at`) make commits wait for a standby.
impl PgStore {
    /// The acquire, plain or (with `period`) under `--once-per`'s rule.
    async fn acquire_in(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: Option<Period>,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        const WHAT: &str = "cannot acquire in";
        if self.require_sync {
            self.check_sync(timeout).await?;
        }
        let ms = millis(lease);
        let values = if key.advertise.is_some() || key.slots > 1 {
            taken_values_sql(name, holder, key.advertise.as_deref(), key.slots_value())
                .map_err(|e| self.s.c.classify(WHAT, e))?
        } else {
            String::new()
        };
        let ran = self
            .run(timeout, WHAT, true, |cols| {
                Ok(match period {
                    Some(p) => acquire_once_sql(name, holder, ms, p, cols)?,
                    None => acquire_sql(name, holder, ms, cols)?,
                } + &values)
            })
            .await?;
        let tag = |r: &PgRow| r.try_get::<String, _>(0).unwrap_or_default();
        if let Some(r) = ran.rows.iter().find(|r| tag(r) == "adopted") {
            tracing::info!(
                event = "adopted",
                "the lease was written on another timeline (a failover of the store): \
                 held at least one lease from now by this server's clock, epoch {}",
                r.try_get::<i64, _>(1).unwrap_or_default()
            );
        }
        let Some(row) = ran.rows.iter().find(|r| tag(r) == "taken") else {
            if let Some(r) = ran.rows.iter().find(|r| tag(r) == "unreadable") {
                let outcome: Option<String> = r.try_get(2).unwrap_or_default();
                let why = match outcome.filter(|o| !crate::store::known_outcome(o)) {
                    Some(o) => format!("says its run ended \"{}\"", crate::names::printable(&o)),
                    None => format!(
                        "has a start more than {} ahead of the server's clock",
                        crate::duration::show(crate::store::FUTURE_LIMIT)
                    ),
                };
                return Err(crate::store::unreadable(&self.s.c.shown, name, &why));
            }
            return Ok(match ran.rows.iter().find(|r| tag(r) == "done") {
                Some(r) => Acquired::DoneThisPeriod {
                    started_ms_ago: r
                        .try_get::<i64, _>(1)
                        .map_err(|e| self.s.c.classify(WHAT, e))?,
                },
                None => Acquired::Held,
            });
        };
        let (epoch, sync) = row
            .try_get::<i64, _>(1)
            .and_then(|e| Ok((e, sync_of_at(row, 2)?)))
            .map_err(|e| self.s.c.classify(WHAT, e))?;
        let why = match self.not_durable(&ran.warnings, sync, timeout).await {
            Some(why) => why,
            None if self.require_sync && !sync => {
                "the commit did not wait for a synchronous standby (require=sync)".into()
            }
            None => return Ok(Acquired::Taken(epoch)),
        };
        // Not a lease to run on: handed back at once, at that epoch only,
        // so no one waits out L for it (a failure to hand back leaves it to
        // expire, which is only slower).
        let handed = self
            .run(timeout, "cannot release in", false, |cols| {
                // Under --once-per nothing ran: the period is not used up.
                let ending = period.map(|_| crate::store::NOT_STARTED);
                release_sql(name, holder, epoch, 0, ending, cols)
            })
            .await
            .is_ok_and(|r| r.rows.len() == 1);
        self.sync_checked = None;
        Err(StoreError::unavailable(format!(
            "the store {} granted the lease at epoch {epoch}, but {why}; {}",
            self.s.c.shown,
            if handed {
                "handed it back"
            } else {
                "it could not be handed back and expires by itself"
            }
        )))
    }

    /// Release (with `ending`, also the run record's end), and the lease's
    /// values in the same transaction where the run has any to write: a
    /// `--min-hold` keep marks the tenure ended, an advertised value goes
    /// with a freed lease. A table without the values' columns (an older
    /// release's, which only a plain run can have taken) gets the plain
    /// release: `status` cannot tell a kept lease there, and says held.
    async fn release_in(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        ending: Option<&str>,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        const WHAT: &str = "cannot release in";
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        let ms = millis(keep);
        let values = if ms > 0 || key.advertise.is_some() || key.slots > 1 {
            released_values_sql(name, epoch, ms).map_err(|e| self.s.c.classify(WHAT, e))?
        } else {
            String::new()
        };
        let with_values = self
            .update(WHAT, timeout, |cols| {
                Ok(release_sql(name, holder, epoch, ms, ending, cols)? + &values)
            })
            .await;
        match with_values {
            Err(e) if !values.is_empty() && lacks_column(&e) => {
                self.update(WHAT, timeout, |cols| {
                    release_sql(name, holder, epoch, ms, ending, cols)
                })
                .await
            }
            done => done,
        }
    }

    /// A `--once-per`, `--advertise` or `--slots` acquire that found the table
    /// without the columns it writes (made by an earlier release): add
    /// them, where this login may (the table's owner), and say so; where it
    /// may not, a refusal that names the one statement to run. A run
    /// without either never gets here: the table works for it as it is.
    async fn add_run_columns(&mut self, timeout: Duration) -> Result<(), StoreError> {
        match self
            .run(
                timeout,
                "cannot add columns to leader_lease in",
                false,
                |_| Ok(UPGRADE_SQL.to_string()),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(
                    event = "store_schema",
                    "added the missing columns to leader_lease (for --once-per, --advertise, --slots)"
                );
                Ok(())
            }
            Err(e) if e.may_heal() => Err(e),
            Err(e) => Err(StoreError::fatal(format!(
                "{e}: table leader_lease was made by an earlier release and lacks the columns \
                 --once-per, --advertise and --slots keep their values in; run `{UPGRADE_SQL}` as the \
                 table's owner (or `leaderrun init` as it)"
            ))),
        }
    }
}

/// Whether `e` is the server's "undefined column" (42703): a table made by
/// an earlier release, met by a statement that names a newer column.
fn lacks_column(e: &StoreError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .is_some_and(|e| is_code(e, UNDEFINED_COLUMN))
}

impl Backend for PgStore {
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let got = match self.acquire_in(key, lease, None, timeout).await {
            // Only `--advertise` and `--slots` name columns a plain
            // acquire does not.
            Err(e) if (key.advertise.is_some() || key.slots > 1) && lacks_column(&e) => {
                self.add_run_columns(timeout).await?;
                self.acquire_in(key, lease, None, timeout).await
            }
            done => done,
        };
        Ok(got?.epoch())
    }

    fn advertises(&self) -> bool {
        true
    }

    fn slots(&self) -> bool {
        true
    }

    fn once_per(&self) -> bool {
        true
    }

    async fn acquire_once(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: Period,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        match self.acquire_in(key, lease, Some(period), timeout).await {
            Err(e) if lacks_column(&e) => {
                self.add_run_columns(timeout).await?;
                self.acquire_in(key, lease, Some(period), timeout).await
            }
            done => done,
        }
    }

    async fn release_ending(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        outcome: Outcome,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let outcome = outcome.to_string();
        self.release_in(key, epoch, keep, Some(&outcome), timeout)
            .await
    }

    async fn run_records(
        &mut self,
        name: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        const WHAT: &str = "cannot read";
        if self.cols == Columns::Legacy {
            // An older release's table (no `timeline`) has no run record
            // either: the upgrade adds them together.
            return Ok(Vec::new());
        }
        let ran = match self
            .run(timeout, WHAT, false, |cols| match cols {
                Columns::WithTimeline => run_records_sql(name),
                Columns::Legacy => Err(sqlx::Error::Encode("no run record columns".into())),
            })
            .await
        {
            // A table made before the run record keeps none.
            Err(e) if lacks_column(&e) => return Ok(Vec::new()),
            ran => ran?,
        };
        ran.rows
            .iter()
            .map(|r| {
                Ok(RunRecord {
                    name: r.try_get(0)?,
                    holder: r.try_get(1)?,
                    epoch: r.try_get::<Option<i64>, _>(2)?.unwrap_or_default(),
                    outcome: r.try_get(3)?,
                    started_at: r.try_get::<Option<String>, _>(4)?.unwrap_or_default(),
                    started_ms_ago: r.try_get::<Option<i64>, _>(5)?.unwrap_or_default(),
                    ended_at: r.try_get(6)?,
                    ended_ms_ago: r.try_get(7)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| self.s.c.classify(WHAT, e))
    }

    async fn renew(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        let ms = millis(lease);
        self.update("cannot renew in", timeout, |cols| {
            renew_sql(name, holder, epoch, ms, cols)
        })
        .await
    }

    async fn release(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.release_in(key, epoch, keep, None, timeout).await
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let ran = self
            .run(timeout, "cannot read", false, |_| inspect_sql(name))
            .await?;
        ran.rows
            .first()
            .map(lease_info)
            .transpose()
            .map_err(|e| self.s.c.classify("cannot read", e))
    }

    fn describe(&self) -> String {
        self.s.c.shown.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pushes_wakeups: true,
            ..Capabilities::MILLIS
        }
    }

    fn wakeups(&self, name: &str, heard: Heard) -> Option<Subscription> {
        let hosts: Vec<PgConnectOptions> = self.s.c.hosts.iter().map(|h| h.opts.clone()).collect();
        Some(Subscription::Postgres(Box::new(HostsWakeups::new(
            hosts, name, heard,
        )?)))
    }

    fn schema(&self) -> Option<Schema> {
        Some(SCHEMA)
    }

    /// Look first and create only when missing, so that `init` on a
    /// read-only server whose table exists succeeds; then make sure the
    /// login may do what a run does, so that "ready" means a run works. A table made by an
    /// older release gets the `timeline` column where this role may add it
    /// ([`UPGRADE_SQL`]); where it may not, the table still works as it did.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.s.reset();
        let rows = self
            .run(timeout, "cannot use", false, |_| Ok(EXISTS_SQL.to_string()))
            .await?
            .rows;
        let there = rows
            .first()
            .and_then(|r| sqlx::Row::try_get::<i64, _>(r, 0).ok())
            .unwrap_or(0)
            != 0;
        if !there {
            self.run(timeout, "cannot use", false, |_| Ok(TABLE_SQL.to_string()))
                .await
                .map_err(sql::cannot_create)?;
        }
        self.upgrade(timeout).await;
        // "Ready" only when a run would work: the login may do all it does.
        let missing: Vec<String> = self
            .run(timeout, "cannot check privileges in", false, |_| {
                Ok(PRIVILEGES_SQL.to_string())
            })
            .await?
            .rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>(0).ok())
            .collect();
        if !missing.is_empty() {
            return Err(sql::lacking(
                &self.s.c.shown,
                &missing,
                "GRANT SELECT, INSERT, UPDATE ON leader_lease TO <login>",
            ));
        }
        Ok(Init::Ready)
    }

    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        Ok(self.replication_state(timeout).await?.replication())
    }

    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let ran = self
            .run(timeout, "cannot read", false, |_| Ok(LIST_SQL.to_string()))
            .await?;
        ran.rows
            .iter()
            .map(lease_info)
            .collect::<Result<_, _>>()
            .map_err(|e| self.s.c.classify("cannot read", e))
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let ran = self
            .run(timeout, "cannot release in", false, |_| {
                clear_sql(name, epoch)
            })
            .await?;
        ran.rows
            .first()
            .map(lease_info)
            .transpose()
            .map_err(|e| self.s.c.classify("cannot release in", e))
    }
}

impl PgStore {
    /// Add the columns a table made by an older release lacks (`timeline`,
    /// the run record's), when any is missing and this role may (the
    /// table's owner); otherwise say so once and leave the table as it is:
    /// it keeps working for every run but a `--once-per` one.
    pub async fn upgrade(&mut self, timeout: Duration) {
        let has = self
            .run(timeout, "cannot read", false, |_| {
                Ok(HAS_COLUMNS_SQL.to_string())
            })
            .await
            .ok()
            .and_then(|r| r.rows.first().and_then(|r| r.try_get::<i64, _>(0).ok()));
        if has.is_none_or(|n| n >= UPGRADE_COLUMNS) {
            return;
        }
        match self
            .run(timeout, "cannot upgrade the table in", false, |_| {
                Ok(UPGRADE_SQL.to_string())
            })
            .await
        {
            Ok(_) => {
                self.cols = Columns::WithTimeline;
                tracing::info!(
                    event = "store_schema",
                    "added the missing columns (timeline, run_*) to leader_lease"
                );
            }
            Err(e) => tracing::warn!(
                event = "store_schema",
                "{e} (the table works without them, but a lease written on another timeline \
                 is not adopted after a failover and --once-per cannot run: run \
                 `{UPGRADE_SQL}` as the table's owner)"
            ),
        }
    }
}
