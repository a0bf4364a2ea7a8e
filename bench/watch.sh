#!/usr/bin/env bash
# What `stallscope watch` costs redis: `redis-benchmark -t set -c 50` throughput with the
# watcher attached (incident ring, metrics endpoint scraped, --events, --out) against the same
# redis untraced, in the same run, on a fresh redis-server on a free loopback port, for each
# watch mode in MODES (default "cheap full": the default mode, no syscall tracepoint until a
# stall, and the always-full mode).
#
#   bench/watch.sh [REQUESTS] [CLIENTS] [ROUNDS]   (defaults 200000, 50, 9)
#
# Untraced and watched runs alternate (U M1 M2 U M2 M1 U ...: ROUNDS runs of each mode, the
# modes' order swapped every round); each watched run's baseline is the mean of the untraced
# runs just before and just after its round (throughput on a shared VM drifts), and the median
# of each mode's ROUNDS ratios is its figure, beside the ratio of the totals and the spread of
# the ratios and of the untraced runs (how noisy the machine was). With the defaults, about 3
# minutes on a quiet machine. Also prints the watcher's CPU seconds and RSS after each watched
# run, from its own metrics, and how long it took to exit on SIGTERM (with its exit status and
# redis's TracerPid afterwards).
# WATCH_EXTRA adds watcher flags to every mode (e.g. `--backend perf`, which implies full);
# a mode `cheap:task` runs the cheap mode with its sampler opened on redis's main thread
# (STALLSCOPE_CHEAP_SAMPLER=task, the A/B of that choice); BIN picks another build.
# Needs redis-server, redis-benchmark, redis-cli, curl, python3, root (BPF, perf events), and
# a release build (cargo build --release; CARGO_TARGET_DIR is honoured).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
C=${2:-50}
ROUNDS=${3:-9}
read -r -a MODES <<<"${MODES:-cheap full}"
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/stallscope}
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli curl python3
start_redis
MPORT=$(free_port)
SCRAPER=""
on_exit '[ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null'

# The throughput of one benchmark run and redis's CPU time over it: "RPS CPU_NS". CPU per
# request is what tracing adds to redis's own work.
rps_cpu() {
  local c0 r c1
  c0=$(cpu_ns "$RPID")
  r=$(rps)
  c1=$(cpu_ns "$RPID")
  echo "$r $((c1 - c0))"
}

