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
//! Both keys share the hash tag `{leaderrun:NAME}`, so a script that names
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
//! Replication (`?replicas=N`, the primary's identity): see [`confirm`] and
//! [`Server`]; docs/stores.md says what each protects against.
//!
//! Push wake-ups: the release and clear scripts `PUBLISH` on the lease's
//! channel (`{leaderrun:NAME}:released`) in the same script as the `DEL`,
//! so a subscriber can never hear of a release before the lease is free. A
//! waiting contender `SUBSCRIBE`s on a connection of its own before each
//! attempt (src/store/push.rs). An expiry publishes nothing (keyspace
//! notifications are off by default and not ours to switch on); a waiter
//! schedules its next attempt for the expiry instead.
//!
//! The connection is taken out of `self` for a call and put back only on
//! success: a failed call, or one abandoned by the elector's timer, leaves
//! nothing half-read behind, and the next call reconnects.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, Value};
use tokio::time::Instant;

use super::push;
use super::sql::{check_params, millis};
use super::{
    AnyStore, Capabilities, Init, LeaseInfo, Replication, Store, StoreAdmin, StoreError, Target,
};
use crate::redact::Redacted;

/// `KEYS[1]` lease, `KEYS[2]` epoch; `ARGV[1]` holder, `ARGV[2]` lease ms.
/// Returns nil when the lease is held; otherwise the new epoch and what the
/// server that took it says about itself (`INFO server`, `replication`,
/// `persistence`), read in the same atomic step: the identity recorded is
/// that of the server that made the write.
const ACQUIRE_LUA: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], e .. ':' .. ARGV[1], 'PX', ARGV[2])
return {e, redis.call('INFO', 'server'), redis.call('INFO', 'replication'),
  redis.call('INFO', 'persistence')}
";

/// `KEYS[1]` lease; `ARGV[1]` `EPOCH:HOLDER`, `ARGV[2]` lease ms, `ARGV[3]`
/// and `ARGV[4]` the run_id and master_replid of the primary that granted
/// the lease ('' when not known: nothing to compare). Returns 1 when
/// renewed, 0 when the lease is not ours, and `{run_id, master_replid}`
/// when the server is not the one that granted it (then nothing is
/// written). An expired key reads as nil, so an expired lease cannot be
/// renewed.
const RENEW_LUA: &str = r"
if ARGV[3] ~= '' then
  local s = redis.call('INFO', 'server')
  local r = redis.call('INFO', 'replication')
  if not string.find(s, '\nrun_id:' .. ARGV[3] .. '\r', 1, true)
    or not string.find(r, '\nmaster_replid:' .. ARGV[4] .. '\r', 1, true) then
    return {string.match(s, '\nrun_id:(%x+)') or '', string.match(r, '\nmaster_replid:(%x+)') or ''}
  end
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// `KEYS[1]` lease; `ARGV[1]` `EPOCH:HOLDER`, `ARGV[2]` keep ms, `ARGV[3]`
/// the lease's wake-up channel ('' to wake nobody). With keep > 0 the
/// holder stays recorded until then (`--min-hold`); otherwise the lease is
/// freed and waiters are told in the same script, so no subscriber hears of
/// it before it is free.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
  if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], '') end
end
return 1
";

/// `KEYS[1]` lease, `KEYS[2]` epoch. `{counter, value, pttl}`, read in one
/// step so the three agree.
const INSPECT_LUA: &str = r"
return {redis.call('GET', KEYS[2]), redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
";

/// `KEYS[1]` lease, `KEYS[2]` epoch; `ARGV[1]` the epoch to clear, or ''
/// for any, `ARGV[2]` the wake-up channel. Returns what was cleared as
/// INSPECT does, or nil.
const CLEAR_LUA: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return false end
if ARGV[1] ~= '' and string.sub(v, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. ':' then
  return false
end
local info = {redis.call('GET', KEYS[2]), v, redis.call('PTTL', KEYS[1])}
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return info
";

static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_LUA));
static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new(RENEW_LUA));
static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LUA));
static INSPECT: LazyLock<Lua> = LazyLock::new(|| Lua::new(INSPECT_LUA));
static CLEAR: LazyLock<Lua> = LazyLock::new(|| Lua::new(CLEAR_LUA));

const PREFIX: &str = "{leaderrun:";
const LEASE_SUFFIX: &str = "}:lease";
const EPOCH_SUFFIX: &str = "}:epoch";

/// The most acknowledgements `?replicas=` may ask for: far more replicas
/// than any primary has, small enough that a typo is caught.
const MAX_REPLICAS: u32 = 100;

fn lease_key(name: &str) -> String {
    format!("{PREFIX}{name}{LEASE_SUFFIX}")
}

fn epoch_key(name: &str) -> String {
    format!("{PREFIX}{name}{EPOCH_SUFFIX}")
}

