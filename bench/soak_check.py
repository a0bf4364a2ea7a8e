#!/usr/bin/env python3
"""Checks a `bench/soak.sh` run: every injected stall is in the --events log and in exactly
one incident report.

    bench/soak_check.py EVENTS.jsonl INCIDENT_DIR [INJECTED.txt]

With INJECTED.txt (one line per injection: the time it was sent, the time it was answered,
`sleep` or `spin`), each injection is found by that window: the main thread's stalls of its
kind (a clock_nanosleep for DEBUG SLEEP, gaps for the EVAL spin) that overlap it. A spin can
come as more than one gap: redis's main thread makes a syscall of its own during the script
now and then (a futex wake of jemalloc's background thread, for one), and a gap ends at any
syscall. The injection is counted when its pieces add up to >= 250 ms, and reported when
every piece is in the same one report. Without it (older runs), the injected stalls are the
main thread's stalls of those kinds of >= 250 ms, which misses a split spin.
"""
import datetime
import json
import os
import sys


def kind_of(e):
    if e.get("thread") != "main":
        return None
    if e["kind"] == "slow_syscall" and e.get("syscall") in ("clock_nanosleep", "nanosleep"):
        return "sleep"
    if e["kind"] == "gap":
        return "spin"
    return None


def t(s):
    return datetime.datetime.fromisoformat(s).timestamp()


# A stall's time as the live analysis and the incident's fresh analysis print it can differ
# by a microsecond (different origins); match on the time to the millisecond.
def ms(x):
    return x[:23] if x else x


events, inc_dir = sys.argv[1], sys.argv[2]
seen = [json.loads(l) for l in open(events) if l.strip()]
reports = {}
for f in sorted(os.listdir(inc_dir)):
    if f.endswith(".json"):
        r = json.load(open(os.path.join(inc_dir, f)))
        reports[f] = {ms(s.get("ts_iso")) for s in r.get("stalls", []) if s.get("ts_iso")}


def reports_of(pieces):
    return sorted({f for f, ts in reports.items() for p in pieces if ms(p["time"]) in ts})


if len(sys.argv) > 3:
    inj = [l.split() for l in open(sys.argv[3]) if len(l.split()) == 3]
    counted = one = 0
    bad = []
    for sent, answered, kind in inj:
        a, b = t(sent) - 0.05, t(answered) + 0.05
        pieces = [
            e
            for e in seen
            if kind_of(e) == kind and t(e["time"]) < b and t(e["time"]) + e["duration_s"] > a
        ]
        total = sum(e["duration_s"] for e in pieces)
        hits = reports_of(pieces)
        # In one report: every piece in it, and no piece in another.
        whole = len(hits) == 1 and all(
            ms(p["time"]) in reports[hits[0]] for p in pieces
        )
        counted += total >= 0.25
        one += total >= 0.25 and whole
        if total < 0.25 or not whole or len(pieces) > 1:
            bad.append((sent, kind, [round(p["duration_s"], 3) for p in pieces], hits))
    sleeps = sum(1 for x in inj if x[2] == "sleep")
    print(
        f"injected: {len(inj)} ({sleeps} DEBUG SLEEP, {len(inj) - sleeps} EVAL spins); counted in --events "
        f"(main-thread stalls of their kind over their window adding up to >= 250 ms): {counted}; "
        f"in exactly one incident report: {one}"
    )
    for sent, kind, durs, hits in bad:
        print(f"  {sent} {kind}: pieces {durs} s in {len(hits)} report(s) {hits}")
else:
    inj = [e for e in seen if kind_of(e) and e["duration_s"] >= 0.25]
    per = [(e, reports_of([e])) for e in inj]
    sleeps = sum(1 for e in inj if kind_of(e) == "sleep")
    one = sum(1 for _, h in per if len(h) == 1)
    print(f"injected stalls seen in --events: {sleeps} sleeps, {len(inj) - sleeps} gaps; in exactly one incident report: {one} of {len(per)}")
    for e, hits in per:
        if len(hits) != 1:
            print(f"  {e['time']} {e['kind']} {e['duration_s']:.3f}s in {len(hits)} reports: {hits}")
print(f"incident reports: {len(reports)} (the others are the machine's own stalls over the threshold)")
