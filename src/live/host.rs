//! The /proc sampler of a live session (`attach` and `watch` alike): every `INTERVAL`, one
//! `Raw` reading of the traced process (page faults, disk I/O, its main thread's time on a
//! CPU and waiting for one, context switches, resident memory) and of the host (the CPUs'
//! iowait share), on its own thread. It keeps either every reading (`Keep::All`: attach's
//! report, at a coarser step past an hour) or the last N seconds of them (`Keep::Last`:
//! watch, whose incidents each carry the readings of their own window). The report's
//! `HostSample`s are the rates between readings (`samples`). Another source (the cgroup's
//! CPU quota and throttling, its memory limit and events, the pressure files) is more fields
//! of `Raw`, read in `read_raw`, and so reaches both commands at once.

use super::cgroup::{CgRaw, CgWindow, Cgroup};
use crate::event::{Nanos, Tid};
use crate::report::{CgroupLimits, HostSample, Report};
use procfs::process::Process;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often /proc is read.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// Most readings `Keep::All` holds (an hour at 100 ms); past it every other one is let go
/// and from then on only every other one is kept, so a long attach keeps bounded memory at
/// a coarser step.
const KEEP_ALL_MAX: usize = 36_000;

/// One reading of /proc (counters, not rates).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Raw {
    pub mono: Nanos,
    pub minflt: u64,
    pub majflt: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// The host's CPU time (ticks): all of it, and waiting for I/O.
    pub cpu_total: u64,
    pub cpu_iowait: u64,
    /// The host's steal time (ns, all CPUs): what the hypervisor ran on its virtual CPUs
    /// instead of this VM (0 on bare metal and where the kernel does not count it).
    pub steal_ns: u64,
    /// Main thread: ns on a CPU and ns runnable but waiting for one (schedstat).
    pub run_ns: u64,
    pub wait_ns: u64,
    pub voluntary_cs: u64,
    pub involuntary_cs: u64,
    pub rss_kb: u64,
    /// The process's cgroup and the host's pressure (cgroup.rs; zeros where not read).
    pub cg: CgRaw,
}

/// Which readings a sampler keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Keep {
    /// Every reading, until the sampler is stopped (coarser past `KEEP_ALL_MAX`).
    All,
    /// Those of the last so long.
    Last(Duration),
}

