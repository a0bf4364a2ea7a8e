# What the benchmark scripts share (sourced, never run): a redis-server of their own on a free
# loopback port in a temp dir, stopped at exit together with whatever tracer they started.
#
#   . bench/lib.sh                 (from the repository's root, where the scripts cd to)
#   need TOOL...                   exits 2 naming the first TOOL missing
#   start_redis [REDIS ARGS...]    sets DIR, PORT, RPID; returns once it answers PING
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
  [ -n "${RPID:-}" ] && kill "$RPID" 2>/dev/null || true
  wait 2>/dev/null || true
  [ -n "${DIR:-}" ] && rm -rf "$DIR"
}

start_redis() {
  DIR=$(mktemp -d)
  PORT=$(free_port)
  trap cleanup EXIT
  redis-server --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save "" --appendonly no \
    --logfile "$DIR/redis.log" --daemonize no "$@" >/dev/null 2>&1 &
  RPID=$!
  for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "redis-server did not answer on port $PORT: $(tail -3 "$DIR/redis.log" 2>/dev/null)" >&2
  exit 2
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
