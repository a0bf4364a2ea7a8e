#!/usr/bin/env bash
# Issue 40's figure: per-command p50 for GET and SET with I/O threads against without them.
# For each server (redis 7: `--io-threads 2 --io-threads-do-reads yes`; valkey 9: `--io-threads
# 2 --io-threads-always-active yes`, valkey switching them on only under more load than this
# host gives it untraced), two servers side by side, one with I/O threads and one without,
# attached in turn (A B A B ... over ROUNDS rounds, so that the machine's load hits both alike)
# with `stallscope attach --backend bpf`, under `redis-benchmark -t set,get -n N -c C --csv`.
# Each run's ratio is the report's p50 (commands[].p50_us) over the client's own p50 (its CSV);
# the summary gives each case's median ratio over the rounds, and the with/without quotient
# of the medians (the issue asks for it within 25%: 0.75-1.25).
# With WIRE=1 (the default; needs tcpdump) each run is also held to the loopback wire
# (`bench/wire_p50.py`: a request segment to the server's next reply segment on its
# connection, the span the report times, without the client's own queueing in it): the
# report's p50 over the wire's, and the same with/without quotient of those (`WIRE` lines).
# With fewer than 2 clients in flight per I/O thread redis 7 does the I/O itself (its
# stopThreadedIOIfNeeded), so C must stay well above that; each I/O-thread run says how many
# reads the I/O threads did (INFO stats io_threaded_reads_processed, grown over the run).
#
#   bench/p50_iothreads.sh BINARY [N] [C] [ROUNDS] [SERVERS]  (defaults 50000, 50, 5, "redis valkey")
#
# Needs root (bpf), redis-server, redis-benchmark, redis-cli, python3, and valkey-server for
# valkey (scripts/test-deps.sh installs it).
set -euo pipefail
BIN=$(realpath "$1")
N=${2:-50000}
C=${3:-50}
ROUNDS=${4:-5}
SERVERS=${5:-redis valkey}
WIRE=${WIRE:-1}
HERE=$(dirname "$(realpath "$0")")
cd "$HERE/.."
. bench/lib.sh
need redis-benchmark redis-cli python3
in_temp_dir

threaded_reads() { redis-cli -p "$1" info stats | tr -d '\r' | awk -F: '/^io_threaded_reads_processed:/ {print $2}'; }

# run CASE PORT PID: one attached benchmark, one line per command.
run() {
  local case=$1 port=$2 pid=$3 before after
  before=$(threaded_reads "$port")
  rm -f "$DIR/r.err" # wait_line must not see the previous run's line
  "$BIN" attach --backend bpf --pid "$pid" --format json --threshold 1s >"$DIR/r.json" 2>"$DIR/r.err" &
  TRACER=$!
  wait_line "$DIR/r.err" "attached to"
  local w=""
  if [ "$WIRE" = 1 ]; then
    tcpdump -i lo -s 160 -B 65536 --immediate-mode --time-stamp-precision=nano -w "$DIR/w.pcap" "tcp port $port" 2>"$DIR/w.err" &
    w=$!
    for _ in $(seq 200); do grep -q "listening on" "$DIR/w.err" && break; sleep 0.05; done
  fi
  redis-benchmark -p "$port" -t set,get -n "$N" -c "$C" --csv 2>/dev/null >"$DIR/c.csv"
  stop
  : >"$DIR/wire.txt"
  if [ -n "$w" ]; then
    kill -INT "$w"; wait "$w" || true
    python3 "$HERE/wire_p50.py" "$DIR/w.pcap" "$port" >"$DIR/wire.txt"
    awk '/dropped by kernel/ {print "DROPS", $1}' "$DIR/w.err" >>"$DIR/wire.txt"
    rm -f "$DIR/w.pcap"
  fi
  after=$(threaded_reads "$port")
  python3 - "$case" "$DIR/r.json" "$DIR/c.csv" "$((after - before))" "$DIR/wire.txt" <<'PY' | tee -a "$DIR/all.txt"
import csv, json, sys
case, rep, cli, threaded = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
wire = {l.split()[0]: l.split()[1:] for l in open(sys.argv[5]) if l.strip()}
ours = {c["command"]: c for c in rep.get("commands", []) if c["phase"] == "all"}
rows = list(csv.reader(open(cli)))
head = rows[0]
for row in rows[1:]:
    cmd = row[0]
    p50 = float(row[head.index("p50_latency_ms")]) * 1000
    rps = float(row[head.index("rps")])
    c = ours.get(cmd, {})
    ratio = c["p50_us"] / p50 if c.get("p50_us") else float("nan")
    extra = ""
    if cmd in wire:
        n, wp50 = int(wire[cmd][0]), float(wire[cmd][1])
        wr = c["p50_us"] / wp50 if c.get("p50_us") and wp50 else float("nan")
        extra = f" wire_p50_us={wp50:.0f} wire_ratio={wr:.3f} wire_pairs={n} wire_drops={wire.get('DROPS', ['0'])[0]}"
    print(f"RUN {case} {cmd} report_p50_us={c.get('p50_us')} client_p50_us={p50:.0f} ratio={ratio:.3f} "
          f"calls={c.get('calls')} from_arrival={c.get('from_arrival')} rps={rps:.0f} "
          f"io_threaded_reads={threaded} lost={rep['summary']['lost_events']}{extra}")
PY
}

