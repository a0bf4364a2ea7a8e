#!/usr/bin/env bash
# Issue 40's first figure, as the issue words it: `attach --backend B --threshold 2ms` on a plain
# GET load (`redis-benchmark -t get -n N -c 50`) of a server with I/O threads, with a DEBUG
# SLEEP 0.3 and an EVAL busy loop of about half a second in the same attach. Per run: the
# stalls called a slow command (`finding: command`) that are neither the DEBUG SLEEP nor the
# EVAL (by the client's own clock of each, give or take 2 ms, and not holding either), the
# main thread's waits for its I/O threads, whether DEBUG SLEEP and the EVAL were found and the
# EVAL named, and the GETs counted against those sent.
#
#   bench/iothreads_verdicts.sh BINARY [BACKEND] [N] [ROUNDS] [SERVERS]
#   (defaults bpf, 300000, 3, "redis valkey"; "redis8" too with REDIS8_SERVER set)
#
# HOGS=K runs K busy loops (`sh -c 'while :; do :; done'`) beside it for the whole run: CPU
# contention, the host short of CPUs for the server's threads ([V40c], [V41a]).
#
# Needs root (bpf, perf), redis-server, redis-benchmark, redis-cli, python3, valkey-server.
set -euo pipefail
BIN=$(realpath "$1")
BACKEND=${2:-bpf}
N=${3:-300000}
ROUNDS=${4:-3}
SERVERS=${5:-redis valkey}
cd "$(dirname "$0")/.."
. bench/lib.sh
need redis-benchmark redis-cli python3
in_temp_dir
HOG_PIDS=()
on_exit 'for h in "${HOG_PIDS[@]}"; do kill "$h" 2>/dev/null; done'

now() { python3 -c 'import time; print(f"{time.time():.6f}")'; }

for _ in $(seq "${HOGS:-0}"); do sh -c 'while :; do :; done' & HOG_PIDS+=($!); done
echo "# $(date -u '+%Y-%m-%d %H:%M:%S') UTC, $(uptime), ${HOGS:-0} CPU hogs"
echo "# binary $BIN ($("$BIN" --version 2>/dev/null || true)), backend $BACKEND, N=$N ROUNDS=$ROUNDS, $(nproc) CPUs"
for s in $SERVERS; do
  case $s in
    redis) sbin=redis-server; io=(--io-threads 2 --io-threads-do-reads yes) ;;
    # valkey switches its I/O threads on only under more load than this host gives it
    # untraced: kept on, as a loaded server has them.
    valkey) sbin=valkey-server; io=(--io-threads 2 --io-threads-always-active yes) ;;
    # redis 8 is not packaged here: REDIS8_SERVER names a redis-server built from its source
    # (fixtures/io-threads/README.md says how). Its I/O threads run event loops of their own.
    redis8) sbin=${REDIS8_SERVER:?set REDIS8_SERVER to a redis 8 redis-server}; io=(--io-threads 2) ;;
    *) echo "unknown server $s" >&2; exit 2 ;;
  esac
  echo "# $s: $("$sbin" --version)"
  for r in $(seq "$ROUNDS"); do
    launch "$sbin" "$s-$r" --enable-debug-command yes "${io[@]}"
    redis-benchmark -p "$PORT" -t get -n 20000 -c 50 -q >/dev/null 2>&1
    rm -f "$DIR/r.err" # wait_line must not see the previous round's line
    "$BIN" attach --backend "$BACKEND" --pid "$SPID" --threshold 2ms --format json >"$DIR/r.json" 2>"$DIR/r.err" &
    TRACER=$!
    wait_line "$DIR/r.err" "attached to"
    redis-benchmark -p "$PORT" -t get -n "$N" -c 50 -q >/dev/null 2>&1 &
    B=$!
    sleep 1
    d0=$(now); redis-cli -p "$PORT" debug sleep 0.3 >/dev/null; d1=$(now)
    sleep 0.5
    e0=$(now)
    redis-cli -p "$PORT" eval "local i=0 for j=1,tonumber(ARGV[1]) do i=i+j end return i" 0 60000000 >/dev/null
    e1=$(now)
    wait "$B"
    stop
    stop_server "$SPID"
    python3 - "$s" "$DIR/r.json" "$N" "$d0" "$d1" "$e0" "$e1" <<'PY'
import datetime, json, sys
name, rep, n = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
debug, ev = (float(sys.argv[4]), float(sys.argv[5])), (float(sys.argv[6]), float(sys.argv[7]))
def span(s):
    t = datetime.datetime.fromisoformat(s["ts_iso"]).timestamp()
    return t, t + s["duration_us"] / 1e6
def over(a, b):
    return a[0] <= b[1] + 0.002 and b[0] <= a[1] + 0.002
st = rep["stalls"]
false = [s for s in st if s["finding"] == "command" and not over(span(s), debug)
         and not over(span(s), ev) and not ({"EVAL", "DEBUG"} & set(s.get("waiting_by_command") or {}))]
waits = sum(1 for s in st if s["thread"] == "main" and s["finding"] == "io-threads")
dbg = any(s["thread"] == "main" and "nanosleep" in (s.get("syscall") or "") and s["finding"] == "command"
          and s["duration_us"] >= 290000 for s in st)
gaps = [s for s in st if s["thread"] == "main" and s["kind"] == "gap" and over(span(s), ev)]
evl = max(gaps, key=lambda s: s["duration_us"], default=None)
named = bool(evl) and "EVAL" in evl["cause"]
gets = next((c["calls"] for c in rep["commands"] if c["command"] == "GET" and c["phase"] == "all"), 0)
print(f"RUN {name} false_slow_commands={len(false)} io_thread_waits={waits} debug_found={dbg} "
      f"eval_found={bool(evl) and evl['duration_us'] >= 200000} eval_named={named} "
      f"eval_finding={evl['finding'] if evl else None} gets={gets}/{n} lost={rep['summary']['lost_events']}")
for s in false:
    print(f"  FALSE {s['ts_iso']} {s['duration_us']} us sched={s.get('sched')}: {s['cause']}")
PY
  done
done
