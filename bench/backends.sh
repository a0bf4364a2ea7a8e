#!/usr/bin/env bash
# What each way of tracing costs redis, in one run on one redis-server (a fresh one on a free
# loopback port in a temp dir): `redis-benchmark -t set` throughput untraced, under
# `stallscope attach --backend bpf`, `--backend perf`, `--backend ptrace`, `strace -f -T -p`
# and `perf trace -p`.
#
#   bench/backends.sh [REQUESTS] [CLIENTS] [ROUNDS]   (defaults 200000, 50, 3)
#
# The cases are interleaved over ROUNDS rounds so that load from elsewhere on the machine hits
# them alike. Throughput on a small VM drifts a lot from one run to the next, so each round
# measures untraced throughput right before the bpf case and right after the perf case and
# takes their mean as that round's baseline; each ratio is taken within its round and the median round
# is reported, beside the ratio of the totals over all rounds.
# Then a completeness check, untimed: while the perf backend traces one more benchmark run,
# `perf stat` counts read and write entries of the same process; the two counts must be
# equal, and the kernel must have dropped nothing. The same for the bpf backend, which must
# also count every SET as a command and every syscall of the main thread (against perf stat's
# raw_syscalls:sys_enter of that thread); then its per-command p50 against the client's own
# p50 (redis-benchmark -c 1, one request in flight, for GET and SET); then a pipelined load
# (-P 32) that shows whether the ring keeps up, and the same load into a ring too small for
# it, where the loss must be counted in the JSON and said in the table.
# Also what the perf backend's scheduler records (context switches, sched_wakeup, page
# faults) cost in lost records: perf with and without them (STALLSCOPE_PERF_NO_SCHED=1),
# alternated, same redis, same load.
# Needs redis-server, redis-benchmark, redis-cli, strace, perf, python3, root, and a release
# build (cargo build --release; CARGO_TARGET_DIR is honoured).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
C=${2:-50}
ROUNDS=${3:-3}
BIN=${CARGO_TARGET_DIR:-target}/release/stallscope
[ -x "$BIN" ] || { echo "build first: cargo build --release ($BIN missing)" >&2; exit 2; }
. bench/lib.sh
need redis-server redis-benchmark redis-cli strace perf python3
start_redis

ratio() { python3 -c "print(f'{float($1)/float($2):.3f}')"; }
lost_of() { sed -n 's/.*; \([0-9]*\) lost$/\1/p' "$1" | tail -1; }

