//! The rules that read the traced process's cgroup over each stall (live only): its memory
//! limit hit (`memory-reclaim`, from memory.events high/max, v1's failcnt, the cgroup's own
//! direct reclaim) where the backend's split does not measure the thread's own reclaim time,
//! and, where it does not measure the throttled time, the quota's throttling estimated from
//! the cgroup's `cpu.stat` over the readings around the stall (`cpu-throttled`); both said
//! to be inferred, never critical. Where the split measures the reclaim (`findings` names
//! the stall from it), the cgroup's readings only add the limit and what was charged.
//! Their input is `CgEvidence`: the limits and the readings the /proc sampler took.

use super::stalls::Cand;
use crate::event::Nanos;
use crate::live::cgroup::{window, CgRaw, CgWindow};
use crate::report::{CgroupLimits, FindingId};
use crate::units::human;

/// The cgroup as the analysis sees it: its limits at the start, and its counters over the
/// trace (monotonic ns, as the events' timestamps).
#[derive(Clone, Debug, Default)]
pub struct CgEvidence {
    pub limits: CgroupLimits,
    pub readings: Vec<(Nanos, CgRaw)>,
    /// The backend measures each stall's throttled time (`Capabilities::splits_throttle`):
    /// no estimate is made from the readings.
    pub exact_throttle: bool,
    /// The CPU burst file the kernel has for the cgroup (`cpu.max.burst`, v1
    /// `cpu.cfs_burst_us`), None where it has none.
    pub burst_file: Option<&'static str>,
}

impl CgEvidence {
    fn window(&self, c: &Cand) -> Option<CgWindow> {
        window(&self.readings, c.start, c.start + c.dur)
    }
}

/// A stall no other rule names as well may be the cgroup's doing: the verdict amended
/// (`v`: the other rules' verdict; `throttled`: the split measured the throttled part).
pub(crate) fn amend(
    ev: &CgEvidence,
    c: &Cand,
    v: (Option<FindingId>, String),
) -> (Option<FindingId>, String) {
    let Some(w) = ev.window(c) else {
        return v;
    };
    let (id, mut text) = v;
    let open = matches!(
        id,
        None | Some(
            FindingId::Command | FindingId::Unexplained | FindingId::OffCpu | FindingId::OwnWork
        )
    );
    let measured = c.sched.is_some_and(|s| s.throttled_ns.is_some());
    if !ev.exact_throttle && !measured {
        let part = (w.delta.throttled_ns as i64).min(c.dur);
        let took = part * 2 >= c.dur;
        if took && (open || id == Some(FindingId::CpuStarvation)) {
            text.push_str(&format!(
                "; {}",
                estimate_words(&ev.limits, part, c.dur, &w)
            ));
            return (Some(FindingId::CpuThrottled), text);
        }
    }
    let reclaim_ns = c.sched.and_then(|s| s.reclaim_ns);
    if id == Some(FindingId::MemoryReclaim) && reclaim_ns.is_some() {
        // Measured: the readings say which limit, and what was charged against it.
        if w.delta.reclaimed() {
            text.push_str(&format!(
                "; the cgroup's counters {}",
                counts_words(&ev.limits, &w)
            ));
        } else {
            text.push_str(&format!("; {}", charged_words(&ev.limits, &w.delta)));
        }
        return (id, text);
    }
    if w.delta.reclaimed() {
        let words = reclaim_words(&ev.limits, &w);
        // The thread's own reclaim was measured and took less than half of the stall: the
        // cgroup's counters around it do not make it the cause.
        if let Some(r) = reclaim_ns {
            text.push_str(&format!(
                " (meanwhile {words}; this thread reclaimed for {} of it)",
                human(r as i64 / 1000)
            ));
            return (id, text);
        }
        if open {
            text.push_str(&format!("; {words}: memory reclaim"));
            return (Some(FindingId::MemoryReclaim), text);
        }
        text.push_str(&format!(" (meanwhile {words})"));
    }
    (id, text)
}

/// "the container's CPU quota of 30 ms per 100 ms throttled the cgroup for 62 ms of this 68 ms
/// stall, estimated from ...".
fn estimate_words(l: &CgroupLimits, part: i64, dur: i64, w: &CgWindow) -> String {
    let quota = l
        .quota()
        .map(|(q, p)| format!(" of {} per {}", human(q as i64), human(p as i64)))
        .unwrap_or_default();
    format!(
        "the container's CPU quota{quota} throttled its cgroup for about {} of this {} stall \
         (cpu-throttled, estimated: the cgroup's cpu.stat throttled time over the {} of readings \
         around the stall, {} throttled period{}; this backend does not measure the thread's own \
         throttled time)",
        human(part / 1000),
        human(dur / 1000),
        human(w.span_ns / 1000),
        w.delta.nr_throttled,
        crate::units::plural(w.delta.nr_throttled)
    )
}

/// "the cgroup hit its memory limit (memory.high 256 MiB): 3 memory.high events, 1,200 pages
/// reclaimed by its own tasks".
fn reclaim_words(l: &CgroupLimits, w: &CgWindow) -> String {
    let limit = l
        .memory_limit()
        .map(|(name, b)| format!(" ({name} {})", mib(b)))
        .unwrap_or_default();
    format!(
        "the cgroup hit its memory limit{limit} {}",
        counts_words(l, w)
    )
}

/// "in the 200 ms of readings around it: 3 memory.high events; charged after it: ...".
fn counts_words(l: &CgroupLimits, w: &CgWindow) -> String {
    let d = &w.delta;
    let mut what = vec![];
    for (n, name) in [
        (d.mem_high, "memory.high event"),
        (d.mem_max, "memory.max event"),
        (d.failcnt, "memory.failcnt charge"),
        (d.direct_reclaimed_pages, "page reclaimed by its own tasks"),
    ] {
        if n > 0 {
            what.push(format!("{n} {name}{}", crate::units::plural(n)));
        }
    }
    format!(
        "in the {} of readings around it: {}; {}",
        human(w.span_ns / 1000),
        what.join(", "),
        charged_words(l, d)
    )
}

/// "charged after it: 47 MiB of the limit's 48 MiB, 9 MiB anonymous, 38 MiB page cache (the
/// AOF's, RDB's and log's pages among it)", from a reading (levels, not deltas).
fn charged_words(l: &CgroupLimits, r: &CgRaw) -> String {
    let of = l
        .memory_limit()
        .map(|(_, b)| format!(" of the limit's {}", mib(b)))
        .unwrap_or_default();
    format!(
        "charged after it: {}{of}, {} anonymous (redis's data, buffers), {} page cache (the AOF's, \
         RDB's and log's pages among it)",
        mib(r.usage),
        mib(r.anon),
        mib(r.file)
    )
}

pub(crate) fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
}
