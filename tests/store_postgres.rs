//! What the Postgres store does beyond the contract (tests/conformance.rs
//! checks that against every store), against real, throwaway Postgres
//! servers: a blackholed connection, a table it may not create, a table
//! made by an older release, leases from another timeline, commits that
//! came back with a warning, and libpq's host lists.

use std::time::{Duration, Instant};

use crate::support::{Pg, Proxy};
use leaderrun::store::{open, ErrorKind, LeaseLock, Lock, Origin};

const L: Duration = Duration::from_secs(5);
const T: Duration = Duration::from_secs(5);

fn lock(url: &str, name: &str, holder: &str) -> Lock {
    match open(Some((url, Origin::Flag)), "leaderrun-test", T) {
        Ok(s) => s.lock(name, holder),
        Err(e) => panic!("cannot open {url}: {e}"),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn blackholed_call_returns_within_its_timeout() {
    let pg = Pg::start();
    let proxy = Proxy::start(pg.port);
    rt().block_on(async {
        let mut a = lock(&pg.url_via(proxy.port), "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        proxy.blackhole();
        let t0 = Instant::now();
        let err = a.renew(1, L, Duration::from_millis(300)).await.unwrap_err();
        let took = t0.elapsed();
        assert!(err.may_heal(), "{err:?}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(800),
            "{took:?}"
        );
        // A fresh connection is made once the link heals.
        proxy.heal();
        assert!(a.renew(1, L, T).await.unwrap());
    });
}

#[test]
fn missing_table_that_cannot_be_created_is_a_clear_fatal_error() {
    let pg = Pg::start();
    pg.sql("CREATE ROLE app LOGIN PASSWORD 'apppw'; REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    rt().block_on(async {
        let url = format!(
            "postgres://app:apppw@127.0.0.1:{}/postgres?sslmode=disable",
            pg.port
        );
        // Looking never creates it, and says it is missing.
        let err = lock(&url, "n", "a").inspect(T).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoTable, "{err:?}");
        let err = lock(&url, "n", "a").acquire(L, T).await.unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.kind(), ErrorKind::WillNotHeal, "{err:?}");
        assert!(msg.contains("table leader_lease is missing"), "{msg}");
        assert!(msg.contains("permission denied"), "{msg}");
        assert!(!msg.contains("apppw"), "{msg}");
        // Once a DBA creates it and grants access, the same role works.
        pg.sql(leaderrun::store::postgres::TABLE_SQL);
        pg.sql("GRANT SELECT, INSERT, UPDATE ON leader_lease TO app");
        assert_eq!(lock(&url, "n", "a").acquire(L, T).await.unwrap(), Some(1));
    });
}

/// The table as the previous release created it (no `timeline` column).
const PREVIOUS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    name       text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
)";

