//! A throwaway single-member etcd per test: free client and peer ports on
//! 127.0.0.1, a temp data dir, stopped on Drop. Never touches an etcd the
//! machine may run on 2379.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, TempDir};

pub const ROOT_PASSWORD: &str = "etcd-root-Pw93";

pub struct Etcd {
    pub port: u16,
    pub dir: TempDir,
    server: Option<Child>,
    /// Set once authentication is on: etcdctl must log in as root.
    auth: bool,
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
        need("etcd", "etcd-server");
        need("etcdctl", "etcd-client");
        let dir = TempDir::new("etcd");
        for attempt in 0..5 {
            let (port, peer) = (free_port(), free_port());
            let client_url = format!("http://127.0.0.1:{port}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = std::fs::File::create(dir.file(&format!("server-{port}.log"))).expect("log");
            let mut cmd = Command::new("etcd");
            cmd.args(["--name", "t"])
                .arg("--data-dir")
                .arg(dir.file(&format!("data-{attempt}")))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("t={peer_url}")])
                .args(["--logger", "zap", "--log-level", "warn"])
                .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .process_group(0);
            // SAFETY: prctl only; the server must not outlive a killed test.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                    Ok(())
                });
            }
            let mut child = cmd.spawn().expect("start etcd");
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // a port was taken after all: try others
                }
                if ctl(port, None, &["endpoint", "health"]).is_ok() {
                    return Etcd {
                        port,
                        dir,
                        server: Some(child),
                        auth: false,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start a throwaway etcd");
    }

    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
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
        ctl(self.port, self.auth.then_some(root.as_str()), args)
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
        if let Some(c) = &self.server {
            let sig = if frozen {
                nix::sys::signal::Signal::SIGSTOP
            } else {
                nix::sys::signal::Signal::SIGCONT
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    pub fn stop(&mut self) {
        self.freeze(false);
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn ctl(port: u16, user: Option<&str>, args: &[&str]) -> Result<String, String> {
    let mut c = Command::new("etcdctl");
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=127.0.0.1:{port}"))
        .args(["--dial-timeout=2s", "--command-timeout=5s"]);
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
