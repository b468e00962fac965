//! Push wake-ups on ZooKeeper: a watch on the lease node, on a session of
//! its own.
//!
//! `exists(lease, watch)` leaves a one-time watch that fires when the node
//! is deleted (a release, a clear, the holder's session expiring) or, when
//! it did not exist, created; a creation only re-arms the watch. The
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
use crate::store::wake::Wakeups;
use crate::store::StoreError;

/// How long `arm` may take to connect.
const CONNECT: Duration = Duration::from_secs(2);

pub struct ZkWakeups {
    ensemble: Ensemble,
    path: String,
    conn: Option<Conn>,
    /// A request was under way when its future was dropped: the
    /// connection may hold half a frame, so it is not used again.
    busy: bool,
}

impl ZkWakeups {
    pub(super) fn new(ensemble: Ensemble, path: String) -> ZkWakeups {
        ZkWakeups {
            ensemble,
            path,
            conn: None,
            busy: false,
        }
    }

    /// Watch the lease node on the current connection.
    async fn watch(&mut self) -> Res<()> {
        let Some(c) = self.conn.as_mut() else {
            return Err(ZkError::Expired);
        };
        self.busy = true;
        c.exists(&self.path, true).await?;
        self.busy = false;
        Ok(())
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
        self.watch().await.map_err(|e| self.lost(e))
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
                if kind == NODE_CREATED {
                    self.watch().await.map_err(|e| self.lost(e))?;
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
