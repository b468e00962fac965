//! A throwaway standalone ZooKeeper server on a free port of 127.0.0.1,
//! with data in a temp dir, stopped on Drop. Started from the Debian
//! package's jar with the machine's Java; never touches a ZooKeeper the
//! machine may run on 2181.
//!
//! `tickTime` is 100 ms, so sessions from 200 ms (2 ticks) to 60 s are
//! granted as asked.
//!
//! [`Ensemble`] is a throwaway ensemble of three such servers (each its own
//! client, peer and election port), whose members a test kills, freezes
//! and restarts one by one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, start_server, TempDir};

const JAR: &str = "/usr/share/java/zookeeper.jar";

/// The `java` command line for ZooKeeper's `main`: a small heap and a quick
/// start (the client tier of the JIT), as a test server needs.
fn java(main: &str, cfg: &std::path::Path) -> Command {
    let java = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).find(|d| d.join("java").exists()))
        .map(|d| d.join("java"));
    let Some(java) = java else {
        panic!(
            "`java` not found on PATH: install the Debian package `zookeeper` (it brings a JRE)"
        );
    };
    if !std::path::Path::new(JAR).exists() {
        panic!("{JAR} not found: install the Debian package `zookeeper`");
    }
    let mut c = Command::new(java);
    c.args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
        .args(["-cp", &format!("/etc/zookeeper/conf:{JAR}")])
        .arg(main)
        .arg(cfg)
        .stdin(Stdio::null());
    c
}

/// A four-letter word to `port`; its answer, or "" when nothing answers.
pub fn four_letters(port: u16, word: &str) -> String {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut out = String::new();
    if s.write_all(word.as_bytes()).is_ok() {
        let _ = s.read_to_string(&mut out);
    }
    out
}

/// The server's role as `srvr` says: "standalone", "leader", "follower",
/// or "" while it serves no clients.
pub fn mode(port: u16) -> String {
    four_letters(port, "srvr")
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .unwrap_or_default()
        .trim()
        .to_string()
}

const COMMON: &str = "tickTime=100
minSessionTimeout=200
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=*
clientPortAddress=127.0.0.1
";

/// The server process.
pub struct Member {
    pub port: u16,
    cfg: PathBuf,
    log: PathBuf,
    main: &'static str,
    server: Option<Child>,
    frozen: bool,
}

impl Member {
    /// Up: started, not frozen, not killed.
    pub fn up(&self) -> bool {
        self.server.is_some() && !self.frozen
    }

    /// Start the server and wait until it serves (`srvr` names its mode);
    /// false when it exited or never did (a port taken after all).
    fn spawn(&mut self, limit: Duration) -> bool {
        let port = self.port;
        self.spawn_until(limit, || !mode(port).is_empty())
    }

    fn spawn_until(&mut self, limit: Duration, ready: impl FnMut() -> bool) -> bool {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let mut cmd = java(self.main, &self.cfg);
        cmd.stdout(log.try_clone().expect("log")).stderr(log);
        self.server = start_server(
            &mut cmd,
            "zookeeper",
            nix::sys::signal::Signal::SIGKILL,
            limit,
            Duration::from_millis(50),
            ready,
        );
        self.frozen = false;
        self.server.is_some()
    }

    /// SIGSTOP (a hung VM, a stuck disk) or SIGCONT the server.
    pub fn freeze(&mut self, frozen: bool) {
        super::freeze_server(self.server.as_ref(), frozen, false);
        self.frozen = frozen && self.server.is_some();
    }

    /// kill -9. ZooKeeper acknowledges a write only once it is in its
    /// fsynced log (a quorum's, in an ensemble), so nothing acknowledged
    /// is lost.
    pub fn kill(&mut self) {
        super::kill_server(&mut self.server, false);
        self.frozen = false;
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // kill -9: a throwaway server has nothing to keep.
        super::kill_server(&mut self.server, false);
    }
}

