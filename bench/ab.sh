#!/usr/bin/env bash
# Two builds of stallscope on the same trace, in one hyperfine run, with the Perl gap finder
# as the common yardstick: how a change moved the speed, as ratios measured together.
#   bench/ab.sh OLD_BINARY NEW_BINARY [TRACE]
# TRACE defaults to bench/gen_trace.py's 6M-line `-ttt -T` log (generated once into $TMPDIR).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OLD_BINARY NEW_BINARY [TRACE]" >&2
  exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
cd "$(dirname "$0")/.."
dir=${TMPDIR:-/tmp}
trace=${3:-$dir/stallscope-bench-6000000.txt}
[ -s "$trace" ] || python3 bench/gen_trace.py 6000000 ttt > "$trace"
runs=${RUNS:-7}
# -i: stallscope exits 1 when it finds stalls, which the synthetic trace has.
hyperfine -i -w1 -r"$runs" --export-json "$dir/stallscope-ab.json" \
  -n perl "perl bench/gapfind.pl 0.2 < $trace" \
  -n old "$old analyze $trace --format json" \
  -n new "$new analyze $trace --format json" 2>&1 | grep -v '^ *$' || true
python3 - "$dir/stallscope-ab.json" <<'PY'
import json, statistics, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
def fig(n):
    t = r[n]["times"]
    return min(t), statistics.median(t)
# CPU seconds (user + system, mean): what a run costs, less at the mercy of other load than
# the wall time.
cpu = {n: r[n]["user"] + r[n]["system"] for n in r}
pm, pmed = fig("perl")
for n in ("old", "new"):
    m, med = fig(n)
    print(f"{n}: min {m:.3f} s, median {med:.3f} s, cpu {cpu[n]:.3f} s; over perl: {pm / m:.2f}x (min), {pmed / med:.2f}x (median), {cpu['perl'] / cpu[n]:.2f}x (cpu)")
om, omed = fig("old")
nm, nmed = fig("new")
print(f"new/old: {nm / om:.3f} (min), {nmed / omed:.3f} (median), {cpu['new'] / cpu['old']:.3f} (cpu)")
PY
