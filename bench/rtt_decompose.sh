#!/usr/bin/env bash
# Where a sequential client's round trip goes, seen by the kernel: a fresh redis on a free
# loopback port, `redis-benchmark -c 1 -t get` against it, and `perf record` of both
# processes' syscalls, scheduler switches/wakeups and `sock:sk_data_ready` for a short window.
# Prints, per request (median over the window), each step from the client's send to its read
# of the reply, and which part redis can see: from its epoll_wait's return (where per-command
# latency started before the arrival stamps), from the request's arrival in its socket (where
# the bpf backend starts it now), and the client's own part on each side.
#   bench/rtt_decompose.sh [SECONDS]   (default 0.3; perf's own cost inflates every step)
# Needs redis-server, redis-benchmark, redis-cli, perf (kernel 6.3+ for sock:sk_data_ready), python3, root.
set -euo pipefail
cd "$(dirname "$0")/.."
WIN=${1:-0.3}
. bench/lib.sh
need redis-server redis-benchmark redis-cli perf python3
BPID=""
on_exit '[ -n "$BPID" ] && kill "$BPID" 2>/dev/null'
start_redis
redis-benchmark -p "$PORT" -t get -n 100000000 -c 1 -q >/dev/null 2>&1 &
BPID=$!
sleep 1
perf record -q -o "$DIR/p.data" -p "$RPID,$BPID" \
  -e 'sched:sched_switch,sched:sched_wakeup,raw_syscalls:sys_enter,raw_syscalls:sys_exit,sock:sk_data_ready' \
  -- sleep "$WIN" >/dev/null 2>&1
B=$BPID
kill "$BPID"; wait "$BPID" 2>/dev/null || true; BPID=""
perf script -i "$DIR/p.data" -F tid,time,event,trace 2>/dev/null >"$DIR/p.txt"
python3 - "$RPID" "$(nproc)" "$DIR/p.txt" "$B" <<'PY'
import re, statistics as st, sys
R = int(sys.argv[1])
ev = []
for l in open(sys.argv[3]):
    m = re.match(r'\s*(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)', l)
    if m:
        ev.append((int(m[1]), float(m[2]) * 1e6, m[3], m[4]))
B = int(sys.argv[4])  # redis-benchmark's (single) thread
SEND, RECV, READ, WRITE, WAIT = 'NR 44 ', 'NR 45 ', 'NR 0 ', 'NR 1 ', 'NR 232 '  # x86_64
rows, cur = [], None
def first(k, t):
    if k not in cur:
        cur[k] = t
for tid, t, e, rest in ev:
    enter, exit_ = e == 'raw_syscalls:sys_enter', e == 'raw_syscalls:sys_exit'
    if tid == B and enter and rest.startswith(SEND):
        cur = {'send': t}
    elif cur is None:
        continue
    elif tid == B and e == 'sock:sk_data_ready' and 'r_write' not in cur:
        first('arrived', t)
    elif tid == B and exit_ and rest.startswith(SEND):
        first('send_ret', t)
    elif tid == R and exit_ and rest.startswith(WAIT) and 'r_read' not in cur:
        first('r_wait_ret', t)
    elif tid == R and enter and rest.startswith(READ):
        first('r_read', t)
    elif tid == R and enter and rest.startswith(WRITE):
        first('r_write', t)
    elif tid == R and e == 'sock:sk_data_ready' and 'r_write' in cur:
        first('reply_arrived', t)
    elif tid == R and exit_ and rest.startswith(WRITE):
        first('r_write_ret', t)
    elif tid == B and exit_ and rest.startswith(WAIT) and 'r_write_ret' in cur:
        first('c_wait_ret', t)
    elif tid == B and exit_ and rest.startswith(RECV) and 'r_write_ret' in cur:
        cur['c_recv_ret'] = t
        rows.append(cur)
        cur = None
keys = ['send', 'arrived', 'send_ret', 'r_wait_ret', 'r_read', 'r_write', 'reply_arrived',
        'r_write_ret', 'c_wait_ret', 'c_recv_ret']
full = [r for r in rows if all(k in r for k in keys)]
med = lambda a, b: st.median(r[b] - r[a] for r in full)
print(f"{len(full)} complete round trips of {len(rows)} ({sys.argv[2]} CPUs); medians in us, perf's cost included")
for a, b in zip(keys, keys[1:]):
    print(f"  {a:>13} -> {b:<13} {med(a, b):6.1f}  (from send {med('send', b):6.1f})")
rtt = med('send', 'c_recv_ret')
for what, a in [("from redis's epoll_wait return", 'r_wait_ret'), ("from the request's arrival", 'arrived')]:
    v = med(a, 'r_write_ret')
    print(f"redis sees {what} to its reply write's return: {v:.1f} of {rtt:.1f} ({v / rtt:.2f})")
print(f"the client's own: send to arrival {med('send', 'arrived'):.1f}, "
      f"redis's write return to the client's read return {med('r_write_ret', 'c_recv_ret'):.1f}")
PY
