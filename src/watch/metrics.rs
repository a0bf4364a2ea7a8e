//! `watch`'s Prometheus/OpenMetrics endpoint: the counters and histograms the watch loop
//! updates, and the small HTTP server that serves them on `--metrics ADDR`. Label values
//! come only from closed sets (thread roles, stall kinds, file classes, finding ids,
//! syscall names, command names capped in number): never pids, paths, keys or values.

use crate::event::{Event, EventKind, Extra, Nanos};
use crate::fdtable::FileClass;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustc_hash::FxHashMap as HashMap;
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// 10 µs to 10 s, 1-2.5-5 per decade: the threshold people pick (1 ms, 10 ms, 100 ms) is
/// always a bucket edge.
pub(crate) const BUCKETS: [f64; 19] = [
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `BUCKETS` in ns: a duration of `d` ns falls in the first bucket whose bound is >= `d`, as
/// it does in seconds.
const BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

fn histogram() -> Histogram {
    Histogram::default()
}

/// A histogram of durations in ns, encoded as prometheus-client's classic histogram over
/// `BUCKETS`: the watch loop observes one per traced syscall, and the crate's histogram
/// takes a lock and searches its buckets one by one at each. Here an observation is a
/// binary search of integer bounds and two atomic additions; the count is the buckets'
/// sum, so a scrape always sees a `+Inf` bucket equal to the count.
#[derive(Clone, Debug, Default)]
pub(crate) struct Histogram(Arc<HistInner>);

#[derive(Debug, Default)]
struct HistInner {
    sum_ns: AtomicU64,
    /// Per bucket (not cumulative), the last one above every bound (`+Inf`).
    counts: [AtomicU64; BOUNDS_NS.len() + 1],
}

impl Histogram {
    #[cfg(test)]
    pub(crate) fn observe_ns(&self, ns: u64) {
        let i = bucket_of(ns);
        self.0.counts[i].fetch_add(1, Ordering::Relaxed);
        self.0.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Adds what `local` gathered and empties it.
    fn take_in(&self, local: &mut Unpublished) {
        for (c, n) in self.0.counts.iter().zip(local.counts.iter_mut()) {
            if *n > 0 {
                c.fetch_add(std::mem::take(n), Ordering::Relaxed);
            }
        }
        self.0
            .sum_ns
            .fetch_add(std::mem::take(&mut local.sum_ns), Ordering::Relaxed);
        local.any = false;
    }
}

fn bucket_of(ns: u64) -> usize {
    BOUNDS_NS.partition_point(|b| *b < ns)
}

impl Unpublished {
    #[inline]
    fn add(&mut self, ns: u64) {
        self.counts[bucket_of(ns)] += 1;
        self.sum_ns += ns;
        self.any = true;
    }
}

/// Observations of one histogram not yet added to its shared counters: the watch loop
/// observes one per traced syscall, and two atomic additions each (locked instructions)
/// were a visible part of its CPU per record. They are added at each drain of the loop
/// (`Observer::publish`, a few times a second), long before a scrape needs them.
#[derive(Default)]
struct Unpublished {
    counts: [u64; BOUNDS_NS.len() + 1],
    sum_ns: u64,
    any: bool,
}

impl prometheus_client::metrics::TypedMetric for Histogram {
    const TYPE: prometheus_client::metrics::MetricType =
        prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for Histogram {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut buckets = [(0.0, 0u64); BOUNDS_NS.len() + 1];
        let mut count = 0;
        for (i, b) in buckets.iter_mut().enumerate() {
            let n = self.0.counts[i].load(Ordering::Relaxed);
            *b = (BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), n);
            count += n;
        }
        let sum = self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        <Self as prometheus_client::metrics::TypedMetric>::TYPE
    }
}

/// The instance a series is about: its listening address (and, later, its container's
/// name), never a pid (`fleet::instance_label`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InstanceLabel {
    pub instance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StallLabels {
    pub instance: String,
    pub role: String,
    pub kind: String,
    pub file_class: String,
    pub finding: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyscallLabels {
    instance: String,
    syscall: &'static str,
    file_class: &'static str,
}

/// Why an incident's stalls are in no report: a closed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UnreportedLabels {
    pub instance: String,
    pub reason: &'static str,
}

/// Over `--max-incidents-per-hour`.
pub(crate) const RATE_LIMIT: &str = "rate_limit";
/// The writer had its queue full for as long as the history ring held the incident.
pub(crate) const WRITER_BUSY: &str = "writer_busy";
/// The report could not be written (full disk, unwritable --out).
pub(crate) const WRITE_ERROR: &str = "write_error";

/// What escalated the cheap tier to the full one: a closed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EscalationLabels {
    pub instance: String,
    pub trigger: &'static str,
}