/// The lease key's value: the epoch first, since it has no `:` in it, so the
/// holder (which may) is everything after the first `:`.
fn lease_value(epoch: i64, holder: &str) -> String {
    format!("{epoch}:{holder}")
}

struct Lua {
    src: &'static str,
    sha: String,
}

impl Lua {
    fn new(src: &'static str) -> Lua {
        Lua {
            src,
            sha: ::redis::Script::new(src).get_hash().to_string(),
        }
    }
}

/// What a server says about itself (`INFO`), as far as leases go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Server {
    /// Changes whenever the process restarts.
    run_id: String,
    /// Changes whenever the server's replication history does: promoted
    /// from replica, or resynchronised from another primary (its data
    /// replaced by that primary's). Also, harmlessly, when a primary frees
    /// or creates its replication backlog (`repl-backlog-ttl` after its
    /// last replica left, and when the next one attaches).
    replid: String,
    version: (u32, u32),
    /// How often the server looks at blocked clients' timeouts
    /// (`configured_hz`, the least its dynamic `hz` goes down to).
    hz: u32,
    /// `INFO replication`'s `role`: `master` or `slave`.
    role: String,
    /// A replica's primary, `host:port`.
    master: Option<String>,
    connected_replicas: u32,
    /// `min-replicas-to-write` (with `min-replicas-max-lag`) is on: Redis
    /// prints `min_slaves_good_slaves` only then.
    min_replicas_to_write: bool,
    aof: bool,
}

impl Server {
    /// From the text of `INFO` sections (`field:value` lines).
    fn parse(sections: &[&str]) -> Server {
        let mut s = Server::default();
        let (mut host, mut port) = (None, None);
        for line in sections.iter().flat_map(|t| t.lines()) {
            let Some((k, v)) = line.trim_end().split_once(':') else {
                continue;
            };
            match k {
                "run_id" => s.run_id = v.to_string(),
                "master_replid" => s.replid = v.to_string(),
                "redis_version" => s.version = parse_version(v),
                "configured_hz" => s.hz = v.parse().unwrap_or(0),
                "role" => s.role = v.to_string(),
                "master_host" => host = Some(v.to_string()),
                "master_port" => port = Some(v.to_string()),
                "connected_slaves" => s.connected_replicas = v.parse().unwrap_or(0),
                "min_slaves_good_slaves" => s.min_replicas_to_write = true,
                "aof_enabled" => s.aof = v == "1",
                _ => {}
            }
        }
        if let (Some(h), Some(p)) = (host, port) {
            s.master = Some(format!("{h}:{p}"));
        }
        s
    }

    /// How late a `WAIT` may return after its timeout: Redis notices a
    /// blocked client's timeout only on its next cron tick (measured on
    /// 7.0: `WAIT 1 100` with no replica answering returns after 200 ms at
    /// the default hz of 10). 100 ms when the server did not say.
    fn tick(&self) -> Duration {
        let hz = if self.hz == 0 { 10 } else { self.hz.min(500) };
        Duration::from_millis(1000 / u64::from(hz))
    }

    fn is_replica(&self) -> bool {
        self.role == "slave"
    }

    /// `WAITAOF` (Redis 7.2) can confirm that the primary's append-only
    /// file has a write on disk, whatever `appendfsync` says.
    fn waitaof(&self) -> bool {
        self.version >= (7, 2) && self.aof
    }
}

