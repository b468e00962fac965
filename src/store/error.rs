//! Why a store call failed.

/// Why a store call failed. The caller must tell these apart: a waiting
/// contender retries `Unavailable` but gives up on `Fatal`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// May heal: network trouble, a timeout, a restarting or read-only
    /// server, a lock held too long.
    #[error("{0}")]
    Unavailable(String),
    /// Will not heal: wrong password, missing permission, unusable
    /// configuration.
    #[error("{0}")]
    Fatal(String),
}

impl StoreError {
    pub fn may_heal(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}
