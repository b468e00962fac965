//! The store contract (src/store/mod.rs, docs/stores.md), checked the same
//! way against every store on a real server started for the test. Stores
//! are opened through the registry from their URL, as the binary does.
//!
//! Run one store: `cargo nextest run -E 'test(/^conformance::mysql::/)'`.
//! Add one: a function in `tests/support/stores.rs`, a line in `conformance!`.

use std::time::{Duration, Instant};

use crate::support::join_all;
use crate::support::stores::{self, Server};
use leaderrun::store::{open, AnyStore, Origin, Store, StoreAdmin, StoreError};

/// Generous call timeout: the suite checks semantics, not latency.
const T: Duration = Duration::from_secs(10);
const L: Duration = Duration::from_secs(10);

fn store(url: &str) -> AnyStore {
    match open(Some((url, Origin::Flag)), "leaderrun-conformance", T) {
        Ok(s) => s,
        Err(e) => panic!("cannot open {url}: {e}"),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The lease the store really grants for a short `want`: at least its
/// minimum, rounded up to its granularity (etcd: whole seconds, 2 s at
/// least), so that each check times itself against what the store keeps.
fn granted(s: &AnyStore, want: Duration) -> Duration {
    let c = s.capabilities();
    match c.grant(want.max(c.min_lease)) {
        Ok(l) => l,
        Err(e) => panic!("{}: {e}", s.describe()),
    }
}

/// Poll `acquire` every 20 ms until it succeeds; the epoch and when.
async fn acquire_when_free(
    s: &mut AnyStore,
    name: &str,
    holder: &str,
    lease: Duration,
    limit: Duration,
) -> (i64, Instant) {
    let t0 = Instant::now();
    loop {
        if let Some(e) = s.acquire(name, holder, lease, T).await.expect("acquire") {
            return (e, Instant::now());
        }
        assert!(t0.elapsed() < limit, "{name} not free after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// N racers on a missing row, then on a released one, then on an expired
/// one: exactly one winner each round, at an epoch above every earlier one.
fn concurrent_acquires_have_one_winner(srv: Server) {
    rt().block_on(async {
        let mut racers: Vec<AnyStore> = (0..8).map(|_| store(&srv.url)).collect();
        for s in racers.iter_mut() {
            // connect (and create the table: looking never does) before
            // the race starts
            s.init(T).await.expect("init");
            s.inspect("warmup", T).await.expect("warm up");
        }
        let mut last = 0;
        let short = granted(&racers[0], Duration::from_secs(1));
        for round in 0..3 {
            let lease = if round == 1 { short } else { L };
            let futs: Vec<_> = racers
                .iter_mut()
                .enumerate()
                .map(|(i, s)| {
                    Box::pin(async move {
                        (
                            i,
                            s.acquire("race", &format!("c{i}"), lease, T)
                                .await
                                .expect("acquire"),
                        )
                    })
                })
                .collect();
            let won: Vec<(usize, i64)> = join_all(futs)
                .await
                .into_iter()
                .filter_map(|(i, e)| e.map(|e| (i, e)))
                .collect();
            assert_eq!(won.len(), 1, "round {round}: winners {won:?}");
            let (i, epoch) = won[0];
            assert!(epoch > last, "round {round}: epoch {epoch} after {last}");
            last = epoch;
            match round {
                0 => assert!(racers[i]
                    .release("race", &format!("c{i}"), epoch, Duration::ZERO, T)
                    .await
                    .expect("release")),
                // round 2 races on this lease once it has expired by itself
                // (etcd deletes expired keys in a sweep every 500 ms: later
                // than `sent + L` is allowed, earlier is not)
                1 => {
                    tokio::time::sleep(short).await;
                    let t0 = Instant::now();
                    while racers[0]
                        .inspect("race", T)
                        .await
                        .expect("inspect")
                        .is_some_and(|l| l.is_live())
                    {
                        assert!(t0.elapsed() < Duration::from_secs(3), "never expired");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                _ => {}
            }
        }
    });
}

/// Renew and release name holder and epoch: anything but the current grant
/// is refused and changes nothing.
fn stale_renew_and_release_are_refused(srv: Server) {
    rt().block_on(async {
        let (mut a, mut b) = (store(&srv.url), store(&srv.url));
        let short = granted(&a, Duration::from_secs(1));
        let ea = a
            .acquire("n", "a", short, T)
            .await
            .expect("acquire")
            .expect("free");
        assert!(
            !a.renew("n", "b", ea, short, T).await.expect("renew"),
            "wrong holder"
        );
        assert!(
            !a.renew("n", "a", ea + 1, short, T).await.expect("renew"),
            "wrong epoch"
        );
        assert!(
            !b.release("n", "a", ea - 1, Duration::ZERO, T)
                .await
                .expect("release"),
            "old epoch"
        );
        assert!(
            b.acquire("n", "b", L, T).await.expect("acquire").is_none(),
            "still a's"
        );
        // a stops renewing; b takes over once it expires
        let (eb, _) = acquire_when_free(&mut b, "n", "b", L, Duration::from_secs(5)).await;
        assert!(eb > ea);
        assert!(
            !a.renew("n", "a", ea, L, T).await.expect("renew"),
            "stale renew"
        );
        assert!(
            !a.release("n", "a", ea, Duration::ZERO, T)
                .await
                .expect("release"),
            "stale release"
        );
        assert!(
            !a.release("n", "a", ea, Duration::from_secs(5), T)
                .await
                .expect("release"),
            "stale keep"
        );
        let info = a.inspect("n", T).await.expect("inspect").expect("row");
        assert_eq!((info.holder.as_deref(), info.epoch), (Some("b"), eb));
        assert!(info.expires_in_ms.expect("an expiry") > 9000, "{info:?}");
        assert!(
            b.renew("n", "b", eb, L, T).await.expect("renew"),
            "the current grant renews"
        );
    });
}

/// Expiry by the store's clock: a rival gets the lease no earlier than
/// `sent + L` and soon after; a renewal pushes expiry out.
fn expiry_frees_the_lease_by_the_stores_clock(srv: Server) {
    rt().block_on(async {
        let (mut a, mut b) = (store(&srv.url), store(&srv.url));
        let l = Duration::from_secs(2);
        a.init(T).await.expect("init");
        a.inspect("warm", T).await.expect("warm up");
        let sent = Instant::now();
        let e = a
            .acquire("x", "a", l, T)
            .await
            .expect("acquire")
            .expect("free");
        // Renew at 1 s: the lease now ends no earlier than renew-sent + L.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let renew_sent = Instant::now();
        assert!(a.renew("x", "a", e, l, T).await.expect("renew"));
        let (e2, won) = acquire_when_free(&mut b, "x", "b", l, Duration::from_secs(6)).await;
        assert_eq!(e2, e + 1);
        let after = won - renew_sent;
        assert!(
            after >= l,
            "taken {after:?} after the renewal was sent, lease {l:?}"
        );
        assert!(
            won - sent < Duration::from_millis(3000) + Duration::from_millis(700),
            "freed late: {:?}",
            won - sent
        );
    });
}

/// `release` with keep (`--min-hold`) keeps the holder until then; without,
/// the lease is free at once.
fn min_hold_keeps_the_lease(srv: Server) {
    rt().block_on(async {
        let (mut a, mut b) = (store(&srv.url), store(&srv.url));
        let e = a
            .acquire("m", "a", L, T)
            .await
            .expect("acquire")
            .expect("free");
        // etcd keeps whole seconds: 2 s here.
        let keep = granted(&a, Duration::from_millis(1200));
        let sent = Instant::now();
        assert!(a.release("m", "a", e, keep, T).await.expect("release"));
        assert!(
            b.acquire("m", "b", L, T).await.expect("acquire").is_none(),
            "kept"
        );
        let info = b.inspect("m", T).await.expect("inspect").expect("row");
        assert_eq!(info.holder.as_deref(), Some("a"));
        assert!(
            info.expires_in_ms.expect("an expiry") > 0
                && info.expires_in_ms.expect("an expiry") as u128 <= keep.as_millis(),
            "{info:?}"
        );
        let (e2, won) = acquire_when_free(&mut b, "m", "b", L, Duration::from_secs(5)).await;
        assert!(
            won - sent >= keep,
            "taken {:?} after a keep of {keep:?}",
            won - sent
        );
        assert_eq!(e2, e + 1);
        assert!(b
            .release("m", "b", e2, Duration::ZERO, T)
            .await
            .expect("release"));
        assert_eq!(
            a.acquire("m", "a", L, T).await.expect("acquire"),
            Some(e2 + 1),
            "free at once"
        );
    });
}

/// 100 acquisitions by alternating holders: strictly increasing epochs.
fn epochs_strictly_increase(srv: Server) {
    rt().block_on(async {
        let mut s = [store(&srv.url), store(&srv.url)];
        let mut last = 0;
        for i in 0..100 {
            let holder = format!("h{}", i % 2);
            let st = &mut s[i % 2];
            let e = st
                .acquire("epochs", &holder, L, T)
                .await
                .expect("acquire")
                .expect("free");
            assert!(e > last, "acquisition {i}: epoch {e} after {last}");
            last = e;
            assert!(st
                .release("epochs", &holder, e, Duration::ZERO, T)
                .await
                .expect("release"));
        }
    });
}

/// status (list, inspect) and release (clear): what an operator sees and does.
fn clear_and_status(srv: Server) {
    rt().block_on(async {
        let mut s = store(&srv.url);
        // The table (where there is one) comes from `init` or a first run:
        // looking never creates it.
        s.init(T).await.expect("init");
        assert!(
            s.list(T).await.expect("list").is_empty(),
            "a fresh store lists nothing"
        );
        assert!(s.inspect("none", T).await.expect("inspect").is_none());
        let ea = s
            .acquire("a", "ha", L, T)
            .await
            .expect("acquire")
            .expect("free");
        let eb = s
            .acquire("b", "hb", L, T)
            .await
            .expect("acquire")
            .expect("free");
        let all = s.list(T).await.expect("list");
        let names: Vec<(&str, Option<&str>, i64, bool)> = all
            .iter()
            .map(|l| (l.name.as_str(), l.holder.as_deref(), l.epoch, l.is_live()))
            .collect();
        assert_eq!(
            names,
            vec![("a", Some("ha"), ea, true), ("b", Some("hb"), eb, true)]
        );
        assert!(
            s.clear("a", Some(ea + 5), T)
                .await
                .expect("clear")
                .is_none(),
            "wrong epoch"
        );
        let was = s
            .clear("a", Some(ea), T)
            .await
            .expect("clear")
            .expect("cleared");
        assert_eq!((was.holder.as_deref(), was.epoch), (Some("ha"), ea));
        assert!(was.expires_in_ms.expect("an expiry") > 0, "{was:?}");
        let now = s.inspect("a", T).await.expect("inspect").expect("row");
        assert!(now.holder.is_none() && !now.is_live(), "{now:?}");
        assert!(
            s.clear("a", None, T).await.expect("clear").is_none(),
            "nothing to clear"
        );
        // The cleared holder's renewal is refused; the next holder gets a higher epoch.
        assert!(!s.renew("a", "ha", ea, L, T).await.expect("renew"));
        assert_eq!(
            s.acquire("a", "hc", L, T).await.expect("acquire"),
            Some(ea + 1)
        );
        assert!(s.clear("b", None, T).await.expect("clear").is_some());
    });
}

/// Names and holders are data, never SQL or keys of another lease; names
/// differing only in case are different leases.
fn injection_looking_names_are_inert(srv: Server) {
    rt().block_on(async {
        let mut s = store(&srv.url);
        let evil = [
            "x'); DROP TABLE leader_lease; --",
            "a\" OR \"1\"=\"1",
            "*",
            "%",
            "{leader}:1",
            "\\",
            "Sweep",
            "sweep",
        ];
        for n in evil {
            assert_eq!(
                s.acquire(n, "h'; --", L, T).await.expect("acquire"),
                Some(1),
                "{n}"
            );
        }
        for n in evil {
            let info = s.inspect(n, T).await.expect("inspect").expect("row");
            assert_eq!(
                (info.name.as_str(), info.holder.as_deref()),
                (n, Some("h'; --"))
            );
        }
        assert_eq!(s.list(T).await.expect("list").len(), evil.len());
        assert!(s.inspect("x", T).await.expect("inspect").is_none());
    });
}

/// A dead server may heal (a waiting contender retries); a wrong password
/// will not (it ends the wait). Neither error shows a password.
fn dead_server_and_wrong_password_are_told_apart(srv: Server) {
    rt().block_on(async {
        if let Some(dead) = &srv.dead_url {
            let t0 = Instant::now();
            let err = store(dead)
                .acquire("n", "a", L, Duration::from_secs(3))
                .await
                .expect_err("dead server");
            assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
            assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        }
        if let Some(refused) = &srv.refused_url {
            let err = store(refused)
                .acquire("n", "a", L, T)
                .await
                .expect_err("refused");
            assert!(matches!(err, StoreError::Fatal(_)), "{err:?}");
            let msg = err.to_string();
            assert!(!msg.contains("Wr0ng-pw"), "password echoed: {msg}");
        }
        // The real thing still works.
        assert_eq!(
            store(&srv.url)
                .acquire("n", "a", L, T)
                .await
                .expect("acquire"),
            Some(1)
        );
    });
}

macro_rules! conformance {
    ($($store:ident),* $(,)?) => {$(
        mod $store {
            use super::*;
            #[test] fn concurrent_acquires_have_one_winner() { super::concurrent_acquires_have_one_winner(stores::$store()) }
            #[test] fn stale_renew_and_release_are_refused() { super::stale_renew_and_release_are_refused(stores::$store()) }
            #[test] fn expiry_frees_the_lease_by_the_stores_clock() { super::expiry_frees_the_lease_by_the_stores_clock(stores::$store()) }
            #[test] fn min_hold_keeps_the_lease() { super::min_hold_keeps_the_lease(stores::$store()) }
            #[test] fn epochs_strictly_increase() { super::epochs_strictly_increase(stores::$store()) }
            #[test] fn clear_and_status() { super::clear_and_status(stores::$store()) }
            #[test] fn injection_looking_names_are_inert() { super::injection_looking_names_are_inert(stores::$store()) }
            #[test] fn dead_server_and_wrong_password_are_told_apart() { super::dead_server_and_wrong_password_are_told_apart(stores::$store()) }
        }
    )*};
}

conformance!(
    postgres,
    sqlite,
    mysql,
    redis,
    etcd,
    pgbouncer_transaction,
    pgbouncer_session
);
