//! One session type for every store: one connection kept between calls,
//! every call bounded by its timeout, the connection put back only on
//! success, errors classified by the store.
//!
//! The connection is taken out of the session for the duration of a call
//! and put back only when the call succeeded: a call that fails, or whose
//! future is dropped mid-flight (the elector's give-up timer, the call's own
//! timeout), leaves no half-used connection behind, whatever it was in the
//! middle of reading, and the next call connects anew.

use std::time::Duration;

use tokio::time::Instant;

use super::StoreError;

/// How a store reaches its server, and what its driver's errors mean.
pub(crate) trait Connect {
    /// What a call runs on: a connection (for etcd, the cluster's members
    /// and the connection to the one that answered last).
    type Conn;
    /// The error the driver's calls return.
    type Error;

    /// The store as shown in logs and errors; never contains a password.
    fn shown(&self) -> String;

    /// A fresh connection, ready for calls, made by `deadline` (the call's
    /// own timeout also bounds it).
    async fn connect(&mut self, deadline: Instant) -> Result<Self::Conn, StoreError>;

    /// `what` ("cannot renew in") the store, with the driver's words: may
    /// heal, or will not.
    fn classify(&self, what: &str, e: Self::Error) -> StoreError;
}

pub(crate) struct Session<C: Connect> {
    /// How to connect; the store's own settings live here too.
    pub c: C,
    conn: Option<C::Conn>,
}

impl<C: Connect> Session<C> {
    pub fn new(c: C) -> Self {
        Session { c, conn: None }
    }

    /// Drop the connection; the next call makes a new one.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "zookeeper"))]
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// Run `f` on the connection (made first when there is none) within
    /// `timeout`; `f` is told the call's deadline, which counts from before
    /// connecting. The connection is kept only when `f` succeeded.
    pub async fn call<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        f: impl AsyncFnOnce(&mut C::Conn, Instant) -> Result<T, C::Error>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + timeout;
        let work = async {
            let mut conn = match self.conn.take() {
                Some(c) => c,
                None => self.c.connect(deadline).await?,
            };
            match f(&mut conn, deadline).await {
                Ok(v) => {
                    self.conn = Some(conn);
                    Ok(v)
                }
                Err(e) => Err(self.c.classify(what, e)),
            }
        };
        match tokio::time::timeout_at(deadline, work).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::unavailable(format!(
                "the store {} did not answer within {}",
                self.c.shown(),
                crate::duration::show(timeout)
            ))),
        }
    }
}
