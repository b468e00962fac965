//! One TCP connection to one ZooKeeper server, inside one session.
//!
//! The handshake (a `ConnectRequest` frame without a header) either creates
//! a session or resumes one (its id and password); the server answers with
//! the session timeout it grants, which it clamps to its own bounds, and a
//! timeout of 0 when the session it was asked to resume has expired. After
//! that, requests and replies are frames matched by `xid`; watch events
//! (`xid` -1) arrive between replies on the same connection and are kept
//! for whoever watches.
//!
//! Frames are read into a buffer of the connection's own and taken from it
//! whole, so a read that is dropped half-way (the wake-up task's ping timer)
//! loses nothing.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::proto::{code, code_name, op, xid, Malformed, Reader, Writer, MAX_FRAME};

/// Why a request on a connection failed.
#[derive(Debug)]
pub(super) enum ZkError {
    /// The connection broke, or could not be made: another server, or the
    /// same one later, may answer.
    Io(std::io::Error),
    /// The server answered with an error code.
    Server(i32),
    /// The server sent something that is not the record it must be.
    Malformed(Malformed),
    /// The session this client held has expired (or was closed): its
    /// ephemeral nodes are gone.
    Expired,
    /// Nothing a retry could change (a refused authentication, nodes that
    /// are not leaderrun's), said for people.
    Refused(String),
    /// What the command line asks is not what the server grants (a session
    /// timeout clamped to its bounds): a usage error, said for people.
    Unusable(String),
}

impl ZkError {
    /// Whether a later call may succeed (contract §5): connection trouble
    /// and the server's transient states may heal; a refused identity, a
    /// missing permission or a request the server cannot take will not.
    pub fn is_transient(&self) -> bool {
        match self {
            ZkError::Io(_) | ZkError::Malformed(_) | ZkError::Expired => true,
            ZkError::Refused(_) | ZkError::Unusable(_) => false,
            ZkError::Server(c) => !matches!(
                *c,
                code::NO_AUTH
                    | code::AUTH_FAILED
                    | code::INVALID_ACL
                    | code::QUOTA_EXCEEDED
                    | code::SESSION_CLOSED_REQUIRE_SASL
                    | code::BAD_ARGUMENTS
                    | code::UNIMPLEMENTED
                    | code::MARSHALLING_ERROR
                    | code::NO_CHILDREN_FOR_EPHEMERALS
            ),
        }
    }
}

impl std::fmt::Display for ZkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZkError::Io(e) => write!(f, "{e}"),
            ZkError::Server(code::NO_AUTH) => f.write_str(
                "NoAuth: this identity may not use the lease nodes \
                 (a wrong user or password, or nodes created by another one)",
            ),
            ZkError::Server(c) => write!(f, "{} (error {c})", code_name(*c)),
            ZkError::Malformed(m) => write!(f, "{m}"),
            ZkError::Expired => f.write_str("the session expired"),
            ZkError::Refused(why) | ZkError::Unusable(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ZkError {}

impl From<std::io::Error> for ZkError {
    fn from(e: std::io::Error) -> ZkError {
        ZkError::Io(e)
    }
}

impl From<Malformed> for ZkError {
    fn from(m: Malformed) -> ZkError {
        ZkError::Malformed(m)
    }
}

pub(super) type Res<T> = Result<T, ZkError>;

/// A session as the server granted it: what resuming it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Creds {
    pub id: i64,
    pub passwd: Vec<u8>,
    /// The session timeout the server granted, in milliseconds.
    pub timeout_ms: i32,
}

/// A watch event: what happened to which node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Event {
    pub kind: i32,
    pub path: String,
}

pub(super) struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet taken as a frame.
    buf: Vec<u8>,
    next_xid: i32,
    pub creds: Creds,
    /// The newest transaction this client has seen, from any connection of
    /// the session: a server that is behind it refuses the handshake, so a
    /// client never reads older state after moving to a lagging server.
    seen: Arc<AtomicI64>,
    /// Watch events received and not yet taken.
    pub events: Vec<Event>,
}

