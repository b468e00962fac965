//! The store contract (src/store/mod.rs, docs/stores.md), checked the same
//! way against every store on a real server started for the test. Stores
//! are opened through the registry from their URL, as the binary does, and
//! the lease calls go through a lock bound to one name and one holder, as
//! the lease loop makes them.
//!
//! Run one store: `cargo nextest run -E 'test(/^conformance::mysql::/)'`.
//! Add one: a function in `tests/support/stores.rs`, a line in `conformance!`.

use std::time::{Duration, Instant};

use crate::support::join_all;
use crate::support::stores::{self, Server};
use leaderrun::store::{open, LeaseInfo, LeaseLock, Lock, Origin, Store};

/// Generous call timeout: the suite checks semantics, not latency.
const T: Duration = Duration::from_secs(10);
const L: Duration = Duration::from_secs(10);

fn store(url: &str) -> Store {
    match open(Some((url, Origin::Flag)), "leaderrun-conformance", T) {
        Ok(s) => s,
        Err(e) => panic!("cannot open {url}: {e}"),
    }
}

/// A lock on lease `name` for `holder`, on a connection of its own.
fn lock(url: &str, name: &str, holder: &str) -> Lock {
    store(url).lock(name, holder)
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
fn granted(s: &Lock, want: Duration) -> Duration {
    let c = s.capabilities();
    match c.grant(want.max(c.min_lease)) {
        Ok(l) => l,
        Err(e) => panic!("{}: {e}", s.describe()),
    }
}

/// Poll `acquire` every 20 ms until it succeeds; the epoch and when.
async fn acquire_when_free(s: &mut Lock, lease: Duration, limit: Duration) -> (i64, Instant) {
    let t0 = Instant::now();
    loop {
        if let Some(e) = s.acquire(lease, T).await.expect("acquire") {
            return (e, Instant::now());
        }
        assert!(t0.elapsed() < limit, "not free after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Until the store says the lease is no longer live (a store that deletes
/// expired keys in a sweep, like etcd every 500 ms, may say so later than
/// `sent + L`; earlier is not allowed and is checked elsewhere).
async fn until_not_live(s: &mut Lock, limit: Duration) {
    let t0 = Instant::now();
    while s
        .inspect(T)
        .await
        .expect("inspect")
        .is_some_and(|l| l.is_live())
    {
        assert!(t0.elapsed() < limit, "never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// N racers on a missing row, then on a released one, then on an expired
/// one: exactly one winner each round, at the next epoch.
fn concurrent_acquires_have_one_winner(srv: Server) {
    rt().block_on(async {
        let mut racers = Vec::new();
        for i in 0..8 {
            let mut s = store(&srv.url);
            // connect (and create the table: looking never does) before
            // the race starts
            s.init(T).await.expect("init");
            let mut l = s.lock("race", format!("c{i}"));
            l.inspect(T).await.expect("warm up");
            racers.push(l);
        }
        let mut last = 0;
        let short = granted(&racers[0], Duration::from_secs(1));
        for round in 0..3 {
            let lease = if round == 1 { short } else { L };
            let futs: Vec<_> = racers
                .iter_mut()
                .enumerate()
                .map(|(i, s)| {
                    Box::pin(async move { (i, s.acquire(lease, T).await.expect("acquire")) })
                })
                .collect();
            let won: Vec<(usize, i64)> = join_all(futs)
                .await
                .into_iter()
                .filter_map(|(i, e)| e.map(|e| (i, e)))
                .collect();
            assert_eq!(won.len(), 1, "round {round}: winners {won:?}");
            let (i, epoch) = won[0];
            assert_eq!(epoch, last + 1, "round {round}: epoch {epoch} after {last}");
            last = epoch;
            match round {
                0 => assert!(racers[i]
                    .release(epoch, Duration::ZERO, T)
                    .await
                    .expect("release")),
                // round 2 races on this lease once it has expired by itself
                1 => {
                    tokio::time::sleep(short).await;
                    until_not_live(&mut racers[0], Duration::from_secs(3)).await;
                }
                _ => {}
            }
        }
    });
}

/// Renew and release name holder and epoch: anything but the current grant
/// is refused and changes nothing. The current grant is renewed and
/// released by whoever names it, on any connection: the watchdog releases
/// after leaderrun was killed with a store of its own.
fn stale_renew_and_release_are_refused(srv: Server) {
    rt().block_on(async {
        let (mut a, mut b) = (lock(&srv.url, "n", "a"), lock(&srv.url, "n", "b"));
        let short = granted(&a, Duration::from_secs(1));
        let ea = a.acquire(short, T).await.expect("acquire").expect("free");
        assert!(!b.renew(ea, short, T).await.expect("renew"), "wrong holder");
        assert!(
            !a.renew(ea + 1, short, T).await.expect("renew"),
            "wrong epoch"
        );
        assert!(
            !b.release(ea, Duration::ZERO, T).await.expect("release"),
            "wrong holder"
        );
        let mut elsewhere = lock(&srv.url, "n", "a");
        assert!(
            !elsewhere
                .release(ea - 1, Duration::ZERO, T)
                .await
                .expect("release"),
            "old epoch"
        );
        assert!(
            b.acquire(L, T).await.expect("acquire").is_none(),
            "still a's"
        );
        assert!(
            elsewhere.renew(ea, short, T).await.expect("renew"),
            "the grant renews on another connection"
        );
        // a stops renewing; b takes over once it expires
        let (eb, _) = acquire_when_free(&mut b, L, Duration::from_secs(5)).await;
        assert_eq!(eb, ea + 1);
        assert!(!a.renew(ea, L, T).await.expect("renew"), "stale renew");
        assert!(
            !a.release(ea, Duration::ZERO, T).await.expect("release"),
            "stale release"
        );
        assert!(
            !a.release(ea, Duration::from_secs(5), T)
                .await
                .expect("release"),
            "stale keep"
        );
        let info = a.inspect(T).await.expect("inspect").expect("row");
        assert_eq!((info.holder.as_deref(), info.epoch), (Some("b"), eb));
        // At most L (and the store's rounding) ahead: etcd shows the latest
        // end of its whole-second TTL.
        let ms = info.expires_in_ms.expect("an expiry");
        let most = (L + b.capabilities().granularity).as_millis() as i64;
        assert!(ms > 9000 && ms <= most, "{info:?}");
        assert!(
            b.renew(eb, L, T).await.expect("renew"),
            "the current grant renews"
        );
        assert!(
            lock(&srv.url, "n", "b")
                .release(eb, Duration::ZERO, T)
                .await
                .expect("release"),
            "the grant is released from another connection"
        );
        let info = a.inspect(T).await.expect("inspect").expect("row");
        assert!(info.holder.is_none() && !info.is_live(), "{info:?}");
    });
}

/// Expiry by the store's clock: a rival gets the lease no earlier than
/// `sent + L` and soon after; a renewal pushes expiry out; an expired lease
/// cannot be renewed even when nobody took it.
fn expiry_frees_the_lease_by_the_stores_clock(srv: Server) {
    rt().block_on(async {
        let mut s = store(&srv.url);
        s.init(T).await.expect("init");
        let mut a = s.lock("x", "a");
        let mut b = lock(&srv.url, "x", "b");
        let l = Duration::from_secs(2);
        a.inspect(T).await.expect("warm up");
        let sent = Instant::now();
        let e = a.acquire(l, T).await.expect("acquire").expect("free");
        // Renew at 1 s: the lease now ends no earlier than renew-sent + L.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let renew_sent = Instant::now();
        assert!(a.renew(e, l, T).await.expect("renew"));
        let (e2, won) = acquire_when_free(&mut b, l, Duration::from_secs(6)).await;
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
        // b lets its lease run out; nobody takes it.
        tokio::time::sleep(l).await;
        until_not_live(&mut b, Duration::from_secs(3)).await;
        assert!(
            !b.renew(e2, l, T).await.expect("renew"),
            "expired, even if nobody took it"
        );
        assert_eq!(a.acquire(l, T).await.expect("acquire"), Some(e2 + 1));
    });
}

/// `release` with keep (`--min-hold`) keeps the holder until then; without,
/// the lease is free at once, and the released grant renews no more.
fn min_hold_keeps_the_lease(srv: Server) {
    rt().block_on(async {
        let (mut a, mut b) = (lock(&srv.url, "m", "a"), lock(&srv.url, "m", "b"));
        let e = a.acquire(L, T).await.expect("acquire").expect("free");
        // etcd keeps whole seconds: 2 s here.
        let keep = granted(&a, Duration::from_millis(1200));
        let sent = Instant::now();
        assert!(a.release(e, keep, T).await.expect("release"));
        assert!(b.acquire(L, T).await.expect("acquire").is_none(), "kept");
        let info = b.inspect(T).await.expect("inspect").expect("row");
        assert_eq!(info.holder.as_deref(), Some("a"));
        let ms = info.expires_in_ms.expect("an expiry");
        assert!(ms > 0 && ms as u128 <= keep.as_millis(), "{info:?}");
        let (e2, won) = acquire_when_free(&mut b, L, Duration::from_secs(5)).await;
        assert!(
            won - sent >= keep,
            "taken {:?} after a keep of {keep:?}",
            won - sent
        );
        assert_eq!(e2, e + 1);
        assert!(b.release(e2, Duration::ZERO, T).await.expect("release"));
        assert!(!b.renew(e2, L, T).await.expect("renew"), "released");
        assert_eq!(
            a.acquire(L, T).await.expect("acquire"),
            Some(e2 + 1),
            "free at once"
        );
    });
}

/// 100 acquisitions by alternating holders: the epoch rises by exactly one
/// each time (every store raises it atomically in the acquisition).
fn epochs_rise_by_one(srv: Server) {
    rt().block_on(async {
        let mut s = [
            lock(&srv.url, "epochs", "h0"),
            lock(&srv.url, "epochs", "h1"),
        ];
        let mut last = 0;
        for i in 0..100 {
            let st = &mut s[i % 2];
            let e = st.acquire(L, T).await.expect("acquire").expect("free");
            assert_eq!(e, last + 1, "acquisition {i}: epoch {e} after {last}");
            last = e;
            assert!(st.release(e, Duration::ZERO, T).await.expect("release"));
        }
    });
}

fn seen(all: &[LeaseInfo]) -> Vec<(&str, Option<&str>, i64, bool)> {
    all.iter()
        .map(|l| (l.name.as_str(), l.holder.as_deref(), l.epoch, l.is_live()))
        .collect()
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
        let mut la = lock(&srv.url, "a", "ha");
        let ea = la.acquire(L, T).await.expect("acquire").expect("free");
        let mut lb = lock(&srv.url, "b", "hb");
        let eb = lb.acquire(L, T).await.expect("acquire").expect("free");
        let all = s.list(T).await.expect("list");
        assert_eq!(
            seen(&all),
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
        // A cleared lease is listed as free, at the epoch it had.
        let all = s.list(T).await.expect("list");
        assert_eq!(
            seen(&all),
            vec![("a", None, ea, false), ("b", Some("hb"), eb, true)]
        );
        // The cleared holder's renewal is refused; the next holder gets a higher epoch.
        assert!(!la.renew(ea, L, T).await.expect("renew"));
        assert_eq!(
            lock(&srv.url, "a", "hc")
                .acquire(L, T)
                .await
                .expect("acquire"),
            Some(ea + 1)
        );
        assert!(s.clear("b", None, T).await.expect("clear").is_some());
    });
}

/// Names and holders are data, never SQL, keys of another lease, glob
/// patterns, hash tags, Lua or JSON; names differing only in case are
/// different leases.
fn injection_looking_names_are_inert(srv: Server) {
    let evil = [
        "x'); DROP TABLE leader_lease; --",
        "a\" OR \"1\"=\"1",
        "*",
        "%",
        "?",
        "[a-z]",
        "{",
        "}",
        "}:epoch",
        "a}:lease",
        "{leader}:1",
        "x') redis.call('FLUSHALL') --",
        "]] .. redis.call('FLUSHALL') .. [[",
        "a/../b",
        "../epoch/x",
        "x\",\"key\":\"eA==",
        "\\",
        "1:2",
        "ü",
        "Sweep",
        "sweep",
    ];
    let holder = "h:'\"; --";
    rt().block_on(async {
        for n in evil {
            let mut l = lock(&srv.url, n, holder);
            assert_eq!(l.acquire(L, T).await.expect("acquire"), Some(1), "{n}");
            let mut other = lock(&srv.url, n, "other");
            assert_eq!(other.acquire(L, T).await.expect("acquire"), None, "{n}");
        }
        let mut s = store(&srv.url);
        for n in evil {
            let info = s.inspect(n, T).await.expect("inspect").expect("row");
            assert_eq!(
                (info.name.as_str(), info.holder.as_deref()),
                (n, Some(holder))
            );
        }
        let mut listed: Vec<String> = s
            .list(T)
            .await
            .expect("list")
            .into_iter()
            .map(|l| l.name)
            .collect();
        let mut want: Vec<String> = evil.iter().map(|n| n.to_string()).collect();
        // The order is the store's (a SQL collation may sort differently).
        listed.sort();
        want.sort();
        assert_eq!(listed, want);
        assert!(s.inspect("x", T).await.expect("inspect").is_none());
        // Clearing `*` clears that lease only.
        assert!(s.clear("*", None, T).await.expect("clear").is_some());
        for n in evil {
            let live = s
                .inspect(n, T)
                .await
                .expect("inspect")
                .expect("row")
                .is_live();
            assert_eq!(live, n != "*", "{n}");
        }
    });
}

/// A dead server may heal (a waiting contender retries); a wrong password
/// will not (it ends the wait). Neither error shows a password.
fn dead_server_and_wrong_password_are_told_apart(srv: Server) {
    rt().block_on(async {
        if let Some(dead) = &srv.dead_url {
            let t0 = Instant::now();
            let err = lock(dead, "n", "a")
                .acquire(L, Duration::from_secs(3))
                .await
                .expect_err("dead server");
            assert!(err.may_heal(), "{err:?}");
            assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        }
        if let Some(refused) = &srv.refused_url {
            let err = lock(refused, "n", "a")
                .acquire(L, T)
                .await
                .expect_err("refused");
            assert!(!err.may_heal(), "{err:?}");
            assert!(
                std::error::Error::source(&err).is_some(),
                "the driver's error behind it: {err:?}"
            );
            let msg = err.to_string();
            assert!(!msg.contains("Wr0ng-pw"), "password echoed: {msg}");
        }
        // The real thing still works.
        assert_eq!(
            lock(&srv.url, "n", "a")
                .acquire(L, T)
                .await
                .expect("acquire"),
            Some(1)
        );
    });
}

/// §12, `--once-per`: the period is checked and claimed in the acquire's
/// own atomic step. Two racing takes in one period: one takes, the other is
/// told "done this period" (not "held"); a run handed back `not started`
/// leaves the period open; one that ended closes it, lease free or not,
/// until half the period has passed by the store's clock; a plain acquire
/// is not bound by the rule.
fn once_per_period_is_claimed_with_the_acquire(srv: Server) {
    use leaderrun::store::{Acquired, Outcome};
    let once = |holder: &str, half: Duration| {
        let mut l = lock(&srv.url, "once", holder);
        l.once_per(leaderrun::store::Period::new(half));
        l
    };
    // Long enough that the racing round is over well inside it; the last
    // round waits it out. Whole even seconds: etcd keeps the period by a
    // lease of whole seconds, at least 2.
    let half = Duration::from_secs(2);
    rt().block_on(async {
        let (mut a, mut b) = (once("a", half), once("b", half));
        let lease = granted(&a, Duration::from_secs(3));
        let (ra, rb) = tokio::join!(a.take(lease, T), b.take(lease, T));
        let (ra, rb) = (ra.expect("take a"), rb.expect("take b"));
        let (winner, loser, epoch) = match (ra, rb) {
            (Acquired::Taken(e), Acquired::DoneThisPeriod { .. }) => (&mut a, &mut b, e),
            (Acquired::DoneThisPeriod { .. }, Acquired::Taken(e)) => (&mut b, &mut a, e),
            other => panic!("two racing takes in one period: {other:?}"),
        };
        // Nothing ran: handed back, the period stays open.
        winner.ending(Outcome::NotStarted);
        assert!(winner
            .release(epoch, Duration::ZERO, T)
            .await
            .expect("release"));
        let epoch = match loser.take(lease, T).await.expect("take") {
            Acquired::Taken(e) => e,
            other => panic!("after a run that never started: {other:?}"),
        };
        let started = Instant::now();
        loser.ending(Outcome::Exit(0));
        assert!(loser
            .release(epoch, Duration::ZERO, T)
            .await
            .expect("release"));
        // Free, but the period's run is done.
        match winner.take(lease, T).await.expect("take") {
            Acquired::DoneThisPeriod { started_ms_ago } => assert!(
                (0..=millis(half)).contains(&started_ms_ago),
                "{started_ms_ago} ms ago"
            ),
            other => panic!("after the period's run: {other:?}"),
        }
        // A plain acquire ignores the period.
        let mut plain = lock(&srv.url, "once", "c");
        let e = plain.acquire(lease, T).await.expect("acquire");
        assert_eq!(e, Some(epoch + 1));
        assert!(plain
            .release(epoch + 1, Duration::ZERO, T)
            .await
            .expect("release"));
        // Past half the period (by the store's clock, which runs at ours'
        // rate; a store that expires in a sweep may be a little late),
        // the next firing runs.
        tokio::time::sleep(half.saturating_sub(started.elapsed())).await;
        let t0 = Instant::now();
        loop {
            match winner.take(lease, T).await.expect("take") {
                Acquired::Taken(_) => break,
                Acquired::DoneThisPeriod { .. } if t0.elapsed() < half => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                other => panic!("{:?} past half the period: {other:?}", started.elapsed()),
            }
        }
    });
}

/// The lease's values (`--advertise`, and a `--min-hold` keep told from a
/// running tenure): each is the tenure's own. An advertised value is there
/// from the acquire that takes the lease, kept through a keep, and never
/// shown for a later tenure that advertised none; a keep marks the tenure
/// ended; a freed lease shows no value.
fn values_are_the_tenures(srv: Server) {
    rt().block_on(async {
        let mut a = lock(&srv.url, "v", "a");
        a.advertise("10.0.0.7:8080 (a)".into());
        let mut b = lock(&srv.url, "v", "b");
        let e = a.acquire(L, T).await.expect("acquire").expect("free");
        let info = b.inspect(T).await.expect("inspect").expect("lease");
        assert_eq!(
            (info.advertised.as_deref(), info.kept),
            (Some("10.0.0.7:8080 (a)"), false),
            "{info:?}"
        );
        let keep = granted(&a, Duration::from_millis(1200));
        assert!(a.release(e, keep, T).await.expect("release"));
        let info = b.inspect(T).await.expect("inspect").expect("lease");
        assert_eq!(
            (info.holder.as_deref(), info.epoch, info.kept),
            (Some("a"), e, true),
            "kept by --min-hold: {info:?}"
        );
        assert_eq!(info.advertised.as_deref(), Some("10.0.0.7:8080 (a)"));
        let (e2, _) = acquire_when_free(&mut b, L, Duration::from_secs(5)).await;
        let info = a.inspect(T).await.expect("inspect").expect("lease");
        assert_eq!(
            (
                info.holder.as_deref(),
                info.epoch,
                info.advertised,
                info.kept
            ),
            (Some("b"), e2, None, false),
            "a later tenure shows none of an earlier one's values"
        );
        // Kept without advertising: the mark alone.
        assert!(b.release(e2, keep, T).await.expect("release"));
        let info = a.inspect(T).await.expect("inspect").expect("lease");
        assert!(info.kept && info.advertised.is_none(), "{info:?}");
        let (e3, _) = acquire_when_free(&mut a, L, Duration::from_secs(5)).await;
        assert!(a.release(e3, Duration::ZERO, T).await.expect("release"));
        let all = store(&srv.url).list(T).await.expect("list");
        let v = all.iter().find(|l| l.name == "v").expect("listed");
        assert_eq!(
            (v.holder.as_deref(), v.advertised.as_deref(), v.kept),
            (None, None, false),
            "freed: {v:?}"
        );
    });
}

/// `--slots N`: each slot a lease of its own, so of eight racers for two
/// slots exactly two win, one per slot; a third finds both held; each
/// slot's epoch rises by one per acquisition of that slot; the store
/// gives back each grant's N; a contender with another N is refused
/// (usage, exit 2) and its slot handed back; a plain run on the name meets
/// slot 0 as the lease it always was.
fn slots_hold_at_most_n(srv: Server) {
    use leaderrun::store::ErrorKind;
    rt().block_on(async {
        let pooled = |holder: String, n: u32| {
            let mut l = lock(&srv.url, "pool", &holder);
            l.slots(n);
            l
        };
        // The table first: looking never creates it.
        store(&srv.url).init(T).await.expect("init");
        let mut racers: Vec<Lock> = (0..8).map(|i| pooled(format!("r{i}"), 2)).collect();
        for r in racers.iter_mut() {
            r.inspect(T).await.expect("warm up");
        }
        let futs: Vec<_> = racers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| Box::pin(async move { (i, l.acquire(L, T).await.expect("acquire")) }))
            .collect();
        let won: Vec<(usize, i64)> = join_all(futs)
            .await
            .into_iter()
            .filter_map(|(i, e)| e.map(|e| (i, e)))
            .collect();
        assert_eq!(won.len(), 2, "winners {won:?}");
        let mut slots: Vec<u32> = won
            .iter()
            .map(|&(i, _)| racers[i].slot().expect("a slot"))
            .collect();
        slots.sort();
        assert_eq!(slots, [0, 1], "{won:?}");
        assert!(
            won.iter().all(|&(_, e)| e == 1),
            "first epoch of each slot: {won:?}"
        );
        let mut s = store(&srv.url);
        for name in ["pool", "pool#1"] {
            let info = s.inspect(name, T).await.expect("inspect").expect("lease");
            assert_eq!(info.slots, Some(2), "{info:?}");
        }
        let mut third = pooled("third".into(), 2);
        assert_eq!(third.acquire(L, T).await.expect("acquire"), None);
        let mut plain = lock(&srv.url, "pool", "plain");
        assert_eq!(plain.acquire(L, T).await.expect("acquire"), None);

        // Slot 1 freed: the third takes it at that slot's next epoch.
        let (i1, e1) = *won
            .iter()
            .find(|&&(i, _)| racers[i].slot() == Some(1))
            .expect("slot 1");
        assert!(racers[i1]
            .release(e1, Duration::ZERO, T)
            .await
            .expect("release"));
        assert_eq!(third.acquire(L, T).await.expect("acquire"), Some(e1 + 1));
        assert_eq!(third.slot(), Some(1));

        // Another N is refused, and leaves no slot taken.
        let (i0, e0) = *won
            .iter()
            .find(|&&(i, _)| racers[i].slot() == Some(0))
            .expect("slot 0");
        assert!(racers[i0]
            .release(e0, Duration::ZERO, T)
            .await
            .expect("release"));
        let mut other = pooled("other".into(), 3);
        let err = other.acquire(L, T).await.expect_err("another N");
        assert_eq!(err.kind(), ErrorKind::Usage, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("--slots 3") && msg.contains("with --slots 2"),
            "{msg}"
        );
        let info = s.inspect("pool", T).await.expect("inspect").expect("lease");
        assert!(
            !info.is_live(),
            "the refused run's slot was not handed back: {info:?}"
        );
        assert_eq!(info.epoch, e0 + 1, "{info:?}");
    });
}

/// §12, `--retry-failed`: a failed run's period is taken again in the
/// acquire's own atomic step, so of racing retries one takes it (the other
/// finds the lease held, the retry running); once a run exits 0 the period
/// is done for retrying takes too.
fn retry_failed_is_claimed_with_the_acquire(srv: Server) {
    use leaderrun::store::{Acquired, Outcome, Period};
    let retrying = |holder: &str| {
        let mut l = lock(&srv.url, "retry", holder);
        l.once_per(Period {
            half: Duration::from_secs(1800),
            retry_failed: true,
        });
        l
    };
    rt().block_on(async {
        let (mut a, mut b, mut c) = (retrying("a"), retrying("b"), retrying("c"));
        let lease = granted(&a, Duration::from_secs(3));
        let epoch = a
            .take(lease, T)
            .await
            .expect("take")
            .epoch()
            .expect("taken");
        a.ending(Outcome::Lost);
        assert!(a.release(epoch, Duration::ZERO, T).await.expect("release"));
        let (rb, rc) = tokio::join!(b.take(lease, T), c.take(lease, T));
        let (rb, rc) = (rb.expect("take b"), rc.expect("take c"));
        let (winner, epoch) = match (rb, rc) {
            (Acquired::Taken(e), Acquired::Held) => (&mut b, e),
            (Acquired::Held, Acquired::Taken(e)) => (&mut c, e),
            other => panic!("two racing retries of a failed period: {other:?}"),
        };
        winner.ending(Outcome::Exit(0));
        assert!(winner
            .release(epoch, Duration::ZERO, T)
            .await
            .expect("release"));
        match a.take(lease, T).await.expect("take") {
            Acquired::DoneThisPeriod { .. } => {}
            other => panic!("a retry after the period's run exited 0: {other:?}"),
        }
    });
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

macro_rules! conformance {
    ($($store:ident),* $(,)?) => {$(
        mod $store {
            use super::*;
            #[test] fn concurrent_acquires_have_one_winner() { super::concurrent_acquires_have_one_winner(stores::$store()) }
            #[test] fn stale_renew_and_release_are_refused() { super::stale_renew_and_release_are_refused(stores::$store()) }
            #[test] fn expiry_frees_the_lease_by_the_stores_clock() { super::expiry_frees_the_lease_by_the_stores_clock(stores::$store()) }
            #[test] fn min_hold_keeps_the_lease() { super::min_hold_keeps_the_lease(stores::$store()) }
            #[test] fn epochs_rise_by_one() { super::epochs_rise_by_one(stores::$store()) }
            #[test] fn clear_and_status() { super::clear_and_status(stores::$store()) }
            #[test] fn injection_looking_names_are_inert() { super::injection_looking_names_are_inert(stores::$store()) }
            #[test] fn dead_server_and_wrong_password_are_told_apart() { super::dead_server_and_wrong_password_are_told_apart(stores::$store()) }
        }
    )*};
}

/// The stores that keep `--once-per`'s rule: the clause runs on each.
macro_rules! once_per {
    ($($store:ident),* $(,)?) => {$(
        mod $store {
            #[test] fn once_per_period_is_claimed_with_the_acquire() { super::super::once_per_period_is_claimed_with_the_acquire(super::super::stores::$store()) }
            #[test] fn retry_failed_is_claimed_with_the_acquire() { super::super::retry_failed_is_claimed_with_the_acquire(super::super::stores::$store()) }
        }
    )*};
}

/// The stores that keep the lease's values: the clause runs on each.
macro_rules! values {
    ($($store:ident),* $(,)?) => {$(
        mod $store {
            #[test] fn values_are_the_tenures() { super::super::values_are_the_tenures(super::super::stores::$store()) }
        }
    )*};
}

/// The stores that keep `--slots`' N with each grant: the clause runs on each.
macro_rules! slots {
    ($($store:ident),* $(,)?) => {$(
        mod $store {
            #[test] fn slots_hold_at_most_n() { super::super::slots_hold_at_most_n(super::super::stores::$store()) }
        }
    )*};
}

mod slots {
    slots!(
        postgres,
        sqlite,
        mysql,
        redis,
        etcd,
        zookeeper,
        pgbouncer_transaction,
        pgbouncer_session
    );
}

mod values {
    values!(
        postgres,
        sqlite,
        mysql,
        redis,
        etcd,
        zookeeper,
        pgbouncer_transaction,
        pgbouncer_session
    );
}

mod once_per {
    once_per!(
        postgres,
        sqlite,
        mysql,
        redis,
        etcd,
        zookeeper,
        pgbouncer_transaction,
        pgbouncer_session
    );
}

conformance!(
    postgres,
    sqlite,
    mysql,
    redis,
    etcd,
    zookeeper,
    pgbouncer_transaction,
    pgbouncer_session
);
