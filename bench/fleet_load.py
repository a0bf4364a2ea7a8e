#!/usr/bin/env python3
"""A fixed-rate load on one redis: RATE commands a second (SET and GET in turn, in
pipelines of PIPE), for DURATION seconds, from one connection. The same load on every
instance is what bench/watch_fleet.sh compares 1, 4 and 8 instances with. Prints the
commands sent and how far behind its schedule it ended (a client starved of CPU).

    fleet_load.py PORT RATE DURATION [PIPE]
"""
import socket
import sys
import time


def main():
    port, rate, dur = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    pipe = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    period = pipe / rate
    start = time.monotonic()
    n = 0
    k = 0
    while time.monotonic() - start < dur:
        cmds = []
        for _ in range(pipe):
            key = b"k%d" % (k % 10000)
            if k % 2:
                cmds.append(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key))
            else:
                cmds.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$5\r\nvalue\r\n" % (len(key), key))
            k += 1
        s.sendall(b"".join(cmds))
        want = pipe
        buf = b""
        while want > 0:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("connection closed")
            buf += chunk
            # Replies are +OK, $-1, or $5 value: count complete lines that start a reply.
            lines = buf.split(b"\r\n")
            buf = lines.pop()
            for ln in lines:
                if ln[:1] in (b"+", b"-", b":") or ln == b"$-1" or ln[:1] == b"$":
                    want -= 1
        n += pipe
        next_at = start + (n / rate)
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    behind = (time.monotonic() - start) - n / rate
    print(f"{n} {behind:.3f}")


if __name__ == "__main__":
    main()
