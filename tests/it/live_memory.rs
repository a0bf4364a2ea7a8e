//! Issue 41's memory half without a container runtime: a redis-server of the test's own with
//! an AOF, put into a memory cgroup the test makes (cgroup v1's memory controller, or v2's
//! memory.max, wherever /proc/self/mountinfo says they are) with a limit a few times redis's
//! own memory, and a SET load of 100 KB values over a few keys: redis's data stays small, the
//! AOF's page cache fills the limit, and every write() that appends to the AOF charges pages
//! the kernel must first reclaim from the cgroup, in redis's main thread, waiting for the
//! writeback of dirty AOF pages when clean ones run out.
//!
//! `stallscope attach --backend bpf` must name those stalls `memory-reclaim`, with the limit
//! and what was charged against it (anonymous memory, page cache), and its measured
//! `reclaim_us` must be what the kernel says: the test reads the same vmscan tracepoints
//! through a tracefs instance of its own (ftrace, not bpf) over the same run, and checks the
//! stalls' reclaim time against the reclaims ftrace saw. The cgroup's own counters say that
//! it reclaimed (v1: memory.failcnt; v2: memory.events max).
//!
//! The machine running these tests is shared and loaded, and how long a reclaim waits for
//! writeback depends on the disk: the bounds are loose where the disk decides, exact where
//! the two readers of one tracepoint must agree. Root only; skipped otherwise, a failure
//! under CI=true.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::cgroup::{controller_mount, TestCgroup};
use crate::common::{all_run, ci, json, serial, threads_of, Attach, Benchmark, Redis, DEADLINE};
use crate::live_watch::Watch;

/// The cgroup's limit: redis with 50 keys of 100 KB is about 15 MiB of anonymous memory
/// (data, client buffers, the allocator's slack); the rest is the AOF's page cache.
const LIMIT: u64 = 48 << 20;

/// The test's memory cgroup's own limit and counter (v1 memory.limit_in_bytes,
/// memory.failcnt; v2 memory.max, memory.events), beside what every test cgroup has
/// (`common::cgroup`).
impl TestCgroup {
    fn set_memory_limit(&self, limit: u64) {
        let f = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        self.write(f, &limit.to_string());
    }

    /// The count of charges that hit the limit (each one reclaimed first): v1 memory.failcnt,
    /// v2 memory.events `max`.
    fn limit_hits(&self) -> u64 {
        if self.v2 {
            self.read("memory.events")
                .lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        } else {
            self.read("memory.failcnt").trim().parse().unwrap_or(0)
        }
    }
}

/// Where tracefs is mounted (mountinfo, not an assumed path).
fn tracefs() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let found = mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split(' ').next()? != "tracefs" {
            return None;
        }
        Some(PathBuf::from(pre.split(' ').nth(4)?))
    });
    found.or_else(|| {
        let d = PathBuf::from("/sys/kernel/debug/tracing");
        d.join("events").exists().then_some(d)
    })
}

const EVENTS: [&str; 4] = [
    "mm_vmscan_memcg_reclaim_begin",
    "mm_vmscan_memcg_reclaim_end",
    "mm_vmscan_direct_reclaim_begin",
    "mm_vmscan_direct_reclaim_end",
];

/// The test's own reader of the kernel's reclaim tracepoints: an ftrace instance (its own
/// buffer, never the top-level one another tool may use) recording the four events of
/// redis's threads, on the monotonic clock; removed on drop.
struct Ftrace {
    dir: PathBuf,
}

