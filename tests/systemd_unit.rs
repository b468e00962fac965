//! The shipped unit, `contrib/leaderrun-standby.service`, under a real
//! systemd: a container (`systemd-nspawn`, Debian's `systemd-container`)
//! booted from this machine's own `/`, with two copies of the unit standing
//! in for two hosts. `kill -9` of the holder's leaderrun makes systemd
//! (`KillMode=mixed`) SIGKILL the rest of the unit at once, the watchdog
//! included; the unit's `ExecStopPost` must then hand the lease back, so
//! that the standby leads within its `--retry`, not a lease later.
//!
//! Needs root, systemd as this machine's `/lib/systemd/systemd`, a
//! writable cgroup v2 hierarchy and `systemd-nspawn`: as root without the
//! last, it fails naming the package; without root it says so and passes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

const SEC: Duration = Duration::from_secs(1);
const BIN: &str = env!("CARGO_BIN_EXE_leaderrun");
/// Long, so that waiting it out cannot pass for a hand-back.
const LEASE: &str = "20s";
/// The unit's standby retries every 2 s (leaderrun's default `--retry`).
const RETRY: Duration = Duration::from_secs(2);

/// A booted container, powered off and its cgroups removed when dropped.
struct Container {
    nspawn: Child,
    pid1: i32,
    cgroup: PathBuf,
}

impl Container {
    fn boot(share: &Path, tag: &str) -> Container {
        let (mount, _) = cgroup2_and_own().expect("a cgroup v2 hierarchy");
        let cgroup = PathBuf::from(format!(
            "{mount}/leaderrun-test-{tag}-{}",
            std::process::id()
        ));
        // nspawn wants a cgroup of its own to keep its unit in
        // (`--keep-unit`): the shell moves itself there, then becomes it.
        let script = format!(
            "mkdir -p '{cg}' && echo $$ > '{cg}/cgroup.procs' && exec systemd-nspawn -D / \
             --volatile=yes -b -M lr{tag}{pid} --register=no --keep-unit --private-network \
             --console=read-only --bind='{share}':/share systemd.firstboot=off \
             systemd.mask=systemd-networkd-wait-online.service",
            cg = cgroup.display(),
            pid = std::process::id(),
            share = share.display(),
        );
        let log = std::fs::File::create(share.join("boot.log")).expect("log");
        let nspawn = Command::new("sh")
            .args(["-c", &script])
            .env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("sh");
        let pid = nspawn.id() as i32;
        // The child of nspawn that is the container's systemd (nspawn forks
        // short-lived helpers too: one of those is not PID 1).
        let pid1 = wait_until_some("the container's systemd", 20 * SEC, || {
            let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
            kids.split_whitespace()
                .filter_map(|k| k.parse::<i32>().ok())
                .find(|k| {
                    std::fs::read_to_string(format!("/proc/{k}/comm"))
                        .is_ok_and(|c| c.trim() == "systemd")
                })
        });
        let c = Container {
            nspawn,
            pid1,
            cgroup,
        };
        wait_for("the container to boot", 60 * SEC, || {
            let out = c.sh("systemctl is-system-running");
            matches!(out.trim(), "running" | "degraded")
        });
        c
    }

