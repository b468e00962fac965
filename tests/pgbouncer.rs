//! leaderrun through Debian's PgBouncer (1.18: no prepared statement
//! support), in transaction and in session pooling, with no pooler settings
//! beyond the pool mode. Status, release and check through the pooler are in
//! `tests/admin.rs`; the store contract in `tests/conformance.rs`
//! (`pgbouncer_transaction::`, `pgbouncer_session::`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::pgbouncer::{Bouncer, Mode};
use crate::support::*;
use leaderrun::store::{open, LeaseLock, Origin};
use nix::sys::signal::Signal;

const SEC: Duration = Duration::from_secs(1);

/// A holder runs, is killed with `kill -9`; a `--wait` standby takes over
/// (its watchdog hands the lease back through the pooler) at the next
/// epoch, and both commands see their epochs.
fn takeover(mode: Mode) {
    let pg = Pg::start();
    let b = Bouncer::start(&pg, mode);
    let dir = TempDir::new("pgb-takeover");
    let timing = ["--lease", "3s", "--retry", "200ms"];
    let mut a = spawn(
        lr(&b.url(), "job", &timing, &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let mut waiting = timing.to_vec();
    waiting.push("--wait");
    let mut s = spawn(
        lr(&b.url(), "job", &waiting, &worker(&dir, "s")),
        &dir.file("s.log"),
    );
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        !dir.file("s.pid").exists(),
        "the standby ran while a held the lease"
    );
    signal(a.id(), Signal::SIGKILL);
    let _ = a.wait();
    wait_file(&dir.file("s.pid"), 10 * SEC);
    assert_eq!(read(&dir.file("a.epoch")).trim(), "1");
    assert_eq!(
        read(&dir.file("s.epoch")).trim(),
        "2",
        "{}",
        read(&dir.file("s.log"))
    );
    // Several renewals (every 1 s) went through the pooler meanwhile.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        alive(pid_in(&dir.file("s.pid"))),
        "{}",
        read(&dir.file("s.log"))
    );
    signal(s.id(), Signal::SIGTERM);
    let st = wait_exit(&mut s, 10 * SEC);
    assert_eq!(st.code(), Some(143), "{}", read(&dir.file("s.log")));
    assert_eq!(pg.lease_row("job"), "|2|f", "released");
    assert!(
        !b.log().contains("unsupported startup parameter"),
        "{}",
        b.log()
    );
}

#[test]
fn wait_takeover_in_transaction_mode() {
    takeover(Mode::Transaction);
}

#[test]
fn wait_takeover_in_session_mode() {
    takeover(Mode::Session);
}

/// A database the pooler does not know, and a startup parameter it refuses,
/// are configuration errors: `--wait` ends at once with 125 instead of
/// retrying until `--timeout`.
#[test]
fn pooler_configuration_errors_end_the_wait() {
    let pg = Pg::start();
    let b = Bouncer::start(&pg, Mode::Transaction);
    for (url, says) in [
        (b.url_db("nodb"), "no such database"),
        (
            format!("{}&options=-cwork_mem%3D8MB", b.url()),
            "unsupported startup parameter",
        ),
        (
            b.url().replace(crate::support::pg::PASSWORD, "Wr0ng-pw"),
            "authentication failed",
        ),
    ] {
        let t0 = Instant::now();
        let r = run(lr(&url, "cfg", &["--wait", "--timeout", "20s"], "true"));
        assert_eq!(r.code, Some(125), "{says}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{}", r.stderr);
        assert!(t0.elapsed() < 10 * SEC, "{says}: took {:?}", t0.elapsed());
    }
}