/// The sampler thread of one traced process and what it kept.
pub(crate) struct Sampler {
    /// The traced process's cgroup, found at the start (or the host's pressure alone).
    cgroup: Option<Cgroup>,
    stop: Arc<AtomicBool>,
    kept: Arc<Mutex<Kept>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Reads `pid` now and every `interval`, keeping what `keep` says, until stopped or
    /// the process is gone.
    pub(crate) fn start(pid: Tid, interval: Duration, keep: Keep) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let kept = Arc::new(Mutex::new(Kept::new(keep, interval)));
        let (s, k) = (stop.clone(), kept.clone());
        let root = std::path::Path::new("/");
        let cgroup = Cgroup::of(root, pid).or_else(|| Cgroup::host_only(root));
        let cg = cgroup.clone();
        let handle = std::thread::Builder::new()
            .name("procsampler".into())
            .spawn(move || {
                let Ok(p) = Process::new(pid as i32) else {
                    return;
                };
                while !s.load(Ordering::SeqCst) {
                    // Without the process's stat the process is gone.
                    let Some(r) = read_raw(&p, cg.as_ref()) else {
                        break;
                    };
                    k.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                    std::thread::sleep(interval);
                }
            })
            .ok();
        Sampler {
            cgroup,
            stop,
            kept,
            handle,
        }
    }

    /// The traced process's cgroup, when it was found.
    pub(crate) fn cgroup(&self) -> Option<&Cgroup> {
        self.cgroup.as_ref()
    }

    /// The readings from just before `from` to just after `to` (monotonic ns).
    pub(crate) fn window(&self, from: Nanos, to: Nanos) -> Vec<Raw> {
        let k = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let iv = k.interval.as_nanos() as Nanos;
        k.raw
            .iter()
            .filter(|r| r.mono >= from - iv && r.mono <= to + iv)
            .copied()
            .collect()
    }

    /// Stops the thread and returns every reading kept, in order.
    pub(crate) fn finish(mut self) -> Vec<Raw> {
        self.stop_thread();
        let mut k = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let last = k.unkept.take();
        k.raw.extend(last);
        std::mem::take(&mut k.raw).into()
    }

    /// Stops the thread, the readings unread.
    pub(crate) fn stop(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The readings a sampler keeps.
struct Kept {
    raw: VecDeque<Raw>,
    interval: Duration,
    /// `Keep::Last`: the most readings kept; `Keep::All`: none (`KEEP_ALL_MAX` thins them).
    most: Option<usize>,
    /// `Keep::All` past `KEEP_ALL_MAX`: one reading in `every` is kept.
    every: usize,
    /// Readings since the last one kept, and the latest of them if it was not kept (it is
    /// at the end, so the last interval is not lost).
    since: usize,
    unkept: Option<Raw>,
}

impl Kept {
    fn new(keep: Keep, interval: Duration) -> Self {
        let most = match keep {
            Keep::All => None,
            Keep::Last(d) => Some((d.as_nanos() / interval.as_nanos().max(1)) as usize + 2),
        };
        Kept {
            raw: VecDeque::with_capacity(most.unwrap_or(0)),
            interval,
            most,
            every: 1,
            since: 0,
            unkept: None,
        }
    }

    fn push(&mut self, r: Raw) {
        if let Some(most) = self.most {
            if self.raw.len() >= most {
                self.raw.pop_front();
            }
            self.raw.push_back(r);
            return;
        }
        self.since += 1;
        if self.since < self.every {
            self.unkept = Some(r);
            return;
        }
        self.since = 0;
        self.unkept = None;
        self.raw.push_back(r);
        if self.raw.len() >= KEEP_ALL_MAX {
            // Every other one goes, the first (the start of the axis) stays.
            let mut i = 0;
            self.raw.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            if self.raw.back() != Some(&r) {
                // `r` went: it is `every` readings past the last one kept, and the latest.
                self.since = self.every;
                self.unkept = Some(r);
            }
            self.every *= 2;
        }
    }
}

/// Reads what a `Raw` holds; None when the process is gone. Each part that cannot be read
/// (a kernel without schedstat, /proc/PID/io of another user) is 0.
fn read_raw(p: &Process, cg: Option<&Cgroup>) -> Option<Raw> {
    let st = p.stat().ok()?;
    let io = p.io().ok();
    let sched = p.schedstat().ok();
    let status = p.status().ok();
    let (cpu_total, cpu_iowait, steal) = cpu_times().unwrap_or((0, 0, 0));
    Some(Raw {
        mono: crate::clock::now_mono(),
        minflt: st.minflt,
        majflt: st.majflt,
        read_bytes: io.as_ref().map_or(0, |i| i.read_bytes),
        write_bytes: io.as_ref().map_or(0, |i| i.write_bytes),
        cpu_total,
        cpu_iowait,
        steal_ns: steal.saturating_mul(1_000_000_000 / procfs::ticks_per_second().max(1)),
        run_ns: sched.as_ref().map_or(0, |s| s.sum_exec_runtime),
        wait_ns: sched.as_ref().map_or(0, |s| s.run_delay),
        voluntary_cs: status
            .as_ref()
            .and_then(|s| s.voluntary_ctxt_switches)
            .unwrap_or(0),
        involuntary_cs: status
            .as_ref()
            .and_then(|s| s.nonvoluntary_ctxt_switches)
            .unwrap_or(0),
        rss_kb: status.as_ref().and_then(|s| s.vmrss).unwrap_or(0),
        cg: cg.map(Cgroup::read).unwrap_or_default(),
    })
}

/// The host's CPU time in ticks (/proc/stat's `cpu` line): all of it (user nice system
/// idle iowait irq softirq steal; guest time is inside user and nice), iowait, and steal.
fn cpu_times() -> Option<(u64, u64, u64)> {
    use procfs::CurrentSI;
    let t = procfs::KernelStats::current().ok()?.total;
    let total = t.user
        + t.nice
        + t.system
        + t.idle
        + [t.iowait, t.irq, t.softirq, t.steal]
            .iter()
            .map(|v| v.unwrap_or(0))
            .sum::<u64>();
    Some((total, t.iowait?, t.steal.unwrap_or(0)))
}

fn rate(a: u64, b: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        0.0
    } else {
        b.saturating_sub(a) as f64 / secs
    }
}

