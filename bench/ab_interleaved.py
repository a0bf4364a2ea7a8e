#!/usr/bin/env python3
"""Several builds of stallscope on one trace, interleaved round by round (the order reversed
every other round), so that a slow spell of the VM falls on all of them alike: hyperfine runs
each command's rounds back to back, and on this VM a spell of seconds moved one command's
median by a third. Prints each build's wall and CPU (user + system) time against the first.

    bench/ab_interleaved.py ROUNDS TRACE NAME=BINARY [NAME=BINARY...]
"""
import resource
import statistics
import subprocess
import sys
import time

rounds, trace = int(sys.argv[1]), sys.argv[2]
bins = dict(a.split("=", 1) for a in sys.argv[3:])
wall = {k: [] for k in bins}
cpu = {k: [] for k in bins}
for i in range(rounds):
    for k in list(bins) if i % 2 == 0 else list(reversed(bins)):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s = time.perf_counter()
        subprocess.run([bins[k], "analyze", trace, "--format", "json"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall[k].append(time.perf_counter() - s)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[k].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
first = next(iter(bins))
med = statistics.median
for k in bins:
    print(f"{k}: wall min {min(wall[k]):.3f} med {med(wall[k]):.3f} s, cpu min {min(cpu[k]):.3f} "
          f"med {med(cpu[k]):.3f} s; against {first}: wall med {med(wall[k]) / med(wall[first]):.3f}, "
          f"cpu med {med(cpu[k]) / med(cpu[first]):.3f}, cpu min {min(cpu[k]) / min(cpu[first]):.3f}")