/// `stallscope_escalations_total`'s triggers: the cheap tier's stall, redis's LATENCY
/// event, the slow log growing.
pub(crate) const TRIGGERS: [&str; 3] = ["stall", "latency-event", "slowlog"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    instance: String,
    command: String,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type ByInstance<M> = Family<InstanceLabel, M>;
type SecondsCounter = Counter<f64, AtomicU64>;

/// Every per-instance metric family, each labelled by `instance`.
struct Families {
    stalls: Family<StallLabels, Counter>,
    syscalls: HistFamily<SyscallLabels>,
    commands: HistFamily<CommandLabels>,
    lost_events: ByInstance<Counter>,
    attached: ByInstance<Gauge>,
    attaches: ByInstance<Counter>,
    incidents: ByInstance<Counter>,
    incidents_suppressed: ByInstance<Counter>,
    incident_errors: ByInstance<Counter>,
    unreported: Family<UnreportedLabels, Counter>,
    escalations: Family<EscalationLabels, Counter>,
    write_seconds: ByInstance<SecondsCounter>,
    write_cpu_seconds: ByInstance<SecondsCounter>,
    event_log_errors: ByInstance<Counter>,
    ring_evicted: ByInstance<Counter>,
    ring_bytes: ByInstance<Gauge>,
    /// What each watched instance's cgroup limits did (read at each scrape).
    cgroup: CgroupMetrics,
}

/// `stallscope_cgroup_memory_events_total`'s labels: the instance, and the event, from a
/// closed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CgroupEventLabels {
    instance: String,
    event: &'static str,
}

const MEMORY_EVENTS: [&str; 4] = ["high", "max", "oom", "failcnt"];

/// Each watched instance's cgroup (its container), as the cgroup's own counters say
/// (`live::cgroup`): its CPU quota's throttling and its memory limit's events, added at each
/// scrape by what they did since the last one. No label names the cgroup (a path is no label
/// value): the instance label says whose it is.
struct CgroupMetrics {
    periods: ByInstance<Counter>,
    throttled_periods: ByInstance<Counter>,
    throttled_seconds: ByInstance<SecondsCounter>,
    memory_events: Family<CgroupEventLabels, Counter>,
    reclaimed_pages: ByInstance<Counter>,
    /// By instance label: the cgroup followed and its counters when last published.
    followed: Mutex<HashMap<String, (crate::live::cgroup::Cgroup, crate::live::cgroup::CgRaw)>>,
}

impl CgroupMetrics {
    fn register(r: &mut Registry) -> Self {
        CgroupMetrics {
            periods: reg(r, "cgroup_cpu_periods", "CFS periods of the instance's cgroup with runnable tasks (cpu.stat nr_periods)", Family::default()),
            throttled_periods: reg(r, "cgroup_cpu_throttled_periods", "Periods in which the instance's cgroup's CPU quota ran out and its tasks were stopped (cpu.stat nr_throttled)", Family::default()),
            throttled_seconds: reg(r, "cgroup_cpu_throttled_seconds", "Time the instance's cgroup's tasks were stopped by its CPU quota, summed over its CPUs (cpu.stat throttled_time / throttled_usec)", Family::default()),
            memory_events: reg(r, "cgroup_memory_events", "The instance's cgroup at its memory limit: memory.events high (over memory.high: reclaimed and throttled), max (at memory.max), oom (cgroup v2), failcnt (a v1 charge that hit memory.limit_in_bytes)", Family::default()),
            reclaimed_pages: reg(r, "cgroup_memory_direct_reclaimed_pages", "Pages the instance's cgroup's own tasks reclaimed (v2 memory.stat pgsteal_direct)", Family::default()),
            followed: Mutex::new(HashMap::default()),
        }
    }

    /// Adds what every followed cgroup's counters did since the last scrape.
    fn publish(&self) {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        for (label, (cg, last)) in followed.iter_mut() {
            let now = cg.read();
            let d = now.since(last);
            *last = now;
            let l = InstanceLabel {
                instance: label.clone(),
            };
            self.periods.get_or_create(&l).inc_by(d.nr_periods);
            self.throttled_periods
                .get_or_create(&l)
                .inc_by(d.nr_throttled);
            self.throttled_seconds
                .get_or_create(&l)
                .inc_by(d.throttled_ns as f64 / 1e9);
            let events = [d.mem_high, d.mem_max, d.mem_oom, d.failcnt];
            for (event, n) in MEMORY_EVENTS.into_iter().zip(events) {
                let e = CgroupEventLabels {
                    instance: label.clone(),
                    event,
                };
                self.memory_events.get_or_create(&e).inc_by(n);
            }
            self.reclaimed_pages
                .get_or_create(&l)
                .inc_by(d.direct_reclaimed_pages);
        }
    }

    /// Stops following instance `label`'s cgroup and drops its series (it is gone).
    fn drop_instance(&self, label: &str) {
        self.follow(label, None);
        let l = InstanceLabel {
            instance: label.to_string(),
        };
        self.periods.remove(&l);
        self.throttled_periods.remove(&l);
        self.throttled_seconds.remove(&l);
        self.reclaimed_pages.remove(&l);
        for event in MEMORY_EVENTS {
            self.memory_events.remove(&CgroupEventLabels {
                instance: label.to_string(),
                event,
            });
        }
    }

    /// Instance `label`'s cgroup from now on (counted from now: a restarted redis adds only
    /// what happens while it is watched); None stops following it, what it did until now
    /// kept.
    fn follow(&self, label: &str, cg: Option<crate::live::cgroup::Cgroup>) {
        self.publish();
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        match cg {
            Some(c) => {
                let now = c.read();
                followed.insert(label.to_string(), (c, now));
            }
            None => {
                followed.remove(label);
            }
        }
    }
}

