//! HTTP/1.1 with one member of the cluster: a connection (TCP, or TLS for
//! `etcds://`), a POST of JSON, and the reply read within fixed bounds.
//!
//! A member that misbehaves (a broken build, a proxy in between, anything
//! listening on the port) must not make leaderrun grow without bound: the
//! status line and headers are parsed by `httparse` from at most
//! [`MAX_HEAD`] bytes and [`MAX_HEADERS`] headers, a chunk-size line (and
//! each trailer line) is at most [`MAX_LINE`] bytes, and a body, or a
//! watch's message, at most [`MAX_BODY`], checked against what the member
//! *declares* before anything is allocated for it, and filled only as its
//! bytes arrive. Anything beyond is an error of the connection, which is
//! then dropped.

use std::io;
use std::sync::Arc;

use httparse::Status;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

use super::members::{EtcdError, Res};

/// The status line and headers of a reply, together.
pub(super) const MAX_HEAD: usize = 16 << 10;
/// Headers in a reply (the gateway sends about eight).
pub(super) const MAX_HEADERS: usize = 32;
/// A chunk-size line, or a trailer line.
pub(super) const MAX_LINE: usize = 1 << 10;
/// A reply's body, or one message of a stream: far more than the list of
/// every lease of any sensible deployment.
pub(super) const MAX_BODY: usize = 64 << 20;

/// How much is read from the socket at a time.
const READ: usize = 8 << 10;

pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One connection to one member.
pub(super) struct Conn {
    io: Box<dyn Io>,
    /// Bytes read and not used yet: the rest of a head, the next chunk.
    buf: Vec<u8>,
    pub endpoint: usize,
    /// The Raft term in the last reply read on this connection, that is
    /// from its one member (mod.rs: the renewal's term check).
    pub term: Option<i64>,
}

/// What a reply's head says about its body.
pub(super) struct Head {
    pub status: u16,
    pub chunked: bool,
    length: Option<usize>,
    /// The connection may carry the next request.
    keep: bool,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A connection to `host:port`, with TLS when `tls` says so.
pub(super) async fn connect(
    host: &str,
    port: u16,
    tls: Option<&tokio_rustls::TlsConnector>,
    endpoint: usize,
) -> Res<Conn> {
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| EtcdError::Transport(format!("cannot connect to {host}:{port}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = match tls {
        Some(connector) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| EtcdError::Refused(format!("bad host name {host}: {e}")))?;
            match connector.connect(name, tcp).await {
                Ok(s) => Box::new(s),
                // A certificate problem will not heal; say so.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(EtcdError::Refused(format!(
                        "TLS with {host}:{port} failed: {e}"
                    )))
                }
                // May heal (a member closing while it restarts), but
                // also what a member that does not serve TLS does.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(EtcdError::Transport(format!(
                        "TLS with {host}:{port} failed: {e} (does it serve TLS?)"
                    )))
                }
                Err(e) => {
                    return Err(EtcdError::Transport(format!(
                        "TLS with {host}:{port} failed: {e}"
                    )))
                }
            }
        }
        None => Box::new(tcp),
    };
    Ok(Conn::new(io, endpoint))
}

/// The client side of TLS: the system's roots (which honour
/// SSL_CERT_FILE / SSL_CERT_DIR), plus the CA `cacert=` names for a
/// private cluster.
pub(super) fn tls_connector(ca_file: Option<&std::path::Path>) -> Res<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let bad = |e: &dyn std::fmt::Display| {
            EtcdError::Refused(format!("cannot read cacert {}: {e}", path.display()))
        };
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))? {
            roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
        }
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

impl Conn {
    pub fn new(io: Box<dyn Io>, endpoint: usize) -> Conn {
        Conn {
            io,
            buf: Vec::new(),
            endpoint,
            term: None,
        }
    }

