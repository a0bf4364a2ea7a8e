//! The traced process's cgroup, read from the files the kernel keeps for it: which cgroup
//! (`/proc/PID/cgroup`), where its controllers are mounted (`/proc/self/mountinfo`: never an
//! assumed `/sys/fs/cgroup`), its limits (CPU quota and period, memory max/high or v1
//! limit_in_bytes) and its counters (CFS throttling, memory events and use, pressure), for
//! cgroup v1 and v2 alike. Everything is read under a root path, so that a test builds a
//! fake /proc and cgroupfs in a temporary directory. `host::Sampler` takes a `CgRaw`
//! reading with each of its /proc readings; the limits go into the report's `cgroup` key.

use crate::event::{Nanos, Tid};
use crate::report::{
    CgroupLimits, CgroupMemory, CgroupReport, CgroupTotals, CgroupVersion, Pressure, PressureShares,
};
use std::path::{Path, PathBuf};

/// v1 says "no limit" with the largest page-aligned signed value; anything this large is none.
const V1_UNLIMITED: u64 = 1 << 62;

/// Where one process's cgroup files are.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cgroup {
    pub version: CgroupVersion,
    /// The cgroup of the CPU controller (v2: the one cgroup), as /proc/PID/cgroup says it.
    pub path: String,
    /// v1, when the memory controller puts the process in another cgroup than the CPU's.
    pub memory_path: Option<String>,
    cpu_dir: Option<PathBuf>,
    mem_dir: Option<PathBuf>,
    /// A cgroup directory with `cpu.pressure` (v2, or v1 with the kernel's psi_v1).
    psi_dir: Option<PathBuf>,
    /// The host's pressure files (`/proc/pressure`), when the kernel has them.
    host_psi: Option<PathBuf>,
}

/// Cumulative pressure stall times (µs): some task (`some`) or every task (`full`) of the
/// group waited for the resource.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Psi {
    pub cpu_some: u64,
    pub io_some: u64,
    pub io_full: u64,
    pub mem_some: u64,
    pub mem_full: u64,
}

/// One reading of a cgroup's counters (0 where a file is missing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CgRaw {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    /// ns (v1 `throttled_time`; v2 `throttled_usec` × 1000).
    pub throttled_ns: u64,
    /// v2 `memory.events`: over memory.high (reclaimed and throttled), at memory.max, OOM.
    pub mem_high: u64,
    pub mem_max: u64,
    pub mem_oom: u64,
    /// v1 `memory.failcnt`: charges that hit limit_in_bytes (each one reclaims first).
    pub failcnt: u64,
    /// v2 `memory.stat` pgsteal_direct: pages the cgroup's own tasks reclaimed.
    pub direct_reclaimed_pages: u64,
    /// Bytes charged: all, anonymous, and page cache (the AOF's and the log's included).
    pub usage: u64,
    pub anon: u64,
    pub file: u64,
    pub psi: Psi,
    pub host_psi: Psi,
}

impl Psi {
    fn since(&self, a: &Psi) -> Psi {
        Psi {
            cpu_some: self.cpu_some.saturating_sub(a.cpu_some),
            io_some: self.io_some.saturating_sub(a.io_some),
            io_full: self.io_full.saturating_sub(a.io_full),
            mem_some: self.mem_some.saturating_sub(a.mem_some),
            mem_full: self.mem_full.saturating_sub(a.mem_full),
        }
    }

    /// The shares of `span_ns` these stall times are (a delta over that span).
    pub(crate) fn shares(&self, span_ns: i64) -> PressureShares {
        let pct = |us: u64| {
            if span_ns <= 0 {
                0.0
            } else {
                (100.0 * us as f64 * 1000.0 / span_ns as f64).min(100.0)
            }
        };
        PressureShares {
            cpu_some_pct: pct(self.cpu_some),
            io_some_pct: pct(self.io_some),
            io_full_pct: pct(self.io_full),
            memory_some_pct: pct(self.mem_some),
            memory_full_pct: pct(self.mem_full),
        }
    }
}

impl CgRaw {
    /// What the counters did since reading `a` (levels, such as memory use, are this one's).
    pub(crate) fn since(&self, a: &CgRaw) -> CgRaw {
        CgRaw {
            nr_periods: self.nr_periods.saturating_sub(a.nr_periods),
            nr_throttled: self.nr_throttled.saturating_sub(a.nr_throttled),
            throttled_ns: self.throttled_ns.saturating_sub(a.throttled_ns),
            mem_high: self.mem_high.saturating_sub(a.mem_high),
            mem_max: self.mem_max.saturating_sub(a.mem_max),
            mem_oom: self.mem_oom.saturating_sub(a.mem_oom),
            failcnt: self.failcnt.saturating_sub(a.failcnt),
            direct_reclaimed_pages: self
                .direct_reclaimed_pages
                .saturating_sub(a.direct_reclaimed_pages),
            psi: self.psi.since(&a.psi),
            host_psi: self.host_psi.since(&a.host_psi),
            ..*self
        }
    }

