#!/usr/bin/env bash
# What tracing costs redis: `redis-benchmark -t set` throughput untraced, while traced by
# `stallscope attach` (ptrace backend), and while traced by `strace -f -T -p`, in one run
# on one redis-server (a fresh one on a free loopback port in a temp dir).
#
#   bench/attach_overhead.sh [REQUESTS] [CLIENTS] [ROUNDS]   (defaults 100000, 50, 3)
#
# The cases are interleaved over ROUNDS rounds (untraced, stallscope, strace, ...) so that
# load from elsewhere on the machine hits them alike; each ratio is taken within its round
# and the median round is reported, beside the overhead stallscope itself reported. Needs redis-server, redis-benchmark, strace, and a
# release build (cargo build --release; CARGO_TARGET_DIR is honoured).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100000}
C=${2:-50}
ROUNDS=${3:-3}
BIN=${CARGO_TARGET_DIR:-target}/release/stallscope
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
for t in redis-server redis-benchmark strace python3; do
  command -v "$t" >/dev/null || { echo "$t is required" >&2; exit 2; }
done

DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save "" --appendonly no \
  --logfile "$DIR/redis.log" --daemonize no >/dev/null 2>&1 &
RPID=$!
TRACER=""
cleanup() {
  [ -n "$TRACER" ] && kill "$TRACER" 2>/dev/null || true
  kill "$RPID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

rps() {
  # "SET","123456.79",... -> 123456.79
  redis-benchmark -p "$PORT" -t set -n "$N" -c "$C" -q --csv 2>/dev/null | awk -F'"' '/^"SET"/ {print $4}'
}
wait_traced() {
  for _ in $(seq 100); do
    [ "$(awk '/^TracerPid:/ {print $2}' /proc/"$RPID"/status)" != 0 ] && return 0
    sleep 0.05
  done
  echo "the tracer did not attach" >&2; exit 2
}
wait_untraced() {
  for _ in $(seq 200); do
    [ "$(awk '/^TracerPid:/ {print $2}' /proc/"$RPID"/status)" = 0 ] && return 0
    sleep 0.05
  done
  echo "the tracer did not detach" >&2; exit 2
}

rps >/dev/null # warm up (allocations, page cache)
ratio() { python3 -c "print(f'{float($1)/float($2):.3f}')"; }
echo "redis-benchmark -t set -n $N -c $C on $(nproc) cores, redis $(redis-server --version | awk '{print $3}' | cut -d= -f2)"
R_SS=(); R_ST=()
for round in $(seq "$ROUNDS"); do
  BASE=$(rps)

  "$BIN" attach --pid "$RPID" --format json --threshold 1s >"$DIR/attach.json" 2>"$DIR/attach.err" &
  TRACER=$!
  wait_traced
  SS=$(rps)
  kill -INT "$TRACER"; wait "$TRACER" || true; TRACER=""
  wait_untraced

  strace -f -T -p "$RPID" -o /dev/null 2>/dev/null &
  TRACER=$!
  wait_traced
  ST=$(rps)
  kill -INT "$TRACER"; wait "$TRACER" || true; TRACER=""
  wait_untraced

  R_SS+=("$(ratio "$SS" "$BASE")"); R_ST+=("$(ratio "$ST" "$BASE")")
  printf 'round %d: untraced %10s rps | stallscope attach %9s rps (%s) | strace -f -T -p %9s rps (%s)\n' \
    "$round" "$BASE" "$SS" "${R_SS[-1]}" "$ST" "${R_ST[-1]}"
  python3 - "$DIR/attach.json" <<'EOF2'
import json, sys
r = json.load(open(sys.argv[1]))
o = r.get("overhead") or {}
print(f"         stallscope reported: {o.get('syscalls_per_s', 0):.0f} syscalls/s traced, "
      f"mean stop {o.get('mean_stop_us', 0):.1f} us, warning: {o.get('warning')}")
EOF2
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "median ratio to untraced: stallscope attach (ptrace) $(median "${R_SS[@]}"), strace -f -T -p $(median "${R_ST[@]}")"
