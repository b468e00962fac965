//! A throwaway `redis-server` per test: a free port on 127.0.0.1, a temp dir,
//! a password (so a wrong one is testable), nothing saved to disk. Never
//! touches the machine's shared Redis on 6379.
//!
//! A replica ([`Redis::replica_of`]) follows its primary through a fault
//! proxy, so a test can stall the replication link, promote the replica
//! (`REPLICAOF NO ONE`) and kill the primary: a failover, on one machine.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, start_server, Proxy, TempDir};

pub const PASSWORD: &str = "r3dis-pw-Kx42";

pub struct Redis {
    pub port: u16,
    pub dir: TempDir,
    server: Option<Child>,
    /// Every write appended and fsynced before the reply, as docs/stores.md
    /// asks of a deployment: a crash then loses nothing acknowledged.
    durable: bool,
    /// The port this server replicates from (a proxy in front of its
    /// primary), when it was started as a replica.
    primary: Option<u16>,
    /// TLS only (no plain port), with a certificate from the test CA
    /// `dir/ca.crt`.
    tls: bool,
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
            primary: None,
            tls: false,
        };
        r.boot();
        r
    }

    /// TLS only, its certificate signed by a CA of the test's own
    /// ([`Redis::ca`]), which no system trusts.
    pub fn start_tls() -> Redis {
        need("redis-server", "redis-server");
        need("redis-cli", "redis-tools");
        let mut r = Redis {
            port: 0,
            dir: TempDir::new("redis-tls"),
            server: None,
            durable: false,
            primary: None,
            tls: true,
        };
        super::make_certs(r.dir.path());
        r.boot();
        r
    }

    /// The CA that signed a TLS server's certificate.
    pub fn ca(&self) -> std::path::PathBuf {
        self.dir.file("ca.crt")
    }

    /// A replica of the server behind `link` (a proxy in front of the
    /// primary's port), as durable as `durable` says; returned once its
    /// first synchronisation is done.
    pub fn replica_of(link: &Proxy, durable: bool) -> Redis {
        need("redis-server", "redis-server");
        let mut r = Redis {
            port: 0,
            dir: TempDir::new("redis-replica"),
            server: None,
            durable,
            primary: Some(link.port),
            tls: false,
        };
        r.boot();
        r.wait_synced();
        r
    }

    /// Until this replica's link to its primary is up and its first full
    /// synchronisation has loaded.
    pub fn wait_synced(&self) {
        super::wait_for("the replica's first sync", Duration::from_secs(20), || {
            let info = self.try_cli(&["INFO", "replication"]).unwrap_or_default();
            info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
        });
    }

    /// A field of `INFO section` (`role`, `run_id`, `connected_slaves`, …).
    pub fn info(&self, section: &str, field: &str) -> String {
        let text = self.cli(&["INFO", section]);
        text.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(&format!("{field}:"))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| panic!("no {field} in INFO {section}: {text}"))
    }

    /// `REPLICAOF NO ONE`: this replica becomes a primary, with the data it
    /// has received so far.
    pub fn promote(&self) {
        assert_eq!(self.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    }

    /// Until the primary counts `n` replicas as online and a `WAIT` for
    /// them returns at once. `connected_slaves` also counts a replica whose
    /// first sync the primary has not yet confirmed: `WAIT` ignores it, so
    /// an acquisition with `replicas=` right after the sync would rightly
    /// fail, which is not what a test that starts a healthy pair means.
    pub fn wait_replicas(&self, n: usize) {
        super::wait_for(
            "the primary to see its replicas online",
            Duration::from_secs(20),
            || {
                let info = self.try_cli(&["INFO", "replication"]).unwrap_or_default();
                let online = info
                    .lines()
                    .filter(|l| l.trim().starts_with("slave") && l.contains("state=online"))
                    .count();
                online >= n
                    && self.try_cli(&["WAIT", &n.to_string(), "100"]).ok() == Some(n.to_string())
            },
        );
    }

    /// Start (or restart, after [`Redis::crash`]) the server on its port,
    /// or on a fresh free one when it has none.
    pub fn boot(&mut self) {
        for _ in 0..5 {
            if self.port == 0 {
                self.port = free_port();
            }
            let port = self.port;
            let tls = self.tls.then(|| self.ca());
            let log =
                std::fs::File::create(self.dir.file(&format!("server-{port}.log"))).expect("log");
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1"]);
            if self.tls {
                let f = |n: &str| self.dir.file(n).display().to_string();
                cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                    .args(["--tls-cert-file", &f("server.crt")])
                    .args(["--tls-key-file", &f("server.key")])
                    .args(["--tls-ca-cert-file", &f("ca.crt")])
                    .args(["--tls-auth-clients", "no"]);
            } else {
                cmd.args(["--port", &port.to_string()]);
            }
            cmd.args(["--requirepass", PASSWORD])
                .args(["--save", ""])
                .arg("--dir")
                .arg(self.dir.path())
                .args(["--daemonize", "no", "--loglevel", "warning"])
                // A replica's first sync starts at once, not after the
                // default 5 s spent waiting for more replicas to share it.
                .args(["--repl-diskless-sync-delay", "0"]);
            if let Some(primary) = self.primary {
                cmd.args(["--replicaof", "127.0.0.1", &primary.to_string()])
                    .args(["--masterauth", PASSWORD]);
            }
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
                || cli_as(port, PASSWORD, tls.as_deref(), &["PING"]).as_deref() == Ok("PONG"),
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
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://:{PASSWORD}@127.0.0.1:{port}/0")
    }

    pub fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        cli_as(
            self.port,
            PASSWORD,
            self.tls.then(|| self.ca()).as_deref(),
            args,
        )
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

/// A primary and a replica that follows it through a fault proxy (`link`:
/// stall it to hold the replication stream back).
pub struct Pair {
    pub primary: Redis,
    pub link: Proxy,
    pub replica: Redis,
}

impl Pair {
    /// Both as durable as `durable` says; returned once the replica is in
    /// sync and the primary counts it.
    pub fn start(durable: bool) -> Pair {
        let primary = Redis::start_with(durable);
        let link = Proxy::start(primary.port);
        let replica = Redis::replica_of(&link, durable);
        primary.wait_replicas(1);
        Pair {
            primary,
            link,
            replica,
        }
    }

    /// The primary's URL asking for `replicas` acknowledgements.
    pub fn url(&self, replicas: u32) -> String {
        format!("{}?replicas={replicas}", self.primary.url())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `redis-cli` against 127.0.0.1:`port` with `password`; its reply, or the
/// server's error (redis-cli exits 0 on those too).
fn cli_as(
    port: u16,
    password: &str,
    tls: Option<&std::path::Path>,
    args: &[&str],
) -> Result<String, String> {
    let mut cmd = Command::new("redis-cli");
    if let Some(ca) = tls {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    let out = cmd
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
