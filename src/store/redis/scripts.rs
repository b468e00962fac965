//! The Lua scripts, the keys they work on, and what their replies mean.

use std::sync::LazyLock;

use ::redis::aio::MultiplexedConnection;
use ::redis::{ErrorKind, RedisError, Value};

use super::server::Server;
use crate::store::{LeaseInfo, StoreError};

/// The lease's values (`--advertise`, `--slots`' N, and the mark of a
/// `--min-hold` keep) live in a key of their own beside the lease,
/// `VALUE_SUFFIX`, always the *last* key a script is given, as
/// `EPOCH:rN:TEXT` while the tenure runs and `EPOCH:kN:TEXT` once its run
/// has ended and only a keep holds it (`store::lease::values_text`: `N`
/// empty for a plain run, `TEXT` empty when nothing is advertised). It
/// lives exactly as the lease does: written with the lease's `PX` by the
/// taking script (deleted there when there is nothing to keep, so no
/// earlier tenure's values linger), extended
/// by every renewal, given the keep's `PX` or deleted by the release. Its
/// commands (`SET`, `PEXPIRE`, `DEL`) and key pattern are the ones the ACL
/// of docs/stores.md already grants.
///
/// After a take (`e` the new epoch, `ARGV[2]` the lease ms): the values,
/// `ARGV[#ARGV]` (`N:TEXT`, `store::lease::values_suffix`; '' for none).
macro_rules! taken_values {
    () => {
        r"
if ARGV[#ARGV] ~= '' then
  redis.call('SET', KEYS[#KEYS], e .. ':r' .. ARGV[#ARGV], 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[#KEYS])
end
"
    };
}

/// After a take, last (`e` the new epoch): `watch` is told on the lease's
/// acquired channel, `ARGV[#ARGV - 1]` (just before the values; '' to tell
/// nobody), in the same script as the `SET`, so no subscriber hears of it
/// before the lease is taken. Waiting contenders do not subscribe to it.
macro_rules! taken_publish {
    () => {
        r"
if ARGV[#ARGV - 1] ~= '' then redis.call('PUBLISH', ARGV[#ARGV - 1], '') end
"
    };
}

/// After a release that matched (`ARGV[1]` `EPOCH:HOLDER`, `ARGV[2]` keep
/// ms): kept, the tenure is marked ended with its values; freed, they go.
macro_rules! released_values {
    () => {
        r"
if tonumber(ARGV[2]) > 0 then
  local e = string.match(ARGV[1], '^(-?%d+):') or ''
  local v = redis.call('GET', KEYS[#KEYS])
  local rest = ':'
  if v and string.sub(v, 1, string.len(e) + 2) == e .. ':r' then
    rest = string.match(string.sub(v, string.len(e) + 3), '^%d*:.*$') or ':'
  end
  redis.call('SET', KEYS[#KEYS], e .. ':k' .. rest, 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[#KEYS])
end
"
    };
}

/// `KEYS[1]` lease, `KEYS[2]` epoch, `KEYS[3]` values; `ARGV[1]` holder,
/// `ARGV[2]` lease ms, `ARGV[3]` the acquired channel, `ARGV[4]` the
/// values ('' for none).
/// Returns nil when the lease is held; otherwise the new epoch and what the
/// server that took it says about itself (`INFO server`, `replication`,
/// `persistence`), read in the same atomic step: the identity recorded is
/// that of the server that made the write.
pub(super) const ACQUIRE_LUA: &str = concat!(
    r"
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], e .. ':' .. ARGV[1], 'PX', ARGV[2])
",
    taken_values!(),
    taken_publish!(),
    r"
return {e, redis.call('INFO', 'server'), redis.call('INFO', 'replication'),
  redis.call('INFO', 'persistence')}
"
);

/// The server's clock in milliseconds (`TIME`), as a Lua integer. A
/// script that reads `TIME` and then writes is replicated by its effects
/// (the only way from Redis 7, the default from 5), so replicas get the
/// values written, not the call.
macro_rules! now_ms {
    () => {
        "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"
    };
}

/// `--once-per` (docs/stores.md, "Once per period"). `KEYS[1]` lease,
/// `KEYS[2]` epoch, `KEYS[3]` period, `KEYS[4]` run record, the values
/// last; `ARGV[1]`
/// holder, `ARGV[2]` lease ms, `ARGV[3]` half period ms, `ARGV[4]` `1`
/// for `--retry-failed`, `ARGV[5]` how far ahead of `TIME` a start may be
/// (ms), `ARGV[6]` the acquired channel, the values last. There is no clock to compare a stored start with but Redis's own
/// expiry, so "a run started less than half a period ago" *is* the period
/// key, which the taking script writes `PX half` beside the lease
/// (`START_MS:EPOCH`). Returns `{'done', ms since that start}` while it
/// lives (whether or not the lease is held: the period's run has
/// started), unless `--retry-failed` and the record of that run (same
/// epoch) did not end `exit 0`: a failed outcome, or none, which with the
/// lease key gone (expired or released) is a run that never ended; such a
/// period is taken again, and its key written afresh. Nil when the lease
/// is held; otherwise as ACQUIRE, having also written the run record
/// afresh (start by `TIME`, holder, epoch; no end, no outcome) in a hash
/// without expiry. A record or period key this release cannot read (not a
/// hash, a field that is not a number, an outcome it does not write, a
/// start more than `ARGV[5]` ahead) is `{'unreadable', why}`, and nothing
/// is written: the run refuses rather than guess. (`redis.pcall`, not
/// `TYPE`: the ACL of docs/stores.md has no `+type`.)
pub(super) const ACQUIRE_ONCE_LUA: &str = concat!(
    now_ms!(),
    r#"
local function number(v) return v and string.match(v, '^%d+$') ~= nil end
local function known(o)
  if o == 'lost' or o == 'killed' or o == 'not started' then return true end
  local n = string.match(o, '^exit (%d+)$') or string.match(o, '^signal (%d+)$')
  return n ~= nil and string.len(n) <= 10
end
local rec = redis.pcall('HMGET', KEYS[4], 'started', 'ended', 'holder', 'epoch', 'outcome')
if rec.err then
  if string.sub(rec.err, 1, 9) == 'WRONGTYPE' then return {'unreadable', 'is not a hash'} end
  return redis.error_reply(rec.err)
end
if rec[1] or rec[2] or rec[3] or rec[4] or rec[5] then
  if not number(rec[1]) then return {'unreadable', 'has a start that is not a time'} end
  if tonumber(rec[1]) > now + tonumber(ARGV[5]) then
    return {'unreadable', 'has a start too far ahead of the server clock'}
  end
  if rec[2] and not number(rec[2]) then return {'unreadable', 'has an end that is not a time'} end
  if not number(rec[4]) then return {'unreadable', 'has an epoch that is not a number'} end
  if rec[5] and not known(rec[5]) then return {'unreadable', 'says its run ended "' .. rec[5] .. '"'} end
end
local started = redis.call('GET', KEYS[3])
if started then
  local s, pe = string.match(started, '^(%d+):(%d+)$')
  if not s then return {'unreadable', 'has a period key that is not START:EPOCH'} end
  local failed = ARGV[4] == '1' and rec[4] == pe and rec[5] ~= 'exit 0'
  if not failed then return {'done', math.max(0, now - tonumber(s))} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], e .. ':' .. ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[3], string.format('%d:%d', now, e), 'PX', ARGV[3])
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[4], 'started', string.format('%d', now), 'holder', ARGV[1], 'epoch', e)
"#,
    taken_values!(),
    taken_publish!(),
    r"
return {e, redis.call('INFO', 'server'), redis.call('INFO', 'replication'),
  redis.call('INFO', 'persistence')}
"
);

/// `KEYS[1]` lease, `KEYS[2]` values; `ARGV[1]` `EPOCH:HOLDER`, `ARGV[2]` lease ms, `ARGV[3]`
/// and `ARGV[4]` the run_id and master_replid of the primary that granted
/// the lease ('' when not known: nothing to compare). Returns 1 when
/// renewed, 0 when the lease is not ours, and `{run_id, master_replid}`
/// when the server is not the one that granted it (then nothing is
/// written). An expired key reads as nil, so an expired lease cannot be
/// renewed.
pub(super) const RENEW_LUA: &str = r"
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
if KEYS[2] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return 1
";

/// `KEYS[1]` lease, the values last; `ARGV[1]` `EPOCH:HOLDER`, `ARGV[2]`
/// keep ms, `ARGV[3]` the lease's wake-up channel ('' to wake nobody). With
/// keep > 0 the holder stays recorded until then (`--min-hold`); otherwise
/// the lease is freed and waiters are told in the same script, so no
/// subscriber hears of it before it is free.
pub(super) const RELEASE_LUA: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
",
    released_values!(),
    r"
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
  if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], '') end
end
return 1
"
);

