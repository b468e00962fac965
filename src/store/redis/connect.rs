//! How to reach the server, and which of its errors may heal.

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError};
use tokio::time::Instant;

use crate::redact::Redacted;
use crate::store::session::Connect;
use crate::store::StoreError;

/// How to reach the server.
pub(super) struct Reach {
    pub(super) client: Client,
    pub(super) redacted: Redacted,
}

impl Connect for Reach {
    type Conn = MultiplexedConnection;
    type Error = RedisError;

    fn shown(&self) -> String {
        self.redacted.to_string()
    }

    async fn connect(&mut self, deadline: Instant) -> Result<MultiplexedConnection, StoreError> {
        // The driver's own timeouts too, so that its background task gives
        // up on a dead socket as we do.
        let timeout = deadline.saturating_duration_since(Instant::now());
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout);
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| self.classify("cannot connect to", e))
    }

    fn classify(&self, what: &str, e: RedisError) -> StoreError {
        // The server's and the driver's words; neither contains the
        // password (the server never echoes AUTH arguments).
        // The driver renders a refused AUTH as "Password authentication
        // failed- AuthenticationFailed": said in words, with the server's
        // own reason where it gave one.
        let msg = match e.kind() {
            ErrorKind::AuthenticationFailed => format!(
                "{what} the store {}: the server refused the user name or password{}",
                self.redacted,
                e.detail().map(|d| format!(" ({d})")).unwrap_or_default()
            ),
            _ => format!("{what} the store {}: {e}", self.redacted),
        };
        StoreError::healing(is_transient(&e), msg).with_source(e)
    }
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