/// A standalone server.
pub struct Zk {
    /// Its data and logs, removed on Drop.
    _dir: TempDir,
    pub member: Member,
}

impl Zk {
    pub fn start() -> Zk {
        Zk::start_with("")
    }

    /// With `extra` lines of `zoo.cfg` after the common ones (a later line
    /// wins: `maxSessionTimeout=1000`).
    pub fn start_with(extra: &str) -> Zk {
        let dir = TempDir::new("zk");
        for attempt in 0..5 {
            let port = free_port();
            let data = dir.file(&format!("data-{attempt}"));
            std::fs::create_dir_all(&data).expect("data dir");
            let cfg = dir.file(&format!("zoo-{attempt}.cfg"));
            std::fs::write(
                &cfg,
                format!(
                    "{COMMON}{extra}dataDir={}\nclientPort={port}\n",
                    data.display()
                ),
            )
            .expect("zoo.cfg");
            let mut member = Member {
                port,
                cfg,
                log: dir.file(&format!("server-{port}.log")),
                main: "org.apache.zookeeper.server.ZooKeeperServerMain",
                server: None,
                frozen: false,
            };
            if member.spawn(Duration::from_secs(30)) {
                return Zk { _dir: dir, member };
            }
        }
        panic!("could not start a throwaway ZooKeeper");
    }

    pub fn port(&self) -> u16 {
        self.member.port
    }

    /// kill -9 (see [`Member::kill`]).
    pub fn crash(&mut self) {
        self.member.kill();
    }