    /// The cgroup hit its memory limit (and so reclaimed): memory.events high or max, or
    /// v1's failcnt, or its own tasks reclaimed pages (a delta).
    pub(crate) fn reclaimed(&self) -> bool {
        self.mem_high + self.mem_max + self.failcnt + self.direct_reclaimed_pages > 0
    }

    /// The report's totals (a delta).
    pub(crate) fn totals(&self) -> CgroupTotals {
        CgroupTotals {
            nr_periods: self.nr_periods,
            nr_throttled: self.nr_throttled,
            throttled_us: self.throttled_ns / 1000,
            memory_high_events: self.mem_high,
            memory_max_events: self.mem_max,
            memory_oom_events: self.mem_oom,
            memory_failcnt: self.failcnt,
            direct_reclaimed_pages: self.direct_reclaimed_pages,
        }
    }
}

/// What a cgroup's counters did over a window: the readings around it and their delta.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CgWindow {
    /// From the reading before the window to the one after it (ns): the delta's span.
    pub span_ns: i64,
    pub delta: CgRaw,
}

/// The counters over [from, to] (monotonic ns) from readings in time order: from the last
/// reading at or before `from` to the first at or after `to` (the first and last readings
/// when the window runs past them).
pub(crate) fn window(readings: &[(Nanos, CgRaw)], from: Nanos, to: Nanos) -> Option<CgWindow> {
    let a = readings
        .iter()
        .rev()
        .find(|r| r.0 <= from)
        .or(readings.first())?;
    let b = readings.iter().find(|r| r.0 >= to).or(readings.last())?;
    (b.0 > a.0).then(|| CgWindow {
        span_ns: b.0 - a.0,
        delta: b.1.since(&a.1),
    })
}

impl Cgroup {
    /// The report's `cgroup` from the readings of the trace: absent in the root cgroup
    /// with no limits (`limits` as read at the start).
    pub(crate) fn report(
        &self,
        limits: CgroupLimits,
        first: &CgRaw,
        last: &CgRaw,
    ) -> Option<CgroupReport> {
        if self.path.is_empty() || (self.is_root() && !limits.any()) {
            return None;
        }
        Some(CgroupReport {
            version: self.version,
            path: self.path.clone(),
            memory_path: self.memory_path.clone(),
            limits,
            totals: last.since(first).totals(),
            memory: CgroupMemory {
                usage_bytes: last.usage,
                anon_bytes: last.anon,
                file_bytes: last.file,
            },
        })
    }

    /// The trace's pressure: the host's, and the cgroup's where it has pressure files.
    pub(crate) fn pressure(&self, w: &CgWindow) -> Option<Pressure> {
        let host = self
            .host_psi
            .is_some()
            .then(|| w.delta.host_psi.shares(w.span_ns));
        let cgroup = self.has_psi().then(|| w.delta.psi.shares(w.span_ns));
        (host.is_some() || cgroup.is_some()).then_some(Pressure { host, cgroup })
    }

    /// The cgroup of `pid` as seen under `root` ("/" on a live system), None when
    /// /proc/PID/cgroup cannot be read or names no mounted hierarchy.
    pub(crate) fn of(root: &Path, pid: Tid) -> Option<Cgroup> {
        let own = std::fs::read_to_string(root.join(format!("proc/{pid}/cgroup"))).ok()?;
        let mounts = std::fs::read_to_string(root.join("proc/self/mountinfo")).ok()?;
        let mounts = parse_mountinfo(&mounts);
        let lines = parse_proc_cgroup(&own);
        let v1 = |ctl: &str| {
            let (_, path) = lines.iter().find(|(c, _)| c.split(',').any(|x| x == ctl))?;
            let m = mounts.iter().find(|m| m.fstype == "cgroup" && m.has(ctl))?;
            Some((path.clone(), m.dir(root, path)))
        };
        let v2 = lines.iter().find(|(c, _)| c.is_empty()).and_then(|(_, p)| {
            let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
            Some((p.clone(), m.dir(root, p)))
        });
        let host_psi = Some(root.join("proc/pressure")).filter(|p| p.join("cpu").exists());
        let (cpu1, mem1) = (v1("cpu"), v1("memory"));
        let cg = if cpu1.is_some() || mem1.is_some() {
            let path = cpu1.as_ref().or(mem1.as_ref())?.0.clone();
            let memory_path = mem1.as_ref().map(|m| m.0.clone()).filter(|p| *p != path);
            // Pressure of the unified hierarchy of a hybrid host, else of the v1 CPU cgroup.
            // Not the root's: its pressure is the host's.
            let own = |c: &Option<(String, PathBuf)>| {
                c.as_ref().filter(|c| c.0 != "/").map(|c| c.1.clone())
            };
            let psi_dir = [own(&v2), own(&cpu1)]
                .into_iter()
                .flatten()
                .find(|d| d.join("cpu.pressure").exists());
            Cgroup {
                version: CgroupVersion::V1,
                path,
                memory_path,
                cpu_dir: cpu1.map(|c| c.1),
                mem_dir: mem1.map(|m| m.1),
                psi_dir,
                host_psi,
            }
        } else {
            let (path, dir) = v2?;
            let psi_dir =
                Some(dir.clone()).filter(|d| path != "/" && d.join("cpu.pressure").exists());
            Cgroup {
                version: CgroupVersion::V2,
                path,
                memory_path: None,
                cpu_dir: Some(dir.clone()),
                mem_dir: Some(dir.clone()),
                psi_dir,
                host_psi,
            }
        };
        Some(cg)
    }

