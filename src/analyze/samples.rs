//! Samples: which individual calls are worth listing. The slowest calls of the trace
//! (whatever the threshold, for the "slowest calls" table) and, when an output needs a
//! timeline, a bounded per-thread sample of the slowest calls above a floor.

use super::call::{PerThread, ResolvedCall};
use super::world::World;
use crate::event::{Nanos, Tid};
use crate::fdtable::FileId;
use crate::report::{self, Bound};
use crate::source::Clock;
use rustc_hash::FxHashMap as HashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One kept call.
#[derive(Clone)]
struct CallRef {
    dur: Nanos,
    tid: Tid,
    proc: crate::fdtable::ProcKey,
    name: &'static str,
    fd: Option<i32>,
    file: Option<FileId>,
    ts: Nanos,
    line: u64,
    bound: Bound,
}

impl CallRef {
    fn of(cx: &ResolvedCall<'_>) -> Self {
        CallRef {
            dur: cx.dur,
            tid: cx.tid,
            proc: cx.proc,
            name: cx.sc.name,
            fd: cx.call_fd,
            file: cx.file,
            ts: cx.ts(),
            line: cx.ev.line,
            bound: cx.bound(),
        }
    }
}

/// Per thread, the slowest calls above the timeline floor: a min-heap on duration so the
/// shortest kept call is the one that makes room.
#[derive(Default)]
struct ThreadSample {
    heap: BinaryHeap<Reverse<(Nanos, u64)>>,
    calls: HashMap<u64, CallRef>,
    dropped: u64,
}

struct Timeline {
    floor: Nanos,
    cap: usize,
    seq: u64,
    per: PerThread<ThreadSample>,
}

pub(crate) struct Samples {
    /// How many slowest calls to keep.
    keep: usize,
    slowest: Vec<CallRef>,
    timeline: Option<Timeline>,
}

impl Samples {
    /// `timeline`: (floor, most calls kept per thread), when an output needs a timeline.
    pub(crate) fn new(keep: usize, timeline: Option<(Nanos, usize)>) -> Self {
        Samples {
            keep,
            slowest: vec![],
            timeline: timeline.map(|(floor, cap)| Timeline {
                floor,
                cap,
                seq: 0,
                per: PerThread::default(),
            }),
        }
    }

    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) {
        if !cx.timed {
            return;
        }
        let dur = cx.dur;
        // Slowest calls (non-waits), bounded.
        if !cx.facts.is_wait()
            && (self.slowest.len() < self.keep || self.slowest.last().is_some_and(|s| s.dur < dur))
        {
            self.slowest.push(CallRef::of(cx));
            self.slowest.sort_by_key(|s| Reverse(s.dur));
            self.slowest.truncate(self.keep);
        }
        if let Some(tl) = &mut self.timeline {
            if !cx.idle && dur >= tl.floor {
                tl.seq += 1;
                let t = tl.per.at(cx.thread);
                if t.calls.len() >= tl.cap {
                    match t.heap.peek() {
                        Some(Reverse((d, _))) if *d < dur => {
                            if let Some(Reverse((_, k))) = t.heap.pop() {
                                t.calls.remove(&k);
                            }
                            t.dropped += 1;
                        }
                        _ => t.dropped += 1,
                    }
                }
                if t.calls.len() < tl.cap {
                    t.heap.push(Reverse((dur, tl.seq)));
                    t.calls.insert(tl.seq, CallRef::of(cx));
                }
            }
        }
    }

    pub(crate) fn slowest(
        &self,
        world: &World,
        clock: &Clock,
        first: Nanos,
        top: usize,
    ) -> Vec<report::SlowCall> {
        self.slowest
            .iter()
            .take(top)
            .map(|s| {
                let fi = s.file.map(|f| world.file(f));
                report::SlowCall {
                    ts: clock.format(s.ts),
                    at_us: (s.ts - first) / 1000,
                    who: crate::report::ThreadRef {
                        pid: world.pid_of(s.proc, s.tid),
                        tid: s.tid,
                        thread: world.role(s.tid),
                    },
                    syscall: s.name.to_string(),
                    target: crate::report::FdRef {
                        fd: s.fd,
                        path: fi.and_then(|i| i.path.as_deref().map(str::to_string)),
                        class: fi.map(|i| i.class),
                    },
                    duration_us: s.dur / 1000,
                    line: (s.line != 0).then_some(s.line),
                    bound: s.bound,
                }
            })
            .collect()
    }

    pub(crate) fn timeline(&self, world: &World, first: Nanos) -> Option<report::Timeline> {
        let tl = self.timeline.as_ref()?;
        let mut calls: Vec<report::TimelineCall> = tl
            .per
            .iter()
            .flat_map(|(_, t)| t.calls.values())
            .map(|s| {
                let fi = s.file.map(|f| world.file(f));
                report::TimelineCall {
                    at_us: (s.ts - first) / 1000,
                    pid: world.pid_of(s.proc, s.tid),
                    tid: s.tid,
                    syscall: s.name.to_string(),
                    target: crate::report::FdRef {
                        fd: s.fd,
                        path: fi.and_then(|i| i.path.as_deref().map(str::to_string)),
                        class: fi.map(|i| i.class),
                    },
                    duration_us: s.dur / 1000,
                    bound: s.bound,
                    line: if s.line == 0 { None } else { Some(s.line) },
                }
            })
            .collect();
        calls.sort_by_key(|c| (c.at_us, c.tid));
        Some(report::Timeline {
            floor_us: tl.floor / 1000,
            max_per_thread: tl.cap,
            dropped: tl.per.iter().map(|(_, t)| t.dropped).sum(),
            calls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};
    use crate::analyze::roles::Role;

    #[test]
    fn slowest_keeps_the_longest_non_waits_in_order() {
        let mut s = Samples::new(2, None);
        for (i, d) in [5, 9, 1, 7].iter().enumerate() {
            let e = event(1, i as i64, *d, "write");
            s.on_call(&call(&e, Role::Main, None));
        }
        let w = event(1, 9, 100, "futex");
        s.on_call(&call(&w, Role::Main, None));
        let d: Vec<Nanos> = s.slowest.iter().map(|c| c.dur).collect();
        assert_eq!(d, vec![9, 7]);
    }

    #[test]
    fn timeline_cap_per_thread_keeps_the_slowest_and_counts_the_rest() {
        let mut s = Samples::new(1, Some((10, 3)));
        for (i, d) in [50, 20, 40, 30, 10, 5].iter().enumerate() {
            let e = event(1, i as i64 * 100, *d, "write");
            s.on_call(&call(&e, Role::Main, None));
        }
        let tl = s.timeline.as_ref().unwrap();
        let t = tl.per.get(crate::analyze::call::ThreadIdx(1)).unwrap();
        let mut kept: Vec<Nanos> = t.calls.values().map(|c| c.dur).collect();
        kept.sort();
        assert_eq!(kept, vec![30, 40, 50]);
        // 20 and 10 made no room (or were pushed out); 5 is under the floor.
        assert_eq!(t.dropped, 2);
    }
}
