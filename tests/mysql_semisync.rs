//! `?require=sync` on MariaDB: leaderrun leads only on acquisitions a
//! semi-synchronous replica acknowledged. A real primary (binary log,
//! semi-sync on) and a real replica (`CHANGE MASTER TO`, semi-sync on),
//! both throwaway servers on free ports in temp dirs.

use std::time::{Duration, Instant};

use crate::support::mysql::My;
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);

fn sync_url(my: &My) -> String {
    format!("{}?require=sync", my.url())
}

fn admin(store: &str, args: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(args).args(["--store", store]);
    run(c)
}

/// With a replica acknowledging, a run leads, and what it acquired is on
/// the replica; `status` says a failover cannot lose it. Without a
/// connected replica nothing starts (125, naming what is missing); under
/// `--wait` that may heal, and the waiter leads once the replica is back.
#[test]
fn require_sync_leads_only_while_a_replica_is_connected() {
    let primary = My::start_primary();
    let replica = My::start_replica(&primary);
    let url = sync_url(&primary);
    let r = run(lr(&url, "s", &[], "echo $LEASE_EPOCH"));
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "1"), "{}", r.stderr);
    wait_for("the acquisition on the replica", 10 * SEC, || {
        replica
            .try_sql("SELECT epoch FROM leader_lease WHERE name = 's'")
            .is_ok_and(|e| e == "1")
    });
    let st = admin(&url, &["status"]);
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    assert!(
        st.stdout
            .contains("replication: semi-synchronous, 1 replica(s) connected"),
        "{}",
        st.stdout
    );
    assert!(
        st.stdout
            .contains("a failover cannot lose an acknowledged acquisition"),
        "{}",
        st.stdout
    );

    replica.sql("STOP SLAVE");
    primary.wait_for_replicas(0);
    let dir = TempDir::new("semisync");
    let ran = dir.file("ran");
    let touch = format!("touch {}", ran.display());
    let r = run(lr(&url, "s", &[], &touch));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("no semi-synchronous replica is connected"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains(crate::support::mysql::PASSWORD),
        "{}",
        r.stderr
    );
    assert!(!ran.exists(), "the command ran without a replica");
    let st = admin(&url, &["status", "--json", "--name", "s"]);
    let j: serde_json::Value = serde_json::from_str(st.stdout.trim()).expect("json");
    assert_eq!(j["failover_can_lose_acquisition"], true, "{j}");

    let log = dir.file("w.log");
    let mut w = spawn(lr(&url, "s", &["--wait", "--retry", "200ms"], &touch), &log);
    wait_for("the waiter to say why", 10 * SEC, || {
        read(&log).contains("no semi-synchronous replica")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(w.try_wait().expect("try_wait").is_none(), "{}", read(&log));
    replica.sql("START SLAVE");
    wait_file(&ran, 20 * SEC);
    assert_eq!(
        wait_exit(&mut w, 10 * SEC).code(),
        Some(0),
        "{}",
        read(&log)
    );
}

/// A replica that stops answering (frozen) while the primary still counts
/// it: the acquire's commit waits `rpl_semi_sync_master_timeout`, then the
/// primary falls back to asynchronous and acknowledges it anyway. leaderrun
/// sees the count of unacknowledged commits rise, hands the lease back and
/// starts nothing; a holder whose renewals go unacknowledged stops (75)
/// within its give-up time, as it would on a lost store.
#[test]
fn an_unacknowledged_acquisition_or_renewal_does_not_count() {
    let primary = My::start_primary();
    let replica = My::start_replica(&primary);
    primary.sql("SET GLOBAL rpl_semi_sync_master_timeout = 500");
    let url = sync_url(&primary);
    let dir = TempDir::new("semisync-ack");
    // The table exists, so the first acquisition is one commit.
    assert_eq!(run(lr(&url, "warm", &[], "true")).code, Some(0));

    replica.freeze(true);
    let ran = dir.file("ran");
    let r = run(lr(
        &url,
        "a",
        &["--lease", "6s"],
        &format!("touch {}", ran.display()),
    ));
    replica.freeze(false);
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr.contains("not acknowledged by a replica"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("handed back"), "{}", r.stderr);
    assert!(!ran.exists(), "the command ran on an unacknowledged lease");
    assert_eq!(
        primary.sql("SELECT CONCAT(epoch, '|', holder IS NULL) FROM leader_lease WHERE name = 'a'"),
        "1|1",
        "handed back at its epoch"
    );

    // Back to semi-synchronous once the replica caught up.
    wait_for("semi-sync to come back", 20 * SEC, || {
        primary.status("Rpl_semi_sync_master_status") == "ON"
    });
    let log = dir.file("h.log");
    let mut h = spawn(lr(&url, "h", &["--lease", "3s"], &worker(&dir, "h")), &log);
    wait_file(&dir.file("h.pid"), 10 * SEC);
    let frozen = Instant::now();
    replica.freeze(true);
    let st = wait_exit(&mut h, 10 * SEC);
    let took = frozen.elapsed();
    replica.freeze(false);
    assert_eq!(st.code(), Some(75), "{}", read(&log));
    assert!(
        read(&log).contains("not acknowledged by a replica"),
        "{}",
        read(&log)
    );
    // The last renewal that counts was sent before the freeze: SIGTERM by
    // G (2 s) after it, SIGKILL by G + K (2.5 s), plus a second for the
    // processes to go on a loaded machine.
    assert!(took < Duration::from_millis(3500), "{took:?}");
    assert!(!alive(pid_in(&dir.file("h.pid"))));
}

/// A server without semi-sync (no binary log, semi-sync off): `require=sync`
/// is a configuration that will not heal, 125 at once even under `--wait`.
#[test]
fn require_sync_on_a_server_without_semi_sync_is_125_at_once() {
    let my = My::start();
    let t0 = Instant::now();
    let r = run(lr(
        &sync_url(&my),
        "s",
        &["--wait", "--timeout", "20s"],
        "true",
    ));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr.contains("semi-synchronous replication is off"),
        "{}",
        r.stderr
    );
    assert!(t0.elapsed() < 10 * SEC, "{:?}", t0.elapsed());
    // Without require=sync it leads; status says what it can (nothing of
    // a replica, whose storage may still be replicated out of sight).
    assert_eq!(run(lr(&my.url(), "s", &[], "true")).code, Some(0));
    let st = admin(&my.url(), &["status"]);
    assert!(
        st.stdout.contains("replication: binary log off") && st.stdout.contains("is not known"),
        "{}",
        st.stdout
    );
}

