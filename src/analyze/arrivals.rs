//! Arrivals: when the request that the event loop just read could have arrived. A wait that
//! blocked ended when the request arrived; one that returned at once found it already queued,
//! and the trace shows it there no earlier than the end of the thread's call before that wait
//! (the wait's start, when a stall-length gap came between). So a latency never starts before
//! a stall or gap of the thread that ended before the wait that returned the request: the
//! trace cannot show the request was waiting through it. Under a ptrace tracer every time is taken
//! at a stop, so the thread's tracer round trip is estimated too.

use super::call::{Facts, PerThread, ResolvedCall, ThreadIdx};
use super::stats::LowDecile;
use crate::event::{DurSource, Nanos};

/// An event-loop wait at least this long blocked (the request arrived at its end); a shorter
/// one returned at once because work was already queued. Without `-T` a wait's duration is
/// an upper bound that includes the tracer's own stop, so it must also exceed twice what
/// the thread's other calls take under the same bound.
const BLOCKED_WAIT: Nanos = 20_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Wait {
    start: Nanos,
    end: Nanos,
    blocked: bool,
    /// A request it returned at once is known to be there from this time on: the end of
    /// the thread's call before it, or its own start (no call before it since the timeline
    /// last broke, or a stall-length gap between).
    from: Nanos,
    /// The end of the thread's latest stall before it (`LoopState::floor` then).
    floor: Nanos,
}

struct LoopState {
    cur_wait: Option<Wait>,
    prev_wait_end: Option<Nanos>,
    /// The end of the thread's latest stall-length call or gap.
    floor: Nanos,
    /// Running mean of this thread's non-waiting calls timed only as upper bounds (no `-T`):
    /// what the tracer adds to every call, so to a wait that did not block too.
    bound_call_ns: Nanos,
    /// Low decile of the time between two consecutive calls (or, without `-T`, of a call's
    /// upper bound): one tracer round trip with almost no work of the thread's own in it.
    trip: LowDecile,
}

impl Default for LoopState {
    fn default() -> Self {
        LoopState {
            cur_wait: None,
            prev_wait_end: None,
            floor: Nanos::MIN,
            bound_call_ns: 0,
            trip: LowDecile::default(),
        }
    }
}

pub(crate) struct Arrivals {
    per: PerThread<LoopState>,
    /// Timestamps were taken by a ptrace tracer at its stops (`Options::stamped_at_stops`).
    stamped_at_stops: bool,
    /// The stall threshold: a gap this long before a wait is a stall a request is not dated
    /// across.
    threshold: Nanos,
}

impl Arrivals {
    pub(crate) fn new(stamped_at_stops: bool, threshold: Nanos) -> Self {
        Arrivals {
            per: PerThread::default(),
            stamped_at_stops,
            threshold,
        }
    }

    /// The timeline broke (an unreadable line; `t`: only that thread, attached or detached):
    /// a wait before the break says nothing of when a request read after it arrived.
    pub(crate) fn forget(&mut self, t: Option<ThreadIdx>) {
        let clear = |s: &mut LoopState| {
            s.cur_wait = None;
            s.prev_wait_end = None;
        };
        match t {
            Some(t) => clear(self.per.at(t)),
            None => self.per.iter_mut().for_each(clear),
        }
    }

