//! ZooKeeper's wire format (jute), as far as leaderrun speaks it.
//!
//! Every message is a frame: a 4-byte big-endian length, then that many
//! bytes. Inside, integers are big-endian (`int` 4 bytes, `long` 8), a
//! `boolean` is one byte, and a `buffer` or `ustring` is an `int` length
//! (-1 for none) followed by its bytes. A request is a header (`xid`, the
//! operation's code) and the operation's record; a reply is a header
//! (`xid`, the server's last zxid, an error code) and, on success, the
//! operation's response. The records are those of ZooKeeper's
//! `zookeeper.jute` (3.5 and later; 3.4 answers the same for these).

use std::fmt;

/// The largest frame read: far more than any reply leaderrun asks for (the
/// longest is the list of every lease name), far less than a misbehaving
/// peer could make us allocate. ZooKeeper's own default bound is 1 MiB.
pub(super) const MAX_FRAME: usize = 4 << 20;

/// Operation codes (`ZooDefs.OpCode`).
pub(super) mod op {
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const AUTH: i32 = 100;
    /// A failed operation's result in a `multi` reply.
    pub const ERROR: i32 = -1;
}

/// The `xid`s the protocol reserves: replies that answer no request.
pub(super) mod xid {
    pub const WATCH_EVENT: i32 = -1;
    pub const PING: i32 = -2;
    pub const AUTH: i32 = -4;
}

/// Node creation flags.
pub(super) const PERSISTENT: i32 = 0;
pub(super) const EPHEMERAL: i32 = 1;

/// Watch event types (`Watcher.Event.EventType`).
pub(super) const NODE_CREATED: i32 = 1;
pub(super) const NODE_DELETED: i32 = 2;

/// The error codes leaderrun tells apart (`KeeperException.Code`).
pub(super) mod code {
    pub const OK: i32 = 0;
    pub const RUNTIME_INCONSISTENCY: i32 = -2;
    pub const MARSHALLING_ERROR: i32 = -5;
    pub const UNIMPLEMENTED: i32 = -6;
    pub const BAD_ARGUMENTS: i32 = -8;
    pub const NO_NODE: i32 = -101;
    pub const NO_AUTH: i32 = -102;
    pub const BAD_VERSION: i32 = -103;
    pub const NO_CHILDREN_FOR_EPHEMERALS: i32 = -108;
    pub const NODE_EXISTS: i32 = -110;
    pub const SESSION_EXPIRED: i32 = -112;
    pub const INVALID_ACL: i32 = -114;
    pub const AUTH_FAILED: i32 = -115;
    pub const SESSION_CLOSED_REQUIRE_SASL: i32 = -124;
    pub const QUOTA_EXCEEDED: i32 = -125;
}

/// ZooKeeper's name for an error code, as its clients print it.
pub(super) fn code_name(c: i32) -> &'static str {
    match c {
        0 => "OK",
        -1 => "SystemError",
        -2 => "RuntimeInconsistency",
        -3 => "DataInconsistency",
        -4 => "ConnectionLoss",
        -5 => "MarshallingError",
        -6 => "Unimplemented",
        -7 => "OperationTimeout",
        -8 => "BadArguments",
        -13 => "NewConfigNoQuorum",
        -14 => "ReconfigInProgress",
        -101 => "NoNode",
        -102 => "NoAuth",
        -103 => "BadVersion",
        -108 => "NoChildrenForEphemerals",
        -110 => "NodeExists",
        -111 => "NotEmpty",
        -112 => "SessionExpired",
        -114 => "InvalidACL",
        -115 => "AuthFailed",
        -118 => "SessionMoved",
        -119 => "NotReadOnly",
        -122 => "RequestTimeout",
        -124 => "SessionClosedRequireSaslAuth",
        -125 => "QuotaExceeded",
        -127 => "Throttled",
        _ => "an unknown error",
    }
}

/// A reply that cannot be read as the record it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a malformed reply ({})", self.0)
    }
}

/// A frame being written; [`Writer::frame`] puts the length in front.
#[derive(Default)]
pub(super) struct Writer(Vec<u8>);

impl Writer {
    /// A request: its header, then whatever the caller writes.
    pub fn request(xid: i32, op: i32) -> Writer {
        let mut w = Writer(Vec::with_capacity(64));
        w.int(xid).int(op);
        w
    }

