//! The once-per round: three hosts fire one schedule (`--once-per 4s`) in
//! every window, each through its own fault proxy, at seeded offsets spread
//! over less than a third of the half period; a nemesis puts a fault into
//! every third window while its firings arrive: the store crashed or
//! frozen, the running holder killed with kill -9, frozen past its lease,
//! or cut off from the store, a contender's link cut. Checked: never two
//! runs of one window's firings (whatever the faults), and a run in every
//! window no fault came near (no fault from L + 1 s before its first firing
//! to its last firing: a fault's leftovers, a lease not handed back, live
//! at most L after it heals). Seeded as the rest of the suite, and replayed
//! by `LEADERRUN_CHAOS_SEED`; under 60 s.

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::Rng;
use crate::support::chaos_store::{ChaosStore, Kind};
use crate::support::*;
use nix::sys::signal::Signal;

/// Hosts firing the schedule.
const HOSTS: usize = 3;
/// The schedule's period, `--once-per`'s DUR: windows start this far apart.
const PERIOD: Duration = Duration::from_secs(4);
/// The lease, L.
const LEASE: Duration = Duration::from_secs(2);
/// The firings of one window arrive within this of its start (host skew
/// and lateness): well under half the period, leaving process start-up and
/// the round trip the rest.
const SPREAD_MS: u64 = 700;
const WINDOWS: usize = 11;

/// One firing: which host, which window, and its leaderrun.
struct Firing {
    host: usize,
    window: usize,
    child: Child,
}

/// A fault, with the boot-clock-free times the checker needs.
struct Fault {
    kind: &'static str,
    window: usize,
    start: Instant,
    heal: Instant,
}

struct Round {
    store: ChaosStore,
    proxies: Vec<Proxy>,
    dir: TempDir,
    log: std::path::PathBuf,
    firings: Vec<Firing>,
}

impl Round {
    fn holder_id(host: usize, window: usize) -> String {
        format!("h{host}w{window}")
    }