/// Every metric, cheap to clone (handles share their values): the per-instance families
/// and the watcher's own cost.
#[derive(Clone)]
pub(crate) struct Metrics {
    registry: Arc<Registry>,
    fam: Arc<Families>,
    /// Instances attached now.
    pub instances: Gauge,
    cpu: SecondsCounter,
    rss: Gauge,
    /// CPU seconds already added to `cpu` (it is a counter, fed by differences).
    cpu_seen: Arc<Mutex<f64>>,
}

/// Registers `m` under `name` and returns it, for `Metrics` to keep a handle.
fn reg<M: prometheus_client::registry::Metric + Clone>(
    r: &mut Registry,
    name: &str,
    help: &str,
    m: M,
) -> M {
    r.register(name, help, m.clone());
    m
}

/// The families of what the watch loop counts per instance: stalls, calls, commands, what
/// the tracer lost, attachment.
fn register_watch(r: &mut Registry) -> [Family<InstanceLabel, Counter>; 2] {
    let lost = reg(
        r,
        "lost_events",
        "Syscall records the kernel dropped (ring buffer full; with one bpf ring for every instance, each instance counts every drop of it)",
        Family::default(),
    );
    let attaches = reg(
        r,
        "attaches",
        "Times the watcher attached to the instance (more than 1: it restarted)",
        Family::default(),
    );
    [lost, attaches]
}

/// The families of the incident writer's and the ring's health, per instance.
fn register_incidents(r: &mut Registry) -> [Family<InstanceLabel, Counter>; 5] {
    let incidents = reg(
        r,
        "incidents",
        "Incident reports written",
        Family::default(),
    );
    let suppressed = reg(
        r,
        "incidents_suppressed",
        "Incidents not written: over --max-incidents-per-hour, or the writer was still busy",
        Family::default(),
    );
    let errors = reg(
        r,
        "incident_write_errors",
        "Incident reports that could not be written (full disk, unwritable --out)",
        Family::default(),
    );
    let event_log_errors = reg(
        r,
        "event_log_errors",
        "Stall lines that could not be written to --events",
        Family::default(),
    );
    let ring_evicted = reg(r, "ring_evicted_early", "Events dropped from the history ring while still wanted (--before, plus 10 s for long stalls): --ring-size is too small for the load", Family::default());
    [
        incidents,
        suppressed,
        errors,
        event_log_errors,
        ring_evicted,
    ]
}

/// The writer's time, per instance.
fn register_writer(r: &mut Registry) -> [ByInstance<SecondsCounter>; 2] {
    let wall = reg(
        r,
        "incident_write_seconds",
        "Wall time the incident writer spent making reports (analysis, HTML, JSON, recording)",
        Family::default(),
    );
    let cpu = reg(
        r,
        "incident_write_cpu_seconds",
        "CPU time of the incident writer thread over the reports it made",
        Family::default(),
    );
    [wall, cpu]
}

