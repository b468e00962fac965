//! Why a store call failed, and why a store URL cannot be used.

use std::error::Error;
use std::fmt;

/// What a failed call means for whoever waits on the store (contract §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// May heal by itself: network trouble, a timeout, a restarting or
    /// read-only server, a lock held too long. A waiting contender retries.
    MayHeal,
    /// Will not heal: wrong password, missing permission, unusable
    /// configuration. Retrying is pointless.
    WillNotHeal,
    /// There is no lease table where one was looked for (will not heal by
    /// itself: `leaderrun init`, or a first run, creates it).
    NoTable,
    /// The store will not do what the command line asks, found only once it
    /// answered (ZooKeeper grants another session timeout than `--lease`):
    /// a usage error (exit 2), like a lease refused before connecting.
    Usage,
}

/// Why a store call failed: what it means ([`ErrorKind`]), one line for
/// people (what failed, in which store, in the server's own words; never a
/// password), and the driver's error behind it, where there is one.
#[derive(Debug)]
pub struct StoreError {
    kind: ErrorKind,
    text: String,
    source: Option<Box<dyn Error + Send + Sync + 'static>>,
}

impl StoreError {
    pub(crate) fn new(kind: ErrorKind, text: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            text: text.into(),
            source: None,
        }
    }

    /// A failure that may heal by itself.
    pub fn unavailable(text: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::MayHeal, text)
    }

    /// A failure that will not heal.
    pub fn fatal(text: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::WillNotHeal, text)
    }

    /// What the command line asks cannot be done on this store (exit 2).
    pub fn usage(text: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::Usage, text)
    }

    /// `kind` for `heals`: may heal, or will not.
    pub(crate) fn healing(heals: bool, text: impl Into<String>) -> StoreError {
        let kind = if heals {
            ErrorKind::MayHeal
        } else {
            ErrorKind::WillNotHeal
        };
        StoreError::new(kind, text)
    }

    /// The driver's error behind this one.
    pub(crate) fn with_source(mut self, e: impl Error + Send + Sync + 'static) -> StoreError {
        self.source = Some(Box::new(e));
        self
    }

    /// The same failure, said differently (a hint added, a warning the
    /// server gave): kind and source are kept.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
    pub(crate) fn reworded(mut self, f: impl FnOnce(&str) -> String) -> StoreError {
        self.text = f(&self.text);
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether a waiting contender should try again.
    pub fn may_heal(&self) -> bool {
        self.kind == ErrorKind::MayHeal
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// Why a store URL cannot be used, as the end of a sentence that begins
/// "the store URL from ORIGIN": "has an unknown parameter x", "is not
/// valid: invalid port number". Never contains the URL or a password.
#[derive(Debug)]
pub struct UrlError {
    what: String,
    source: Option<Box<dyn Error + Send + Sync + 'static>>,
}

impl UrlError {
    /// The parser's error behind this one.
    pub(crate) fn because(
        what: impl Into<String>,
        e: impl Error + Send + Sync + 'static,
    ) -> UrlError {
        UrlError {
            what: what.into(),
            source: Some(Box::new(e)),
        }
    }
}

impl From<String> for UrlError {
    fn from(what: String) -> UrlError {
        UrlError { what, source: None }
    }
}

impl From<&str> for UrlError {
    fn from(what: &str) -> UrlError {
        what.to_string().into()
    }
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl Error for UrlError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}
