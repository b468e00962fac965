//! `--slots N`: up to N holders of one name, each slot a lease of its own
//! with its own epoch, against real stores. What a user relies on: never
//! more than N commands at once, and N at once when N are waiting; every
//! waiter runs; `LEASE_SLOT` and a per-slot `LEASE_EPOCH` that only rises;
//! contenders that disagree on N refused before anything runs; `status`,
//! `release --slot`, `check` and `watch` that know slots.

use std::time::Duration;

use crate::support::stores::{self, Server};
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// One command's run, as it wrote it down: its slot, its epoch, and when
/// it started and ended (ns of the wall clock, one host).
#[derive(Debug)]
struct Ran {
    slot: u32,
    epoch: i64,
    start: u128,
    end: u128,
}

/// The command each contender runs: it writes its slot, epoch and start,
/// runs `hold` seconds, and writes its end.
fn recorder(dir: &TempDir, tag: &str, hold: &str) -> String {
    format!(
        "f={}; echo \"$LEASE_SLOT $LEASE_EPOCH $(date +%s%N)\" > $f.tmp; sleep {hold}; \
         echo \"$(cat $f.tmp) $(date +%s%N)\" > $f",
        dir.file(tag).display()
    )
}

fn ran(dir: &TempDir, tag: &str) -> Ran {
    let text = read(&dir.file(tag));
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(f.len(), 4, "{tag}: {text:?}");
    Ran {
        slot: f[0].parse().expect("slot"),
        epoch: f[1].parse().expect("epoch"),
        start: f[2].parse().expect("start"),
        end: f[3].parse().expect("end"),
    }
}

