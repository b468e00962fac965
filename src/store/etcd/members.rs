//! The cluster's members, as the store's calls reach them: POSTs of JSON to
//! etcd's v3 gateway (mod.rs says why not gRPC) over keep-alive
//! connections (http.rs) to the members the URL lists, with an auth token
//! when the URL names a user. Errors keep etcd's gRPC status, so that the
//! store can tell what may heal.
//!
//! # A member that hangs costs one hedge, not the call
//!
//! A member can hang without refusing anything: a frozen process (`kill
//! -STOP`, a stuck disk, a paused VM) still has its listening socket, so the
//! kernel accepts the connection and the request sits unanswered. Two rules
//! keep such a member from eating the lease's budget:
//!
//! * **Within a call, another member is asked too** ([`Members::call`]). The
//!   first attempt goes to the member that answered last; if it has not
//!   answered after [`hedge`] (a quarter of the time left, 10–500 ms), the
//!   same step goes to the next member as well, and so on. The first answer
//!   wins and the other attempts are dropped with their connections; a
//!   member that fails outright (refused, reset, `no leader`) is passed over
//!   at once. A slow member is not cut off, so a call that is merely slow
//!   still gets its answer. This repeats a step, so every step sent this way
//!   must be safe to apply more than once, in any order with its copies:
//!   mod.rs says why each one is, next to it.
//! * **A call abandoned moves the next one on.** A call is abandoned when
//!   the store's timeout fires or the elector drops its future at its own
//!   deadline (the same instant, so nothing after the `await` ever runs).
//!   The client therefore marks where a call is out *before* it waits
//!   (`out`), and clears the mark only when the call completes; the next call
//!   that finds a mark left behind starts at the member after it.
//!
//! The stream a watch reads ([`Members::stream`]) tries the members in turn
//! and follows the second rule: it is one request whose answer never ends,
//! so there is nothing to race.

use std::cell::{Cell, OnceCell, RefCell};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::api::{self, ErrorReply, Headed, Token};
use super::http::{self, Conn};

#[derive(Debug, thiserror::Error)]
pub(super) enum EtcdError {
    /// Could not connect, or the connection broke: may heal.
    #[error("{0}")]
    Transport(String),
    /// etcd's own error: a gRPC status code and message.
    #[error("{1}")]
    Status(i64, String),
    /// Our own refusal (a lease etcd cannot grant, an odd reply).
    #[error("{0}")]
    Refused(String),
}

impl EtcdError {
    /// May heal, and worth asking another member about within the same
    /// call: a member that cannot answer now says nothing about the rest.
    pub fn is_transient(&self) -> bool {
        match self {
            EtcdError::Transport(_) => true,
            // CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED,
            // INTERNAL, UNAVAILABLE ("no leader", "request timed out",
            // "leader changed", "too many requests", a member shutting
            // down).
            EtcdError::Status(code, _) => matches!(code, 1 | 4 | 8 | 10 | 13 | 14),
            EtcdError::Refused(_) => false,
        }
    }
    pub fn is_not_found(&self) -> bool {
        matches!(self, EtcdError::Status(5, _))
    }
    /// etcd's "lease already exists" (FAILED_PRECONDITION), the answer to a
    /// grant of an ID that is taken.
    pub fn is_exists(&self) -> bool {
        matches!(self, EtcdError::Status(9, m) if m.contains("already exists"))
    }
}

pub(super) type Res<T> = Result<T, EtcdError>;

/// How long an attempt may go unanswered before the next member is asked
/// too: a quarter of the time left, so that with three members listed the
/// third still gets half of it; at least 10 ms (below that, a healthy
/// member's linearizable read would be hedged routinely); at most 500 ms (a
/// healthy cluster answers in milliseconds, while a frozen member never
/// does, and `status` with its 10 s should not wait seconds on one).
pub(super) fn hedge(left: Duration) -> Duration {
    (left / 4).clamp(Duration::from_millis(10), Duration::from_millis(500))
}

