#!/usr/bin/env python3
"""What the Redis store's identity check costs per renewal.

    tests/bench/redis_renew.py [CALLS [ROUNDS]]

Starts a throwaway redis-server (a free port on 127.0.0.1, a temp dir), loads
the renewal script from src/store/redis/scripts.rs, and times three ways to renew,
interleaved round by round, CALLS calls each per round (default 2000, 7
rounds), one connection, one call at a time:

  plain     the renewal script with no identity to compare (ARGV[3] = '')
  inside    the same script comparing run_id and master_replid, read by
            INFO inside the script (what leaderrun does)
  pipelined the plain script plus INFO server and INFO replication sent in
            the same write (one round trip, the alternative)

Prints, per way, the median over rounds of each round's median round trip
(client side, µs) and the server's own time per call (INFO commandstats,
µs), so the cost is seen apart from the loopback's.
"""

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def renew_script():
    src = open(os.path.join(ROOT, "src/store/redis/scripts.rs")).read()
    m = re.search(r'const RENEW_LUA: &str = r"(.*?)";', src, re.S)
    if not m:
        sys.exit("no RENEW_LUA in src/store/redis/scripts.rs")
    return m.group(1)


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.s.recv(65536)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise RuntimeError("bad reply %r" % line)

    def send(self, *cmds):
        self.s.sendall(b"".join(cmds))
        return [self.reply() for _ in cmds]


def field(info, name):
    m = re.search(rb"\n" + name.encode() + rb":([^\r\n]*)", b"\n" + info)
    return m.group(1).decode() if m else ""


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    server = shutil.which("redis-server") or sys.exit(
        "redis-server not found: install the Debian package redis-server")
    d = tempfile.mkdtemp(prefix="leaderrun-bench-redis-")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    p = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                          "--appendonly", "no", "--dir", d, "--loglevel", "warning"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                c = Conn(port)
                break
            except OSError:
                time.sleep(0.02)
        else:
            sys.exit("redis-server did not start")
        sha = c.send(resp("SCRIPT", "LOAD", renew_script()))[0]
        run_id = field(c.send(resp("INFO", "server"))[0], "run_id")
        replid = field(c.send(resp("INFO", "replication"))[0], "master_replid")
        key = "{leaderrun:bench}:lease"
        c.send(resp("SET", key, "1:h", "PX", 60000))
        plain = resp("EVALSHA", sha, 1, key, "1:h", 60000, "", "")
        inside = resp("EVALSHA", sha, 1, key, "1:h", 60000, run_id, replid)
        ways = {
            "plain": [plain],
            "inside": [inside],
            "pipelined": [plain, resp("INFO", "server"), resp("INFO", "replication")],
        }
        medians = {w: [] for w in ways}
        server_us = {w: [] for w in ways}
        for _ in range(rounds):
            for w, cmds in ways.items():
                c.send(resp("CONFIG", "RESETSTAT"))
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter_ns()
                    out = c.send(*cmds)
                    times.append((time.perf_counter_ns() - t0) / 1000)
                    assert out[0] == b"1", out
                medians[w].append(statistics.median(times))
                stats = c.send(resp("INFO", "commandstats"))[0].decode()
                usec = {m.group(1): float(m.group(2)) for m in
                        re.finditer(r"cmdstat_(\w+):calls=\d+,usec=(\d+)", stats)}
                # A script's own commands are counted in their rows too, and
                # in the script's: only what the client sent is added up.
                total = usec.get("evalsha", 0)
                if w == "pipelined":
                    total += usec.get("info", 0)
                server_us[w].append(total / calls)
        print("redis-server %s, %d calls x %d rounds, one connection" % (
            field(c.send(resp("INFO", "server"))[0], "redis_version"), calls, rounds))
        print("%-10s %22s %22s" % ("way", "round trip, median µs", "server time per call µs"))
        for w in ways:
            print("%-10s %22.1f %22.1f" % (w, statistics.median(medians[w]),
                                          statistics.median(server_us[w])))
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
