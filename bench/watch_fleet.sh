#!/usr/bin/env bash
# `watch` with several instances (issue 42): the watcher's CPU and memory with 1, 4 and 8
# redis-servers under the same per-instance load (bench/fleet_load.py: RATE commands a
# second each, SET/GET in pipelines of 10), and its peak RSS with 8 idle instances and with
# 4 under load. One watcher (bpf, one set of programs for all) per scenario; scenarios
# alternate over ROUNDS rounds (1 4 8 idle8, then the same again) and medians are printed.
# The redis binary is copied under a name of its own and watched with `--name` (what
# `--all` does for redis-server and valkey-server), so that other redis on a shared machine
# are left alone.
#
#   bash bench/watch_fleet.sh BIN [ROUNDS] [SECONDS] [RATE]
#
# Prints per scenario and round: the watcher's CPU (seconds of CPU per second, from
# /proc/PID/stat over the measured window), its RSS at the end and its peak (VmHWM), the
# commands sent and the load clients' worst lag behind schedule. Needs root, redis-server,
# python3.
set -euo pipefail
BIN=${1:?BIN}; ROUNDS=${2:-3}; SECS=${3:-20}; RATE=${4:-5000}
DIR=$(mktemp -d)
NAME=redis-fleetb
cp "$(command -v redis-server)" "$DIR/$NAME"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=(); WPID=""
cleanup() {
  [ -n "$WPID" ] && kill "$WPID" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
ticks=$(getconf CLK_TCK)
cpu_s() { awk -v t="$ticks" '{ print ($14 + $15) / t }' "/proc/$1/stat"; }
kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

# One scenario: N instances, LOAD 1 (fleet_load.py on each) or 0 (idle).
scenario() {
  local n=$1 load=$2 ports=() p i
  PIDS=()
  for i in $(seq "$n"); do
    p=$(free_port); ports+=("$p")
    mkdir -p "$DIR/r$p"
    "$DIR/$NAME" --port "$p" --bind 127.0.0.1 --save "" --dir "$DIR/r$p" --logfile r.log --daemonize no >/dev/null 2>&1 &
    PIDS+=($!)
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 200); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
  done
  "$BIN" watch --name "$NAME" --metrics "127.0.0.1:$(free_port)" >/dev/null 2>"$DIR/w.err" &
  WPID=$!
  for _ in $(seq 400); do
    got=$(grep -c 'as instance' "$DIR/w.err" 2>/dev/null) || got=0
    [ "$got" -ge "$n" ] && break
    sleep 0.05
  done
  sleep 2
  local loads=()
  if [ "$load" = 1 ]; then
    for p in "${ports[@]}"; do
      python3 "$(dirname "$0")/fleet_load.py" "$p" "$RATE" "$((SECS + 2))" >"$DIR/load.$p" &
      loads+=($!)
    done
  fi
  sleep 1
  local c0 c1
  c0=$(cpu_s "$WPID")
  sleep "$SECS"
  c1=$(cpu_s "$WPID")
  local rss hwm
  rss=$(kb "$WPID" VmRSS); hwm=$(kb "$WPID" VmHWM)
  for l in "${loads[@]}"; do wait "$l" || true; done
  local sent=0 lag=0
  if [ "$load" = 1 ]; then
    sent=$(cat "$DIR"/load.* | awk '{ s += $1 } END { print s }')
    lag=$(cat "$DIR"/load.* | awk 'BEGIN { m = 0 } { if ($2 > m) m = $2 } END { print m }')
    rm -f "$DIR"/load.*
  fi
  kill "$WPID"; wait "$WPID" 2>/dev/null || true; WPID=""
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
  echo "$n $load $(awk -v a="$c0" -v b="$c1" -v s="$SECS" 'BEGIN { printf "%.4f", (b - a) / s }') $rss $hwm $sent $lag"
}

echo "watch_fleet: $BIN rounds=$ROUNDS secs=$SECS rate=$RATE/instance; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); started $(date -u +%FT%TZ)"
echo "# instances loaded cpu_per_s rss_kb peak_kb commands_sent worst_client_lag_s"
for r in $(seq "$ROUNDS"); do
  for sc in "1 1" "4 1" "8 1" "8 0"; do
    # shellcheck disable=SC2086
    line=$(scenario $sc)
    echo "$line" | tee -a "$DIR/rows"
  done
done
echo "ended $(date -u +%FT%TZ); load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$DIR/rows" "$SECS" <<'PY'
import sys, statistics
secs = int(sys.argv[2])
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault((r[0], r[1]), []).append(r)
print("# medians: instances loaded | watcher CPU (cores) | RSS MiB | peak RSS MiB | commands/s per instance")
for (n, load), rs in sorted(by.items(), key=lambda k: (int(k[0][0]), k[0][1])):
    med = lambda i: statistics.median(float(x[i]) for x in rs)
    per = med(5) / int(n) / (secs + 2) if load == "1" else 0
    print(f"{n} {'load' if load == '1' else 'idle'} | {med(2):.3f} | {med(3)/1024:.0f} | {med(4)/1024:.0f} | {per:.0f}")
PY
