#!/usr/bin/env bash
# What `stallscope watch`'s default mode (the cheap tier) finds: RUNS rounds of three injected
# stalls against a fresh redis-server whose data directory and log file are on slowfs
# (scripts/slowfs.py): DEBUG SLEEP 0.3 (a blocked syscall: the sleep must be named), an EVAL
# busy loop of 0.5 s (a main-thread gap on a CPU), and a close() of redis's log file that
# slowfs holds for 400 ms (DEBUG LOG; the call and the log file must be named). Each must be
# found once, with a duration within the sampling period plus 10 % of what was injected
# (slowfs's own log gives the close's real delay). Then INCIDENTS stalls with --out under
# redis-benchmark load, each escalating to the full tier for its incident, and the watcher's
# peak RSS (VmHWM) over both phases.
#
#   bench/cheap_detect.sh [RUNS] [INCIDENTS]   (defaults 20, 5)
#
# Needs root, redis-server, redis-cli, python3 with fusepy, fusermount, and a build
# (BIN=path, default target/release/stallscope).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-20}
INCIDENTS=${2:-5}
PERIOD_MS=${PERIOD_MS:-2}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/stallscope}
[ -x "$BIN" ] || { echo "build first ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli python3 fusermount mountpoint
in_temp_dir
mkdir -p "$DIR/back" "$DIR/mnt"
FS=""
# The mount is busy while redis (its log file) or the watcher (which reads that log) holds it
# open: both are gone before it is unmounted, ahead of lib.sh's own stop of the server.
on_exit 'stop_server "${RPID:-}"; sleep 0.3; fusermount -u "$DIR/mnt" 2>/dev/null; [ -n "$FS" ] && kill "$FS" 2>/dev/null'
python3 scripts/slowfs.py "$DIR/back" "$DIR/mnt" --control "$DIR/ctl" --log "$DIR/delays.tsv" >"$DIR/fs.out" 2>&1 &
FS=$!
for _ in $(seq 100); do mountpoint -q "$DIR/mnt" && [ -S "$DIR/ctl" ] && break; sleep 0.1; done
launch redis-server mnt --logfile "$DIR/mnt/redis.log" --enable-debug-command local
RPID=$SPID
rule() { python3 scripts/slowfs.py set "$DIR/ctl" "$1" >/dev/null; }
EVAL="local t = redis.call('TIME') local s = t[1] + t[2] / 1e6 while true do local n = redis.call('TIME') if n[1] + n[2] / 1e6 - s > 0.5 then break end end return 1"
start_watch() {
  rm -f "$DIR/w.err"
  "$BIN" watch --pid "$RPID" --threshold 50ms --sample-period "${PERIOD_MS}ms" --events "$1" \
    --redis-log "$DIR/mnt/redis.log" "${@:2}" ${WATCH_EXTRA:-} >/dev/null 2>"$DIR/w.err" &
  TRACER=$!
  wait_line "$DIR/w.err" "watching $RPID"
}
count() { { ls "$DIR/incidents"/*.json 2>/dev/null || true; } | wc -l; }
ended() { grep -c "back to the cheap tier" "$DIR/w.err" || true; }
peak() { vm_kb "$TRACER" VmHWM; }

echo "cheap tier detection: $RUNS rounds, sampling period ${PERIOD_MS} ms, threshold 50 ms; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r), $(git rev-parse --short HEAD)"
start_watch "$DIR/events.jsonl"
for r in $(seq "$RUNS"); do
  redis-cli -p "$PORT" debug sleep 0.3 >/dev/null
  sleep 0.2
  redis-cli -p "$PORT" eval "$EVAL" 0 >/dev/null
  sleep 0.2
  rule '{"rules": [{"op": "flush", "match": "redis.log", "ms": 400}]}'
  redis-cli -p "$PORT" debug log "cheap tier round $r" >/dev/null
  rule '{"rules": []}'
  sleep 0.2
done
sleep 1
PEAK_A=$(peak)
stop
python3 - "$DIR/events.jsonl" "$DIR/delays.tsv" "$RUNS" "$PERIOD_MS" <<'PY'
import json, statistics, sys
events = [json.loads(l) for l in open(sys.argv[1])]
runs, period = int(sys.argv[3]), float(sys.argv[4]) / 1000
closes = []
rows = {}
for l in list(open(sys.argv[2]))[1:]:
    f = l.rstrip("\n").split("\t")
    if f[1] == "end" and f[3] == "flush":
        closes.append(float(f[5]) / 1000)
kinds = {
    "sleep": ([e for e in events if "nanosleep" in (e["syscall"] or "")], lambda i: 0.3),
    "eval": ([e for e in events if e["kind"] == "gap"], lambda i: 0.5),
    "close": ([e for e in events if e["syscall"] == "close" and (e["path"] or "").endswith("/redis.log")],
              lambda i: closes[i] if i < len(closes) else 0.4),
}
other = [e for e in events if e not in sum((v[0] for v in kinds.values()), [])]
for k, (found, injected) in kinds.items():
    errs = [e["duration_s"] - injected(i) for i, e in enumerate(found)]
    ok = [abs(x) <= period + 0.1 * injected(i) for i, x in enumerate(errs)]
    print(f"{k}: found {len(found)}/{runs}; within the period + 10 %: {sum(ok)}/{len(found)}; "
          f"duration - injected: median {statistics.median(errs) * 1000:+.1f} ms, "
          f"min {min(errs) * 1000:+.1f}, max {max(errs) * 1000:+.1f}" if found else f"{k}: found 0/{runs}")
print(f"other stall lines: {len(other)}" + "".join(f"\n  {o['kind']} {o['syscall']} {o['duration_s']:.3f}s {o['thread']}" for o in other[:5]))
PY
echo "peak RSS (VmHWM) over the detection rounds: $((PEAK_A / 1024)) MiB"

start_watch "$DIR/events2.jsonl" --out "$DIR/incidents" --after 1s
# Under load: each escalation's full tier records a saturated redis (its history ring fills).
redis-benchmark -p "$PORT" -t set -n 100000000 -c 50 -q >/dev/null 2>&1 &
LOAD=$!
for i in $(seq "$INCIDENTS"); do
  n=$(count)
  redis-cli -p "$PORT" debug sleep 0.3 >/dev/null
  for _ in $(seq 600); do
    [ "$(count)" -gt "$n" ] && [ "$(ended)" -ge "$i" ] && break
    sleep 0.1
  done
done
PEAK_B=$(peak)
kill "$LOAD" 2>/dev/null || true
stop
echo "incidents under load: $(count) of $INCIDENTS written, $(ended) escalations ended, $(grep -o '[0-9]* lost' "$DIR/w.err" | awk '{s += $1} END {print s + 0}') records lost; peak RSS (VmHWM) with escalations: $((PEAK_B / 1024)) MiB"