    /// Send a request: its head, then its body.
    pub async fn send(&mut self, head: &str, body: &[u8]) -> io::Result<()> {
        self.io.write_all(head.as_bytes()).await?;
        self.io.write_all(body).await?;
        self.io.flush().await
    }

    /// A whole reply: status, body and whether the connection may be
    /// reused. Handles `Content-Length` and chunked bodies (the gateway
    /// streams keepalive replies, with a trailer).
    pub async fn read_response(&mut self) -> io::Result<(u16, Vec<u8>, bool)> {
        let head = self.read_head().await?;
        let mut keep = head.keep;
        let body = if head.chunked {
            let mut body = Vec::new();
            while let Some(chunk) = self.next_chunk(MAX_BODY - body.len()).await? {
                body.extend_from_slice(&chunk);
            }
            body
        } else if let Some(n) = head.length {
            if n > MAX_BODY {
                return Err(bad("reply too large"));
            }
            self.take(n).await?
        } else {
            // Neither: the body runs to the end of the connection.
            keep = false;
            let mut body = std::mem::take(&mut self.buf);
            if body.len() > MAX_BODY {
                return Err(bad("reply too large"));
            }
            let room = (MAX_BODY - body.len()) as u64;
            (&mut self.io).take(room + 1).read_to_end(&mut body).await?;
            if body.len() > MAX_BODY {
                return Err(bad("reply too large"));
            }
            body
        };
        Ok((head.status, body, keep))
    }

