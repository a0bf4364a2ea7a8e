#!/usr/bin/env bash
# What the bpf backend costs redis in CPU, measured so that load elsewhere on the machine
# moves it little (throughput does move: bench/backends.sh is the throughput figure): for
# ROUNDS alternated runs of `redis-benchmark -t set -n N -c C` against one fresh redis-server
# (free loopback port, temp dir), untraced and under `stallscope attach --backend bpf`:
#   - redis-server's CPU time (utime+stime ticks of /proc/PID/stat) over the run, per request;
#   - stallscope's own CPU time over the run, per request;
#   - each BPF program's run count and mean run time (kernel.bpf_stats_enabled, set for the
#     run and put back after), from `bpftool prog show`.
#
#   bench/bpf_cost.sh [REQUESTS] [CLIENTS] [ROUNDS]    (defaults 200000, 50, 3)
#   BIN=path/to/stallscope bench/bpf_cost.sh           (default target/release/stallscope)
#
# Needs root, redis-server, redis-benchmark, redis-cli, bpftool, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
C=${2:-50}
ROUNDS=${3:-3}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/stallscope}
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli bpftool python3
HZ=$(getconf CLK_TCK)
start_redis
bpf_stats 1

rps >/dev/null # warm up
echo "redis-benchmark -t set -n $N -c $C, $(nproc) cores, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg), $BIN"
U_SUM=0; B_SUM=0; S_SUM=0
for round in $(seq "$ROUNDS"); do
  t0=$(ticks "$RPID"); U_RPS=$(rps); t1=$(ticks "$RPID")
  U=$((t1 - t0))
  rm -f "$DIR/bpf.err"
  "$BIN" attach --backend bpf --pid "$RPID" --format json --threshold 1s >"$DIR/bpf.json" 2>"$DIR/bpf.err" &
  TRACER=$!
  wait_line "$DIR/bpf.err" "attached to"
  progs "$TRACER" >"$DIR/p0"
  s0=$(ticks "$TRACER"); t0=$(ticks "$RPID"); B_RPS=$(rps); t1=$(ticks "$RPID"); s1=$(ticks "$TRACER")
  progs "$TRACER" >"$DIR/p1"
  stop
  B=$((t1 - t0)); S=$((s1 - s0))
  U_SUM=$((U_SUM + U)); B_SUM=$((B_SUM + B)); S_SUM=$((S_SUM + S))
  LOST=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['lost_events'])" "$DIR/bpf.json")
  python3 - "$round" "$N" "$HZ" "$U" "$B" "$S" "$U_RPS" "$B_RPS" "$LOST" "$DIR/p0" "$DIR/p1" <<'PY'
import sys
rnd, n, hz, u, b, s = (int(x) for x in sys.argv[1:7])
urps, brps, lost = sys.argv[7], sys.argv[8], sys.argv[9]
def load(p):
    out = {}
    for l in open(p):
        i, name, typ, t, c = l.split()
        out[i] = (name, typ, int(t), int(c))
    return out
p0, p1 = load(sys.argv[10]), load(sys.argv[11])
ns = lambda t: t * 1e9 / hz / n
print(f"round {rnd}: redis CPU untraced {u} ticks ({ns(u):.0f} ns/req), under bpf {b} ticks ({ns(b):.0f} ns/req, +{ns(b-u):.0f}); "
      f"stallscope {s} ticks ({ns(s):.0f} ns/req); rps {urps} untraced, {brps} bpf (load-dependent); lost {lost}")
for i, (name, typ, t, c) in sorted(p1.items(), key=lambda kv: kv[1][0]):
    t0, c0 = p0.get(i, (name, typ, 0, 0))[2:]
    dc, dt = c - c0, t - t0
    if dc:
        print(f"  {name:<16} {typ:<14} {dc:>9} runs  {dt / dc:7.0f} ns/run  {dt / n:6.0f} ns/req")
PY
done
python3 -c "
import sys
n, hz, r = $N, $HZ, $ROUNDS
u, b, s = $U_SUM, $B_SUM, $S_SUM
f = lambda t: t * 1e9 / hz / n / r
print(f'all rounds: redis CPU {f(u):.0f} ns/req untraced, {f(b):.0f} under bpf ({b/u:.3f}x); stallscope {f(s):.0f} ns/req')
"