impl Ftrace {
    fn start(tids: &[u32]) -> Option<Ftrace> {
        let root = tracefs()?;
        if !EVENTS
            .iter()
            .all(|e| root.join("events/vmscan").join(e).exists())
        {
            return None;
        }
        let dir = root.join(format!("instances/stallscope-test-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).ok()?;
        let f = Ftrace { dir };
        let w = |p: &str, v: &str| {
            std::fs::write(f.dir.join(p), v).unwrap_or_else(|e| panic!("tracefs {p} {v}: {e}"))
        };
        w("trace_clock", "mono");
        w("buffer_size_kb", "8192");
        let filter: Vec<String> = tids.iter().map(|t| format!("common_pid == {t}")).collect();
        for e in EVENTS {
            w(&format!("events/vmscan/{e}/filter"), &filter.join(" || "));
            w(&format!("events/vmscan/{e}/enable"), "1");
        }
        w("tracing_on", "1");
        Some(f)
    }

    /// Every reclaim it saw: (tid, begin, end), monotonic ns; and whether the buffer lost
    /// events (then a total is a lower bound).
    fn reclaims(&self) -> (Vec<(u32, i64, i64)>, bool) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        let text = std::fs::read_to_string(self.dir.join("trace")).unwrap_or_default();
        let lost = text
            .lines()
            .find_map(|l| l.strip_prefix("# entries-in-buffer/entries-written: "))
            .and_then(|v| v.split_once('/'))
            .is_some_and(|(a, b)| a.split_whitespace().next() != b.split_whitespace().next());
        let mut open: std::collections::HashMap<u32, i64> = Default::default();
        let mut out = vec![];
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            // "  redis-server-16191   [000] ..... 20548.879162: mm_vmscan_memcg_reclaim_end: ..."
            let Some((head, rest)) = l.split_once(": mm_vmscan_") else {
                continue;
            };
            let mut f = head.split_whitespace();
            let task = f.next().unwrap_or("");
            let Some(tid) = task.rsplit_once('-').and_then(|(_, t)| t.parse().ok()) else {
                continue;
            };
            let Some(ts) = f.last().and_then(|t| t.parse::<f64>().ok()) else {
                continue;
            };
            let ns = (ts * 1e9).round() as i64;
            let name = rest.split(':').next().unwrap_or("");
            if name.ends_with("_begin") {
                open.entry(tid).or_insert(ns);
            } else if let Some(b) = open.remove(&tid) {
                out.push((tid, b, ns));
            }
        }
        (out, lost)
    }
}

