//! etcd's v3 JSON API as this store uses it: keys, values and replies.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

use super::http::{int, EtcdError, Res};

pub(super) const LEASE_PREFIX: &str = "leaderrun/lease/";
pub(super) const EPOCH_PREFIX: &str = "leaderrun/epoch/";

pub(super) fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

pub(super) fn lease_key(name: &str) -> String {
    format!("{LEASE_PREFIX}{name}")
}

pub(super) fn epoch_key(name: &str) -> String {
    format!("{EPOCH_PREFIX}{name}")
}

/// The end of a prefix range: the prefix with its last byte + 1 (the
/// prefixes here end in `/`, so this never overflows).
pub(super) fn prefix_end(prefix: &str) -> String {
    let mut b = prefix.as_bytes().to_vec();
    if let Some(last) = b.last_mut() {
        *last += 1;
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// A key-value from a range reply.
pub(super) struct Kv {
    pub(super) key: String,
    pub(super) value: String,
    pub(super) mod_revision: i64,
    pub(super) lease: i64,
}

pub(super) fn kvs(range: &Value) -> Res<Vec<Kv>> {
    let Some(list) = range.get("kvs").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    let text = |kv: &Value, f: &str| -> Res<String> {
        let raw = kv.get(f).and_then(Value::as_str).unwrap_or("");
        let bytes = B64
            .decode(raw)
            .map_err(|_| EtcdError::Refused(format!("etcd sent a {f} that is not base64")))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    list.iter()
        .map(|kv| {
            Ok(Kv {
                key: text(kv, "key")?,
                value: text(kv, "value")?,
                mod_revision: int(kv, "mod_revision"),
                lease: int(kv, "lease"),
            })
        })
        .collect()
}

/// The `i`-th response of a transaction, of the given kind.
pub(super) fn txn_part<'a>(txn: &'a Value, i: usize, kind: &str) -> Res<&'a Value> {
    txn.get("responses")
        .and_then(|r| r.get(i))
        .and_then(|r| r.get(kind))
        .ok_or_else(|| EtcdError::Refused(format!("etcd's transaction reply lacks {kind} #{i}")))
}

pub(super) fn range_op(key: &str) -> Value {
    json!({"request_range": {"key": b64(key)}})
}

pub(super) fn prefix_op(prefix: &str) -> Value {
    json!({"request_range": {"key": b64(prefix), "range_end": b64(&prefix_end(prefix))}})
}

pub(super) fn lease_value(epoch: i64, holder: &str) -> String {
    format!("{epoch}:{holder}")
}

/// `EPOCH:HOLDER` back into its parts.
pub(super) fn split_value(v: &str) -> Option<(i64, &str)> {
    let (e, h) = v.split_once(':')?;
    Some((e.parse().ok()?, h))
}
