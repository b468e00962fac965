//! The Redis store: two keys per lease, expiry by the server's clock.
//!
//! For lease `NAME`:
//!
//! * `{leaderrun:NAME}:lease` holds `EPOCH:HOLDER` while the lease is held,
//!   with a server-side expiry (`PX`). When it expires Redis deletes it, so a
//!   missing key *is* a free lease; no client clock is ever consulted.
//! * `{leaderrun:NAME}:epoch` is a counter that never expires. It is raised
//!   by exactly one per acquisition (`INCR` in the acquire script) and
//!   survives releases and expiries, so epochs never repeat while the data
//!   survives (see docs/stores.md for what a failover can do to that).
//!
//! Under `--once-per` (docs/stores.md, "Once per period") two more:
//! `{leaderrun:NAME}:period`, which lives half a period by Redis's own
//! expiry from the start of the run that wrote it (Redis has no clock a
//! stored time could be compared with inside a script but `TIME`, and
//! expiry is what the lease already trusts), and `{leaderrun:NAME}:run`,
//! the run record, a hash without expiry. The acquiring script checks the
//! one and writes both, with the lease, in one atomic step.
//!
//! All keys share the hash tag `{leaderrun:NAME}`, so a script that names
//! both is legal on a cluster slot too, and a name containing `{` or `}`
//! cannot split them: both keys begin with the same bytes up to the first
//! `}`, whatever the name.
//!
//! Acquire, renew, release, inspect and clear are each one Lua script, which
//! Redis runs atomically: no other command interleaves, so two racers cannot
//! both see a missing lease key. Names and holders travel only as `KEYS` and
//! `ARGV`, never as script text, and are compared as plain strings, so no
//! name can change what a script does.
//!
//! Scripts go by `EVALSHA` and fall back to `EVAL` (not `SCRIPT LOAD`) on
//! `NOSCRIPT`: after a restart or `SCRIPT FLUSH` the first call sends the
//! source once, atomically, and an ACL user needs no `SCRIPT` permission.
//!
//! Replication (`?replicas=N`, the primary's identity): see wait.rs and
//! server.rs; docs/stores.md says what each protects against.
//!
//! Push wake-ups: the release and clear scripts `PUBLISH` on the lease's
//! channel (`{leaderrun:NAME}:released`) in the same script as the `DEL`,
//! so a subscriber can never hear of a release before the lease is free. A
//! waiting contender `SUBSCRIBE`s on a connection of its own before each
//! attempt (wake.rs). The acquire scripts likewise `PUBLISH` on
//! `{leaderrun:NAME}:acquired` with the `SET`, for `watch` alone. An expiry publishes nothing (keyspace
//! notifications are off by default and not ours to switch on); a waiter
//! schedules its next attempt for the expiry instead.
//!
//! The connection is taken out of `self` for a call and put back only on
//! success: a failed call, or one abandoned by the elector's timer, leaves
//! nothing half-read behind, and the next call reconnects.

use crate::store::UrlError;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{Client, RedisError, Value};
use tokio::time::Instant;

mod connect;
mod scripts;
mod server;
mod url;
mod wait;
pub(crate) mod wake;

use self::connect::Reach;
use self::scripts::*;
use self::server::{replication_of, risks, Server};
use self::url::replicas_param;
use self::wait::{confirm, reserve, wait_ms};
use self::wake::{redis_acquired_channel, redis_channel, RedisWakeups};
use super::session::Session;
use super::sql::millis;
use super::wake::{Heard, Subscription};
use super::{
    Acquired, Backend, Capabilities, Init, LeaseInfo, LeaseKey, Outcome, Period, Replication,
    RunRecord, Store, StoreError, Target, NOT_STARTED,
};
use crate::redact::Redacted;

/// The grant this lock took last, and the primary that took it. (A store
/// is bound to one lease name and holder once it is a lock.)
struct Granted {
    epoch: i64,
    primary: Server,
}

