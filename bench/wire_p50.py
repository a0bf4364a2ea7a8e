#!/usr/bin/env python3
"""Per-command server latency read off the wire: a reference for the report's p50 that neither
the tracer nor the client measures.

Reads a pcap of loopback traffic to one redis port (`tcpdump -i lo -w FILE tcp port PORT`,
nanosecond or microsecond stamps) and, per connection, pairs each request segment (client to
server, with payload) with the next reply segment (server to client), in order: without
pipelining one request has one reply, and a connection has at most one request in flight:
a request replaces one still unanswered, whose reply the capture lost, so that a lost segment
costs one pair and never shifts the pairs after it. On loopback a segment is stamped once, when its sender's
write hands it to the device, so a pair's span is from the client's send (the request's
arrival, a few microseconds later) to the server's write of the reply: the quantity the
report's per-command latency measures, without the client's own queueing in it.

    bench/wire_p50.py FILE.pcap PORT   ->  one line per command: NAME count p50_us
"""
import statistics
import struct
import sys
from collections import defaultdict


def packets(path):
    with open(path, "rb") as f:
        head = f.read(24)
        magic = struct.unpack("<I", head[:4])[0]
        if magic == 0xA1B2C3D4:
            scale = 1000
        elif magic == 0xA1B23C4D:
            scale = 1
        else:
            raise SystemExit(f"{path}: not a little-endian pcap (magic {magic:#x})")
        link = struct.unpack("<I", head[20:24])[0]
        skip = {1: 14, 113: 16, 276: 20}.get(link)
        if skip is None:
            raise SystemExit(f"{path}: link type {link} not handled")
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            sec, frac, incl, _ = struct.unpack("<IIII", rec)
            data = f.read(incl)
            yield sec * 1_000_000_000 + frac * scale, data[skip:]


def command(payload):
    """The command name of a RESP request's first segment (`*N\\r\\n$L\\r\\nNAME`)."""
    parts = payload.split(b"\r\n", 3)
    if len(parts) >= 3 and parts[0][:1] == b"*" and parts[1][:1] == b"$":
        return parts[2].decode("ascii", "replace").upper()
    return "?"


def main():
    path, port = sys.argv[1], int(sys.argv[2])
    pending = {}  # client port -> (time, command) of its request not yet answered
    spans = defaultdict(list)
    for ts, ip in packets(path):
        if len(ip) < 20 or ip[0] >> 4 != 4:
            continue
        ihl = (ip[0] & 15) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:]
        sport, dport = struct.unpack(">HH", tcp[:4])
        doff = (tcp[12] >> 4) * 4
        plen = total - ihl - doff
        if plen <= 0:
            continue
        payload = tcp[doff:]
        if dport == port:
            pending[sport] = (ts, command(payload))
        elif sport == port and dport in pending:
            t0, name = pending.pop(dport)
            spans[name].append(ts - t0)
    for name, v in sorted(spans.items()):
        print(f"{name} {len(v)} {statistics.median(v) / 1000:.1f}")


if __name__ == "__main__":
    main()