/// `7.0.15` → (7, 0); anything unreadable reads as the oldest.
fn parse_version(v: &str) -> (u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The lease this store took last, and the primary that took it.
struct Granted {
    name: String,
    epoch: i64,
    primary: Server,
}

pub struct RedisStore {
    client: Client,
    conn: Option<MultiplexedConnection>,
    redacted: Redacted,
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
pub fn open(t: &Target<'_>) -> Result<AnyStore, String> {
    Ok(Box::new(RedisStore::new(t.url)?))
}

/// `replicas=N`, the one parameter: a whole number from 0 to
/// [`MAX_REPLICAS`], given at most once.
fn replicas_param(url: &url::Url) -> Result<u32, String> {
    // `protocol=3` would change the shape of every reply parsed below, and
    // the driver ignores parameters it does not know (a mistyped one would
    // silently do nothing): take none but ours.
    check_params(url, &["replicas"])?;
    let mut given = url.query_pairs().filter(|(k, _)| k == "replicas");
    let Some((_, v)) = given.next() else {
        return Ok(0);
    };
    if given.next().is_some() {
        return Err("has replicas= more than once".into());
    }
    // Digits only: no sign, no spaces, no hex; never shown back.
    v.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| v.parse::<u32>().ok())
        .flatten()
        .filter(|n| *n <= MAX_REPLICAS)
        .ok_or_else(|| {
            format!("has a replicas= that is not a whole number from 0 to {MAX_REPLICAS}")
        })
}

impl RedisStore {
    pub fn new(url: &url::Url) -> Result<RedisStore, String> {
        let replicas = replicas_param(url)?;
        // The driver gets the URL without our parameter. Its parse errors
        // are fixed texts ("Missing hostname", "Invalid database number");
        // it never puts the URL in them.
        let mut bare = url.clone();
        bare.set_query(None);
        let client = Client::open(bare).map_err(|e| format!("is not valid: {e}"))?;
        Ok(RedisStore {
            client,
            conn: None,
            redacted: Redacted::new(url),
            replicas,
            granted: None,
            checked: false,
        })
    }

    fn classify(&self, what: &str, e: &RedisError) -> StoreError {
        // The server's and the driver's words; neither contains the
        // password (the server never echoes AUTH arguments).
        let msg = format!("{what} the store {}: {e}", self.redacted);
        if is_transient(e) {
            StoreError::Unavailable(msg)
        } else {
            StoreError::Fatal(msg)
        }
    }

    /// Run `f` on a connection within `timeout`; keep the connection only
    /// when the call succeeded. `f` is told the call's deadline, which
    /// counts from before connecting.
    async fn call<T, F, Fut>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<(T, MultiplexedConnection), RedisError>>,
    {
        let deadline = Instant::now() + timeout;
        let work = async {
            let conn = match self.conn.take() {
                Some(mut c) => {
                    // This call's bound, not the one of the call that
                    // connected: a WAIT may rightly take most of it.
                    c.set_response_timeout(timeout);
                    c
                }
                None => {
                    // The driver's own timeouts too, so that its background
                    // task gives up on a dead socket as we do.
                    let cfg = AsyncConnectionConfig::new()
                        .set_connection_timeout(timeout)
                        .set_response_timeout(timeout);
                    self.client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await
                        .map_err(|e| self.classify("cannot connect to", &e))?
                }
            };
            match f(conn, deadline).await {
                Ok((v, conn)) => {
                    self.conn = Some(conn);
                    Ok(v)
                }
                Err(e) => Err(self.classify(what, &e)),
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the store {} did not answer within {}",
                self.redacted,
                humantime::format_duration(timeout)
            ))),
        }
    }

    /// One script on the lease's two keys.
    async fn script(
        &mut self,
        timeout: Duration,
        what: &str,
        lua: &'static Lua,
        name: &str,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        let keys = [lease_key(name), epoch_key(name)];
        self.call(timeout, what, move |mut c, _| async move {
            let v = eval(&mut c, lua, &keys, &args).await?;
            Ok((v, c))
        })
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
                self.redacted,
                risks.join("; ")
            );
        }
    }
}

/// What makes a primary able to lose an acquisition it acknowledged, in the
/// words of the run's warning.
fn risks(server: &Server, fsync: Option<&str>, replicas: u32) -> Vec<String> {
    let mut out = Vec::new();
    if !server.aof {
        out.push(
            "it keeps no append-only file (appendonly no), so a restart forgets every lease \
             and epoch counter"
                .to_string(),
        );
    } else if let Some(f) = fsync.filter(|f| *f != "always") {
        // With replicas=N on 7.2, WAITAOF confirms the disk write instead.
        if !(replicas > 0 && server.waitaof()) {
            out.push(format!(
                "appendfsync {f}, so a crash can lose the last second of acquisitions and hand \
                 an epoch out twice"
            ));
        }
    }
    if replicas == 0 && server.connected_replicas > 0 && !server.min_replicas_to_write {
        out.push(format!(
            "min-replicas-to-write is 0 with {} connected and no replicas= in the URL, so a \
             primary cut off from its replicas keeps granting leases that a failover loses",
            count(server.connected_replicas, "replica")
        ));
    }
    out
}

