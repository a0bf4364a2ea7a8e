#!/usr/bin/env python3
"""A long `perf trace` text for timing the perf parser: a real capture (default
fixtures/perf-captures/redis-always-p-T.perf.txt.gz: `perf trace -p` of redis under
appendfsync always, with entry-only and `[continued]` lines) repeated with its times shifted,
so every copy follows the one before on the same clock.

    bench/gen_perf_trace.py LINES [CAPTURE] > trace.txt
"""
import gzip
import re
import sys

want = int(sys.argv[1])
src = sys.argv[2] if len(sys.argv) > 2 else "fixtures/perf-captures/redis-always-p-T.perf.txt.gz"
lines = gzip.open(src, "rt").read().splitlines()
stamp = re.compile(r"^(\s*)(\d+\.\d+)")
times = [float(m.group(2)) for m in map(stamp.match, lines) if m]
span = max(times) - min(times) + 1.0
out, shift = sys.stdout, 0.0
written = 0
while written < want:
    for line in lines:
        m = stamp.match(line)
        if m:
            line = f"{m.group(1)}{float(m.group(2)) + shift:.3f}{line[m.end():]}"
        out.write(line + "\n")
        written += 1
        if written >= want:
            break
    shift += span
