//! A throwaway `redis-server` per test: a free port on 127.0.0.1, a temp dir,
//! a password (so a wrong one is testable), nothing saved to disk. Never
//! touches the machine's shared Redis on 6379.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, start_server, TempDir};

pub const PASSWORD: &str = "r3dis-pw-Kx42";

pub struct Redis {
    pub port: u16,
    pub dir: TempDir,
    server: Option<Child>,
    /// Every write appended and fsynced before the reply, as docs/stores.md
    /// asks of a deployment: a crash then loses nothing acknowledged.
    durable: bool,
}

fn need(bin: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).exists()))
        .unwrap_or(false);
    if !found {
        panic!("`{bin}` not found on PATH: install the Debian package `{package}`");
    }
}

impl Redis {
    /// Nothing saved to disk: fast, and enough for one server lifetime.
    pub fn start() -> Redis {
        Redis::start_with(false)
    }

    /// With `durable`, an append-only file fsynced on every write, so the
    /// server can be crashed and booted again (the chaos suite does).
    pub fn start_with(durable: bool) -> Redis {
        need("redis-server", "redis-server");
        need("redis-cli", "redis-tools");
        let mut r = Redis {
            port: 0,
            dir: TempDir::new("redis"),
            server: None,
            durable,
        };
        r.boot();
        r
    }

    /// Start (or restart, after [`Redis::crash`]) the server on its port,
    /// or on a fresh free one when it has none.
    pub fn boot(&mut self) {
        for _ in 0..5 {
            if self.port == 0 {
                self.port = free_port();
            }
            let port = self.port;
            let log =
                std::fs::File::create(self.dir.file(&format!("server-{port}.log"))).expect("log");
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--requirepass", PASSWORD])
                .args(["--save", ""])
                .arg("--dir")
                .arg(self.dir.path())
                .args(["--daemonize", "no", "--loglevel", "warning"]);
            if self.durable {
                cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
            } else {
                cmd.args(["--appendonly", "no"]);
            }
            cmd.stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log);
            self.server = start_server(
                &mut cmd,
                "redis-server",
                nix::sys::signal::Signal::SIGKILL,
                Duration::from_secs(20),
                Duration::from_millis(20),
                || cli_as(port, PASSWORD, &["PING"]).as_deref() == Ok("PONG"),
            );
            if self.server.is_some() {
                return;
            }
            self.port = 0;
        }
        panic!("could not start a throwaway redis-server");
    }

    /// kill -9: no shutdown save, no goodbye to clients.
    pub fn crash(&mut self) {
        self.stop();
    }

    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    /// The URL through another port (a fault proxy in front of this server).
    pub fn url_via(&self, port: u16) -> String {
        format!("redis://:{PASSWORD}@127.0.0.1:{port}/0")
    }

    pub fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        cli_as(self.port, PASSWORD, args)
    }

    /// A command as the default user; its reply as redis-cli prints it.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|e| panic!("redis-cli {args:?} failed: {e}"))
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the server.
    pub fn freeze(&self, frozen: bool) {
        super::freeze_server(self.server.as_ref(), frozen, false);
    }

    pub fn stop(&mut self) {
        super::kill_server(&mut self.server, false);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `redis-cli` against 127.0.0.1:`port` with `password`; its reply, or the
/// server's error (redis-cli exits 0 on those too).
fn cli_as(port: u16, password: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .arg("--no-auth-warning")
        .args(["-a", password])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let refused = ["ERR", "NOAUTH", "WRONGPASS", "NOPERM", "Could not connect"];
    if out.status.success() && !refused.iter().any(|p| text.starts_with(p)) {
        Ok(text)
    } else {
        Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
    }
}