/// Upgrading in place: a table made by the previous release, used by a role
/// with SELECT, INSERT, UPDATE only, keeps working for every run without a
/// word at the default level; `leaderrun init` (by the owner) adds the
/// column, `init --print` shows how, and later writes record the timeline.
#[test]
fn a_table_made_by_the_previous_release_keeps_working_and_init_upgrades_it() {
    let pg = Pg::start();
    pg.sql(PREVIOUS_TABLE_SQL);
    pg.sql("CREATE ROLE app LOGIN PASSWORD 'apppw'; GRANT SELECT, INSERT, UPDATE ON leader_lease TO app");
    let app = format!(
        "postgres://app:apppw@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    for round in 1..=2 {
        let out = crate::support::run(crate::support::lr(&app, "job", &[], "echo $LEASE_EPOCH"));
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        assert_eq!(out.stdout.trim(), round.to_string());
        assert_eq!(out.stderr, "", "a warning on every run");
    }
    rt().block_on(async {
        let mut a = lock(&app, "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        assert!(a.renew(1, L, T).await.unwrap());
        assert!(a.release(1, Duration::ZERO, T).await.unwrap());
    });
    let mut print = crate::support::leaderrun();
    print.args(["init", "--print", "--store", &pg.url()]);
    let out = crate::support::run(print);
    assert!(
        out.stdout
            .contains("ADD COLUMN IF NOT EXISTS timeline bigint"),
        "{}",
        out.stdout
    );
    let mut init = crate::support::leaderrun();
    init.args(["init", "--store", &pg.url()]);
    let out = crate::support::run(init);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let column = "SELECT count(*) FROM information_schema.columns \
                  WHERE table_name = 'leader_lease' AND column_name = 'timeline'";
    assert_eq!(pg.sql(column), "1");
    let out = crate::support::run(crate::support::lr(&app, "job", &[], "true"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        pg.sql("SELECT epoch, timeline FROM leader_lease WHERE name = 'job'"),
        "3|1"
    );
}

/// A held lease last written on another timeline (a promoted standby's
/// view of a lease the old primary granted, by the old primary's clock) is
/// not taken even when it looks expired: it is held one more lease by this
/// server's clock, holder and epoch untouched, and taken after that.
#[test]
fn a_lease_from_another_timeline_is_adopted_not_taken() {
    let pg = Pg::start();
    let short = Duration::from_millis(1500);
    rt().block_on(async {
        let (mut a, mut b) = (lock(&pg.url(), "n", "a"), lock(&pg.url(), "n", "b"));
        assert_eq!(a.acquire(short, T).await.unwrap(), Some(1));
        // The holder renews a lease from another timeline whatever the
        // other clock's expiry says: the grant is its own.
        let foreign = "UPDATE leader_lease SET timeline = 7, expires_at = now() - interval '1 second'";
        pg.sql(foreign);
        assert!(a.renew(1, short, T).await.unwrap());
        assert!(!a.renew(2, short, T).await.unwrap(), "another grant");
        assert_eq!(pg.sql("SELECT timeline, expires_at > now() FROM leader_lease"), "1|t");
        pg.sql(foreign);
        let t0 = Instant::now();
        assert_eq!(b.acquire(short, T).await.unwrap(), None, "taken on a foreign clock");
        assert_eq!(pg.sql("SELECT holder, epoch, timeline, expires_at > now() + interval '1 second' FROM leader_lease"), "a|1|1|t");
        // The holder, if it still runs, renews the adopted lease.
        assert!(a.renew(1, short, T).await.unwrap());
        assert_eq!(b.acquire(short, T).await.unwrap(), None);
        // Once that lease has passed by this server's clock: taken.
        tokio::time::sleep(short + Duration::from_millis(50)).await;
        assert_eq!(b.acquire(short, T).await.unwrap(), Some(2));
        assert!(t0.elapsed() >= short);
        // A released lease from another timeline is free: taken at once.
        assert!(b.release(2, Duration::ZERO, T).await.unwrap());
        pg.sql("UPDATE leader_lease SET timeline = 7");
        assert_eq!(a.acquire(short, T).await.unwrap(), Some(3));
    });
}

/// A write whose commit came back with a warning is not a lease: the
/// acquire hands the lease back and fails (may heal), the renew fails.
/// (Postgres warns this way when a commit's wait for a synchronous standby
/// is cancelled; here a trigger warns, tests/failover_postgres.rs has the
/// real thing.)
#[test]
fn a_commit_that_comes_back_with_a_warning_is_not_a_lease() {
    let pg = Pg::start();
    pg.sql(leaderrun::store::postgres::TABLE_SQL);
    pg.sql(
        "CREATE FUNCTION warn() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE WARNING 'committed locally, maybe'; RETURN NEW; END $$",
    );
    let warn = "CREATE TRIGGER w BEFORE INSERT OR UPDATE ON leader_lease FOR EACH ROW EXECUTE FUNCTION warn()";
    pg.sql(warn);
    rt().block_on(async {
        let mut a = lock(&pg.url(), "n", "a");
        let err = a.acquire(L, T).await.unwrap_err();
        assert!(err.may_heal(), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("committed locally, maybe") && msg.contains("handed it back"),
            "{msg}"
        );
        assert_eq!(pg.lease_row("n"), "|1|f", "not handed back");
        pg.sql("DROP TRIGGER w ON leader_lease");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(2));
        pg.sql(warn);
        let err = a.renew(2, L, T).await.unwrap_err();
        assert!(err.may_heal(), "{err:?}");
    });
}

/// libpq's host list: hosts are tried in order, a refused one is skipped,
/// and with `target_session_attrs=read-write` a read-only server is too.
#[test]
fn a_host_list_is_tried_in_order() {
    let (ro, rw) = (Pg::start(), Pg::start());
    ro.sql("ALTER DATABASE postgres SET default_transaction_read_only = on");
    let down = crate::support::free_port();
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{down},127.0.0.1:{},127.0.0.1:{}/postgres\
         ?sslmode=disable&target_session_attrs=read-write&connect_timeout=2&application_name=mine",
        crate::support::pg::PASSWORD,
        ro.port,
        rw.port
    );
    rt().block_on(async {
        let mut s = lock(&url, "n", "a");
        assert_eq!(s.acquire(L, T).await.unwrap(), Some(1));
    });
    assert_eq!(rw.lease_row("n"), "a|1|t");
    assert!(
        ro.try_sql("SELECT 1 FROM leader_lease").is_err(),
        "written to the read-only server"
    );
    // Only read-only servers: may heal (one may be promoted), every host named.
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{down},127.0.0.1:{}/postgres\
         ?sslmode=disable&target_session_attrs=read-write",
        crate::support::pg::PASSWORD,
        ro.port
    );
    rt().block_on(async {
        let err = lock(&url, "n", "a").acquire(L, T).await.unwrap_err();
        let msg = err.to_string();
        assert!(err.may_heal(), "{err:?}");
        assert!(
            msg.contains(&format!("127.0.0.1:{down}")) && msg.contains("read-only"),
            "{msg}"
        );
        assert!(!msg.contains(crate::support::pg::PASSWORD), "{msg}");
    });
}