pub struct RedisStore {
    s: Session<Reach>,
    /// `?replicas=N`: an acquisition or a renewal counts only once `N`
    /// replicas acknowledged it.
    replicas: u32,
    granted: Option<Granted>,
    /// This run has looked at the deployment (and warned, if need be):
    /// once per run, not per call.
    checked: bool,
}

/// The registry's constructor for `redis://` and `rediss://` (TLS):
/// `redis://[user][:password]@host[:port][/db][?replicas=N]`. Nothing is
/// connected until the first call.
pub fn open(t: &Target<'_>) -> Result<Store, UrlError> {
    Ok(Store::Redis(RedisStore::new(t.url)?))
}

impl RedisStore {
    fn new(url: &::url::Url) -> Result<RedisStore, UrlError> {
        let replicas = replicas_param(url)?;
        // The driver gets the URL without our parameter. Its parse errors
        // are fixed texts ("Missing hostname", "Invalid database number");
        // it never puts the URL in them.
        let mut bare = url.clone();
        bare.set_query(None);
        let client =
            Client::open(bare).map_err(|e| UrlError::because(format!("is not valid: {e}"), e))?;
        Ok(RedisStore {
            s: Session::new(Reach {
                client,
                redacted: Redacted::new(url),
            }),
            replicas,
            granted: None,
            checked: false,
        })
    }

    /// A call on the session, with the driver's response timeout set to
    /// this call's bound, not to that of the call that connected: a `WAIT`
    /// may rightly take most of it.
    async fn call<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: impl AsyncFnOnce(&mut MultiplexedConnection, Instant) -> Result<T, RedisError>,
    ) -> Result<T, StoreError> {
        self.s
            .call(timeout, what, async move |c, deadline| {
                c.set_response_timeout(timeout);
                f(c, deadline).await
            })
            .await
    }

    /// One script on the lease's keys: lease, epoch, values.
    async fn script(
        &mut self,
        timeout: Duration,
        what: &str,
        lua: &'static Lua,
        name: &str,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        let keys = [lease_key(name), epoch_key(name), value_key(name)];
        self.call(timeout, what, async |c, _| eval(c, lua, &keys, &args).await)
            .await
    }

    /// Once per run, when a lease was first taken: a deployment that can
    /// lose an acknowledged acquisition is named in one warning line.
    fn warn_once(&mut self, server: &Server, fsync: Option<&str>) {
        if std::mem::replace(&mut self.checked, true) {
            return;
        }
        let risks = risks(server, fsync, self.replicas);
        if !risks.is_empty() {
            tracing::warn!(
                event = "store",
                "the store {} can lose acknowledged acquisitions: {} (docs/stores.md, Redis)",
                self.s.c.redacted,
                risks.join("; ")
            );
        }
    }
}

/// `CONFIG GET name`, or `None` where it is not permitted (it also reveals
/// passwords, so a careful ACL leaves it out) or not known.
async fn config_get(c: &mut MultiplexedConnection, name: &str) -> Option<String> {
    let pair: Vec<String> = ::redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(c)
        .await
        .ok()?;
    pair.get(1).cloned()
}

/// How an acquisition went on the server.
enum Taken {
    Held,
    /// `--once-per`: this period's run started this long ago (ms).
    Done(i64),
    /// `--once-per`: the run record cannot be read (why).
    Unreadable(String),
    /// Taken and, with `replicas=N`, acknowledged. `fsync` is read once
    /// per run, for the warning.
    Yes {
        epoch: i64,
        server: Server,
        fsync: Option<String>,
    },
    /// Taken, but fewer acknowledgements than asked for (`why`); handed
    /// back already.
    Unconfirmed {
        epoch: i64,
        why: String,
    },
}

/// How a renewal went on the server.
enum Renewed {
    Yes,
    NotOurs,
    /// The server is not the primary that granted the lease: what it says
    /// it is now (run_id, master_replid).
    Moved(String, String),
    Unconfirmed(String),
}