    /// The status line and headers, parsed once they are all in (at most
    /// [`MAX_HEAD`] bytes, [`MAX_HEADERS`] headers).
    pub async fn read_head(&mut self) -> io::Result<Head> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut reply = httparse::Response::new(&mut headers);
            let used = match reply.parse(&self.buf) {
                Ok(Status::Complete(used)) => used,
                Ok(Status::Partial) if self.buf.len() >= MAX_HEAD => {
                    return Err(bad("reply head too long"))
                }
                Ok(Status::Partial) => {
                    self.fill().await?;
                    continue;
                }
                Err(httparse::Error::TooManyHeaders) => return Err(bad("too many headers")),
                Err(e) => return Err(bad(&format!("not an HTTP reply ({e})"))),
            };
            if used > MAX_HEAD {
                return Err(bad("reply head too long"));
            }
            let status = reply.code.ok_or_else(|| bad("no status"))?;
            let mut head = Head {
                status,
                chunked: false,
                length: None,
                keep: true,
            };
            for h in reply.headers.iter() {
                let value =
                    std::str::from_utf8(h.value).map_err(|_| bad("a header is not text"))?;
                let value = value.trim();
                if h.name.eq_ignore_ascii_case("content-length") {
                    let n = value.parse().map_err(|_| bad("bad Content-Length"))?;
                    head.length = Some(n);
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    head.chunked = value.to_ascii_lowercase().contains("chunked");
                } else if h.name.eq_ignore_ascii_case("connection") {
                    head.keep = !value.eq_ignore_ascii_case("close");
                }
            }
            self.buf.drain(..used);
            return Ok(head);
        }
    }

    /// The next chunk of a chunked body, at most `room` bytes; `None` after
    /// the last one (its trailers read too).
    pub async fn next_chunk(&mut self, room: usize) -> io::Result<Option<Vec<u8>>> {
        let size = loop {
            match httparse::parse_chunk_size(&self.buf) {
                Ok(Status::Complete((used, size))) => {
                    self.buf.drain(..used);
                    break size;
                }
                Ok(Status::Partial) if self.buf.len() > MAX_LINE => {
                    return Err(bad("chunk size line too long"))
                }
                Ok(Status::Partial) => self.fill().await?,
                Err(_) => return Err(bad("bad chunk size")),
            }
        };
        if size == 0 {
            self.skip_trailers().await?;
            return Ok(None);
        }
        let size = usize::try_from(size)
            .ok()
            .filter(|n| *n <= room)
            .ok_or_else(|| bad("reply too large"))?;
        let chunk = self.take(size).await?;
        if self.take(2).await? != b"\r\n" {
            return Err(bad("a chunk does not end its line"));
        }
        Ok(Some(chunk))
    }

    /// Trailer lines after the last chunk, up to an empty one.
    async fn skip_trailers(&mut self) -> io::Result<()> {
        for _ in 0..=MAX_HEADERS {
            let end = loop {
                match self.buf.windows(2).position(|w| w == b"\r\n") {
                    Some(i) => break i,
                    None if self.buf.len() > MAX_LINE => return Err(bad("trailer too long")),
                    None => self.fill().await?,
                }
            };
            self.buf.drain(..end + 2);
            if end == 0 {
                return Ok(());
            }
        }
        Err(bad("too many trailers"))
    }

    /// The next `n` bytes, read as they arrive.
    async fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill().await?;
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Read what the socket has (up to [`READ`] bytes); the end of the
    /// connection is an error here, as every caller expects more.
    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; READ];
        let n = self.io.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A connection whose member sends `reply` (then `endless` for ever,
    /// if given) and nothing else.
    fn replying(reply: &'static [u8], endless: Option<&'static [u8]>) -> Conn {
        let (ours, mut theirs) = tokio::io::duplex(64 << 10);
        tokio::spawn(async move {
            if theirs.write_all(reply).await.is_err() {
                return;
            }
            if let Some(more) = endless {
                while theirs.write_all(more).await.is_ok() {}
            }
        });
        Conn::new(Box::new(ours), 0)
    }

    #[tokio::test]
    async fn a_reply_is_read_by_its_length_or_its_chunks() {
        let mut c = replying(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", None);
        let (status, body, keep) = c.read_response().await.expect("read");
        assert_eq!((status, body.as_slice(), keep), (200, &b"{}"[..], true));
        let mut c = replying(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              3;x=y\r\n{\"a\r\n5\r\n\":1}\n\r\n0\r\nGrpc-Trailer: z\r\n\r\n",
            None,
        );
        let (_, body, _) = c.read_response().await.expect("read");
        assert_eq!(body, b"{\"a\":1}\n");
    }

    /// What a misbehaving endpoint can send ends the read with an error,
    /// quickly and holding little: the reader never holds more than the
    /// bound plus one read.
    #[tokio::test]
    async fn a_misbehaving_endpoint_is_cut_off_within_bounds() {
        // What it is, what the member sends, then sends again for ever.
        type Case = (&'static str, &'static [u8], Option<&'static [u8]>);
        let cases: [Case; 5] = [
            (
                "an endless status line",
                b"HTTP/1.1 200 ",
                Some(b"OKOKOKOK"),
            ),
            (
                "an endless header line",
                b"HTTP/1.1 200 OK\r\nX-Long: ",
                Some(b"aaaaaaaa"),
            ),
            (
                "headers without end",
                b"HTTP/1.1 200 OK\r\n",
                Some(b"X-A: b\r\n"),
            ),
            (
                "a huge chunk size",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffff\r\n",
                Some(b"xxxxxxxx"),
            ),
            (
                "an endless chunk-size line",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1",
                Some(b"00000000"),
            ),
        ];
        for (what, reply, endless) in cases {
            let mut c = replying(reply, endless);
            let r = tokio::time::timeout(std::time::Duration::from_secs(5), c.read_response())
                .await
                .unwrap_or_else(|_| panic!("{what}: still reading"));
            let e = r.err().unwrap_or_else(|| panic!("{what}: accepted"));
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{what}: {e}");
            assert!(
                c.buf.capacity() <= MAX_HEAD + 2 * READ,
                "{what}: held {}",
                c.buf.capacity()
            );
        }
        // A declared length beyond the bound is refused before any of it.
        let mut c = replying(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
            None,
        );
        let e = c.read_response().await.expect_err("refused");
        assert!(e.to_string().contains("too large"), "{e}");
    }
}
