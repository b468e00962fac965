//! What a holder tells its own command about its lease: `leaderrun check`
//! inside the command asks the leaderrun that runs it, not a store.
//!
//! The command knows `LEASE_NAME` and `LEASE_EPOCH`, but not the store: the
//! store string may carry a password, and the command inherits no secret it
//! did not already have (contract §10). A `check` that read whatever store
//! its own environment named read the wrong one whenever the run's store
//! came from `--store`. So the holder publishes its lease instead: a small
//! record in a memfd (no file on disk, gone with the holder), reached by the
//! command as `/proc/PID/fd/N` through `LEASE_STATE`. The record holds no
//! secret, only the name, holder, epoch, the store as `status` shows it
//! (password hidden), and the holder's own give-up deadline on
//! `CLOCK_BOOTTIME`.
//!
//! The answer is conservative by construction. "Live" means the holder's
//! last successful renewal was sent less than `G` ago (the deadline at which
//! leaderrun and its watchdog stop the command, contract §3), read on the
//! same boot clock by the same kernel, and the holder has not since learnt
//! otherwise (a renewal that matched nothing, a release, the command's end).
//! The store set expiry at `sent + L` or later and `G < L`, so while the
//! answer is "live" no rival can hold the lease, and it stays so without the
//! holder doing anything: a frozen or killed holder's record simply runs
//! past its deadline. What it cannot see sooner than its holder does is an
//! operator's `release` of a live lease: the holder learns of it at its next
//! renewal (within `R`), and so does `check`, when the command is stopped.
//!
//! The record is rewritten in place after every renewal. A reader may see a
//! write half done, so each record ends with a checksum of itself, and a
//! reader that finds it wrong reads again.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use crate::clock::Stamp;

/// The variable that names the record for the command.
pub const VAR: &str = "LEASE_STATE";

/// The record's version: a reader refuses any other.
const VERSION: u32 = 1;

/// Where a run stands, as its command may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Leading, until the give-up deadline unless renewed.
    Held,
    /// A renewal found the lease someone else's (or released), or the give-up
    /// deadline passed: the command is being stopped.
    Lost,
    /// The command ended or `--max-term` passed: the lease is being given back.
    Ending,
}

/// One record, as written and read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub v: u32,
    pub pid: u32,
    pub name: String,
    pub holder: String,
    pub epoch: i64,
    /// The store as `status` names it (never a password).
    pub store: String,
    pub standing: Standing,
    /// The give-up deadline, in nanoseconds of `CLOCK_BOOTTIME`.
    pub give_up_at_ns: u64,
}

impl Record {
    fn give_up_at(&self) -> Stamp {
        Stamp::from_origin(Duration::from_nanos(self.give_up_at_ns))
    }
}

/// FNV-1a, 64 bits: enough to tell a torn record from a whole one.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The bytes of one record: its JSON, a tab, its checksum, a newline.
fn encode(r: &Record) -> Vec<u8> {
    // Strings, numbers and a unit enum: this cannot fail.
    let json = serde_json::to_string(r).unwrap_or_default();
    format!("{json}\t{:016x}\n", checksum(json.as_bytes())).into_bytes()
}

/// A record from the bytes before the first newline; `None` when they are
/// not one whole record (torn, or not ours).
fn decode(bytes: &[u8]) -> Option<Record> {
    let line = bytes.split(|b| *b == b'\n').next()?;
    let tab = line.iter().rposition(|b| *b == b'\t')?;
    let (json, sum) = (&line[..tab], &line[tab + 1..]);
    let sum = u64::from_str_radix(std::str::from_utf8(sum).ok()?, 16).ok()?;
    if sum != checksum(json) {
        return None;
    }
    serde_json::from_slice(json).ok()
}

/// The holder's side: the record, kept current.
pub struct Publisher {
    file: File,
    record: Record,
    timing: crate::timing::Timing,
}

