#!/usr/bin/env bash
# Writes `stallscope analyze --format json` and the table report of every bundled trace (and of
# any extra trace directories given) to OUT_DIR, one file per trace and format, so that two
# builds can be compared byte for byte: a behaviour-preserving refactor must leave
# `diff -r OLD NEW` empty.
#
#   scripts/golden.sh BINARY OUT_DIR [EXTRA_DIR...]
#
# Every trace is read as a user would read it: plain, and, when the capture carries one, with
# its --threads file too. Dates are pinned (--date) so that -t/-tt traces give the same output on
# any day. Exit statuses are recorded beside the outputs (0, 1 and 2 are all valid results).
# With GOLDEN_PICTURES=1 the --html, --svg and --export-trace files are written too (for a
# renderer refactor; off by default so that older golden directories still compare).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BINARY OUT_DIR [EXTRA_DIR...]" >&2
  exit 2
fi
bin=$(realpath "$1")
out=$2
shift 2
cd "$(dirname "$0")/.."
mkdir -p "$out"

traces() {
  for d in fixtures "$@"; do
    [ -d "$d" ] || continue
    find "$d" -type f \( -name '*.strace' -o -name '*.strace.gz' -o -name '*.strace.[0-9]*' \
      -o -name '*.strace-c.txt' -o -name '*.perf.txt' -o -name '*.perf.txt.gz' \) | sort
    # Peer traces are plain .txt files written by others; a SOURCES/README is not a trace.
    find "$d" -type f -path '*peer*' -name '*.txt' ! -name 'SOURCES*' ! -name 'README*' | sort
  done | sort -u
}

n=0
while IFS= read -r t; do
  name=${t#../}; name=${name#../}; name=${name//\//_}
  for fmt in json table; do
    rc=0
    "$bin" analyze "$t" --format "$fmt" --date 2026-11-30Z </dev/null >"$out/$name.$fmt" 2>"$out/$name.$fmt.stderr" || rc=$?
    echo "$rc" >"$out/$name.$fmt.rc"
  done
  if [ "${GOLDEN_PICTURES:-0}" = 1 ]; then
    "$bin" analyze "$t" --format json --date 2026-11-30Z --html "$out/$name.html" \
      --svg "$out/$name.svg" --export-trace "$out/$name.trace.json" </dev/null \
      >/dev/null 2>"$out/$name.pictures.stderr" || true
  fi
  threads="${t%%.strace*}.threads.txt"
  if [ -f "$threads" ]; then
    rc=0
    "$bin" analyze "$t" --format json --date 2026-11-30Z --threads "$threads" </dev/null \
      >"$out/$name.threads.json" 2>"$out/$name.threads.json.stderr" || rc=$?
    echo "$rc" >"$out/$name.threads.json.rc"
  fi
  n=$((n + 1))
done < <(traces "$@")
echo "$n traces written to $out"