/// Most commands running at one instant.
fn most_at_once(runs: &[Ran]) -> usize {
    runs.iter()
        .map(|r| {
            runs.iter()
                .filter(|o| o.start <= r.start && r.start < o.end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Four `--wait` contenders with `--slots 2`, started together, each
/// running a command of 0.6 s: two run at once, never three; all four run;
/// both slots are used, and each slot's epochs rise in the order its
/// commands started. Then a third slot's worth of contenders: six with
/// `--slots 3`, run after those ended (no live holder disagrees).
fn share_on(srv: Server) {
    let dir = TempDir::new("slots");
    let mut kids = Vec::new();
    for i in 0..4 {
        let tag = format!("c{i}");
        kids.push(spawn(
            lr(
                &srv.url,
                "pool",
                &[
                    "--slots", "2", "--wait", "--lease", "3s", "--retry", "200ms",
                ],
                &recorder(&dir, &tag, "0.6"),
            ),
            &dir.file(&format!("{tag}.log")),
        ));
    }
    for (i, k) in kids.iter_mut().enumerate() {
        let st = wait_exit(k, 30 * SEC);
        assert_eq!(
            st.code(),
            Some(0),
            "{}",
            read(&dir.file(&format!("c{i}.log")))
        );
    }
    let runs: Vec<Ran> = (0..4).map(|i| ran(&dir, &format!("c{i}"))).collect();
    let most = most_at_once(&runs);
    for slot in [0, 1] {
        let mut mine: Vec<&Ran> = runs.iter().filter(|r| r.slot == slot).collect();
        assert!(!mine.is_empty(), "slot {slot} never used: {runs:?}");
        mine.sort_by_key(|r| r.start);
        assert!(
            mine.windows(2).all(|w| w[0].epoch < w[1].epoch),
            "slot {slot}'s epochs do not rise: {runs:?}"
        );
    }
    eprintln!(
        "--slots 2, 4 contenders: most at once {most}, runs {}, slots used {:?}, epochs {:?}",
        runs.len(),
        runs.iter().map(|r| r.slot).collect::<Vec<_>>(),
        runs.iter().map(|r| (r.slot, r.epoch)).collect::<Vec<_>>()
    );
    assert_eq!(most, 2, "{runs:?}");
}

#[test]
fn four_share_two_slots_embedded() {
    share_on(stores::sqlite());
}

#[test]
fn four_share_two_slots_postgres() {
    share_on(stores::postgres());
}

#[test]
fn four_share_two_slots_pgbouncer_transaction() {
    share_on(stores::pgbouncer_transaction());
}

#[test]
fn four_share_two_slots_mysql() {
    share_on(stores::mysql());
}

#[test]
fn four_share_two_slots_redis() {
    share_on(stores::redis());
}

#[test]
fn four_share_two_slots_etcd() {
    share_on(stores::etcd());
}

#[test]
fn four_share_two_slots_zookeeper() {
    share_on(stores::zookeeper());
}

/// Contenders that disagree on N are refused, exit 2, one line naming both
/// values, before their command starts; the holder runs on. Both ways: a
/// larger N meeting a holder of a smaller one, and `--slots 2` meeting a
/// plain run's lease (N = 1).
fn disagree_on(srv: Server) {
    let dir = TempDir::new("slots-disagree");
    let hold = format!(
        "touch {r}; while [ ! -e {s} ]; do sleep 0.01; done",
        r = dir.file("running").display(),
        s = dir.file("stop").display(),
    );
    for (held_with, asked) in [(&["--slots", "2"][..], "3"), (&[][..], "2")] {
        let _ = std::fs::remove_file(dir.file("running"));
        let _ = std::fs::remove_file(dir.file("stop"));
        let mut holder = spawn(lr(&srv.url, "dis", held_with, &hold), &dir.file("h.log"));
        wait_file(&dir.file("running"), 10 * SEC);
        let ran = dir.file("ran");
        let out = run(lr(
            &srv.url,
            "dis",
            &["--slots", asked],
            &format!("touch {}", ran.display()),
        ));
        let had = if held_with.is_empty() { "1" } else { "2" };
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        // One line says why (a store's own warning aside: a test Redis
        // keeps no append-only file, which every run there warns of).
        let errors = out.stderr.lines().filter(|l| !l.contains(" WARN ")).count();
        assert_eq!(errors, 1, "{}", out.stderr);
        assert!(
            out.stderr.contains(&format!("--slots {asked}"))
                && out.stderr.contains(&format!("with --slots {had}")),
            "{}",
            out.stderr
        );
        assert!(!ran.exists(), "the command ran");
        std::fs::write(dir.file("stop"), "").unwrap();
        assert_eq!(wait_exit(&mut holder, 10 * SEC).code(), Some(0));
    }
    // The refused run handed its slot back: all free now.
    let mut c = leaderrun();
    c.args(["--store", &srv.url, "status", "--json"]);
    let st = json(&run(c).stdout);
    let live: Vec<&serde_json::Value> = st
        .as_array()
        .expect("array")
        .iter()
        .filter(|l| l["live"] == true)
        .collect();
    assert!(live.is_empty(), "{st}");
}

#[test]
fn disagreeing_slots_are_refused_embedded() {
    disagree_on(stores::sqlite());
}

#[test]
fn disagreeing_slots_are_refused_postgres() {
    disagree_on(stores::postgres());
}

#[test]
fn disagreeing_slots_are_refused_mysql() {
    disagree_on(stores::mysql());
}

#[test]
fn disagreeing_slots_are_refused_redis() {
    disagree_on(stores::redis());
}

#[test]
fn disagreeing_slots_are_refused_etcd() {
    disagree_on(stores::etcd());
}

#[test]
fn disagreeing_slots_are_refused_zookeeper() {
    disagree_on(stores::zookeeper());
}

/// The operator's side: `status` shows each slot (text: `NAME#1`; JSON:
/// the name, `slot`, `slots`, and with `--name` the other slots beside
/// slot 0); the command's own `check` (no flags: `LEASE_SLOT` from the
/// environment) answers for its slot, through its holder and from the
/// store; `watch --json --name` prints the slot of an acquisition; and
/// `release --slot 1` ends that slot's run (exit 75) and not the other.
fn operate_on(srv: Server) {
    let dir = TempDir::new("slots-ops");
    let bin = env!("CARGO_BIN_EXE_leaderrun");
    let mut init = leaderrun();
    init.args(["--store", &srv.url, "init"]);
    assert_eq!(run(init).code, Some(0));
    let (mut watch, lines) = watch_json(&srv.url, "ops", &dir);
    assert_eq!(
        lines.recv_timeout(10 * SEC).expect("state line")["event"],
        "state"
    );

    let holder = |tag: &str| {
        // Checks itself twice (through its holder, then from the store
        // with LEASE_STATE unset), then waits for its stop file.
        let script = format!(
            "{bin} check; echo $? > {t}.via-holder; \
             env -u LEASE_STATE {bin} --store '{url}' check; echo $? > {t}.via-store; \
             touch {t}.running; while [ ! -e {t}.stop ]; do sleep 0.01; done",
            t = dir.file(tag).display(),
            url = srv.url,
        );
        spawn(
            lr(
                &srv.url,
                "ops",
                &["--slots", "2", "--advertise", tag, "--lease", "3s"],
                &script,
            ),
            &dir.file(&format!("{tag}.log")),
        )
    };
    let mut a = holder("a");
    wait_file(&dir.file("a.running"), 10 * SEC);
    let mut b = holder("b");
    wait_file(&dir.file("b.running"), 10 * SEC);
    for t in ["a", "b"] {
        for how in ["via-holder", "via-store"] {
            assert_eq!(
                read(&dir.file(&format!("{t}.{how}"))).trim(),
                "0",
                "{t}'s check {how}: {}",
                read(&dir.file(&format!("{t}.log")))
            );
        }
    }

    let mut c = leaderrun();
    c.args(["--store", &srv.url, "status"]);
    let text = run(c).stdout;
    assert!(
        text.lines()
            .any(|l| l.starts_with("ops ") && l.contains("advertises a"))
            && text
                .lines()
                .any(|l| l.starts_with("ops#1 ") && l.contains("advertises b")),
        "{text}"
    );
    let mut c = leaderrun();
    c.args(["--store", &srv.url, "status", "--name", "ops", "--json"]);
    let st = json(&run(c).stdout);
    assert_eq!(
        (&st["name"], &st["slot"], &st["slots"], &st["advertised"]),
        (&"ops".into(), &0.into(), &2.into(), &"a".into()),
        "{st}"
    );
    let other = &st["other_slots"][0];
    assert_eq!(
        (&other["name"], &other["slot"], &other["advertised"]),
        (&"ops".into(), &1.into(), &"b".into()),
        "{st}"
    );

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let l = lines
            .recv_timeout(10 * SEC)
            .expect("watch's acquired lines");
        if l["event"] == "acquired" {
            assert_eq!(l["name"], "ops", "{l}");
            seen.push(l["slot"].as_u64().expect("slot"));
        }
    }
    seen.sort();
    assert_eq!(seen, [0, 1]);

    let mut c = leaderrun();
    c.args([
        "--store", &srv.url, "release", "--name", "ops", "--slot", "1",
    ]);
    let out = run(c);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("released ops#1"), "{}", out.stdout);
    assert_eq!(wait_exit(&mut b, 10 * SEC).code(), Some(75));
    assert!(a.try_wait().expect("wait").is_none(), "slot 0's run ended");
    std::fs::write(dir.file("a.stop"), "").unwrap();
    assert_eq!(wait_exit(&mut a, 10 * SEC).code(), Some(0));
    signal(watch.id(), nix::sys::signal::Signal::SIGTERM);
    let _ = wait_exit(&mut watch, 10 * SEC);
}

#[test]
fn status_release_check_watch_know_slots_embedded() {
    operate_on(stores::sqlite());
}

#[test]
fn status_release_check_watch_know_slots_postgres() {
    operate_on(stores::postgres());
}

#[test]
fn status_release_check_watch_know_slots_mysql() {
    operate_on(stores::mysql());
}

#[test]
fn status_release_check_watch_know_slots_redis() {
    operate_on(stores::redis());
}

#[test]
fn status_release_check_watch_know_slots_etcd() {
    operate_on(stores::etcd());
}

#[test]
fn status_release_check_watch_know_slots_zookeeper() {
    operate_on(stores::zookeeper());
}

/// Bad `--slots` values and combinations: one line, exit 2, no command.
#[test]
fn bad_slots_are_refused() {
    let dir = TempDir::new("slots-bad");
    let url = format!("sqlite://{}", dir.file("l.db").display());
    let ran = dir.file("ran");
    let touch = format!("touch {}", ran.display());
    for (extra, says) in [
        (&["--slots", "0"][..], "out of range: 1 to 64"),
        (&["--slots", "65"][..], "out of range: 1 to 64"),
        (&["--slots", "two"][..], "not a whole number"),
        (
            &["--slots", "2", "--once-per", "1h"][..],
            "--slots with --once-per",
        ),
    ] {
        let out = run(lr(&url, "bad", extra, &touch));
        assert_eq!(out.code, Some(2), "{extra:?}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
        assert!(out.stderr.contains(says), "{extra:?}: {}", out.stderr);
    }
    let mut c = leaderrun();
    c.args(["--store", &url, "release", "--name", "bad", "--slot", "64"]);
    let out = run(c);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(!ran.exists(), "a command ran");
}

/// Upgrading in place on Postgres: a table made before `--slots` (the last
/// release's, with the values' columns but no `slots`), with that release's
/// grants, keeps working for plain runs; a `--slots 2` run exits 125
/// naming the one statement and runs nothing; after `init` by the owner
/// the same role shares two slots.
#[test]
fn postgres_a_table_made_before_slots_is_upgraded_by_init() {
    let pg = Pg::start();
    pg.sql(
        "CREATE TABLE leader_lease (
    name text PRIMARY KEY, holder text, epoch bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity', timeline bigint,
    run_started_at timestamptz, run_ended_at timestamptz, run_holder text,
    run_epoch bigint, run_outcome text, advertised text, advertised_epoch bigint,
    kept_epoch bigint)",
    );
    pg.sql("CREATE ROLE app LOGIN PASSWORD 'apppw'; GRANT SELECT, INSERT, UPDATE ON leader_lease TO app");
    let app = format!(
        "postgres://app:apppw@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    let dir = TempDir::new("slots-upgrade");
    let ran = dir.file("ran");
    let touch = format!("touch {}", ran.display());
    let out = run(lr(&app, "plain", &[], &touch));
    assert_eq!((out.code, out.stderr.as_str()), (Some(0), ""));
    assert!(ran.exists());
    std::fs::remove_file(&ran).unwrap();
    let out = run(lr(&app, "pool", &["--slots", "2"], &touch));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(leaderrun::store::postgres::UPGRADE_SQL),
        "{}",
        out.stderr
    );
    assert!(!ran.exists(), "the command ran");
    let mut init = leaderrun();
    init.args(["init", "--store", &pg.url()]);
    assert_eq!(run(init).code, Some(0));
    let out = run(lr(&app, "pool", &["--slots", "2"], &touch));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(ran.exists());
}

/// `kill -9` of the leaderrun that holds slot 1 (its watchdog survives):
/// the watchdog stops the command and hands that slot back at its epoch,
/// so a waiter (polling every 30 s, woken by the push) leads slot 1 at the
/// next epoch within a second, long before the slot's lease (L = 10 s)
/// could run out; slot 0's run is untouched.
fn hand_back_on(srv: Server) {
    let dir = TempDir::new("slots-kill9");
    let timing = [
        "--slots",
        "2",
        "--lease",
        "10s",
        "--renew",
        "1s",
        "--give-up",
        "3s",
    ];
    let hold = |tag: &str| {
        format!(
            "echo \"$LEASE_SLOT $LEASE_EPOCH\" > {t}.slot; touch {t}.running; sleep 60",
            t = dir.file(tag).display()
        )
    };
    let mut a = spawn(lr(&srv.url, "hb", &timing, &hold("a")), &dir.file("a.log"));
    wait_file(&dir.file("a.running"), 10 * SEC);
    let mut b = spawn(lr(&srv.url, "hb", &timing, &hold("b")), &dir.file("b.log"));
    wait_file(&dir.file("b.running"), 10 * SEC);
    assert_eq!(read(&dir.file("b.slot")).trim(), "1 1");
    let waiter = [&timing[..], &["-v", "--wait", "--retry", "30s"]].concat();
    let mut c = spawn(lr(&srv.url, "hb", &waiter, &hold("c")), &dir.file("c.log"));
    wait_for("the waiter to wait", 10 * SEC, || {
        read(&dir.file("c.log")).contains("waiting:")
    });
    assert!(!dir.file("c.running").exists(), "a third ran beside two");
    let killed = std::time::Instant::now();
    signal(b.id(), nix::sys::signal::Signal::SIGKILL);
    let _ = b.wait();
    wait_file(&dir.file("c.running"), 10 * SEC);
    let took = killed.elapsed();
    eprintln!("kill -9 of slot 1's leaderrun: the waiter led slot 1 after {took:?}");
    assert_eq!(read(&dir.file("c.slot")).trim(), "1 2");
    assert!(
        took < SEC,
        "{took:?}: waited the lease out, not handed back"
    );
    assert!(a.try_wait().expect("wait").is_none(), "slot 0's run ended");
    for k in [&mut a, &mut c] {
        signal(k.id(), nix::sys::signal::Signal::SIGTERM);
        let _ = wait_exit(k, 10 * SEC);
    }
}

#[test]
fn kill_9_of_a_slot_holder_hands_the_slot_back_embedded() {
    hand_back_on(stores::sqlite());
}

#[test]
fn kill_9_of_a_slot_holder_hands_the_slot_back_postgres() {
    hand_back_on(stores::postgres());
}

#[test]
fn kill_9_of_a_slot_holder_hands_the_slot_back_redis() {
    hand_back_on(stores::redis());
}

#[test]
fn kill_9_of_a_slot_holder_hands_the_slot_back_etcd() {
    hand_back_on(stores::etcd());
}

#[test]
fn kill_9_of_a_slot_holder_hands_the_slot_back_zookeeper() {
    hand_back_on(stores::zookeeper());
}

/// The same on MySQL/MariaDB, from a table a development build made with
/// the advertised value's columns but no `slots` (MySQL has no `ADD COLUMN
/// IF NOT EXISTS`): the statement named adds only the missing column, and
/// after `init` the login with that build's grants shares two slots.
#[test]
fn mysql_a_table_made_before_slots_is_upgraded_by_init() {
    let my = crate::support::mysql::My::start();
    my.sql(
        "CREATE TABLE leader_lease (
    name VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    holder VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    epoch BIGINT NOT NULL DEFAULT 0,
    expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',
    run_started_at DATETIME(6) NULL, run_ended_at DATETIME(6) NULL,
    run_holder VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    run_epoch BIGINT NULL, run_outcome VARCHAR(64) CHARACTER SET utf8mb4 NULL,
    advertised VARCHAR(256) CHARACTER SET utf8mb4 NULL,
    advertised_epoch BIGINT NULL, kept_epoch BIGINT NULL
) ENGINE = InnoDB",
    );
    my.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'apppw'");
    my.sql("GRANT SELECT, INSERT, UPDATE ON lr.leader_lease TO 'app'@'%'");
    let app = format!("mysql://app:apppw@127.0.0.1:{}/lr", my.port);
    let dir = TempDir::new("slots-upgrade-mysql");
    let ran = dir.file("ran");
    let touch = format!("touch {}", ran.display());
    let out = run(lr(&app, "plain", &["--min-hold", "30s"], &touch));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    std::fs::remove_file(&ran).unwrap();
    let out = run(lr(&app, "pool", &["--slots", "2"], &touch));
    assert_eq!(out.code, Some(125), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("run `ALTER TABLE leader_lease ADD COLUMN slots BIGINT NULL`"),
        "{}",
        out.stderr
    );
    assert!(!ran.exists(), "the command ran");
    let mut init = leaderrun();
    init.args(["init", "--store", &my.url()]);
    assert_eq!(run(init).code, Some(0));
    let out = run(lr(&app, "pool", &["--slots", "2"], &touch));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(ran.exists());
}
