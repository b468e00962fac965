#!/usr/bin/env python3
"""Per-phase medians of `leaderrun -v --name x -- true`, from its own log
timestamps: start (exec to the `store` line: loading, arguments, runtime),
acquire (`store` to `acquired`: connect and acquire), run (`acquired` to
`exited`: watchdog orders, cgroup, the command's start and exit, the sweep),
release (`exited` to `released`), exit (`released` to the process's end).

    bench/phases.py RUNS STORE BINARY...     (STORE '' for the embedded store)
"""
import datetime, os, statistics, subprocess, sys, time

runs, store, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
PHASES = ["start", "acquire", "run", "release", "exit", "total"]


def stamp(line):
    t = line.split()[0].rstrip("Z")
    return datetime.datetime.fromisoformat(t).replace(tzinfo=datetime.timezone.utc).timestamp()


def one(b):
    t0 = time.time()
    p = subprocess.run([b, "-v", "--store", store, "--name", "x", "--", "true"],
                       capture_output=True, text=True)
    t1 = time.time()
    ev = {}
    for line in p.stderr.splitlines():
        for key, word in [("store", " store "), ("acquired", " acquired "),
                          ("exited", " command exited"), ("released", " released")]:
            if word in line and key not in ev:
                ev[key] = stamp(line)
    if len(ev) < 4:
        raise SystemExit(f"{b}: unexpected log:\n{p.stderr}")
    return [ev["store"] - t0, ev["acquired"] - ev["store"], ev["exited"] - ev["acquired"],
            ev["released"] - ev["exited"], t1 - ev["released"], t1 - t0]


res = {b: [] for b in bins}
for _ in range(runs):  # interleaved, so load changes hit every binary alike
    for b in bins:
        res[b].append(one(b))
print(f"{'ms (median of %d)' % runs:<44}" + "".join(f"{p:>9}" for p in PHASES))
for b in bins:
    med = [statistics.median(r[i] for r in res[b]) * 1e3 for i in range(len(PHASES))]
    print(f"{b[-44:]:<44}" + "".join(f"{m:9.2f}" for m in med))
