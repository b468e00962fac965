//! What the Redis store does beyond the contract (tests/conformance.rs
//! checks that against every store), against real, throwaway
//! `redis-server`s: flushed scripts, the epoch counter, ACL refusals, a
//! blackholed or frozen server, `?replicas=N`, a primary that restarted or
//! changed history, what `status` and the run's warning say, TLS, the
//! documented ACL, and the `leaderrun` binary end to end on it.

use std::time::{Duration, Instant};

use crate::support::redis::{Pair, Redis, PASSWORD};
use crate::support::*;
use leaderrun::store::{open, LeaseLock, Lock, Origin, Store};

const L: Duration = Duration::from_secs(5);
const T: Duration = Duration::from_secs(5);
const ZERO: Duration = Duration::ZERO;

/// Opened through the registry from the URL, as the binary does.
fn store(url: &str) -> Store {
    match open(Some((url, Origin::Flag)), "leaderrun-test", T) {
        Ok(s) => s,
        Err(e) => panic!("cannot open {url}: {e}"),
    }
}

fn lock(url: &str, name: &str, holder: &str) -> Lock {
    store(url).lock(name, holder)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// After a restart or `SCRIPT FLUSH` the scripts are unknown to the server;
/// the store falls back to EVAL and goes on.
#[test]
fn flushed_scripts_are_sent_again() {
    let r = Redis::start();
    rt().block_on(async {
        let mut a = lock(&r.url(), "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        r.cli(&["SCRIPT", "FLUSH"]);
        assert!(a.renew(1, L, T).await.unwrap());
        assert!(a.release(1, ZERO, T).await.unwrap());
        r.cli(&["SCRIPT", "FLUSH"]);
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(2));
    });
}

/// The epoch counter outlives every lease (no expiry on it), and `status`
/// lists leaderrun's keys only.
#[test]
fn the_epoch_counter_never_expires_and_other_keys_are_not_listed() {
    let r = Redis::start();
    rt().block_on(async {
        let mut a = lock(&r.url(), "e", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        assert!(a.release(1, ZERO, T).await.unwrap());
        assert_eq!(
            r.cli(&["TTL", "{leaderrun:e}:epoch"]),
            "-1",
            "the counter never expires"
        );
        r.cli(&["SET", "unrelated", "x"]);
        let listed: Vec<String> = store(&r.url())
            .list(T)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(listed, ["e"]);
    });
}

/// No password where one is needed (NOAUTH) and an ACL user that may not
/// run scripts (NOPERM) will not heal either, and say so in Redis's words.
/// (A wrong password and a dead server are the conformance suite's.)
#[test]
fn no_password_or_no_permission_will_not_heal() {
    let r = Redis::start();
    rt().block_on(async {
        let url = format!("redis://127.0.0.1:{}/0", r.port);
        let err = lock(&url, "n", "a").acquire(L, T).await.unwrap_err();
        assert!(!err.may_heal(), "no password: {err:?}");
        assert!(err.to_string().contains("NOAUTH"), "{err}");

        r.cli(&[
            "ACL", "SETUSER", "ro", "on", ">ro-pw", "~*", "+ping", "+get",
        ]);
        let url = format!("redis://ro:ro-pw@127.0.0.1:{}/0", r.port);
        let err = lock(&url, "n", "a").acquire(L, T).await.unwrap_err();
        assert!(!err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("NOPERM"), "{err}");
        assert!(err.to_string().contains("redis://ro:***@"), "{err}");
    });
}

#[test]
fn blackholed_call_returns_within_its_timeout_and_reconnects() {
    let r = Redis::start();
    let proxy = Proxy::start(r.port);
    rt().block_on(async {
        let mut a = lock(&r.url_via(proxy.port), "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        proxy.blackhole();
        let t0 = Instant::now();
        let err = a.renew(1, L, Duration::from_millis(300)).await.unwrap_err();
        let took = t0.elapsed();
        assert!(err.may_heal(), "{err:?}");
        assert!(took < Duration::from_millis(800), "{took:?}");
        // A new connection is made once the link heals.
        proxy.heal();
        assert!(a.renew(1, L, T).await.unwrap());
    });
    // A frozen server (accepts nothing, answers nothing) is bounded too.
    r.freeze(true);
    rt().block_on(async {
        let t0 = Instant::now();
        let err = lock(&r.url(), "m", "a")
            .acquire(L, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(err.may_heal(), "{err:?}");
        assert!(
            t0.elapsed() < Duration::from_millis(800),
            "{:?}",
            t0.elapsed()
        );
    });
    r.freeze(false);
}

#[test]
fn the_binary_runs_a_command_under_a_redis_lease() {
    let r = Redis::start();
    let dir = TempDir::new("redis-e2e");
    let url = r.url();
    // The child sees its epoch; its exit status passes through.
    let out = dir.file("env");
    let script = format!(
        "echo \"$LEASE_EPOCH $LEASE_NAME\" > {}; exit 7",
        out.display()
    );
    let res = run(lr(&url, "job", &[], &script));
    assert_eq!(res.code, Some(7), "{}", res.stderr);
    assert_eq!(read(&out).trim(), "1 job");
    assert!(!res.stderr.contains(PASSWORD), "{}", res.stderr);

    // While one holds it, a second contender is refused.
    let mut holder = spawn(
        lr(&url, "job", &["--lease", "3s"], &worker(&dir, "w")),
        &dir.file("w.log"),
    );
    wait_file(&dir.file("w.pid"), Duration::from_secs(10));
    assert_eq!(read(&dir.file("w.epoch")).trim(), "2");
    let res = run(lr(
        &url,
        "job",
        &["--conflict-exit-code", "3", "-v"],
        "echo should-not-run",
    ));
    assert_eq!(res.code, Some(3), "{}", res.stderr);
    assert!(!res.stdout.contains("should-not-run"));
    assert!(res.stderr.contains("held by"), "{}", res.stderr);

    // `status` reads it through the same store.
    let mut c = leaderrun();
    c.args(["status", "--store", &url, "--name", "job"]);
    let st = run(c);
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    assert!(st.stdout.contains("job"), "{}", st.stdout);

    // SIGTERM: the command stops, the lease is released, the next run gets 3.
    signal(holder.id(), nix::sys::signal::Signal::SIGTERM);
    let st = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(st.code(), Some(143), "{}", read(&dir.file("w.log")));
    assert_eq!(r.cli(&["EXISTS", "{leaderrun:job}:lease"]), "0");
    let res = run(lr(&url, "job", &[], &script));
    assert_eq!(res.code, Some(7), "{}", res.stderr);
    assert_eq!(read(&out).trim(), "3 job");
}

// ---------------------------------------------------------------------------
// Replication: `?replicas=N`, the primary's identity, what status says.

#[test]
fn the_replicas_parameter_is_checked() {
    for bad in [
        "",
        "x",
        "-1",
        "+1",
        "1.5",
        " 1",
        "0x1",
        "101",
        "99999999999999999999",
    ] {
        let raw = format!("redis://:{PASSWORD}@127.0.0.1:1/0?replicas={bad}");
        let e = match open(Some((&raw, Origin::Flag)), "t", T) {
            Ok(_) => panic!("replicas={bad:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("replicas=") && e.contains("0 to 100"),
            "{bad:?}: {e}"
        );
        assert!(!e.contains(PASSWORD), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    let twice = "redis://127.0.0.1:1/0?replicas=1&replicas=2";
    let e = open(Some((twice, Origin::Flag)), "t", T)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("more than once"), "{e}");
    let typo = "redis://127.0.0.1:1/0?replica=1";
    let e = open(Some((typo, Origin::Flag)), "t", T)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("unknown parameter replica"), "{e}");
    for good in ["0", "1", "3", "100"] {
        let raw = format!("rediss://:{PASSWORD}@127.0.0.1:1/0?replicas={good}");
        let s = store(&raw);
        assert_eq!(
            s.describe(),
            format!("rediss://:***@127.0.0.1:1/0?replicas={good}")
        );
    }

    // The binary: a usage error, exit 2, one line, nothing started.
    let dir = TempDir::new("redis-params");
    let flag = dir.file("ran");
    let res = run(lr(
        "redis://127.0.0.1:1/0?replicas=many",
        "p",
        &[],
        &format!("touch {}", flag.display()),
    ));
    assert_eq!(res.code, Some(2), "{}", res.stderr);
    assert_eq!(res.stderr.trim().lines().count(), 1, "{}", res.stderr);
    assert!(res.stderr.contains("replicas="), "{}", res.stderr);
    assert!(!flag.exists(), "the command ran");
}

/// With `replicas=1` an acquisition and a renewal count only once a replica
/// has them. With the replication link stalled, a renewal fails within its
/// timeout (and does not count), and an acquisition fails too and hands the
/// lease back at once: the primary shows it free, its epoch used up.
#[test]
fn acquire_and_renew_wait_for_replicas() {
    let p = Pair::start(false);
    rt().block_on(async {
        let mut a = lock(&p.url(1), "n", "a");
        let mut m = lock(&p.url(1), "m", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        // Acknowledged means the replica has it, at once.
        assert_eq!(p.replica.cli(&["GET", "{leaderrun:n}:lease"]), "1:a");
        assert!(a.renew(1, L, T).await.unwrap());

        // Two replicas asked for, one there: refused, handed back.
        let mut two = lock(&p.url(2), "two", "a");
        let err = two
            .acquire(L, Duration::from_millis(400))
            .await
            .unwrap_err();
        assert!(err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("1 of 2 replicas"), "{err}");
        assert_eq!(p.primary.cli(&["EXISTS", "{leaderrun:two}:lease"]), "0");

        p.link.stall();
        let budget = Duration::from_millis(400);
        let t0 = Instant::now();
        let err = a.renew(1, L, budget).await.unwrap_err();
        let took = t0.elapsed();
        assert!(err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("0 of 1 replica"), "{err}");
        assert!(took <= budget + Duration::from_millis(100), "{took:?}");

        let t0 = Instant::now();
        let err = m.acquire(L, Duration::from_millis(500)).await.unwrap_err();
        let took = t0.elapsed();
        assert!(err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("handed back"), "{err}");
        assert!(took <= Duration::from_millis(600), "{took:?}");
        assert_eq!(p.primary.cli(&["EXISTS", "{leaderrun:m}:lease"]), "0");
        assert_eq!(p.primary.cli(&["GET", "{leaderrun:m}:epoch"]), "1");

        p.link.heal();
        assert_eq!(m.acquire(L, T).await.unwrap(), Some(2));
        assert!(a.renew(1, L, T).await.unwrap());
        // A release waits for nothing: the lease is free on the primary
        // the moment it answers (see docs/stores.md on why).
        p.link.stall();
        let t0 = Instant::now();
        assert!(m.release(2, ZERO, T).await.unwrap());
        assert!(
            t0.elapsed() < Duration::from_millis(200),
            "{:?}",
            t0.elapsed()
        );
        p.link.heal();
    });
}

/// A WAIT the ACL refuses will not heal (exit 125), and the lease it could
/// not confirm is handed back rather than left to expire.
#[test]
fn a_refused_wait_hands_the_lease_back() {
    let r = Redis::start();
    r.cli(&[
        "ACL", "SETUSER", "nowait", "on", ">nw-pw", "~*", "&*", "+@all", "-wait",
    ]);
    let url = format!("redis://nowait:nw-pw@127.0.0.1:{}/0?replicas=1", r.port);
    rt().block_on(async {
        let err = lock(&url, "n", "a").acquire(L, T).await.unwrap_err();
        assert!(!err.may_heal(), "{err:?}");
        assert!(err.to_string().contains("NOPERM"), "{err}");
    });
    assert_eq!(r.cli(&["EXISTS", "{leaderrun:n}:lease"]), "0");
    assert_eq!(r.cli(&["GET", "{leaderrun:n}:epoch"]), "1");
}

/// A primary restarted under a held lease (a new run_id) may have lost the
/// acquisition or the renewals since: even with the lease key still there
/// (an append-only file kept it), the next renewal says "not ours".
#[test]
fn a_restarted_primary_ends_the_lease() {
    let mut r = Redis::start_with(true);
    rt().block_on(async {
        let mut a = lock(&r.url(), "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        assert!(a.renew(1, L, T).await.unwrap());
        let before = r.info("server", "run_id");
        r.crash();
        r.boot();
        assert_ne!(r.info("server", "run_id"), before);
        assert_eq!(
            r.cli(&["GET", "{leaderrun:n}:lease"]),
            "1:a",
            "kept by the AOF"
        );
        let mut renewed = None;
        // The first call after the restart may meet the dead connection.
        for _ in 0..3 {
            match a.renew(1, L, T).await {
                Ok(v) => {
                    renewed = Some(v);
                    break;
                }
                Err(e) => assert!(e.may_heal(), "{e}"),
            }
        }
        assert_eq!(renewed, Some(false), "a renewal on a restarted primary");
        // The next holder takes it over with the next epoch.
        r.cli(&["DEL", "{leaderrun:n}:lease"]);
        let mut b = lock(&r.url(), "n", "b");
        assert_eq!(b.acquire(L, T).await.unwrap(), Some(2));
        assert!(b.renew(2, L, T).await.unwrap());
    });
}

/// The same server, whose history changed under the lease: it followed
/// another primary for a while (its data replaced by that primary's) and
/// was promoted again. Its run_id is the same, its master_replid is not.
#[test]
fn a_primary_whose_history_changed_ends_the_lease() {
    let p = Pair::start(false);
    rt().block_on(async {
        let mut a = lock(&p.primary.url(), "n", "a");
        assert_eq!(a.acquire(L, T).await.unwrap(), Some(1));
        assert!(a.renew(1, L, T).await.unwrap());
        wait_for(
            "the replica to have the lease",
            Duration::from_secs(5),
            || {
                p.replica
                    .try_cli(&["GET", "{leaderrun:n}:lease"])
                    .as_deref()
                    == Ok("1:a")
            },
        );
        let (run_id, replid) = (
            p.primary.info("server", "run_id"),
            p.primary.info("replication", "master_replid"),
        );
        p.replica.promote();
        p.primary.cli(&["CONFIG", "SET", "masterauth", PASSWORD]);
        p.primary
            .cli(&["REPLICAOF", "127.0.0.1", &p.replica.port.to_string()]);
        p.primary.wait_synced();
        p.primary.promote();
        assert_eq!(p.primary.info("server", "run_id"), run_id);
        assert_ne!(p.primary.info("replication", "master_replid"), replid);
        assert_eq!(p.primary.cli(&["GET", "{leaderrun:n}:lease"]), "1:a");
        let mut renewed = None;
        for _ in 0..3 {
            match a.renew(1, L, T).await {
                Ok(v) => {
                    renewed = Some(v);
                    break;
                }
                Err(e) => assert!(e.may_heal(), "{e}"),
            }
        }
        assert_eq!(renewed, Some(false));
    });
}

/// `status`'s line on what a failover can lose, from what the server says.
#[test]
fn replication_is_reported() {
    let lone = Redis::start();
    let p = Pair::start(true);
    rt().block_on(async {
        let r = store(&lone.url()).replication(T).await.unwrap();
        assert_eq!(r.can_lose_acknowledged, Some(true), "{r:?}");
        assert!(r.detail.contains("primary"), "{r:?}");
        assert!(r.detail.contains("appendonly no"), "{r:?}");

        let r = store(&p.url(1)).replication(T).await.unwrap();
        assert_eq!(r.can_lose_acknowledged, Some(false), "{r:?}");
        assert!(r.detail.contains("1 replica connected"), "{r:?}");
        assert!(r.detail.contains("replicas=1"), "{r:?}");
        assert!(r.detail.contains("appendonly yes"), "{r:?}");

        // The same server without replicas= in the URL: an acquisition is
        // acknowledged before any replica has it.
        let r = store(&p.primary.url()).replication(T).await.unwrap();
        assert_eq!(r.can_lose_acknowledged, Some(true), "{r:?}");

        let r = store(&p.replica.url()).replication(T).await.unwrap();
        assert_eq!(r.can_lose_acknowledged, None, "{r:?}");
        assert!(r.detail.contains("replica of"), "{r:?}");
    });
    // Through `status`, the line under the table.
    let mut c = leaderrun();
    c.args(["status", "--store", &p.url(1)]);
    let st = run(c);
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    assert!(
        st.stdout
            .contains("a failover cannot lose an acknowledged acquisition"),
        "{}",
        st.stdout
    );
}

/// A deployment the docs call unsafe is named once per run, when the lease
/// is taken (not on a quiet try that found it held).
#[test]
fn an_unsafe_deployment_is_warned_about_once() {
    let p = Pair::start(false);
    let res = run(lr(&p.primary.url(), "w", &[], "true"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let warnings: Vec<&str> = res
        .stderr
        .lines()
        .filter(|l| l.contains("appendonly no"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", res.stderr);
    assert!(
        warnings[0].contains("min-replicas-to-write"),
        "{}",
        res.stderr
    );
    assert!(!res.stderr.contains(PASSWORD), "{}", res.stderr);

    // Durable, and refusing writes without a replica: nothing to say.
    let q = Pair::start(true);
    q.primary
        .cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    let res = run(lr(&q.primary.url(), "w", &[], "true"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert_eq!(res.stderr.trim(), "", "{}", res.stderr);
}

// ---------------------------------------------------------------------------
// What will not heal: exit 125 in both modes.

fn wait_run(url: &str, extra: &[&str]) -> (Output, Duration) {
    let mut args = vec!["--wait", "--retry", "200ms", "--timeout", "20s"];
    args.extend_from_slice(extra);
    let t0 = Instant::now();
    let res = run(lr(url, "fatal", &args, "echo ran"));
    (res, t0.elapsed())
}

#[test]
fn tls_against_an_unknown_ca_will_not_heal() {
    let r = Redis::start_tls();
    let url = format!("rediss://:{PASSWORD}@localhost:{}/0", r.port);
    // Trusting the test CA: it works.
    let mut c = lr(&url, "tls", &[], "echo ran");
    c.env("SSL_CERT_FILE", r.ca());
    let res = run(c);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert_eq!(res.stdout.trim(), "ran");
    // The system's roots only: refused, try-once and --wait alike.
    let res = run(lr(&url, "tls", &[], "echo ran"));
    assert_eq!(res.code, Some(125), "{}", res.stderr);
    assert!(res.stderr.contains("certificate"), "{}", res.stderr);
    assert!(!res.stderr.contains(PASSWORD), "{}", res.stderr);
    let (res, took) = wait_run(&url, &[]);
    assert_eq!(res.code, Some(125), "{}", res.stderr);
    assert!(took < Duration::from_secs(5), "{took:?}: {}", res.stderr);
    assert!(!res.stdout.contains("ran"));
}

#[test]
fn refused_logins_and_permissions_will_not_heal_under_wait() {
    let r = Redis::start();
    r.cli(&[
        "ACL", "SETUSER", "ro", "on", ">ro-pw", "~*", "+ping", "+get",
    ]);
    for (url, what) in [
        (
            format!("redis://:Wr0ngSecret@127.0.0.1:{}/0", r.port),
            "refused the user name or password",
        ),
        (format!("redis://127.0.0.1:{}/0", r.port), "NOAUTH"),
        (format!("redis://ro:ro-pw@127.0.0.1:{}/0", r.port), "NOPERM"),
    ] {
        let (res, took) = wait_run(&url, &[]);
        assert_eq!(res.code, Some(125), "{what}: {}", res.stderr);
        assert!(res.stderr.contains(what), "{what}: {}", res.stderr);
        assert!(took < Duration::from_secs(5), "{what}: {took:?}");
        assert!(!res.stderr.contains("Wr0ngSecret"), "{}", res.stderr);
    }
}

// ---------------------------------------------------------------------------
// The ACL in docs/stores.md: exactly what it lists, and everything works.

/// The `ACL SETUSER` line of docs/stores.md, with `password`.
fn documented_acl(password: &str) -> Vec<String> {
    let doc = include_str!("../docs/stores.md");
    let line = doc
        .lines()
        .find(|l| l.contains("ACL SETUSER leaderrun"))
        .expect("docs/stores.md shows the ACL SETUSER line");
    let words: Vec<String> = line
        .split_whitespace()
        .skip_while(|w| *w != "ACL")
        .map(|w| {
            w.trim_matches('\'')
                .replace(">SECRET", &format!(">{password}"))
        })
        .collect();
    assert!(
        words.iter().any(|w| w == &format!(">{password}")),
        "the documented line sets the password as >SECRET: {line}"
    );
    words
}

#[test]
fn the_documented_acl_is_enough() {
    let p = Pair::start(true);
    let acl = documented_acl("lr-pw");
    let args: Vec<&str> = acl.iter().map(String::as_str).collect();
    assert_eq!(p.primary.cli(&args), "OK");
    p.primary.cli(&["ACL", "LOG", "RESET"]);
    let url = format!("redis://leaderrun:lr-pw@127.0.0.1:{}/0", p.primary.port);
    let dir = TempDir::new("redis-acl");
    let bin = env!("CARGO_BIN_EXE_leaderrun");

    // Run, renew (R is 667 ms), `check` from inside the command, release.
    let mut c = lr(
        &url,
        "acl",
        &["--lease", "2s", "-vv"],
        &format!("sleep 1.6 && {bin} check"),
    );
    // For `check` inside the command: leaderrun hands it no store URL.
    c.env("LEADERRUN_STORE", &url);
    let res = run(c);
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    assert!(res.stderr.contains("renewed"), "{}", res.stderr);
    assert!(res.stderr.contains("released"), "{}", res.stderr);

    // With --min-hold the release keeps the lease; status shows it; an
    // operator's release clears it.
    let res = run(lr(&url, "acl", &["--min-hold", "30s"], "true"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let pttl: i64 = p
        .primary
        .cli(&["PTTL", "{leaderrun:acl}:lease"])
        .parse()
        .unwrap();
    assert!(pttl > 20_000, "kept: {pttl}");
    let mut c = leaderrun();
    c.args(["status", "--store", &url]);
    let st = run(c);
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    // Told from a running tenure: the run has ended (the values key, under
    // the same ACL).
    assert!(
        st.stdout
            .contains("kept by --min-hold (run ended), expires in"),
        "{}",
        st.stdout
    );
    let mut c = leaderrun();
    c.args(["release", "--store", &url, "--name", "acl"]);
    let rel = run(c);
    assert_eq!(rel.code, Some(0), "{}", rel.stderr);
    let mut c = leaderrun();
    c.args(["status", "--store", &url, "--name", "acl", "--json"]);
    let st = run(c);
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    assert!(
        st.stdout.contains("\"expires_in_ms\":null"),
        "{}",
        st.stdout
    );

    // Push wake-ups: a waiter is woken by the holder's release.
    let mut holder = spawn(
        lr(&url, "push", &["--lease", "10s"], &worker(&dir, "h")),
        &dir.file("h.log"),
    );
    wait_file(&dir.file("h.pid"), Duration::from_secs(10));
    let mut waiter = spawn(
        lr(&url, "push", &["--wait", "--retry", "30s", "-vv"], "true"),
        &dir.file("w.log"),
    );
    wait_for("the waiter to wait", Duration::from_secs(10), || {
        read(&dir.file("w.log")).contains("waiting")
    });
    signal(holder.id(), nix::sys::signal::Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
    let st = wait_exit(&mut waiter, Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", read(&dir.file("w.log")));
    assert!(
        read(&dir.file("w.log")).contains("the lease was released; trying now"),
        "{}",
        read(&dir.file("w.log"))
    );

    // replicas=1: WAIT is allowed too.
    let res = run(lr(&format!("{url}?replicas=1"), "acl", &[], "true"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);

    // --once-per: its scripts (TIME, the record's hash), a second firing
    // of the period, the record in status, with and without --name.
    let res = run(lr(&url, "once", &["--once-per", "1h"], "exit 3"));
    assert_eq!(res.code, Some(3), "{}", res.stderr);
    let res = run(lr(&url, "once", &["--once-per", "1h"], "exit 4"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    for args in [vec!["status"], vec!["status", "--name", "once"]] {
        let mut c = leaderrun();
        c.args(["--store", &url]).args(&args);
        let st = run(c);
        assert_eq!(st.code, Some(0), "{}", st.stderr);
        assert!(
            st.stdout.contains("last run of once: started"),
            "{}",
            st.stdout
        );
        assert!(st.stdout.contains(": exit 3"), "{}", st.stdout);
    }

    // Nothing was refused along the way but the optional CONFIG GET: every
    // `object` an ACL LOG entry names (a command, key or channel) is that.
    let log = p.primary.cli(&["ACL", "LOG"]);
    let lines: Vec<&str> = log.lines().map(str::trim).collect();
    let refused: Vec<&str> = lines
        .windows(2)
        .filter(|w| w[0] == "object")
        .map(|w| w[1])
        .filter(|o| *o != "config|get")
        .collect();
    assert!(refused.is_empty(), "refused {refused:?}: {log}");
}

/// `status` of a lease that was released says `free`, with no made-up age.
#[test]
fn status_of_a_free_lease_says_free() {
    let r = Redis::start();
    let res = run(lr(&r.url(), "job", &[], "true"));
    assert_eq!(res.code, Some(0), "{}", res.stderr);
    let mut c = leaderrun();
    c.args(["status", "--store", &r.url(), "--name", "job"]);
    let st = run(c);
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    let row = st
        .stdout
        .lines()
        .find(|l| l.starts_with("job"))
        .unwrap_or_else(|| panic!("{}", st.stdout));
    assert!(row.trim_end().ends_with("free"), "{row}");
    assert!(!row.contains("ago"), "{row}");
}
