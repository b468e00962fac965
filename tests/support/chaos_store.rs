//! The lease store the chaos suite puts under faults, as a parameter: which
//! server the contenders hold their lease in, and how the nemesis crashes,
//! freezes and restarts it.
//!
//! The fenced resource the children write to (`chaos_child`) is a Postgres
//! table for every store: what is under test is the lease store, and one
//! fence keeps the checker the same for all. With the Postgres store the
//! lease table and the fence share one server, as they always did, so a
//! Postgres crash also interrupts the children's writes; with the others,
//! a crash or freeze hits the lease store alone.

use std::cell::RefCell;
use std::time::Duration;

use leaderrun::store::{open, Origin, Store};

use super::chaos_child::SCHEMA;
use super::etcd::Etcd;
use super::mysql::{self, My};
use super::redis::Redis;
use super::zookeeper::Zk;
use super::Pg;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    Redis,
    Etcd,
    Mysql,
    ZooKeeper,
}

enum Server {
    /// The lease table lives in the fence's own Postgres.
    Fence,
    Redis(Redis),
    Etcd(Etcd),
    My(My),
    Zk(Zk),
}

pub struct ChaosStore {
    /// The fenced resource every child writes to.
    pub fence: Pg,
    server: Server,
    /// Reads the current holder, to aim faults at it (never to judge).
    observer: RefCell<Option<Store>>,
    rt: tokio::runtime::Runtime,
}

impl ChaosStore {
    pub fn start(kind: Kind) -> ChaosStore {
        let fence = Pg::start();
        fence.sql(SCHEMA);
        let server = match kind {
            Kind::Postgres => {
                fence.sql(leaderrun::store::postgres::TABLE_SQL);
                Server::Fence
            }
            // Durable as docs/stores.md asks: a crash must not lose
            // acknowledged acquisitions, or epochs would repeat by design.
            Kind::Redis => Server::Redis(Redis::start_with(true)),
            Kind::Etcd => Server::Etcd(Etcd::start()),
            Kind::Mysql => {
                let my = My::start();
                my.sql(leaderrun::store::mysql::TABLE_SQL);
                Server::My(my)
            }
            Kind::ZooKeeper => Server::Zk(Zk::start()),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        ChaosStore {
            fence,
            server,
            observer: RefCell::new(None),
            rt,
        }
    }

    /// The lease store's port, for the contenders' fault proxies.
    pub fn port(&self) -> u16 {
        match &self.server {
            Server::Fence => self.fence.port,
            Server::Redis(r) => r.port,
            Server::Etcd(e) => e.port,
            Server::My(m) => m.port,
            Server::Zk(z) => z.port(),
        }
    }

    /// The lease store's URL through another port (a contender's proxy).
    pub fn url_via(&self, port: u16) -> String {
        match &self.server {
            Server::Fence => self.fence.url_via(port),
            Server::Redis(r) => r.url_via(port),
            Server::Etcd(_) => format!("etcd://127.0.0.1:{port}"),
            Server::My(_) => format!("mysql://lr:{}@127.0.0.1:{port}/lr", mysql::PASSWORD),
            Server::Zk(_) => format!("zk://127.0.0.1:{port}"),
        }
    }

    /// The fenced resource's URL, for the children.
    pub fn fence_url(&self) -> String {
        self.fence.url()
    }

    /// The fault names in the summary: "postgres crash", "redis freeze", …
    pub fn crash_kind(&self) -> &'static str {
        match &self.server {
            Server::Fence => "postgres crash",
            Server::Redis(_) => "redis crash",
            Server::Etcd(_) => "etcd crash",
            Server::My(_) => "mariadb crash",
            Server::Zk(_) => "zookeeper crash",
        }
    }

    pub fn freeze_kind(&self) -> &'static str {
        match &self.server {
            Server::Fence => "postgres freeze",
            Server::Redis(_) => "redis freeze",
            Server::Etcd(_) => "etcd freeze",
            Server::My(_) => "mariadb freeze",
            Server::Zk(_) => "zookeeper freeze",
        }
    }

    /// Stop the lease store's server at once.
    pub fn crash(&mut self) {
        match &mut self.server {
            Server::Fence => self.fence.crash(),
            Server::Redis(r) => r.crash(),
            Server::Etcd(e) => e.crash(),
            Server::My(m) => m.crash(),
            Server::Zk(z) => z.crash(),
        }
    }

    /// Start it again on the same port, with the data it had.
    pub fn boot(&mut self) {
        match &mut self.server {
            Server::Fence => self.fence.boot(),
            Server::Redis(r) => r.boot(),
            Server::Etcd(e) => e.boot(),
            Server::My(m) => m.boot(),
            Server::Zk(z) => z.boot(),
        }
    }

    /// How much later than Postgres this store may let a new leader in
    /// after a fault heals, in ns. etcd, on electing a leader (after its
    /// restart too), renews every lease in full plus its election timeout
    /// (1 s), so a holder that could not renew during the election keeps
    /// its lease; and it deletes expired keys in a sweep every 500 ms. Both
    /// only delay a rival, never let one in early. On a loaded 2-core
    /// machine the election after a restart itself took over a second more
    /// (seen once: no leader 4.7 s after the heal), hence 3 s in all.
    pub fn recovery_slack(&self) -> u128 {
        match &self.server {
            Server::Etcd(_) => 3_000_000_000,
            _ => 0,
        }
    }

    /// SIGSTOP (or SIGCONT) the lease store's server.
    pub fn freeze(&mut self, frozen: bool) {
        match &mut self.server {
            Server::Fence => self.fence.freeze(frozen),
            Server::Redis(r) => r.freeze(frozen),
            Server::Etcd(e) => e.freeze(frozen),
            Server::My(m) => m.freeze(frozen),
            Server::Zk(z) => z.freeze(frozen),
        }
    }

    /// The live holder of lease `name`, asked through the store itself on
    /// a direct connection; `None` when free or when the store does not
    /// answer within half a second.
    pub fn holder(&self, name: &str) -> Option<String> {
        let mut observer = self.observer.borrow_mut();
        let s = match observer.as_mut() {
            Some(s) => s,
            None => {
                let url = self.url_via(self.port());
                let t = Duration::from_millis(500);
                let s = open(Some((&url, Origin::Flag)), "leaderrun-chaos", t).ok()?;
                observer.insert(s)
            }
        };
        let info = self
            .rt
            .block_on(s.inspect(name, Duration::from_millis(500)))
            .ok()??;
        info.is_live().then_some(info.holder?)
    }
}
