#!/usr/bin/env bash
# What one traced syscall costs under `stallscope attach --backend bpf`, kernel side: a small
# C loop (built here with cc) makes N getppid() calls per round and prints its own CPU time
# per call (getrusage); rounds alternate untraced and traced (a fresh attach each time), so
# load elsewhere hits both alike. CPU time, not wall time: the loop's own cost per call,
# including the tracepoint dispatch and the programs, is what the attach adds.
#
#   bench/bpf_syscall_cost.sh [N] [PAIRS]     (defaults 1000000, 3)
#   BIN=path/to/stallscope bench/bpf_syscall_cost.sh
#   STATS=1 ...   also each program's mean run time (kernel.bpf_stats_enabled for the run;
#                 its own clock reads add to the figures and to the traced CPU time)
#   OTHER=1 ...   attach to an idle `sleep` instead, so the loop is a bystander: what every
#                 other task's syscall pays while the bpf backend runs (the syscall
#                 tracepoints' slow path, their dispatch and the programs' process filter;
#                 under a local benchmark, the client's toll)
#
# Needs root, cc, python3 (and bpftool with STATS=1).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
P=${2:-3}
BIN=$(realpath "${BIN:-${CARGO_TARGET_DIR:-target}/release/stallscope}")
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need cc python3
[ "${STATS:-0}" = 1 ] && need bpftool
in_temp_dir
L=""; T=""
on_exit 'for p in "$T" "$L"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done'
cat >"$DIR/loop.c" <<'C'
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
static volatile sig_atomic_t go;
static void on_usr1(int s) { (void)s; go = 1; }
static double cpu(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}
int main(int argc, char **argv)
{
	long n = atol(argv[1]);
	int rounds = atoi(argv[2]);
	signal(SIGUSR1, on_usr1);
	for (int k = 0; k < rounds; k++) {
		while (!go)
			pause();
		go = 0;
		double c0 = cpu();
		for (long i = 0; i < n; i++)
			syscall(SYS_getppid);
		printf("%.1f\n", (cpu() - c0) * 1e9 / n);
		fflush(stdout);
	}
	return 0;
}
C
cc -O2 -o "$DIR/loop" "$DIR/loop.c"
bpf_stats "${STATS:-0}"
"$DIR/loop" "$N" $((2 * P)) >"$DIR/loop.out" &
L=$!
TARGET=$L
if [ "${OTHER:-0}" = 1 ]; then
  sleep 100000 &
  T=$!
  TARGET=$T
fi
sleep 0.2
done_rounds() { wc -l <"$DIR/loop.out"; }
wait_rounds() { while [ "$(done_rounds)" -lt "$1" ]; do sleep 0.05; done; }
echo "$N getppid per round$([ "${OTHER:-0}" = 1 ] && echo ' (the loop untraced, stallscope attached to an idle sleep)'), $(nproc) cores, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg), $BIN"
k=0
for _ in $(seq "$P"); do
  kill -USR1 "$L"; k=$((k + 1)); wait_rounds "$k"
  rm -f "$DIR/s.err"
  "$BIN" attach --backend bpf --pid "$TARGET" --threshold 10s >/dev/null 2>"$DIR/s.err" &
  TRACER=$!
  wait_line "$DIR/s.err" "attached to"
  [ "${STATS:-0}" = 1 ] && progs "$TRACER" >"$DIR/p0"
  kill -USR1 "$L"; k=$((k + 1)); wait_rounds "$k"
  if [ "${STATS:-0}" = 1 ]; then
    progs "$TRACER" >"$DIR/p1"
    # id name type t c, joined: $4 $5 before, $8 $9 after.
    join "$DIR/p0" "$DIR/p1" | awk '$9-$5 > 1000 {printf "  %s: %d runs, %.0f ns/run\n", $2, $9-$5, ($8-$4)/($9-$5)}'
  fi
  stop
done
grep -h "syscall programs" "$DIR/s.err" || true
paste - - <"$DIR/loop.out" | awk -v w="$([ "${OTHER:-0}" = 1 ] && echo 'attached elsewhere' || echo traced)" '{printf "CPU per getppid: untraced %s ns, %s %s ns, +%.0f ns\n", $1, w, $2, $2 - $1}'
