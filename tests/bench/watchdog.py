#!/usr/bin/env python3
"""Figures for the watchdog (docs/contract.md §10), measured on the real
binary with the embedded store in a temp dir. Prints medians and worst cases.

    cargo build --release && python3 tests/bench/watchdog.py [target/release/leaderrun] [runs]

1. leaderrun frozen alone (SIGSTOP right after a renewal): time from that
   renewal's send to the command's death; the bound is G + K.
2. stderr a full pipe nobody reads, and the store locked by another process
   (every renewal fails and leaderrun has warnings it cannot write): time
   from the lock to the command's death; the bound is G + K (the lock falls
   at most R after the last renewal, so the death comes at most G + K - 0
   after it, measured here from the lock).
3. kill -9 of a holder at default timings with a standby at --retry 2s: time
   from the kill to the standby's command starting (the watchdog releases the
   lease once the command is gone; without it the standby would wait out L = 15 s).
"""
import os, signal, sqlite3, statistics, subprocess, sys, tempfile, time
from datetime import datetime

LR = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/leaderrun")
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 5


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait(pred, limit=30.0, step=0.001):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > limit:
            raise TimeoutError
        time.sleep(step)


def pidfile(p):
    wait(lambda: os.path.exists(p))
    return int(open(p).read())


def lr(store, name, args, script, **kw):
    return subprocess.Popen([LR, "--store", store, "--name", name, *args, "--", "sh", "-c", script],
                            start_new_session=True, **kw)


RUN = iter(range(1_000_000))


def pid_script(path):
    """The command: ignore SIGTERM, write its pid atomically, sleep."""
    return f"trap '' TERM; echo $$ > {path}.tmp && mv {path}.tmp {path}; exec sleep 1000"


def frozen(d):
    store = f"sqlite://{d}/l.db"
    log = open(f"{d}/f.log", "w+")
    # A new name each run: a lease lost to a freeze is not released.
    p = lr(store, f"f{next(RUN)}", ["--lease", "3s", "-vv"], pid_script(f"{d}/f.pid"), stderr=log)
    cmd = pidfile(f"{d}/f.pid")
    wait(lambda: open(f"{d}/f.log").read().count("renewed") > 0)
    # the renewal's log line is written right after its reply; its send was a moment before
    line = [l for l in open(f"{d}/f.log") if "renewed" in l][-1]
    renewed = datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
    os.kill(p.pid, signal.SIGSTOP)
    wait(lambda: gone(cmd))
    died = time.time()
    os.kill(p.pid, signal.SIGCONT)
    p.wait()
    os.remove(f"{d}/f.pid")
    return died - renewed


def blocked(d):
    store = f"sqlite://{d}/l.db"
    r, w = os.pipe()
    fill = os.open(f"/proc/self/fd/{w}", os.O_WRONLY | os.O_NONBLOCK)
    try:
        while True:
            os.write(fill, b"." * 4096)
    except BlockingIOError:
        pass
    os.close(fill)
    p = lr(store, f"b{next(RUN)}", ["--lease", "3s", "-vv"], pid_script(f"{d}/b.pid"), stderr=w)
    os.close(w)
    cmd = pidfile(f"{d}/b.pid")
    time.sleep(0.3)
    db = sqlite3.connect(f"{d}/l.db", timeout=0.1, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    t0 = time.time()
    wait(lambda: gone(cmd))
    died = time.time()
    db.execute("ROLLBACK")
    db.close()
    p.wait(timeout=10)
    os.close(r)
    os.remove(f"{d}/b.pid")
    return died - t0, p.returncode


def takeover(d):
    store = f"sqlite://{d}/l.db"
    name = f"t{next(RUN)}"
    a = lr(store, name, [], pid_script(f"{d}/a.pid"))
    pidfile(f"{d}/a.pid")
    b = lr(store, name, ["--wait", "--retry", "2s"], f"touch {d}/b.started; exec sleep 1000")
    time.sleep(2.5)  # B has polled and found the lease held
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    wait(lambda: os.path.exists(f"{d}/b.started"))
    took = time.monotonic() - t0
    b.send_signal(signal.SIGTERM)
    b.wait()
    for f in ("a.pid", "b.started"):
        os.remove(f"{d}/{f}")
    return took


def report(what, xs, bound=None):
    xs = sorted(xs)
    b = f"; bound {bound}" if bound else ""
    print(f"{what}: median {statistics.median(xs)*1000:.0f} ms, worst {xs[-1]*1000:.0f} ms, "
          f"n = {len(xs)}{b}")


with tempfile.TemporaryDirectory() as d:
    report("frozen leaderrun: last renewal -> command dead (L=3s)", [frozen(d) for _ in range(RUNS)],
           "G+K = 2500 ms")
    res = [blocked(d) for _ in range(RUNS)]
    report("stderr full + store locked: lock -> command dead (L=3s)", [r[0] for r in res],
           "G+K = 2500 ms after the last renewal")
    print(f"   leaderrun exit statuses: {sorted(set(r[1] for r in res))}")
    report("kill -9 of the holder -> standby's command started (defaults, --retry 2s)",
           [takeover(d) for _ in range(RUNS)], "target 3000 ms")
