//! What leaderrun tells its watchdog, and how it crosses the pipe: one JSON
//! object per line, decoded into typed messages.
//!
//! JSON escapes every control character inside a string, so no value can
//! break a line or forge a message: a holder or store string with a newline
//! in it crosses whole, as the same string. Values that are bytes rather
//! than text cross as hex: a cgroup path is whatever the hierarchy allows
//! (spaces, newlines, bytes that are not UTF-8), and split at the wrong
//! place `/sys/fs/cgroup/a b/leaderrun-…` would name `/sys/fs/cgroup/a`, a
//! stranger's cgroup, to be killed. Instants and durations cross as whole
//! nanoseconds on the boot clock.
//!
//! The first line is the [`Start`]: the orders, and what leaderrun has said
//! since (a replacement's case), so that the watchdog's `ready` means it
//! holds all of it. Every later line is one [`Msg`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Stamp;
use crate::redact::Secret;
use crate::store::Origin;
use crate::timing::Timing;

/// Everything the watchdog needs to know, sent once at start. Its `Debug`
/// shows the store string redacted (redact.rs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Orders {
    /// The `--store` value as given (the watchdog resolves it exactly as
    /// leaderrun did, from the same environment). It may hold a password:
    /// never in a log line, nor in `Debug`.
    #[serde(with = "secret")]
    pub store: Option<Secret>,
    #[serde(with = "origin")]
    pub origin: Origin,
    pub name: String,
    pub holder: String,
    pub epoch: i64,
    /// `L`, `R`, `G`, `K`, `P`: the stop plan's (stop.rs), and the release
    /// after leaderrun's death is retried on the renewal's schedule
    /// (elector.rs, `hand_back_until`).
    #[serde(with = "timing")]
    pub timing: Timing,
    #[serde(with = "ns_opt")]
    pub min_hold: Option<Duration>,
    #[serde(with = "stamp")]
    pub acquired_at: Stamp,
    /// When the last renewal the store confirmed (the acquisition, at
    /// first) was sent: every deadline counts from here.
    #[serde(with = "stamp")]
    pub sent: Stamp,
    pub verbose: u8,
    pub quiet: bool,
    pub json: bool,
}

/// What leaderrun says after the orders, one per line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum Msg {
    /// The command is about to be forked (into `cgroup`, if any: named
    /// before the directory exists; said again with none when it could
    /// not be made).
    Spawning {
        #[serde(with = "path_hex")]
        cgroup: Option<PathBuf>,
    },
    /// The command started: its pid, with its start time (clock ticks
    /// since boot), which together name it, and its cgroup.
    Child {
        pid: i32,
        start: u64,
        #[serde(with = "path_hex")]
        cgroup: Option<PathBuf>,
    },
    /// A renewal the store confirmed, sent at `sent`.
    Renewed {
        #[serde(with = "stamp")]
        sent: Stamp,
    },
    /// leaderrun is stopping the command itself.
    Stopping,
    /// Look at leaderrun's descendants now (a replacement's first look).
    Look,
    /// Everything the command started is gone: leave, touching nothing.
    Done,
}

/// The wire format's version: a watchdog refuses orders of another.
pub const VERSION: u32 = 1;

/// The first line: the orders, and what was said since (a replacement's
/// case), applied before the watchdog says `ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    pub watchdog: u32,
    pub orders: Orders,
    pub said: Vec<Msg>,
}

/// Why a line is not what the watchdog takes. Its text never quotes the
/// line (the orders hold the store string, which may hold a password):
/// what kind of fault, and where.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a message of this version ({} at column {})", kind(.0), .0.column())]
    Json(#[from] serde_json::Error),
    #[error("orders of wire version {0}, not {VERSION}")]
    Version(u32),
}

fn kind(e: &serde_json::Error) -> &'static str {
    use serde_json::error::Category;
    match e.classify() {
        Category::Io => "a read error",
        Category::Syntax => "not JSON",
        Category::Data => "not the fields expected",
        Category::Eof => "cut short",
    }
}

/// A value as one line: JSON has no raw newline anywhere in it. Fails only
/// for a duration or instant past `u64` nanoseconds, which timing.rs
/// bounds far below.
fn line(v: &impl Serialize) -> Result<String, serde_json::Error> {
    let mut s = serde_json::to_string(v)?;
    s.push('\n');
    Ok(s)
}