    fn fire(&mut self, host: usize, window: usize) {
        let url = self.store.url_via(self.proxies[host].port);
        let script = format!(
            "echo \"{window} $LEASE_EPOCH start $$\" >> {log}; sleep 1; echo \"{window} end\" >> {log}",
            log = self.log.display()
        );
        let out = std::fs::File::create(
            self.dir
                .file(&format!("{}.log", Round::holder_id(host, window))),
        )
        .expect("log");
        let mut c = leaderrun();
        c.args(["--store", &url, "--name", "once", "--once-per", "4s"])
            .args(["--lease", "2s", "-v", "--holder"])
            .arg(Round::holder_id(host, window))
            .args(["--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(out);
        {
            use std::os::unix::process::CommandExt;
            c.process_group(0);
        }
        let child = c.spawn().expect("spawn leaderrun");
        self.firings.push(Firing {
            host,
            window,
            child,
        });
    }

    /// The firing that holds the lease now, by the store.
    fn holder(&self) -> Option<&Firing> {
        let h = self.store.holder("once")?;
        self.firings
            .iter()
            .find(|f| Round::holder_id(f.host, f.window) == h)
    }

    /// Wait (up to `limit`) for a holder; its leaderrun's pid and host.
    fn wait_holder(&self, limit: Duration) -> Option<(u32, usize)> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(f) = self.holder() {
                return Some((f.child.id(), f.host));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn reap(&mut self) {
        for f in &mut self.firings {
            let _ = f.child.try_wait();
        }
    }
}

/// Sleep until `at`, reaping exited firings meanwhile.
fn until(r: &mut Round, at: Instant) {
    while Instant::now() < at {
        r.reap();
        std::thread::sleep(
            at.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(20)),
        );
    }
}

/// The nemesis's fault for window `w`, started now and healed before it
/// returns. `None` when there was nothing to aim at (no holder in time).
fn inject(r: &mut Round, rng: &mut Rng) -> Option<&'static str> {
    Some(match rng.below(6) {
        0 => {
            r.store.crash();
            std::thread::sleep(rng.ms(200, 1000));
            r.store.boot();
            r.store.crash_kind()
        }
        1 => {
            r.store.freeze(true);
            std::thread::sleep(rng.ms(300, 1500));
            r.store.freeze(false);
            r.store.freeze_kind()
        }
        2 => {
            let (pid, _) = r.wait_holder(Duration::from_millis(1500))?;
            signal(pid, Signal::SIGKILL);
            "kill -9 the holder"
        }
        3 => {
            // leaderrun, its watchdog and its command: only expiry and the
            // thaw are left; other firings of the window find the period
            // taken, and the thawed command is stopped as lost.
            let (pid, _) = r.wait_holder(Duration::from_millis(1500))?;
            let groups: Vec<i32> = child_groups(pid)
                .into_iter()
                .chain(watchdog_of(pid))
                .collect();
            signal_group(pid, Signal::SIGSTOP);
            for g in &groups {
                signal_group(*g as u32, Signal::SIGSTOP);
            }
            std::thread::sleep(LEASE + rng.ms(200, 800));
            signal_group(pid, Signal::SIGCONT);
            for g in &groups {
                signal_group(*g as u32, Signal::SIGCONT);
            }
            "freeze the holder past its lease"
        }
        4 => {
            let (_, host) = r.wait_holder(Duration::from_millis(1500))?;
            r.proxies[host].blackhole();
            std::thread::sleep(rng.ms(500, 2500));
            r.proxies[host].heal();
            "cut the holder off the store"
        }
        _ => {
            let host = rng.below(HOSTS as u64) as usize;
            r.proxies[host].blackhole();
            std::thread::sleep(rng.ms(300, 1500));
            r.proxies[host].heal();
            "cut a contender off the store"
        }
    })
}

fn run_round(seed: u64) {
    eprintln!("chaos once-per: seed {seed} (replay: LEADERRUN_CHAOS_SEED={seed})");
    let mut rng = Rng(seed);
    let store = ChaosStore::start(Kind::Postgres);
    let proxies = (0..HOSTS).map(|_| Proxy::start(store.port())).collect();
    let dir = TempDir::new("chaos-once");
    let log = dir.file("runs.log");
    let mut r = Round {
        store,
        proxies,
        dir,
        log,
        firings: Vec::new(),
    };
    let t0 = Instant::now() + Duration::from_secs(1);
    let mut faults: Vec<Fault> = Vec::new();
    // Firing offsets per window, seeded; sorted into one timeline.
    let mut schedule: Vec<(Instant, usize, usize)> = (0..WINDOWS)
        .flat_map(|w| (0..HOSTS).map(move |h| (w, h)))
        .map(|(w, h)| {
            let at = t0 + PERIOD * w as u32 + Duration::from_millis(rng.below(SPREAD_MS));
            (at, w, h)
        })
        .collect();
    schedule.sort();
    let mut next = 0;
    for w in 0..WINDOWS {
        let w_start = t0 + PERIOD * w as u32;
        // Every third window (1, 4, 7, …) gets a fault, its start seeded
        // within the firings; the windows between are quiet.
        let fault_at = (w % 3 == 1).then(|| w_start + rng.ms(0, SPREAD_MS + 300));
        let w_end = w_start + PERIOD;
        let mut fault_done = fault_at.is_none();
        loop {
            let fire_at = schedule.get(next).filter(|s| s.0 < w_end).map(|s| s.0);
            let fault = fault_at.filter(|_| !fault_done);
            let due = match (fire_at, fault) {
                (Some(f), Some(x)) => f.min(x),
                (Some(f), None) => f,
                (None, Some(x)) => x,
                (None, None) => break,
            };
            until(&mut r, due);
            if fire_at == Some(due) {
                let (_, w, h) = schedule[next];
                next += 1;
                r.fire(h, w);
            } else {
                fault_done = true;
                // Firings due meanwhile still fire: on a thread of their
                // own the nemesis would race the clock; here they fire
                // late, which the fault excuses in this window anyway.
                let start = Instant::now();
                if let Some(kind) = inject(&mut r, &mut rng) {
                    faults.push(Fault {
                        kind,
                        window: w,
                        start,
                        heal: Instant::now(),
                    });
                }
            }
        }
        until(&mut r, w_end);
    }
    // Let the last runs end, then collect every firing.
    for f in &mut r.firings {
        let st = wait_exit(&mut f.child, Duration::from_secs(15));
        if st.code() == Some(101) {
            panic!("leaderrun panicked: {}", Round::holder_id(f.host, f.window));
        }
    }
    let mut starts: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for line in read(&r.log).lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.get(2) == Some(&"start") {
            let w: usize = parts[0].parse().expect("window");
            starts.entry(w).or_default().push(line.to_string());
        }
    }
    let mut violations = Vec::new();
    let mut owed = 0;
    for w in 0..WINDOWS {
        let runs = starts.get(&w).map_or(0, Vec::len);
        if runs > 1 {
            violations.push(format!("window {w}: {runs} runs: {:?}", starts[&w]));
        }
        // Owed a run: no fault from L + 1 s before the window's first
        // firing to its last one.
        let first = t0 + PERIOD * w as u32;
        let last = first + Duration::from_millis(SPREAD_MS);
        let near = faults
            .iter()
            .any(|f| f.start <= last && f.heal + LEASE + Duration::from_secs(1) >= first);
        if !near {
            owed += 1;
            if runs == 0 {
                violations.push(format!("window {w}: no run, and no fault came near it"));
            }
        }
    }
    let kinds: Vec<String> = faults
        .iter()
        .map(|f| format!("w{}: {}", f.window, f.kind))
        .collect();
    eprintln!(
        "chaos once-per summary, seed {seed}: {WINDOWS} windows, {} firings, {} runs, {} \
         double runs, {owed} windows owed a run, {} missed; faults: {}",
        r.firings.len(),
        starts.values().map(Vec::len).sum::<usize>(),
        violations.iter().filter(|v| v.contains("runs:")).count(),
        violations.iter().filter(|v| v.contains("no run")).count(),
        kinds.join(", ")
    );
    if !violations.is_empty() {
        let keep =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-once-{seed}"));
        let _ = std::fs::remove_dir_all(&keep);
        let _ = std::fs::create_dir_all(&keep);
        for e in std::fs::read_dir(r.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
        }
        eprintln!("chaos once-per: logs kept in {}", keep.display());
    }
    assert!(
        faults.len() >= 2,
        "fewer than two faults hit: the round proves little"
    );
    assert!(
        owed >= 3,
        "only {owed} windows owed a run: the round proves little"
    );
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[test]
fn chaos_once_per() {
    run_round(super::fixed_seed());
}
