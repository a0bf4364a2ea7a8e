#!/usr/bin/env bash
# Where `attach --backend bpf`'s throughput loss goes, in one run on one redis-server (a fresh
# one on a free loopback port in a temp dir), `redis-benchmark -t set -n N -c C` in four cases:
#   untraced  no tracer;
#   filter    the programs loaded and attached, the syscall and receive programs returning
#             right after the process filter (STALLSCOPE_BPF_MEASURE=filter): what running
#             them for every task of the machine costs on its own;
#   discard   the full kernel programs, the ring emptied and its records thrown away
#             (STALLSCOPE_BPF_MEASURE=discard): the kernel side and the ring, without
#             stallscope's decoding and analysis (the ceiling the kernel side allows);
#   full      `attach --backend bpf` as a user runs it.
# Each round runs untraced, filter, discard, full, untraced; each case's ratio is against the
# mean of its round's two untraced runs, and the median round is reported. Per case and round:
# throughput; CPU per request of redis-server (utime+stime of /proc/PID/stat), of
# redis-benchmark (its rusage) and of stallscope (the kernel programs' run time is charged to
# whichever task runs them: mostly redis and redis-benchmark); in discard mode, the records per
# request by kind. Then one more round of the three traced cases with kernel.bpf_stats_enabled=1
# (set for that round only, as it adds two clock reads to every program run, and put back
# after): each BPF program's runs per request and mean run time.
#
#   bench/bpf_decompose.sh [REQUESTS] [CLIENTS] [ROUNDS]    (defaults 200000, 50, 5)
#   BIN=path/to/stallscope bench/bpf_decompose.sh           (default target/release/stallscope)
#   COMPARE=path/to/older/stallscope bench/bpf_decompose.sh
#       then also, with bpf_stats on, ROUNDS alternated `full` runs of BIN and of COMPARE: the
#       per-program run time and the CPU per request of each, in the same run (the VM's speed
#       drifts between runs, so figures of two runs do not compare); COMPARE_ROUNDS=K runs K
#       pairs instead of ROUNDS.
#
# Needs root, redis-server, redis-benchmark, redis-cli, bpftool, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
C=${2:-50}
ROUNDS=${3:-5}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/stallscope}
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli bpftool python3
HZ=$(getconf CLK_TCK)
start_redis

# "rps cpu_ticks" of one redis-benchmark run (its CPU from its rusage, in clock ticks).
bench() {
  python3 - "$PORT" "$N" "$C" "$HZ" <<'PY'
import resource, subprocess, sys
port, n, c, hz = sys.argv[1:5]
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
out = subprocess.run(["redis-benchmark", "-p", port, "-t", "set", "-n", n, "-c", c, "-q", "--csv"],
                     capture_output=True, text=True).stdout
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
rps = next(l.split('"')[3] for l in out.splitlines() if l.startswith('"SET"'))
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(rps, round(cpu * int(hz)))
PY
}

# One case: prints "case round rps bench_ticks redis_ticks tracer_ticks" to $DIR/rows,
# the programs' deltas to $DIR/progs.CASE.ROUND, stallscope's stderr to $DIR/err.CASE.ROUND.
run_case() {
  local case=$1 round=$2 mode=""
  case $case in filter) mode=filter ;; discard) mode=discard ;; esac
  if [ "$case" != untraced ]; then
    rm -f "$DIR/err"
    STALLSCOPE_BPF_MEASURE=$mode "${CASE_BIN:-$BIN}" attach --backend bpf --pid "$RPID" --format json --threshold 1s \
      >"$DIR/out.json" 2>"$DIR/err" &
    TRACER=$!
    wait_line "$DIR/err" "attached to"
    progs "$TRACER" >"$DIR/p0"
  fi
  local s0=0 s1=0
  [ -n "$TRACER" ] && s0=$(ticks "$TRACER")
  local t0 t1 out
  t0=$(ticks "$RPID")
  out=$(bench)
  t1=$(ticks "$RPID")
  if [ -n "$TRACER" ]; then
    s1=$(ticks "$TRACER")
    progs "$TRACER" >"$DIR/p1"
    python3 - "$DIR/p0" "$DIR/p1" >"$DIR/progs.$case.$round" <<'PY'
import sys
def load(p):
    return {l.split()[0]: l.split()[1:] for l in open(p)}
p0, p1 = load(sys.argv[1]), load(sys.argv[2])
for i, (name, _, t, c) in p1.items():
    _, _, t0, c0 = p0.get(i, (name, None, 0, 0))
    print(name, int(t) - int(t0), int(c) - int(c0))
PY
    stop
    cp "$DIR/err" "$DIR/err.$case.$round"
  fi
  echo "$case $round $out $((t1 - t0)) $((s1 - s0))" >>"$DIR/rows"
}

bench >/dev/null # warm up
echo "# bench/bpf_decompose.sh $N $C $ROUNDS: redis-benchmark -t set -n $N -c $C, $(nproc) cores, redis $(redis-server --version | awk '{print $3}' | cut -d= -f2), kernel $(uname -r), load at start $(cut -d' ' -f1-3 /proc/loadavg), $BIN"
: >"$DIR/rows"
for round in $(seq "$ROUNDS"); do
  run_case untraced "$round"
  run_case filter "$round"
  run_case discard "$round"
  run_case full "$round"
  run_case untraced "$round"