rps >/dev/null # warm up (allocations, page cache)
echo "redis-benchmark -t set -n $N -c $C on $(nproc) cores, redis $(redis-server --version | awk '{print $3}' | cut -d= -f2), kernel $(uname -r)"
R_BF=(); R_PF=(); R_PT=(); R_ST=(); R_TR=(); SUM_BASE=0; SUM_PF=0; SUM_BF=0
for round in $(seq "$ROUNDS"); do
  BASE1=$(rps)

  rm -f "$DIR/bpf.err"
  "$BIN" attach --backend bpf --pid "$RPID" --format json --threshold 1s >"$DIR/bpf.json" 2>"$DIR/bpf.err" &
  TRACER=$!
  wait_line "$DIR/bpf.err" "attached to"
  BF=$(rps)
  stop
  BF_SETS=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sum(c['calls'] for c in r.get('commands',[]) if c['command']=='SET' and c['phase']=='all'))" "$DIR/bpf.json")

  rm -f "$DIR/perf.err" # wait_line must not see the previous round's line
  "$BIN" attach --backend perf --pid "$RPID" --format json --threshold 1s >"$DIR/perf.json" 2>"$DIR/perf.err" &
  TRACER=$!
  wait_line "$DIR/perf.err" "attached to"
  PF=$(rps)
  stop
  BASE2=$(rps)
  BASE=$(python3 -c "print(f'{($BASE1 + $BASE2) / 2:.2f}')")
  SUM_BASE=$(python3 -c "print($SUM_BASE + $BASE)"); SUM_PF=$(python3 -c "print($SUM_PF + $PF)")
  SUM_BF=$(python3 -c "print($SUM_BF + $BF)")

  "$BIN" attach --backend ptrace --pid "$RPID" --format json --threshold 1s >"$DIR/ptrace.json" 2>"$DIR/ptrace.err" &
  TRACER=$!
  wait_ptraced
  PT=$(rps)
  stop
  wait_untraced

  strace -f -T -p "$RPID" -o /dev/null 2>/dev/null &
  TRACER=$!
  wait_ptraced
  ST=$(rps)
  stop
  wait_untraced

  perf trace -p "$RPID" -o /dev/null 2>"$DIR/ptrace-perf.err" &
  TRACER=$!
  sleep 1 # perf trace has no "ready" message; it needs a moment to open its events
  TR=$(rps)
  stop

  R_BF+=("$(ratio "$BF" "$BASE")")
  R_PF+=("$(ratio "$PF" "$BASE")"); R_PT+=("$(ratio "$PT" "$BASE")")
  R_ST+=("$(ratio "$ST" "$BASE")"); R_TR+=("$(ratio "$TR" "$BASE")")
  printf 'round %d: --backend bpf %9s (%s, %s lost, %s of %s SETs counted)\n' \
    "$round" "$BF" "${R_BF[-1]}" "$(lost_of "$DIR/bpf.err")" "$BF_SETS" "$N"
  printf 'round %d: untraced %9s rps (%s, %s) | --backend perf %9s (%s, %s lost) | --backend ptrace %9s (%s) | strace -f -T %9s (%s) | perf trace %9s (%s)\n' \
    "$round" "$BASE" "$BASE1" "$BASE2" "$PF" "${R_PF[-1]}" "$(lost_of "$DIR/perf.err")" "$PT" "${R_PT[-1]}" "$ST" "${R_ST[-1]}" "$TR" "${R_TR[-1]}"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "perf backend, total over all rounds: $(ratio "$SUM_PF" "$SUM_BASE") of untraced"
echo "bpf backend, total over all rounds: $(ratio "$SUM_BF" "$SUM_BASE") of untraced"
echo "median ratio to untraced (rounds above; each ratio against its own round's untraced mean): stallscope --backend bpf $(median "${R_BF[@]}"), --backend perf $(median "${R_PF[@]}"), --backend ptrace $(median "${R_PT[@]}"), strace -f -T -p $(median "${R_ST[@]}"), perf trace -p $(median "${R_TR[@]}")"

# The perf backend with and without its scheduler records, alternated: lost records and
# throughput of each run.
SUM_NS=0; SUM_S=0
for round in 1 2 3; do
  for mode in 1 0; do
    rm -f "$DIR/perf.err"
    STALLSCOPE_PERF_NO_SCHED=$mode "$BIN" attach --backend perf --pid "$RPID" --format json --threshold 1s >"$DIR/perf.json" 2>"$DIR/perf.err" &
    TRACER=$!
    wait_line "$DIR/perf.err" "attached to"
    R=$(rps)
    stop
    L=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['lost_events'])" "$DIR/perf.json")
    if [ "$mode" = 1 ]; then W=without; SUM_NS=$((SUM_NS + L)); else W=with; SUM_S=$((SUM_S + L)); fi
    printf 'perf %s scheduler records, run %d: %9s rps, %s lost\n' "$W" "$round" "$R" "$L"
  done
done
echo "perf lost records over 3 runs each: without scheduler records $SUM_NS, with $SUM_S"

# Completeness: perf stat counts every read/write entry of redis over a window that holds
# stallscope's. Outside the benchmark redis is idle: it writes nothing, but its cron reads
# /proc/self/stat about ten times a second, so perf stat may count a few more reads.
perf stat -x, -e syscalls:sys_enter_read,syscalls:sys_enter_write -p "$RPID" -o "$DIR/stat.csv" &
STAT=$!
sleep 0.5
rm -f "$DIR/perf.err"
"$BIN" attach --backend perf --pid "$RPID" --format json --threshold 1s >"$DIR/perf.json" 2>"$DIR/perf.err" &
TRACER=$!
wait_line "$DIR/perf.err" "attached to"
rps >/dev/null
stop
sleep 0.2
kill -INT "$STAT"; wait "$STAT" || true
python3 - "$DIR/perf.json" "$DIR/stat.csv" "$DIR/perf.err" <<'EOF'
import json, sys, re
r = json.load(open(sys.argv[1]))
calls = {s["name"]: s["calls"] for s in r.get("syscalls", [])}
stat = {}
for line in open(sys.argv[2]):
    f = line.strip().split(",")
    if len(f) > 2 and f[2].startswith("syscalls:sys_enter_"):
        stat[f[2].split("_")[-1]] = int(f[0]) if f[0].isdigit() else 0
