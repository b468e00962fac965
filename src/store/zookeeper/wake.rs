//! Push wake-ups on ZooKeeper: a watch on the lease node, on a session of
//! its own.
//!
//! `exists(lease, watch)` leaves a one-time watch that fires when the node
//! is deleted (a release, a clear, the holder's session expiring), when its
//! data is written (every renewal rewrites it) or, when it did not exist,
//! created. A deletion wakes; so does a creation for `watch` (an
//! acquisition); anything else only sets the watch again, since the one
//! that fired is used up: left unset after a renewal, a waiter slept
//! through every later release until its next attempt. The
//! session is separate from the lease loop's (a reopened session closes
//! its other connections), and is kept alive with pings while `wake` is
//! awaited; when it lapses in between (while this process led), the next
//! `arm` makes a new one.
use std::time::Duration;

use tokio::time::Instant;

use super::conn::{Conn, Res, ZkError};
use super::ensemble::Ensemble;
use super::proto::{NODE_CREATED, NODE_DELETED};
use crate::store::session::Connect;
use crate::store::wake::{Heard, Wakeups};
use crate::store::StoreError;

/// How long `arm` may take to connect.
const CONNECT: Duration = Duration::from_secs(2);

pub struct ZkWakeups {
    ensemble: Ensemble,
    path: String,
    heard: Heard,
    conn: Option<Conn>,
    /// A request was under way when its future was dropped: the
    /// connection may hold half a frame, so it is not used again.
    busy: bool,
}

impl ZkWakeups {
    pub(super) fn new(ensemble: Ensemble, path: String, heard: Heard) -> ZkWakeups {
        ZkWakeups {
            ensemble,
            path,
            heard,
            conn: None,
            busy: false,
        }
    }

    /// Watch the lease node on the current connection; whether it exists.
    async fn watch(&mut self) -> Res<bool> {
        let Some(c) = self.conn.as_mut() else {
            return Err(ZkError::Expired);
        };
        self.busy = true;
        let there = c.exists(&self.path, true).await?;
        self.busy = false;
        Ok(there)
    }

    fn lost(&mut self, e: impl std::fmt::Display) -> StoreError {
        self.conn = None;
        StoreError::unavailable(format!(
            "the watch on {} of {} was lost: {e}",
            self.path, self.ensemble.shown
        ))
    }
}

impl Wakeups for ZkWakeups {
    async fn arm(&mut self) -> Result<(), StoreError> {
        if self.busy {
            self.conn = None;
            self.busy = false;
        }
        if let Some(c) = self.conn.as_mut() {
            // What arrived before this attempt, the attempt itself sees.
            c.events.clear();
            if self.watch().await.is_ok() {
                return Ok(());
            }
            self.conn = None;
        }
        let deadline = Instant::now() + CONNECT;
        let c = tokio::time::timeout_at(deadline, self.ensemble.connect(deadline))
            .await
            .map_err(|_| StoreError::unavailable("the watch connection timed out"))??;
        self.conn = Some(c);
        self.watch().await.map(|_| ()).map_err(|e| self.lost(e))
    }

    async fn wake(&mut self) -> Result<(), StoreError> {
        loop {
            let Some(c) = self.conn.as_mut() else {
                return Err(StoreError::unavailable("not watching"));
            };
            if let Some(at) = c.events.iter().position(|e| e.path == self.path) {
                let kind = c.events.remove(at).kind;
                if kind == NODE_DELETED {
                    return Ok(());
                }
                // A creation, or a renewal's rewrite of the node: the watch
                // fired and is gone. Set again at once; a node gone by then
                // was freed in between, which the new watch will not tell.
                let there = self.watch().await.map_err(|e| self.lost(e))?;
                if !there || (kind == NODE_CREATED && self.heard == Heard::Changes) {
                    return Ok(());
                }
                continue;
            }
            // Pings keep the session alive: a third of its timeout apart.
            let every = Duration::from_millis((c.creds.timeout_ms / 3).max(1) as u64);
            match tokio::time::timeout(every, c.next_event()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(self.lost(e)),
                Err(_) => {
                    self.busy = true;
                    let sent = c.send_ping().await;
                    self.busy = false;
                    sent.map_err(|e| self.lost(e))?;
                }
            }
        }
    }
}