    /// Only the host's pressure files: for a process whose cgroup cannot be read.
    pub(crate) fn host_only(root: &Path) -> Option<Cgroup> {
        let host_psi = Some(root.join("proc/pressure")).filter(|p| p.join("cpu").exists())?;
        Some(Cgroup {
            version: CgroupVersion::V2,
            path: String::new(),
            memory_path: None,
            cpu_dir: None,
            mem_dir: None,
            psi_dir: None,
            host_psi: Some(host_psi),
        })
    }

    /// In the root cgroup of every controller read (a root cgroup has no limits).
    pub(crate) fn is_root(&self) -> bool {
        self.path.is_empty()
            || (self.path == "/" && self.memory_path.as_deref().is_none_or(|p| p == "/"))
    }

    /// The limits now.
    pub(crate) fn limits(&self) -> CgroupLimits {
        let mut l = CgroupLimits::default();
        let rd = |d: &Option<PathBuf>, f: &str| d.as_ref().and_then(|d| read(&d.join(f)));
        match self.version {
            CgroupVersion::V2 => {
                if let Some(t) = rd(&self.cpu_dir, "cpu.max") {
                    let mut w = t.split_whitespace();
                    l.cpu_quota_us = w.next().and_then(|q| q.parse().ok());
                    l.cpu_period_us = w.next().and_then(|p| p.parse().ok());
                }
                l.cpu_burst_us = rd(&self.cpu_dir, "cpu.max.burst").and_then(|v| num(&v));
                l.memory_max_bytes = rd(&self.mem_dir, "memory.max").and_then(|v| num(&v));
                l.memory_high_bytes = rd(&self.mem_dir, "memory.high").and_then(|v| num(&v));
            }
            CgroupVersion::V1 => {
                l.cpu_quota_us = rd(&self.cpu_dir, "cpu.cfs_quota_us")
                    .and_then(|v| v.trim().parse::<i64>().ok())
                    .filter(|q| *q > 0)
                    .map(|q| q as u64);
                l.cpu_period_us = rd(&self.cpu_dir, "cpu.cfs_period_us").and_then(|v| num(&v));
                l.cpu_burst_us = rd(&self.cpu_dir, "cpu.cfs_burst_us")
                    .and_then(|v| num(&v))
                    .filter(|b| *b > 0);
                l.memory_limit_in_bytes = rd(&self.mem_dir, "memory.limit_in_bytes")
                    .and_then(|v| num(&v))
                    .filter(|b| *b < V1_UNLIMITED);
            }
        }
        l
    }