fn count(n: u32, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// What `status` says of the server's replication, and whether a failover
/// can lose an acknowledged acquisition: not when every acquisition waits
/// for a replica (`replicas=N ≥ 1`, so a promoted replica has it) *and*
/// the primary has it on disk before it answers (an append-only file with
/// `appendfsync always`, or `WAITAOF` on 7.2), so a restart keeps it too.
fn replication_of(server: &Server, fsync: Option<&str>, replicas: u32) -> Replication {
    if server.is_replica() {
        let of = server.master.as_deref().unwrap_or("an unknown primary");
        return Replication::unknown(format!(
            "a replica of {of} (read-only: leases are taken on its primary; ask that)"
        ));
    }
    let mut parts = vec![format!(
        "primary, {} connected",
        count(server.connected_replicas, "replica")
    )];
    parts.push(if replicas > 0 {
        format!("every acquisition and renewal waits for {replicas} (replicas={replicas})")
    } else {
        "nothing waits for a replica (no replicas= in the URL)".into()
    });
    if replicas > server.connected_replicas {
        parts.push(format!(
            "fewer replicas connected than replicas={replicas}: every acquisition fails"
        ));
    }
    parts.push(match (server.aof, fsync) {
        (false, _) => "appendonly no".into(),
        (true, Some(f)) => format!("appendonly yes (appendfsync {f})"),
        (true, None) => "appendonly yes (appendfsync not readable: no CONFIG GET)".into(),
    });
    parts.push(format!(
        "min-replicas-to-write {}",
        if server.min_replicas_to_write {
            "on"
        } else {
            "0"
        }
    ));
    let can_lose = if replicas == 0 || !server.aof {
        Some(true)
    } else if replicas > 0 && server.waitaof() {
        Some(false)
    } else {
        fsync.map(|f| f != "always")
    };
    Replication {
        can_lose_acknowledged: can_lose,
        detail: parts.join(", "),
    }
}

/// `EVALSHA`, and `EVAL` of the same source when the server does not know
/// the script (a restart, `SCRIPT FLUSH`, a failover to a fresh replica).
async fn eval(
    c: &mut MultiplexedConnection,
    lua: &Lua,
    keys: &[String],
    args: &[String],
) -> Result<Value, RedisError> {
    let build = |cmd: &str, body: &str| {
        let mut cmd = ::redis::cmd(cmd);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    match build("EVALSHA", &lua.sha).query_async(c).await {
        Err(e) if e.kind() == ErrorKind::NoScriptError => {
            build("EVAL", lua.src).query_async(c).await
        }
        r => r,
    }
}

/// After a write on `c`: until `n` replicas acknowledge it (`WAIT`) and,
/// on Redis 7.2 and later with an append-only file (`aof`), until the
/// primary has it on disk (`WAITAOF 1 0`), all before `deadline - reserve`.
/// The timeouts sent are shorter by the server's `tick` ([`Server::tick`]),
/// since that is how late they may end. `None` when confirmed; otherwise
/// what fell short.
///
/// `WAIT` must run on the connection that wrote, right after the write:
/// it waits for that connection's last write. A replica's acknowledgement
/// means it has the write in memory, so a failover to it keeps the write;
/// the primary's disk keeps it across a restart. The replicas' own disks
/// are not waited for (`WAITAOF 1 N` would refuse every call where replicas
/// run without an append-only file, and guards only a second failure).
/// `WAIT` and `WAITAOF` take a timeout in milliseconds, where 0 means for
/// ever: 0 is never sent.
async fn confirm(
    c: &mut MultiplexedConnection,
    n: u32,
    server: &Server,
    deadline: Instant,
    reserve: Duration,
) -> Result<Option<String>, RedisError> {
    let reserve = reserve + server.tick();
    let Some(t) = wait_ms(deadline, reserve) else {
        return Ok(Some(format!(
            "left no time to wait for {}",
            count(n, "replica")
        )));
    };
    let acked: i64 = ::redis::cmd("WAIT").arg(n).arg(t).query_async(c).await?;
    if acked < i64::from(n) {
        return Ok(Some(format!(
            "reached {acked} of {} within {t} ms",
            count(n, "replica")
        )));
    }
    if server.waitaof() {
        let Some(t) = wait_ms(deadline, reserve) else {
            return Ok(Some("left no time to wait for the primary's disk".into()));
        };
        let synced: Vec<i64> = ::redis::cmd("WAITAOF")
            .arg(1)
            .arg(0)
            .arg(t)
            .query_async(c)
            .await?;
        if synced.first().copied().unwrap_or(0) < 1 {
            return Ok(Some(format!(
                "was not on the primary's disk within {t} ms (WAITAOF)"
            )));
        }
    }
    Ok(None)
}

/// Whole milliseconds from now to `deadline - reserve`; `None` below one.
fn wait_ms(deadline: Instant, reserve: Duration) -> Option<u64> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .saturating_sub(reserve);
    u64::try_from(left.as_millis()).ok().filter(|ms| *ms > 0)
}

/// What to keep back from a call's deadline for what follows a `WAIT` (on
/// top of the server's tick): at least `floor` and `1/share` of what is
/// left, and `round_trips` times the round trip the script took, but never
/// more than half of what is left.
fn reserve(
    rtt: Duration,
    left: Duration,
    floor: Duration,
    share: u32,
    round_trips: u32,
) -> Duration {
    (rtt * round_trips)
        .max(floor)
        .max(left / share)
        .min(left / 2)
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

/// Failures that may heal by themselves: the network, timeouts, a server
/// that is loading its data, busy with a script, read-only (a replica, or a
/// primary during a failover), out of memory under `noeviction`. A wrong
/// password (`WRONGPASS`), a missing one (`NOAUTH`), an ACL refusal
/// (`NOPERM`), a TLS failure (an unknown CA, a bad certificate, a server
/// that speaks no TLS), a bad configuration or a key of the wrong type will
/// not.
fn is_transient(e: &RedisError) -> bool {
    if is_tls_failure(e) {
        return false;
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() {
        return true;
    }
    match e.kind() {
        ErrorKind::BusyLoadingError
        | ErrorKind::TryAgain
        | ErrorKind::ClusterDown
        | ErrorKind::MasterDown
        | ErrorKind::ReadOnly => true,
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => false,
        _ => matches!(e.code(), Some("BUSY" | "OOM" | "LOADING" | "MASTERDOWN")),
    }
}

/// The TLS layer refused: the driver hands rustls's error up inside an I/O
/// error. Unlike a refused or reset connection, this does not change by
/// trying again; a connection closed mid-handshake is a plain I/O error.
fn is_tls_failure(e: &RedisError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .and_then(|io| io.get_ref())
        .is_some_and(|inner| inner.is::<tokio_rustls::rustls::Error>())
}

fn bad_reply(what: &str, v: &Value) -> RedisError {
    RedisError::from((
        ErrorKind::TypeError,
        "unexpected reply",
        format!("{what}: {v:?}"),
    ))
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The acquire script's reply: `None` when held, else the epoch and the
/// server that granted it.
fn parse_acquired(v: &Value) -> Result<Option<(i64, Server)>, RedisError> {
    match v {
        Value::Nil => Ok(None),
        Value::Array(p) if p.len() == 4 => {
            let epoch = as_int(&p[0]).ok_or_else(|| bad_reply("acquire", v))?;
            let texts: Vec<String> = p[1..].iter().filter_map(as_text).collect();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            Ok(Some((epoch, Server::parse(&texts))))
        }
        _ => Err(bad_reply("acquire", v)),
    }
}

/// A lease from `{counter, value, pttl}` (INSPECT and CLEAR); `None` when
/// the lease has neither a counter nor a holder (never acquired).
fn parse_info(name: &str, v: &Value) -> Result<Option<LeaseInfo>, StoreError> {
    let bad = || StoreError::Fatal(format!("unexpected reply from Redis for {name}: {v:?}"));
    let parts = match v {
        Value::Nil => return Ok(None),
        Value::Array(p) if p.len() == 3 => p,
        _ => return Err(bad()),
    };
    let counter = as_int(&parts[0]);
    let held = as_text(&parts[1]);
    let pttl = as_int(&parts[2]).ok_or_else(bad)?;
    Ok(match (held, counter) {
        (Some(value), counter) => {
            let (epoch, holder) = value.split_once(':').ok_or_else(bad)?;
            let epoch = epoch.parse::<i64>().ok().or(counter).ok_or_else(bad)?;
            Some(LeaseInfo {
                name: name.to_string(),
                holder: Some(holder.to_string()),
                epoch,
                // -1: a key without expiry, which only a hand-made key has.
                expires_in_ms: Some(if pttl >= 0 { pttl } else { i64::MAX }),
            })
        }
        // Free (released or expired): the counter still says which epoch
        // was last handed out.
        (None, Some(epoch)) => Some(LeaseInfo {
            name: name.to_string(),
            holder: None,
            epoch,
            expires_in_ms: None,
        }),
        (None, None) => None,
    })
}

/// How an acquisition went on the server.
enum Taken {
    Held,
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

/// The first 8 characters of an id, for a log line.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

impl Store for RedisStore {
    async fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let replicas = self.replicas;
        let look = !self.checked;
        let keys = [lease_key(name), epoch_key(name)];
        let args = vec![holder.to_string(), millis(lease).max(1).to_string()];
        let taken = self
            .call(
                timeout,
                "cannot acquire in",
                move |mut c, deadline| async move {
                    let start = Instant::now();
                    let v = eval(&mut c, &ACQUIRE, &keys, &args).await?;
                    let Some((epoch, server)) = parse_acquired(&v)? else {
                        return Ok((Taken::Held, c));
                    };
                    let rtt = start.elapsed();
                    // Room for the hand-back below, and for reading the
                    // configuration once: a round trip each, with a wide
                    // margin, since a hand-back that misses the deadline leaves
                    // the lease taken for L with no command under it.
                    let left = deadline.saturating_duration_since(Instant::now());
                    let keep = reserve(rtt, left, Duration::from_millis(50), 4, 4);
                    if replicas > 0 {
                        let confirmed = confirm(&mut c, replicas, &server, deadline, keep).await;
                        if !matches!(confirmed, Ok(None)) {
                            // Not acknowledged (or WAIT refused): give it
                            // back at once, at this epoch only, so nobody
                            // waits out a lease whose command never starts.
                            // Waiters are not woken: the lease was never
                            // usable, and they would most likely meet the
                            // same stalled replication.
                            let value = lease_value(epoch, &args[0]);
                            let back = [value, "0".into(), String::new()];
                            let handed = eval(&mut c, &RELEASE, &keys, &back).await;
                            let why = confirmed?.unwrap_or_default();
                            handed?;
                            return Ok((Taken::Unconfirmed { epoch, why }, c));
                        }
                    }
                    // `CONFIG GET` cannot run inside a script: once per run, and
                    // only with time to spare (a confirmed lease must not be
                    // lost to a slow answer about settings).
                    let fsync = if look && server.aof && wait_ms(deadline, keep * 2).is_some() {
                        let left = deadline
                            .saturating_duration_since(Instant::now())
                            .saturating_sub(keep);
                        tokio::time::timeout(left, config_get(&mut c, "appendfsync"))
                            .await
                            .ok()
                            .flatten()
                    } else {
                        None
                    };
                    Ok((
                        Taken::Yes {
                            epoch,
                            server,
                            fsync,
                        },
                        c,
                    ))
                },
            )
            .await?;
        match taken {
            Taken::Held => Ok(None),
            Taken::Yes {
                epoch,
                server,
                fsync,
            } => {
                self.warn_once(&server, fsync.as_deref());
                self.granted = Some(Granted {
                    name: name.to_string(),
                    epoch,
                    primary: server,
                });
                Ok(Some(epoch))
            }
            Taken::Unconfirmed { epoch, why } => Err(StoreError::Unavailable(format!(
                "cannot acquire in the store {}: the acquisition (epoch {epoch}) {why}, so \
                     it was handed back",
                self.redacted
            ))),
        }
    }

    async fn renew(
        &mut self,
        name: &str,
        holder: &str,
        epoch: i64,
        lease: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let replicas = self.replicas;
        // Not granted through this store: nothing to compare with, and the
        // defaults (no WAITAOF, a tick of 100 ms) for what follows.
        let primary = self
            .granted
            .as_ref()
            .filter(|g| g.name == name && g.epoch == epoch)
            .map(|g| g.primary.clone())
            .unwrap_or_default();
        let (run_id, replid) = (primary.run_id.clone(), primary.replid.clone());
        let keys = [lease_key(name)];
        let args = vec![
            lease_value(epoch, holder),
            millis(lease).max(1).to_string(),
            run_id.clone(),
            replid.clone(),
        ];
        let renewed = self
            .call(
                timeout,
                "cannot renew in",
                move |mut c, deadline| async move {
                    let start = Instant::now();
                    let v = eval(&mut c, &RENEW, &keys, &args).await?;
                    let r = match &v {
                        Value::Array(p) if p.len() == 2 => Renewed::Moved(
                            as_text(&p[0]).unwrap_or_default(),
                            as_text(&p[1]).unwrap_or_default(),
                        ),
                        v if as_int(v) == Some(1) => Renewed::Yes,
                        _ => Renewed::NotOurs,
                    };
                    if !matches!(r, Renewed::Yes) || replicas == 0 {
                        return Ok((r, c));
                    }
                    let rtt = start.elapsed();
                    let left = deadline.saturating_duration_since(Instant::now());
                    // Only the reply follows; one that comes late fails the
                    // renewal all the same.
                    let keep = reserve(rtt, left, Duration::from_millis(10), 5, 2);
                    Ok(
                        match confirm(&mut c, replicas, &primary, deadline, keep).await? {
                            Some(why) => (Renewed::Unconfirmed(why), c),
                            None => (Renewed::Yes, c),
                        },
                    )
                },
            )
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
                    self.redacted,
                    what.join(", ")
                );
                self.granted = None;
                Ok(false)
            }
            Renewed::Unconfirmed(why) => Err(StoreError::Unavailable(format!(
                "cannot renew in the store {}: the renewal {why}, so it does not count",
                self.redacted
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
        name: &str,
        holder: &str,
        epoch: i64,
        keep: Duration,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let args = vec![
            lease_value(epoch, holder),
            millis(keep).to_string(),
            push::redis_channel(name),
        ];
        let v = self
            .script(timeout, "cannot release in", &RELEASE, name, args)
            .await?;
        if self
            .granted
            .as_ref()
            .is_some_and(|g| g.name == name && g.epoch == epoch)
        {
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
}

impl StoreAdmin for RedisStore {
    fn describe(&self) -> String {
        self.redacted.to_string()
    }

    /// `PX` takes milliseconds and the server counts them on its own clock.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pushes_wakeups: true,
            ..Capabilities::MILLIS
        }
    }

    fn wakeups(&self) -> Option<push::AnyWakeups> {
        Some(Box::new(push::RedisWakeups::new(self.client.clone())))
    }

    /// From `INFO` (role, connected replicas, `min-replicas-to-write`,
    /// the append-only file) and, where permitted, `CONFIG GET
    /// appendfsync`; see [`replication_of`].
    async fn replication(&mut self, timeout: Duration) -> Result<Replication, StoreError> {
        let (server, fsync) = self
            .call(timeout, "cannot read", |mut c, _| async move {
                let mut texts = Vec::with_capacity(3);
                for section in ["server", "replication", "persistence"] {
                    let t: String = ::redis::cmd("INFO")
                        .arg(section)
                        .query_async(&mut c)
                        .await?;
                    texts.push(t);
                }
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                let server = Server::parse(&texts);
                let fsync = config_get(&mut c, "appendfsync").await;
                Ok(((server, fsync), c))
            })
            .await?;
        Ok(replication_of(&server, fsync.as_deref(), self.replicas))
    }

    /// Nothing to create: keys appear on first use. Connecting (and
    /// authenticating) is still checked, so `init` fails on a wrong password.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.call(timeout, "cannot use", |mut c, _| async move {
            let _: String = ::redis::cmd("PING").query_async(&mut c).await?;
            Ok(((), c))
        })
        .await?;
        Ok(Init::NothingToDo)
    }

    /// Every lease that was ever acquired has an epoch counter, held or not,
    /// so the counters are what is scanned (`SCAN`, not `KEYS`, so a big
    /// database is not blocked). `{` and `}` are not glob characters.
    async fn list(&mut self, timeout: Duration) -> Result<Vec<LeaseInfo>, StoreError> {
        let pattern = format!("{PREFIX}*{EPOCH_SUFFIX}");
        let keys: Vec<String> = self
            .call(timeout, "cannot read", |mut c, _| async move {
                let mut cursor = 0u64;
                let mut keys = Vec::new();
                loop {
                    let (next, batch): (u64, Vec<String>) = ::redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut c)
                        .await?;
                    keys.extend(batch);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
                Ok((keys, c))
            })
            .await?;
        // SCAN may return a key twice; a name is the text between the fixed
        // prefix and suffix, whatever it contains.
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|k| k.strip_prefix(PREFIX)?.strip_suffix(EPOCH_SUFFIX))
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
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
            push::redis_channel(name),
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
    fn keys_share_a_hash_tag_whatever_the_name() {
        for name in ["job", "a}b", "{x}", "}", "*"] {
            let (l, e) = (lease_key(name), epoch_key(name));
            let tag = |k: &str| {
                let open = k.find('{').expect("open");
                let close = open + k[open..].find('}').expect("close");
                k[open + 1..close].to_string()
            };
            assert_eq!(tag(&l), tag(&e), "{name}");
        }
    }

    /// `INFO` as Redis 7.0.15 prints it (trimmed), `\r\n` line ends.
    const PRIMARY_INFO: [&str; 3] = [
        "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\
         run_id:01aa66b6a0446fea775d0bcb96a5a29291255dd2\r\nhz:10\r\nconfigured_hz:10\r\n",
        "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nmin_slaves_good_slaves:1\r\n\
         slave0:ip=127.0.0.1,port=47112,state=online,offset=126,lag=0\r\n\
         master_replid:a10368cb331c9efd9249127fb92b6edc679e6058\r\n\
         master_replid2:0000000000000000000000000000000000000000\r\n",
        "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\n",
    ];

    #[test]
    fn server_from_info() {
        let s = Server::parse(&PRIMARY_INFO);
        assert_eq!(s.run_id, "01aa66b6a0446fea775d0bcb96a5a29291255dd2");
        assert_eq!(s.replid, "a10368cb331c9efd9249127fb92b6edc679e6058");
        assert_eq!((s.version, s.hz, s.role.as_str()), ((7, 0), 10, "master"));
        assert_eq!(
            (s.connected_replicas, s.min_replicas_to_write, s.aof),
            (1, true, true)
        );
        assert_eq!(s.master, None);
        assert!(!s.waitaof(), "7.0 has no WAITAOF");
        assert_eq!(s.tick(), Duration::from_millis(100));
        let replica = Server::parse(&[
            "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379\r\n",
            "# Server\r\nredis_version:7.2.4\r\nconfigured_hz:100\r\n",
        ]);
        assert!(replica.is_replica());
        assert_eq!(replica.master.as_deref(), Some("10.0.0.1:6379"));
        assert_eq!(replica.tick(), Duration::from_millis(10));
        assert_eq!(parse_version("7.2.4"), (7, 2));
        assert_eq!(parse_version("x"), (0, 0));
        // Nothing said: the defaults are the careful ones.
        let empty = Server::parse(&[]);
        assert_eq!(
            (empty.tick(), empty.aof, empty.waitaof()),
            (Duration::from_millis(100), false, false)
        );
    }

    fn url(q: &str) -> url::Url {
        url::Url::parse(&format!("redis://h:1/0{q}")).expect("url")
    }

    #[test]
    fn the_replicas_parameter() {
        assert_eq!(replicas_param(&url("")), Ok(0));
        assert_eq!(replicas_param(&url("?replicas=0")), Ok(0));
        assert_eq!(replicas_param(&url("?replicas=100")), Ok(100));
        for bad in [
            "?replicas=",
            "?replicas=101",
            "?replicas=-1",
            "?replicas=%201",
            "?replicas=1e1",
        ] {
            let e = replicas_param(&url(bad)).expect_err(bad);
            assert!(e.contains("0 to 100"), "{bad}: {e}");
        }
        let e = replicas_param(&url("?replicas=1&replicas=1")).expect_err("twice");
        assert!(e.contains("more than once"), "{e}");
        let e = replicas_param(&url("?protocol=3")).expect_err("protocol");
        assert!(e.contains("unknown parameter protocol"), "{e}");
    }

    fn server(aof: bool, version: (u32, u32), replicas: u32, min: bool) -> Server {
        Server {
            role: "master".into(),
            aof,
            version,
            connected_replicas: replicas,
            min_replicas_to_write: min,
            ..Server::default()
        }
    }

    #[test]
    fn what_the_warning_names() {
        let none = |s: &Server, f: Option<&str>, n: u32| risks(s, f, n).is_empty();
        assert!(none(&server(true, (7, 0), 1, true), Some("always"), 0));
        assert!(
            none(&server(true, (7, 0), 0, false), Some("always"), 0),
            "no replicas"
        );
        assert!(
            none(&server(true, (7, 0), 2, false), None, 1),
            "replicas= waits"
        );
        let r = risks(&server(false, (7, 0), 1, false), None, 0);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].contains("appendonly no") && r[1].contains("min-replicas-to-write is 0"));
        let r = risks(&server(true, (7, 0), 0, false), Some("everysec"), 1);
        assert!(r[0].contains("appendfsync everysec"), "{r:?}");
        // WAITAOF confirms the disk write when replicas= asks for waiting.
        assert!(none(&server(true, (7, 2), 1, false), Some("everysec"), 1));
        assert!(!none(&server(true, (7, 2), 0, true), Some("everysec"), 0));
    }

    #[test]
    fn what_status_says_a_failover_can_lose() {
        let lose =
            |s: &Server, f: Option<&str>, n: u32| replication_of(s, f, n).can_lose_acknowledged;
        assert_eq!(
            lose(&server(true, (7, 0), 1, true), Some("always"), 1),
            Some(false)
        );
        assert_eq!(
            lose(&server(true, (7, 0), 1, true), Some("always"), 0),
            Some(true)
        );
        assert_eq!(
            lose(&server(false, (7, 0), 1, true), Some("always"), 1),
            Some(true)
        );
        assert_eq!(
            lose(&server(true, (7, 0), 1, true), Some("everysec"), 1),
            Some(true)
        );
        assert_eq!(lose(&server(true, (7, 0), 1, true), None, 1), None);
        assert_eq!(lose(&server(true, (7, 2), 1, true), None, 1), Some(false));
        let r = replication_of(&server(true, (7, 0), 0, false), Some("always"), 2);
        assert!(r.detail.contains("every acquisition fails"), "{r:?}");
        let replica = Server {
            role: "slave".into(),
            master: Some("h:6379".into()),
            ..Server::default()
        };
        let r = replication_of(&replica, None, 1);
        assert_eq!(r.can_lose_acknowledged, None);
        assert!(r.detail.contains("a replica of h:6379"), "{r:?}");
    }

    #[test]
    fn waits_fit_the_deadline() {
        let ms = Duration::from_millis;
        // The hand-back's share of a 1.3 s acquisition: a quarter.
        assert_eq!(reserve(ms(1), ms(1300), ms(50), 4, 4), ms(325));
        // A slow round trip takes more, never more than half.
        assert_eq!(reserve(ms(100), ms(300), ms(50), 4, 4), ms(150));
        assert_eq!(reserve(ms(1), ms(300), ms(10), 5, 2), ms(60));
        let soon = Instant::now() + ms(50);
        assert_eq!(
            wait_ms(soon, ms(60)),
            None,
            "never WAIT 0: that is for ever"
        );
        assert!(wait_ms(Instant::now() + ms(500), ms(100)).is_some_and(|t| t <= 400));
        assert_eq!(short("0123456789abcdef"), "01234567");
        assert_eq!(short("ab"), "ab");
    }

    #[test]
    fn info_from_replies() {
        let v = Value::Array(vec![
            Value::BulkString(b"7".to_vec()),
            Value::BulkString(b"7:host:1:abc".to_vec()),
            Value::Int(900),
        ]);
        let i = parse_info("n", &v).expect("ok").expect("some");
        assert_eq!(
            (i.holder.as_deref(), i.epoch, i.expires_in_ms),
            (Some("host:1:abc"), 7, Some(900))
        );
        let free = Value::Array(vec![
            Value::BulkString(b"3".to_vec()),
            Value::Nil,
            Value::Int(-2),
        ]);
        let i = parse_info("n", &free).expect("ok").expect("some");
        assert_eq!((i.holder, i.epoch), (None, 3));
        let none = Value::Array(vec![Value::Nil, Value::Nil, Value::Int(-2)]);
        assert_eq!(parse_info("n", &none).expect("ok"), None);
    }
}
