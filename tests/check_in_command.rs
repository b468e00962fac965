//! `leaderrun check` inside the command asks the leaderrun that runs it,
//! whatever store that one was given: the README's fencing pattern
//! (`leaderrun check || exit 75`) under `--store`, with no store string in
//! the command's environment. It says no once the lease is lost (a release
//! by an operator, seen at the next renewal) or its holder is frozen past
//! the give-up deadline, and it names the store it speaks of.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::stores::{self, Server};
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);
const BIN: &str = env!("CARGO_BIN_EXE_leaderrun");

/// The run form with the embedded default moved into `dir`, so that a
/// `check` that reads "the store its environment names" finds an empty one
/// there, never the machine's.
fn run_in(dir: &TempDir, srv: &Server, name: &str, extra: &[&str], script: &str) -> Command {
    let mut c = lr(&srv.url, name, extra, script);
    c.env("LEADERRUN_STATE_DIR", dir.path());
    c
}

/// Under `--store`, the command's `check` is 0 at its epoch and 1 at
/// another, naming the run's store; `check --store` reads that store and
/// agrees; the command's environment holds no store string.
fn checks_the_parents_store(srv: Server) {
    let dir = TempDir::new("check-parent");
    let script = format!(
        "{BIN} check; echo $? > {own}; {BIN} check --epoch $((LEASE_EPOCH + 1)) 2> {other_log}; \
         echo $? > {other}; {BIN} --store \"$STORE\" check; echo $? > {flag}; env > {env}",
        own = dir.file("own").display(),
        other = dir.file("other").display(),
        other_log = dir.file("other.log").display(),
        flag = dir.file("flag").display(),
        env = dir.file("env").display(),
    );
    let mut c = run_in(&dir, &srv, "chk", &[], &script);
    // The test hands the store to the third check itself, under a name of
    // its own: leaderrun adds no store string to the environment.
    c.env("STORE", &srv.url);
    let out = run(c);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let code = |f: &str| read(&dir.file(f)).trim().to_string();
    assert_eq!(
        code("own"),
        "0",
        "check inside the command said no to its own lease"
    );
    assert_eq!(code("other"), "1");
    let said = read(&dir.file("other.log"));
    let shown = srv.url.split('@').next_back().unwrap_or_default();
    assert!(
        said.contains("is not live at epoch") && said.contains(shown.split('?').next().unwrap()),
        "the refusal does not name the store: {said}"
    );
    assert_eq!(code("flag"), "0", "check --store disagrees");
    let env = read(&dir.file("env"));
    for line in env.lines().filter(|l| !l.starts_with("STORE=")) {
        assert!(
            !line.contains(&srv.url) && !line.contains("postgres:"),
            "a store string in the command's environment: {line}"
        );
    }
    assert!(env.contains("LEASE_STATE=/proc/"), "{env}");
}

#[test]
fn checks_the_parents_store_postgres() {
    checks_the_parents_store(stores::postgres());
}

#[test]
fn checks_the_parents_store_embedded() {
    checks_the_parents_store(stores::sqlite());
}

#[test]
fn checks_the_parents_store_zookeeper() {
    checks_the_parents_store(stores::zookeeper());
}

/// A command that traps SIGTERM and checks: once the stop has begun, the
/// answer is no. `kind` says how the lease goes: released by an operator
/// (seen at the next renewal, before the give-up deadline: only the
/// holder's word makes it a no), or the holder frozen past `G` (the
/// watchdog stops the command; nobody updates the record).
fn no_once_the_stop_began(release: bool) {
    let srv = stores::postgres();
    let dir = TempDir::new("check-lost");
    let answer = dir.file("answer");
    let script = format!(
        "trap '{BIN} check 2> {log}; echo $? > {answer}.tmp; mv {answer}.tmp {answer}; exit 0' TERM; \
         touch {running}; while :; do sleep 0.02; done",
        log = dir.file("answer.log").display(),
        answer = answer.display(),
        running = dir.file("running").display(),
    );
    let mut holder = spawn(
        run_in(
            &dir,
            &srv,
            "lost",
            &["--lease", "3s", "--renew", "500ms", "--give-up", "2s"],
            &script,
        ),
        &dir.file("holder.log"),
    );
    wait_file(&dir.file("running"), 10 * SEC);
    if release {
        let mut c = leaderrun();
        c.args(["--store", &srv.url, "release", "--name", "lost"]);
        let out = run(c);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    } else {
        signal(holder.id(), Signal::SIGSTOP);
    }
    wait_file(&answer, 10 * SEC);
    if !release {
        signal(holder.id(), Signal::SIGCONT);
    }
    assert_eq!(wait_exit(&mut holder, 10 * SEC).code(), Some(75));
    let said = read(&dir.file("answer.log"));
    assert_eq!(
        read(&answer).trim(),
        "1",
        "check said yes while the command was being stopped: {said}\n{}",
        read(&dir.file("holder.log"))
    );
    let why = if release {
        "was lost"
    } else {
        "past the give-up deadline"
    };
    assert!(said.contains(why), "{said}");
    if release {
        // Nobody took the lease: the holder does not claim someone did.
        let log = read(&dir.file("holder.log"));
        assert!(
            log.contains("or it was released") && !log.contains("another holder has the lease"),
            "{log}"
        );
    }
}

#[test]
fn no_once_an_operator_released_the_lease() {
    no_once_the_stop_began(true);
}

#[test]
fn no_once_the_holder_is_frozen_past_its_deadline() {
    no_once_the_stop_began(false);
}

/// Asked about another lease than the one the command runs under, `check`
/// reads a store as it always did (here: the embedded default, empty).
#[test]
fn another_lease_is_read_from_a_store() {
    let srv = stores::sqlite();
    let dir = TempDir::new("check-other");
    let script = format!(
        "{BIN} check --name elsewhere --epoch 1 2> {log}; echo $? > {code}",
        log = dir.file("log").display(),
        code = dir.file("code").display(),
    );
    let out = run(run_in(&dir, &srv, "mine", &[], &script));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(read(&dir.file("code")).trim(), "1");
    let said = read(&dir.file("log"));
    assert!(
        said.contains("no lease named elsewhere in sqlite://")
            && said.contains(&dir.path().display().to_string()),
        "{said}"
    );
}
