//! `--once-per` on a run record this release cannot make sense of (written
//! by a newer or broken release, or by hand): the run refuses, exit 125 in
//! one line, and the command does not run, with or without
//! `--retry-failed`; `status` still lists the lease. One test per store,
//! each record broken by hand on the real server.

use crate::support::etcd::Etcd;
use crate::support::mysql::My;
use crate::support::redis::Redis;
use crate::support::*;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// One way to break a record: what it is, whether `status` marks it (the
/// outcome is the broken part), and the break, given the lease's name.
type Break<'a> = (&'a str, bool, &'a dyn Fn(&str));

/// For each `(what, marked, break)`: a run of a fresh name leaves a good record
/// (exit 0), `break(name)` spoils it; then `status` (text and JSON) still
/// lists the lease, and a `--once-per` firing, plain or retrying, exits
/// 125 with one line naming the run record, never running the command.
/// `marked`: the outcome is the broken part, which `status` marks.
fn broken_records_are_refused(url: &str, breaks: &[Break]) {
    let dir = TempDir::new("once-broken");
    let ran = dir.file("ran");
    let script = format!("echo >> {}", ran.display());
    for (i, (what, marked, spoil)) in breaks.iter().enumerate() {
        let name = format!("b{i}");
        let out = run(lr(url, &name, &["--once-per", "4s"], "true"));
        assert_eq!(out.code, Some(0), "{what}: {}", out.stderr);
        spoil(&name);
        let mut c = leaderrun();
        c.args(["--store", url, "status", "--name", &name, "--json"]);
        let out = run(c);
        assert_eq!(out.code, Some(0), "{what}: {}", out.stderr);
        let j = json(&out.stdout);
        assert_eq!(j["name"], name.as_str(), "{what}: {j}");
        let mut c = leaderrun();
        c.args(["--store", url, "status"]);
        let out = run(c);
        assert_eq!(out.code, Some(0), "{what}: {}", out.stderr);
        assert!(out.stdout.contains(&name), "{what}: {}", out.stdout);
        if *marked {
            assert_eq!(j["last_run"]["unreadable"], true, "{what}: {j}");
            assert!(out.stdout.contains("unreadable"), "{what}: {}", out.stdout);
        }
        for extra in [&[][..], &["--retry-failed"]] {
            let mut args = vec!["--once-per", "4s", "--conflict-exit-code", "3"];
            args.extend_from_slice(extra);
            let out = run(lr(url, &name, &args, &script));
            assert_eq!(out.code, Some(125), "{what} {extra:?}: {}", out.stderr);
            assert_eq!(
                out.stderr.trim().lines().count(),
                1,
                "{what}: {}",
                out.stderr
            );
            assert!(out.stderr.contains("run record"), "{what}: {}", out.stderr);
            assert!(!out.stderr.contains("panicked"), "{what}: {}", out.stderr);
            assert!(!ran.exists(), "{what} {extra:?}: the command ran");
        }
        // A plain run is not bound by the record, and does not read it.
        let out = run(lr(url, &name, &[], "true"));
        assert_eq!(out.code, Some(0), "{what}: {}", out.stderr);
    }
}

#[test]
fn postgres_a_broken_record_is_refused() {
    let pg = Pg::start();
    let set = |name: &str, set: &str| {
        pg.sql(&format!(
            "UPDATE leader_lease SET {set} WHERE name = '{name}'"
        ));
    };
    broken_records_are_refused(
        &pg.url(),
        &[
            ("an unknown outcome", true, &|n| {
                set(n, "run_outcome = 'exploded'")
            }),
            ("an outcome in capitals", true, &|n| {
                set(n, "run_outcome = 'EXIT 0'")
            }),
            ("a start years ahead", false, &|n| {
                set(n, "run_started_at = now() + interval '5 years'")
            }),
            ("a start at infinity", false, &|n| {
                set(n, "run_started_at = 'infinity'")
            }),
        ],
    );
}

#[test]
fn mysql_a_broken_record_is_refused() {
    let my = My::start();
    let set = |name: &str, set: &str| {
        my.sql(&format!(
            "UPDATE leader_lease SET {set} WHERE name = '{name}'"
        ));
    };
    broken_records_are_refused(
        &my.url(),
        &[
            ("an unknown outcome", true, &|n| {
                set(n, "run_outcome = 'exploded'")
            }),
            // The column's collation ignores case; the check must not.
            ("an outcome in capitals", true, &|n| {
                set(n, "run_outcome = 'EXIT 0'")
            }),
            ("a start years ahead", false, &|n| {
                set(n, "run_started_at = UTC_TIMESTAMP(6) + INTERVAL 5 YEAR")
            }),
        ],
    );
}

