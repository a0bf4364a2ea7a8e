//! The event loop of the backends the kernel feeds without stopping the tracee (perf, bpf):
//! between the kernel's buffers and `Tracer::next_event_timeout`. It owns the order of the
//! few things such a backend does while waiting for events (return what is ready, end on a
//! stop request or when the process is gone, check on the process now and then, take in
//! what the kernel wrote), so that the two backends differ only in how they read their
//! buffers. (ptrace has its own loop: it resumes stopped threads.) `Fed` is the state this
//! loop and the `Tracer` methods share in both backends.

use super::{SpanPool, TracerStats};
use crate::event::{Event, Nanos, Tid};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What a kernel-fed backend keeps besides its rings and its threads: the events ready, its
/// counts, and where it is in its life.
pub(crate) struct Fed {
    /// Events ready to be returned, in order.
    pub queue: VecDeque<Event>,
    pub stats: TracerStats,
    /// Records the kernel dropped that `Tracer::take_lost` has not handed on yet.
    pub lost_unreported: u64,
    pub stop_requested: bool,
    /// Tracing has ended: every event left is in the queue.
    pub done: bool,
    pub warnings: Vec<String>,
    /// When the process was last checked on.
    pub last_check: Instant,
    /// Boxes for the calls' scheduler split, handed back by the consumer.
    pub spans: SpanPool,
    /// The traced process's pid namespace: its clone and wait results are mapped to the
    /// host's pids, which the kernel's records name tasks by.
    pub pidns: super::container::PidNs,
}

impl Fed {
    pub(crate) fn new() -> Self {
        Fed {
            queue: VecDeque::new(),
            stats: TracerStats::default(),
            lost_unreported: 0,
            stop_requested: false,
            done: false,
            warnings: vec![],
            last_check: Instant::now(),
            spans: SpanPool::default(),
            pidns: Default::default(),
        }
    }

    /// Counts `n` records the kernel dropped.
    pub(crate) fn lost(&mut self, n: u64) {
        self.stats.lost_events += n;
        self.lost_unreported += n;
    }

    /// Counts one call of `tid` (of process `main`), with its duration if it was measured.
    #[inline]
    pub(crate) fn count(&mut self, tid: Tid, main: Tid, dur: Option<Nanos>) {
        self.stats.count(tid, main, dur);
    }

    /// `Tracer::is_done`.
    pub(crate) fn is_done(&self) -> bool {
        self.done && self.queue.is_empty()
    }

    /// `Tracer::take_lost`.
    pub(crate) fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost_unreported)
    }
}

/// How often the process is checked for exit (and whatever else a backend does then).
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The longest single wait for the kernel: stop requests and the process check are never
/// later than this.
const WAIT_AT_MOST: Duration = Duration::from_millis(20);

/// Events the queue keeps room for once it is empty again. A backlog (the tracer descheduled
/// while the kernel's buffers filled) grows it to hold all of it; a watcher running for days
/// would otherwise keep, as resident memory, room for the largest backlog it ever had.
pub(crate) const QUEUE_KEEP: usize = 16 * 1024;

/// The traced process has exited: gone from /proc, or a zombie (dead, not yet reaped).
pub(crate) fn process_gone(pid: crate::event::Tid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st == "Z" || st == "X"),
        Err(_) => true,
    }
}

/// A backend fed by kernel buffers.
pub(crate) trait KernelFed {
    /// The state every such backend keeps: its queue, whether it ended or was asked to
    /// stop, when the process was last checked on.
    fn fed(&mut self) -> &mut Fed;
    /// Events ready to be returned, in order.
    fn queue(&mut self) -> &mut VecDeque<Event> {
        &mut self.fed().queue
    }
    /// Ends tracing: takes what the kernel still holds, the calls still running, the detach.
    fn finish(&mut self);
    /// The periodic check: whether the traced process is gone.
    fn check(&mut self) -> bool;
    /// Moves what the kernel wrote into the queue, waiting at most `wait` for it to come.
    fn gather(&mut self, wait: Duration);
}

/// `Tracer::next_event_timeout` of a kernel-fed backend.
pub(crate) fn next_event_timeout<T: KernelFed>(t: &mut T, timeout: Duration) -> Option<Event> {
    wait_ready(t, timeout);
    t.queue().pop_front()
}

/// `Tracer::next_batch` of a kernel-fed backend: the whole queue at once. Into an empty
/// `out` (the usual case: the consumer drained the last batch) the two queues are swapped,
/// so no event is copied on the way and each queue's allocation is reused.
pub(crate) fn next_batch<T: KernelFed>(t: &mut T, timeout: Duration, out: &mut VecDeque<Event>) {
    if !wait_ready(t, timeout) {
        return;
    }
    if out.is_empty() {
        // Emptied by pop_front, its start is wherever the last event was: cleared, the
        // backend refills it from the start, the same few cache-hot lines each time,
        // instead of writing its way through the whole allocation.
        out.clear();
        std::mem::swap(t.queue(), out);
    } else {
        out.append(t.queue());
    }
}

