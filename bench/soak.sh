#!/usr/bin/env bash
# Soak test of `stallscope watch`: a fresh redis-server under steady load (redis-benchmark
# SET/GET from 4 clients, looping) for DURATION seconds, with a stall injected every minute,
# alternately `DEBUG SLEEP 0.3` (a slow syscall of the main thread) and an EVAL that spins
# 300 ms without a syscall (a gap). The watcher runs with --out, --events and --metrics as a
# service would. Prints, at the end:
#   - the watcher's RSS at 5 minutes and at the end (from /proc), and their ratio; RSS is
#     sampled every 5 s, and an incident being analysed holds the ring's events for a few
#     seconds (handed over, not copied) while the ring refills, so each figure is given as
#     the floor (what stays: leaks would raise it) and the peak (bounded by design: the ring
#     and one incident's events, two when the ring is dropping what a waiting incident needs,
#     plus the analyzers: at most three times --ring-size) of the minute before it;
#   - injected stalls vs those the watcher counted (--events lines of the main thread of
#     the injected kind over each injection's window, adding up to >= 250 ms: a spin can
#     be cut in pieces by a syscall redis makes during the script) and the
#     stallscope_stalls_total sum; stalls in no report, by reason; the writer's time per
#     report; the load average;
#   - incident reports written vs incidents injected (each injection is 60 s after the
#     previous one, beyond --before + --after, so each is one incident).
#
#   nice bash bench/soak.sh [DURATION_S] [OUT_FILE]     (defaults 1800, bench/soak.result.txt)
#
# THRESHOLD (default 10ms; 100ms makes the injected 300 ms stalls the incidents, even when
# redis's main thread splits a spin in two with a syscall of its own) and MAX_INCIDENTS (default 1000 per hour: the soak checks grouping
# and memory, not the rate limit) are passed to the watcher. bench/soak_check.py matches
# each injected stall to the incident reports. WATCH_EXTRA adds watcher flags (e.g.
# `--perf-pages 8192` on a loaded machine, where a descheduled watcher loses records). KEEP=1
# keeps the run's directory (incident reports, --events log, RSS samples) for a look after.
#
# Needs redis-server, redis-benchmark, redis-cli, curl, python3, root, and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-1800}
OUT=${2:-bench/soak.result.txt}
BIN=${CARGO_TARGET_DIR:-target}/release/stallscope
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli curl python3
start_redis --appendonly yes --appendfsync everysec --enable-debug-command yes
MPORT=$(free_port)
# lib.sh's cleanup removes $DIR only when it is still set.
on_exit '[ -n "${KEEP:-}" ] && echo "soak: kept $DIR (incidents, events.jsonl, rss.txt, watch.err)" >&2 && DIR=""'

"$BIN" watch --pid "$RPID" --out "$DIR/incidents" --events "$DIR/events.jsonl" \
  --metrics "127.0.0.1:$MPORT" --threshold "${THRESHOLD:-10ms}" \
  --max-incidents-per-hour "${MAX_INCIDENTS:-1000}" ${WATCH_EXTRA:-} >/dev/null 2>"$DIR/watch.err" &
TRACER=$!
wait_line "$DIR/watch.err" "watching $RPID"
rss() { vm_kb "$TRACER" VmRSS; }

steady_load
SPIN='local t = redis.call("TIME") local s = t[1] * 1000000 + t[2] while true do local n = redis.call("TIME") if n[1] * 1000000 + n[2] - s > 300000 then break end end return 1'
START=$(date +%s)
INJ_SLEEP=0; INJ_SPIN=0; RSS5=""; RSS10=""; i=0
echo "soak: ${DUR}s, threshold ${THRESHOLD:-10ms}, redis $RPID on port $PORT, watcher $TRACER, started $(date -u +%FT%TZ)" | tee "$OUT"
while :; do
  now=$(date +%s); el=$((now - START))
  [ "$el" -ge "$DUR" ] && break
  if [ $((el - ${LAST_SAMPLE:--5})) -ge 5 ]; then
    echo "$el $(rss)" >>"$DIR/rss.txt"; LAST_SAMPLE=$el
    echo "$el $(cut -d' ' -f1 /proc/loadavg)" >>"$DIR/load.txt"
  fi
  if [ -z "$RSS5" ] && [ "$el" -ge 300 ]; then RSS5=$(rss); echo "RSS at ${el}s: ${RSS5} kB" | tee -a "$OUT"; fi
  if [ -z "$RSS10" ] && [ "$el" -ge 600 ]; then RSS10=$(rss); echo "RSS at ${el}s: ${RSS10} kB" | tee -a "$OUT"; fi
  # One injection per minute, at 30 s past each minute of the run.
  if [ "$el" -ge $((i * 60 + 30)) ]; then
    # When each injection was sent and answered: bench/soak_check.py finds its stalls by
    # that window, whatever pieces the watcher saw it as.
    t0=$(date -u +%FT%T.%6N+00:00)
    if [ $((i % 2)) -eq 0 ]; then
      redis-cli -p "$PORT" DEBUG SLEEP 0.3 >/dev/null && INJ_SLEEP=$((INJ_SLEEP + 1)) && kind=sleep
    else
      redis-cli -p "$PORT" EVAL "$SPIN" 0 >/dev/null && INJ_SPIN=$((INJ_SPIN + 1)) && kind=spin
    fi
    echo "$t0 $(date -u +%FT%T.%6N+00:00) $kind" >>"$DIR/injected.txt"
    i=$((i + 1))
    echo "$(date -u +%T) injected $i; watcher RSS $(rss) kB" >>"$OUT"
  fi
  sleep 1
