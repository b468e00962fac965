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
