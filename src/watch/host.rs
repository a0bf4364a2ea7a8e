//! `watch`'s /proc history: what `attach` samples every 100 ms for its report (page faults,
//! disk I/O of redis, the system's iowait), plus the main thread's scheduling
//! (/proc/PID/schedstat: time on a CPU and waiting for one), context switches and resident
//! memory (/proc/PID/status), kept for the last minute or so in a bounded queue, so that each
//! incident report carries the samples of its own window. `attach` keeps every sample
//! until the end; a watcher running for days cannot, and needs only the window of the
//! incident it is writing.

use crate::event::{Nanos, Tid};
use crate::report::HostSample;
use procfs::process::Process;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often /proc is read (as `attach` does).
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// One reading of /proc (counters, not rates).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Raw {
    pub mono: Nanos,
    pub minflt: u64,
    pub majflt: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub cpu_total: u64,
    pub cpu_iowait: u64,
    /// Main thread: ns on a CPU and ns runnable but waiting for one (schedstat).
    pub run_ns: u64,
    pub wait_ns: u64,
    pub voluntary_cs: u64,
    pub involuntary_cs: u64,
    pub rss_kb: u64,
}

fn cpu_times() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user/nice).
    Some((v.iter().take(8).sum(), *v.get(4)?))
}

fn read_raw(p: &Process) -> Option<Raw> {
    // stat is the one that must be there: without it the process is gone.
    let st = p.stat().ok()?;
    let io = p.io().ok();
    let sched = p.schedstat().ok();
    let status = p.status().ok();
    let (cpu_total, cpu_iowait) = cpu_times().unwrap_or((0, 0));
    Some(Raw {
        mono: crate::live::now_mono(),
        minflt: st.minflt,
        majflt: st.majflt,
        read_bytes: io.as_ref().map_or(0, |i| i.read_bytes),
        write_bytes: io.as_ref().map_or(0, |i| i.write_bytes),
        cpu_total,
        cpu_iowait,
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
    })
}

/// The sampler thread of one attachment and its bounded history.
pub(crate) struct HostRing {
    stop: Arc<AtomicBool>,
    data: Arc<Mutex<VecDeque<Raw>>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl HostRing {
    /// Samples `pid` every `INTERVAL`, keeping the last `keep` of readings.
    pub(crate) fn start(pid: Tid, keep: Duration) -> HostRing {
        let stop = Arc::new(AtomicBool::new(false));
        let most = (keep.as_nanos() / INTERVAL.as_nanos()) as usize + 2;
        let data = Arc::new(Mutex::new(VecDeque::with_capacity(most)));
        let (s, d) = (stop.clone(), data.clone());
        let handle = std::thread::Builder::new()
            .name("watch-proc".into())
            .spawn(move || {
                let Ok(p) = Process::new(pid as i32) else {
                    return;
                };
                while !s.load(Ordering::SeqCst) {
                    let Some(r) = read_raw(&p) else { break };
                    {
                        let mut q = d.lock().unwrap_or_else(|e| e.into_inner());
                        if q.len() >= most {
                            q.pop_front();
                        }
                        q.push_back(r);
                    }
                    std::thread::sleep(INTERVAL);
                }
            })
            .ok();
        HostRing { stop, data, handle }
    }

    /// The readings from just before `from` to just after `to` (monotonic ns).
    pub(crate) fn window(&self, from: Nanos, to: Nanos) -> Vec<Raw> {
        let iv = INTERVAL.as_nanos() as Nanos;
        let q = self.data.lock().unwrap_or_else(|e| e.into_inner());
        q.iter()
            .filter(|r| r.mono >= from - iv && r.mono <= to + iv)
            .copied()
            .collect()
    }

    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn rate(a: u64, b: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        0.0
    } else {
        b.saturating_sub(a) as f64 / secs
    }
}

/// The report's samples (rates between consecutive readings, `at_us` from `origin`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_bounded_window_of_this_process() {
        let me = std::process::id();
        let h = HostRing::start(me, Duration::from_millis(300));
        let t0 = crate::live::now_mono();
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
        h.stop();
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
