#!/usr/bin/env bash
# What `stallscope watch` costs redis: `redis-benchmark -t set -c 50` throughput with the
# watcher attached (perf backend, incident ring, metrics endpoint scraped, --events) against
# the same redis untraced, in the same run, on a fresh redis-server on a free loopback port.
#
#   bench/watch.sh [REQUESTS] [CLIENTS] [ROUNDS]   (defaults 200000, 50, 9)
#
# Untraced and watched runs strictly alternate (U W U W ... W U: ROUNDS watched runs, one
# more untraced); each watched run's baseline is the mean of the untraced runs just before
# and just after it (throughput on a shared VM drifts), and the median of the ROUNDS ratios
# is the figure, beside the ratio of the totals and the spread of the ratios and of the
# untraced runs (how noisy the machine was). With the defaults, about 2 minutes on a quiet
# machine. Also prints the watcher's CPU seconds and
# RSS after each watched run, from its own metrics, and how long it took to exit on SIGTERM
# (with its exit status and redis's TracerPid afterwards).
# WATCH_EXTRA adds watcher flags (e.g. `--backend perf`; the default is auto: bpf where it loads).
# Needs redis-server, redis-benchmark, redis-cli, curl, python3, root (perf tracepoints), and
# a release build (cargo build --release; CARGO_TARGET_DIR is honoured).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
C=${2:-50}
ROUNDS=${3:-9}
BIN=${CARGO_TARGET_DIR:-target}/release/stallscope
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
for t in redis-server redis-benchmark redis-cli curl python3; do
  command -v "$t" >/dev/null || { echo "$t is required" >&2; exit 2; }
done

DIR=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
MPORT=$(free_port)
redis-server --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save "" --appendonly no \
  --logfile "$DIR/redis.log" --daemonize no >/dev/null 2>&1 &
RPID=$!
W=""
SCRAPER=""
cleanup() {
  [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null || true
  [ -n "$W" ] && kill "$W" 2>/dev/null || true
  kill "$RPID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

rps() {
  redis-benchmark -p "$PORT" -t set -n "$N" -c "$C" -q --csv 2>/dev/null | awk -F'"' '/^"SET"/ {print $4}'
}
wait_line() {
  for _ in $(seq 400); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "no '$2' in $1: $(cat "$1")" >&2; exit 2
}
metric() { curl -s "http://127.0.0.1:$MPORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

rps >/dev/null # warm up
echo "watch ${WATCH_EXTRA:-(backend auto)}; redis-benchmark -t set -n $N -c $C on $(nproc) cores, redis $(redis-server --version | awk '{print $3}' | cut -d= -f2), kernel $(uname -r)"
RATIOS=(); SUM_BASE=0; SUM_W=0; UNTRACED=()
BASE2=$(rps); UNTRACED+=("$BASE2")
for round in $(seq "$ROUNDS"); do
  BASE1=$BASE2
  rm -f "$DIR/w.err"
  "$BIN" watch --pid "$RPID" --out "$DIR/incidents" --metrics "127.0.0.1:$MPORT" \
    --events "$DIR/events.jsonl" ${WATCH_EXTRA:-} >/dev/null 2>"$DIR/w.err" &
  W=$!
  wait_line "$DIR/w.err" "watching $RPID"
  # A Prometheus-like scraper, every second, for the whole watched run.
  ( while sleep 1; do curl -s "http://127.0.0.1:$MPORT/metrics" >/dev/null || true; done ) &
  SCRAPER=$!
  WR=$(rps)
  kill "$SCRAPER"; wait "$SCRAPER" 2>/dev/null || true; SCRAPER=""
  CPU=$(metric stallscope_watcher_cpu_seconds_total)
  RSS=$(metric stallscope_watcher_resident_bytes)
  LOST=$(metric stallscope_lost_events_total)
  T0=$(date +%s.%N)
  kill -TERM "$W"; set +e; wait "$W"; WCODE=$?; set -e; W=""
  STOP_S=$(python3 -c "print(f'{$(date +%s.%N) - $T0:.3f}')")
  TRACED=$(awk '/^TracerPid:/ {print $2}' /proc/"$RPID"/status)
  BASE2=$(rps); UNTRACED+=("$BASE2")
  BASE=$(python3 -c "print(f'{($BASE1 + $BASE2) / 2:.2f}')")
  R=$(python3 -c "print(f'{$WR / $BASE:.3f}')")
  RATIOS+=("$R")
  SUM_BASE=$(python3 -c "print($SUM_BASE + $BASE)")
  SUM_W=$(python3 -c "print($SUM_W + $WR)")
  echo "round $round: untraced $BASE rps ($BASE1, $BASE2) | watch $WR rps ($R); watcher CPU ${CPU}s, RSS $(python3 -c "print(f'{$RSS/1048576:.0f}')") MiB, $LOST lost; SIGTERM: exit $WCODE after ${STOP_S}s, TracerPid $TRACED"
done
echo "watch, total over all rounds: $(python3 -c "print(f'{$SUM_W / $SUM_BASE:.3f}')") of untraced"
python3 - "${UNTRACED[*]}" "${RATIOS[*]}" <<'PY'
import statistics, sys
u = [float(x) for x in sys.argv[1].split()]
r = sorted(float(x) for x in sys.argv[2].split())
print(f"untraced runs: {len(u)}, {min(u):.0f}-{max(u):.0f} rps (spread {max(u) / min(u):.2f}x, cv {statistics.pstdev(u) / statistics.mean(u):.3f})")
print(f"ratios: {' '.join(f'{x:.3f}' for x in r)}")
print(f"median ratio to untraced: {statistics.median(r):.3f}")
PY