impl RedisStore {
    /// The names with a key that ends in `suffix` (`SCAN`, not `KEYS`, so
    /// a big database is not blocked; `{` and `}` are not glob
    /// characters), sorted, each once.
    async fn names(&mut self, suffix: &str, timeout: Duration) -> Result<Vec<String>, StoreError> {
        let pattern = format!("{PREFIX}*{suffix}");
        let keys: Vec<String> = self
            .call(timeout, "cannot read", async move |c, _| {
                let mut cursor = 0u64;
                let mut keys = Vec::new();
                loop {
                    let (next, batch): (u64, Vec<String>) = ::redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(c)
                        .await?;
                    keys.extend(batch);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
                Ok(keys)
            })
            .await?;
        // SCAN may return a key twice; a name is the text between the fixed
        // prefix and suffix, whatever it contains.
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|k| k.strip_prefix(PREFIX)?.strip_suffix(suffix))
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// The first 8 characters of an id, for a log line.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

impl RedisStore {
    /// The acquire, plain or (with `half`) under `--once-per`'s rule.
    async fn acquire_in(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        period: Option<Period>,
        timeout: Duration,
    ) -> Result<Acquired, StoreError> {
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        let replicas = self.replicas;
        let look = !self.checked;
        let mut keys = vec![lease_key(name), epoch_key(name)];
        let mut args = vec![holder.to_string(), millis(lease).max(1).to_string()];
        let lua: &Lua = match period {
            Some(p) => {
                keys.extend([period_key(name), run_key(name)]);
                args.extend([
                    millis(p.half).max(1).to_string(),
                    if p.retry_failed { "1" } else { "0" }.to_string(),
                    millis(crate::store::FUTURE_LIMIT).to_string(),
                ]);
                &ACQUIRE_ONCE
            }
            None => &ACQUIRE,
        };
        // The acquired channel, then the values key and the values go last
        // (scripts.rs).
        args.push(redis_acquired_channel(name));
        keys.push(value_key(name));
        args.push(crate::store::lease::values_suffix(
            key.advertise.as_deref(),
            key.slots_value(),
        ));
        let taken = self
            .call(timeout, "cannot acquire in", async move |c, deadline| {
                let start = Instant::now();
                let v = eval(c, lua, &keys, &args).await?;
                let (epoch, server) = match parse_acquired(&v)? {
                    Reply::Held => return Ok(Taken::Held),
                    Reply::Done(ms) => return Ok(Taken::Done(ms)),
                    Reply::Unreadable(why) => return Ok(Taken::Unreadable(why)),
                    Reply::Taken(epoch, server) => (epoch, server),
                };
                let rtt = start.elapsed();
                // Room for the hand-back below, and for reading the
                // configuration once: a round trip each, with a wide
                // margin, since a hand-back that misses the deadline leaves
                // the lease taken for L with no command under it.
                let left = deadline.saturating_duration_since(Instant::now());
                let keep = reserve(rtt, left, Duration::from_millis(50), 4, 4);
                if replicas > 0 {
                    let confirmed = confirm(c, replicas, &server, deadline, keep).await;
                    if !matches!(confirmed, Ok(None)) {
                        // Not acknowledged (or WAIT refused): give it
                        // back at once, at this epoch only, so nobody
                        // waits out a lease whose command never starts.
                        // Waiters are not woken: the lease was never
                        // usable, and they would most likely meet the
                        // same stalled replication. Under --once-per
                        // nothing ran: the period is not used up.
                        let value = lease_value(epoch, &args[0]);
                        let mut back = vec![value, "0".into(), String::new()];
                        let handed = match period {
                            Some(_) => {
                                back.extend([
                                    NOT_STARTED.to_string(),
                                    args[0].clone(),
                                    epoch.to_string(),
                                ]);
                                let ks = [
                                    keys[0].clone(),
                                    keys[2].clone(),
                                    keys[3].clone(),
                                    keys[keys.len() - 1].clone(),
                                ];
                                eval(c, &RELEASE_ENDING, &ks, &back).await
                            }
                            None => eval(c, &RELEASE, &keys, &back).await,
                        };
                        let why = confirmed?.unwrap_or_default();
                        handed?;
                        return Ok(Taken::Unconfirmed { epoch, why });
                    }
                }
                // `CONFIG GET` cannot run inside a script: once per run, and
                // only with time to spare (a confirmed lease must not be
                // lost to a slow answer about settings).
                let fsync = if look && server.aof && wait_ms(deadline, keep * 2).is_some() {
                    let left = deadline
                        .saturating_duration_since(Instant::now())
                        .saturating_sub(keep);
                    tokio::time::timeout(left, config_get(c, "appendfsync"))
                        .await
                        .ok()
                        .flatten()
                } else {
                    None
                };
                Ok(Taken::Yes {
                    epoch,
                    server,
                    fsync,
                })
            })
            .await?;
        match taken {
            Taken::Held => Ok(Acquired::Held),
            Taken::Done(started_ms_ago) => Ok(Acquired::DoneThisPeriod { started_ms_ago }),
            Taken::Unreadable(why) => Err(crate::store::unreadable(
                &self.s.c.redacted.to_string(),
                name,
                &crate::names::printable(&why),
            )),
            Taken::Yes {
                epoch,
                server,
                fsync,
            } => {
                self.warn_once(&server, fsync.as_deref());
                self.granted = Some(Granted {
                    epoch,
                    primary: server,
                });
                Ok(Acquired::Taken(epoch))
            }
            Taken::Unconfirmed { epoch, why } => Err(StoreError::unavailable(format!(
                "cannot acquire in the store {}: the acquisition (epoch {epoch}) {why}, so \
                     it was handed back",
                self.s.c.redacted
            ))),
        }
    }

    /// The run record of `name`, by the server's clock; `None` without one.
    async fn run_record(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<RunRecord>, StoreError> {
        let keys = [run_key(name)];
        let v = self
            .call(timeout, "cannot read", async |c, _| {
                eval(c, &RECORD, &keys, &[]).await
            })
            .await?;
        let parts = match &v {
            Value::Nil => return Ok(None),
            Value::Array(p) if p.len() == 6 => p,
            _ => {
                return Err(StoreError::fatal(format!(
                    "unexpected reply from Redis for {name}'s run record: {v:?}"
                )))
            }
        };
        let now = as_int(&parts[0]).unwrap_or_default();
        // A field written by hand that is not a time reads as none, and
        // times are clamped as status clamps every time.
        let at = |v: &Value| as_int(v).map(|ms| ms.clamp(now - MAX_MS, now + MAX_MS));
        let (started, ended) = (at(&parts[1]), at(&parts[2]));
        Ok(Some(RunRecord {
            name: name.to_string(),
            started_at: started.map(rfc3339).unwrap_or_default(),
            started_ms_ago: started.map_or(0, |s| now - s),
            ended_at: ended.map(rfc3339),
            ended_ms_ago: ended.map(|e| now - e),
            holder: as_text(&parts[3]),
            epoch: as_int(&parts[4]).unwrap_or_default(),
            outcome: as_text(&parts[5]),
        }))
    }
}

/// Whether Redis refused a command for the user's ACL (`NOPERM`, or inside
/// a script "can't run this command").
fn refused_by_acl(e: &StoreError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<RedisError>())
        .is_some_and(|r| {
            r.code() == Some("NOPERM") || r.to_string().contains("can't run this command")
        })
}

/// Ten years in milliseconds: a time shown is clamped to it.
const MAX_MS: i64 = 10 * 366 * 24 * 3600 * 1000;

/// Milliseconds since the Unix epoch (the server's `TIME`) as RFC 3339 in
/// UTC, to the millisecond.
fn rfc3339(ms: i64) -> String {
    let t = match u64::try_from(ms) {
        Ok(ms) => std::time::UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => std::time::UNIX_EPOCH,
    };
    humantime::format_rfc3339_millis(t).to_string()
}

impl Backend for RedisStore {
    async fn acquire(
        &mut self,
        key: &LeaseKey,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        Ok(self.acquire_in(key, lease, None, timeout).await?.epoch())
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
            // A user made by the ACL line of the release before --once-per:
            // Redis 7.0 names no command when a script's call is refused.
            Err(e) if !e.may_heal() && refused_by_acl(&e) => Err(e.reworded(|m| {
                format!(
                    "{m} (--once-per's scripts also call TIME, HSET and HMGET: add \
                     +time +hset +hmget to the user's ACL, as docs/stores.md shows)"
                )
            })),
            done => done,
        }
    }

    /// As `release`, with the run's end and outcome written in the same
    /// script where the record is this holder's at `epoch`.
    async fn release_ending(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        outcome: Outcome,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        let keys = [
            lease_key(name),
            period_key(name),
            run_key(name),
            value_key(name),
        ];
        let args = [
            lease_value(epoch, holder),
            millis(keep).to_string(),
            redis_channel(name),
            outcome.to_string(),
            holder.to_string(),
            epoch.to_string(),
        ];
        let v = self
            .call(timeout, "cannot release in", async |c, _| {
                eval(c, &RELEASE_ENDING, &keys, &args).await
            })
            .await?;
        if self.granted.as_ref().is_some_and(|g| g.epoch == epoch) {
            self.granted = None;
        }
        Ok(as_int(&v) == Some(1))
    }

    /// Of `name`, or of every name with a record (`SCAN` for the records'
    /// keys, as `list` scans the counters).
    async fn run_records(
        &mut self,
        name: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let names = match name {
            Some(n) => vec![n.to_string()],
            None => self.names(RUN_SUFFIX, timeout).await?,
        };
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if let Some(r) = self.run_record(&n, timeout).await? {
                out.push(r);
            }
        }
        Ok(out)
    }