/// RELEASE with the run's end (`--once-per`). `KEYS[1]` lease, `KEYS[2]`
/// period, `KEYS[3]` run record, the values last; `ARGV[1]`..`ARGV[3]` as RELEASE, `ARGV[4]`
/// the outcome, `ARGV[5]` holder, `ARGV[6]` epoch. The end (by `TIME`) and
/// outcome are written where the record is this holder's at this epoch,
/// whether or not the lease key still lives: a record that still names
/// them was written by no one since (a takeover writes its own), so a lost
/// lease is recorded `lost` when its holder gets to say so. A run that
/// never started (`not started`) also deletes the period key, if it is its
/// own: nothing ran, and the period's next firing runs.
pub(super) const RELEASE_ENDING_LUA: &str = concat!(
    r"
local r = redis.call('HMGET', KEYS[3], 'holder', 'epoch')
if r[1] == ARGV[5] and r[2] == ARGV[6] then
",
    now_ms!(),
    r"
  redis.call('HSET', KEYS[3], 'ended', string.format('%d', now), 'outcome', ARGV[4])
  if ARGV[4] == 'not started' then
    local p = redis.call('GET', KEYS[2])
    if p and string.match(p, ':(%d+)$') == ARGV[6] then redis.call('DEL', KEYS[2]) end
  end
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
",
    released_values!(),
    r"
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
  if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], '') end
