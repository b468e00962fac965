//! Push wake-ups for etcd: a `Watch` on the lease key, for deletions only
//! (a waiting contender), or for every write of it (`watch`: an
//! acquisition puts the key; renewals only keep its etcd lease alive and
//! write nothing, so they stay off the wire either way).
//!
//! etcd deletes the key on every way a lease ends — release (a delete),
//! `leaderrun release` (a delete), revocation and TTL expiry (the etcd
//! leader deletes the keys of an expired lease) — so one watch covers all of
//! them, expiry included, by the etcd leader's clock.
//!
//! The JSON gateway serves the watch as one streaming POST to `/v3/watch`: a
//! chunked HTTP/1.1 reply that never ends, one JSON message after another
//! (the first says the watch was created). A task of its own reads it into a
//! channel, so the elector's `select!` can drop a waiting future at any time
//! without leaving half a message read; the task ends (and the channel
//! closes, which the elector sees as a broken subscription) when the stream
//! does, and is aborted when the subscription is dropped.
//!
//! The watch is created *before* the acquisition attempt, from the
//! revision current at its creation, so a deletion after the attempt is
//! always reported. It stays open across attempts; a deletion reported
//! before an attempt only causes one extra attempt.

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::api::{reply, WatchMessage};
use super::http::{Conn, MAX_BODY};
use super::members::{EtcdError, Members};
use super::{b64, lease_key, StoreError};
use crate::store::wake::{Heard, Wakeups};

enum Msg {
    Created,
    Deleted,
    /// The key was written: an acquisition (or a `--min-hold` keep, which
    /// moves the key to an etcd lease of its own). Only asked for with
    /// [`Heard::Changes`].
    Put,
}

pub struct EtcdWakeups {
    /// The cluster again: its own connection and its own auth token.
    client: Members,
    /// The lease whose key is watched.
    name: String,
    heard: Heard,
    rx: Option<mpsc::UnboundedReceiver<Msg>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl EtcdWakeups {
    pub(super) fn new(client: Members, name: &str, heard: Heard) -> EtcdWakeups {
        EtcdWakeups {
            client,
            name: name.to_string(),
            heard,
            rx: None,
            task: None,
        }
    }

    fn stop(&mut self) {
        self.rx = None;
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    async fn start(&mut self, name: &str) -> Result<(), EtcdError> {
        // A start abandoned by the elector's timer may have left its task
        // behind, waiting on a watch nobody reads.
        self.stop();
        // NOPUT: a waiting contender wants deletions only; acquisitions
        // stay off its wire. `watch` wants both.
        let key = b64(&lease_key(name));
        let body = match self.heard {
            Heard::Releases => json!({"create_request": {"key": key, "filters": ["NOPUT"]}}),
            Heard::Changes => json!({"create_request": {"key": key}}),
        };
        let conn = self.client.stream("/v3/watch", &body).await?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.task = Some(tokio::spawn(async move {
            let _ = pump(conn, tx).await;
        }));
        match rx.recv().await {
            Some(Msg::Created) => {
                // Only now is the start no longer out: one that hangs on a
                // frozen member until the elector drops it moves the next
                // start to the next member.
                self.client.settled();
                self.rx = Some(rx);
                Ok(())
            }
            _ => {
                self.stop();
                Err(EtcdError::Transport("the watch was not created".into()))
            }
        }
    }
}

impl Drop for EtcdWakeups {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Wakeups for EtcdWakeups {
    async fn arm(&mut self) -> Result<(), StoreError> {
        let name = self.name.clone();
        let name = name.as_str();
        if self.rx.is_none() {
            if let Err(e) = self.start(name).await {
                self.stop();
                return Err(StoreError::unavailable(format!("cannot watch: {e}")).with_source(e));
            }
        }
        let Some(rx) = self.rx.as_mut() else {
            return Err(StoreError::unavailable("not watching"));
        };
        loop {
            match rx.try_recv() {
                Ok(_) => {}
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.stop();
                    return Err(StoreError::unavailable("the watch ended"));
                }
            }
        }
    }

    async fn wake(&mut self) -> Result<(), StoreError> {
        loop {
            let Some(rx) = self.rx.as_mut() else {
                return Err(StoreError::unavailable("not watching"));
            };
            match rx.recv().await {
                Some(Msg::Deleted) => return Ok(()),
                Some(Msg::Put) if self.heard == Heard::Changes => return Ok(()),
                Some(Msg::Created | Msg::Put) => {}
                None => {
                    self.stop();
                    return Err(StoreError::unavailable("the watch ended"));
                }
            }
        }
    }
}

/// Read chunks, split them into JSON messages, pass on what matters. Returns
/// when the stream ends, breaks, or nobody listens any more. Messages are
/// held at most [`MAX_BODY`] bytes at a time (http.rs bounds the rest).
async fn pump(mut conn: Conn, tx: mpsc::UnboundedSender<Msg>) -> std::io::Result<()> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = conn.next_chunk(MAX_BODY - buf.len()).await? {
        buf.extend_from_slice(&chunk);
        let mut msgs = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
        let mut used = 0;
        while let Some(m) = msgs.next() {
            match m {
                Ok(v) => {
                    used = msgs.byte_offset();
                    for msg in meaning(v)? {
                        if tx.send(msg).is_err() {
                            return Ok(());
                        }
                    }
                }
                Err(e) if e.is_eof() => break,
                Err(e) => return Err(bad(&e.to_string())),
            }
        }
        buf.drain(..used);
    }
    Ok(())
}

/// What one watch message says: created, deletions, writes, or (an error, a
/// cancelled watch, a message that is not one) the end of the stream.
fn meaning(mut v: Value) -> std::io::Result<Vec<Msg>> {
    let end = |m: &str| std::io::Error::other(m.to_string());
    if v.get("error").is_some() {
        return Err(end("the watch failed"));
    }
    let Some(r) = v.get_mut("result").map(Value::take) else {
        return Ok(Vec::new());
    };
    let r: WatchMessage = reply(r).map_err(|e| end(&e.to_string()))?;
    if r.canceled {
        return Err(end("the watch was cancelled"));
    }
    let mut out = Vec::new();
    if r.created {
        out.push(Msg::Created);
    }
    if r.events.iter().any(|e| e.kind == "DELETE") {
        out.push(Msg::Deleted);
    }
    // A put is the type left out (the enum's zero); the gateway may also
    // spell it.
    if r.events
        .iter()
        .any(|e| e.kind.is_empty() || e.kind == "PUT")
    {
        out.push(Msg::Put);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_read_for_creation_deletions_and_writes() {
        let created = json!({"result": {"header": {"revision": "5"}, "created": true}});
        assert!(matches!(meaning(created).unwrap()[..], [Msg::Created]));
        let deleted = json!({"result": {"events": [{"type": "DELETE", "kv": {"key": "eA=="}}]}});
        assert!(matches!(meaning(deleted).unwrap()[..], [Msg::Deleted]));
        let put = json!({"result": {"events": [{"kv": {"key": "eA=="}}]}});
        assert!(matches!(meaning(put).unwrap()[..], [Msg::Put]));
        assert!(meaning(json!({"result": {"events": []}}))
            .unwrap()
            .is_empty());
        assert!(meaning(json!({"result": {"canceled": true}})).is_err());
        assert!(meaning(json!({"error": {"code": 14}})).is_err());
        assert!(meaning(json!({"result": {"created": "yes"}})).is_err());
    }
}
