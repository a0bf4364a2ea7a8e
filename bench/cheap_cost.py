#!/usr/bin/env python3
"""What the cheap tier's kernel programs cost, as the kernel counts it (bpf_stats): a figure
that other load on a shared machine moves much less than throughput does.

A fresh redis-server on a free loopback port takes `redis-benchmark -t set -c 50` runs while
`stallscope watch --pid` (the default, cheap mode; no --out, so nothing escalates) watches it.
With kernel.bpf_stats_enabled=1 the kernel adds each program's run time and run count to its
fdinfo; before and after each run they are read from the watcher's program fds. Per run and
per build: each program's runs per second, ns per run, and its total per request served,
against redis's own CPU per request (schedstat of all its threads) and the host's context
switches. bpf_stats itself adds two clock reads per program run (tens of ns), counted in
the run time: the figures are a ceiling.

    python3 bench/cheap_cost.py [REQUESTS] [ROUNDS]        (defaults 400000, 5)

BIN_A and BIN_B (environment) alternate round by round (A B, B A, ...); both default to
target/release/stallscope. Needs root, redis-server, redis-benchmark, redis-cli.
"""
import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

PROG_TYPES = {26: "sched_switch (tp_btf)", 7: "sampler (perf_event)"}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def prog_stats(pid):
    """{prog_id: (type, run_time_ns, run_cnt)} of the programs process `pid` holds."""
    out = {}
    for f in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            text = open(f).read()
        except OSError:
            continue
        if "prog_type:" not in text or "run_cnt:" not in text:
            continue
        kv = dict(re.findall(r"^(\w+):\s+(\S+)", text, re.M))
        out[int(kv["prog_id"])] = (int(kv["prog_type"]), int(kv["run_time_ns"]), int(kv["run_cnt"]))
    return out


def cpu_ns(pid):
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(open(f).read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total


def ctxt():
    for line in open("/proc/stat"):
        if line.startswith("ctxt "):
            return int(line.split()[1])
    return 0


def bench(port, n):
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-t", "set", "-n", str(n), "-c", "50", "-q"],
        capture_output=True, text=True, check=True).stdout
    m = re.findall(r"([\d.]+) requests per second", out)
    return float(m[-1])


def one_run(binary, rpid, port, n, tmp):
    err = open(os.path.join(tmp, "watch.err"), "w+")
    w = subprocess.Popen([binary, "watch", "--pid", str(rpid), "--threshold", "1s"],
                         stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.time() + 60
    while time.time() < deadline:
        err.seek(0)
        if "with the cheap tier" in err.read():
            break
        time.sleep(0.05)
    else:
        w.kill()
        err.seek(0)
        sys.exit(f"{binary}: the cheap tier did not start: {err.read()}")
    p0, c0, x0, t0 = prog_stats(w.pid), cpu_ns(rpid), ctxt(), time.time()
    rps = bench(port, n)
    p1, c1, x1, t1 = prog_stats(w.pid), cpu_ns(rpid), ctxt(), time.time()
    w.terminate()
    w.wait(timeout=30)
    secs = t1 - t0
    progs = {}
    for pid_, (ty, rt, rc) in p1.items():
        _, rt0, rc0 = p0.get(pid_, (ty, 0, 0))
        name = PROG_TYPES.get(ty, f"type {ty}")
        a, b = progs.get(name, (0, 0))
        progs[name] = (a + rt - rt0, b + rc - rc0)
    return {"rps": rps, "secs": secs, "requests": n, "redis_ns": c1 - c0,
            "ctxt_per_s": (x1 - x0) / secs, "progs": progs}


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    default = "target/release/stallscope"
    bins = {"A": os.environ.get("BIN_A", default), "B": os.environ.get("BIN_B", default)}
    was = open("/proc/sys/kernel/bpf_stats_enabled").read().strip()
    tmp = tempfile.mkdtemp()
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
                              "--save", "", "--appendonly", "no", "--daemonize", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        open("/proc/sys/kernel/bpf_stats_enabled", "w").write("1")
        print(f"cheap_cost: redis-benchmark -t set -n {n} -c 50, {rounds} rounds; A={bins['A']} B={bins['B']}; "
              f"load average {open('/proc/loadavg').read().split()[0]} at the start, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
        rows = {"A": [], "B": []}
        for r in range(rounds):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for k in order:
                x = one_run(bins[k], redis.pid, port, n, tmp)
                rows[k].append(x)
                parts = []
                total = 0
                for name, (ns, cnt) in sorted(x["progs"].items()):
                    total += ns
                    parts.append(f"{name}: {cnt / x['secs']:.0f}/s, {ns / max(cnt, 1):.0f} ns/run")
                print(f"round {r + 1} {k}: {x['rps']:.0f} rps, redis {x['redis_ns'] / n:.0f} ns CPU/request, "
                      f"programs {total / n:.1f} ns/request ({100 * total / max(x['redis_ns'], 1):.2f}% of redis's CPU), "
                      f"host {x['ctxt_per_s']:.0f} switches/s; " + "; ".join(parts))
        for k in ("A", "B"):
            share = sorted(100 * sum(ns for ns, _ in x["progs"].values()) / max(x["redis_ns"], 1) for x in rows[k])
            per_run = {}
            for x in rows[k]:
                for name, (ns, cnt) in x["progs"].items():
                    per_run.setdefault(name, []).append(ns / max(cnt, 1))
            pr = "; ".join(f"{name} median {sorted(v)[len(v) // 2]:.0f} ns/run" for name, v in sorted(per_run.items()))
            print(f"{k}: programs' CPU as a share of redis's, median {share[len(share) // 2]:.2f}% "
                  f"(range {share[0]:.2f}-{share[-1]:.2f}); {pr}")
    finally:
        open("/proc/sys/kernel/bpf_stats_enabled", "w").write(was)
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