end
return 1
"
);

/// `KEYS[1]` run record. `{now ms, started, ended, holder, epoch,
/// outcome}` by the server's clock, or nil when there is no record, or
/// none `status` can show (a key of another type: a listing never fails
/// for one record).
pub(super) const RECORD_LUA: &str = concat!(
    r"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
",
    now_ms!(),
    r"
local r = redis.pcall('HMGET', KEYS[1], 'started', 'ended', 'holder', 'epoch', 'outcome')
if r.err then
  if string.sub(r.err, 1, 9) == 'WRONGTYPE' then return false end
  return redis.error_reply(r.err)
end
return {string.format('%d', now), r[1], r[2], r[3], r[4], r[5]}
"
);

/// `KEYS[1]` lease, `KEYS[2]` epoch, `KEYS[3]` values. `{counter, value,
/// pttl, values}`, read in one step so they agree.
pub(super) const INSPECT_LUA: &str = r"
return {redis.call('GET', KEYS[2]), redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[3])}
";

/// `KEYS[1]` lease, `KEYS[2]` epoch, `KEYS[3]` values; `ARGV[1]` the epoch to clear, or ''
/// for any, `ARGV[2]` the wake-up channel. Returns what was cleared as
/// INSPECT does, or nil.
pub(super) const CLEAR_LUA: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return false end
if ARGV[1] ~= '' and string.sub(v, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. ':' then
  return false
end
local info = {redis.call('GET', KEYS[2]), v, redis.call('PTTL', KEYS[1])}
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[3])
redis.call('PUBLISH', ARGV[2], '')
return info
";

pub(super) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_LUA));
pub(super) static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new(RENEW_LUA));
pub(super) static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LUA));
pub(super) static INSPECT: LazyLock<Lua> = LazyLock::new(|| Lua::new(INSPECT_LUA));
pub(super) static CLEAR: LazyLock<Lua> = LazyLock::new(|| Lua::new(CLEAR_LUA));
pub(super) static ACQUIRE_ONCE: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_ONCE_LUA));
pub(super) static RELEASE_ENDING: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_ENDING_LUA));
pub(super) static RECORD: LazyLock<Lua> = LazyLock::new(|| Lua::new(RECORD_LUA));

pub(super) const PREFIX: &str = "{leaderrun:";
pub(super) const LEASE_SUFFIX: &str = "}:lease";
pub(super) const EPOCH_SUFFIX: &str = "}:epoch";
/// `--once-per`: the period key (lives half a period) and the run record.
pub(super) const PERIOD_SUFFIX: &str = "}:period";
pub(super) const RUN_SUFFIX: &str = "}:run";
/// The lease's values (see `taken_values!`).
pub(super) const VALUE_SUFFIX: &str = "}:value";

pub(super) fn value_key(name: &str) -> String {
    format!("{PREFIX}{name}{VALUE_SUFFIX}")
}

pub(super) fn lease_key(name: &str) -> String {
    format!("{PREFIX}{name}{LEASE_SUFFIX}")
}

pub(super) fn epoch_key(name: &str) -> String {
    format!("{PREFIX}{name}{EPOCH_SUFFIX}")
}

