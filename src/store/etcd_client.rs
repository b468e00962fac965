//! A small HTTP/1.1 client for etcd's v3 JSON gateway (etcd.rs says why
//! not gRPC): POSTs of JSON on one keep-alive connection, to the first of
//! several endpoints that answers, over TCP or TLS (`etcds://`), with an
//! auth token when the URL names a user. Errors keep etcd's gRPC status, so
//! that the store can tell what may heal.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

/// A reply larger than this is not from an etcd we understand.
pub(super) const MAX_BODY: usize = 64 << 20;

pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub(super) struct Conn {
    pub io: BufReader<Box<dyn Io>>,
    pub endpoint: usize,
}

#[derive(Debug)]
pub(super) enum EtcdError {
    /// Could not connect, or the connection broke: may heal.
    Transport(String),
    /// etcd's own error: a gRPC status code and message.
    Status(i64, String),
    /// Our own refusal (a lease etcd cannot grant, an odd reply).
    Refused(String),
}

impl EtcdError {
    pub fn is_transient(&self) -> bool {
        match self {
            EtcdError::Transport(_) => true,
            // CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED,
            // INTERNAL, UNAVAILABLE ("no leader", "request timed out",
            // "too many requests", a member shutting down).
            EtcdError::Status(code, _) => matches!(code, 1 | 4 | 8 | 10 | 13 | 14),
            EtcdError::Refused(_) => false,
        }
    }
    pub fn is_not_found(&self) -> bool {
        matches!(self, EtcdError::Status(5, _))
    }
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Transport(m) | EtcdError::Refused(m) => f.write_str(m),
            EtcdError::Status(_, m) => f.write_str(m),
        }
    }
}

pub(super) type Res<T> = Result<T, EtcdError>;

/// One cluster, as the URL names it, and what is learnt from it: the
/// connection in use, the endpoint to try first, the auth token.
pub(super) struct Client {
    endpoints: Vec<(String, u16)>,
    tls: bool,
    ca_file: Option<std::path::PathBuf>,
    connector: Option<tokio_rustls::TlsConnector>,
    user: Option<(String, String)>,
    token: Option<String>,
    conn: Option<Conn>,
    next: usize,
}

impl Client {
    pub fn new(
        endpoints: Vec<(String, u16)>,
        tls: bool,
        ca_file: Option<std::path::PathBuf>,
        user: Option<(String, String)>,
    ) -> Client {
        Client {
            endpoints,
            tls,
            ca_file,
            connector: None,
            user,
            token: None,
            conn: None,
            next: 0,
        }
    }

    /// The same cluster and credentials, with no connection or token of
    /// its own yet: for a watch, which must not share the call connection.
    pub fn fresh(&self) -> Client {
        Client {
            endpoints: self.endpoints.clone(),
            tls: self.tls,
            ca_file: self.ca_file.clone(),
            connector: self.connector.clone(),
            user: self.user.clone(),
            token: None,
            conn: None,
            next: self.next,
        }
    }

    /// A call was abandoned (its request may still be in flight on the
    /// dropped connection): the next one starts at the next endpoint.
    pub fn skip_endpoint(&mut self) {
        self.next = (self.next + 1) % self.endpoints.len();
    }

    /// Authenticate first when the URL names a user and no token is held.
    pub async fn ensure_token(&mut self) -> Res<()> {
        if self.user.is_some() && self.token.is_none() {
            self.authenticate().await?;
        }
        Ok(())
    }

    /// The token was refused (expired, or the server restarted): the next
    /// call authenticates anew.
    pub fn forget_token(&mut self) {
        self.token = None;
    }