/// The report's samples: rates between consecutive readings, `at_us` from `origin`.
pub(crate) fn samples(raw: &[Raw], origin: Nanos) -> Vec<HostSample> {
    raw.windows(2)
        .map(|w| {
            let (a, b) = (w[0], w[1]);
            let secs = (b.mono - a.mono) as f64 / 1e9;
            let dt = b.cpu_total.saturating_sub(a.cpu_total);
            HostSample {
                at_us: (a.mono - origin) / 1000,
                minflt_per_s: rate(a.minflt, b.minflt, secs),
                majflt_per_s: rate(a.majflt, b.majflt, secs),
                read_bytes_per_s: rate(a.read_bytes, b.read_bytes, secs),
                write_bytes_per_s: rate(a.write_bytes, b.write_bytes, secs),
                iowait_pct: if dt == 0 {
                    0.0
                } else {
                    100.0 * b.cpu_iowait.saturating_sub(a.cpu_iowait) as f64 / dt as f64
                },
            }
        })
        .collect()
}

/// What the main thread's scheduling and the process's memory did over [from, to]
/// (monotonic ns), from the two readings around it: a note for the report's host section.
pub(crate) fn sched_note(raw: &[Raw], from: Nanos, to: Nanos, what: &str) -> Option<String> {
    let a = raw.iter().rev().find(|r| r.mono <= from).or(raw.first())?;
    let b = raw.iter().find(|r| r.mono >= to).or(raw.last())?;
    if b.mono <= a.mono {
        return None;
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    Some(format!(
        "{what} ({:.0} ms of /proc readings): redis's main thread ran {:.1} ms on a CPU and waited {:.1} ms for one \
         (schedstat); {} voluntary and {} involuntary context switches (status); RSS {} MB",
        (b.mono - a.mono) as f64 / 1e6,
        ms(b.run_ns.saturating_sub(a.run_ns)),
        ms(b.wait_ns.saturating_sub(a.wait_ns)),
        b.voluntary_cs.saturating_sub(a.voluntary_cs),
        b.involuntary_cs.saturating_sub(a.involuntary_cs),
        b.rss_kb / 1024
    ))
}

/// The cgroup's counters over [from, to] (monotonic ns), from the readings around it.
pub(crate) fn cg_window(raw: &[Raw], from: Nanos, to: Nanos) -> Option<CgWindow> {
    super::cgroup::window(&cg_readings(raw), from, to)
}

/// The host's steal time over the trace, as the analysis takes it (`Analyzer::host_readings`).
pub(crate) fn steal_readings(raw: &[Raw]) -> Vec<(Nanos, u64)> {
    raw.iter().map(|r| (r.mono, r.steal_ns)).collect()
}

/// The cgroup's readings, as the analysis takes them (`analyze::limits::CgEvidence`).
pub(crate) fn cg_readings(raw: &[Raw]) -> Vec<(Nanos, CgRaw)> {
    raw.iter().map(|r| (r.mono, r.cg)).collect()
}

/// "{what} (200 ms of readings): the cgroup was throttled 62.0 ms in 1 period, 3 memory.high
/// events; pressure (share of the time some task waited): cgroup cpu 61%, io 0%, memory 0%;
/// host cpu 35%, io 2%, memory 0%".
pub(crate) fn cg_note(cg: &Cgroup, w: &CgWindow, what: &str) -> String {
    let d = &w.delta;
    let mut parts = vec![];
    if !cg.path.is_empty() {
        parts.push(format!(
            "the cgroup was throttled {:.1} ms in {} period{} (cpu.stat)",
            d.throttled_ns as f64 / 1e6,
            d.nr_throttled,
            crate::units::plural(d.nr_throttled)
        ));
        for (n, name) in [
            (d.mem_high, "memory.high event"),
            (d.mem_max, "memory.max event"),
            (d.failcnt, "memory.failcnt charge"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {name}{}", crate::units::plural(n)));
            }
        }
    }
    if let Some(p) = cg.pressure(w) {
        let words = |s: &crate::report::PressureShares| {
            format!(
                "cpu {:.0}%, io {:.0}%, memory {:.0}%",
                s.cpu_some_pct, s.io_some_pct, s.memory_some_pct
            )
        };
        let mut pr = vec![];
        if let Some(c) = &p.cgroup {
            pr.push(format!("cgroup {}", words(c)));
        }
        if let Some(h) = &p.host {
            pr.push(format!("host {}", words(h)));
        }
        parts.push(format!(
            "pressure (share of the time some task waited): {}",
            pr.join("; ")
        ));
    }
    format!(
        "{what} ({:.0} ms of readings): {}",
        w.span_ns as f64 / 1e6,
        parts.join(", ")
    )
}

/// The cgroup's part of a live report from the sampler's readings (`origin`: the monotonic
/// time of the report's `at_us` 0): `report.cgroup`, the trace's pressure in `report.host`,
/// a note on the longest stalls. Returns each stall's window, the input of the rules that
/// read the cgroup (`analyze::limits`).
pub(crate) fn add_cgroup(
    report: &mut Report,
    cg: &Cgroup,
    limits: CgroupLimits,
    raw: &[Raw],
    origin: Nanos,
) -> Vec<Option<CgWindow>> {
    let (Some(first), Some(last)) = (raw.first(), raw.last()) else {
        return vec![None; report.stalls.len()];
    };
    report.live.cgroup = cg.report(limits, &first.cg, &last.cg);
    let whole = cg_window(raw, first.mono, last.mono);
    let windows: Vec<Option<CgWindow>> = report
        .stalls
        .iter()
        .map(|s| {
            let from = origin + s.at_us * 1000;
            cg_window(raw, from, from + s.duration_us * 1000)
        })
        .collect();
    let mut longest: Vec<usize> = (0..report.stalls.len()).collect();
    longest.sort_by_key(|i| std::cmp::Reverse(report.stalls[*i].duration_us));
    let mut notes = vec![];
    for i in longest.into_iter().take(3) {
        let s = &report.stalls[i];
        if let Some(w) = &windows[i] {
            let what = format!(
                "during the {:.1} ms {} stall of {} at {}",
                s.duration_us as f64 / 1000.0,
                s.syscall.as_deref().unwrap_or("gap"),
                s.who.thread,
                s.ts
            );
            notes.push(cg_note(cg, w, &what));
        }
    }
    if let Some(w) = &whole {
        notes.push(cg_note(cg, w, "whole trace"));
    }
    if let Some(h) = &mut report.live.host {
        h.pressure = whole.as_ref().and_then(|w| cg.pressure(w));
        h.notes.extend(notes);
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_bounded_window_of_this_process() {
        let me = std::process::id();
        let h = Sampler::start(me, INTERVAL, Keep::Last(Duration::from_millis(300)));
        let t0 = crate::clock::now_mono();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // Poll until the queue is full (the bound is 5 readings), however slow the machine.
        let mut got = vec![];
        while std::time::Instant::now() < deadline {
            got = h.window(Nanos::MIN / 2, Nanos::MAX / 2);
            if got.len() >= 5 && got.first().unwrap().mono > t0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        h.finish();
        assert_eq!(got.len(), 5, "{got:?}");
        assert!(got.windows(2).all(|w| w[0].mono < w[1].mono));
        assert!(got.iter().all(|r| r.rss_kb > 0 && r.run_ns > 0));
        let s = samples(&got, got[0].mono);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].at_us, 0);
        assert!(s.iter().all(|x| (0.0..=100.0).contains(&x.iowait_pct)));
        let note = sched_note(&got, got[1].mono, got[3].mono, "during the stall").unwrap();
        assert!(note.contains("waited") && note.contains("RSS"), "{note}");
    }

    /// Attach's use: every reading until the end, whose rates show the process's faults.
    #[test]
    fn keeps_every_reading_until_finished() {
        let me = std::process::id();
        let t0 = crate::clock::now_mono();
        let s = Sampler::start(me, Duration::from_millis(20), Keep::All);
        // Touch fresh memory so minor faults happen.
        let v: Vec<u8> = vec![1; 8 << 20];
        std::thread::sleep(Duration::from_millis(120));
        let raw = s.finish();
        assert!(raw.len() >= 4, "{}", raw.len());
        let samples = samples(&raw, t0);
        assert!(samples.iter().all(|s| s.at_us >= 0));
        assert!(samples
            .iter()
            .all(|s| s.iowait_pct >= 0.0 && s.iowait_pct <= 100.0));
        assert!(samples.iter().any(|s| s.minflt_per_s > 0.0));
        assert!(v.iter().map(|b| *b as u64).sum::<u64>() > 0);
    }

    /// Past `KEEP_ALL_MAX` every other reading goes, the first and the latest stay, and the
    /// step stays even from then on.
    #[test]
    fn keeping_all_thins_past_the_bound() {
        let mut k = Kept::new(Keep::All, INTERVAL);
        let r = |i: usize| Raw {
            mono: i as Nanos,
            ..Default::default()
        };
        let n = KEEP_ALL_MAX + 12;
        for i in 0..n {
            k.push(r(i));
        }
        assert_eq!(k.every, 2);
        assert_eq!(k.raw.front().map(|r| r.mono), Some(0));
        let step: Vec<Nanos> = k
            .raw
            .iter()
            .zip(k.raw.iter().skip(1))
            .map(|(a, b)| b.mono - a.mono)
            .collect();
        assert!(
            step.iter().all(|s| *s == 2),
            "{:?}",
            &step[step.len() - 4..]
        );
        assert!(k.raw.len() <= KEEP_ALL_MAX / 2 + 6, "{}", k.raw.len());
        // The latest reading is the one not kept yet: it ends the axis at finish.
        assert_eq!(k.unkept.map(|r| r.mono), Some(n as Nanos - 1));
    }

    #[test]
    fn keeping_the_last_is_bounded() {
        let mut k = Kept::new(Keep::Last(Duration::from_millis(300)), INTERVAL);
        for i in 0..50 {
            k.push(Raw {
                mono: i,
                ..Default::default()
            });
        }
        let kept: Vec<Nanos> = k.raw.iter().map(|r| r.mono).collect();
        assert_eq!(kept, vec![45, 46, 47, 48, 49]);
    }

    #[test]
    fn notes_take_the_readings_around_the_window() {
        let r = |mono, run_ns, wait_ns| Raw {
            mono,
            run_ns,
            wait_ns,
            rss_kb: 2048,
            ..Default::default()
        };
        let raw = [
            r(0, 0, 0),
            r(100_000_000, 10_000_000, 0),
            r(200_000_000, 10_000_000, 80_000_000),
        ];
        let n = sched_note(&raw, 150_000_000, 160_000_000, "x").unwrap();
        assert!(
            n.contains("ran 0.0 ms") && n.contains("waited 80.0 ms"),
            "{n}"
        );
        assert!(n.contains("RSS 2 MB"), "{n}");
    }
}
