//! One function per store: a fresh, empty store on a throwaway server (or
//! file), with what the conformance suite needs to know about it. Adding a
//! store to the suite is one function here and one line in
//! `tests/conformance.rs`.

use std::any::Any;

use super::pgbouncer::{Bouncer, Mode};
use super::{etcd::Etcd, free_port, mysql::My, redis::Redis, zookeeper::Zk, Pg, TempDir};

pub struct Server {
    /// The store URL, as a user would pass it to `--store`.
    pub url: String,
    /// A URL of the same kind where nothing answers: calls must fail as
    /// "may heal". `None` for stores without a server.
    pub dead_url: Option<String>,
    /// A URL the store refuses for good (a wrong password; for a file, a
    /// path that cannot be one): calls must fail as "will not heal".
    pub refused_url: Option<String>,
    /// Keeps the server (or temp dir) alive; dropping it stops the server.
    /// Held for its `Drop` alone, never read.
    #[allow(dead_code)]
    pub guard: Box<dyn Any>,
}

pub fn postgres() -> Server {
    let pg = Pg::start();
    Server {
        url: pg.url(),
        dead_url: Some(format!(
            "postgres://postgres:pw@127.0.0.1:{}/postgres?sslmode=disable",
            free_port()
        )),
        refused_url: Some(format!(
            "postgres://postgres:Wr0ng-pw@127.0.0.1:{}/postgres?sslmode=disable",
            pg.port
        )),
        guard: Box::new(pg),
    }
}

/// Postgres behind PgBouncer in transaction pooling: every call may land
/// on another server connection.
pub fn pgbouncer_transaction() -> Server {
    pgbouncer(Mode::Transaction)
}

pub fn pgbouncer_session() -> Server {
    pgbouncer(Mode::Session)
}

fn pgbouncer(mode: Mode) -> Server {
    let pg = Pg::start();
    let b = Bouncer::start(&pg, mode);
    Server {
        url: b.url(),
        dead_url: Some(format!(
            "postgres://postgres:pw@127.0.0.1:{}/postgres?sslmode=disable",
            free_port()
        )),
        // Refused by the pooler itself, which says so with the code of a
        // broken link (08P01): it must still be told apart as will-not-heal.
        refused_url: Some(format!(
            "postgres://postgres:Wr0ng-pw@127.0.0.1:{}/postgres?sslmode=disable",
            b.port
        )),
        // Dropped in order: the pooler, then the server behind it.
        guard: Box::new((b, pg)),
    }
}

pub fn mysql() -> Server {
    let my = My::start();
    Server {
        url: my.url(),
        dead_url: Some(format!("mysql://lr:pw@127.0.0.1:{}/lr", free_port())),
        refused_url: Some(my.url_with("Wr0ng-pw")),
        guard: Box::new(my),
    }
}

pub fn sqlite() -> Server {
    let dir = TempDir::new("conf-sqlite");
    let blocker = dir.file("not-a-dir");
    std::fs::write(&blocker, "").expect("file");
    Server {
        url: format!("sqlite://{}", dir.file("leases.db").display()),
        dead_url: None,
        // A file where a directory must be: no retry will fix that.
        refused_url: Some(format!("sqlite://{}/leases.db", blocker.display())),
        guard: Box::new(dir),
    }
}

pub fn redis() -> Server {
    let r = Redis::start();
    Server {
        url: r.url(),
        dead_url: Some(format!("redis://:pw@127.0.0.1:{}/0", free_port())),
        refused_url: Some(format!("redis://:Wr0ng-pw@127.0.0.1:{}/0", r.port)),
        guard: Box::new(r),
    }
}

/// With authentication on, so that a wrong password can be refused.
pub fn etcd() -> Server {
    let mut e = Etcd::start();
    e.enable_auth("lr", "lr-Pw-5t");
    Server {
        url: format!("etcd://lr:lr-Pw-5t@127.0.0.1:{}", e.port),
        dead_url: Some(format!("etcd://lr:pw@127.0.0.1:{}", free_port())),
        refused_url: Some(format!("etcd://lr:Wr0ng-pw@127.0.0.1:{}", e.port)),
        guard: Box::new(e),
    }
}

/// With digest authentication: `leaderrun init` with the right password
/// creates the root node with that identity's ACL, so a wrong password
/// (digest takes any, it only derives another identity) meets `NoAuth`.
pub fn zookeeper() -> Server {
    let z = Zk::start();
    let url = format!("zk://lr:lr-Pw-5t@127.0.0.1:{}", z.port());
    let init = std::process::Command::new(env!("CARGO_BIN_EXE_leaderrun"))
        .args(["init", "--store", &url])
        .output()
        .expect("run leaderrun init");
    assert!(
        init.status.success(),
        "leaderrun init on ZooKeeper: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    Server {
        url,
        dead_url: Some(format!("zk://lr:pw@127.0.0.1:{}", free_port())),
        refused_url: Some(format!("zk://lr:Wr0ng-pw@127.0.0.1:{}", z.port())),
        guard: Box::new(z),
    }
}
