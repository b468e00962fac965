#!/usr/bin/env bash
# Fleet sizing: N leaseholders (each its own lease name, leading, running
# `sleep`) through PgBouncer in transaction pooling in front of one
# Postgres, at default timings unless LEASE is set. Measures, over a window
# of W seconds once all lead: server connections (pg_stat_activity), renewals
# per second and their statements (pg_stat_statements), and the CPU of all
# Postgres processes and of PgBouncer (from /proc). Loopback servers in a
# temp dir only. Needs postgresql (with pg_stat_statements, in the server
# package), pgbouncer.
#
#   N=1000 W=60 bench/fleet.sh [BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/leaderrun}
n=${N:-1000} w=${W:-60}
lease_args=()
[ -n "${LEASE:-}" ] && lease_args=(--lease "$LEASE")
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
tmp=$(mktemp -d /tmp/leaderrun-fleet.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
owner=$(id -un); [ "$(id -u)" = 0 ] && owner=postgres
as_owner() { if [ "$(id -u)" = 0 ]; then su "$owner" -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
pids=()
cleanup() {
    [ -n "${lr_pids:-}" ] && kill $lr_pids 2>/dev/null
    sleep 3
    [ -s "$tmp/pgbouncer.pid" ] && kill "$(cat "$tmp/pgbouncer.pid")" 2>/dev/null
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 1; rm -rf "$tmp"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"
chown "$owner" "$tmp"
echo fleet-pw > "$tmp/pw"; chown "$owner" "$tmp/pw"
as_owner "$pgbin/initdb -D $tmp/pg -U postgres --auth-local=trust --auth-host=scram-sha-256 --no-sync --pwfile=$tmp/pw" >/dev/null
pgport=$(free_port) bport=$(free_port)
as_owner "ulimit -n \$(ulimit -Hn); exec $pgbin/postgres -D $tmp/pg -p $pgport -k $tmp -c listen_addresses=127.0.0.1 \
    -c shared_preload_libraries=pg_stat_statements >$tmp/pg.log 2>&1" &
pids+=($!)
echo '"postgres" "fleet-pw"' > "$tmp/users"
cat > "$tmp/pgbouncer.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$pgport dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $tmp/users
pool_mode = transaction
max_client_conn = $((2 * n + 100))
logfile = $tmp/pgbouncer.log
pidfile = $tmp/pgbouncer.pid
INI
chown "$owner" "$tmp/users" "$tmp/pgbouncer.ini"
sleep 2
as_owner "ulimit -n \$(ulimit -Hn); exec pgbouncer $tmp/pgbouncer.ini" >/dev/null 2>&1 &
pids+=($!)
psql_pg() { PGPASSWORD=fleet-pw "$pgbin/psql" -X -Atq -h 127.0.0.1 -p "$pgport" -U postgres -d postgres -c "$1"; }
for _ in $(seq 50); do psql_pg 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
psql_pg 'CREATE EXTENSION pg_stat_statements' 
url="postgres://postgres:fleet-pw@127.0.0.1:$bport/postgres?sslmode=disable"
"$bin" init --store "$url"

echo "starting $n leaseholders ($(uptime))"
lr_pids=""
for i in $(seq "$n"); do
    "$bin" --store "$url" --name "lease-$i" "${lease_args[@]}" -- sleep 100000 2>>"$tmp/lr.log" &
    lr_pids="$lr_pids $!"
    sleep 0.01
done
for _ in $(seq 120); do
    live=$(psql_pg "select count(*) from leader_lease where holder is not null and expires_at > now()")
    [ "$live" -ge "$n" ] && break
    sleep 1
done
echo "leading: $live of $n"
sleep 10 # past the start-up burst

cpu_of() { # utime+stime in clock ticks of the processes given
    local t=0
    for p in "$@"; do
        read -r -a f < <(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null || echo)
        [ "${#f[@]}" -gt 13 ] && t=$((t + f[11] + f[12]))
    done
    echo "$t"
}
pg_procs() { # the postmaster and its children: this cluster's processes only
    local pm
    pm=$(head -1 "$tmp/pg/postmaster.pid")
    echo "$pm $(pgrep -P "$pm" | tr '\n' ' ')"
}
bouncer=$(cat "$tmp/pgbouncer.pid")
stat() {
    psql_pg "select coalesce(sum(calls),0) from pg_stat_statements where query like 'UPDATE leader_lease%expires_at > now()%'"
}
# Backends come and go with the pool; the pool's are long-lived, so their
# CPU over the window is what renewals cost (plus the postmaster's share).
before_procs=$(pg_procs)
c0=$(stat); cpu0=$(cpu_of $before_procs) b0=$(cpu_of "$bouncer") t0=$(date +%s.%N)
server_conns=()
for i in $(seq "$w"); do
    server_conns+=("$(psql_pg "select count(*) from pg_stat_activity where backend_type = 'client backend' and usename = 'postgres'")")
    sleep 1
done
c1=$(stat); cpu1=$(cpu_of $before_procs) b1=$(cpu_of "$bouncer") t1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
python3 - "$n" "$c0" "$c1" "$cpu0" "$cpu1" "$b0" "$b1" "$t0" "$t1" "$hz" "${server_conns[@]}" <<'PY'
import sys, statistics
n, c0, c1, cpu0, cpu1, b0, b1 = map(int, sys.argv[1:8])
t0, t1, hz = float(sys.argv[8]), float(sys.argv[9]), int(sys.argv[10])
conns = [int(x) for x in sys.argv[11:]]
secs = t1 - t0
ren = (c1 - c0) / secs
pg_cpu = (cpu1 - cpu0) / hz / secs
pgb_cpu = (b1 - b0) / hz / secs
print(f"leaseholders {n}, window {secs:.0f} s")
print(f"renewals/s {ren:.1f} ({ren / n * 5:.2f} per lease per 5 s)")
print(f"server connections (client backends, 1/s samples): median {statistics.median(conns)}, max {max(conns)}")
print(f"Postgres CPU {pg_cpu * 100:.1f}% of a core: {pg_cpu / ren * 1e3:.3f} ms per renewal")
print(f"PgBouncer CPU {pgb_cpu * 100:.1f}% of a core: {pgb_cpu / ren * 1e3:.3f} ms per renewal")
print(f"at 10,000 leases: {ren / n * 10000:.0f} renewals/s, Postgres {pg_cpu / n * 10000:.2f} cores, PgBouncer {pgb_cpu / n * 10000:.2f} cores (linear)")
PY
psql_pg "select calls, round(mean_exec_time::numeric, 3) as mean_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 60) from pg_stat_statements order by calls desc limit 6"