/// The cluster as the URL names it: its members, how to speak to them,
/// and as whom. Shared by the store's calls and its watch.
pub(super) struct Reach {
    endpoints: Vec<(String, u16)>,
    tls: bool,
    ca_file: Option<PathBuf>,
    user: Option<(String, String)>,
    /// Made on first use (reading the roots and `cacert=`), then kept.
    connector: OnceCell<tokio_rustls::TlsConnector>,
}

impl Reach {
    pub fn new(
        endpoints: Vec<(String, u16)>,
        tls: bool,
        ca_file: Option<PathBuf>,
        user: Option<(String, String)>,
    ) -> Reach {
        Reach {
            endpoints,
            tls,
            ca_file,
            user,
            connector: OnceCell::new(),
        }
    }

    fn tls_connector(&self) -> Res<Option<tokio_rustls::TlsConnector>> {
        if !self.tls {
            return Ok(None);
        }
        if let Some(c) = self.connector.get() {
            return Ok(Some(c.clone()));
        }
        let c = http::tls_connector(self.ca_file.as_deref())?;
        Ok(Some(self.connector.get_or_init(|| c).clone()))
    }
}

/// What one call leaves for the next, whether it completed, failed or was
/// abandoned: the member to start at, and the auth token.
#[derive(Default)]
pub(super) struct Cursor {
    next: Cell<usize>,
    /// The member a call last sent an attempt to, while that call is out.
    /// A call that completes clears it; one that was abandoned leaves it
    /// behind, and the next call starts at the member after it.
    out: Cell<Option<usize>>,
    token: RefCell<Option<String>>,
}

impl Cursor {
    /// Starting where this one would, with no token or call of its own:
    /// for a watch, which must not share the calls' connection.
    pub fn detached(&self) -> Cursor {
        let c = Cursor::default();
        c.next.set(self.next.get());
        c
    }
}

/// The cluster's members as one connection of the store's session
/// (src/store/session.rs): the connection to the member that answered last,
/// kept while calls succeed, and the cursor shared with the session, which
/// outlives a connection dropped with a failed or abandoned call.
pub(super) struct Members {
    reach: Rc<Reach>,
    cursor: Rc<Cursor>,
    idle: Option<Conn>,
    /// The current call's deadline: the hedging interval is a share of
    /// what is left of it.
    deadline: Option<Instant>,
}

impl Members {
    pub fn new(reach: Rc<Reach>, cursor: Rc<Cursor>) -> Members {
        Members {
            reach,
            cursor,
            idle: None,
            deadline: None,
        }
    }

    /// The deadline of the call about to be made.
    pub fn deadline(&mut self, at: Instant) {
        self.deadline = Some(at);
    }

    /// Where the next call starts: after the member an abandoned call was
    /// left waiting on, whose connection went with it.
    fn start(&mut self) -> usize {
        if let Some(ep) = self.cursor.out.take() {
            self.cursor.next.set((ep + 1) % self.reach.endpoints.len());
            self.idle = None;
        }
        self.cursor.next.get()
    }

    fn member(
        &self,
        endpoint: usize,
        conn: Option<Conn>,
        tls: Option<tokio_rustls::TlsConnector>,
    ) -> Member {
        let (host, port) = self.reach.endpoints[endpoint].clone();
        Member {
            endpoint,
            host,
            port,
            tls,
            conn,
            user: self.reach.user.clone(),
            token: self.cursor.token.borrow().clone(),
        }
    }

    /// A completed call's member: its token and its connection are kept
    /// for the next call, which starts there.
    fn adopt(&mut self, s: Member) {
        if s.token.is_some() {
            *self.cursor.token.borrow_mut() = s.token;
        }
        self.cursor.next.set(s.endpoint);
        self.idle = s.conn;
        self.cursor.out.set(None);
    }

    /// Every member was asked and none could answer: the next call starts
    /// after the first one asked.
    fn none_answered(&mut self, first: usize) -> EtcdError {
        self.cursor.out.set(None);
        self.cursor
            .next
            .set((first + 1) % self.reach.endpoints.len());
        EtcdError::Transport("no endpoint".into())
    }