#[test]
fn sqlite_a_broken_record_is_refused() {
    let dir = TempDir::new("once-broken-lite");
    let db = dir.file("leases.db");
    let url = format!("sqlite://{}", db.display());
    let set = |name: &str, set: &str| {
        let file = leaderrun::store::sqlite::lease_file(&db, name).expect("a file name");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            use sqlx::Connection;
            let u = format!("sqlite://{}", file.display());
            let mut c = sqlx::SqliteConnection::connect(&u).await.expect("open");
            sqlx::raw_sql(&format!("UPDATE leader_lease SET {set}"))
                .execute(&mut c)
                .await
                .expect("sql");
        });
    };
    broken_records_are_refused(
        &url,
        &[
            ("an unknown outcome", true, &|n| {
                set(n, "run_outcome = 'exploded'")
            }),
            ("an outcome that is a number", true, &|n| {
                set(n, "run_outcome = 7")
            }),
            ("a start that is text", false, &|n| {
                set(n, "run_started_at = 'soon'")
            }),
            ("a start years ahead", false, &|n| {
                set(n, "run_started_at = run_started_at + 157680000000")
            }),
        ],
    );
}

#[test]
fn redis_a_broken_record_is_refused() {
    let r = Redis::start();
    let key = |n: &str| format!("{{leaderrun:{n}}}:run");
    let hset = |n: &str, f: &str, v: &str| {
        r.cli(&["HSET", &key(n), f, v]);
    };
    broken_records_are_refused(
        &r.url(),
        &[
            ("an unknown outcome", true, &|n| {
                hset(n, "outcome", "exploded")
            }),
            ("a start that is text", false, &|n| {
                hset(n, "started", "soon")
            }),
            ("an epoch that is text", false, &|n| hset(n, "epoch", "x")),
            ("an end that is text", false, &|n| hset(n, "ended", "later")),
            ("a start years ahead", false, &|n| {
                hset(n, "started", "99999999999999")
            }),
            ("a record that is not a hash", false, &|n| {
                r.cli(&["DEL", &key(n)]);
                r.cli(&["SET", &key(n), "garbage"]);
            }),
            ("a period key that is not START:EPOCH", false, &|n| {
                r.cli(&[
                    "SET",
                    &format!("{{leaderrun:{n}}}:period"),
                    "garbage",
                    "PX",
                    "60000",
                ]);
            }),
        ],
    );
}

#[test]
fn etcd_a_broken_record_is_refused() {
    let e = Etcd::start();
    let put = |n: &str, v: &str| {
        e.ctl(&["put", &format!("leaderrun/run/{n}"), v]);
    };
    let stored = |outcome: &str, started: i64| {
        format!(
            r#"{{"started_ms":{started},"ended_ms":1,"holder":"h","epoch":1,"outcome":"{outcome}"}}"#
        )
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    broken_records_are_refused(
        &e.url(),
        &[
            ("an unknown outcome", true, &|n| {
                put(n, &stored("exploded", now))
            }),
            ("a value that is not JSON", false, &|n| put(n, "garbage")),
        ],
    );
}

/// The record is `CHROOT/leaderrun/NAME/run`, `EPOCH\nOUTCOME\nHOLDER`; its
/// start is the node's creation time, which only the server stamps. A URL
/// without credentials leaves the nodes open to the hand edit.
#[test]
fn zookeeper_a_broken_record_is_refused() {
    use crate::support::zookeeper::{Client, Zk};
    let z = Zk::start();
    let set = |n: &str, data: &[u8]| {
        let mut c = Client::connect(z.port(), None);
        c.set(&format!("/leaderrun/{n}/run"), data);
        c.close();
    };
    broken_records_are_refused(
        &format!("zk://127.0.0.1:{}", z.port()),
        &[
            ("an unknown outcome", true, &|n| set(n, b"1\nexploded\nh")),
            ("an outcome in capitals", true, &|n| set(n, b"1\nEXIT 0\nh")),
            ("data that is not a record", false, &|n| set(n, b"garbage")),
        ],
    );
}