impl Families {
    fn register(r: &mut Registry) -> Families {
        let stalls = reg(r, "stalls", "Stalls over the threshold, by instance, thread role, kind (slow_syscall or gap), file class and finding", Family::<StallLabels, Counter>::default());
        let syscalls: HistFamily<SyscallLabels> = reg(
            r,
            "syscall_duration_seconds",
            "Traced syscall durations by instance, syscall and file class",
            Family::new_with_constructor(histogram),
        );
        let commands: HistFamily<CommandLabels> = reg(r, "command_duration_seconds", "Command latency inside redis, by instance, from the request's read to the reply's write (backends that see buffers: bpf, ptrace)", Family::new_with_constructor(histogram));
        let [lost_events, attaches] = register_watch(r);
        let attached = reg(
            r,
            "attached",
            "1 while the watcher traces the instance, 0 once it is gone (its other series are then dropped; this one 10 minutes after it left, unless it came back)",
            Family::default(),
        );
        let [incidents, incidents_suppressed, incident_errors, event_log_errors, ring_evicted] =
            register_incidents(r);
        let unreported = reg(r, "stalls_not_reported", "Stalls over the threshold (counted in stallscope_stalls_total) in no incident report, by reason: rate_limit, writer_busy (the incident waited for the writer until the history ring dropped its first stall), write_error", Family::<UnreportedLabels, Counter>::default());
        let escalations = reg(r, "escalations", "Times the cheap tier (watch --mode cheap) attached the full tier for an incident, by trigger: stall (the cheap tier found one over the threshold), latency-event (a new LATENCY LATEST event, with --redis), slowlog (the slow log grew, with --redis)", Family::<EscalationLabels, Counter>::default());
        let [write_seconds, write_cpu_seconds] = register_writer(r);
        let ring_bytes = reg(
            r,
            "ring_bytes",
            "Bytes held by the instance's history ring (its share of --ring-size)",
            Family::default(),
        );
        Families {
            stalls,
            syscalls,
            commands,
            lost_events,
            attached,
            attaches,
            incidents,
            incidents_suppressed,
            incident_errors,
            unreported,
            escalations,
            write_seconds,
            write_cpu_seconds,
            event_log_errors,
            ring_evicted,
            ring_bytes,
            cgroup: CgroupMetrics::register(r),
        }
    }
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut r = Registry::with_prefix("stallscope");
        let fam = Families::register(&mut r);
        let instances = reg(
            &mut r,
            "instances",
            "Instances the watcher is attached to now",
            Gauge::default(),
        );
        let cpu = reg(
            &mut r,
            "watcher_cpu_seconds",
            "CPU time (user + system) used by the watcher itself",
            SecondsCounter::default(),
        );
        let rss = reg(
            &mut r,
            "watcher_resident_bytes",
            "Resident memory of the watcher itself",
            Gauge::default(),
        );
        Metrics {
            registry: Arc::new(r),
            fam: Arc::new(fam),
            instances,
            cpu,
            rss,
            cpu_seen: Arc::new(Mutex::new(0.0)),
        }
    }

    /// The handles of instance `label`'s series, created now (at 0) so that an alert on
    /// their rate has them from the start.
    pub(crate) fn instance(&self, label: &str) -> InstanceMetrics {
        let f = &self.fam;
        let l = InstanceLabel {
            instance: label.to_string(),
        };
        let c = |fam: &ByInstance<Counter>| fam.get_or_create_owned(&l);
        let im = InstanceMetrics {
            label: label.to_string(),
            fam: self.fam.clone(),
            lost_events: c(&f.lost_events),
            attached: f.attached.get_or_create_owned(&l),
            attaches: c(&f.attaches),
            incidents: c(&f.incidents),
            incidents_suppressed: c(&f.incidents_suppressed),
            incident_errors: c(&f.incident_errors),
            write_seconds: f.write_seconds.get_or_create_owned(&l),
            write_cpu_seconds: f.write_cpu_seconds.get_or_create_owned(&l),
            event_log_errors: c(&f.event_log_errors),
            ring_evicted: c(&f.ring_evicted),
            ring_bytes: f.ring_bytes.get_or_create_owned(&l),
            created: Arc::default(),
        };
        for reason in [RATE_LIMIT, WRITER_BUSY, WRITE_ERROR] {
            drop(im.unreported(reason));
        }
        for trigger in TRIGGERS {
            drop(im.escalation(trigger));
        }
        im
    }

    /// The OpenMetrics text of every metric, with the watcher's own CPU and memory read now.
    pub(crate) fn encode(&self) -> String {
        if let Some(now) = self_cpu_seconds() {
            let mut seen = self.cpu_seen.lock().unwrap_or_else(|e| e.into_inner());
            if now > *seen {
                self.cpu.inc_by(now - *seen);
                *seen = now;
            }
        }
        if let Some(rss) = self_rss_bytes() {
            self.rss.set(rss as i64);
        }
        self.fam.cgroup.publish();
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// The label sets an instance's labelled families got beyond the one-label ones: what
/// `InstanceMetrics::forget` removes.
#[derive(Default)]
struct Created {
    stalls: Vec<StallLabels>,
    syscalls: Vec<SyscallLabels>,
    commands: Vec<CommandLabels>,
}

/// One instance's series: the handles the watch loop and its writer update.
#[derive(Clone)]
pub(crate) struct InstanceMetrics {
    pub label: String,
    fam: Arc<Families>,
    pub lost_events: Counter,
    pub attached: Gauge,
    pub attaches: Counter,
    pub incidents: Counter,
    pub incidents_suppressed: Counter,
    pub incident_errors: Counter,
    /// The writer's wall and CPU time over the reports it made.
    pub write_seconds: SecondsCounter,
    pub write_cpu_seconds: SecondsCounter,
    pub event_log_errors: Counter,
    pub ring_evicted: Counter,
    pub ring_bytes: Gauge,
    created: Arc<Mutex<Created>>,
}

impl InstanceMetrics {
    /// From now on the instance's cgroup series follow `pid`'s cgroup; None stops them.
    pub(crate) fn watch_cgroup(&self, pid: Option<crate::event::Tid>) {
        let cg = pid.and_then(|p| crate::live::cgroup::Cgroup::of(std::path::Path::new("/"), p));
        self.fam.cgroup.follow(&self.label, cg);
    }

    /// Counts a stall (`l.instance` is filled in).
    pub(crate) fn count_stall(&self, mut l: StallLabels) {
        l.instance.clone_from(&self.label);
        let c = self.fam.stalls.get_or_create_owned(&l);
        if c.get() == 0 {
            let mut cr = self.created.lock().unwrap_or_else(|e| e.into_inner());
            if !cr.stalls.contains(&l) {
                cr.stalls.push(l);
            }
        }
        c.inc();
    }

    /// Stalls over the threshold in no report, for `reason`.
    pub(crate) fn unreported(&self, reason: &'static str) -> Counter {
        self.fam.unreported.get_or_create_owned(&UnreportedLabels {
            instance: self.label.clone(),
            reason,
        })
    }

    /// Escalations to the full tier for `trigger` (one of `TRIGGERS`).
    pub(crate) fn escalation(&self, trigger: &'static str) -> Counter {
        self.fam.escalations.get_or_create_owned(&EscalationLabels {
            instance: self.label.clone(),
            trigger,
        })
    }

    fn syscall_hist(&self, syscall: &'static str, file_class: &'static str) -> Histogram {
        let l = SyscallLabels {
            instance: self.label.clone(),
            syscall,
            file_class,
        };
        let h = self.fam.syscalls.get_or_create_owned(&l);
        let mut cr = self.created.lock().unwrap_or_else(|e| e.into_inner());
        if !cr.syscalls.contains(&l) {
            cr.syscalls.push(l);
        }
        h
    }

    fn command_hist(&self, command: &str) -> Histogram {
        let l = CommandLabels {
            instance: self.label.clone(),
            command: command.to_string(),
        };
        let h = self.fam.commands.get_or_create_owned(&l);
        let mut cr = self.created.lock().unwrap_or_else(|e| e.into_inner());
        if !cr.commands.contains(&l) {
            cr.commands.push(l);
        }
        h
    }

    /// The instance is gone: its cgroup is no longer followed and the cgroup's series go (the
    /// container may live on, or its cgroup be reused, and count under a label that no longer
    /// stands for a watched redis). Its other series stay at their last values, no longer
    /// growing, until `forget` (a restart under the same label goes on with them).
    pub(crate) fn leave(&self) {
        self.fam.cgroup.drop_instance(&self.label);
    }

    /// Drops every series of this instance from what a scrape shows (it left a while ago).
    pub(crate) fn forget(&self) {
        self.fam.attached.remove(&InstanceLabel {
            instance: self.label.clone(),
        });
        let f = &self.fam;
        f.cgroup.drop_instance(&self.label);
        let l = InstanceLabel {
            instance: self.label.clone(),
        };
        for fam in [
            &f.lost_events,
            &f.attaches,
            &f.incidents,
            &f.incidents_suppressed,
            &f.incident_errors,
            &f.event_log_errors,
            &f.ring_evicted,
        ] {
            fam.remove(&l);
        }
        f.ring_bytes.remove(&l);
        f.write_seconds.remove(&l);
        f.write_cpu_seconds.remove(&l);
        for reason in [RATE_LIMIT, WRITER_BUSY, WRITE_ERROR] {
            f.unreported.remove(&UnreportedLabels {
                instance: self.label.clone(),
                reason,
            });
        }
        for trigger in TRIGGERS {
            f.escalations.remove(&EscalationLabels {
                instance: self.label.clone(),
                trigger,
            });
        }
        let cr = std::mem::take(&mut *self.created.lock().unwrap_or_else(|e| e.into_inner()));
        for s in &cr.stalls {
            f.stalls.remove(s);
        }
        for s in &cr.syscalls {
            f.syscalls.remove(s);
        }
        for c in &cr.commands {
            f.commands.remove(c);
        }
    }
}

fn self_cpu_seconds() -> Option<f64> {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(tv(ru.ru_utime) + tv(ru.ru_stime))
}

/// CPU seconds of the calling thread.
pub(crate) fn thread_cpu_seconds() -> f64 {
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes into the struct it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// VmRSS of this process, in bytes.
pub(crate) fn self_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Command names become label values only while there are few of them: a client sending
/// garbage must not grow the label set.
const MAX_COMMANDS: usize = 256;

/// The watch loop's side of the metrics: per-event observation with the label handles
/// cached (a family lookup per syscall would take a lock and hash a label set), and the
/// request-to-reply timing of commands for backends that see buffers.
pub(crate) struct Observer {
    m: InstanceMetrics,
    by_call: HashMap<(usize, FileClass), (Histogram, Unpublished)>,
    by_cmd: HashMap<Box<str>, (Histogram, Unpublished)>,
    /// Client fd -> (command name, when its request was read). The first command of a
    /// read is timed: pipelined ones after it share its reply writes.
    pending: HashMap<i32, (CmdName, Nanos)>,
}

impl Observer {
    pub(crate) fn new(m: InstanceMetrics) -> Observer {
        Observer {
            m,
            by_call: HashMap::default(),
            by_cmd: HashMap::default(),
            pending: HashMap::default(),
        }
    }

    /// Adds the syscall and command observations gathered since the last call to the
    /// metrics a scrape reads.
    pub(crate) fn publish(&mut self) {
        for (h, local) in self.by_call.values_mut().chain(self.by_cmd.values_mut()) {
            if local.any {
                h.take_in(local);
            }
        }
    }

    /// A new process (restart): the fds of the old one mean nothing.
    pub(crate) fn reset_process(&mut self) {
        self.pending.clear();
    }

    /// One traced event; `class` is what its fd argument was, as the analyzer's fd table
    /// resolved it.
    pub(crate) fn observe(&mut self, ev: &Event, class: Option<FileClass>) {
        let EventKind::Syscall(sc) = &ev.kind else {
            return;
        };
        let Some(dur) = sc.dur else { return };
        let class = class.unwrap_or(FileClass::Unknown);
        let key = (sc.name.as_ptr() as usize, class);
        let m = &self.m;
        let (_, local) = self.by_call.entry(key).or_insert_with(|| {
            (
                m.syscall_hist(sc.name, class.as_str()),
                Unpublished::default(),
            )
        });
        local.add(dur.max(0) as u64);
        let Some(fd) = sc.fd else { return };
        if sc.sys.facts.has(crate::syscalls::Facts::CLOSE) {
            self.pending.remove(&fd);
            return;
        }
        if class != FileClass::Client {
            return;
        }
        let Extra::Data(data) = &sc.extra else {
            return;
        };
        let facts = sc.sys.facts;
        use crate::syscalls::Facts;
        if facts.has(Facts::RECV) {
            if sc.ret.val().is_some_and(|n| n > 0) {
                if let Some(name) = command_name(data.head().bytes()) {
                    self.pending.entry(fd).or_insert((name, ev.ts));
                }
            }
        } else if facts.has(Facts::SEND) {
            if let Some((name, at)) = self.pending.remove(&fd) {
                let ns = (ev.end() - at).max(0) as u64;
                if let Some((_, local)) = self.by_cmd.get_mut(&*name) {
                    local.add(ns);
                } else if self.by_cmd.len() < MAX_COMMANDS {
                    let h = m.command_hist(&name);
                    let mut local = Unpublished::default();
                    local.add(ns);
                    self.by_cmd.insert((&*name).into(), (h, local));
                }
            }
        }
    }
}

/// The command name of a RESP request, upper-cased: the first name the analysis's decoder
/// takes (`resp::first_command`, one rule for the report, the metrics and recordings).
pub(crate) fn command_name(b: &[u8]) -> Option<CmdName> {
    let name = crate::analyze::resp::first_command(b)?;
    let mut c = CmdName {
        len: name.len() as u8,
        buf: [0; crate::analyze::resp::NAME_MAX],
    };
    c.buf[..name.len()].copy_from_slice(name);
    c.buf.make_ascii_uppercase();
    Some(c)
}

/// A command name as `command_name` takes it (ASCII, at most 32 bytes), kept inline: one
/// is taken from nearly every client request, and a heap string each was a visible part of
/// the watcher's own CPU.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct CmdName {
    len: u8,
    buf: [u8; crate::analyze::resp::NAME_MAX],
}

impl std::ops::Deref for CmdName {
    type Target = str;
    fn deref(&self) -> &str {
        // Only ASCII letters, digits and `_-|.` are ever stored.
        std::str::from_utf8(&self.buf[..self.len as usize]).unwrap_or("")
    }
}

impl std::fmt::Debug for CmdName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl std::fmt::Display for CmdName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

/// `--metrics`: `127.0.0.1:9323`, `[::1]:9323`, or a bare port / `:PORT` on loopback.
pub(crate) fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    let t = s.trim();
    let port_only = t.strip_prefix(':').unwrap_or(t);
    if let Ok(p) = port_only.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], p)));
    }
    t.parse()
        .map_err(|_| format!("{s:?} is not an address: use 127.0.0.1:9323 or :9323"))
}

