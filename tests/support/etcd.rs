//! A throwaway single-member etcd per test: free client and peer ports on
//! 127.0.0.1, a temp data dir, stopped on Drop. Never touches an etcd the
//! machine may run on 2379.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, start_server, TempDir};

pub const ROOT_PASSWORD: &str = "etcd-root-Pw93";

pub struct Etcd {
    pub port: u16,
    pub dir: TempDir,
    server: Option<Child>,
    /// Set once authentication is on: etcdctl must log in as root.
    auth: bool,
    /// Clients speak TLS, verified against `dir/ca.crt`.
    tls: bool,
    /// Kept for a restart after [`Etcd::crash`]: same ports, same data.
    peer: u16,
    data: std::path::PathBuf,
}

fn need(bin: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).exists()))
        .unwrap_or(false);
    if !found {
        panic!("`{bin}` not found on PATH: install the Debian package `{package}`");
    }
}

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_with(false)
    }

    /// With `tls`, the client port speaks only TLS, with a certificate for
    /// 127.0.0.1 signed by a fresh CA at `dir/ca.crt`.
    pub fn start_with(tls: bool) -> Etcd {
        need("etcd", "etcd-server");
        need("etcdctl", "etcd-client");
        let dir = TempDir::new("etcd");
        if tls {
            super::make_certs(dir.path());
        }
        let mut e = Etcd {
            port: 0,
            dir,
            server: None,
            auth: false,
            tls,
            peer: 0,
            data: std::path::PathBuf::new(),
        };
        for attempt in 0..5 {
            (e.port, e.peer) = (free_port(), free_port());
            e.data = e.dir.file(&format!("data-{attempt}"));
            if e.spawn() {
                return e;
            }
        }
        panic!("could not start a throwaway etcd");
    }

    /// Start the server on its ports and data dir; false when it exited or
    /// never became healthy (a port taken after all).
    fn spawn(&mut self) -> bool {
        let (port, peer, tls, dir) = (self.port, self.peer, self.tls, &self.dir);
        let scheme = if tls { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.file(&format!("server-{port}.log")))
            .expect("log");
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "t"])
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .args(["--logger", "zap", "--log-level", "warn"]);
        if tls {
            cmd.arg("--cert-file")
                .arg(dir.file("server.crt"))
                .arg("--key-file")
                .arg(dir.file("server.key"));
        }
        cmd.env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let ca = tls.then(|| dir.file("ca.crt"));
        self.server = start_server(
            &mut cmd,
            "etcd",
            nix::sys::signal::Signal::SIGKILL,
            Duration::from_secs(30),
            Duration::from_millis(50),
            // Health needs no login, with authentication on or off.
            || ctl(port, ca.as_deref(), None, &["endpoint", "health"]).is_ok(),
        );
        self.server.is_some()
    }

    /// kill -9. etcd acknowledges a write only once it is in its fsynced
    /// log, so nothing acknowledged is lost.
    pub fn crash(&mut self) {
        self.stop();
    }

    /// Start again after [`Etcd::crash`], on the same ports and data.
    pub fn boot(&mut self) {
        for _ in 0..5 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("could not restart the throwaway etcd");
    }

    pub fn url(&self) -> String {
        if self.tls {
            format!(
                "etcds://127.0.0.1:{}?cacert={}",
                self.port,
                self.dir.file("ca.crt").display()
            )
        } else {
            format!("etcd://127.0.0.1:{}", self.port)
        }
    }

    /// Turn authentication on: a root user with [`ROOT_PASSWORD`], and
    /// `user` with `password` allowed to read and write `leaderrun/…`.
    pub fn enable_auth(&mut self, user: &str, password: &str) {
        self.ctl(&["user", "add", &format!("root:{ROOT_PASSWORD}")]);
        self.ctl(&["user", "grant-role", "root", "root"]);
        self.ctl(&["user", "add", &format!("{user}:{password}")]);
        self.ctl(&["role", "add", "rw"]);
        self.ctl(&[
            "role",
            "grant-permission",
            "rw",
            "--prefix=true",
            "readwrite",
            "leaderrun/",
        ]);
        self.ctl(&["user", "grant-role", user, "rw"]);
        self.ctl(&["auth", "enable"]);
        self.auth = true;
    }

    pub fn try_ctl(&self, args: &[&str]) -> Result<String, String> {
        let root = format!("root:{ROOT_PASSWORD}");
        let ca = self.tls.then(|| self.dir.file("ca.crt"));
        ctl(
            self.port,
            ca.as_deref(),
            self.auth.then_some(root.as_str()),
            args,
        )
    }

    /// `etcdctl` against this server; its output.
    pub fn ctl(&self, args: &[&str]) -> String {
        self.try_ctl(args)
            .unwrap_or_else(|e| panic!("etcdctl {args:?} failed: {e}"))
    }

    /// The value of `key`, or "" when it is missing.
    pub fn get(&self, key: &str) -> String {
        self.ctl(&["get", "--print-value-only", key])
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the server.
    pub fn freeze(&self, frozen: bool) {
        super::freeze_server(self.server.as_ref(), frozen, false);
    }

    pub fn stop(&mut self) {
        super::kill_server(&mut self.server, false);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn ctl(
    port: u16,
    ca: Option<&std::path::Path>,
    user: Option<&str>,
    args: &[&str],
) -> Result<String, String> {
    let mut c = Command::new("etcdctl");
    let scheme = if ca.is_some() { "https" } else { "http" };
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={scheme}://127.0.0.1:{port}"))
        .args(["--dial-timeout=2s", "--command-timeout=5s"]);
    if let Some(ca) = ca {
        c.arg(format!("--cacert={}", ca.display()));
    }
    if let Some(u) = user {
        c.arg(format!("--user={u}"));
    }
    let out = c
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// Election timing of the throwaway clusters: etcd's defaults divided by
/// two (50 ms heartbeat, 500 ms election timeout), so that elections in the
/// failover tests take under a second. Their shortest lease is then 1 s
/// (1.5 × 500 ms, rounded up), below leaderrun's 2 s; and `--lease 3s`
/// (R = 1 s, G = 2 s) leaves G − R = 1 s between a renewal and the give-up,
/// the 1.5 × election timeout docs/stores.md asks for (750 ms), with room.
pub const ELECTION_MS: u64 = 500;

/// The election timeout the clusters run with: [`ELECTION_MS`], unless
/// `LEADERRUN_ETCD_ELECTION_MS` asks for another (at least 100), to measure
/// at etcd's default of 1000 ms, say. The heartbeat is a tenth of it, as in
/// etcd's defaults. The failover tests' bounds follow it; their "the holder
/// keeps its lease" holds only with room for an election (docs/stores.md).
pub fn election_ms() -> u64 {
    std::env::var("LEADERRUN_ETCD_ELECTION_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&ms| ms >= 100)
        .unwrap_or(ELECTION_MS)
}

/// One member of a [`Cluster`].
pub struct Member {
    pub name: String,
    pub port: u16,
    pub peer: u16,
    data: std::path::PathBuf,
    server: Option<Child>,
    frozen: bool,
}

impl Member {
    /// Up: started, not frozen, not killed or removed.
    pub fn up(&self) -> bool {
        self.server.is_some() && !self.frozen
    }
}

/// A throwaway cluster of three members on 127.0.0.1, each with its own
/// client and peer port (free ports) and data dir, all stopped on Drop.
pub struct Cluster {
    pub dir: TempDir,
    pub members: Vec<Member>,
    initial: String,
    token: String,
}

impl Cluster {
    pub fn start() -> Cluster {
        need("etcd", "etcd-server");
        need("etcdctl", "etcd-client");
        for attempt in 0..5 {
            let dir = TempDir::new("etcd-cluster");
            let members: Vec<Member> = (0..3)
                .map(|i| Member {
                    name: format!("m{i}"),
                    port: free_port(),
                    peer: free_port(),
                    data: dir.file(&format!("m{i}-{attempt}")),
                    server: None,
                    frozen: false,
                })
                .collect();
            let initial = members
                .iter()
                .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
                .collect::<Vec<_>>()
                .join(",");
            let mut c = Cluster {
                token: format!("leaderrun-test-{}-{attempt}", std::process::id()),
                dir,
                members,
                initial,
            };
            // All three at once: a member alone has no quorum and never
            // becomes healthy.
            let all = (0..3).all(|i| c.spawn(i));
            if all && c.wait_healthy(Duration::from_secs(30)) {
                return c;
            }
            // A port taken after all, most likely: dropped (stopped), and
            // again on other ports.
        }
        panic!("could not start a throwaway etcd cluster");
    }

    /// Start member `i` on its ports and data dir (a restart after
    /// [`Cluster::kill`] too: etcd then ignores the initial-cluster flags
    /// and rejoins from its data). False when it exited at once.
    fn spawn(&mut self, i: usize) -> bool {
        let m = &self.members[i];
        let client_url = format!("http://127.0.0.1:{}", m.port);
        let peer_url = format!("http://127.0.0.1:{}", m.peer);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.file(&format!("{}.log", m.name)))
            .expect("log");
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", &(election_ms() / 10).to_string()])
            .args(["--election-timeout", &election_ms().to_string()])
            .args(["--logger", "zap", "--log-level", "warn"])
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        // Readiness is the whole cluster's (wait_healthy), not one member's.
        let server = start_server(
            &mut cmd,
            "etcd",
            nix::sys::signal::Signal::SIGKILL,
            Duration::from_secs(5),
            Duration::from_millis(50),
            || true,
        );
        let m = &mut self.members[i];
        m.server = server;
        m.frozen = false;
        m.server.is_some()
    }

    /// Every member that is up answers its health check (which needs a
    /// quorum behind it).
    pub fn wait_healthy(&self, limit: Duration) -> bool {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < limit {
            let ok = self
                .members
                .iter()
                .filter(|m| m.up())
                .all(|m| ctl(m.port, None, None, &["endpoint", "health"]).is_ok());
            if ok {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// `etcd://` with the members in this order.
    pub fn url(&self, order: &[usize]) -> String {
        let hosts: Vec<String> = order
            .iter()
            .map(|&i| format!("127.0.0.1:{}", self.members[i].port))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The members in the order a URL listing `first` first uses.
    pub fn order(&self, first: usize) -> Vec<usize> {
        std::iter::once(first)
            .chain((0..self.members.len()).filter(|&i| i != first))
            .collect()
    }

    /// The member that leads now, as the members that are up say (each
    /// asked for its own status); waits for an election to finish.
    pub fn leader(&self) -> usize {
        let t0 = std::time::Instant::now();
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if !m.up() {
                    continue;
                }
                let Ok(out) = ctl(m.port, None, None, &["endpoint", "status"]) else {
                    continue;
                };
                // endpoint, ID, version, db size, is leader, …
                if out.split(", ").nth(4) == Some("true") {
                    return i;
                }
            }
            if t0.elapsed() > Duration::from_secs(20) {
                panic!("no etcd member leads");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A member that is up and does not lead.
    pub fn follower(&self) -> usize {
        let l = self.leader();
        (0..self.members.len())
            .find(|&i| i != l && self.members[i].up())
            .expect("a follower")
    }

    /// SIGSTOP (a hung VM, a stuck disk) or SIGCONT member `i`.
    pub fn freeze(&mut self, i: usize, frozen: bool) {
        super::freeze_server(self.members[i].server.as_ref(), frozen, false);
        self.members[i].frozen = frozen;
    }

    /// kill -9 of member `i`.
    pub fn kill(&mut self, i: usize) {
        super::kill_server(&mut self.members[i].server, false);
        self.members[i].frozen = false;
    }

    /// Start member `i` again after [`Cluster::kill`], with its data.
    pub fn restart(&mut self, i: usize) {
        for _ in 0..5 {
            if self.spawn(i) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("could not restart etcd member {i}");
    }

    /// `etcdctl` against the members that are up; its output.
    pub fn ctl(&self, args: &[&str]) -> String {
        self.try_ctl(args)
            .unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"))
    }

    pub fn try_ctl(&self, args: &[&str]) -> Result<String, String> {
        self.try_ctl_without(None, args)
    }

    /// `etcdctl` through every running member but `skip`.
    fn try_ctl_without(&self, skip: Option<usize>, args: &[&str]) -> Result<String, String> {
        let eps: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .filter(|&(i, m)| m.up() && Some(i) != skip)
            .map(|(_, m)| m)
            .map(|m| format!("http://127.0.0.1:{}", m.port))
            .collect();
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", eps.join(",")))
            .args(["--dial-timeout=2s", "--command-timeout=5s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("etcdctl");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    /// `etcdctl member remove` of member `i`; etcd then stops it, and it
    /// is reaped here.
    pub fn remove(&mut self, i: usize) {
        let name = self.members[i].name.clone();
        // id, status, name, peer URLs, client URLs, is learner
        let list = self.ctl(&["member", "list"]);
        let id = list
            .lines()
            .find(|l| l.split(", ").nth(2) == Some(name.as_str()))
            .and_then(|l| l.split(", ").next())
            .unwrap_or_else(|| panic!("{name} not in {list}"))
            .to_string();
        // etcd refuses to remove a member until the others have been
        // connected for a while (its strict reconfiguration check, 5 s
        // after they met), so a young cluster is asked again.
        let t0 = std::time::Instant::now();
        // Asked through the others: the removed member stops as it applies
        // its removal, and its answer may never come ("server stopped",
        // seen in CI).
        while let Err(e) = self.try_ctl_without(Some(i), &["member", "remove", &id]) {
            if !e.contains("unhealthy cluster") || t0.elapsed() > Duration::from_secs(15) {
                panic!("etcdctl member remove {id}: {e}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let t0 = std::time::Instant::now();
        let m = &mut self.members[i];
        if let Some(c) = m.server.as_mut() {
            while c.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        super::kill_server(&mut m.server, false);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in self.members.iter_mut() {
            super::kill_server(&mut m.server, false);
        }
    }
}
