#!/usr/bin/env bash
# What the ptrace backend's scheduler split costs redis: `redis-benchmark -t set` throughput
# under `stallscope attach --backend ptrace` with the split (two preads of /proc per stop) and
# without it (STALLSCOPE_PTRACE_NO_SCHED=1), alternated A B A B in one run on one redis-server
# (a fresh one on a free loopback port in a temp dir), each round also measuring untraced
# throughput. Prints each run, the medians and the ratio with/without (within each round and of
# the medians).
#
#   bench/ptrace_sched.sh [REQUESTS] [CLIENTS] [ROUNDS] [REDIS ARGS...]   (defaults 20000, 50, 7)
#
# e.g. `bench/ptrace_sched.sh 20000 50 7 --io-threads 2 --io-threads-do-reads yes` for redis
# with I/O threads. Needs redis-server, redis-benchmark, redis-cli, python3, root, and a build
# (BIN=target/testing/stallscope by default; release or testing, the ratio is what counts).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
C=${2:-50}
ROUNDS=${3:-7}
shift $(( $# < 3 ? $# : 3 ))
BIN=${BIN:-target/testing/stallscope}
[ -x "$BIN" ] || { echo "build first ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli python3
start_redis "$@"
traced() { # $1: 1 = without the split
  STALLSCOPE_PTRACE_NO_SCHED=$1 "$BIN" attach --backend ptrace --pid "$RPID" --format json \
    --threshold 1s >"$DIR/pt.json" 2>"$DIR/pt.err" &
  TRACER=$!
  wait_ptraced
  R=$(rps)
  stop
  wait_untraced
  # The tracer's own time per stop (from waitpid's return to the resume), from its report.
  U=$(python3 -c "import json,sys; print(f\"{json.load(open(sys.argv[1]))['overhead']['mean_stop_us']:.2f}\")" "$DIR/pt.json")
  echo "$R $U"
}
rps >/dev/null # warm up
echo "redis-benchmark -t set -n $N -c $C on $(nproc) cores, redis $(redis-server --version | awk '{print $3}' | cut -d= -f2) $*, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
WITH=(); WITHOUT=(); BASE=(); RATIO=(); WITH_US=(); WITHOUT_US=()
for round in $(seq "$ROUNDS"); do
  B=$(rps)
  # Alternate which goes first, so a drift within a round hits both alike.
  if [ $((round % 2)) = 1 ]; then A=$(traced 1); S=$(traced 0); else S=$(traced 0); A=$(traced 1); fi
  read -r A AU <<<"$A"; read -r S SU <<<"$S"
  WITHOUT+=("$A"); WITH+=("$S"); BASE+=("$B"); WITHOUT_US+=("$AU"); WITH_US+=("$SU")
  RATIO+=("$(python3 -c "print(f'{$S/$A:.3f}')")")
  printf 'round %d: untraced %9s rps | ptrace without split %9s (%s us a stop) | with split %9s (%s us a stop) | with/without %s\n' \
    "$round" "$B" "$A" "$AU" "$S" "$SU" "${RATIO[-1]}"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
MW=$(median "${WITH[@]}"); MA=$(median "${WITHOUT[@]}")
echo "medians: untraced $(median "${BASE[@]}") rps, ptrace without split $MA ($(median "${WITHOUT_US[@]}") us a stop), with split $MW ($(median "${WITH_US[@]}") us a stop); ratio of medians $(python3 -c "print(f'{$MW/$MA:.3f}')"), median of the rounds' ratios $(median "${RATIO[@]}")"
