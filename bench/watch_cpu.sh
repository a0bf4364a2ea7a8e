#!/usr/bin/env bash
# What stallscope's own process spends per live record: CPU time of the tracer (all its
# threads) over one `redis-benchmark -t set -c 50` run, per request and per record. A figure
# that load on a shared machine barely moves (CPU time, not throughput), for `attach` and
# `watch` with the bpf and perf backends.
#
#   bench/watch_cpu.sh [REQUESTS] [ROUNDS] [MODES...]   (defaults 200000, 3, all four modes)
#   MODES: attach-bpf attach-perf watch-bpf watch-perf
#   ARGS="--threshold 1s" bench/watch_cpu.sh ...   extra options of the tracer: a threshold
#     the machine's own stalls do not reach, so that the CPU per record is not mixed with
#     what the stalls and incident reports of a loaded machine cost
#   BIN=target/profiling/stallscope PERF_RECORD=DIR bench/watch_cpu.sh 200000 1 watch-bpf
#     also `perf record -g` the tracer during the benchmark into DIR/MODE.data (PERF_FREQ
#     samples a second, default 2000; PERF_G replaces -g: other perf record options)
#
# The tracer's CPU is the sum over /proc/PID/task/*/schedstat (ns on a CPU) just after the
# benchmark minus just before it (attach-time setup is not counted). Records are the
# syscalls the tracer says it traced over its whole run (a few hundred more than the
# benchmark's: redis's own timers), so ns/record slightly understates.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
ROUNDS=${2:-3}
shift 2 2>/dev/null || shift $#
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(attach-bpf attach-perf watch-bpf watch-perf)
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/stallscope}
[ -x "$BIN" ] || { echo "build first ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli python3
start_redis
MPORT=$(free_port)
PR=""
on_exit '[ -n "$PR" ] && kill -INT "$PR" 2>/dev/null'
redis-benchmark -p "$PORT" -t set -n 20000 -c 50 -q >/dev/null 2>&1 # warm up
echo "# $BIN ${ARGS:-}; redis-benchmark -t set -n $N -c 50; load $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in "${MODES[@]}"; do
  cmd=${mode%-*}
  backend=${mode#*-}
  for round in $(seq "$ROUNDS"); do
    rm -f "$DIR/t.err"
    rm -rf "$DIR/inc"
    if [ "$cmd" = attach ]; then
      "$BIN" attach --pid "$RPID" --backend "$backend" --format json ${ARGS:-} >"$DIR/t.out" 2>"$DIR/t.err" &
      TRACER=$!
      wait_line "$DIR/t.err" "attached to" 600
    else
      "$BIN" watch --pid "$RPID" --backend "$backend" --out "$DIR/inc" --metrics "127.0.0.1:$MPORT" \
        --events "$DIR/events.jsonl" ${ARGS:-} >/dev/null 2>"$DIR/t.err" &
      TRACER=$!
      wait_line "$DIR/t.err" "watching $RPID" 600
    fi
    sleep 0.3
    if [ -n "${PERF_RECORD:-}" ]; then
      mkdir -p "$PERF_RECORD"
      perf record ${PERF_G:--g} -F ${PERF_FREQ:-2000} -p "$TRACER" -o "$PERF_RECORD/$mode.data" >/dev/null 2>&1 &
      PR=$!
      sleep 0.5
    fi
    C0=$(cpu_ns "$TRACER"); K0=$(ticks "$TRACER")
    redis-benchmark -p "$PORT" -t set -n "$N" -c 50 -q >/dev/null 2>&1
    sleep 0.3 # the tracer catches up with what the kernel still holds
    C1=$(cpu_ns "$TRACER"); K1=$(ticks "$TRACER")
    if [ -n "$PR" ]; then kill -INT "$PR"; wait "$PR" 2>/dev/null || true; PR=""; fi
    stop
    # watch's default cheap mode counts in the kernel and says no record count: 0 here.
    recs=$(grep -oE 'traced [0-9]+ syscalls' "$DIR/t.err" | awk '{print $2}' || true)
    recs=${recs:-0}
    # Stalls found (and incidents written) cost the tracer too: say how many there were.
    stalls=$(grep -c '^stall: ' "$DIR/t.err" || true)
    incidents=$(ls "$DIR/inc" 2>/dev/null | grep -c '\.json$' || true)
    lost=$(grep -oE '[0-9]+ lost' "$DIR/t.err" | awk '{print $1}' || true)
    python3 -c "
c = ($C1 - $C0); r = $recs; n = $N
per = f'{r} records ({r/n:.2f}/request), {c/r:.0f} ns/record' if r else 'no record count (cheap mode)'
print(f'$mode round $round: tracer CPU {c/1e9:.3f} s ({$K1 - $K0} ticks), {per}, {c/n:.0f} ns/request; lost ${lost:-0}; $stalls stalls, $incidents incident reports; exit $STATUS')"
  done
done