    async fn renew(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        let replicas = self.replicas;
        // Not granted through this store: nothing to compare with, and the
        // defaults (no WAITAOF, a tick of 100 ms) for what follows.
        let primary = self
            .granted
            .as_ref()
            .filter(|g| g.epoch == epoch)
            .map(|g| g.primary.clone())
            .unwrap_or_default();
        let (run_id, replid) = (primary.run_id.clone(), primary.replid.clone());
        let keys = [lease_key(name), value_key(name)];
        let args = vec![
            lease_value(epoch, holder),
            millis(lease).max(1).to_string(),
            run_id.clone(),
            replid.clone(),
        ];
        let renewed = self
            .call(timeout, "cannot renew in", async move |c, deadline| {
                let start = Instant::now();
                let v = eval(c, &RENEW, &keys, &args).await?;
                let r = match &v {
                    Value::Array(p) if p.len() == 2 => Renewed::Moved(
                        as_text(&p[0]).unwrap_or_default(),
                        as_text(&p[1]).unwrap_or_default(),
                    ),
                    v if as_int(v) == Some(1) => Renewed::Yes,
                    _ => Renewed::NotOurs,
                };
                if !matches!(r, Renewed::Yes) || replicas == 0 {
                    return Ok(r);
                }
                let rtt = start.elapsed();
                let left = deadline.saturating_duration_since(Instant::now());
                // Only the reply follows; one that comes late fails the
                // renewal all the same.
                let keep = reserve(rtt, left, Duration::from_millis(10), 5, 2);
                Ok(
                    match confirm(c, replicas, &primary, deadline, keep).await? {
                        Some(why) => Renewed::Unconfirmed(why),
                        None => Renewed::Yes,
                    },
                )
            })
            .await?;
        match renewed {
            Renewed::Yes => Ok(true),
            Renewed::NotOurs => Ok(false),
            Renewed::Moved(now_id, now_replid) => {
                // Acknowledged writes may be missing here (a restart that
                // lost the last of its append-only file, a promoted replica
                // that had not received them), so the expiry this server
                // keeps may be earlier than sent + L: the lease cannot be
                // trusted any longer, and the command is stopped at once.
                let mut what = Vec::new();
                if now_id != run_id {
                    what.push(format!(
                        "run_id was {}, is {}",
                        short(&run_id),
                        short(&now_id)
                    ));
                }
                if now_replid != replid {
                    what.push(format!(
                        "master_replid was {}, is {}",
                        short(&replid),
                        short(&now_replid)
                    ));
                }
                tracing::warn!(
                    event = "store_error",
                    epoch,
                    "the store {} is no longer the Redis primary that granted lease {name} ({}): \
                     it may lack the acquisition or the last renewals, so the lease is lost",
                    self.s.c.redacted,
                    what.join(", ")
                );
                self.granted = None;
                Ok(false)
            }
            Renewed::Unconfirmed(why) => Err(StoreError::unavailable(format!(
                "cannot renew in the store {}: the renewal {why}, so it does not count",
                self.s.c.redacted
            ))),
        }
    }