impl Publisher {
    /// A record for a lease just acquired at `epoch`, last sent at `sent`,
    /// under `timing`. `None` where no memfd can be made (the command's
    /// `check` then reads a store, as it did before).
    pub fn new(
        name: &str,
        holder: &str,
        store: String,
        epoch: i64,
        sent: Stamp,
        timing: crate::timing::Timing,
    ) -> Option<Publisher> {
        let fd = nix::sys::memfd::memfd_create(
            c"leaderrun-lease",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .map_err(|e| tracing::debug!(event = "no_lease_state", "no memfd for check ({e})"))
        .ok()?;
        let mut p = Publisher {
            file: File::from(fd),
            record: Record {
                v: VERSION,
                pid: std::process::id(),
                name: name.to_string(),
                holder: holder.to_string(),
                epoch,
                store,
                standing: Standing::Held,
                give_up_at_ns: 0,
            },
            timing,
        };
        p.renewed(sent);
        Some(p)
    }

    /// `VAR`'s value for the command.
    pub fn path(&self) -> String {
        use std::os::fd::AsRawFd;
        format!("/proc/{}/fd/{}", self.record.pid, self.file.as_raw_fd())
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&mut self, sent: Stamp) {
        // The stop plan's own deadline: the record says "live" exactly as
        // long as neither leaderrun nor its watchdog would stop the command.
        let at = crate::stop::StopPlan::new(sent, self.timing).give_up_at();
        self.record.give_up_at_ns = u64::try_from(at.since_origin().as_nanos()).unwrap_or(u64::MAX);
        self.write();
    }

    /// The lease is no longer to be relied on: lost, or being given back.
    pub fn ended(&mut self, standing: Standing) {
        self.record.standing = standing;
        self.write();
    }

    fn write(&self) {
        // A memfd write is a copy into memory: it never waits on a device.
        // One that fails leaves the old record, whose deadline still runs
        // out on its own: the answer stays conservative.
        if let Err(e) = self.file.write_all_at(&encode(&self.record), 0) {
            tracing::debug!(
                event = "no_lease_state",
                "cannot update the record for check ({e})"
            );
        }
    }
}

/// What the holder's record says about `name` at `epoch`.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Live,
    /// Not live, and why, in words that follow "lease NAME ...".
    NotLive(String),
}

/// Why the record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The holder and its record are gone: its run is over.
    #[error("its leaderrun (through {VAR}={0}) has exited")]
    Gone(String),
    #[error("cannot read {VAR}={path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{VAR}={0} holds no lease record of this leaderrun's version")]
    Garbled(String),
}

/// Read the record at `path` (`VAR`'s value). A torn record is read again.
pub fn read(path: &str) -> Result<Record, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_string(),
        source,
    };
    let mut file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::Gone(path.to_string()),
        _ => io(e),
    })?;
    // A write takes microseconds; a record still torn after this many reads
    // is not a record.
    for _ in 0..1000 {
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).map_err(io)?;
        if let Some(r) = decode(&buf).filter(|r| r.v == VERSION) {
            return Ok(r);
        }
        std::io::Seek::rewind(&mut file).map_err(io)?;
        std::thread::yield_now();
    }
    Err(ReadError::Garbled(path.to_string()))
}