rps_cpu >/dev/null # warm up
echo "watch modes ${MODES[*]} ${WATCH_EXTRA:-}; redis-benchmark -t set -n $N -c $C on $(nproc) cores, redis $(redis-server --version | awk '{print $3}' | cut -d= -f2), kernel $(uname -r)"
declare -A RATIOS SUM_W CPU_RATIOS
SUM_BASE=0; UNTRACED=()
for m in "${MODES[@]}"; do RATIOS[$m]=""; SUM_W[$m]=0; CPU_RATIOS[$m]=""; done
# One watched run of mode $1: its throughput in WR, the watcher's figures in LINE.
watched() {
  rm -f "$DIR/w.err" "$DIR/events.jsonl"
  # cheap:task: the cheap mode with its sampler on the thread (measurement only).
  local sampler=""
  [ "${1#*:}" != "$1" ] && sampler=${1#*:}
  STALLSCOPE_CHEAP_SAMPLER=$sampler "$BIN" watch --pid "$RPID" --mode "${1%%:*}" --out "$DIR/incidents" --metrics "127.0.0.1:$MPORT" \
    --events "$DIR/events.jsonl" ${WATCH_EXTRA:-} >/dev/null 2>"$DIR/w.err" &
  TRACER=$!
  wait_line "$DIR/w.err" "watching $RPID"
  # A Prometheus-like scraper, every second, for the whole watched run.
  ( while sleep 1; do curl -s "http://127.0.0.1:$MPORT/metrics" >/dev/null || true; done ) &
  SCRAPER=$!
  read -r WR WCPU <<<"$(rps_cpu)"
  kill "$SCRAPER"; wait "$SCRAPER" 2>/dev/null || true; SCRAPER=""
  local cpu rss lost t0 took traced
  cpu=$(metric stallscope_watcher_cpu_seconds_total)
  rss=$(metric stallscope_watcher_resident_bytes)
  lost=$(metric stallscope_lost_events_total)
  t0=$(date +%s.%N)
  stop TERM
  took=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.3f}')")
  traced=$(tracer_pid)
  local stalls escal
  stalls=$({ cat "$DIR/events.jsonl" 2>/dev/null || true; } | wc -l)
  escal=$({ grep -c "escalating" "$DIR/w.err" || true; } | head -1)
  LINE="$stalls stalls, $escal escalations; watcher CPU ${cpu}s, RSS $(python3 -c "print(f'{$rss/1048576:.0f}')") MiB, $lost lost; SIGTERM: exit $STATUS after ${took}s, TracerPid $traced"
}
read -r BASE2 BCPU2 <<<"$(rps_cpu)"; UNTRACED+=("$BASE2")
for round in $(seq "$ROUNDS"); do
  BASE1=$BASE2; BCPU1=$BCPU2
  order=("${MODES[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    order=(); for ((i=${#MODES[@]}-1; i>=0; i--)); do order+=("${MODES[$i]}"); done
  fi
  declare -A GOT GOTCPU LINES
  for m in "${order[@]}"; do watched "$m"; GOT[$m]=${WR:-0}; GOTCPU[$m]=${WCPU:-0}; LINES[$m]=$LINE; done
  read -r BASE2 BCPU2 <<<"$(rps_cpu)"; UNTRACED+=("$BASE2")
  BCPU=$(( (BCPU1 + BCPU2) / 2 ))
  BASE=$(python3 -c "print(f'{($BASE1 + $BASE2) / 2:.2f}')")
  SUM_BASE=$(python3 -c "print($SUM_BASE + $BASE)")
  echo "round $round: untraced $BASE rps ($BASE1, $BASE2), redis CPU $((BCPU / N)) ns/request"
  for m in "${order[@]}"; do
    R=$(python3 -c "print(f'{${GOT[$m]} / $BASE:.3f}')")
    RATIOS[$m]="${RATIOS[$m]} $R"
    CR=$(python3 -c "print(f'{$BCPU / max(${GOTCPU[$m]:-0}, 1):.3f}')")
    CPU_RATIOS[$m]="${CPU_RATIOS[$m]} $CR"
    SUM_W[$m]=$(python3 -c "print(${SUM_W[$m]} + ${GOT[$m]})")
    echo "  $m: ${GOT[$m]} rps ($R), redis CPU $((GOTCPU[$m] / N)) ns/request (untraced/this $CR); ${LINES[$m]}"
  done
done
python3 - "${UNTRACED[*]}" <<'PY'
import statistics, sys
u = [float(x) for x in sys.argv[1].split()]
print(f"untraced runs: {len(u)}, {min(u):.0f}-{max(u):.0f} rps (spread {max(u) / min(u):.2f}x, cv {statistics.pstdev(u) / statistics.mean(u):.3f})")
PY
for m in "${MODES[@]}"; do
  python3 - "$m" "${RATIOS[$m]}" "${SUM_W[$m]}" "$SUM_BASE" "${CPU_RATIOS[$m]}" <<'PY'
import statistics, sys
m, r, w, b = sys.argv[1], sorted(float(x) for x in sys.argv[2].split()), float(sys.argv[3]), float(sys.argv[4])
c = sorted(float(x) for x in sys.argv[5].split())
print(f"{m}: throughput ratios {' '.join(f'{x:.3f}' for x in r)}; median ratio to untraced {statistics.median(r):.3f}; total {w / b:.3f}")
print(f"{m}: redis CPU per request, untraced/{m}: {' '.join(f'{x:.3f}' for x in c)}; median {statistics.median(c):.3f}")
PY
done