    /// One POST of `body` to `path`, on whichever member answers first
    /// (see the module's doc): only for a request that is safe to apply
    /// more than once.
    pub async fn rpc(&mut self, path: &str, body: &Value) -> Res<Value> {
        self.call(&|mut s: Member| async move {
            let r = s.call(path, body).await;
            (s, r)
        })
        .await
    }

    /// Run `op`, a step of one or more requests on one member, on the
    /// members in turn, hedged (see the module's doc): the first to finish
    /// with a result or an error that is not transient decides. Every
    /// request in `op` must be safe to apply more than once.
    pub async fn call<T, F, Fut>(&mut self, op: &F) -> Res<T>
    where
        F: Fn(Member) -> Fut,
        Fut: Future<Output = (Member, Res<T>)>,
    {
        let tls = self.reach.tls_connector()?;
        let n = self.reach.endpoints.len();
        let first = self.start();
        let mut idle = self.idle.take();
        let mut attempts: Vec<Pin<Box<Fut>>> = Vec::with_capacity(n);
        let (mut started, mut now_please) = (0, true);
        let mut hedge_at = Instant::now();
        let mut last = None;
        loop {
            let now = Instant::now();
            if started < n && (now_please || now >= hedge_at) {
                let ep = (first + started) % n;
                started += 1;
                let conn = idle.take().filter(|c| c.endpoint == ep);
                // Marked before the attempt can block: if this call is
                // dropped from here on, the next one starts after `ep`.
                self.cursor.out.set(Some(ep));
                attempts.push(Box::pin(op(self.member(ep, conn, tls.clone()))));
                let left = self
                    .deadline
                    .map_or(Duration::MAX, |d| d.saturating_duration_since(now));
                hedge_at = now + hedge(left);
                now_please = false;
                continue;
            }
            if attempts.is_empty() {
                let none = self.none_answered(first);
                return Err(last.unwrap_or(none));
            }
            let more = started < n;
            let mut timer = std::pin::pin!(tokio::time::sleep_until(hedge_at));
            let done = std::future::poll_fn(|cx| {
                for (i, a) in attempts.iter_mut().enumerate() {
                    if let Poll::Ready(r) = a.as_mut().poll(cx) {
                        return Poll::Ready(Some((i, r)));
                    }
                }
                if more && timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            let Some((i, (s, r))) = done else { continue };
            drop(attempts.swap_remove(i));
            match r {
                Err(e) if e.is_transient() => {
                    last = Some(e);
                    now_please = true;
                }
                r => {
                    // An answer, or an error no other member would change
                    // (a refused password, a missing permission, a
                    // certificate): the call is done; the attempts still
                    // out are dropped, with their connections.
                    self.adopt(s);
                    return r;
                }
            }
        }
    }

    /// A request whose reply is a stream that does not end (a watch): the
    /// members in turn, each until it fails, from where the last call
    /// left off. The call stays marked out (see the module's doc) until
    /// [`Members::settled`], which the watch calls once etcd confirmed it,
    /// so that a start abandoned while a member hangs moves the next start
    /// on.
    pub async fn stream(&mut self, path: &str, body: &Value) -> Res<Conn> {
        let tls = self.reach.tls_connector()?;
        let n = self.reach.endpoints.len();
        let first = self.start();
        let mut last = None;
        for k in 0..n {
            let ep = (first + k) % n;
            self.cursor.out.set(Some(ep));
            let mut s = self.member(ep, None, tls.clone());
            match s.open_stream(path, body).await {
                Ok(conn) => {
                    if s.token.is_some() {
                        *self.cursor.token.borrow_mut() = s.token;
                    }
                    self.cursor.next.set(ep);
                    return Ok(conn);
                }
                Err(e) if e.is_transient() => last = Some(e),
                Err(e) => {
                    self.cursor.out.set(None);
                    self.cursor.next.set(ep);
                    // A token the server no longer knows: the next start
                    // authenticates anew.
                    *self.cursor.token.borrow_mut() = None;
                    return Err(e);
                }
            }
        }
        let none = self.none_answered(first);
        Err(last.unwrap_or(none))
    }

    /// The stream [`Members::stream`] opened is confirmed: its start is no
    /// longer out.
    pub fn settled(&mut self) {
        self.cursor.out.set(None);
    }
}

/// One member, for one attempt: its connection (made on first use), and
/// the auth token as the cursor had it (or as this attempt renewed it).
pub(super) struct Member {
    endpoint: usize,
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    conn: Option<Conn>,
    user: Option<(String, String)>,
    token: Option<String>,
}

impl Member {
    /// The member's Raft term in the last reply on this session's
    /// connection; `None` before the first one (a new connection).
    pub fn term(&self) -> Option<i64> {
        self.conn.as_ref().and_then(|c| c.term)
    }

    /// One POST, authenticating first when the URL names a user and no
    /// token is held, and once more with a fresh token when the server
    /// forgot ours (a restart, its TTL).
    pub async fn call(&mut self, path: &str, body: &Value) -> Res<Value> {
        if self.user.is_some() && self.token.is_none() {
            self.authenticate().await?;
        }
        match self.post(path, body).await {
            Err(EtcdError::Status(16, m)) if self.user.is_some() && m.contains("token") => {
                self.token = None;
                self.authenticate().await?;
                self.post(path, body).await
            }
            other => other,
        }
    }

    /// A fresh token. Safe to repeat: each authentication only hands out
    /// another token.
    async fn authenticate(&mut self) -> Res<()> {
        let Some((name, password)) = self.user.clone() else {
            return Ok(());
        };
        self.token = None;
        let r = self
            .post(
                "/v3/auth/authenticate",
                &json!({"name": name, "password": password}),
            )
            .await?;
        match api::reply::<Token>(r) {
            Ok(t) => {
                self.token = Some(t.token);
                Ok(())
            }
            Err(_) => Err(EtcdError::Refused(
                "etcd returned no auth token (is authentication enabled?)".into(),
            )),
        }
    }

    async fn connect(&mut self) -> Res<Conn> {
        http::connect(&self.host, self.port, self.tls.as_ref(), self.endpoint).await
    }

    /// The request line and headers of a POST of `len` bytes of JSON.
    fn head(&self, path: &str, len: usize) -> String {
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n",
            self.host, self.port
        );
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: {t}\r\n"));
        }
        head.push_str("\r\n");
        head
    }

