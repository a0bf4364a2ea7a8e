# What the benchmark scripts share (sourced, never run): a redis-server of their own on a free
# loopback port in a temp dir, stopped at exit together with whatever tracer they started.
#
#   . bench/lib.sh                 (from the repository's root, where the scripts cd to)
#   need TOOL...                   exits 2 naming the first TOOL missing
#   start_redis [REDIS ARGS...]    sets DIR, PORT, RPID; returns once it answers PING
#   in_temp_dir                    sets DIR (removed at exit) for scripts that run several servers
#   launch BINARY SUBDIR [ARGS...] one more server (redis-server, valkey-server, a build of
#                                  redis 8) in $DIR/SUBDIR; sets PORT, SPID; stopped at exit
#   stop_server PID                stops one now
#   on_exit 'COMMAND'              one more step for the exit's cleanup (before the server stops)
#   TRACER=$!                      a tracer to kill at exit
#   stop [SIGNAL]                  ends $TRACER (SIGINT unless named), its exit status in STATUS
#   tracer_pid, wait_ptraced, wait_untraced, wait_line FILE TEXT [TRIES], rps (needs N and C)
#   cpu_ns PID, ticks PID, vm_kb PID FIELD   a process's CPU (ns, clock ticks), its VmRSS or VmHWM
#   metric NAME                    a watcher's metric on $MPORT, summed over its label sets
#   steady_load                    redis-benchmark SET/GET from 4 clients, looping, as $LOAD
#   bpf_stats 0|1, progs PID       kernel.bpf_stats_enabled (put back at exit); a tracer's programs
#
# Each script stays runnable alone: this file only holds what several of them repeated.

need() {
  for t in "$@"; do
    command -v "$t" >/dev/null || { echo "$t is required" >&2; exit 2; }
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

TRACER=""
EXIT_STEPS=()
on_exit() { EXIT_STEPS+=("$1"); }

# The steps run before the wait for the children: one may stop a child (a load generator).
cleanup() {
  [ -n "$TRACER" ] && kill "$TRACER" 2>/dev/null || true
  local s
  for s in "${EXIT_STEPS[@]}"; do eval "$s" || true; done
  local p
  for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${DIR:-}" ] && rm -rf "$DIR"
}

SERVER_PIDS=()

in_temp_dir() {
  DIR=$(mktemp -d)
  trap cleanup EXIT
}

launch() {
  local bin=$1 sdir=$DIR/$2
  shift 2
  mkdir -p "$sdir"
  PORT=$(free_port)
  "$bin" --port "$PORT" --bind 127.0.0.1 --dir "$sdir" --save "" --appendonly no \
    --logfile "$sdir/server.log" --daemonize no "$@" >/dev/null 2>&1 &
  SPID=$!
  SERVER_PIDS+=("$SPID")
  for _ in $(seq 200); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "$bin did not answer on port $PORT: $(tail -3 "$sdir/server.log" 2>/dev/null)" >&2
  exit 2
}

stop_server() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

start_redis() {
  in_temp_dir
  launch redis-server . "$@"
  RPID=$SPID
}

tracer_pid() { awk '/^TracerPid:/ {print $2}' /proc/"$RPID"/status; }
wait_ptraced() {
  for _ in $(seq 200); do [ "$(tracer_pid)" != 0 ] && return 0; sleep 0.05; done
  echo "the tracer did not attach" >&2; exit 2
}
wait_untraced() {
  for _ in $(seq 200); do [ "$(tracer_pid)" = 0 ] && return 0; sleep 0.05; done
  echo "the tracer did not detach" >&2; exit 2
}
# stallscope prints "attached to" once every thread is traced ("watching PID" for watch).
wait_line() {
  for _ in $(seq "${3:-400}"); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "no '$2' in $1: $(cat "$1")" >&2; exit 2
}
# Some scripts report how the tracer ended: its exit status is left in STATUS.
stop() { kill -"${1:-INT}" "$TRACER"; STATUS=0; wait "$TRACER" || STATUS=$?; TRACER=""; }
# SET requests per second of one `redis-benchmark -n $N -c $C` ("SET","123456.79",... -> 123456.79).
rps() {
  redis-benchmark -p "$PORT" -t set -n "$N" -c "$C" -q --csv 2>/dev/null | awk -F'"' '/^"SET"/ {print $4}'
}

# CPU time rather than throughput: other load on a shared machine takes the CPU away from a
# process, it does not add to its work, so these move much less than requests per second.
# On-CPU ns of all PID's threads (schedstat); a thread that ends meanwhile is skipped.
cpu_ns() {
  local s=0 v f
  for f in /proc/"$1"/task/*/schedstat; do
    read -r v _ <"$f" 2>/dev/null || continue
    s=$((s + v))
  done
  echo "$s"
}
ticks() { awk '{print $14 + $15}' /proc/"$1"/stat; }
vm_kb() { awk -v f="$2:" '$1 == f {print $2}' /proc/"$1"/status; }

# Per-instance metrics carry an `instance` label: summed over the label sets, 0 when absent.
metric() {
  curl -s "http://127.0.0.1:$MPORT/metrics" |
    awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'
}

# A load for however long a run lasts (-n only bounds one redis-benchmark), stopped at exit.
steady_load() {
  ( while true; do redis-benchmark -p "$PORT" -t set,get -n 2000000 -c 4 -r 100000 -q >/dev/null 2>&1 || sleep 1; done ) &
  LOAD=$!
  on_exit '[ -n "$LOAD" ] && kill "$LOAD" 2>/dev/null'
}

# The programs' run time and count cost a clock read per run: on only where a script reports
# them, and the setting found is put back at exit.
bpf_stats() {
  if [ -z "${STATS_WAS:-}" ]; then
    STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
    on_exit 'sysctl -qw kernel.bpf_stats_enabled="$STATS_WAS"'
  fi
  sysctl -qw kernel.bpf_stats_enabled="$1"
}
# "id name type run_time_ns run_cnt" of the programs stallscope holds (their ids from the
# fdinfo of its bpf fds: bpftool's own pid column needs a bpftool built with skeletons). An
# fd stallscope closes between the glob and grep holds no program: grep's complaint is moot.
progs() {
  local ids
  ids=$({ grep -h '^prog_id:' /proc/"$1"/fdinfo/* 2>/dev/null || true; } | awk '{print $2}' | sort -u | tr '\n' ' ')
  bpftool -j prog show | python3 -c '
import json, sys
ids = set(int(x) for x in sys.argv[1].split())
for p in json.load(sys.stdin):
    if p["id"] in ids:
        print(p["id"], p.get("name", "?"), p.get("type", "?"), p.get("run_time_ns", 0), p.get("run_cnt", 0))
' "$ids"
}