    /// A shell line run inside the container; its stdout.
    fn sh(&self, line: &str) -> String {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid1.to_string(), "-a", "sh", "-c", line])
            .stdin(Stdio::null())
            .output()
            .expect("nsenter");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `leaderrun status --json` of the lease, inside the container (its
    /// boot id is its own: the embedded store is read where it is used).
    fn lease(&self) -> serde_json::Value {
        let out = self
            .sh("/share/leaderrun --store sqlite:///share/leases.db status --name ingest --json");
        serde_json::from_str(out.trim()).unwrap_or(serde_json::Value::Null)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.sh("systemctl poweroff");
        let t0 = Instant::now();
        while t0.elapsed() < 10 * SEC {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Not down in time (a unit still stopping): everything in the
        // container's cgroup is killed at once, its PID 1 included, which
        // would otherwise outlive nspawn.
        let _ = std::fs::write(self.cgroup.join("cgroup.kill"), "1");
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        // `--keep-unit` leaves the cgroups nspawn made: deepest first, once
        // the processes in them are gone.
        let t0 = Instant::now();
        while self.cgroup.exists() && t0.elapsed() < 5 * SEC {
            remove_cgroups(&self.cgroup);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn remove_cgroups(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroups(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The shipped unit as a host would install it, with this build's binary,
/// the store in the shared directory and a command that runs until killed.
fn unit(lease: &str) -> String {
    include_str!("../contrib/leaderrun-standby.service")
        .replace("/usr/bin/leaderrun", "/share/leaderrun")
        .replace("/etc/leaderrun/ingest.env", "/share/ingest.env")
        .replace("/usr/local/bin/ingestd", "/bin/sleep 100000")
        .replace(
            "--wait --name ingest",
            &format!("--wait --name ingest --lease {lease}"),
        )
}

#[test]
fn kill_9_of_the_holder_hands_over_within_retry_under_systemd() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (systemd-nspawn)");
        return;
    }
    if !Path::new("/lib/systemd/systemd").exists() {
        eprintln!("skipped: this machine has no systemd to boot");
        return;
    }
    assert!(
        Command::new("systemd-nspawn")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "systemd-nspawn is missing: apt-get install systemd-container"
    );
    let dir = TempDir::new("systemd");
    std::fs::copy(BIN, dir.file("leaderrun")).expect("copy leaderrun");
    std::fs::write(
        dir.file("ingest.env"),
        "LEADERRUN_STORE=sqlite:///share/leases.db\n",
    )
    .unwrap();
    std::fs::write(dir.file("unit"), unit(LEASE)).unwrap();
    let c = Container::boot(dir.path(), "unit");
    c.sh(
        "mkdir -p /etc/systemd/system && cp /share/unit /etc/systemd/system/ingest-a.service \
         && cp /share/unit /etc/systemd/system/ingest-b.service && systemctl daemon-reload \
         && systemctl start ingest-a",
    );
    wait_for("ingest-a to lead", 20 * SEC, || c.lease()["live"] == true);
    c.sh("systemctl start ingest-b");
    let held = c.lease();
    let epoch = held["epoch"].as_i64().expect("epoch");
    let invocation = c.sh("systemctl show -p InvocationID --value ingest-a");
    assert!(
        held["holder"]
            .as_str()
            .is_some_and(|h| h.ends_with(invocation.trim())),
        "the holder does not name ingest-a's run: {held} / {invocation}"
    );
    // The standby waits, retrying: give it a moment to be waiting.
    wait_for("ingest-b to wait", 20 * SEC, || {
        c.sh("systemctl show -p StatusText --value ingest-b")
            .contains("waiting")
    });
    let t0 = Instant::now();
    c.sh("systemctl kill -s KILL --kill-whom=main ingest-a");
    let took = wait_until_some("a new holder", 30 * SEC, || {
        let l = c.lease();
        (l["live"] == true && l["epoch"].as_i64().is_some_and(|e| e > epoch)).then(|| t0.elapsed())
    });
    let journal = c.sh("journalctl -u ingest-a -u ingest-b --no-pager -o short-monotonic");
    eprintln!("kill -9 of the holder under systemd: the standby led after {took:?}");
    assert!(
        took < RETRY,
        "the standby led {took:?} after a kill -9 of the holder (lease {LEASE}, retry \
         {RETRY:?}): the lease was not handed back\n{journal}"
    );
    assert!(
        journal.contains("released ingest"),
        "ExecStopPost did not release: {journal}"
    );
    // One command runs: the new holder's; systemd's SIGKILL reached all of
    // the killed run.
    let running = c.sh("pgrep -c -f '^/bin/sleep 100000'");
    assert_eq!(running.trim(), "1", "{journal}");
}