    /// `gap`: the time since the thread's previous call ended (stalls unit; none for the
    /// thread's first call since the timeline last broke).
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>, gap: Option<Nanos>) {
        let upper = cx.dur_src() == DurSource::UpperBound;
        let threshold = self.threshold;
        let t = self.per.at(cx.thread);
        if let Some(g) = gap {
            if !upper && (0..1_000_000).contains(&g) {
                t.trip.add(g);
            }
        }
        let stall_gap = gap.is_some_and(|g| g >= threshold);
        if stall_gap {
            t.floor = t.floor.max(cx.ts());
        }
        let dur = cx.dur;
        if cx.timed && !cx.idle && dur >= threshold {
            t.floor = t.floor.max(cx.end);
        }
        if cx.facts.has(Facts::EPOLL) {
            t.prev_wait_end = t.cur_wait.map(|w| w.end);
            let blocked_at = if upper {
                BLOCKED_WAIT.max(2 * t.bound_call_ns)
            } else {
                BLOCKED_WAIT
            };
            let from = match gap {
                Some(g) if !stall_gap => cx.ts() - g.max(0),
                _ => cx.ts(),
            };
            t.cur_wait = Some(Wait {
                start: cx.ts(),
                end: cx.end,
                blocked: dur >= blocked_at,
                from,
                floor: t.floor,
            });
        } else if upper && !cx.idle && dur < 1_000_000 {
            // Stalls aside (they are not overhead): a slow mean of the tracer's cost.
            t.trip.add(dur);
            t.bound_call_ns = if t.bound_call_ns == 0 {
                dur
            } else {
                t.bound_call_ns + (dur - t.bound_call_ns) / 16
            };
        }
    }

    /// When a request (or connection) read at `at` by thread `t` could have arrived.
    pub(crate) fn request_time(&self, t: ThreadIdx, at: Nanos) -> Nanos {
        let Some(t) = self.per.get(t) else {
            return at;
        };
        let req = match t.cur_wait {
            // Under ptrace the wait is seen to end only after the woken thread reached its
            // exit stop and the tracer ran: the request came about one round trip earlier.
            Some(Wait {
                start,
                end,
                blocked: true,
                ..
            }) if self.stamped_at_stops => end - t.trip.ns.min(end - start),
            Some(Wait {
                end, blocked: true, ..
            }) => end,
            // Returned at once: queued, but the trace shows it there only from the end of
            // the call before the wait (not from the previous wait's end, nor from the
            // trace's start: a stall between would be charged with a request it may not
            // have held).
            Some(Wait {
                blocked: false,
                from,
                ..
            }) => from,
            None => at,
        };
        req.min(at)
    }

    /// The earliest a request found by the thread's last wait may be dated: the end of the
    /// thread's latest stall before that wait (the trace cannot show the request was there
    /// while it ran).
    pub(crate) fn not_before(&self, t: ThreadIdx) -> Nanos {
        self.per
            .get(t)
            .and_then(|s| s.cur_wait)
            .map_or(Nanos::MIN, |w| w.floor)
    }

    /// The thread waited for work (a wait before its last one ended) after `at`: whatever it
    /// had registered by `at` would have been returned by that wait.
    pub(crate) fn waited_since(&self, t: ThreadIdx, at: Nanos) -> bool {
        self.per
            .get(t)
            .and_then(|s| s.prev_wait_end)
            .is_some_and(|e| e > at)
    }

    /// The thread's last wait returned at once: work was already queued.
    pub(crate) fn woke_on_queued(&self, t: ThreadIdx) -> bool {
        self.per
            .get(t)
            .and_then(|s| s.cur_wait)
            .is_some_and(|w| !w.blocked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};
    use crate::analyze::roles::Role;

    const US: Nanos = 1_000;
    const MS: Nanos = 1_000_000;

    fn arrivals() -> Arrivals {
        Arrivals::new(false, 10 * MS)
    }

    #[test]
    fn a_blocked_wait_ends_when_the_request_arrived() {
        let mut a = arrivals();
        let w = event(1, 1000 * US, 500 * US, "epoll_wait");
        let cx = call(&w, Role::Main, None);
        a.on_call(&cx, None);
        assert_eq!(a.request_time(cx.thread, 1600 * US), 1500 * US);
        assert!(!a.woke_on_queued(cx.thread));
        // A read before any wait: the read itself.
        assert_eq!(a.request_time(ThreadIdx(7), 42), 42);
    }

    /// Issue 13: a wait that returned at once shows the request queued from the end of the
    /// thread's call before it, never from the previous wait's end nor the trace's start.
    #[test]
    fn an_immediate_return_dates_the_request_from_the_end_of_the_call_before() {
        let mut a = arrivals();
        let w1 = event(1, 1000 * US, 500 * US, "epoll_wait");
        let r = event(1, 1510 * US, 10 * US, "read");
        let wr = event(1, 1600 * US, 10 * US, "write");
        let w2 = event(1, 1700 * US, 2 * US, "epoll_wait");
        let cx = call(&w1, Role::Main, None);
        a.on_call(&cx, None);
        a.on_call(&call(&r, Role::Main, None), Some(10 * US));
        a.on_call(&call(&wr, Role::Main, None), Some(80 * US));
        a.on_call(&call(&w2, Role::Main, None), Some(90 * US));
        assert!(a.woke_on_queued(cx.thread));
        // The write before the wait ended at 1610 µs (the previous wait at 1500 µs).
        assert_eq!(a.request_time(cx.thread, 1710 * US), 1610 * US);
        // The first wait of a trace returned at once: from its own start, not from the
        // trace's first timestamp.
        let mut b = arrivals();
        b.on_call(&call(&w2, Role::Main, None), None);
        assert_eq!(b.request_time(cx.thread, 1710 * US), 1700 * US);
    }

    /// Issue 13: never before a stall-length gap or call of the thread that ended before
    /// the wait that returned the request.
    #[test]
    fn no_request_is_dated_before_a_stall_that_ended_before_its_wait() {
        // A gap of 300 ms of CPU work, then a wait that returned at once.
        let mut a = arrivals();
        let r = event(1, 0, 10 * US, "read");
        let w = event(1, 300 * MS, 2 * US, "epoll_wait");
        let t = call(&r, Role::Main, None).thread;
        a.on_call(&call(&r, Role::Main, None), None);
        a.on_call(&call(&w, Role::Main, None), Some(300 * MS - 10 * US));
        assert_eq!(a.request_time(t, 300 * MS + 10 * US), 300 * MS);
        assert_eq!(a.not_before(t), 300 * MS);
        // A 500 ms fdatasync, then a wait that returned at once.
        let mut a = arrivals();
        let f = event(1, 0, 500 * MS, "fdatasync");
        let w = event(1, 500 * MS + 5 * US, 2 * US, "epoll_wait");
        a.on_call(&call(&f, Role::Main, None), None);
        a.on_call(&call(&w, Role::Main, None), Some(5 * US));
        assert_eq!(a.request_time(t, 501 * MS), 500 * MS);
        assert_eq!(a.not_before(t), 500 * MS);
        // A request returned by a wait before the stall is dated from that wait, whenever
        // it is read: the stall held it.
        let mut a = arrivals();
        let w = event(1, 0, 5 * MS, "epoll_wait");
        let f = event(1, 5 * MS, 500 * MS, "close");
        a.on_call(&call(&w, Role::Main, None), None);
        a.on_call(&call(&f, Role::Main, None), Some(0));
        assert_eq!(a.request_time(t, 506 * MS), 5 * MS);
        assert_eq!(a.not_before(t), Nanos::MIN, "no stall before that wait");
        // An idle wait of any length is no stall.
        let mut a = arrivals();
        let w1 = event(1, 0, 900 * MS, "epoll_wait");
        a.on_call(&call(&w1, Role::Main, None), None);
        assert_eq!(a.not_before(t), Nanos::MIN);
    }

    #[test]
    fn under_ptrace_a_round_trip_earlier() {
        let mut a = Arrivals::new(true, 10 * MS);
        let r = event(1, 0, 5 * US, "read");
        let cx = call(&r, Role::Main, None);
        // The time between calls settles the round trip: the first sample is taken as is.
        a.on_call(&cx, Some(30 * US));
        let w = event(1, 1000 * US, 500 * US, "epoll_wait");
        a.on_call(&call(&w, Role::Main, None), None);
        assert_eq!(a.request_time(cx.thread, 2000 * US), 1470 * US);
    }
}
