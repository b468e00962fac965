//! etcd's v3 JSON API as this store uses it: its keys, the requests, and
//! the replies, read into typed structs.
//!
//! The gateway speaks proto3's JSON mapping: int64 fields are strings,
//! bytes are base64, and a field holding its zero value (0, false, an empty
//! list or string) is left out. So a field that may be zero reads as zero
//! when absent (`#[serde(default)]`, each said so below); every other
//! field is required, and a field that is there must be what it says it is:
//! a malformed reply is an error of its own, never a zero.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::Deserialize;
use serde_json::{json, Value};

use super::members::{EtcdError, Res};

pub(super) const LEASE_PREFIX: &str = "leaderrun/lease/";
pub(super) const EPOCH_PREFIX: &str = "leaderrun/epoch/";
/// `--once-per`: the period key (on an etcd lease of half the period) and
/// the run record (on none).
pub(super) const PERIOD_PREFIX: &str = "leaderrun/period/";
pub(super) const RUN_PREFIX: &str = "leaderrun/run/";
/// The lease's values (`--advertise`, the mark of a `--min-hold` keep:
/// `store::lease::values_text`), on the same etcd lease as the lease key,
/// so they live and end exactly as it does.
pub(super) const VALUE_PREFIX: &str = "leaderrun/value/";

pub(super) fn value_key(name: &str) -> String {
    format!("{VALUE_PREFIX}{name}")
}

pub(super) fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

pub(super) fn lease_key(name: &str) -> String {
    format!("{LEASE_PREFIX}{name}")
}

pub(super) fn epoch_key(name: &str) -> String {
    format!("{EPOCH_PREFIX}{name}")
}

pub(super) fn period_key(name: &str) -> String {
    format!("{PERIOD_PREFIX}{name}")
}

pub(super) fn run_key(name: &str) -> String {
    format!("{RUN_PREFIX}{name}")
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

/// A reply read as `T`; one that does not fit is not an etcd reply this
/// store understands, and will not become one by asking again.
pub(super) fn reply<T: DeserializeOwned>(v: Value) -> Res<T> {
    serde_json::from_value(v).map_err(|e| {
        EtcdError::Refused(format!(
            "etcd sent a reply leaderrun does not understand: {e}"
        ))
    })
}

/// An int64: a string of digits (or, in an error reply, a JSON number).
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(d)? {
        Int::Number(n) => Ok(n),
        Int::Text(s) => s
            .parse()
            .map_err(|_| D::Error::custom(format!("{s:?} is not an int64"))),
    }
}

/// Bytes, base64 in JSON, read as text (keys and values are UTF-8 here).
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let raw = String::deserialize(d)?;
    let bytes = B64
        .decode(&raw)
        .map_err(|_| D::Error::custom("bytes that are not base64"))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// What every reply of etcd's carries.
#[derive(Debug, Deserialize)]
pub(super) struct Headed {
    pub header: Header,
}

#[derive(Debug, Deserialize)]
pub(super) struct Header {
    /// Never 0 in a reply: a member answers only in a term it knows.
    #[serde(deserialize_with = "int64")]
    pub raft_term: i64,
}

/// An error reply: `{"error", "code", "message"}`, or in a stream
/// `{"grpc_code", "message"}`. Read leniently: any error is an error.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ErrorReply {
    #[serde(default, deserialize_with = "int64")]
    pub code: i64,
    #[serde(default, deserialize_with = "int64")]
    pub grpc_code: i64,
    #[serde(default)]
    pub message: String,
}

/// A key-value of a range.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Kv {
    #[serde(deserialize_with = "text")]
    pub key: String,
    /// Empty values are left out.
    #[serde(default, deserialize_with = "text")]
    pub value: String,
    /// Never 0 for a key that exists.
    #[serde(deserialize_with = "int64")]
    pub mod_revision: i64,
    /// The etcd lease the key is on; 0 (left out) for none.
    #[serde(default, deserialize_with = "int64")]
    pub lease: i64,
}

/// A range's keys; none are left out as an empty list.
#[derive(Debug, Deserialize)]
pub(super) struct Range {
    #[serde(default)]
    pub kvs: Vec<Kv>,
}

/// A transaction's outcome and, in order, its operations' replies.
#[derive(Debug, Deserialize)]
pub(super) struct Txn {
    /// Left out when false (the compare failed).
    #[serde(default)]
    pub succeeded: bool,
    /// Left out when the branch taken had no operations.
    #[serde(default)]
    pub responses: Vec<Op>,
}

/// One operation's reply; only ranges are read.
#[derive(Debug, Deserialize)]
pub(super) struct Op {
    pub response_range: Option<Range>,
}