pub(super) fn period_key(name: &str) -> String {
    format!("{PREFIX}{name}{PERIOD_SUFFIX}")
}

pub(super) fn run_key(name: &str) -> String {
    format!("{PREFIX}{name}{RUN_SUFFIX}")
}

/// The lease key's value: the epoch first, since it has no `:` in it, so the
/// holder (which may) is everything after the first `:`.
pub(super) fn lease_value(epoch: i64, holder: &str) -> String {
    format!("{epoch}:{holder}")
}

pub(super) struct Lua {
    pub(super) src: &'static str,
    pub(super) sha: String,
}

impl Lua {
    pub(super) fn new(src: &'static str) -> Lua {
        Lua {
            src,
            sha: ::redis::Script::new(src).get_hash().to_string(),
        }
    }
}

/// `EVALSHA`, and `EVAL` of the same source when the server does not know
/// the script (a restart, `SCRIPT FLUSH`, a failover to a fresh replica).
pub(super) async fn eval(
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

pub(super) fn bad_reply(what: &str, v: &Value) -> RedisError {
    RedisError::from((
        ErrorKind::TypeError,
        "unexpected reply",
        format!("{what}: {v:?}"),
    ))
}

pub(super) fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(super) fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// What an acquire script answered.
pub(super) enum Reply {
    Held,
    /// `--once-per`: this period's run started this long ago (ms).
    Done(i64),
    /// `--once-per`: the record cannot be read (why).
    Unreadable(String),
    Taken(i64, Server),
}

/// The acquire scripts' reply.
pub(super) fn parse_acquired(v: &Value) -> Result<Reply, RedisError> {
    match v {
        Value::Nil => Ok(Reply::Held),
        Value::Array(p) if p.len() == 2 && as_text(&p[0]).as_deref() == Some("done") => Ok(
            Reply::Done(as_int(&p[1]).ok_or_else(|| bad_reply("acquire", v))?),
        ),
        Value::Array(p) if p.len() == 2 && as_text(&p[0]).as_deref() == Some("unreadable") => Ok(
            Reply::Unreadable(as_text(&p[1]).ok_or_else(|| bad_reply("acquire", v))?),
        ),
        Value::Array(p) if p.len() == 4 => {
            let epoch = as_int(&p[0]).ok_or_else(|| bad_reply("acquire", v))?;
            let texts: Vec<String> = p[1..].iter().filter_map(as_text).collect();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            Ok(Reply::Taken(epoch, Server::parse(&texts)))
        }
        _ => Err(bad_reply("acquire", v)),
    }
}

/// A lease from `{counter, value, pttl}` (INSPECT and CLEAR); `None` when
/// the lease has neither a counter nor a holder (never acquired).
pub(super) fn parse_info(name: &str, v: &Value) -> Result<Option<LeaseInfo>, StoreError> {
    let bad = || StoreError::fatal(format!("unexpected reply from Redis for {name}: {v:?}"));
    let parts = match v {
        Value::Nil => return Ok(None),
        Value::Array(p) if p.len() == 3 || p.len() == 4 => p,
        _ => return Err(bad()),
    };
    let counter = as_int(&parts[0]);
    let held = as_text(&parts[1]);
    let pttl = as_int(&parts[2]).ok_or_else(bad)?;
    Ok(match (held, counter) {
        (Some(value), counter) => {
            let (epoch, holder) = value.split_once(':').ok_or_else(bad)?;
            let epoch = epoch.parse::<i64>().ok().or(counter).ok_or_else(bad)?;
            let values = parts
                .get(3)
                .and_then(as_text)
                .map(|v| crate::store::lease::parse_values(&v, epoch))
                .unwrap_or_default();
            Some(LeaseInfo {
                name: name.to_string(),
                holder: Some(holder.to_string()),
                epoch,
                // -1: a key without expiry, which only a hand-made key has.
                expires_in_ms: Some(if pttl >= 0 { pttl } else { i64::MAX }),
                advertised: values.advertised,
                kept: values.kept,
                slots: values.slots,
            })
        }
        // Free (released or expired): the counter still says which epoch
        // was last handed out.
        (None, Some(epoch)) => Some(LeaseInfo {
            name: name.to_string(),
            holder: None,
            epoch,
            expires_in_ms: None,
            ..LeaseInfo::default()
        }),
        (None, None) => None,
    })
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
            assert_eq!(tag(&l), tag(&period_key(name)), "{name}");
            assert_eq!(tag(&l), tag(&run_key(name)), "{name}");
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