impl Drop for Ftrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        for e in EVENTS {
            let _ = std::fs::write(self.dir.join(format!("events/vmscan/{e}/enable")), "0");
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn can_run() -> bool {
    let tools = all_run(&["redis-server", "redis-benchmark"]);
    let root = unsafe { libc::geteuid() } == 0;
    let ok = tools && root && controller_mount("memory").is_some() && tracefs().is_some();
    if !ok && ci() {
        panic!("the memory experiment needs root, a memory cgroup controller, tracefs, redis-server and redis-benchmark under CI=true");
    }
    if !ok {
        eprintln!("skipping: the memory experiment needs root, a memory cgroup controller, tracefs, redis-server and redis-benchmark");
    }
    ok
}

/// A SET load of 100 KB values over 50 keys (redis's data stays about 5 MB; the AOF grows
/// by 100 KB a command), `n` commands in all, until done or dropped.
fn load(port: u16, n: u64) -> Benchmark {
    let args = format!("-t set -n {n} -c 4 -P 4 -d 100000 -r 50 -q");
    Benchmark::start(port, &args)
}

/// A directory on the disk for redis's AOF: the page cache of a tmpfs is shared memory that
/// no reclaim frees (without swap the cgroup would kill redis instead), and /tmp may be one.
fn disk_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn us(v: &serde_json::Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

#[test]
fn a_memory_limit_makes_the_aof_writes_reclaim_and_the_reclaim_is_measured() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let (_tmp, r, cg) = aof_redis_under_a_limit();
    let Some(ft) = reclaim_reader(&r) else {
        return;
    };
    let hits_before = cg.limit_hits();
    let args = ["--threshold", "5ms", "-d", "12s", "-f", "json"];
    let a = Attach::start("bpf", r.pid(), &args);
    assert!(a.attached, "not attached: {:?}", a.stderr);
    assert!(
        a.stderr.iter().any(|l| l.contains("reclaim programs on")),
        "the reclaim programs did not run: {:?}",
        a.stderr
    );
    // 3000 commands: 300 MB through the AOF, six times the limit (a few seconds on a disk).
    let mut load = load(r.port, 3000);
    load.wait(Duration::from_secs(10));
    drop(load);
    let (code, out, err) = a.finish(DEADLINE);
    let (reclaims, lost) = ft.reclaims();
    let hits = cg.limit_hits() - hits_before;
    assert!(
        matches!(code, Some(0 | 1)),
        "exit {code:?}; stderr: {err:?}"
    );
    let rep = json(&out);
    check_report(&rep, &reclaims, lost, hits);
    drop(ft);
    drop(cg);
    r.assert_unharmed();
}

/// A redis with an AOF in a directory on the disk, in a memory cgroup of the test's own
/// with `LIMIT`.
fn aof_redis_under_a_limit() -> (tempfile::TempDir, Redis, TestCgroup) {
    let tmp = disk_tempdir();
    let dir = tmp.path().to_string_lossy().into_owned();
    let r = Redis::start_in(
        tmp.path(),
        &[
            "--dir",
            &dir,
            "--logfile",
            "redis.log",
            "--loglevel",
            "verbose",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            // One AOF that only grows: a rewrite child would add its own reclaim.
            "--auto-aof-rewrite-percentage",
            "0",
        ],
    );
    let name = format!("stallscope-test-mem-{}", std::process::id());
    let cg = TestCgroup::make("memory", &name).expect("cannot make a memory cgroup");
    cg.set_memory_limit(LIMIT);
    cg.add(r.pid());
    (tmp, r, cg)
}

/// The test's own reader of redis's reclaims; None (a skip, a failure under CI=true) on a
/// kernel without the vmscan tracepoints.
fn reclaim_reader(r: &Redis) -> Option<Ftrace> {
    let ft = Ftrace::start(&threads_of(r.pid()));
    if ft.is_none() {
        assert!(
            !ci(),
            "the kernel lacks the vmscan reclaim tracepoints (CI=true)"
        );
        eprintln!("skipping: no vmscan reclaim tracepoints");
    }
    ft
}

/// The same load under `watch`'s default mode, the cheap tier (no syscall tracepoint): its
/// records carry the reclaim time the same programs measure, so a main-thread stall that was
/// mostly reclaim is `memory-reclaim` there too, with the limit, in the events log and the
/// stall counter. The cheap tier sees a blocked call from the switch-out to the switch-in:
/// a reclaim that waited for writeback in one sleep of 5 ms or more is one of its stalls,
/// one made of shorter sleeps is not; ftrace's account says which there were.
#[test]
fn the_cheap_tier_names_a_stall_in_reclaim_memory_reclaim_too() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let (tmp, r, cg) = aof_redis_under_a_limit();
    let Some(ft) = reclaim_reader(&r) else {
        return;
    };
    let events = tmp.path().join("events.jsonl");
    let pid = r.pid().to_string();
    let args = [
        "--mode",
        "cheap",
        "--pid",
        &pid,
        "--threshold",
        "5ms",
        "--events",
        events.to_str().unwrap(),
    ];
    let mut w = Watch::start_until(&args, "with the cheap tier", DEADLINE);
    assert!(
        !w.lines()
            .iter()
            .any(|l| l.contains("cannot time memory reclaim")),
        "{:?}",
        w.lines()
    );
    let mut load = load(r.port, 3000);
    load.wait(Duration::from_secs(10));
    drop(load);
    // The last records are read within the tier's poll (20 ms).
    std::thread::sleep(Duration::from_millis(500));
    let code = w.terminate(DEADLINE);
    let (reclaims, _) = ft.reclaims();
    assert_eq!(code, Some(0), "{:?}", w.lines());
    let text = std::fs::read_to_string(&events).unwrap_or_default();
    let stalls: Vec<serde_json::Value> = text.lines().map(json).collect();
    let main = r.pid();
    let longest_main = reclaims
        .iter()
        .filter(|x| x.0 == main)
        .map(|x| x.2 - x.1)
        .max()
        .unwrap_or(0);
    let named: Vec<_> = stalls
        .iter()
        .filter(|s| s["finding"] == "memory-reclaim")
        .collect();
    eprintln!(
        "cheap tier: {} stalls of 5 ms or more, {} memory-reclaim; ftrace: {} reclaims, the main thread's longest {} µs",
        stalls.len(),
        named.len(),
        reclaims.len(),
        longest_main / 1000
    );
    if let Some(s) = named.first() {
        eprintln!("a memory-reclaim stall of the cheap tier: {}", s["cause"]);
    }
    for s in &named {
        let why = s["cause"].as_str().unwrap_or("");
        assert!(why.starts_with("cheap tier: "), "{why}");
        for part in ["reclaimed memory itself for", "48 MiB", "memory reclaim"] {
            assert!(why.contains(part), "{part:?} not in {why}");
        }
        assert_eq!(s["thread"], "main", "{s}");
    }
    if longest_main < 5_000_000 {
        eprintln!("no reclaim of the main thread reached 5 ms on this disk: nothing to name");
        return;
    }
    assert!(!named.is_empty(), "no memory-reclaim stall: {stalls:?}");
    drop(ft);
    drop(cg);
    r.assert_unharmed();
}