    async fn post(&mut self, path: &str, body: &Value) -> Res<Value> {
        // Taken out for the exchange and put back only once the reply was
        // read whole: a connection left half-read is never reused.
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect().await?,
        };
        let payload = body.to_string();
        let head = self.head(path, payload.len());
        let exchange = async {
            conn.send(&head, payload.as_bytes()).await?;
            conn.read_response().await
        };
        let (host, port) = (&self.host, self.port);
        let (status, body, keep) = exchange.await.map_err(|e| {
            EtcdError::Transport(format!("connection to {host}:{port} failed: {e}"))
        })?;
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
            let e = api::reply::<ErrorReply>(e).unwrap_or_default();
            let code = if e.code != 0 { e.code } else { e.grpc_code };
            let msg = if e.message.is_empty() {
                "etcd error".to_string()
            } else {
                e.message
            };
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
        // Every reply of etcd's carries its header: the member's Raft term
        // comes from there (the renewal's term check), and a reply without
        // one is not etcd's.
        let headed: Headed = api::reply(v.clone())?;
        conn.term = Some(headed.header.raft_term);
        if keep {
            self.conn = Some(conn);
        }
        Ok(v)
    }

    /// Send a request whose reply streams; its connection once the reply's
    /// head says the stream is there (status 200, chunked).
    async fn open_stream(&mut self, path: &str, body: &Value) -> Res<Conn> {
        if self.user.is_some() && self.token.is_none() {
            self.authenticate().await?;
        }
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect().await?,
        };
        let payload = body.to_string();
        let head = self.head(path, payload.len());
        let (host, port) = (&self.host, self.port);
        let broke = |e: std::io::Error| {
            EtcdError::Transport(format!("connection to {host}:{port} failed: {e}"))
        };
        conn.send(&head, payload.as_bytes()).await.map_err(broke)?;
        let head = conn.read_head().await.map_err(broke)?;
        if head.status != 200 {
            // An expired token, most likely (the caller forgets it).
            return Err(EtcdError::Refused(format!(
                "{path} was refused by {host}:{port} (HTTP {})",
                head.status
            )));
        }
        if !head.chunked {
            return Err(EtcdError::Refused(format!(
                "the reply to {path} from {host}:{port} is not a stream"
            )));
        }
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    /// A member that accepts connections and never answers (frozen).
    async fn silent() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((c, _)) = l.accept().await {
                kept.push(c);
            }
        });
        port
    }

    /// A member that answers every POST with an empty JSON reply at once.
    async fn answering() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut io = BufReader::new(c);
                    loop {
                        let mut len = 0;
                        let mut line = String::new();
                        loop {
                            line.clear();
                            if io.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            if let Some(v) = line.strip_prefix("Content-Length: ") {
                                len = v.trim().parse().unwrap();
                            }
                        }
                        let mut body = vec![0; len];
                        io.read_exact(&mut body).await.unwrap();
                        let reply = r#"{"header":{"raft_term":"2"}}"#;
                        let head =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", reply.len());
                        let w = io.get_mut();
                        w.write_all(head.as_bytes()).await.unwrap();
                        w.write_all(reply.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        port
    }

    fn client(ports: &[u16]) -> Members {
        let eps = ports
            .iter()
            .map(|p| ("127.0.0.1".to_string(), *p))
            .collect();
        Members::new(Rc::new(Reach::new(eps, false, None, None)), Rc::default())
    }

    /// A frozen member listed first costs one hedge, not the call: the
    /// second member is asked a quarter of the way in and answers; the
    /// next call starts there.
    #[tokio::test]
    async fn a_silent_member_is_hedged_within_the_call() {
        let mut c = client(&[silent().await, answering().await]);
        let t0 = Instant::now();
        c.deadline(t0 + Duration::from_millis(400));
        let body = json!({});
        let call = c.rpc("/v3/kv/range", &body);
        let r = tokio::time::timeout(Duration::from_secs(1), call).await;
        r.expect("in time").expect("answered");
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(took < Duration::from_millis(400), "{took:?}");
        let t0 = Instant::now();
        c.deadline(t0 + Duration::from_millis(400));
        c.rpc("/v3/kv/range", &json!({})).await.expect("answered");
        assert!(
            t0.elapsed() < Duration::from_millis(100),
            "{:?}",
            t0.elapsed()
        );
    }

    /// A call dropped while it waits on a frozen member (the elector's
    /// deadline) moves the next call to the next member, which then
    /// answers before any hedge.
    #[tokio::test]
    async fn an_abandoned_call_moves_the_next_one_on() {
        let mut c = client(&[silent().await, answering().await]);
        c.deadline(Instant::now() + Duration::from_secs(10));
        let dropped =
            tokio::time::timeout(Duration::from_millis(50), c.rpc("/v3/kv/range", &json!({})))
                .await;
        assert!(dropped.is_err(), "the silent member answered");
        let t0 = Instant::now();
        c.deadline(t0 + Duration::from_secs(10));
        c.rpc("/v3/kv/range", &json!({})).await.expect("answered");
        // A hedge would come only after 500 ms.
        assert!(
            t0.elapsed() < Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn hedging_leaves_room_for_the_next_members() {
        let ms = Duration::from_millis;
        // A renewal at --lease 3s gets 500 ms: the second member is asked
        // after 125 ms, well inside the call.
        assert_eq!(hedge(ms(500)), ms(125));
        assert_eq!(hedge(ms(50)), ms(12) + Duration::from_micros(500));
        assert_eq!(hedge(ms(10)), ms(10));
        assert_eq!(hedge(Duration::from_secs(10)), ms(500));
        assert_eq!(hedge(Duration::ZERO), ms(10));
    }
}
