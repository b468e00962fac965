//! A throwaway Postgres cluster per test: `initdb` into a temp dir, started on
//! a free port on 127.0.0.1 as an unprivileged user when the tests run as root
//! (initdb refuses root). Password auth over TCP, so wrong-password tests are
//! real. Never touches the machine's own Postgres.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, start_server, TempDir};

pub const PASSWORD: &str = "t3st-pw-Zq81";

pub struct Pg {
    pub port: u16,
    pub dir: TempDir,
    bin: PathBuf,
    server: Option<Child>,
    owner: Option<(u32, u32)>,
    /// Run with `synchronous_commit = on` (a primary whose commits may wait
    /// for a synchronous standby) instead of the fast `off`.
    durable: bool,
    /// Extra environment for the server (libfaketime for a clock ahead).
    env: Vec<(String, String)>,
}

/// Where the server binaries are: PATH first, then Debian's versioned dirs.
fn pg_bin() -> PathBuf {
    if let Some(p) = find_on_path("initdb") {
        if let Some(dir) = p.parent() {
            if dir.join("postgres").exists() {
                return dir.to_path_buf();
            }
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("postgres").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| {
        panic!(
            "Postgres server binaries (initdb, postgres) not found on PATH or in \
             /usr/lib/postgresql/*/bin: install the Debian package `postgresql`"
        )
    })
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// uid/gid to run the server as: ourselves, or `postgres`/`nobody` as root.
pub fn server_owner() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    for name in ["postgres", "nobody"] {
        if let Ok(Some(u)) = nix::unistd::User::from_name(name) {
            return Some((u.uid.as_raw(), u.gid.as_raw()));
        }
    }
    panic!("running as root and neither user `postgres` nor `nobody` exists to run initdb");
}

impl Pg {
    pub fn start() -> Pg {
        Pg::start_with(false)
    }

    /// With `tls`, the server also speaks TLS with a fresh self-signed
    /// certificate for `localhost`, signed by a CA at `dir/ca.crt`.
    pub fn start_with(tls: bool) -> Pg {
        Pg::start_opts(tls, false)
    }

    fn start_opts(tls: bool, durable: bool) -> Pg {
        let bin = pg_bin();
        let owner = server_owner();
        let dir = TempDir::new("pg");
        if let Some((uid, gid)) = owner {
            nix::unistd::chown(
                dir.path(),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .expect("chown temp dir");
        }
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD).expect("write pwfile");
        if let Some((uid, gid)) = owner {
            let _ = nix::unistd::chown(
                &pwfile,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            );
        }
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_owner(&mut initdb, owner);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if tls {
            let (crt, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
            super::make_certs(dir.path());
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                .expect("chmod key");
            if let Some((uid, gid)) = owner {
                for f in [&crt, &key] {
                    nix::unistd::chown(
                        f,
                        Some(nix::unistd::Uid::from_raw(uid)),
                        Some(nix::unistd::Gid::from_raw(gid)),
                    )
                    .expect("chown cert");
                }
            }
            let conf = format!(
                "\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                crt.display(),
                key.display()
            );
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("postgresql.conf"))
                .expect("postgresql.conf");
            std::io::Write::write_all(&mut f, conf.as_bytes()).expect("write conf");
        }
        let mut pg = Pg {
            port: 0,
            dir,
            bin,
            server: None,
            owner,
            durable,
            env: Vec::new(),
        };
        pg.boot();
        pg
    }

    /// A primary for streaming standbys: `synchronous_commit = on`, so that
    /// its commits wait for a standby once `synchronous_standby_names` names
    /// one ([`Pg::make_sync`]).
    pub fn start_primary() -> Pg {
        Pg::start_opts(false, true)
    }

    /// A streaming standby of `primary`, made by `pg_basebackup -R` into a
    /// data dir of its own, on its own port, reaching the primary through
    /// `upstream` (a fault proxy's port, so the link can be cut), named `s1`
    /// for `synchronous_standby_names`. With `clock_ahead` (`"+3s"`) it runs
    /// under libfaketime with its clock that far ahead of the host's.
    pub fn standby_of(primary: &Pg, upstream: u16, clock_ahead: Option<&str>) -> Pg {
        let owner = primary.owner;
        let dir = TempDir::new("pg-standby");
        if let Some((uid, gid)) = owner {
            nix::unistd::chown(
                dir.path(),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .expect("chown temp dir");
        }
        let data = dir.path().join("data");
        let mut bb = Command::new(primary.bin.join("pg_basebackup"));
        bb.arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-U", "postgres", "-R", "-X", "stream"])
            .args(["--no-sync", "-c", "fast"])
            .arg("-p")
            .arg(primary.port.to_string())
            .env("PGPASSWORD", PASSWORD)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_owner(&mut bb, owner);
        let out = bb.output().expect("run pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // -R wrote standby.signal and a primary_conninfo to the primary's
        // own port; a later line wins: through the proxy, with a name.
        let conninfo = format!(
            "\nprimary_conninfo = 'host=127.0.0.1 port={upstream} user=postgres \
             password={PASSWORD} application_name=s1'\n"
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.auto.conf"))
            .expect("postgresql.auto.conf");
        std::io::Write::write_all(&mut f, conninfo.as_bytes()).expect("write conf");
        let env = match clock_ahead {
            None => Vec::new(),
            Some(off) => vec![
                (
                    "LD_PRELOAD".to_string(),
                    super::libfaketime().display().to_string(),
                ),
                ("FAKETIME".to_string(), off.to_string()),
                // Only the wall clock: timeouts and waits keep their length.
                ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
            ],
        };
        let mut pg = Pg {
            port: 0,
            dir,
            bin: primary.bin.clone(),
            server: None,
            owner,
            durable: true,
            env,
        };
        pg.boot();
        pg
    }

    /// Make the standby `s1` synchronous (`synchronous_standby_names`, a
    /// reload), and wait until the primary reports it so.
    pub fn make_sync(&self) {
        self.sql("ALTER SYSTEM SET synchronous_standby_names = 's1'");
        self.sql("SELECT pg_reload_conf()");
        super::wait_for("a synchronous standby", Duration::from_secs(30), || {
            self.try_sql("SELECT sync_state FROM pg_stat_replication WHERE application_name = 's1'")
                .is_ok_and(|s| s == "sync")
        });
    }

    /// Wait until standby `s1` streams from this primary and has replayed
    /// everything written so far.
    pub fn wait_replayed(&self) {
        let lsn = self.sql("SELECT pg_current_wal_lsn()");
        super::wait_for("the standby to replay", Duration::from_secs(30), || {
            self.try_sql(&format!(
                "SELECT replay_lsn >= '{lsn}' FROM pg_stat_replication WHERE application_name = 's1' AND state = 'streaming'"
            ))
            .is_ok_and(|s| s == "t")
        });
    }

    /// Promote this standby (`pg_ctl promote`), waiting until it takes
    /// writes.
    pub fn promote(&self) {
        let mut c = Command::new(self.bin.join("pg_ctl"));
        c.arg("promote")
            .arg("-w")
            .arg("-D")
            .arg(self.data_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_owner(&mut c, self.owner);
        let out = c.output().expect("run pg_ctl promote");
        assert!(
            out.status.success(),
            "pg_ctl promote failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        super::wait_for(
            "the promoted standby to take writes",
            Duration::from_secs(30),
            || {
                self.try_sql("SELECT pg_is_in_recovery()")
                    .is_ok_and(|s| s == "f")
            },
        );
    }

    /// Start (or restart) the server on a fresh free port when it has none.
    pub fn boot(&mut self) {
        for _ in 0..5 {
            if self.port == 0 {
                self.port = free_port();
            }
            let log =
                std::fs::File::create(self.dir.path().join(format!("server-{}.log", self.port)))
                    .expect("server log");
            let mut cmd = Command::new(self.bin.join("postgres"));
            cmd.arg("-D")
                .arg(self.dir.path().join("data"))
                .arg("-p")
                .arg(self.port.to_string())
                .arg("-k")
                .arg(self.dir.path())
                .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
                .args(["-c", "full_page_writes=off"])
                .args(if self.durable {
                    [].as_slice()
                } else {
                    ["-c", "synchronous_commit=off"].as_slice()
                })
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log);
            as_owner(&mut cmd, self.owner);
            // Its own process group (start_server), so the whole server
            // (postmaster and backends) can be frozen at once.
            self.server = start_server(
                &mut cmd,
                "postgres",
                nix::sys::signal::Signal::SIGQUIT,
                Duration::from_secs(30),
                Duration::from_millis(30),
                || self.try_sql("SELECT 1").is_ok(),
            );
            if self.server.is_some() {
                return;
            }
            self.port = 0;
        }
        panic!(
            "could not start a throwaway postgres (see {})",
            self.dir.path().display()
        );
    }

    /// Stop the server at once, like a crash (`-m immediate`).
    /// A postmaster that has not gone 3 s after SIGQUIT (seen once: a
    /// minute, with a standby's link blackholed) is killed with its whole
    /// process group.
    pub fn crash(&mut self) {
        self.freeze(false);
        if let Some(mut c) = self.server.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT);
            let t0 = std::time::Instant::now();
            while matches!(c.try_wait(), Ok(None)) {
                if t0.elapsed() > Duration::from_secs(3) {
                    // Not reaped yet, so the group id is still its own.
                    let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Kill the whole server at once (SIGKILL to its process group), as a
    /// power cut would: nothing of it runs a moment later.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.server.take() {
            // Not reaped yet, so the group id is still the postmaster's.
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = c.wait();
        }
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the whole server.
    pub fn freeze(&self, frozen: bool) {
        super::freeze_server(self.server.as_ref(), frozen, true);
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    pub fn url_via(&self, port: u16) -> String {
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/postgres?sslmode=disable")
    }

    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        self.try_sql_via(self.port, sql)
    }

    /// As `try_sql`, to another port (a pooler or a proxy in front).
    pub fn try_sql_via(&self, port: u16, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-A",
                "-t",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
            ])
            .arg("-p")
            .arg(port.to_string())
            .args(["-d", "postgres", "-c", sql])
            .env("PGPASSWORD", PASSWORD)
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    /// Run SQL as the superuser over a direct connection; rows as text.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|e| panic!("sql {sql:?} failed: {e}"))
    }

    /// `holder|epoch|live` of a lease, or "" when there is no row.
    pub fn lease_row(&self, name: &str) -> String {
        self.sql(&format!(
            "SELECT coalesce(holder,''), epoch, expires_at > now() FROM leader_lease WHERE name = '{name}'"
        ))
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn bin(&self) -> &Path {
        &self.bin
    }
}

pub fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
        cmd.env("HOME", "/tmp");
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        self.crash();
    }
}