/// A binary log without semi-sync is asynchronous replication: `status`
/// says a failover can lose an acquisition, and `require=sync` refuses.
#[test]
fn a_binary_log_without_semi_sync_is_asynchronous() {
    let my = My::start_with(vec!["--log-bin=bin".into(), "--server-id=1".into()]);
    assert_eq!(run(lr(&my.url(), "s", &[], "true")).code, Some(0));
    let st = admin(&my.url(), &["status"]);
    assert!(
        st.stdout.contains("replication: asynchronous")
            && st
                .stdout
                .contains("a failover can lose an acknowledged acquisition"),
        "{}",
        st.stdout
    );
    let r = run(lr(&sync_url(&my), "s", &[], "true"));
    assert_eq!(r.code, Some(125), "{}", r.stderr);
}

/// Not a check: what `require=sync` costs per call, against a primary and
/// a semi-sync replica on this machine. 300 rounds, the two stores
/// interleaved; medians. Run with
/// `cargo nextest run --run-ignored only -E 'test(/^mysql_semisync::.*cost/)' --no-capture`.
#[test]
#[ignore = "a measurement, not a check"]
fn require_sync_cost() {
    use leaderrun::store::{open, LeaseLock, Origin};
    let primary = My::start_primary();
    let _replica = My::start_replica(&primary);
    let t = 5 * SEC;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let urls = [primary.url(), sync_url(&primary)];
        let lock = |u: &str, name: &str| {
            open(Some((u, Origin::Flag)), "cost", t)
                .expect("open")
                .lock(name, "h")
        };
        lock(&urls[0], "warm").acquire(t, t).await.expect("warm");
        let mut took = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
        for i in 0..300 {
            for (k, url) in urls.iter().enumerate() {
                // One lease per round, each a lock of its own (as one run
                // is): a connection is made in the first call.
                let mut s = lock(url, &format!("c{k}-{i}"));
                s.inspect(t).await.expect("connect");
                let t0 = Instant::now();
                let e = s.acquire(t, t).await.expect("acquire");
                took[k][0].push(t0.elapsed());
                let e = e.expect("free");
                let t0 = Instant::now();
                assert!(s.renew(e, t, t).await.expect("renew"));
                took[k][1].push(t0.elapsed());
                s.release(e, Duration::ZERO, t).await.expect("release");
            }
        }
        let med = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64() * 1000.0
        };
        let [[a0, r0], [a1, r1]] = &mut took;
        eprintln!(
            "acquire median: plain {:.3} ms, require=sync {:.3} ms; \
             renew median: plain {:.3} ms, require=sync {:.3} ms",
            med(a0),
            med(a1),
            med(r0),
            med(r1)
        );
    });
}