    pub fn int(&mut self, v: i32) -> &mut Writer {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn long(&mut self, v: i64) -> &mut Writer {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Writer {
        self.0.push(u8::from(v));
        self
    }

    pub fn buffer(&mut self, b: &[u8]) -> &mut Writer {
        // Nothing leaderrun writes comes near 2 GiB.
        self.int(i32::try_from(b.len()).unwrap_or(i32::MAX));
        self.0.extend_from_slice(b);
        self
    }

    pub fn string(&mut self, s: &str) -> &mut Writer {
        self.buffer(s.as_bytes())
    }

    /// The bytes to send: length, then the frame.
    pub fn frame(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() + 4);
        out.extend_from_slice(&(self.0.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.0);
        out
    }
}

/// A frame being read.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        if self.buf.len() < n {
            return Err(Malformed(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn int(&mut self) -> Result<i32, Malformed> {
        let b = self.take(4, "short int")?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn long(&mut self) -> Result<i64, Malformed> {
        let b = self.take(8, "short long")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    pub fn bool(&mut self) -> Result<bool, Malformed> {
        Ok(self.take(1, "short boolean")?[0] != 0)
    }

    /// A buffer; `None` written as length -1 reads as empty.
    pub fn buffer(&mut self) -> Result<&'a [u8], Malformed> {
        match self.int()? {
            n if n < 0 => Ok(&[]),
            n => self.take(n as usize, "buffer longer than its frame"),
        }
    }

    pub fn string(&mut self) -> Result<String, Malformed> {
        let b = self.buffer()?;
        String::from_utf8(b.to_vec()).map_err(|_| Malformed("string not UTF-8"))
    }

    pub fn strings(&mut self) -> Result<Vec<String>, Malformed> {
        let n = self.int()?;
        if n < 0 {
            return Ok(Vec::new());
        }
        // Each string takes 4 bytes at least: a count beyond that is a lie.
        if n as usize > self.buf.len() / 4 {
            return Err(Malformed("vector longer than its frame"));
        }
        (0..n).map(|_| self.string()).collect()
    }

    pub fn stat(&mut self) -> Result<Stat, Malformed> {
        Ok(Stat {
            czxid: self.long()?,
            mzxid: self.long()?,
            ctime: self.long()?,
            mtime: self.long()?,
            version: self.int()?,
            cversion: self.int()?,
            aversion: self.int()?,
            ephemeral_owner: self.long()?,
            data_length: self.int()?,
            num_children: self.int()?,
            pzxid: self.long()?,
        })
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// What is left unread.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }
}

/// A node's metadata. `ctime` and `mtime` are the ZooKeeper leader's wall
/// clock (milliseconds since 1970) when it made the transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(dead_code)] // read whole, as the record is; not every field is used
pub(super) struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    /// The session that owns an ephemeral node; 0 for a persistent one.
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

/// Who may do what to a node leaderrun creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acl {
    /// `world:anyone`, every permission: a store without authentication.
    Open,
    /// `auth:` (every identity the creating session authenticated as),
    /// every permission: with `zk://user:password@…`, the user's digest
    /// identity, so every leaderrun with the same credentials, and nobody
    /// else, may touch the lease.
    Creator,
}

/// `ZooDefs.Perms.ALL`: read, write, create, delete, admin.
const ALL: i32 = 31;

impl Acl {
    fn write(self, w: &mut Writer) {
        let (scheme, id) = match self {
            Acl::Open => ("world", "anyone"),
            Acl::Creator => ("auth", ""),
        };
        w.int(1).int(ALL).string(scheme).string(id);
    }
}

/// One operation of a `multi` (a transaction: all of them, or none).
#[derive(Debug, Clone, Copy)]
pub(super) enum Op<'a> {
    Create {
        path: &'a str,
        data: &'a [u8],
        acl: Acl,
        flags: i32,
    },
    /// `version` -1: whatever the version.
    Delete { path: &'a str, version: i32 },
    SetData {
        path: &'a str,
        data: &'a [u8],
        version: i32,
    },
    /// Passes when the node exists at `version` (-1: at any version).
    Check { path: &'a str, version: i32 },
}

impl Op<'_> {
    fn code(&self) -> i32 {
        match self {
            Op::Create { .. } => op::CREATE,
            Op::Delete { .. } => op::DELETE,
            Op::SetData { .. } => op::SET_DATA,
            Op::Check { .. } => op::CHECK,
        }
    }

    /// The operation's request record (also what it is on its own).
    pub fn write(&self, w: &mut Writer) {
        match *self {
            Op::Create {
                path,
                data,
                acl,
                flags,
            } => {
                w.string(path).buffer(data);
                acl.write(w);
                w.int(flags);
            }
            Op::Delete { path, version } => {
                w.string(path).int(version);
            }
            Op::SetData {
                path,
                data,
                version,
            } => {
                w.string(path).buffer(data).int(version);
            }
            Op::Check { path, version } => {
                w.string(path).int(version);
            }
        }
    }
}

/// A `multi` request's record: each operation behind a header saying what
/// it is, then a header that ends the list.
pub(super) fn write_multi(w: &mut Writer, ops: &[Op<'_>]) {
    for o in ops {
        w.int(o.code()).bool(false).int(-1);
        o.write(w);
    }
    w.int(-1).bool(true).int(-1);
}

/// What one operation of a `multi` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OpResult {
    Created,
    Deleted,
    Set(Stat),
    Checked,
    /// The transaction failed: this operation's error code (0 for those
    /// before the one that failed, -2 for those after it).
    Failed(i32),
}

/// A `multi` reply: one result per operation, in order.
pub(super) fn read_multi(r: &mut Reader<'_>) -> Result<Vec<OpResult>, Malformed> {
    let mut out = Vec::new();
    loop {
        let (kind, done, _err) = (r.int()?, r.bool()?, r.int()?);
        if done {
            return Ok(out);
        }
        out.push(match kind {
            op::CREATE => {
                r.string()?;
                OpResult::Created
            }
            op::DELETE => OpResult::Deleted,
            op::SET_DATA => OpResult::Set(r.stat()?),
            op::CHECK => OpResult::Checked,
            op::ERROR => OpResult::Failed(r.int()?),
            _ => return Err(Malformed("unknown result in a multi")),
        });
    }
}

/// The error a failed `multi` failed with: the first code that is neither
/// "ok" (an operation before the failing one) nor "runtime inconsistency"
/// (one after it). `None` when every operation succeeded.
pub(super) fn multi_error(results: &[OpResult]) -> Option<i32> {
    let failed = results.iter().filter_map(|r| match r {
        OpResult::Failed(c) => Some(*c),
        _ => None,
    });
    let mut seen = None;
    for c in failed {
        if c != code::OK && c != code::RUNTIME_INCONSISTENCY {
            return Some(c);
        }
        seen.get_or_insert(code::RUNTIME_INCONSISTENCY);
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(w: Writer) -> Vec<u8> {
        let f = w.frame();
        let len = u32::from_be_bytes([f[0], f[1], f[2], f[3]]) as usize;
        assert_eq!(len, f.len() - 4);
        f[4..].to_vec()
    }

    #[test]
    fn integers_and_buffers_are_big_endian_and_length_prefixed() {
        let mut w = Writer::default();
        w.int(-2)
            .long(0x0102_0304_0506_0708)
            .bool(true)
            .string("ab");
        let b = body(w);
        assert_eq!(
            b,
            [0xff, 0xff, 0xff, 0xfe, 1, 2, 3, 4, 5, 6, 7, 8, 1, 0, 0, 0, 2, b'a', b'b']
        );
        let mut r = Reader::new(&b);
        assert_eq!(r.int(), Ok(-2));
        assert_eq!(r.long(), Ok(0x0102_0304_0506_0708));
        assert_eq!(r.bool(), Ok(true));
        assert_eq!(r.string().as_deref(), Ok("ab"));
        assert!(r.is_empty());
    }

    #[test]
    fn lengths_beyond_the_frame_are_refused() {
        // A buffer claiming 100 bytes in a frame of 6.
        let b = [0, 0, 0, 100, 1, 2];
        assert!(Reader::new(&b).buffer().is_err());
        // A vector claiming a billion strings.
        let b = [0x40, 0, 0, 0, 0, 0, 0, 0];
        assert!(Reader::new(&b).strings().is_err());
        // -1 is "no buffer".
        let b = [0xff, 0xff, 0xff, 0xff];
        assert_eq!(Reader::new(&b).buffer(), Ok(&[][..]));
        assert!(Reader::new(&[0, 0]).int().is_err());
    }

    #[test]
    fn a_multi_is_framed_by_headers_and_its_error_is_the_failing_ops() {
        let mut w = Writer::default();
        write_multi(
            &mut w,
            &[
                Op::Check {
                    path: "/a",
                    version: 3,
                },
                Op::Delete {
                    path: "/b",
                    version: -1,
                },
            ],
        );
        let b = body(w);
        let mut r = Reader::new(&b);
        assert_eq!(
            (r.int(), r.bool(), r.int()),
            (Ok(op::CHECK), Ok(false), Ok(-1))
        );
        assert_eq!((r.string().as_deref(), r.int()), (Ok("/a"), Ok(3)));
        assert_eq!(
            (r.int(), r.bool(), r.int()),
            (Ok(op::DELETE), Ok(false), Ok(-1))
        );
        assert_eq!((r.string().as_deref(), r.int()), (Ok("/b"), Ok(-1)));
        assert_eq!((r.int(), r.bool(), r.int()), (Ok(-1), Ok(true), Ok(-1)));
        assert!(r.is_empty());

        // The reply to a multi whose second operation failed.
        let mut w = Writer::default();
        w.int(op::ERROR).bool(false).int(0).int(code::OK);
        w.int(op::ERROR)
            .bool(false)
            .int(-103)
            .int(code::BAD_VERSION);
        w.int(op::ERROR)
            .bool(false)
            .int(-2)
            .int(code::RUNTIME_INCONSISTENCY);
        w.int(-1).bool(true).int(-1);
        let b = body(w);
        let res = read_multi(&mut Reader::new(&b)).expect("reads");
        assert_eq!(res.len(), 3);
        assert_eq!(multi_error(&res), Some(code::BAD_VERSION));
        assert_eq!(multi_error(&[OpResult::Checked, OpResult::Deleted]), None);
    }
}
