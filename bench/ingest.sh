#!/usr/bin/env bash
# Issue 2's figures: `stallscope analyze --format json` against the Perl gap finder people use
# today, on the same synthetic 6M-line `strace -ttt -T` log, in one hyperfine run; `wc -l` as
# the floor; peak RSS on that file and on one twice as large.
#   bench/ingest.sh [LINES]        (default 6000000; needs hyperfine, perl, python3)
# The trace generator and the Perl baseline are bench/gen_trace.py and bench/gapfind.pl
# (provenance in bench/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
lines=${1:-6000000}
dir=${TMPDIR:-/tmp}
big="$dir/stallscope-bench-$lines.txt"
big2="$dir/stallscope-bench-$((lines * 2)).txt"
[ -s "$big" ] || python3 bench/gen_trace.py "$lines" ttt > "$big"
[ -s "$big2" ] || python3 bench/gen_trace.py "$((lines * 2))" ttt > "$big2"
cargo build --release -q
bin=target/release/stallscope
echo "input: $big ($(du -h "$big" | cut -f1), $(wc -l < "$big") lines)"
# -i: stallscope exits 1 when it finds stalls, which this file has.
hyperfine -i -w1 -r5 --export-json "$dir/stallscope-ingest.json" \
  "wc -l < $big" \
  "perl bench/gapfind.pl 0.2 < $big" \
  "$bin analyze $big --format json" 2>&1 | grep -v '^ *$' || true
python3 - "$dir/stallscope-ingest.json" <<'PY'
import json, sys
r = {x["command"].split()[0].split("/")[-1]: x for x in json.load(open(sys.argv[1]))["results"]}
perl, ours, wc = r["perl"]["mean"], r["stallscope"]["mean"], r["wc"]["mean"]
print(f"perl {perl:.3f} s, stallscope {ours:.3f} s, wc -l {wc:.3f} s")
print(f"speed-up over perl: {perl / ours:.2f}x (target 4x); stallscope is {ours / wc:.1f}x the wc -l floor")
PY
for f in "$big" "$big2"; do
  # analyze exits 1 when it finds stalls (this file has them): not a failure here.
  rss=$( { /usr/bin/time -v "$bin" analyze "$f" --format json > /dev/null || true; } 2>&1 | awk -F': ' '/Maximum resident/ {print $2}')
  echo "peak RSS on $(du -h "$f" | cut -f1): $((rss / 1024)) MB (target 32 MB)"
done