    /// The counters now.
    pub(crate) fn read(&self) -> CgRaw {
        let mut r = CgRaw::default();
        let kv = |d: &Option<PathBuf>, f: &str| {
            d.as_ref()
                .and_then(|d| read(&d.join(f)))
                .map(|t| keyed(&t))
                .unwrap_or_default()
        };
        let get = |m: &[(String, u64)], k: &str| m.iter().find(|(n, _)| n == k).map(|x| x.1);
        let cpu = kv(&self.cpu_dir, "cpu.stat");
        r.nr_periods = get(&cpu, "nr_periods").unwrap_or(0);
        r.nr_throttled = get(&cpu, "nr_throttled").unwrap_or(0);
        r.throttled_ns = match self.version {
            CgroupVersion::V1 => get(&cpu, "throttled_time").unwrap_or(0),
            CgroupVersion::V2 => get(&cpu, "throttled_usec").unwrap_or(0) * 1000,
        };
        let stat = kv(&self.mem_dir, "memory.stat");
        match self.version {
            CgroupVersion::V2 => {
                let ev = kv(&self.mem_dir, "memory.events");
                r.mem_high = get(&ev, "high").unwrap_or(0);
                r.mem_max = get(&ev, "max").unwrap_or(0);
                r.mem_oom = get(&ev, "oom").unwrap_or(0);
                r.direct_reclaimed_pages = get(&stat, "pgsteal_direct").unwrap_or(0);
                r.anon = get(&stat, "anon").unwrap_or(0);
                r.file = get(&stat, "file").unwrap_or(0);
                r.usage = self.file_num(&self.mem_dir, "memory.current");
            }
            CgroupVersion::V1 => {
                r.failcnt = self.file_num(&self.mem_dir, "memory.failcnt");
                // The hierarchical totals when the kernel gives them (children included).
                let pick = |a: &str, b: &str| get(&stat, a).or(get(&stat, b)).unwrap_or(0);
                r.anon = pick("total_rss", "rss");
                r.file = pick("total_cache", "cache");
                r.usage = self.file_num(&self.mem_dir, "memory.usage_in_bytes");
            }
        }
        if let Some(d) = &self.psi_dir {
            r.psi = psi(&[
                d.join("cpu.pressure"),
                d.join("io.pressure"),
                d.join("memory.pressure"),
            ]);
        }
        if let Some(d) = &self.host_psi {
            r.host_psi = psi(&[d.join("cpu"), d.join("io"), d.join("memory")]);
        }
        r
    }

    /// The CPU burst file the kernel has for this cgroup (Linux 5.14 and later), if any.
    pub(crate) fn burst_file(&self) -> Option<&'static str> {
        let name = match self.version {
            CgroupVersion::V2 => "cpu.max.burst",
            CgroupVersion::V1 => "cpu.cfs_burst_us",
        };
        let dir = self.cpu_dir.as_ref()?;
        dir.join(name).exists().then_some(name)
    }

    /// Whether a cgroup pressure reading is had (the host's is apart).
    pub(crate) fn has_psi(&self) -> bool {
        self.psi_dir.is_some()
    }

    fn file_num(&self, d: &Option<PathBuf>, f: &str) -> u64 {
        d.as_ref()
            .and_then(|d| read(&d.join(f)))
            .and_then(|v| num(&v))
            .unwrap_or(0)
    }
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// A number, None for "max" (v2's no-limit) or anything else.
fn num(v: &str) -> Option<u64> {
    v.trim().parse().ok()
}

/// "key value" lines (cpu.stat, memory.stat, memory.events).
fn keyed(t: &str) -> Vec<(String, u64)> {
    t.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The `total=` of the `some` and `full` lines of cpu, io and memory pressure files.
fn psi(files: &[PathBuf; 3]) -> Psi {
    let totals = |p: &PathBuf| {
        let t = read(p).unwrap_or_default();
        let of = |kind: &str| {
            t.lines()
                .find(|l| l.starts_with(kind))
                .and_then(|l| l.rsplit_once("total="))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0)
        };
        (of("some "), of("full "))
    };
    let (cpu, io, mem) = (totals(&files[0]), totals(&files[1]), totals(&files[2]));
    Psi {
        cpu_some: cpu.0,
        io_some: io.0,
        io_full: io.1,
        mem_some: mem.0,
        mem_full: mem.1,
    }
}

/// `/proc/PID/cgroup`: (controllers, path) per line; v2's line has no controllers.
fn parse_proc_cgroup(t: &str) -> Vec<(String, String)> {
    t.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            Some((ctl.to_string(), path.to_string()))
        })
        .collect()
}

/// One cgroup mount of /proc/self/mountinfo.
#[derive(Debug)]
struct Mount {
    /// The directory of the hierarchy that is mounted (not "/" inside a cgroup namespace
    /// or a bind mount of a sub-tree).
    root: String,
    point: String,
    fstype: String,
    /// v1: the super options name the controllers ("rw,cpu,cpuacct").
    options: String,
}

impl Mount {
    fn has(&self, ctl: &str) -> bool {
        self.options.split(',').any(|o| o == ctl)
    }
    /// The directory of cgroup `path` under this mount, under `root`.
    fn dir(&self, root: &Path, path: &str) -> PathBuf {
        let rel = match path.strip_prefix(self.root.as_str()) {
            Some(r) if self.root != "/" => r,
            _ => path,
        };
        let mut d = root.join(self.point.trim_start_matches('/'));
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            d.push(part);
        }
        d
    }
}

fn parse_mountinfo(t: &str) -> Vec<Mount> {
    t.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let p: Vec<&str> = post.split(' ').collect();
            let fstype = *p.first()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(Mount {
                root: unescape(f.get(3)?),
                point: unescape(f.get(4)?),
                fstype: fstype.to_string(),
                options: p.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
