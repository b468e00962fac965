//! A throwaway MariaDB (or MySQL) server per test: a data directory copied
//! from a template made once by `mariadb-install-db`, started from the
//! installed `mariadbd` on a free port on 127.0.0.1 with its socket in the
//! temp dir, and killed on drop. Real password authentication (a user `lr`
//! created at start-up by `--init-file`), so a wrong password is testable.
//! Never touches the machine's own server on 3306.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, start_server, TempDir};

pub const PASSWORD: &str = "t3st-My-pw-Q7";

pub struct My {
    pub port: u16,
    pub dir: TempDir,
    server: Option<Child>,
    /// Server options beyond [`SERVER_ARGS`] (TLS, a binary log, semi-sync).
    extra: Vec<String>,
}

fn find(names: &[&str], dirs: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut all: Vec<PathBuf> = std::env::split_paths(&path).collect();
    all.extend(dirs.iter().map(PathBuf::from));
    all.iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.exists())
}

fn server_bin() -> PathBuf {
    find(&["mariadbd", "mysqld"], &["/usr/sbin", "/usr/libexec"]).unwrap_or_else(|| {
        panic!(
            "MariaDB server binary (mariadbd) not found on PATH or in /usr/sbin: \
             install the Debian package `mariadb-server`"
        )
    })
}

fn install_bin() -> PathBuf {
    find(
        &["mariadb-install-db", "mysql_install_db"],
        &["/usr/bin", "/usr/sbin"],
    )
    .unwrap_or_else(|| {
        panic!("mariadb-install-db not found: install the Debian package `mariadb-server`")
    })
}

/// `--user=root` when the tests run as root: mariadbd refuses root unless
/// told, and the data directory is ours anyway.
fn user_args() -> Vec<String> {
    if nix::unistd::geteuid().is_root() {
        vec!["--user=root".into()]
    } else {
        Vec::new()
    }
}

/// Small buffers and no fsync: a test server, not a database. Each commit
/// still reaches the OS (`flush-log-at-trx-commit=2`), so a kill -9 of the
/// server (the chaos suite's crash) loses nothing it acknowledged; only a
/// crash of the machine could.
const SERVER_ARGS: &[&str] = &[
    "--no-defaults",
    "--skip-name-resolve",
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=4M",
    "--innodb-flush-log-at-trx-commit=2",
    "--skip-log-bin",
    "--performance-schema=OFF",
];