err = open(sys.argv[3]).read()
m = re.search(r"traced (\d+) syscalls \((\d+) of the main thread \d+\); (\d+) lost", err)
print(f"completeness: read  stallscope {calls.get('read', 0)} vs perf stat {stat.get('read')}; "
      f"write stallscope {calls.get('write', 0)} vs perf stat {stat.get('write')}; "
      f"lost {r['summary']['lost_events']}; main thread {m.group(2) if m else '?'} of {m.group(1) if m else '?'} syscalls")
rd, wr = calls.get("read", 0), calls.get("write", 0)
ok = wr == stat.get("write") and 0 <= (stat.get("read") or 0) - rd <= 30 and r["summary"]["lost_events"] == 0
print("completeness:", "every write captured, reads up to redis's idle /proc reads outside stallscope's window, nothing lost"
      if ok else "MISMATCH")
EOF

# The same completeness check for the bpf backend, plus every syscall of the main thread
# (raw_syscalls:sys_enter of that one thread) and every SET counted as a command.
perf stat -x, -e syscalls:sys_enter_read,syscalls:sys_enter_write -p "$RPID" -o "$DIR/stat.csv" &
STAT=$!
perf stat -x, -e raw_syscalls:sys_enter -t "$RPID" -o "$DIR/stat-main.csv" &
STAT_MAIN=$!
sleep 0.5
rm -f "$DIR/bpf.err"
"$BIN" attach --backend bpf --pid "$RPID" --format json --threshold 1s >"$DIR/bpf.json" 2>"$DIR/bpf.err" &
TRACER=$!
wait_line "$DIR/bpf.err" "attached to"
rps >/dev/null
stop
sleep 0.2
kill -INT "$STAT" "$STAT_MAIN"; wait "$STAT" "$STAT_MAIN" || true
python3 - "$DIR/bpf.json" "$DIR/stat.csv" "$DIR/bpf.err" "$DIR/stat-main.csv" "$N" <<'PY'
import json, sys, re
r = json.load(open(sys.argv[1]))
calls = {s["name"]: s["calls"] for s in r.get("syscalls", [])}
stat = {}
for line in open(sys.argv[2]):
    f = line.strip().split(",")
    if len(f) > 2 and f[2].startswith("syscalls:sys_enter_"):
        stat[f[2].split("_")[-1]] = int(f[0]) if f[0].isdigit() else 0
main_stat = None
for line in open(sys.argv[4]):
    f = line.strip().split(",")
    if len(f) > 2 and f[2] == "raw_syscalls:sys_enter" and f[0].isdigit():
        main_stat = int(f[0])
err = open(sys.argv[3]).read()
m = re.search(r"traced (\d+) syscalls \((\d+) of the main thread \d+\); (\d+) lost", err)
main = int(m.group(2)) if m else -1
sets = sum(c["calls"] for c in r.get("commands", []) if c["command"] == "SET" and c["phase"] == "all")
print(f"bpf completeness: read  stallscope {calls.get('read', 0)} vs perf stat {stat.get('read')}; "
      f"write stallscope {calls.get('write', 0)} vs perf stat {stat.get('write')}; "
      f"main thread stallscope {main} vs perf stat {main_stat}; SET commands {sets} of {sys.argv[5]}; "
      f"lost {r['summary']['lost_events']}")
rd, wr = calls.get("read", 0), calls.get("write", 0)
# Outside stallscope's window redis's cron makes 4 calls per 100 ms (open, read, close of
# /proc/self/stat, epoll_wait): perf stat's window is longer by about a second.
ok = (wr == stat.get("write") and 0 <= (stat.get("read") or 0) - rd <= 30
      and main_stat is not None and 0 <= main_stat - main <= 120
      and sets == int(sys.argv[5]) and r["summary"]["lost_events"] == 0)
