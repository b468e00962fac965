//! Throwaway ZooKeeper servers: one standalone server, or an ensemble of
//! three, on free ports of 127.0.0.1 with data in a temp dir, stopped on
//! Drop. Started from the Debian package's jar with the machine's Java;
//! never touches a ZooKeeper the machine may run on 2181.
//!
//! `tickTime` is 100 ms, so sessions from 200 ms (2 ticks) to 60 s are
//! granted as asked, and the ensemble notices a dead leader within a
//! second (`syncLimit` 5 ticks).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, start_server, TempDir};

const JAR: &str = "/usr/share/java/zookeeper.jar";

/// The `java` command line for ZooKeeper's `main`: a small heap and a quick
/// start (the client tier of the JIT), as a test server needs.
fn java(main: &str, cfg: &std::path::Path) -> Command {
    let java = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).find(|d| d.join("java").exists()))
        .map(|d| d.join("java"));
    let Some(java) = java else {
        panic!("`java` not found on PATH: install the Debian package `zookeeper` (it brings a JRE)");
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
initLimit=50
syncLimit=5
admin.enableServer=false
4lw.commands.whitelist=*
clientPortAddress=127.0.0.1
";

/// One server of a standalone store or an ensemble.
pub struct Member {
    pub port: u16,
    cfg: PathBuf,
    log: PathBuf,
    main: &'static str,
    server: Option<Child>,
}

impl Member {
    fn spawn(&mut self, limit: Duration) -> bool {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let mut cmd = java(self.main, &self.cfg);
        cmd.stdout(log.try_clone().expect("log")).stderr(log);
        let (port, main) = (self.port, self.main);
        self.server = start_server(
            &mut cmd,
            "zookeeper",
            nix::sys::signal::Signal::SIGKILL,
            limit,
            Duration::from_millis(50),
            // A lone member of an ensemble serves nobody: started is enough.
            || main.ends_with("QuorumPeerMain") || !mode(port).is_empty(),
        );
        self.server.is_some()
    }

    pub fn up(&self) -> bool {
        self.server.is_some()
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the server.
    pub fn freeze(&self, frozen: bool) {
        super::freeze_server(self.server.as_ref(), frozen, false);
    }

    /// kill -9. ZooKeeper acknowledges a write once a quorum logged it on
    /// disk, so nothing acknowledged is lost.
    pub fn crash(&mut self) {
        super::kill_server(&mut self.server, false);
    }

    pub fn boot(&mut self) {
        for _ in 0..5 {
            if self.spawn(Duration::from_secs(30)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("could not restart a throwaway ZooKeeper server");
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.crash();
    }
}

/// A standalone server.
pub struct Zk {
    pub dir: TempDir,
    pub member: Member,
}

impl Zk {
    pub fn start() -> Zk {
        let dir = TempDir::new("zk");
        for attempt in 0..5 {
            let port = free_port();
            let data = dir.file(&format!("data-{attempt}"));
            std::fs::create_dir_all(&data).expect("data dir");
            let cfg = dir.file(&format!("zoo-{attempt}.cfg"));
            std::fs::write(
                &cfg,
                format!("{COMMON}dataDir={}\nclientPort={port}\n", data.display()),
            )
            .expect("zoo.cfg");
            let mut member = Member {
                port,
                cfg,
                log: dir.file(&format!("server-{port}.log")),
                main: "org.apache.zookeeper.server.ZooKeeperServerMain",
                server: None,
            };
            if member.spawn(Duration::from_secs(30)) {
                return Zk { dir, member };
            }
        }
        panic!("could not start a throwaway ZooKeeper");
    }

    pub fn port(&self) -> u16 {
        self.member.port
    }

    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port())
    }

    pub fn freeze(&self, frozen: bool) {
        self.member.freeze(frozen);
    }
}

/// Three servers, each a voter.
pub struct Ensemble {
    pub dir: TempDir,
    pub members: Vec<Member>,
}

impl Ensemble {
    pub fn start() -> Ensemble {
        let dir = TempDir::new("zk-ensemble");
        let ports: Vec<(u16, u16, u16)> = (0..3)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (c, peer, elect))| {
                format!("server.{}=127.0.0.1:{peer}:{elect};127.0.0.1:{c}\n", i + 1)
            })
            .collect();
        let mut members = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let data = dir.file(&format!("data-{}", i + 1));
            std::fs::create_dir_all(&data).expect("data dir");
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
            let cfg = dir.file(&format!("zoo-{}.cfg", i + 1));
            std::fs::write(
                &cfg,
                format!(
                    "{COMMON}dataDir={}\nclientPort={client}\nstandaloneEnabled=false\n{servers}",
                    data.display()
                ),
            )
            .expect("zoo.cfg");
            members.push(Member {
                port: *client,
                cfg,
                log: dir.file(&format!("server-{}.log", i + 1)),
                main: "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                server: None,
            });
        }
        for m in &mut members {
            assert!(m.spawn(Duration::from_secs(30)), "a ZooKeeper member did not start");
        }
        let e = Ensemble { dir, members };
        assert!(
            e.wait_serving(3, Duration::from_secs(60)),
            "the ZooKeeper ensemble did not form"
        );
        e
    }

    /// Wait until `n` members serve clients, one of them as leader.
    pub fn wait_serving(&self, n: usize, limit: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            let modes: Vec<String> = self.members.iter().map(|m| mode(m.port)).collect();
            let serving = modes.iter().filter(|m| !m.is_empty()).count();
            if serving >= n && modes.iter().any(|m| m == "leader") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The index of the current leader.
    pub fn leader(&self) -> usize {
        (0..self.members.len())
            .find(|&i| mode(self.members[i].port) == "leader")
            .expect("the ensemble has a leader")
    }

    /// `zk://` naming the members in `order`.
    pub fn url(&self, order: &[usize]) -> String {
        let hosts: Vec<String> = order
            .iter()
            .map(|&i| format!("127.0.0.1:{}", self.members[i].port))
            .collect();
        format!("zk://{}", hosts.join(","))
    }
}