    /// Start again after [`Zk::crash`], on the same port and data; returns
    /// once it serves.
    pub fn boot(&mut self) {
        for _ in 0..5 {
            if self.member.spawn(Duration::from_secs(30)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("could not restart the throwaway ZooKeeper");
    }

    /// SIGSTOP (or SIGCONT) the server.
    pub fn freeze(&mut self, frozen: bool) {
        self.member.freeze(frozen);
    }
}

/// A throwaway ensemble of three voting members on 127.0.0.1, each with
/// its own client port, peer and election ports (`server.N=…` lines) and
/// data dir (with its `myid`), all stopped on Drop. `tickTime` is 100 ms as
/// for the standalone server; a follower must connect and sync within
/// `initLimit` (2 s) and keep up within `syncLimit` (0.5 s), so a member
/// that hangs is dropped by the leader half a second later.
pub struct Ensemble {
    pub dir: TempDir,
    pub members: Vec<Member>,
}

impl Ensemble {
    pub fn start() -> Ensemble {
        for attempt in 0..5 {
            let dir = TempDir::new("zk-ensemble");
            let ports: Vec<(u16, u16, u16)> = (0..3)
                .map(|_| (free_port(), free_port(), free_port()))
                .collect();
            let servers: String = ports
                .iter()
                .enumerate()
                .map(|(i, (_, peer, election))| {
                    format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1)
                })
                .collect();
            let members = ports
                .iter()
                .enumerate()
                .map(|(i, &(port, _, _))| {
                    let data = dir.file(&format!("data-{i}-{attempt}"));
                    std::fs::create_dir_all(&data).expect("data dir");
                    std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
                    let cfg = dir.file(&format!("zoo-{i}-{attempt}.cfg"));
                    std::fs::write(
                        &cfg,
                        format!(
                            "{COMMON}initLimit=20\nsyncLimit=5\n{servers}dataDir={}\n\
                             clientPort={port}\n",
                            data.display()
                        ),
                    )
                    .expect("zoo.cfg");
                    Member {
                        port,
                        cfg,
                        log: dir.file(&format!("member-{i}.log")),
                        main: "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                        server: None,
                        frozen: false,
                    }
                })
                .collect();
            let mut e = Ensemble { dir, members };
            // All three at once: a member alone has no quorum and never
            // serves. Readiness is the ensemble's (wait_quorum).
            let all = (0..3).all(|i| e.members[i].spawn_until(Duration::from_secs(5), || true));
            if all && e.wait_quorum(Duration::from_secs(60)) {
                return e;
            }
            // A port taken after all, most likely: dropped (stopped), and
            // again on other ports.
        }
        panic!("could not start a throwaway ZooKeeper ensemble");
    }

    /// `zk://` with the members in this order.
    pub fn url(&self, order: &[usize]) -> String {
        let hosts: Vec<String> = order
            .iter()
            .map(|&i| format!("127.0.0.1:{}", self.members[i].port))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// The members in the order a URL listing `first` first uses.
    pub fn order(&self, first: usize) -> Vec<usize> {
        std::iter::once(first)
            .chain((0..self.members.len()).filter(|&i| i != first))
            .collect()
    }

    /// Member `i`'s role, as its `srvr` says: "leader", "follower", or ""
    /// while it serves no clients (electing, no quorum, down or frozen:
    /// a frozen member is not asked, as it would not answer).
    pub fn mode(&self, i: usize) -> String {
        let m = &self.members[i];
        if !m.up() {
            return String::new();
        }
        mode(m.port)
    }

    /// Every member that is up serves, one as the leader and the rest as
    /// its followers, and they are a quorum (at least two of three).
    pub fn wait_quorum(&self, limit: Duration) -> bool {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < limit {
            let up: Vec<usize> = (0..3).filter(|&i| self.members[i].up()).collect();
            let modes: Vec<String> = up.iter().map(|&i| self.mode(i)).collect();
            let leaders = modes.iter().filter(|m| *m == "leader").count();
            let followers = modes.iter().filter(|m| *m == "follower").count();
            if up.len() >= 2 && leaders == 1 && leaders + followers == up.len() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The member that leads now; waits for an election to finish.
    pub fn leader(&self) -> usize {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(i) = (0..3).find(|&i| self.mode(i) == "leader") {
                return i;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                panic!("no ZooKeeper member leads");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A member that is up and follows.
    pub fn follower(&self) -> usize {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(i) = (0..3).find(|&i| self.mode(i) == "follower") {
                return i;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                panic!("no ZooKeeper member follows");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGSTOP or SIGCONT member `i`.
    pub fn freeze(&mut self, i: usize, frozen: bool) {
        self.members[i].freeze(frozen);
    }

    /// kill -9 of member `i`.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Start member `i` again after [`Ensemble::kill`], with its data; it
    /// rejoins (see [`Ensemble::wait_quorum`]).
    pub fn restart(&mut self, i: usize) {
        for _ in 0..5 {
            if self.members[i].spawn_until(Duration::from_secs(5), || true) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("could not restart ZooKeeper member {i}");
    }
}

/// A minimal ZooKeeper client for the tests, on its own session: reads what
/// leaderrun wrote, makes nodes with a given ACL, and ends a session by its
/// id and password (what the lease node records), which the server then
/// treats as expired: its ephemeral nodes go, and resuming it is refused.
pub struct Client {
    s: TcpStream,
    xid: i32,
}

/// `world:anyone` with these permissions (`ZooDefs.Perms`: read 1, write 2,
/// create 4, delete 8, admin 16).
pub const READ: i32 = 1;
pub const ALL: i32 = 31;

fn put_buf(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as i32).to_be_bytes());
    out.extend_from_slice(b);
}

fn int_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl Client {
    /// A new session (10 s), or `resume`'s (id, password).
    pub fn connect(port: u16, resume: Option<(i64, &[u8])>) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to ZooKeeper");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut c = Client { s, xid: 1 };
        let (id, pw) = resume.unwrap_or((0, &[0u8; 16]));
        let mut req = Vec::new();
        req.extend_from_slice(&0i32.to_be_bytes());
        req.extend_from_slice(&0i64.to_be_bytes());
        req.extend_from_slice(&10_000i32.to_be_bytes());
        req.extend_from_slice(&id.to_be_bytes());
        put_buf(&mut req, pw);
        req.push(0);
        c.send(&req);
        let reply = c.frame();
        assert!(int_at(&reply, 4) > 0, "ZooKeeper refused the session");
        c
    }

    fn send(&mut self, body: &[u8]) {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        self.s.write_all(&f).expect("write to ZooKeeper");
    }

    fn frame(&mut self) -> Vec<u8> {
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len).expect("read from ZooKeeper");
        let mut f = vec![0u8; u32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut f).expect("read from ZooKeeper");
        f
    }

    /// Request `op` with `body`: the error code and the reply's record.
    fn call(&mut self, op: i32, body: &[u8]) -> (i32, Vec<u8>) {
        let xid = self.xid;
        self.xid += 1;
        let mut req = xid.to_be_bytes().to_vec();
        req.extend_from_slice(&op.to_be_bytes());
        req.extend_from_slice(body);
        self.send(&req);
        loop {
            let f = self.frame();
            if int_at(&f, 0) == xid {
                return (int_at(&f, 12), f[16..].to_vec());
            }
        }
    }

    /// A node's data; `None` when it does not exist.
    pub fn get(&mut self, path: &str) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        put_buf(&mut body, path.as_bytes());
        body.push(0);
        match self.call(4, &body) {
            (0, r) => {
                let n = int_at(&r, 0).max(0) as usize;
                Some(r[4..4 + n].to_vec())
            }
            (-101, _) => None,
            (e, _) => panic!("get {path}: error {e}"),
        }
    }

    /// The names of a node's children (empty when it does not exist).
    pub fn children(&mut self, path: &str) -> Vec<String> {
        let mut body = Vec::new();
        put_buf(&mut body, path.as_bytes());
        body.push(0);
        match self.call(8, &body) {
            (0, r) => {
                let mut out = Vec::new();
                let mut at = 4;
                for _ in 0..int_at(&r, 0) {
                    let n = int_at(&r, at) as usize;
                    out.push(String::from_utf8_lossy(&r[at + 4..at + 4 + n]).into_owned());
                    at += 4 + n;
                }
                out.sort();
                out
            }
            (-101, _) => Vec::new(),
            (e, _) => panic!("children of {path}: error {e}"),
        }
    }

    /// A persistent node open to anyone with `perms`.
    pub fn create(&mut self, path: &str, perms: i32) {
        let mut body = Vec::new();
        put_buf(&mut body, path.as_bytes());
        put_buf(&mut body, b"");
        body.extend_from_slice(&1i32.to_be_bytes());
        body.extend_from_slice(&perms.to_be_bytes());
        put_buf(&mut body, b"world");
        put_buf(&mut body, b"anyone");
        body.extend_from_slice(&0i32.to_be_bytes());
        let (e, _) = self.call(1, &body);
        assert_eq!(e, 0, "create {path}");
    }

    /// End this session (closeSession), as the server does at expiry.
    pub fn close(mut self) {
        let (e, _) = self.call(-11, &[]);
        assert_eq!(e, 0, "closeSession");
    }
}

/// The session a lease node names (`EPOCH\nlease\nMS\nID:HEXPASSWORD\nHOLDER`).
pub fn session_of(lease_node: &[u8]) -> (i64, Vec<u8>) {
    let text = String::from_utf8_lossy(lease_node);
    let line = text.lines().nth(3).expect("a session line");
    let (id, hex) = line.split_once(':').expect("id:password");
    let pw = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    (id.parse().expect("session id"), pw)
}

/// A hand edit, for tests that break what leaderrun wrote (on nodes open
/// to anyone: a store URL without credentials).
impl Client {
    /// Overwrite a node's data, at any version.
    pub fn set(&mut self, path: &str, data: &[u8]) {
        let mut body = Vec::new();
        put_buf(&mut body, path.as_bytes());
        put_buf(&mut body, data);
        body.extend_from_slice(&(-1i32).to_be_bytes());
        let (e, _) = self.call(5, &body);
        assert_eq!(e, 0, "set {path}");
    }
}