done
bpf_stats 1
: >"$DIR/rows.stats"
mv "$DIR/rows" "$DIR/rows.keep"
for case in filter discard full; do run_case "$case" stats; done
mv "$DIR/rows.keep" "$DIR/rows"
if [ -n "${COMPARE:-}" ]; then
  for round in $(seq "${COMPARE_ROUNDS:-$ROUNDS}"); do
    CASE_BIN=$COMPARE run_case full "cmp-old-$round"
    run_case full "cmp-new-$round"
  done
  mv "$DIR/rows" "$DIR/rows.keep"
  grep ' cmp-' "$DIR/rows.keep" >"$DIR/rows.cmp" || true
  grep -v ' cmp-' "$DIR/rows.keep" >"$DIR/rows"
fi
bpf_stats "$STATS_WAS"
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$DIR" "$N" "$HZ" "$ROUNDS" <<'PY'
import os, re, statistics, sys
d, n, hz, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [l.split() for l in open(os.path.join(d, "rows"))]
ns = lambda ticks: ticks * 1e9 / hz / n
by = {}
for case, rnd, rps, bticks, rticks, sticks in rows:
    by.setdefault((case, int(rnd)), []).append((float(rps), int(rticks), int(bticks), int(sticks)))
cases = ["untraced", "filter", "discard", "full"]
med = lambda xs: statistics.median(xs)
print(f"{'case':<9} {'ratio':>6} {'rps':>9} {'redis':>7} {'bench':>7} {'stallsc':>7}   (CPU in ns per request; medians of {rounds} rounds)")
summary = {}
for case in cases:
    ratios, rps, red, ben, st = [], [], [], [], []
    for r in range(1, rounds + 1):
        base = statistics.mean(x[0] for x in by[("untraced", r)])
        for x in by[(case, r)]:
            ratios.append(x[0] / base); rps.append(x[0]); red.append(ns(x[1])); ben.append(ns(x[2]))
            st.append(ns(x[3]))
    summary[case] = med(ratios)
    print(f"{case:<9} {med(ratios):6.3f} {med(rps):9.0f} {med(red):7.0f} {med(ben):7.0f} {med(st):7.0f}" +
          (f"   rounds {' '.join(f'{x:.3f}' for x in ratios)}" if case != "untraced" else ""))
for case in ["filter", "discard", "full"]:
    total = 0
    parts = []
    for l in open(os.path.join(d, f"progs.{case}.stats")):
        name, t, c = l.split()
        t, c = int(t), int(c)
        if c == 0:
            continue
        total += t / n
        parts.append(f"{name} {c / n:.2f} runs/req x {t / c:.0f} ns = {t / n:.0f} ns/req")
    print(f"programs (bpf_stats round), {case}: {total:.0f} ns/req in all: " + "; ".join(parts))
for r in range(1, rounds + 1):
    err = open(os.path.join(d, f"err.discard.{r}")).read()
    m = re.search(r"discarded (\d+) records, (\d+) bytes \(([^)]*)\)", err)
    if m:
        kinds = ", ".join(f"{k} {int(v) / n:.2f}/req" for k, v in re.findall(r"kind (\d+): (\d+)", m.group(3)))
        print(f"records, discard round {r}: {int(m.group(1)) / n:.2f}/req, {int(m.group(2)) / int(m.group(1)):.0f} bytes each ({kinds})")
for r in range(1, rounds + 1):
    err = open(os.path.join(d, f"err.full.{r}")).read()
    m = re.search(r"traced (\d+) syscalls \((\d+) of the main thread \d+\); (\d+) lost", err)
    if m:
        print(f"full round {r}: traced {m.group(1)} syscalls ({m.group(2)} of the main thread), {m.group(3)} lost")
print(f"summary: filter {summary['filter']:.3f}, discard {summary['discard']:.3f}, full {summary['full']:.3f} of untraced")
PY
if [ -n "${COMPARE:-}" ]; then
  python3 - "$DIR" "$N" "$HZ" "${COMPARE_ROUNDS:-$ROUNDS}" "$COMPARE" "$BIN" <<'PY'
import os, statistics, sys
d, n, hz, rounds, old, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
ns = lambda ticks: ticks * 1e9 / hz / n
rows = [l.split() for l in open(os.path.join(d, "rows.cmp"))]
for tag, binary in (("old", old), ("new", new)):
    mine = [r for r in rows if r[1].startswith(f"cmp-{tag}-")]
    red = statistics.median(ns(int(r[4])) for r in mine)
    st = statistics.median(ns(int(r[5])) for r in mine)
    rps = statistics.median(float(r[2]) for r in mine)
    progs, runs = {}, {}
    for r in range(1, rounds + 1):
        for l in open(os.path.join(d, f"progs.full.cmp-{tag}-{r}")):
            name, t, c = l.split()
            progs.setdefault(name.replace("btf_", ""), []).append(int(t) / n)
            runs.setdefault(name.replace("btf_", ""), []).append((int(c) / n, int(t) / max(int(c), 1)))
    total = statistics.median(sum(v[i] for v in progs.values() if len(v) > i) for i in range(rounds))
    parts = ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in sorted(progs.items()) if statistics.median(v) >= 1)
    print(f"compare, full, {tag} ({binary}): programs {total:.0f} ns/req ({parts}); redis CPU {red:.0f} ns/req, stallscope {st:.0f} ns/req, {rps:.0f} rps (load-dependent), medians of {rounds}")
    # Runs per request count every task's syscalls: other processes' (load elsewhere) show
    # as more runs per request, each at the filter's price; ns per run shows the mix.
    print(f"  runs/req x ns/run, medians: " + ", ".join(
        f"{k} {statistics.median(x[0] for x in v):.2f} x {statistics.median(x[1] for x in v):.0f}"
        for k, v in sorted(runs.items()) if statistics.median(x[0] for x in v) >= 0.01))
PY
fi