impl Start {
    pub fn new(orders: Orders, said: Vec<Msg>) -> Start {
        Start {
            watchdog: VERSION,
            orders,
            said,
        }
    }

    pub fn encode(&self) -> Result<String, serde_json::Error> {
        line(self)
    }

    /// One line (without its newline).
    pub fn decode(bytes: &[u8]) -> Result<Start, DecodeError> {
        let s: Start = serde_json::from_slice(bytes)?;
        if s.watchdog != VERSION {
            return Err(DecodeError::Version(s.watchdog));
        }
        Ok(s)
    }
}

impl Msg {
    pub fn encode(&self) -> Result<String, serde_json::Error> {
        line(self)
    }

    /// One line (without its newline).
    pub fn decode(bytes: &[u8]) -> Result<Msg, DecodeError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// The store string, exposed only on the wire (the pipe is the watchdog's
/// alone).
mod secret {
    use crate::redact::Secret;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Secret>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_some(v.expose()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Secret>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.map(Secret::from))
    }
}

/// Durations as whole nanoseconds. A value past `u64::MAX` ns (584 years)
/// cannot be sent: every duration here is bounded far below (timing.rs).
mod ns {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        let n = u64::try_from(d.as_nanos())
            .map_err(|_| serde::ser::Error::custom("a duration past u64 nanoseconds"))?;
        s.serialize_u64(n)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_nanos(u64::deserialize(d)?))
    }
}

mod ns_opt {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::ns::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_nanos))
    }
}

/// Boot-clock instants as nanoseconds since boot.
mod stamp {
    use crate::clock::Stamp;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Stamp, s: S) -> Result<S::Ok, S::Error> {
        super::ns::serialize(&t.since_origin(), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Stamp, D::Error> {
        super::ns::deserialize(d).map(Stamp::from_origin)
    }
}

/// The five durations, checked again on arrival: a watchdog acts only on a
/// timing leaderrun could have run with.
mod timing {
    use crate::timing::{Timing, TimingArgs};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Wire {
        #[serde(with = "super::ns")]
        lease: std::time::Duration,
        #[serde(with = "super::ns")]
        renew: std::time::Duration,
        #[serde(with = "super::ns")]
        give_up: std::time::Duration,
        #[serde(with = "super::ns")]
        kill_after: std::time::Duration,
        #[serde(with = "super::ns")]
        retry: std::time::Duration,
    }

    pub fn serialize<S: Serializer>(t: &Timing, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            lease: t.lease,
            renew: t.renew,
            give_up: t.give_up,
            kill_after: t.kill_after,
            retry: t.retry,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timing, D::Error> {
        let w = Wire::deserialize(d)?;
        let t = Timing::resolve(TimingArgs {
            lease: Some(w.lease.into()),
            renew: Some(w.renew.into()),
            give_up: Some(w.give_up.into()),
            kill_after: Some(w.kill_after.into()),
            retry: Some(w.retry.into()),
        })
        .map_err(serde::de::Error::custom)?;
        Ok(t)
    }
}

mod origin {
    use crate::store::Origin;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(o: &Origin, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match o {
            Origin::Flag => "flag",
            Origin::LeaderrunStore => "env",
            Origin::DatabaseUrl => "database_url",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Origin, D::Error> {
        match String::deserialize(d)?.as_str() {
            "flag" => Ok(Origin::Flag),
            "env" => Ok(Origin::LeaderrunStore),
            "database_url" => Ok(Origin::DatabaseUrl),
            other => Err(serde::de::Error::unknown_variant(
                other,
                &["flag", "env", "database_url"],
            )),
        }
    }
}

/// A cgroup path as its bytes in hex (see the module docs); `null` for
/// none. Anything but whole hex bytes of an absolute path is refused.
mod path_hex {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::PathBuf;

    pub fn serialize<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        match p {
            None => s.serialize_none(),
            Some(p) => {
                let hex: String = p
                    .as_os_str()
                    .as_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                s.serialize_some(&hex)
            }
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        let Some(hex) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        from_hex(&hex)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom("not the hex of an absolute path"))
    }

    pub(super) fn from_hex(f: &str) -> Option<PathBuf> {
        if f.len() % 2 != 0 || !f.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let bytes = (0..f.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(f.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        let p = PathBuf::from(std::ffi::OsString::from_vec(bytes));
        p.is_absolute().then_some(p)
    }
}

#[cfg(test)]
#[path = "orders_tests.rs"]
mod tests;