impl Txn {
    /// The `i`-th reply, which the request made a range.
    pub fn range(&self, i: usize) -> Res<&Range> {
        self.responses
            .get(i)
            .and_then(|op| op.response_range.as_ref())
            .ok_or_else(|| {
                EtcdError::Refused(format!(
                    "etcd's transaction reply lacks response_range #{i}"
                ))
            })
    }
}

/// A lease granted.
#[derive(Debug, Deserialize)]
pub(super) struct Grant {
    #[serde(rename = "ID", deserialize_with = "int64")]
    pub id: i64,
    #[serde(rename = "TTL", deserialize_with = "int64")]
    pub ttl: i64,
    /// Why not, when etcd says so here rather than as an error.
    #[serde(default)]
    pub error: String,
}

/// A keepalive's answer.
#[derive(Debug, Deserialize)]
pub(super) struct KeepAlive {
    /// 0 (left out) when etcd no longer has the lease.
    #[serde(rename = "TTL", default, deserialize_with = "int64")]
    pub ttl: i64,
}

/// What is left of a lease.
#[derive(Debug, Deserialize)]
pub(super) struct TimeToLive {
    /// Whole seconds left: -1 when the lease is gone, 0 (left out) for
    /// under a second.
    #[serde(rename = "TTL", default, deserialize_with = "int64")]
    pub ttl: i64,
    /// As granted; 0 (left out) when the lease is gone.
    #[serde(rename = "grantedTTL", default, deserialize_with = "int64")]
    pub granted_ttl: i64,
}

/// The cluster's members, for `status`.
#[derive(Debug, Deserialize)]
pub(super) struct MemberList {
    #[serde(default)]
    pub members: Vec<MemberInfo>,
}

#[derive(Debug, Deserialize)]
pub(super) struct MemberInfo {
    /// Left out when false.
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

/// An authentication's token.
#[derive(Debug, Deserialize)]
pub(super) struct Token {
    pub token: String,
}

/// One message of a watch's stream (inside its `result`).
#[derive(Debug, Deserialize)]
pub(super) struct WatchMessage {
    #[serde(default)]
    pub created: bool,
    #[serde(default)]
    pub canceled: bool,
    #[serde(default)]
    pub events: Vec<Event>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Event {
    /// `DELETE`; left out for a put (the enum's zero).
    #[serde(rename = "type", default)]
    pub kind: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_as_the_gateway_writes_them() {
        let txn: Txn = reply(json!({
            "header": {"revision": "2", "raft_term": "2"},
            "responses": [{"response_range": {"header": {"revision": "2"}, "kvs": [
                {"key": "aw==", "create_revision": "2", "mod_revision": "2", "version": "1",
                 "value": "dg==", "lease": "12345"}], "count": "1"}},
                {"response_range": {"header": {"revision": "2"}}}]
        }))
        .expect("txn");
        assert!(!txn.succeeded, "left out: false");
        let kv = &txn.range(0).expect("range").kvs[0];
        assert_eq!((kv.key.as_str(), kv.value.as_str()), ("k", "v"));
        assert_eq!((kv.mod_revision, kv.lease), (2, 12345));
        assert!(txn.range(1).expect("range").kvs.is_empty());
        assert!(txn.range(2).is_err());
        let gone: KeepAlive = reply(json!({"header": {"raft_term": "2"}, "ID": "9"})).expect("ka");
        assert_eq!(gone.ttl, 0);
        let h: Headed = reply(json!({"header": {"raft_term": "7"}})).expect("header");
        assert_eq!(h.header.raft_term, 7);
    }

    /// A field that is there but is not what it says is an error, never 0;
    /// a field that cannot be zero is required.
    #[test]
    fn a_bad_or_missing_field_is_an_error_not_zero() {
        for bad in [
            json!({"ID": "12x", "TTL": "5"}),
            json!({"ID": "12", "TTL": true}),
            json!({"ID": "12"}),
            json!({"TTL": "5"}),
        ] {
            assert!(reply::<Grant>(bad.clone()).is_err(), "{bad}");
        }
        assert!(reply::<Headed>(json!({"ID": "1"})).is_err(), "no header");
        assert!(reply::<Headed>(json!({"header": {"raft_term": "x"}})).is_err());
        assert!(
            reply::<Range>(json!({"kvs": [{"key": "not base64!", "mod_revision": "1"}]})).is_err()
        );
        assert!(
            reply::<Range>(json!({"kvs": [{"key": "aw=="}]})).is_err(),
            "no revision"
        );
        assert!(reply::<TimeToLive>(json!({"TTL": "-1x"})).is_err());
    }

    #[test]
    fn prefix_ranges() {
        assert_eq!(prefix_end("leaderrun/epoch/"), "leaderrun/epoch0");
        assert_eq!(split_value("12:host:1:x"), Some((12, "host:1:x")));
        assert_eq!(split_value("x:host"), None);
    }
}
