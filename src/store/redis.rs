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

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, Value};

use super::push;
use super::sql::{check_params, millis};
use super::{AnyStore, Capabilities, Init, LeaseInfo, Store, StoreAdmin, StoreError, Target};
use crate::redact::Redacted;

/// `KEYS[1]` lease, `KEYS[2]` epoch; `ARGV[1]` holder, `ARGV[2]` lease ms.
/// Returns the new epoch, or nil when the lease is held.
const ACQUIRE_LUA: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], e .. ':' .. ARGV[1], 'PX', ARGV[2])
return e
";

/// `KEYS[1]` lease; `ARGV[1]` `EPOCH:HOLDER`, `ARGV[2]` lease ms. An expired
/// key reads as nil, so an expired lease cannot be renewed.
const RENEW_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// `KEYS[1]` lease; `ARGV[1]` `EPOCH:HOLDER`, `ARGV[2]` keep ms, `ARGV[3]`
/// the lease's wake-up channel. With keep > 0 the holder stays recorded
/// until then (`--min-hold`); otherwise the lease is freed and waiters are
/// told in the same script, so no subscriber hears of it before it is free.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], '')
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

const PREFIX: &str = "{leaderrun:";
const LEASE_SUFFIX: &str = "}:lease";
const EPOCH_SUFFIX: &str = "}:epoch";

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

pub struct RedisStore {
    client: Client,
    conn: Option<MultiplexedConnection>,
    redacted: Redacted,
    acquire: Lua,
    renew: Lua,
    release: Lua,
    inspect: Lua,
    clear: Lua,
}

/// The registry's constructor for `redis://` and `rediss://` (TLS):
/// `redis://[user][:password]@host[:port][/db]`. Nothing is connected until
/// the first call.
pub fn open(t: &Target<'_>) -> Result<AnyStore, String> {
    Ok(Box::new(RedisStore::new(t.url)?))
}

impl RedisStore {
    pub fn new(url: &url::Url) -> Result<RedisStore, String> {
        // The driver ignores query parameters it does not know (a mistyped
        // one would silently do nothing) and `protocol=3` would change the
        // shape of every reply parsed below: take none.
        check_params(url, &[])?;
        // The driver's parse errors are fixed texts ("Missing hostname",
        // "Invalid database number"); it never puts the URL in them.
        let client = Client::open(url.clone()).map_err(|e| format!("is not valid: {e}"))?;
        Ok(RedisStore {
            client,
            conn: None,
            redacted: Redacted::new(url),
            acquire: Lua::new(ACQUIRE_LUA),
            renew: Lua::new(RENEW_LUA),
            release: Lua::new(RELEASE_LUA),
            inspect: Lua::new(INSPECT_LUA),
            clear: Lua::new(CLEAR_LUA),
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
    /// when the call succeeded.
    async fn call<T, F, Fut>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = Result<(T, MultiplexedConnection), RedisError>>,
    {
        let work = async {
            let conn = match self.conn.take() {
                Some(c) => c,
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
            match f(conn).await {
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
        which: fn(&RedisStore) -> &Lua,
        name: &str,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        let (sha, src) = {
            let l = which(self);
            (l.sha.clone(), l.src)
        };
        let keys = [lease_key(name), epoch_key(name)];
        self.call(timeout, what, move |mut c| async move {
            let v = eval(&mut c, &sha, src, &keys, &args).await?;
            Ok((v, c))
        })
        .await
    }
}

/// `EVALSHA`, and `EVAL` of the same source when the server does not know
/// the script (a restart, `SCRIPT FLUSH`, a failover to a fresh replica).
async fn eval(
    c: &mut MultiplexedConnection,
    sha: &str,
    src: &str,
    keys: &[String],
    args: &[String],
) -> Result<Value, RedisError> {
    let build = |cmd: &str, body: &str| {
        let mut cmd = ::redis::cmd(cmd);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    match build("EVALSHA", sha).query_async(c).await {
        Err(e) if e.kind() == ErrorKind::NoScriptError => build("EVAL", src).query_async(c).await,
        r => r,
    }
}

/// Failures that may heal by themselves: the network, timeouts, a server
/// that is loading its data, busy with a script, read-only (a replica, or a
/// primary during a failover), out of memory under `noeviction`. A wrong
/// password (`WRONGPASS`), a missing one (`NOAUTH`), an ACL refusal
/// (`NOPERM`), a bad configuration or a key of the wrong type will not.
fn is_transient(e: &RedisError) -> bool {
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

impl Store for RedisStore {
    async fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let args = vec![holder.to_string(), millis(lease).max(1).to_string()];
        let v = self
            .script(timeout, "cannot acquire in", |s| &s.acquire, name, args)
            .await?;
        match v {
            Value::Nil => Ok(None),
            Value::Int(e) => Ok(Some(e)),
            other => Err(self.classify("cannot acquire in", &bad_reply("acquire", &other))),
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
        let args = vec![lease_value(epoch, holder), millis(lease).max(1).to_string()];
        let v = self
            .script(timeout, "cannot renew in", |s| &s.renew, name, args)
            .await?;
        Ok(as_int(&v) == Some(1))
    }

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
            .script(timeout, "cannot release in", |s| &s.release, name, args)
            .await?;
        Ok(as_int(&v) == Some(1))
    }

    async fn inspect(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let v = self
            .script(timeout, "cannot read", |s| &s.inspect, name, Vec::new())
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

    /// Nothing to create: keys appear on first use. Connecting (and
    /// authenticating) is still checked, so `init` fails on a wrong password.
    async fn init(&mut self, timeout: Duration) -> Result<Init, StoreError> {
        self.call(timeout, "cannot use", |mut c| async move {
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
            .call(timeout, "cannot read", |mut c| async move {
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
            .script(timeout, "cannot release in", |s| &s.clear, name, args)
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
