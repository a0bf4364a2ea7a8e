#!/usr/bin/env python3
"""Checks a `bench/soak.sh` run: every injected stall (a main-thread stall of >= 250 ms of
the injected kinds: a sleep for DEBUG SLEEP, a gap for the EVAL spin) is in the --events log
and in exactly one incident report.

    bench/soak_check.py EVENTS.jsonl INCIDENT_DIR
"""
import json
import os
import sys


def injected(e):
    return (
        e.get("thread") == "main"
        and e.get("duration_s", 0) >= 0.25
        and (
            (e["kind"] == "slow_syscall" and e.get("syscall") in ("clock_nanosleep", "nanosleep"))
            or e["kind"] == "gap"
        )
    )


events, inc_dir = sys.argv[1], sys.argv[2]
seen = [json.loads(l) for l in open(events) if l.strip()]
inj = [e for e in seen if injected(e)]
reports = {}
for f in sorted(os.listdir(inc_dir)):
    if f.endswith(".json"):
        r = json.load(open(os.path.join(inc_dir, f)))
        reports[f] = {s.get("ts_iso") for s in r.get("stalls", [])}
# A stall's time as the live analysis and the incident's fresh analysis print it can differ
# by a microsecond (different origins); match on the time to the millisecond.
def ms(t):
    return t[:23] if t else t

per = []
for e in inj:
    hits = [f for f, ts in reports.items() if any(ms(t) == ms(e["time"]) for t in ts if t)]
    per.append((e["time"], e["kind"], e["duration_s"], hits))
sleeps = sum(1 for e in inj if e["kind"] == "slow_syscall")
gaps = len(inj) - sleeps
one = sum(1 for p in per if len(p[3]) == 1)
print(f"injected stalls seen in --events: {sleeps} sleeps, {gaps} gaps; in exactly one incident report: {one} of {len(per)}")
for t, k, d, hits in per:
    if len(hits) != 1:
        print(f"  {t} {k} {d:.3f}s in {len(hits)} reports: {hits}")
print(f"incident reports: {len(reports)} (the others are the machine's own stalls over 10 ms)")