/// The system tables, made once per build directory and mariadbd version,
/// then copied for every server (install-db takes seconds, a copy does not).
fn template() -> PathBuf {
    let bin = server_bin();
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let tag: String = version
        .split_whitespace()
        .nth(2)
        .unwrap_or("unknown")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect();
    let t = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mariadb-template-{tag}"));
    if t.join("mysql").is_dir() {
        return t;
    }
    // Made aside and renamed into place: concurrent test processes each
    // make one, the first rename wins, the others throw theirs away.
    let tmp = PathBuf::from(format!("{}.tmp-{}", t.display(), std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let out = Command::new(install_bin())
        .arg("--no-defaults")
        .arg(format!("--datadir={}", tmp.display()))
        .args(user_args())
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
            "--innodb-log-file-size=4M",
            "--innodb-buffer-pool-size=16M",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run mariadb-install-db");
    assert!(
        out.status.success(),
        "mariadb-install-db failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if std::fs::rename(&tmp, &t).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    assert!(t.join("mysql").is_dir(), "no template at {}", t.display());
    t
}

impl My {
    pub fn start() -> My {
        My::start_with(Vec::new())
    }

    /// With TLS: a CA at `dir/ca.crt` signs the server's certificate for
    /// localhost and 127.0.0.1 (see `make_certs`).
    pub fn start_tls() -> My {
        let dir = TempDir::new("my-certs");
        super::make_certs(dir.path());
        let f = |n: &str| dir.file(n).display().to_string();
        let my = My::start_with(vec![
            format!("--ssl-ca={}", f("ca.crt")),
            format!("--ssl-cert={}", f("server.crt")),
            format!("--ssl-key={}", f("server.key")),
        ]);
        for n in ["ca.crt", "server.crt", "server.key"] {
            std::fs::copy(dir.file(n), my.dir.file(n)).expect("keep the certificates");
        }
        my
    }

    /// A primary for semi-synchronous replication: a binary log (with GTIDs,
    /// as MariaDB always has), server id 1, semi-sync on as the primary.
    pub fn start_primary() -> My {
        My::start_with(vec![
            "--log-bin=primary-bin".into(),
            "--server-id=1".into(),
            "--rpl-semi-sync-master-enabled=ON".into(),
        ])
    }

    /// A semi-sync replica of `primary`, replicating from the start of its
    /// binary log, connected (the primary counts it) before this returns.
    pub fn start_replica(primary: &My) -> My {
        let replica = My::start_with(vec![
            "--server-id=2".into(),
            "--rpl-semi-sync-slave-enabled=ON".into(),
        ]);
        replica.sql(&format!(
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, \
             MASTER_USER = 'lr', MASTER_PASSWORD = '{PASSWORD}', MASTER_USE_GTID = slave_pos; \
             START SLAVE",
            primary.port
        ));
        primary.wait_for_replicas(1);
        replica
    }

    /// Until the primary counts `n` semi-sync replicas.
    pub fn wait_for_replicas(&self, n: u32) {
        super::wait_for(
            &format!("{n} semi-sync replica(s)"),
            Duration::from_secs(20),
            || {
                self.try_sql("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_clients'")
                    .is_ok()
                    && self.status("Rpl_semi_sync_master_clients") == n.to_string()
            },
        );
    }

    /// A global status variable's value.
    pub fn status(&self, name: &str) -> String {
        self.sql(&format!(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME = '{}'",
            name.to_uppercase()
        ))
    }

    pub fn start_with(extra: Vec<String>) -> My {
        let template = template();
        let dir = TempDir::new("my");
        let data = dir.path().join("data");
        let out = Command::new("cp")
            .arg("-a")
            .arg(&template)
            .arg(&data)
            .output()
            .expect("cp");
        assert!(out.status.success(), "copy template: {:?}", out);
        std::fs::write(
            dir.path().join("init.sql"),
            format!(
                "CREATE USER IF NOT EXISTS 'lr'@'%' IDENTIFIED BY '{PASSWORD}';
                 GRANT ALL ON *.* TO 'lr'@'%' WITH GRANT OPTION;
                 CREATE DATABASE IF NOT EXISTS lr;\n"
            ),
        )
        .expect("init.sql");
        let mut my = My {
            port: 0,
            dir,
            server: None,
            extra,
        };
        my.boot();
        my
    }

    /// Start (or restart, after [`My::crash`]) the server on its port, or
    /// on a fresh free one when it has none.
    pub fn boot(&mut self) {
        let bin = server_bin();
        for _ in 0..5 {
            if self.port == 0 {
                self.port = free_port();
            }
            let d = self.dir.path();
            let log = d.join(format!("server-{}.log", self.port));
            let mut cmd = Command::new(&bin);
            cmd.args(SERVER_ARGS)
                .arg(format!("--datadir={}", d.join("data").display()))
                .args(user_args())
                .arg(format!("--port={}", self.port))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--socket={}", d.join("sock").display()))
                .arg(format!("--pid-file={}", d.join("pid").display()))
                .arg(format!("--log-error={}", log.display()))
                .arg(format!("--init-file={}", d.join("init.sql").display()))
                .args(&self.extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            self.server = start_server(
                &mut cmd,
                "mariadbd",
                nix::sys::signal::Signal::SIGKILL,
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
            "could not start a throwaway mariadbd (see {})",
            self.dir.path().display()
        );
    }

    pub fn url(&self) -> String {
        self.url_with(PASSWORD)
    }

    pub fn url_with(&self, password: &str) -> String {
        format!("mysql://lr:{password}@127.0.0.1:{}/lr", self.port)
    }

    /// Run statements as `lr`; the first column of the first row as text
    /// ("" when there is none). On a thread of its own, so a test may call
    /// it from inside its own runtime.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        std::thread::scope(|s| {
            s.spawn(|| self.try_sql_here(sql))
                .join()
                .unwrap_or_else(|_| Err("sql thread panicked".into()))
        })
    }

    fn try_sql_here(&self, sql: &str) -> Result<String, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            use sqlx::{Connection, Row};
            let mut c = tokio::time::timeout(
                Duration::from_secs(5),
                sqlx::MySqlConnection::connect(&self.url()),
            )
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| e.to_string())?;
            let mut first = String::new();
            for stmt in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                let rows = sqlx::query(stmt)
                    .fetch_all(&mut c)
                    .await
                    .map_err(|e| e.to_string())?;
                if let Some(r) = rows.first() {
                    first = r
                        .try_get::<String, _>(0)
                        .or_else(|_| r.try_get::<i64, _>(0).map(|v| v.to_string()))
                        .unwrap_or_default();
                }
            }
            Ok(first)
        })
    }

    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|e| panic!("sql {sql:?} failed: {e}"))
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the server.
    pub fn freeze(&self, frozen: bool) {
        super::freeze_server(self.server.as_ref(), frozen, true);
    }

    /// Kill the server at once, like a crash.
    pub fn crash(&mut self) {
        super::kill_server(&mut self.server, true);
    }
}

impl Drop for My {
    fn drop(&mut self) {
        self.crash();
    }
}