/// The answer for `epoch` from `r`, at `now` on the boot clock.
pub fn answer(r: &Record, epoch: i64, now: Stamp) -> Answer {
    if r.epoch != epoch {
        return Answer::NotLive(format!(
            "is not live at epoch {epoch}: its holder leads at epoch {}",
            r.epoch
        ));
    }
    match r.standing {
        Standing::Lost => Answer::NotLive(format!("was lost at epoch {epoch}")),
        Standing::Ending => Answer::NotLive(format!(
            "is being given back at epoch {epoch}: the run is ending"
        )),
        Standing::Held if now >= r.give_up_at() => Answer::NotLive(format!(
            "is not live at epoch {epoch}: no renewal for {} past the give-up deadline",
            crate::duration::show(now.saturating_since(r.give_up_at()))
        )),
        Standing::Held => Answer::Live,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            v: VERSION,
            pid: 42,
            name: "n\t\"x\"\n".into(),
            holder: "h".into(),
            epoch: 7,
            store: "postgres://app@db/jobs".into(),
            standing: Standing::Held,
            give_up_at_ns: 5_000_000_000,
        }
    }

    #[test]
    fn a_record_survives_encoding_and_a_torn_one_is_refused() {
        let r = record();
        let bytes = encode(&r);
        assert_eq!(decode(&bytes), Some(r.clone()));
        // A longer record from before, overwritten by a shorter one: the
        // tail after the newline is not read.
        let mut longer = bytes.clone();
        longer.extend_from_slice(b"leftover bytes of an older record");
        assert_eq!(decode(&longer), Some(r.clone()));
        // Half of a new record over an old one.
        let mut other = r.clone();
        other.epoch = 8;
        let new = encode(&other);
        let mut torn = new[..new.len() / 2].to_vec();
        torn.extend_from_slice(&bytes[new.len() / 2..]);
        assert_eq!(decode(&torn), None);
        assert_eq!(decode(b""), None);
        assert_eq!(decode(b"{}\tzz\n"), None);
        // FNV-1a as published (a record is read by another leaderrun, maybe
        // of another build: the sum is a format, not a private detail).
        assert_eq!(checksum(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(checksum(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    /// No record where one was named: its leaderrun is gone (the command's
    /// check says "not live"), unlike a record it may not read (cannot tell).
    #[test]
    fn a_record_that_is_gone_is_told_from_one_that_cannot_be_read() {
        assert!(matches!(
            read("/proc/self/fd/no-such-fd"),
            Err(ReadError::Gone(_))
        ));
        assert!(matches!(read("/proc/self"), Err(ReadError::Io { .. })));
    }

    #[test]
    fn live_only_before_the_deadline_at_its_own_epoch_while_held() {
        let r = record();
        let at = |ms: u64| Stamp::from_origin(Duration::from_millis(ms));
        assert_eq!(answer(&r, 7, at(4_999)), Answer::Live);
        assert!(matches!(answer(&r, 7, at(5_000)), Answer::NotLive(_)));
        assert!(matches!(answer(&r, 6, at(0)), Answer::NotLive(_)));
        assert!(matches!(answer(&r, 8, at(0)), Answer::NotLive(_)));
        for s in [Standing::Lost, Standing::Ending] {
            let mut ended = r.clone();
            ended.standing = s;
            assert!(matches!(answer(&ended, 7, at(0)), Answer::NotLive(_)));
        }
    }

    #[test]
    fn the_holder_publishes_and_a_reader_reads_it_back() {
        let sent = crate::clock::boottime_now();
        let Some(mut p) = Publisher::new(
            "n",
            "h",
            "sqlite:///x".into(),
            3,
            sent,
            crate::timing::Timing {
                lease: Duration::from_secs(15),
                renew: Duration::from_secs(5),
                give_up: Duration::from_secs(10),
                kill_after: Duration::from_secs(2),
                retry: Duration::from_secs(2),
            },
        ) else {
            return; // no memfd on this kernel: nothing to test
        };
        let r = read(&p.path()).expect("read");
        assert_eq!((r.epoch, r.standing), (3, Standing::Held));
        assert_eq!(answer(&r, 3, crate::clock::boottime_now()), Answer::Live);
        // A renewal sent long ago moves the deadline into the past.
        p.renewed(Stamp::ORIGIN);
        let r = read(&p.path()).expect("read");
        assert!(matches!(
            answer(&r, 3, crate::clock::boottime_now()),
            Answer::NotLive(_)
        ));
        p.renewed(sent);
        p.ended(Standing::Lost);
        assert_eq!(read(&p.path()).expect("read").standing, Standing::Lost);
    }
}