done
# Let the last incident finish (--after 5 s, then the report is written).
sleep 10
RSSEND=$(rss)
kill "$LOAD" 2>/dev/null || true; wait "$LOAD" 2>/dev/null || true; LOAD=""
STALLS_METRIC=$(metric stallscope_stalls_total)
INCIDENTS=$(find "$DIR/incidents" -name '*.json' | wc -l)
SUPPRESSED=$(metric stallscope_incidents_suppressed_total)
LOST=$(metric stallscope_lost_events_total)
EVICTED=$(metric stallscope_ring_evicted_early_total)
CPU=$(metric stallscope_watcher_cpu_seconds_total)
WRITTEN_METRIC=$(metric stallscope_incidents_total)
WSEC=$(metric stallscope_incident_write_seconds_total)
WCPU=$(metric stallscope_incident_write_cpu_seconds_total)
NOTREP=$(curl -s "http://127.0.0.1:$MPORT/metrics" | awk 'index($1, "stallscope_stalls_not_reported_total") == 1 {sub(/.*reason="/, "", $1); sub(/".*/, "", $1); printf "%s %s, ", $1, $2}')
ERRS=$(metric stallscope_incident_write_errors_total)
read -r SEEN_SLEEP SEEN_SPIN < <(python3 - "$DIR/events.jsonl" <<'PY'
import json, sys
sl = sp = 0
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["thread"] != "main" or e["duration_s"] < 0.25:
        continue
    if e["kind"] == "slow_syscall" and e["syscall"] in ("clock_nanosleep", "nanosleep"):
        sl += 1
    elif e["kind"] == "gap":
        sp += 1
print(sl, sp)
PY
)
stop TERM
{
  echo "ended $(date -u +%FT%TZ)"
  echo "watcher RSS: ${RSS5} kB at 5 min, ${RSSEND} kB at the end: $(python3 -c "print(f'{$RSSEND / $RSS5:.3f}')")x"
  [ -n "$RSS10" ] && echo "watcher RSS: ${RSS10} kB at 10 min, ${RSSEND} kB at the end: $(python3 -c "print(f'{$RSSEND / $RSS10:.3f}')")x"
  python3 - "$DIR/rss.txt" "$DUR" <<'PY'
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 2]
end = max(t for t, _ in rows)
def window(a, b):
    v = [r for t, r in rows if a <= t < b]
    return min(v), max(v)
f5, p5 = window(240, 300)
fe, pe = window(end - 60, end + 1)
print(f"watcher RSS floor/peak over the minute before 5 min: {f5}/{p5} kB; before the end: {fe}/{pe} kB; floor ratio {fe / f5:.3f}, peak ratio {pe / p5:.3f}")
if end >= 600:
    f10, p10 = window(540, 600)
    print(f"watcher RSS floor/peak over the minute before 10 min: {f10}/{p10} kB; floor ratio at the end {fe / f10:.3f}, peak ratio {pe / p10:.3f}")
# Per minute: a leak climbs; the live analyzer, replaced every 10 minutes, saws.
floors = [window(m * 60, m * 60 + 60)[0] for m in range(end // 60) if any(m * 60 <= t < m * 60 + 60 for t, _ in rows)]
print("watcher RSS floor per minute (MB): " + " ".join(f"{f / 1024:.0f}" for f in floors))
PY
  echo "injected: $INJ_SLEEP DEBUG SLEEP 0.3, $INJ_SPIN EVAL 300 ms spins; seen by the watcher (--events, main thread, >= 250 ms): $SEEN_SLEEP sleeps, $SEEN_SPIN gaps"
  echo "stallscope_stalls_total (all stalls over ${THRESHOLD:-10ms}, load included): $STALLS_METRIC"
  echo "incident reports written: $INCIDENTS for $((INJ_SLEEP + INJ_SPIN)) injected incidents; not written: $SUPPRESSED (rate limit or writer busy), $ERRS write errors"
  echo "stalls in no report (stallscope_stalls_not_reported_total): ${NOTREP%, }"
  python3 -c "n=$WRITTEN_METRIC; print(f'incident writer: {$WSEC:.1f} s wall, {$WCPU:.1f} s CPU for {n:.0f} reports: {$WSEC / max(n, 1):.2f} s wall, {$WCPU / max(n, 1):.2f} s CPU each')"
  python3 -c "import sys; v=[float(l.split()[1]) for l in open('$DIR/load.txt')]; print(f'load average (1 min, every 5 s): min {min(v):.1f}, median {sorted(v)[len(v)//2]:.1f}, max {max(v):.1f}')"
  echo "lost events $LOST, ring evicted early $EVICTED, watcher CPU ${CPU}s over ${DUR}s; exit status after SIGTERM $STATUS"
  python3 bench/soak_check.py "$DIR/events.jsonl" "$DIR/incidents" "$DIR/injected.txt"
  echo "incident files:"; ls "$DIR/incidents" | sed 's/^/  /' | head -80
  echo "watcher stderr (last 5 lines):"; tail -5 "$DIR/watch.err" | sed 's/^/  /'
} | tee -a "$OUT"
