#!/usr/bin/env python3
"""The benchmark behind every figure the docs quote. One command:

    python3 tests/bench/run.py [--runs N] [--stores embedded,postgres,redis,etcd,zookeeper] [--no-build]

It builds the release binary, starts throwaway servers (Postgres, Redis, etcd, ZooKeeper)
on free ports in a temp dir, as the tests do (never the shared services on the
standard ports), measures, and writes docs/benchmarks.md and the table between
the `bench` markers in docs/performance.md. Every figure is a median and a worst case
over the stated number of runs, measured side by side in the same run:

1. start to exit of `leaderrun -- true` (lease free: acquire, start the
   watchdog, run, release) against `flock(1)` on a file (the embedded store's
   peer) and `etcdctl lock` (the shared stores' peer), with hyperfine when it
   is installed (`apt-get install -y hyperfine`), else a plain timing loop;
2. graceful handover per store: the old command's exit to the new command's
   start, the waiter at the default `--retry 2s`;
3. takeover after `kill -9` of the holding leaderrun (its watchdog stops the
   command and releases), default timings;
4. takeover after the holder expired (leaderrun and its watchdog killed
   together right after a renewal, so nothing releases): the new command's
   start after the last renewal's reply + L, with L = 3 s and `--retry 10s`
   (so a poll cannot be what finds it);
5. `watch` latency: a holder's release (the time its own `released` log
   line carries) to the `released` line of a `watch --name N --json
   --retry 10s` (so a read every 10 s cannot be what prints it: the push);
6. PSS (/proc/PID/smaps_rollup) of a leading leaderrun and of its watchdog:
   idle (after a few renewals) and the peak of samples every 20 ms from the
   start (the kernel keeps no peak PSS; its peak RSS, VmHWM, is shown too).

Timestamps are taken by the commands themselves (`date +%s.%N`), so they
include the cost of starting `date` on both sides of a handover. Postgres runs
with fsync off (as in the tests): its figures are the protocol's, not a disk's.

tests/bench/watchdog.py (the watchdog's own figures) stays beside this one.
"""
import argparse, json, os, pwd, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR = os.path.join(ROOT, "target/release/leaderrun")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait(pred, limit=30.0, step=0.002, what="a condition"):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > limit:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(step)


def stamp(path):
    wait(lambda: os.path.exists(path) and open(path).read().strip() != "", what=path)
    return float(open(path).read())


def log_time(line):
    return datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------------------
# Throwaway servers

class Server:
    def __init__(self, kind, url, proc, extra=None):
        self.kind, self.url, self.proc, self.extra = kind, url, proc, extra or {}

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def pg_bin():
    found = sorted(
        (os.path.join("/usr/lib/postgresql", v, "bin") for v in os.listdir("/usr/lib/postgresql")),
        key=lambda p: int(re.sub(r"\D", "", p.split("/")[-2]) or 0))
    return found[-1]


def owner():
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            u = pwd.getpwnam(name)
            return u.pw_uid, u.pw_gid
        except KeyError:
            pass
    sys.exit("running as root and neither `postgres` nor `nobody` exists to run postgres")


