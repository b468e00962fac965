//! A throwaway PgBouncer (Debian's `pgbouncer` package) in front of a
//! throwaway Postgres: its own config in a temp dir, a free port on
//! 127.0.0.1, no settings beyond the pool mode and what the README names.
//! PgBouncer refuses to run as root, so as root it runs as the user that
//! runs the test Postgres.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::pg::{as_owner, server_owner, PASSWORD};
use super::{free_port, start_server, Pg, TempDir};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Transaction,
    Session,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Transaction => "transaction",
            Mode::Session => "session",
        }
    }
}

pub struct Bouncer {
    pub port: u16,
    pub dir: TempDir,
    child: Child,
}

fn pgbouncer_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("pgbouncer"))
            .find(|p| p.exists())
    });
    on_path
        .or_else(|| Some(PathBuf::from("/usr/sbin/pgbouncer")).filter(|p| p.exists()))
        .unwrap_or_else(|| {
            panic!(
                "pgbouncer not found on PATH or in /usr/sbin: install the Debian package `pgbouncer`"
            )
        })
}

impl Bouncer {
    /// A PgBouncer in `mode` in front of `pg`, database `postgres`, user
    /// `postgres` with the test password (SCRAM on both sides).
    pub fn start(pg: &Pg, mode: Mode) -> Bouncer {
        Bouncer::start_with(pg, mode, "")
    }

    /// With `extra` lines added to the `[pgbouncer]` section.
    pub fn start_with(pg: &Pg, mode: Mode, extra: &str) -> Bouncer {
        let bin = pgbouncer_bin();
        let owner = server_owner();
        let dir = TempDir::new(&format!("pgbouncer-{}", mode.name()));
        let chown = |p: &std::path::Path| {
            if let Some((uid, gid)) = owner {
                nix::unistd::chown(
                    p,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )
                .expect("chown");
            }
        };
        chown(dir.path());
        let users = dir.file("userlist.txt");
        std::fs::write(&users, format!("\"postgres\" \"{PASSWORD}\"\n")).expect("userlist");
        chown(&users);
        for _ in 0..5 {
            let port = free_port();
            let ini = dir.file("pgbouncer.ini");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     postgres = host=127.0.0.1 port={pg_port} dbname=postgres\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = scram-sha-256\n\
                     auth_file = {users}\n\
                     pool_mode = {mode}\n\
                     logfile = {log}\n\
                     {extra}",
                    pg_port = pg.port,
                    users = users.display(),
                    mode = mode.name(),
                    log = dir.file("pgbouncer.log").display(),
                ),
            )
            .expect("pgbouncer.ini");
            chown(&ini);
            let mut cmd = Command::new(&bin);
            cmd.arg(&ini)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            as_owner(&mut cmd, owner);
            let started = start_server(
                &mut cmd,
                "pgbouncer",
                nix::sys::signal::Signal::SIGKILL,
                Duration::from_secs(15),
                Duration::from_millis(30),
                || pg.try_sql_via(port, "SELECT 1").is_ok_and(|out| out == "1"),
            );
            if let Some(child) = started {
                return Bouncer { port, dir, child };
            }
        }
        panic!(
            "could not start pgbouncer (see {})",
            dir.file("pgbouncer.log").display()
        );
    }

    /// The store URL through the pooler.
    pub fn url(&self) -> String {
        self.url_db("postgres")
    }

    pub fn url_db(&self, db: &str) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.file("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