/// Connections served at once at most: each has a thread of its own for at most
/// `REQUEST_DEADLINE` of reading plus its write; past this many, a new one is closed at once.
const MAX_CONNS: usize = 32;
/// The whole request (line and headers) must come within this: an idle or slow connection
/// (a port scan, a half-open socket) holds its own thread that long, never the listener.
const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_millis(1000);

/// Serves `GET /metrics` on a thread of its own until the process ends. Each connection
/// is read and answered on a thread of its own, with a deadline for its request: an idle
/// or slow client cannot delay another one's scrape (the listener only accepts).
pub(crate) fn serve(listener: std::net::TcpListener, m: Metrics) {
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(s) = conn else { continue };
                if live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNS {
                    live.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                let (m, live2) = (m.clone(), live.clone());
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .stack_size(256 << 10)
                    .spawn(move || {
                        answer(s, &m);
                        live2.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    live.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })
        .expect("spawn the metrics thread");
}

/// Reads the request line and headers of one connection (within `REQUEST_DEADLINE`, at
/// most 16 KiB) and answers it.
fn answer(mut s: std::net::TcpStream, m: &Metrics) {
    let t0 = std::time::Instant::now();
    let _ = s.set_write_timeout(Some(std::time::Duration::from_secs(5)));
    let mut r = BufReader::new(match s.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    let mut h = String::new();
    let mut total = 0;
    loop {
        let left = REQUEST_DEADLINE.saturating_sub(t0.elapsed());
        if left.is_zero() || total > 16 << 10 {
            break;
        }
        let _ = s.set_read_timeout(Some(left));
        h.clear();
        match r.read_line(&mut h) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
        if line.is_empty() {
            line = std::mem::take(&mut h);
        } else if h == "\r\n" || h == "\n" {
            break;
        }
    }
    if line.is_empty() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            m.encode(),
        ),
        ("GET", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "stallscope watch: metrics at /metrics\n".to_string(),
        ),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: try /metrics\n".to_string(),
        ),
    };
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_names_from_requests() {
        assert_eq!(
            command_name(b"*3\r\n$3\r\nset\r\n$1\r\nk\r\n").as_deref(),
            Some("SET")
        );
        assert_eq!(command_name(b"PING\r\n").as_deref(), Some("PING"));
        assert_eq!(
            command_name(b"*1\r\n$5\r\nDEBUG"),
            None,
            "cut before its end"
        );
        assert_eq!(command_name(b"*2\r\n$4\r\n\x01\x02xy\r\n"), None);
        assert_eq!(
            command_name(b"GET /metrics HTTP/1.1\r\n").as_deref(),
            Some("GET")
        );
    }

    /// Five idle connections (a port scan, half-open sockets) held open: a scrape still
    /// answers within a second; and one that sends its request byte by byte, slower than
    /// the deadline, is closed without holding anyone up.
    #[test]
    fn idle_connections_never_delay_a_scrape() {
        use std::io::Read;
        use std::net::TcpStream;
        use std::time::{Duration, Instant};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let m = Metrics::new();
        m.instance("127.0.0.1:6379").attached.set(1);
        serve(l, m);
        let idle: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GE").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        let took = t.elapsed();
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            body.contains("stallscope_attached{instance=\"127.0.0.1:6379\"} 1"),
            "{body}"
        );
        // The slow one is cut off at the deadline, with no answer.
        slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = vec![];
        let n = slow.read_to_end(&mut rest).unwrap_or(0);
        assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&rest));
        drop(idle);
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr(":9323").unwrap().to_string(), "127.0.0.1:9323");
        assert_eq!(parse_addr("9323").unwrap().to_string(), "127.0.0.1:9323");
        assert_eq!(
            parse_addr("0.0.0.0:9000").unwrap().to_string(),
            "0.0.0.0:9000"
        );
        assert!(parse_addr("localhost").is_err());
    }

    #[test]
    fn the_histogram_encodes_as_the_crates_classic_one() {
        use prometheus_client::metrics::histogram::Histogram as Classic;
        let ns = [
            0u64,
            9_999,
            10_000,
            10_001,
            30_000_000,
            30_000_000,
            999_999_999,
            1_000_000_000,
            20_000_000_000,
        ];
        let encode = |register: &dyn Fn(&mut Registry)| {
            let mut r = Registry::with_prefix("t");
            register(&mut r);
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
            out
        };
        let ours = Histogram::default();
        let theirs = Classic::new(BUCKETS);
        for n in ns {
            ours.observe_ns(n);
            theirs.observe(n as f64 / 1e9);
        }
        let a = encode(&|r| r.register("d", "durations", ours.clone()));
        let b = encode(&|r| r.register("d", "durations", theirs.clone()));
        // The sum is added in ns here, in seconds there: equal up to float rounding.
        let sum = |t: &str| -> f64 {
            t.lines()
                .find_map(|l| l.strip_prefix("t_d_sum "))
                .unwrap()
                .parse()
                .unwrap()
        };
        assert!((sum(&a) - sum(&b)).abs() < 1e-9, "{a}\n{b}");
        let rest = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with("t_d_sum "))
                .map(String::from)
                .collect()
        };
        assert_eq!(rest(&a), rest(&b));
        assert!(
            a.contains("t_d_bucket{le=\"1e-5\"} 3") || a.contains("le=\"0.00001\"} 3"),
            "{a}"
        );
    }

    fn put_file(root: &std::path::Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A fake root where process 5 is in the cgroup v2 `/box`, mounted at `/cg`.
    fn fake_v2_box(root: &std::path::Path) {
        put_file(root, "proc/5/cgroup", "0::/box\n");
        put_file(
            root,
            "proc/self/mountinfo",
            "30 22 0:26 / /cg rw - cgroup2 cgroup2 rw\n",
        );
    }

    /// Each instance's cgroup counters are published at each scrape by what they did since
    /// the last one, from the cgroup followed (a fake v2 tree here), and stop with it.
    #[test]
    fn the_cgroup_counters_follow_each_instances_cgroup() {
        let tmp = tempfile::tempdir().unwrap();
        let put = |rel: &str, text: &str| put_file(tmp.path(), rel, text);
        fake_v2_box(tmp.path());
        let stat = |periods: u64, throttled: u64, usec: u64| {
            format!("nr_periods {periods}\nnr_throttled {throttled}\nthrottled_usec {usec}\n")
        };
        put("cg/box/cpu.stat", &stat(10, 4, 1_000_000));
        put("cg/box/memory.events", "high 7\nmax 0\noom 0\n");
        let cg = crate::live::cgroup::Cgroup::of(tmp.path(), 5).unwrap();
        let m = Metrics::new();
        m.fam.cgroup.follow("r1", Some(cg));
        put("cg/box/cpu.stat", &stat(13, 7, 1_250_000));
        put("cg/box/memory.events", "high 9\nmax 1\noom 0\n");
        let text = m.encode();
        for want in [
            "stallscope_cgroup_cpu_periods_total{instance=\"r1\"} 3",
            "stallscope_cgroup_cpu_throttled_periods_total{instance=\"r1\"} 3",
            "stallscope_cgroup_cpu_throttled_seconds_total{instance=\"r1\"} 0.25",
            "stallscope_cgroup_memory_events_total{instance=\"r1\",event=\"high\"} 2",
            "stallscope_cgroup_memory_events_total{instance=\"r1\",event=\"max\"} 1",
            "stallscope_cgroup_memory_events_total{instance=\"r1\",event=\"failcnt\"} 0",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // Published once: a scrape with nothing new adds nothing.
        assert!(m
            .encode()
            .contains("stallscope_cgroup_cpu_periods_total{instance=\"r1\"} 3"));
        // What happened before it stopped following is kept; nothing after.
        put("cg/box/cpu.stat", &stat(14, 8, 1_300_000));
        m.fam.cgroup.follow("r1", None);
        put("cg/box/cpu.stat", &stat(20, 9, 9_000_000));
        let text = m.encode();
        assert!(
            text.contains("stallscope_cgroup_cpu_periods_total{instance=\"r1\"} 4"),
            "{text}"
        );
    }

    /// A departed instance (`leave`) loses its cgroup's series, which are not made again by
    /// later scrapes however its cgroup's counters move; its own stay until `forget`; another
    /// instance's all stay.
    #[test]
    fn a_departed_instance_lets_go_of_its_cgroup() {
        let tmp = tempfile::tempdir().unwrap();
        let put = |rel: &str, text: &str| put_file(tmp.path(), rel, text);
        fake_v2_box(tmp.path());
        put(
            "cg/box/cpu.stat",
            "nr_periods 1\nnr_throttled 1\nthrottled_usec 10\n",
        );
        put("cg/box/memory.events", "high 0\nmax 1\noom 0\n");
        let cg = || crate::live::cgroup::Cgroup::of(tmp.path(), 5).unwrap();
        let m = Metrics::new();
        let (gone, stays) = (m.instance("10.0.0.1:6379"), m.instance("10.0.0.2:6379"));
        for (im, label) in [(&gone, "10.0.0.1:6379"), (&stays, "10.0.0.2:6379")] {
            im.attached.set(1);
            m.fam.cgroup.follow(label, Some(cg()));
            im.count_stall(StallLabels {
                instance: String::new(),
                role: "main".into(),
                kind: "gap".into(),
                file_class: "none".into(),
                finding: "cpu-throttled".into(),
            });
        }
        put(
            "cg/box/cpu.stat",
            "nr_periods 5\nnr_throttled 4\nthrottled_usec 90\n",
        );
        let before = m.encode();
        let of = |text: &str, label: &str| -> Vec<String> {
            let i = format!("instance=\"{label}\"");
            text.lines()
                .filter(|l| l.contains(&i))
                .map(str::to_string)
                .collect()
        };
        assert!(
            of(&before, "10.0.0.1:6379")
                .iter()
                .any(|l| l.starts_with("stallscope_cgroup_cpu_throttled_periods_total")),
            "{before}"
        );
        gone.attached.set(0);
        gone.leave();
        put(
            "cg/box/cpu.stat",
            "nr_periods 9\nnr_throttled 8\nthrottled_usec 200\n",
        );
        for _ in 0..2 {
            let text = m.encode();
            let gone_lines = of(&text, "10.0.0.1:6379");
            assert!(
                !gone_lines
                    .iter()
                    .any(|l| l.starts_with("stallscope_cgroup_")),
                "{text}"
            );
            assert!(
                gone_lines
                    .contains(&"stallscope_attached{instance=\"10.0.0.1:6379\"} 0".to_string()),
                "{text}"
            );
            assert!(
                gone_lines
                    .iter()
                    .any(|l| l.starts_with("stallscope_stalls_total")),
                "{text}"
            );
            let left = of(&text, "10.0.0.2:6379");
            for family in [
                "stallscope_cgroup_cpu_periods_total",
                "stallscope_cgroup_memory_events_total",
                "stallscope_stalls_total",
                "stallscope_attached",
            ] {
                assert!(
                    left.iter().any(|l| l.starts_with(family)),
                    "{family}: {text}"
                );
            }
        }
        gone.forget();
        assert!(of(&m.encode(), "10.0.0.1:6379").is_empty());
    }

    #[test]
    fn encodes_the_contract_names() {
        let m = Metrics::new();
        let text = m.encode();
        assert!(
            !text.contains("stallscope_attached{"),
            "no instance yet: {text}"
        );
        let im = m.instance("127.0.0.1:6379");
        im.count_stall(StallLabels {
            instance: String::new(),
            role: "main".into(),
            kind: "slow_syscall".into(),
            file_class: "none".into(),
            finding: "debug-sleep".into(),
        });
        let mut o = Observer::new(im.clone());
        let mut sc = crate::event::Syscall::new("fdatasync");
        sc.dur = Some(30_000_000);
        o.observe(
            &Event {
                tid: 1,
                ts: 0,
                line: 0,
                kind: EventKind::Syscall(sc),
            },
            Some(FileClass::Aof),
        );
        let counted = |t: &str| {
            t.lines()
                .any(|l| l.contains("syscall=\"fdatasync\"") && l.ends_with(" 1"))
        };
        assert!(!counted(&m.encode()), "not published yet");
        o.publish();
        let text = m.encode();
        assert!(counted(&text), "{text}");
        let i = "instance=\"127.0.0.1:6379\"";
        assert!(text.contains(&format!("stallscope_stalls_total{{{i},role=\"main\",kind=\"slow_syscall\",file_class=\"none\",finding=\"debug-sleep\"}} 1")), "{text}");
        assert!(text.contains(&format!("stallscope_syscall_duration_seconds_bucket{{le=\"0.05\",{i},syscall=\"fdatasync\",file_class=\"aof\"}} 1")) || text.contains(&format!("stallscope_syscall_duration_seconds_bucket{{{i},syscall=\"fdatasync\",file_class=\"aof\",le=\"0.05\"}} 1")), "{text}");
        assert!(
            text.contains(&format!("stallscope_attached{{{i}}} 0")),
            "{text}"
        );
        assert!(
            text.contains("stallscope_watcher_cpu_seconds_total"),
            "{text}"
        );
        assert!(
            text.contains(&format!("stallscope_lost_events_total{{{i}}} 0")),
            "{text}"
        );
        // Each reason a stall can miss its report is a series from the start.
        for r in ["rate_limit", "writer_busy", "write_error"] {
            assert!(
                text.contains(&format!(
                    "stallscope_stalls_not_reported_total{{{i},reason=\"{r}\"}} 0"
                )),
                "{text}"
            );
        }
        // Another instance has series of its own; forgetting the first leaves none of it.
        let other = m.instance("[::1]:6380");
        other.attached.set(1);
        im.forget();
        let text = m.encode();
        let left: Vec<&str> = text.lines().filter(|l| l.contains(i)).collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(
            text.contains("stallscope_attached{instance=\"[::1]:6380\"} 1"),
            "{text}"
        );
    }
}