/// The server-side timeouts hold through transaction pooling (a statement
/// stuck behind a row lock is cancelled by the server, not only abandoned
/// by the client), and leave nothing on the server connection: with one
/// server connection in the pool, the next client sees the defaults.
#[test]
fn server_side_timeouts_hold_and_do_not_leak_through_transaction_pooling() {
    let pg = Pg::start();
    let b = Bouncer::start_with(&pg, Mode::Transaction, "default_pool_size = 1\n");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut s = open(
            Some((&b.url(), Origin::Flag)),
            "leaderrun-test",
            Duration::from_millis(300),
        )
        .expect("url parses")
        .lock("n", "a");
        assert_eq!(
            s.acquire(30 * SEC, 5 * SEC).await.expect("acquire"),
            Some(1)
        );
        // Another session, straight to the server, holds the row lock.
        let mut locker = Command::new(pg.bin().join("psql"))
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .arg("-p")
            .arg(pg.port.to_string())
            .args([
                "-c",
                "BEGIN; SELECT 1 FROM leader_lease WHERE name = 'n' FOR UPDATE; SELECT pg_sleep(8)",
            ])
            .env("PGPASSWORD", crate::support::pg::PASSWORD)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("psql");
        wait_for("the row lock", 10 * SEC, || {
            pg.sql(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                    WHERE c.relname = 'leader_lease' AND l.mode = 'RowShareLock'",
            ) != "0"
        });
        let t0 = Instant::now();
        // A client-side bound of 5 s: only the server's 300 ms ends it early.
        let err = s.renew(1, 30 * SEC, 5 * SEC).await.expect_err("locked");
        let took = t0.elapsed();
        assert!(err.may_heal(), "{err:?}");
        // Statement or lock timeout, whichever the server notices first.
        assert!(err.to_string().contains("due to"), "{err}");
        assert!(err.to_string().contains("timeout"), "{err}");
        assert!(took < 2 * SEC, "{took:?}");
        // The backend would sleep on after psql died: end it.
        pg.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query LIKE '%pg_sleep(8)%' AND pid <> pg_backend_pid()",
        );
        let _ = locker.wait();
        assert_eq!(
            pg.try_sql_via(b.port, "SHOW statement_timeout; SHOW lock_timeout"),
            Ok("0\n0".to_string())
        );
        // The store works on afterwards.
        assert!(s.renew(1, 30 * SEC, 5 * SEC).await.expect("renew"));
    });
}

/// A `--wait` standby without `--no-push` behind transaction pooling: its
/// `LISTEN` cannot hold there. It must not leave one on a pooled server
/// connection that later runs (any lease name) trip over: every run through
/// the pool afterwards is silent, and the standby says once, at `-v`, that
/// wake-ups are unavailable, and polls.
#[test]
fn a_waiter_with_push_leaves_nothing_behind_in_a_transaction_pool() {
    let pg = Pg::start();
    let b = Bouncer::start_with(&pg, Mode::Transaction, "default_pool_size = 2\n");
    let dir = TempDir::new("pgb-stray");
    let mut a = spawn(
        lr(&b.url(), "held", &["--lease", "3s"], &worker(&dir, "a")),
        &dir.file("a.log"),
    );
    wait_file(&dir.file("a.pid"), 10 * SEC);
    let wlog = dir.file("w.log");
    let ran = dir.file("w.ran");
    let mut w = spawn(
        lr(
            &b.url(),
            "held",
            &["-v", "--wait", "--lease", "3s", "--retry", "500ms"],
            &format!("touch {}", ran.display()),
        ),
        &wlog,
    );
    wait_for("the standby to wait", 10 * SEC, || {
        read(&wlog).contains("waiting:")
    });
    for i in 0..20 {
        let r = run(lr(&b.url(), &format!("other-{i}"), &[], "true"));
        assert_eq!(r.code, Some(0), "run {i}: {}", r.stderr);
        assert_eq!(r.stderr, "", "run {i} through the pool was not silent");
    }
    wait_for("the standby to say push is unavailable", 10 * SEC, || {
        read(&wlog).contains("LISTEN does not hold")
    });
    // No LISTEN is left on a server connection the pool hands out.
    for _ in 0..6 {
        assert_eq!(
            pg.try_sql_via(b.port, "SELECT count(*) FROM pg_listening_channels()"),
            Ok("0".to_string())
        );
    }
    // The standby polls, and takes over once the holder is gone.
    signal(a.id(), Signal::SIGTERM);
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(143));
    assert_eq!(
        wait_exit(&mut w, 10 * SEC).code(),
        Some(0),
        "{}",
        read(&wlog)
    );
    assert!(ran.exists());
    let text = read(&wlog);
    assert_eq!(
        text.matches("LISTEN does not hold").count(),
        1,
        "said once: {text}"
    );
    for bad in ["WARN", "ERROR", "could not release"] {
        assert!(!text.contains(bad), "{bad}: {text}");
    }
    // The holder's renewals and release went through the same pool.
    let held = read(&dir.file("a.log"));
    for bad in ["renew", "could not release", "NotificationResponse"] {
        assert!(!held.contains(bad), "{bad}: {held}");
    }
}