    /// A release waits for no replica, with or without `replicas=N`: the
    /// command is gone by now (contract §8), so a release lost in a
    /// failover can only leave the lease held on the new primary until
    /// the expiry it has (delaying a rival by at most `L`), or, for
    /// `--min-hold`, shorten the hold to that expiry (a later run may start
    /// sooner, at a higher epoch, never beside this one). Neither is worth
    /// a replica's round trip on every handover.
    async fn release(
        &mut self,
        key: &LeaseKey,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (key.name.as_str(), key.holder.as_str());
        let args = vec![
            lease_value(epoch, holder),
            millis(keep).to_string(),
            redis_channel(name),
        ];
        let v = self
            .script(timeout, "cannot release in", &RELEASE, name, args)
            .await?;
        if self.granted.as_ref().is_some_and(|g| g.epoch == epoch) {
            self.granted = None;
        }
        Ok(as_int(&v) == Some(1))
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let v = self
            .script(timeout, "cannot read", &INSPECT, name, Vec::new())
            .await?;
        parse_info(name, &v)
    }

    fn describe(&self) -> String {
        self.s.c.redacted.to_string()
    }

    /// `PX` takes milliseconds and the server counts them on its own clock.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pushes_wakeups: true,
            ..Capabilities::MILLIS
        }
    }

    fn wakeups(&self, name: &str, heard: Heard) -> Option<Subscription> {
        Some(Subscription::Redis(RedisWakeups::new(
            self.s.c.client.clone(),
            name,
            heard,
        )))
    }

    /// From `INFO` (role, connected replicas, `min-replicas-to-write`,
    /// the append-only file) and, where permitted, `CONFIG GET
    /// appendfsync`; see [`replication_of`].
    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        let (server, fsync) = self
            .call(timeout, "cannot read", async move |c, _| {
                let mut texts = Vec::with_capacity(3);
                for section in ["server", "replication", "persistence"] {
                    let t: String = ::redis::cmd("INFO").arg(section).query_async(c).await?;
                    texts.push(t);
                }
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                let server = Server::parse(&texts);
                let fsync = config_get(c, "appendfsync").await;
                Ok((server, fsync))
            })
            .await?;
        Ok(replication_of(&server, fsync.as_deref(), self.replicas))
    }

    /// Nothing to create: keys appear on first use. Connecting (and
    /// authenticating) is still checked, so `init` fails on a wrong password.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.call(timeout, "cannot use", async move |c, _| {
            let _: String = ::redis::cmd("PING").query_async(c).await?;
            Ok(())
        })
        .await?;
        Ok(Init::NothingToDo)
    }

    /// Every lease that was ever acquired has an epoch counter, held or not,
    /// so the counters are what is scanned.
    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let names = self.names(EPOCH_SUFFIX, timeout).await?;
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if let Some(info) = self.inspect(&n, timeout).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    async fn clear(
        &mut self,
        name: &str,
        epoch: Option<i64>,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let args = vec![
            epoch.map(|e| e.to_string()).unwrap_or_default(),
            redis_channel(name),
        ];
        let v = self
            .script(timeout, "cannot release in", &CLEAR, name, args)
            .await?;
        parse_info(name, &v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_shortened_for_log_lines() {
        assert_eq!(short("0123456789abcdef"), "01234567");
        assert_eq!(short("ab"), "ab");
    }
}
