//! How leaderrun reaches an ensemble: its servers in turn, one session
//! kept across connections.
//!
//! A connection that fails is dropped with the call (session.rs); the next
//! call connects again, to the server *after* the one last used (or last
//! tried, when a call was abandoned while it hung), and resumes
//! the same session (its id and password), so a server that died or hangs
//! costs one call, not the lease: the session, and the ephemeral lease node
//! it owns, live on the ensemble until its timeout passes without a word
//! from us. A server whose view is older than what this client has seen
//! refuses the handshake, so moving to a lagging server never shows older
//! state. When the session did expire, a fresh one is made at once: the
//! lease node went with the old one, and renew notices (lease.rs).

use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use tokio::time::Instant;

use super::conn::{Conn, Creds, Res, ZkError};
use crate::store::session::Connect;
use crate::store::StoreError;

pub(super) struct Ensemble {
    /// `host:port` of every server, as given.
    pub hosts: Vec<String>,
    /// Where the next connection attempt starts.
    next: usize,
    /// Digest authentication, when the URL names a user.
    pub user: Option<(String, String)>,
    /// Built from the parsed URL, password hidden.
    pub shown: String,
    /// The session timeout asked for, in milliseconds.
    pub ask_ms: i32,
    /// Refuse a session whose granted timeout is not the one asked for:
    /// set for the lease loop, whose timing is built on it.
    pub exact: bool,
    /// The session, once the ensemble granted one.
    pub creds: Option<Creds>,
    seen: Arc<AtomicI64>,
}

impl Ensemble {
    pub fn new(hosts: Vec<String>, user: Option<(String, String)>, shown: String) -> Ensemble {
        Ensemble {
            hosts,
            next: 0,
            user,
            shown,
            ask_ms: DEFAULT_SESSION_MS,
            exact: false,
            creds: None,
            seen: Arc::default(),
        }
    }

    /// A session of its own on the same ensemble (the wake-up
    /// subscription's), never sharing this one's connections.
    pub fn detached(&self) -> Ensemble {
        let mut e = Ensemble::new(self.hosts.clone(), self.user.clone(), self.shown.clone());
        e.next = self.next;
        e
    }

    /// Ask for sessions of `ms` from now on (the current one is dropped).
    pub fn ask(&mut self, ms: i32, exact: bool) {
        if self.ask_ms != ms || self.exact != exact {
            self.creds = None;
        }
        self.ask_ms = ms;
        self.exact = exact;
    }

    /// One server: the handshake (resuming the session, or a fresh one
    /// when it expired), the timeout check, the authentication.
    async fn handshake(&mut self, addr: &str) -> Res<Conn> {
        let mut c =
            match Conn::open(addr, self.ask_ms, self.creds.as_ref(), self.seen.clone()).await {
                Err(ZkError::Expired) if self.creds.is_some() => {
                    self.creds = None;
                    Conn::open(addr, self.ask_ms, None, self.seen.clone()).await?
                }
                r => r?,
            };
        if self.exact && c.creds.timeout_ms != self.ask_ms {
            return Err(ZkError::Unusable(format!(
                "it granted a session timeout of {}ms, not the {}ms --lease asks for \
                 (ZooKeeper grants from minSessionTimeout to maxSessionTimeout, by default \
                 2 to 20 × its tickTime): use --lease {}ms",
                c.creds.timeout_ms, self.ask_ms, c.creds.timeout_ms
            )));
        }
        self.creds = Some(c.creds.clone());
        if let Some((user, password)) = &self.user {
            c.auth(user, password).await?;
        }
        Ok(c)
    }
}

/// The session timeout for calls outside the lease loop (`status`,
/// `release`, the watchdog's release): long enough for any of them, and
/// within ZooKeeper's default bounds for a tickTime of 2 s (4 s to 40 s).
pub(super) const DEFAULT_SESSION_MS: i32 = 10_000;

impl Connect for Ensemble {
    type Conn = Conn;
    type Error = ZkError;

    fn shown(&self) -> String {
        self.shown.clone()
    }

    /// Each server in turn from the one after the last used, each given
    /// half the time left while others remain (so a server that hangs
    /// leaves time for the rest), the last one all of it.
    async fn connect(&mut self, deadline: Instant) -> Result<Conn, StoreError> {
        let n = self.hosts.len();
        let start = self.next;
        let mut last = None;
        for i in 0..n {
            let at = (start + i) % n;
            // Passed over before it is tried, not after: a caller that
            // abandons the call while this server hangs (the elector's
            // subscription budget, shorter than the connect's own; a
            // call's deadline) must not start its next call here again.
            // Moved only on success or after every server had failed, the
            // call after an abandoned one started at the server that hung
            // in it again: a waiter's watch, abandoned after min(R/2, P)
            // while the frozen server listed first had half of its 2 s,
            // never subscribed while that server hung (contract §3: the
            // call after an abandoned one starts at another server;
            // tests/failover_zookeeper.rs).
            self.next = (at + 1) % n;
            let addr = self.hosts[at].clone();
            let left = deadline.saturating_duration_since(Instant::now());
            let budget = if i + 1 < n { left / 2 } else { left };
            match tokio::time::timeout(budget, self.handshake(&addr)).await {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(e)) if !e.is_transient() => {
                    return Err(self.classify(&format!("cannot connect to {addr} of"), e));
                }
                Ok(Err(e)) => last = Some(format!("{addr}: {e}")),
                Err(_) => last = Some(format!("{addr}: no answer in time")),
            }
        }
        self.next = (start + 1) % n.max(1);
        Err(StoreError::unavailable(format!(
            "cannot reach the store {} ({})",
            self.shown,
            last.unwrap_or_else(|| "no servers".into())
        )))
    }

    fn classify(&self, what: &str, e: ZkError) -> StoreError {
        // ZooKeeper's codes and our own words name no password.
        let msg = format!("{what} the store {}: {e}", self.shown);
        if let ZkError::Unusable(_) = e {
            return StoreError::usage(msg).with_source(e);
        }
        StoreError::healing(e.is_transient(), msg).with_source(e)
    }
}