/// The report against the kernel's own accounts: ftrace's reclaims of redis's threads and
/// the cgroup's count of charges that hit the limit (`hits`).
fn check_report(rep: &serde_json::Value, reclaims: &[(u32, i64, i64)], lost: bool, hits: u64) {
    let stalls = rep["stalls"].as_array().expect("stalls");
    let total_ft: i64 = reclaims.iter().map(|r| r.2 - r.1).sum::<i64>() / 1000;
    let longest_ft = reclaims.iter().map(|r| r.2 - r.1).max().unwrap_or(0) / 1000;
    let by_reclaim: Vec<_> = stalls
        .iter()
        .filter(|s| s["finding"] == "memory-reclaim")
        .collect();
    let sum_stalls: i64 = stalls.iter().map(|s| us(&s["sched"]["reclaim_us"])).sum();
    let sum_named: i64 = by_reclaim
        .iter()
        .map(|s| us(&s["sched"]["reclaim_us"]))
        .sum();
    eprintln!(
        "limit {} MiB: {hits} charges hit it; ftrace: {} reclaims of redis's threads, {total_ft} µs in all, the longest {longest_ft} µs{}; \
         report: {} stalls of 5 ms or more, {} memory-reclaim ({sum_named} µs reclaiming), reclaim_us over all stalls {sum_stalls} µs",
        LIMIT >> 20,
        reclaims.len(),
        if lost { " (its buffer overflowed)" } else { "" },
        stalls.len(),
        by_reclaim.len(),
    );
    // The cgroup's own counter: the load did push it into reclaim.
    assert!(hits > 0, "the cgroup never hit its limit");
    assert!(!reclaims.is_empty(), "ftrace saw no reclaim");
    // The report's cgroup: the limit, and that it was hit.
    let cgr = &rep["cgroup"];
    let limit_key = if cgr["version"] == "v2" {
        "memory_max_bytes"
    } else {
        "memory_limit_in_bytes"
    };
    assert_eq!(cgr["limits"][limit_key], LIMIT, "{cgr}");
    let counted = cgr["totals"]["memory_failcnt"].as_u64().unwrap_or(0)
        + cgr["totals"]["memory_max_events"].as_u64().unwrap_or(0);
    assert!(counted > 0 && counted <= hits, "{counted} of {hits}: {cgr}");
    // How long a reclaim waits for writeback is the disk's doing: at least one stall of
    // 5 ms was mostly reclaim on this machine in every run (a quiet disk may make them short;
    // then ftrace shows no reclaim of 5 ms either, which is checked first).
    if longest_ft < 5_000 {
        eprintln!("no reclaim reached 5 ms on this disk: nothing to name");
        return;
    }
    assert!(
        !by_reclaim.is_empty(),
        "no memory-reclaim stall: {stalls:?}"
    );
    for s in &by_reclaim {
        let reclaim = us(&s["sched"]["reclaim_us"]);
        assert!(reclaim * 2 >= us(&s["duration_us"]), "{s}");
        let why = s["cause"].as_str().unwrap_or("");
        for part in ["reclaimed memory itself", "MiB", "page cache"] {
            assert!(why.contains(part), "{part:?} not in {why}");
        }
    }
    // Both readers of the tracepoints agree: the stalls' reclaim is ftrace's, never more
    // (1% for the two clocks' reads at either end), and holds every reclaim long enough to
    // make a stall alone (ftrace's of 5 ms or more: each inside a call or gap of 5 ms).
    let long_ft: i64 = reclaims
        .iter()
        .map(|r| r.2 - r.1)
        .filter(|d| *d >= 5_000_000)
        .sum::<i64>()
        / 1000;
    assert!(
        sum_stalls <= total_ft + total_ft / 100 + 100,
        "stalls {sum_stalls} µs, ftrace {total_ft} µs"
    );
    if !lost {
        assert!(
            sum_stalls >= long_ft - long_ft / 100,
            "stalls {sum_stalls} µs, ftrace's long reclaims {long_ft} µs"
        );
    }
    let f = rep["findings"].as_array().unwrap();
    let finding = f
        .iter()
        .find(|f| f["id"] == "memory-reclaim")
        .expect("memory-reclaim finding");
    let ev = finding["evidence"].as_str().unwrap_or("");
    eprintln!(
        "a memory-reclaim stall: {}\nthe finding ({}): {ev}",
        by_reclaim[0]["cause"], finding["severity"]
    );
    for part in ["measured", "anonymous", "page cache", "limit"] {
        assert!(ev.contains(part), "{part:?} not in {ev}");
    }
}