/// Waits (at most `timeout`) until the queue holds an event or tracing has ended; true
/// when there is an event. The clock is read only once the queue is empty: a backend
/// with events ready costs no clock read per event.
fn wait_ready<T: KernelFed>(t: &mut T, timeout: Duration) -> bool {
    if !t.queue().is_empty() {
        return true;
    }
    let start = Instant::now();
    loop {
        if !t.queue().is_empty() {
            return true;
        }
        if t.fed().done {
            return false;
        }
        if t.fed().stop_requested {
            t.finish();
            continue;
        }
        if t.fed().last_check.elapsed() >= CHECK_EVERY {
            t.fed().last_check = Instant::now();
            if t.check() {
                t.finish();
                continue;
            }
        }
        let q = t.queue();
        if q.capacity() > 4 * QUEUE_KEEP {
            q.shrink_to(QUEUE_KEEP);
        }
        let left = timeout.saturating_sub(start.elapsed());
        t.gather(left.min(WAIT_AT_MOST));
        if t.queue().is_empty() && start.elapsed() >= timeout {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    /// A backend whose kernel delivers one event per gather, up to `left`, and whose
    /// process is gone once `gone_after` checks have been made.
    struct Fake {
        fed: Fed,
        left: u32,
        finished: u32,
        checks: u32,
        gone_after: u32,
    }

    fn fake(left: u32, gone_after: u32) -> Fake {
        let mut fed = Fed::new();
        // Due for a check at the first call.
        fed.last_check = Instant::now() - CHECK_EVERY;
        Fake {
            fed,
            left,
            finished: 0,
            checks: 0,
            gone_after,
        }
    }

    fn ev(ts: i64, kind: EventKind) -> Event {
        Event {
            tid: 1,
            ts,
            line: 0,
            kind,
        }
    }

    impl KernelFed for Fake {
        fn fed(&mut self) -> &mut Fed {
            &mut self.fed
        }
        fn finish(&mut self) {
            self.finished += 1;
            self.fed.done = true;
            self.fed.queue.push_back(ev(-1, EventKind::Detach));
        }
        fn check(&mut self) -> bool {
            self.checks += 1;
            self.checks > self.gone_after
        }
        fn gather(&mut self, _: Duration) {
            if self.left > 0 {
                self.left -= 1;
                self.fed
                    .queue
                    .push_back(ev(self.left as i64, EventKind::Attach { threads: None }));
            }
        }
    }

    #[test]
    fn a_running_process_is_not_gone_and_a_missing_one_is() {
        assert!(!process_gone(std::process::id()));
        // Above the kernel's pid_max (at most 2^22): no such process.
        assert!(process_gone(1 << 23));
    }

    #[test]
    fn events_then_a_quiet_timeout_then_the_detach_once_stopped() {
        let mut f = fake(2, u32::MAX);
        let t = Duration::from_millis(1);
        assert_eq!(next_event_timeout(&mut f, t).map(|e| e.ts), Some(1));
        assert_eq!(next_event_timeout(&mut f, t).map(|e| e.ts), Some(0));
        assert_eq!(next_event_timeout(&mut f, t), None, "nothing more came");
        assert_eq!(f.finished, 0);
        f.fed.stop_requested = true;
        let d = next_event_timeout(&mut f, t).expect("the detach");
        assert_eq!(d.kind, EventKind::Detach);
        assert_eq!(next_event_timeout(&mut f, t), None);
        assert_eq!(f.finished, 1, "finished once");
    }

    #[test]
    fn a_batch_is_the_whole_queue_in_order_then_the_detach_once_stopped() {
        let mut f = fake(0, u32::MAX);
        for i in 0..5 {
            f.fed
                .queue
                .push_back(ev(i, EventKind::Attach { threads: None }));
        }
        let t = Duration::from_millis(1);
        let mut out = VecDeque::new();
        next_batch(&mut f, t, &mut out);
        let ts: Vec<i64> = out.iter().map(|e| e.ts).collect();
        assert_eq!(ts, vec![0, 1, 2, 3, 4]);
        assert!(f.fed.queue.is_empty());
        // Into a batch not yet drained, the next events are appended after it.
        f.left = 1;
        next_batch(&mut f, t, &mut out);
        assert_eq!(out.len(), 6);
        assert_eq!(out.back().map(|e| e.ts), Some(0));
        out.clear();
        next_batch(&mut f, t, &mut out);
        assert!(out.is_empty(), "nothing more came");
        f.fed.stop_requested = true;
        next_batch(&mut f, t, &mut out);
        assert_eq!(out.pop_front().map(|e| e.kind), Some(EventKind::Detach));
        next_batch(&mut f, t, &mut out);
        assert!(out.is_empty());
        assert_eq!(f.finished, 1, "finished once");
    }

    #[test]
    fn a_process_gone_at_the_check_ends_tracing() {
        let mut f = fake(0, 0);
        let d = next_event_timeout(&mut f, Duration::from_secs(5)).expect("the detach");
        assert_eq!((d.kind, f.checks, f.finished), (EventKind::Detach, 1, 1));
    }

    #[test]
    fn the_queue_lets_go_of_a_backlog_once_it_is_drained() {
        let mut f = fake(0, u32::MAX);
        // What one gather takes in after the tracer was descheduled for a while.
        for i in 0..20 * QUEUE_KEEP {
            f.fed
                .queue
                .push_back(ev(i as i64, EventKind::Attach { threads: None }));
        }
        let t = Duration::from_millis(1);
        let mut n = 0;
        while next_event_timeout(&mut f, t).is_some() {
            n += 1;
        }
        assert_eq!(n, 20 * QUEUE_KEEP);
        assert!(
            f.fed.queue.capacity() <= 4 * QUEUE_KEEP,
            "{}",
            f.fed.queue.capacity()
        );
    }
}
