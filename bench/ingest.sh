#!/usr/bin/env bash
# Issue 17's figures: `stallscope analyze --format json` against the Perl gap finder people use
# today and `wc -l` (the floor: nothing line-based reads faster), on the same synthetic
# 6M-line traces in ONE hyperfine run: the `strace -ttt -T` shape, the `strace -f -tt -T`
# shape (`[pid N]` column) and the `-ttt` file gzipped (perl and wc read it through
# `gzip -dc`, stallscope reads the .gz itself). Min and median of each, ratios to perl; then
# peak RSS on the 6M-line file and on one twice as large. Two more shapes of the same lines,
# for stallscope alone (perl reads neither): the `-ttt` file piped in on stdin, and the same
# lines as an `strace -ff` set of two files (every fourth line in the second), which
# stallscope merges by time; their ratios are to perl on the `-ttt` file. And the `-ttt` file
# as stdin redirected from it (`analyze - < file`), which stallscope reads as the file.
#   bench/ingest.sh [LINES]        (default 6000000; needs hyperfine, perl, python3, gzip)
#   BIN=path/to/stallscope RUNS=5 bench/ingest.sh   (default: a fresh `cargo build --release`)
# The trace generator and the Perl baseline are bench/gen_trace.py and bench/gapfind.pl
# (provenance in bench/README.md). Traces are generated once into $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
lines=${1:-6000000}
runs=${RUNS:-5}
dir=${TMPDIR:-/tmp}
ttt="$dir/stallscope-ingest-$lines-ttt.txt"
ttf="$dir/stallscope-ingest-$lines-tt-f.txt"
gz="$ttt.gz"
big2="$dir/stallscope-ingest-$((lines * 2))-ttt.txt"
# Runs sharing $TMPDIR share the traces: each is written under a name of its own and renamed
# into place whole (a run never reads another's half-written file, nor one left by a run that
# was interrupted), one run at a time under a lock (the next one waits, then finds them made).
# Everything else a run writes is its own.
gen_once() { # make FILE COMMAND...: FILE from COMMAND's stdout, unless it is there already
  local f=$1
  shift
  [ -s "$f" ] && return
  local part
  part=$(mktemp "$f.part.XXXXXX")
  "$@" > "$part" && mv -f "$part" "$f" || { rm -f "$part"; return 1; }
}
exec 9> "$dir/stallscope-ingest.lock"
flock 9
gen_once "$ttt" python3 bench/gen_trace.py "$lines" ttt
gen_once "$ttf" python3 bench/gen_trace.py "$lines" tt-f
gen_once "$gz" gzip -c "$ttt"
gen_once "$big2" python3 bench/gen_trace.py "$((lines * 2))" ttt
ff="$dir/stallscope-ingest-$lines-ff/trace"
if [ ! -s "$ff.101" ]; then
  mkdir -p "$(dirname "$ff")"
  awk -v a="$ff.100.part" -v b="$ff.101.part" 'NR % 4 == 0 { print > b; next } { print > a }' "$ttt"
  mv -f "$ff.100.part" "$ff.100" && mv -f "$ff.101.part" "$ff.101"
fi
flock -u 9
results=$(mktemp "$dir/stallscope-ingest.XXXXXX.json")
trap 'rm -f "$results"' EXIT
if [ -z "${BIN:-}" ]; then
  cargo build --release -q
  BIN=target/release/stallscope
fi
bin=$(realpath "$BIN")
for f in "$ttt" "$ttf" "$gz"; do
  echo "input: $f ($(du -h "$f" | cut -f1))"
done
# -i: stallscope exits 1 when it finds stalls, which these files have.
hyperfine -i -w1 -r"$runs" --export-json "$results" \
  -n "wc ttt" "wc -l < $ttt" \
  -n "perl ttt" "perl bench/gapfind.pl 0.2 < $ttt" \
  -n "stallscope ttt" "$bin analyze $ttt --format json" \
  -n "wc tt-f" "wc -l < $ttf" \
  -n "perl tt-f" "perl bench/gapfind.pl 0.2 < $ttf" \
  -n "stallscope tt-f" "$bin analyze $ttf --format json" \
  -n "wc gz" "gzip -dc < $gz | wc -l" \
  -n "perl gz" "gzip -dc < $gz | perl bench/gapfind.pl 0.2" \
  -n "stallscope gz" "$bin analyze $gz --format json" \
  -n "stallscope stdin" "cat $ttt | $bin analyze - --format json" \
  -n "stallscope redirect" "$bin analyze - --format json < $ttt" \
  -n "stallscope ff" "$bin analyze $ff --format json" 2>&1 | grep -v '^ *$' || true
python3 - "$results" <<'PY'
import json, statistics, sys
res = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
r = {k: v["times"] for k, v in res.items()}
# CPU seconds (user + system, mean over the runs, children included): on a machine shared with
# other work the wall times of a one-thread perl and a three-thread stallscope are squeezed
# differently; CPU time says what each one costs whatever the load.
cpu = {k: v["user"] + v["system"] for k, v in res.items()}
print(f"{'shape':6} {'':10} {'min s':>7} {'median s':>9} {'perl/x min':>11} {'perl/x median':>14} {'cpu s':>7} {'perl/x cpu':>11}")
for shape in ("ttt", "tt-f", "gz"):
    p = r[f"perl {shape}"]
    pm, pmed, pc = min(p), statistics.median(p), cpu[f"perl {shape}"]
    for who in ("perl", "stallscope", "wc"):
        k = f"{who} {shape}"
        m, med = min(r[k]), statistics.median(r[k])
        print(f"{shape:6} {who:10} {m:7.3f} {med:9.3f} {pm / m:10.2f}x {pmed / med:13.2f}x {cpu[k]:7.3f} {pc / cpu[k]:10.2f}x")
    s = r[f"stallscope {shape}"]
    print(f"{shape:6} speed-up over perl: {pm / min(s):.2f}x (min), {pmed / statistics.median(s):.2f}x (median); target 6x, goal 8x")
p = r["perl ttt"]
pm, pmed, pc = min(p), statistics.median(p), cpu["perl ttt"]
for shape in ("stdin", "redirect", "ff"):
    k = f"stallscope {shape}"
    m, med = min(r[k]), statistics.median(r[k])
    print(f"{shape:8} {'stallscope':10} {m:7.3f} {med:9.3f} {pm / m:10.2f}x {pmed / med:13.2f}x {cpu[k]:7.3f} {pc / cpu[k]:10.2f}x  (ratios to perl ttt)")
PY
for f in "$ttt" "$big2"; do
  # analyze exits 1 when it finds stalls (this file has them): not a failure here.
  rss=$( { /usr/bin/time -v "$bin" analyze "$f" --format json > /dev/null || true; } 2>&1 | awk -F': ' '/Maximum resident/ {print $2}')
  echo "peak RSS on $(basename "$f") ($(du -h "$f" | cut -f1)): $((rss / 1024)) MB (target 32 MB)"
done