print("bpf completeness:", "every write and SET captured, main-thread calls and reads up to redis's idle cron outside stallscope's window, nothing lost"
      if ok else "MISMATCH")
PY

# Per-command latency seen by stallscope (bpf) against the client's own, one request in
# flight at a time so that the client's round trip is the request's latency.
rm -f "$DIR/bpf.err"
"$BIN" attach --backend bpf --pid "$RPID" --format json --threshold 1s >"$DIR/bpf.json" 2>"$DIR/bpf.err" &
TRACER=$!
wait_line "$DIR/bpf.err" "attached to"
redis-benchmark -p "$PORT" -t set,get -n 20000 -c 1 --csv 2>/dev/null >"$DIR/c1.csv"
stop
python3 - "$DIR/bpf.json" "$DIR/c1.csv" <<'PY'
import json, sys, csv
r = json.load(open(sys.argv[1]))
ours = {c["command"]: c for c in r.get("commands", []) if c["phase"] == "all"}
rows = list(csv.reader(open(sys.argv[2])))
head = rows[0]
for row in rows[1:]:
    test, p50_ms = row[0], float(row[head.index("p50_latency_ms")])
    c = ours.get(test)
    if not c:
        print(f"per-command p50 {test}: not in the report")
        continue
    ratio = c['p50_us'] / (p50_ms * 1000)
    print(f"per-command p50 {test}: stallscope {c['p50_us']} us ({c['calls']} calls, {c.get('from_arrival', 0)} timed from their arrival) "
          f"vs client {p50_ms * 1000:.0f} us: {ratio:.2f} of the client's ({'within' if abs(1 - ratio) <= 0.25 else 'NOT within'} 25%)")
print("per-command latency starts at:", r["summary"].get("command_start", "(not said)"))
PY

# Pipelined: 32 requests per round trip, several times the syscall records per second.
rm -f "$DIR/bpf.err"
"$BIN" attach --backend bpf --pid "$RPID" --format json --threshold 1s >"$DIR/bpf.json" 2>"$DIR/bpf.err" &
TRACER=$!
wait_line "$DIR/bpf.err" "attached to"
P32=$(redis-benchmark -p "$PORT" -t set -n "$((N * 5))" -c "$C" -P 32 -q --csv 2>/dev/null | awk -F'"' '/^"SET"/ {print $4}')
stop
python3 - "$DIR/bpf.json" "$P32" "$((N * 5))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
sets = sum(c["calls"] for c in r.get("commands", []) if c["command"] == "SET" and c["phase"] == "all")
# A read of 32 pipelined requests has its first 64 bytes copied: one command name per read.
print(f"pipelined -P 32 under bpf: {float(sys.argv[2]):.0f} rps, lost {r['summary']['lost_events']}, "
      f"{sets} of {sys.argv[3]} SETs named (one per read: 64 bytes of each read are copied); "
      f"overhead warning: {(r.get('overhead') or {}).get('warning')}")
PY

# The same load into a ring far too small for it (8 pages, 32 KiB): the loss is counted in
# the JSON, and the table says so.
for fmt in json table; do
  rm -f "$DIR/bpf.err"
  "$BIN" attach --backend bpf --pid "$RPID" --format "$fmt" --color never --threshold 1ms --perf-pages 8 >"$DIR/small.$fmt" 2>"$DIR/bpf.err" &
  TRACER=$!
  wait_line "$DIR/bpf.err" "attached to"
  redis-benchmark -p "$PORT" -t set -n "$((N * 5))" -c "$C" -P 32 -q --csv >/dev/null 2>&1
  stop
done
python3 - "$DIR/small.json" "$DIR/small.table" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
lost = r["summary"]["lost_events"]
marked = sum(1 for s in r.get("stalls", []) if s.get("events_lost"))
said = "events were lost" in open(sys.argv[2]).read()
print(f"pipelined -P 32 under bpf, 8-page ring: lost {lost} (JSON), {marked} stalls marked events_lost, "
      f"table says so: {said}; warning: {(r.get('overhead') or {}).get('warning')}")
print("loss accounting:", "counted and reported" if lost > 0 and said else "NOT SHOWN")
PY
