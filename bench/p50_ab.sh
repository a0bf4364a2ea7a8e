#!/usr/bin/env bash
# Per-command p50 of `attach --backend bpf` against the client's own (redis-benchmark -c 1 -t
# set,get -n 20000), as bench/backends.sh measures it, for two or more builds in the same run on
# the same redis, alternated over two rounds (an A/B of where a command's clock starts).
#   bench/p50_ab.sh BINARY...
set -euo pipefail
BINS=()
for b in "$@"; do BINS+=("$(realpath "$b")"); done
cd "$(dirname "$0")/.."
. bench/lib.sh
need redis-server redis-benchmark redis-cli python3
start_redis
for round in 1 2; do
for BIN in "${BINS[@]}"; do
  "$BIN" attach --backend bpf --pid "$RPID" --format json --threshold 1s >"$DIR/bpf.json" 2>"$DIR/bpf.err" &
  TRACER=$!
  wait_line "$DIR/bpf.err" "attached to"
  redis-benchmark -p "$PORT" -t set,get -n 20000 -c 1 --csv 2>/dev/null >"$DIR/c1.csv"
  stop
  echo "== $BIN round $round"
  python3 - "$DIR/bpf.json" "$DIR/c1.csv" <<'PY'
import json, sys, csv
r = json.load(open(sys.argv[1]))
ours = {c["command"]: c for c in r.get("commands", []) if c["phase"] == "all"}
rows = list(csv.reader(open(sys.argv[2])))
head = rows[0]
for row in rows[1:]:
    test, p50_ms = row[0], float(row[head.index("p50_latency_ms")])
    c = ours.get(test)
    print(f"  {test}: stallscope p50 {c['p50_us']} us ({c['calls']} calls, {c.get('from_arrival',0)} from arrival) vs client {p50_ms*1000:.0f} us: {c['p50_us']/(p50_ms*1000):.2f}")
print("  start:", r["summary"].get("command_start"), " lost:", r["summary"]["lost_events"])
PY
  grep -i warning "$DIR/bpf.err" || true
done
done
