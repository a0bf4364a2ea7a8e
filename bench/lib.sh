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
#   TRACER=$!                      a tracer to kill at exit; `stop` ends it with SIGINT
#   tracer_pid, wait_ptraced, wait_untraced, wait_line FILE TEXT, rps (needs N and C)
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
# stallscope prints "attached to" once every thread is traced.
wait_line() {
  for _ in $(seq 400); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "no '$2' in $1: $(cat "$1")" >&2; exit 2
}
stop() { kill -INT "$TRACER"; wait "$TRACER" || true; TRACER=""; }
# SET requests per second of one `redis-benchmark -n $N -c $C` ("SET","123456.79",... -> 123456.79).
rps() {
  redis-benchmark -p "$PORT" -t set -n "$N" -c "$C" -q --csv 2>/dev/null | awk -F'"' '/^"SET"/ {print $4}'
}
