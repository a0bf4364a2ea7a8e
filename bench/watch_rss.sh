#!/usr/bin/env bash
# The watcher's memory, one build against another in the same run: both watch the same
# fresh redis-server (perf backend, --out, --events) under the same steady load
# (redis-benchmark SET/GET from 4 clients, looping) with a `DEBUG SLEEP 0.3` injected every
# 20 s, so each writes an incident report every 20 s. Their RSS is read from /proc every 2 s.
# Prints, per watcher: RSS floor (minimum), median and peak over the run after the first
# minute, incident reports written; then the ratios B/A.
#
#   nice bash bench/watch_rss.sh BIN_A BIN_B [DURATION_S] [EXTRA_FLAGS_A] [EXTRA_FLAGS_B]
#
# e.g. BIN_A a build of the previous commit, BIN_B target/release/stallscope; extra flags
# (such as `--ring-size 128MiB`) compare like settings instead of defaults.
# Needs redis-server, redis-benchmark, redis-cli, python3, root.
set -euo pipefail
A=${1:?BIN_A}; B=${2:?BIN_B}; DUR=${3:-300}; XA=${4:-}; XB=${5:-}
# No cd to the repository: BIN_A and BIN_B may be paths from where it is run.
. "$(dirname "$0")/lib.sh"
need redis-server redis-benchmark redis-cli python3
start_redis --appendonly yes --appendfsync everysec --enable-debug-command yes
WA=""; WB=""
on_exit 'for p in "$WA" "$WB"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done'
# shellcheck disable=SC2086
"$A" watch --pid "$RPID" --out "$DIR/a" --events "$DIR/a.jsonl" --max-incidents-per-hour 1000 $XA >/dev/null 2>"$DIR/a.err" &
WA=$!
# shellcheck disable=SC2086
"$B" watch --pid "$RPID" --out "$DIR/b" --events "$DIR/b.jsonl" --max-incidents-per-hour 1000 $XB >/dev/null 2>"$DIR/b.err" &
WB=$!
wait_line "$DIR/a.err" "watching $RPID"
wait_line "$DIR/b.err" "watching $RPID"
steady_load
START=$(date +%s); NEXT=10
echo "watch_rss: ${DUR}s; A=$A $XA; B=$B $XB; redis $RPID; started $(date -u +%FT%TZ)"
while :; do
  el=$(( $(date +%s) - START ))
  [ "$el" -ge "$DUR" ] && break
  echo "$el $(vm_kb "$WA" VmRSS) $(vm_kb "$WB" VmRSS)" >>"$DIR/rss.txt"
  if [ "$el" -ge "$NEXT" ]; then redis-cli -p "$PORT" DEBUG SLEEP 0.3 >/dev/null; NEXT=$((NEXT + 20)); fi
  sleep 2
done
sleep 8
# Each watcher's CPU time (user + system, s) over the run: what its allocator settings cost.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / hz}' /proc/"$1"/stat; }
echo "watcher CPU: A $(cpu "$WA") s, B $(cpu "$WB") s; peak (VmHWM): A $(($(vm_kb "$WA" VmHWM) / 1024)) MB, B $(($(vm_kb "$WB" VmHWM) / 1024)) MB"
python3 - "$DIR/rss.txt" "$(find "$DIR/a" -name '*.json' | wc -l)" "$(find "$DIR/b" -name '*.json' | wc -l)" <<'PY'
import sys, statistics
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 3]
rows = [r for r in rows if r[0] >= 60]
out = {}
for i, name in ((1, "A"), (2, "B")):
    v = [r[i] for r in rows]
    out[name] = (min(v), statistics.median(v), max(v))
    print(f"{name}: RSS floor {out[name][0] / 1024:.0f} MB, median {out[name][1] / 1024:.0f} MB, peak {out[name][2] / 1024:.0f} MB over {len(v)} samples; incident reports {sys.argv[2 if name == 'A' else 3]}")
a, b = out["A"], out["B"]
print(f"B/A: floor {b[0] / a[0]:.2f}, median {b[1] / a[1]:.2f}, peak {b[2] / a[2]:.2f}")
PY