echo "# $(date -u '+%Y-%m-%d %H:%M:%S') UTC, $(uptime)"
echo "# binary $BIN ($("$BIN" --version 2>/dev/null || true)), N=$N C=$C ROUNDS=$ROUNDS, $(nproc) CPUs"
for s in $SERVERS; do
  case $s in
    redis) sbin=redis-server; io=(--io-threads 2 --io-threads-do-reads yes) ;;
    valkey) sbin=valkey-server; io=(--io-threads 2 --io-threads-always-active yes) ;;
    *) echo "unknown server $s" >&2; exit 2 ;;
  esac
  need "$sbin"
  echo "# $s: $("$sbin" --version)"
  launch "$sbin" "$s-plain"; PPORT=$PORT; PPID_=$SPID
  launch "$sbin" "$s-io" "${io[@]}"; IPORT=$PORT; IPID=$SPID
  for r in $(seq "$ROUNDS"); do
    # The order flips each round: neither case always runs first.
    if [ $((r % 2)) = 1 ]; then
      run "$s-io" "$IPORT" "$IPID"; run "$s-plain" "$PPORT" "$PPID_"
    else
      run "$s-plain" "$PPORT" "$PPID_"; run "$s-io" "$IPORT" "$IPID"
    fi
  done
  stop_server "$PPID_"; stop_server "$IPID"
done
python3 - "$DIR/all.txt" <<'PY'
import statistics, sys
runs = {}
for l in open(sys.argv[1]):
    if not l.startswith("RUN "):
        continue
    f = l.split()
    kv = dict(x.split("=", 1) for x in f[3:])
    runs.setdefault((f[1], f[2]), []).append(kv)
print("# medians over the rounds (report p50 / client p50)")
for (case, cmd), v in sorted(runs.items()):
    med = lambda k: statistics.median(float(x[k]) for x in v)
    print(f"MEDIAN {case} {cmd}: ratio {med('ratio'):.3f} (report {med('report_p50_us'):.0f} us, "
          f"client {med('client_p50_us'):.0f} us, {med('rps'):.0f} req/s"
          + (f", wire {med('wire_p50_us'):.0f} us, report/wire {med('wire_ratio'):.3f}" if all("wire_ratio" in x for x in v) else "")
          + f") over {len(v)} runs")
for case in sorted({c.rsplit('-', 1)[0] for c, _ in runs}):
    for cmd in ("SET", "GET"):
        io, plain = runs.get((f"{case}-io", cmd)), runs.get((f"{case}-plain", cmd))
        if not io or not plain:
            continue
        a = statistics.median(float(x["ratio"]) for x in io)
        b = statistics.median(float(x["ratio"]) for x in plain)
        q = a / b
        print(f"FIGURE {case} {cmd}: with I/O threads {a:.3f}, without {b:.3f}: "
              f"quotient {q:.3f} ({'within' if 0.75 <= q <= 1.25 else 'NOT within'} 25%)")
        if all("wire_ratio" in x for x in io + plain):
            a = statistics.median(float(x["wire_ratio"]) for x in io)
            b = statistics.median(float(x["wire_ratio"]) for x in plain)
            q = a / b
            print(f"WIRE {case} {cmd}: report p50 / wire p50 with I/O threads {a:.3f}, without {b:.3f}: "
                  f"quotient {q:.3f} ({'within' if 0.75 <= q <= 1.25 else 'NOT within'} 25%)")
PY
