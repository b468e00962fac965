//! A throwaway standalone ZooKeeper server on a free port of 127.0.0.1,
//! with data in a temp dir, stopped on Drop. Started from the Debian
//! package's jar with the machine's Java; never touches a ZooKeeper the
//! machine may run on 2181.
//!
//! `tickTime` is 100 ms, so sessions from 200 ms (2 ticks) to 60 s are
//! granted as asked.

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
        let port = self.port;
        self.server = start_server(
            &mut cmd,
            "zookeeper",
            nix::sys::signal::Signal::SIGKILL,
            limit,
            Duration::from_millis(50),
            // Serving once `srvr` names its mode.
            || !mode(port).is_empty(),
        );
        self.server.is_some()
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
                return Zk { _dir: dir, member };
            }
        }
        panic!("could not start a throwaway ZooKeeper");
    }

    pub fn port(&self) -> u16 {
        self.member.port
    }
}