    /// The request line and headers of a POST of `len` bytes of JSON.
    pub fn head(&self, path: &str, conn: &Conn, len: usize) -> String {
        let (host, port) = &self.endpoints[conn.endpoint];
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n"
        );
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: {t}\r\n"));
        }
        head.push_str("\r\n");
        head
    }

    fn tls_connector(&mut self) -> Res<tokio_rustls::TlsConnector> {
        if let Some(c) = &self.connector {
            return Ok(c.clone());
        }
        // The system's roots (which honour SSL_CERT_FILE / SSL_CERT_DIR),
        // plus the CA named by `cacert=` for a private cluster.
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if let Some(path) = &self.ca_file {
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
        let c = tokio_rustls::TlsConnector::from(Arc::new(config));
        self.connector = Some(c.clone());
        Ok(c)
    }

    /// A connection to the first endpoint that accepts one, starting at
    /// `next`: nothing was sent yet, so moving on is always safe.
    pub async fn connect(&mut self) -> Res<Conn> {
        let n = self.endpoints.len();
        let mut last = String::new();
        for i in 0..n {
            let idx = (self.next + i) % n;
            let (host, port) = self.endpoints[idx].clone();
            let tcp = match TcpStream::connect((host.as_str(), port)).await {
                Ok(t) => t,
                Err(e) => {
                    last = format!("cannot connect to {host}:{port}: {e}");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let io: Box<dyn Io> = if self.tls {
                let connector = self.tls_connector()?;
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| EtcdError::Refused(format!("bad host name {host}: {e}")))?;
                match connector.connect(name, tcp).await {
                    Ok(s) => Box::new(s),
                    Err(e) => {
                        // A certificate problem will not heal; say so.
                        if e.kind() == std::io::ErrorKind::InvalidData {
                            return Err(EtcdError::Refused(format!(
                                "TLS with {host}:{port} failed: {e}"
                            )));
                        }
                        last = format!("TLS with {host}:{port} failed: {e}");
                        continue;
                    }
                }
            } else {
                Box::new(tcp)
            };
            self.next = idx;
            return Ok(Conn {
                io: BufReader::new(io),
                endpoint: idx,
            });
        }
        Err(EtcdError::Transport(last))
    }

    /// One POST of `body` to `path`; etcd's JSON reply, or its error.
    pub async fn rpc(&mut self, path: &str, body: &Value) -> Res<Value> {
        if self.user.is_some() && self.token.is_none() && path != "/v3/auth/authenticate" {
            self.authenticate().await?;
        }
        match self.post(path, body).await {
            // A token the server forgot (restart, TTL): once more, fresh.
            Err(EtcdError::Status(16, m)) if self.user.is_some() && m.contains("token") => {
                self.token = None;
                self.authenticate().await?;
                self.post(path, body).await
            }
            other => other,
        }
    }

    async fn authenticate(&mut self) -> Res<()> {
        let Some((name, password)) = self.user.clone() else {
            return Ok(());
        };
        let r = self
            .post(
                "/v3/auth/authenticate",
                &json!({"name": name, "password": password}),
            )
            .await?;
        match r.get("token").and_then(Value::as_str) {
            Some(t) => {
                self.token = Some(t.to_string());
                Ok(())
            }
            None => Err(EtcdError::Refused(
                "etcd returned no auth token (is authentication enabled?)".into(),
            )),
        }
    }

    async fn post(&mut self, path: &str, body: &Value) -> Res<Value> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect().await?,
        };
        let (host, port) = &self.endpoints[conn.endpoint];
        let payload = body.to_string();
        let head = self.head(path, &conn, payload.len());
        let exchange = async {
            let w = conn.io.get_mut();
            w.write_all(head.as_bytes()).await?;
            w.write_all(payload.as_bytes()).await?;
            w.flush().await?;
            read_response(&mut conn.io).await
        };
        let (status, body, keep) = match exchange.await {
            Ok(r) => r,
            Err(e) => {
                // The request may have been applied: not repeated here, but
                // the next call starts with the next endpoint.
                self.next = (conn.endpoint + 1) % self.endpoints.len();
                return Err(EtcdError::Transport(format!(
                    "connection to {host}:{port} failed: {e}"
                )));
            }
        };
        let endpoint = conn.endpoint;
        if keep {
            self.conn = Some(conn);
        }
        let parsed: Option<Value> = serde_json::Deserializer::from_slice(&body)
            .into_iter::<Value>()
            .next()
            .and_then(Result::ok);
        // A streamed reply (keepalive) wraps its message in `result`, or
        // carries an `error` object instead.
        let (v, err) = match parsed {
            Some(Value::Object(mut m)) => {
                if let Some(r) = m.remove("result") {
                    (r, None)
                } else if let Some(Value::Object(e)) = m.remove("error") {
                    (Value::Null, Some(Value::Object(e)))
                } else if m.contains_key("code") && (status != 200 || m.contains_key("message")) {
                    (Value::Null, Some(Value::Object(m)))
                } else {
                    (Value::Object(m), None)
                }
            }
            _ => (Value::Null, None),
        };
        if let Some(e) = err {
            let code = int(&e, "code");
            let msg = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("etcd error")
                .to_string();
            if matches!(code, 14 | 4) {
                // No leader, or a member too busy: ask another next time.
                self.conn = None;
                self.next = (endpoint + 1) % self.endpoints.len();
            }
            return Err(EtcdError::Status(code, msg));
        }
        if status != 200 || v.is_null() {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            let e = format!("HTTP {status} from {host}:{port}: {text}");
            return Err(if status >= 500 || status == 0 {
                EtcdError::Transport(e)
            } else {
                EtcdError::Refused(e)
            });
        }
        Ok(v)
    }
}

/// An int64 field: the gateway writes them as strings and leaves out zeros.
pub(super) fn int(v: &Value, key: &str) -> i64 {
    match v.get(key) {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// Status, body and whether the connection may be reused. Handles
/// `Content-Length` and chunked bodies (the gateway streams keepalive
/// replies, with a trailer).
async fn read_response(io: &mut BufReader<Box<dyn Io>>) -> std::io::Result<(u16, Vec<u8>, bool)> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut line = String::new();
    if io.read_line(&mut line).await? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("not an HTTP reply"))?;
    let (mut length, mut chunked, mut keep) = (None, false, true);
    loop {
        line.clear();
        if io.read_line(&mut line).await? == 0 {
            return Err(bad("reply ended in its headers"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                length = Some(v.parse::<usize>().map_err(|_| bad("bad Content-Length"))?);
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.to_ascii_lowercase().contains("chunked");
            } else if k.eq_ignore_ascii_case("connection") {
                keep = !v.eq_ignore_ascii_case("close");
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            io.read_line(&mut line).await?;
            let size = line.trim_end().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad("bad chunk size"))?;
            if size == 0 {
                // Trailers, up to an empty line.
                loop {
                    line.clear();
                    if io.read_line(&mut line).await? == 0 || line.trim_end().is_empty() {
                        break;
                    }
                }
                break;
            }
            if body.len() + size > MAX_BODY {
                return Err(bad("reply too large"));
            }
            let start = body.len();
            body.resize(start + size, 0);
            io.read_exact(&mut body[start..]).await?;
            let mut crlf = [0u8; 2];
            io.read_exact(&mut crlf).await?;
        }
    } else if let Some(n) = length {
        if n > MAX_BODY {
            return Err(bad("reply too large"));
        }
        body.resize(n, 0);
        io.read_exact(&mut body).await?;
    } else {
        // Neither: the body runs to the end of the connection.
        io.take(MAX_BODY as u64).read_to_end(&mut body).await?;
        keep = false;
    }
    Ok((status, body, keep))
}