impl Conn {
    /// Connect to `addr` and create a session asking for `ask_ms`, or
    /// resume `resume`. `Err(Expired)` when the session to resume is gone.
    pub async fn open(
        addr: &str,
        ask_ms: i32,
        resume: Option<&Creds>,
        seen: Arc<AtomicI64>,
    ) -> Res<Conn> {
        let stream = TcpStream::connect(addr).await?;
        let _ = stream.set_nodelay(true);
        let mut w = Writer::default();
        let (id, passwd) = resume.map_or((0, &[0u8; 16][..]), |c| (c.id, &c.passwd[..]));
        w.int(0)
            .long(seen.load(Ordering::Relaxed))
            .int(ask_ms)
            .long(id)
            .buffer(passwd)
            .bool(false);
        let mut c = Conn {
            stream,
            buf: Vec::with_capacity(512),
            next_xid: 1,
            creds: Creds {
                id: 0,
                passwd: Vec::new(),
                timeout_ms: 0,
            },
            seen,
            events: Vec::new(),
        };
        c.stream.write_all(&w.frame()).await?;
        let f = c.frame().await?;
        let mut r = Reader::new(&f);
        let (_version, timeout_ms, id) = (r.int()?, r.int()?, r.long()?);
        let passwd = r.buffer()?.to_vec();
        if timeout_ms <= 0 || id == 0 {
            return Err(ZkError::Expired);
        }
        c.creds = Creds {
            id,
            passwd,
            timeout_ms,
        };
        Ok(c)
    }

    /// Authenticate as `user` (`digest` scheme): the identity every node
    /// this connection creates with the creator's ACL belongs to. Digest
    /// authentication takes any user and password (it only derives the
    /// identity); a wrong password shows as `NoAuth` on the nodes.
    pub async fn auth(&mut self, user: &str, password: &str) -> Res<()> {
        let mut w = Writer::request(xid::AUTH, op::AUTH);
        w.int(0)
            .string("digest")
            .buffer(format!("{user}:{password}").as_bytes());
        self.stream.write_all(&w.frame()).await?;
        match self.reply(xid::AUTH).await {
            Ok(_) => Ok(()),
            Err(ZkError::Server(code::AUTH_FAILED)) => Err(ZkError::Refused(
                "the server refused the digest authentication".into(),
            )),
            Err(e) => Err(e),
        }
    }

    /// Send request `opcode` with the record `body` writes; the reply's
    /// record on success.
    pub async fn request(&mut self, opcode: i32, body: impl FnOnce(&mut Writer)) -> Res<Vec<u8>> {
        let x = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1).max(1);
        let mut w = Writer::request(x, opcode);
        body(&mut w);
        self.stream.write_all(&w.frame()).await?;
        self.reply(x).await
    }

    /// A ping: keeps the session alive on a connection that is otherwise
    /// idle (the wake-up connection's), answered by `xid` -2.
    pub async fn send_ping(&mut self) -> Res<()> {
        let w = Writer::request(xid::PING, op::PING);
        self.stream.write_all(&w.frame()).await?;
        Ok(())
    }

    /// Read until the reply to `want` arrives, keeping watch events and
    /// passing over ping replies.
    async fn reply(&mut self, want: i32) -> Res<Vec<u8>> {
        loop {
            let f = self.frame().await?;
            let mut r = Reader::new(&f);
            let (got, zxid, err) = (r.int()?, r.long()?, r.int()?);
            if zxid > 0 {
                self.seen.fetch_max(zxid, Ordering::Relaxed);
            }
            if got == xid::WATCH_EVENT {
                self.keep_event(&mut r)?;
                continue;
            }
            if got != want {
                // Ping replies, and nothing else on a connection that has
                // one request out at a time.
                continue;
            }
            if err == code::SESSION_EXPIRED {
                return Err(ZkError::Expired);
            }
            if err != code::OK {
                return Err(ZkError::Server(err));
            }
            return Ok(r.rest().to_vec());
        }
    }

    fn keep_event(&mut self, r: &mut Reader<'_>) -> Res<()> {
        let (kind, _state, path) = (r.int()?, r.int()?, r.string()?);
        // A session event (kind -1: disconnected, expired) names no node.
        if kind > 0 {
            self.events.push(Event { kind, path });
        }
        Ok(())
    }

    /// Wait for the next frame of any kind: watch events are kept, ping
    /// replies passed over. For the wake-up task, which has no request out.
    pub async fn next_event(&mut self) -> Res<()> {
        loop {
            let f = self.frame().await?;
            let mut r = Reader::new(&f);
            let (got, zxid, _err) = (r.int()?, r.long()?, r.int()?);
            if zxid > 0 {
                self.seen.fetch_max(zxid, Ordering::Relaxed);
            }
            if got == xid::WATCH_EVENT {
                self.keep_event(&mut r)?;
                return Ok(());
            }
        }
    }

    /// The next whole frame, without its length. Cancel-safe: bytes read
    /// stay in the buffer until a whole frame is there.
    async fn frame(&mut self) -> Res<Vec<u8>> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if len > MAX_FRAME {
                    return Err(Malformed("a frame longer than 4 MiB").into());
                }
                if self.buf.len() >= 4 + len {
                    let f = self.buf[4..4 + len].to_vec();
                    self.buf.drain(..4 + len);
                    return Ok(f);
                }
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(ZkError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
        }
    }
}