def start_postgres(tmp):
    d = os.path.join(tmp, "pg")
    os.mkdir(d)
    own = owner()
    if own:
        os.chown(d, *own)

    def as_owner():
        if own:
            os.setgid(own[1])
            os.setuid(own[0])
        os.setsid()

    b = pg_bin()
    subprocess.run([f"{b}/initdb", "-D", f"{d}/data", "-U", "postgres", "--auth=trust", "--no-sync"],
                   preexec_fn=as_owner, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "HOME": "/tmp"})
    port = free_port()
    p = subprocess.Popen([f"{b}/postgres", "-D", f"{d}/data", "-p", str(port), "-k", d,
                          "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                          "-c", "full_page_writes=off"],
                         preexec_fn=as_owner, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait(lambda: subprocess.run([f"{b}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(port)]).returncode == 0,
         what="postgres")
    version = subprocess.run([f"{b}/postgres", "--version"], capture_output=True, text=True).stdout.strip()
    return Server("postgres", f"postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable", p,
                  {"version": version})


def start_redis(tmp):
    port = free_port()
    p = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                          "--appendonly", "no", "--dir", tmp, "--daemonize", "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                text=True).stdout.strip() == "PONG", what="redis")
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    return Server("redis", f"redis://127.0.0.1:{port}/0", p, {"version": "Redis " + version})


def start_etcd(tmp):
    port, peer = free_port(), free_port()
    c, pu = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
    p = subprocess.Popen(["etcd", "--name", "b", "--data-dir", os.path.join(tmp, "etcd"),
                          "--listen-client-urls", c, "--advertise-client-urls", c,
                          "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
                          "--initial-cluster", f"b={pu}", "--log-level", "warn"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait(lambda: subprocess.run(["etcdctl", f"--endpoints={c}", "endpoint", "health"],
                                capture_output=True).returncode == 0, what="etcd")
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return Server("etcd", f"etcd://127.0.0.1:{port}", p, {"endpoint": c, "version": version})


def zk_says(port, word):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(word.encode())
            out = b""
            while chunk := s.recv(4096):
                out += chunk
            return out.decode(errors="replace")
    except OSError:
        return ""


def start_zookeeper(tmp):
    # tickTime 200 ms: sessions of 400 ms to 60 s are granted as asked (the
    # default --lease 15s and the 3 s of `expired` both); the ensemble
    # expires sessions in buckets of one tick, so an expiry lands up to a
    # tick after the timeout.
    d = os.path.join(tmp, "zk")
    os.mkdir(d)
    port = free_port()
    cfg = os.path.join(d, "zoo.cfg")
    with open(cfg, "w") as f:
        f.write(f"tickTime=200\nminSessionTimeout=400\nmaxSessionTimeout=60000\n"
                f"dataDir={d}/data\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
                f"admin.enableServer=false\n4lw.commands.whitelist=*\n")
    p = subprocess.Popen(["java", "-Xmx128m", "-XX:+UseSerialGC", "-cp",
                          "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar",
                          "org.apache.zookeeper.server.ZooKeeperServerMain", cfg],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait(lambda: "Mode:" in zk_says(port, "srvr"), what="zookeeper")
    version = zk_says(port, "srvr").split("\n")[0].split(":", 1)[-1].split(",")[0].strip()
    version = re.sub(r"-\$\{.*?\}", "", version)  # Debian's jar leaves a build macro in it
    return Server("zookeeper", f"zk://127.0.0.1:{port}", p, {"version": "ZooKeeper " + version})


def start_embedded(tmp):
    return Server("embedded", f"sqlite://{tmp}/embedded/leases.db", None, {"version": "SQLite (bundled)"})


STARTERS = {"embedded": start_embedded, "postgres": start_postgres, "redis": start_redis, "etcd": start_etcd,
            "zookeeper": start_zookeeper}


# ---------------------------------------------------------------------------
# Measurements

def lr(store, name, args, script, log=None):
    return subprocess.Popen([LR, "--store", store, "--name", name, *args, "--", "sh", "-c", script],
                            start_new_session=True, stdout=log or subprocess.DEVNULL,
                            stderr=log or subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def stop(p):
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def watchdog_of(pid):
    # Started detached, it is not leaderrun's child: found by `--be-watchdog PID`.
    for c in os.listdir("/proc"):
        if c.isdigit():
            try:
                args = open(f"/proc/{c}/cmdline", "rb").read().split(b"\0")
                if args[1:3] == [b"--be-watchdog", str(pid).encode()]:
                    return int(c)
            except (FileNotFoundError, ProcessLookupError):
                pass
    return None


def waiting(logpath):
    wait(lambda: "waiting:" in open(logpath).read(), what="the waiter to wait")


def handover(srv, d, i):
    """The old command's exit → the new command's start, default --retry."""
    name = f"h{i}"
    a = lr(srv.url, name, [], f"touch {d}/a.run; while [ ! -e {d}/a.stop ]; do sleep 0.005; done; "
                             f"date +%s.%N > {d}/a.exit")
    wait(lambda: os.path.exists(f"{d}/a.run"), what="the holder")
    blog = open(f"{d}/b.log", "w")
    b = lr(srv.url, name, ["-v", "--wait"], f"date +%s.%N > {d}/b.start; exec sleep 1000", blog)
    waiting(f"{d}/b.log")
    open(f"{d}/a.stop", "w").close()
    a.wait(20)
    took = stamp(f"{d}/b.start") - stamp(f"{d}/a.exit")
    stop(b)
    return took


def killed(srv, d, i):
    """kill -9 of the holding leaderrun → the standby's command starts."""
    name = f"k{i}"
    a = lr(srv.url, name, [], f"touch {d}/a.run; exec sleep 1000")
    wait(lambda: os.path.exists(f"{d}/a.run"), what="the holder")
    wait(lambda: watchdog_of(a.pid) is not None, what="the watchdog")
    blog = open(f"{d}/b.log", "w")
    b = lr(srv.url, name, ["-v", "--wait"], f"date +%s.%N > {d}/b.start; exec sleep 1000", blog)
    waiting(f"{d}/b.log")
    t0 = time.time()
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    took = stamp(f"{d}/b.start") - t0
    stop(b)
    return took


def expired(srv, d, i):
    """Holder and watchdog killed right after a renewal: the new command's
    start minus (that renewal's reply + L), L = 3 s."""
    name = f"e{i}"
    alog = open(f"{d}/a.log", "w")
    a = lr(srv.url, name, ["-vv", "--lease", "3s"], f"echo $$ > {d}/a.cmd; touch {d}/a.run; exec sleep 1000",
           alog)
    wait(lambda: os.path.exists(f"{d}/a.run"), what="the holder")
    wait(lambda: watchdog_of(a.pid) is not None, what="the watchdog")
    w = watchdog_of(a.pid)
    blog = open(f"{d}/b.log", "w")
    b = lr(srv.url, name, ["-v", "--wait", "--lease", "3s", "--retry", "10s"],
           f"date +%s.%N > {d}/b.start; exec sleep 1000", blog)
    waiting(f"{d}/b.log")
    n = open(f"{d}/a.log").read().count("renewed")
    wait(lambda: open(f"{d}/a.log").read().count("renewed") > n, what="a renewal")
    os.kill(w, signal.SIGKILL)
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    last = [l for l in open(f"{d}/a.log") if "renewed" in l][-1]
    took = stamp(f"{d}/b.start") - (log_time(last) + 3.0)
    try:  # the parent-death signal has most likely killed it already
        os.kill(int(open(f"{d}/a.cmd").read()), signal.SIGKILL)
    except ProcessLookupError:
        pass
    stop(b)
    return took


def watched(srv, d, i):
    """A release → the `released` line of a watcher reading every 10 s."""
    name = f"w{i}"
    alog = open(f"{d}/a.log", "w")
    a = lr(srv.url, name, ["-v"], f"touch {d}/a.run; while [ ! -e {d}/a.stop ]; do sleep 0.005; done", alog)
    wait(lambda: os.path.exists(f"{d}/a.run"), what="the holder")
    w = subprocess.Popen([LR, "--store", srv.url, "watch", "--name", name, "--json", "--retry", "10s"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         start_new_session=True, text=True)
    first = json.loads(w.stdout.readline())
    assert first["event"] == "state" and first["live"], first
    open(f"{d}/a.stop", "w").close()
    line = json.loads(w.stdout.readline())
    seen = time.time()
    assert line["event"] == "released", line
    a.wait(20)
    released = [l for l in open(f"{d}/a.log") if " released" in l]
    stop(w)
    return seen - log_time(released[-1])


def pss(pid):
    try:
        for l in open(f"/proc/{pid}/smaps_rollup"):
            if l.startswith("Pss:"):
                return int(l.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def hwm(pid):
    try:
        for l in open(f"/proc/{pid}/status"):
            if l.startswith("VmHWM:"):
                return int(l.split()[1])
    except FileNotFoundError:
        pass
    return None


def memory(srv, d, i):
    """(leaderrun idle, peak, VmHWM), (watchdog idle, peak, VmHWM) in KiB."""
    name = f"m{i}"
    alog = open(f"{d}/a.log", "w")
    a = lr(srv.url, name, ["-vv", "--lease", "3s"], "exec sleep 1000", alog)
    peak = {"lr": 0, "wd": 0}
    w = None
    t0 = time.monotonic()
    while open(f"{d}/a.log").read().count("renewed") < 3:
        if time.monotonic() - t0 > 30:
            raise TimeoutError("renewals")
        w = w or watchdog_of(a.pid)
        for k, p in (("lr", a.pid), ("wd", w)):
            v = pss(p) if p else None
            if v:
                peak[k] = max(peak[k], v)
        time.sleep(0.02)
    out = ((pss(a.pid), peak["lr"], hwm(a.pid)), (pss(w), peak["wd"], hwm(w)))
    stop(a)
    return out


def startup(servers, runs, d):
    """Start-to-exit of `leaderrun -- true` on every store and of its peers,
    side by side in one hyperfine run (interleaved runs in the fallback)."""
    cmds = {}
    for srv in servers:
        cmds[f"leaderrun --store {srv.kind}"] = [LR, "--store", srv.url, "--name", "s", "--", "true"]
        if srv.kind == "embedded":
            cmds["flock(1), a file"] = ["flock", f"{d}/flock", "true"]
        elif srv.kind == "etcd":
            cmds["etcdctl lock"] = ["etcdctl", f"--endpoints={srv.extra['endpoint']}", "lock", "s-peer",
                                    "true"]
    for k, c in cmds.items():
        if k.startswith("leaderrun"):
            subprocess.run(c, check=True)  # creates the table or the file
    if shutil.which("hyperfine"):
        out = f"{d}/hyperfine.json"
        subprocess.run(["hyperfine", "-N", "--warmup", "3", "--runs", str(runs), "--export-json", out,
                        "--style", "none", *[" ".join(c) for c in cmds.values()]], check=True,
                       stdout=subprocess.DEVNULL)
        res = json.load(open(out))["results"]
        return {k: list(r["times"]) for k, r in zip(cmds, res)}
    times = {k: [] for k in cmds}
    for _ in range(runs):
        for k, c in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(c, check=True)
            times[k].append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------------------

def ms(xs):
    return f"{statistics.median(xs) * 1000:.1f}", f"{max(xs) * 1000:.1f}"


def fresh(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per figure (startup: 5x this)")
    ap.add_argument("--stores", default="embedded,postgres,redis,etcd,zookeeper")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/benchmarks.md"))
    ap.add_argument("--no-readme", action="store_true", help="leave docs/performance.md alone")
    o = ap.parse_args()
    if not o.no_build:
        subprocess.run(["cargo", "build", "--release", "--bin", "leaderrun"], cwd=ROOT, check=True)
    stores = o.stores.split(",")
    tmp = tempfile.mkdtemp(prefix="leaderrun-bench-")
    os.chmod(tmp, 0o755)  # postgres, run as its own user under root, must reach its directory
    load = open("/proc/loadavg").read().split()[:3]
    rows, mem, servers = [], [], []
    try:
        for kind in stores:
            servers.append(STARTERS[kind](tmp))
        versions = [srv.extra["version"] for srv in servers]
        print("startup, side by side", file=sys.stderr)
        starts = startup(servers, o.runs * 5, fresh(f"{tmp}/startup"))
        for srv in servers:
            kind = srv.kind
            figs = {}
            for what, f in (("handover", handover), ("killed", killed), ("expired", expired),
                            ("watched", watched)):
                print(f"{kind}: {what}", file=sys.stderr)
                figs[what] = [f(srv, fresh(f"{tmp}/{what}-{kind}-{i}"), i) for i in range(o.runs)]
            rows.append((kind, figs))
            print(f"{kind}: memory", file=sys.stderr)
            mem.append((kind, [memory(srv, fresh(f"{tmp}/m-{kind}-{i}"), i) for i in range(3)]))
    finally:
        for srv in servers:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    head = (f"`python3 tests/bench/run.py --runs {o.runs}` on {os.cpu_count()} CPUs "
            f"({os.uname().release}), load {' '.join(load)} at the start; "
            f"{', '.join(versions)}; {time.strftime('%Y-%m-%d')}.")
    main_table = ["| store | graceful handover, median / worst | kill -9 of the holder, median / worst "
                  "| expired holder: start after last renewal + L, median / worst "
                  "| `watch`: release to its line, median / worst |",
                  "|---|---|---|---|---|"]
    for kind, f in rows:
        h, k, e, w = ms(f["handover"]), ms(f["killed"]), ms(f["expired"]), ms(f["watched"])
        main_table.append(f"| {kind} | {h[0]} / {h[1]} ms | {k[0]} / {k[1]} ms | {e[0]} / {e[1]} ms "
                          f"| {w[0]} / {w[1]} ms |")
    start_table = ["| command | median | worst |", "|---|---|---|"]
    for k, xs in starts.items():
        m = ms(xs)
        start_table.append(f"| `{k} … -- true` | {m[0]} ms | {m[1]} ms |" if k.startswith("leaderrun")
                           else f"| {k}: `… true` | {m[0]} ms | {m[1]} ms |")
    mem_table = ["| store | leaderrun idle / peak PSS (VmHWM) | watchdog idle / peak PSS (VmHWM) |",
                 "|---|---|---|"]
    for kind, runs in mem:
        (li, lp, lh), (wi, wp, wh) = max(runs, key=lambda r: r[0][1])
        mem_table.append(f"| {kind} | {li} / {lp} KiB ({lh} KiB) | {wi} / {wp} KiB ({wh} KiB) |")

    n = o.runs
    doc = f"""# Benchmarks

Written by `python3 tests/bench/run.py` (see its docstring for what each figure
measures); do not edit by hand. {head}

## Handover and takeover ({n} runs each)

Default timings (`--lease 15s`, `--retry 2s`) for the first two columns; the
third uses `--lease 3s` and a waiter at `--retry 10s`, so only the scheduling
at expiry (or a watch that fires on expiry) can explain a takeover within
milliseconds of it. Graceful handover is the old command's exit to the new
command's start; kill -9 is from the signal to the new command's start (the
watchdog stops the old command and releases). The last column is from the
holder's release (its `released` log line's time) to a `watch --name N --json
--retry 10s` printing it: the store's push, not a read.

{chr(10).join(main_table)}

## Start to exit, lease free ({n * 5} runs each, side by side)

{chr(10).join(start_table)}

## Memory of a leading leaderrun and its watchdog (worst of 3 runs)

PSS from `/proc/PID/smaps_rollup` after three renewals (idle), and the largest
of samples every 20 ms since the start (peak); VmHWM is the kernel's peak RSS.

{chr(10).join(mem_table)}
"""
    open(o.out, "w").write(doc)
    print(doc)
    if not o.no_readme:
        readme = os.path.join(ROOT, "docs", "performance.md")
        text = open(readme).read()
        block = (f"<!-- bench:start (written by tests/bench/run.py) -->\n{head}\n\n"
                 + "\n".join(main_table) + "\n\nStart to exit of `leaderrun … -- true` with the lease free, "
                 "against `flock(1)` and `etcdctl lock`:\n\n" + "\n".join(start_table) + "\n<!-- bench:end -->")
        new = re.sub(r"<!-- bench:start.*?<!-- bench:end -->", lambda _: block, text, flags=re.S)
        if new != text:
            open(readme, "w").write(new)


if __name__ == "__main__":
    main()
