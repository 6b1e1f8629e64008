#!/usr/bin/env bash
# The bow-compare harness's `id` workload (one message to one listener by __id, 64 in flight)
# (or PLAN, e.g. "group:16") against server_gw.py only, for several bow_gateway source trees in alternation: before/after
# figures of a change in one session. Each session is fresh, pinned as run-matrix.sh pins it
# (server CPU 0, load generator CPU 1), through one private redis-server.
#   bench/bow_id_ab.sh PYTHON "ROUNDS" L DURATION SRC...
# SRC: a directory holding bow_gateway/ (a `git archive` of a commit, or the work tree), put first
# on PYTHONPATH. Prints one line per session and workload: src, round, server µs per delivery
# (per message for id), messages/s,
# the server's CPU share, both cores' busy/steal shares, lost + HTTP errors, the server's RSS
# growth per idle socket, load average. HARNESS: a copy of the harness with node_modules (else
# npm ci); EXTRA_PATH: more PYTHONPATH (profiling hooks); KEEP_LOG: keep each server's log
# there; ON_CONNECT: a command run with the server's pid once its sockets are connected.
set -u
py=${1:?usage: bow_id_ab.sh PYTHON ROUNDS L DURATION SRC...}; rounds=$2; L=$3; dur=$4; shift 4
py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")
harness=${HARNESS:-/work/shared/bench/bow-compare}
w=$(mktemp -d)
cp -r "$harness/." "$w/"
[ -d "$w/node_modules" ] || ( cd "$w" && npm ci --silent >/dev/null 2>&1 ) || { echo "npm ci failed"; exit 1; }
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$w/redis.pid" >/dev/null
trap 'kill $(cat "$w/redis.pid") 2>/dev/null; rm -rf "$w"' EXIT
sleep 0.5
ulimit -n 20000
cd "$w"
for round in $rounds; do
  for src in "$@"; do
    rm -f server.log  # not the last session's READY: the redirect below happens in the background
    hport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    PYTHONPATH=$src${EXTRA_PATH:+:$EXTRA_PATH} REDIS_PORT=$port PORT=$hport taskset -c 0 "$py" server_gw.py >server.log 2>&1 &
    spid=$!
    for _ in $(seq 150); do grep -q READY server.log && break; sleep 0.2; done
    rm -f res.jsonl
    if [ -n "${ON_CONNECT:-}" ]; then  # a command run with the server's pid once connected
      ( for _ in $(seq 600); do grep -q '"connect"' res.jsonl 2>/dev/null && break; sleep 0.1; done
        $ON_CONNECT $spid ) &
    fi
    taskset -c 1 node loadgen.js --url http://127.0.0.1:$hport --client raw4 --L "$L" --pid $spid \
      --plan "${PLAN:-id:64}" --duration "$dur" --warmup 0.5 --drain 60 --label gw --out res.jsonl >/dev/null
    kill $spid; wait $spid 2>/dev/null
    [ -n "${KEEP_LOG:-}" ] && cp server.log "$KEEP_LOG.$(basename "$src").$round"
    python3 - "$src" "$round" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open("res.jsonl")]
push = [r for r in rows if r.get("phase") == "push"]
if not push:
    print(f"{sys.argv[1]} round {sys.argv[2]}: no push phase ({rows[0] if rows else 'nothing'})")
    sys.exit()
kb = next((c["kb_per_conn"] for c in rows if c.get("phase") == "connect"), float("nan"))
for r in push:
    print(f"{sys.argv[1]} round {sys.argv[2]} {r['audience']}:{r['W']}: "
          f"{r['server_cpu_us_per_delivery']:.1f} µs/delivery, "
          f"{r['msgs_per_s']:.0f} msg/s, server cpu {r['server_cpu']:.2f}, cores {r['cores']}, "
          f"lost {r['lost'] + r['http_errors']}, {kb:.1f} KB/socket idle, load {sys.argv[3]}",
          flush=True)
EOF
    sleep 1
  done
done
