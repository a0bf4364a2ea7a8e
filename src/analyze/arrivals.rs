//! Arrivals: when the request that the event loop just read arrived. A wait that blocked
//! ended when the request arrived; one that returned at once means the request was already
//! queued, at the latest since the previous wait ended. Under a ptrace tracer every time is
//! taken at a stop, so the thread's tracer round trip is estimated too.

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
}

#[derive(Default)]
struct LoopState {
    cur_wait: Option<Wait>,
    prev_wait_end: Option<Nanos>,
    /// Running mean of this thread's non-waiting calls timed only as upper bounds (no `-T`):
    /// what the tracer adds to every call, so to a wait that did not block too.
    bound_call_ns: Nanos,
    /// Low decile of the time between two consecutive calls (or, without `-T`, of a call's
    /// upper bound): one tracer round trip with almost no work of the thread's own in it.
    trip: LowDecile,
}

#[derive(Default)]
pub(crate) struct Arrivals {
    per: PerThread<LoopState>,
    /// Timestamps were taken by a ptrace tracer at its stops (`Options::stamped_at_stops`).
    stamped_at_stops: bool,
}

impl Arrivals {
    pub(crate) fn new(stamped_at_stops: bool) -> Self {
        Arrivals {
            per: PerThread::default(),
            stamped_at_stops,
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

    /// `gap`: the time since the thread's previous call ended (stalls unit).
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>, gap: Option<Nanos>) {
        let upper = cx.dur_src() == DurSource::UpperBound;
        let t = self.per.at(cx.thread);
        if let Some(g) = gap {
            if !upper && (0..1_000_000).contains(&g) {
                t.trip.add(g);
            }
        }
        let dur = cx.dur;
        if cx.facts.has(Facts::EPOLL) {
            t.prev_wait_end = t.cur_wait.map(|w| w.end);
            let floor = if upper {
                BLOCKED_WAIT.max(2 * t.bound_call_ns)
            } else {
                BLOCKED_WAIT
            };
            t.cur_wait = Some(Wait {
                start: cx.ts(),
                end: cx.end,
                blocked: dur >= floor,
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

    /// When a request (or connection) read at `at` by thread `t` most likely arrived;
    /// `first`: the trace's first timestamp.
    pub(crate) fn request_time(&self, t: ThreadIdx, at: Nanos, first: Option<Nanos>) -> Nanos {
        let first = first.unwrap_or(at);
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
            }) if self.stamped_at_stops => end - t.trip.ns.min(end - start),
            Some(Wait {
                end, blocked: true, ..
            }) => end,
            // Returned at once with no earlier wait in the trace: queued since before the
            // trace began, as far as it can tell.
            Some(Wait {
                start,
                blocked: false,
                ..
            }) => t.prev_wait_end.unwrap_or(first.min(start)),
            None => at,
        };
        req.min(at)
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

    #[test]
    fn a_blocked_wait_ends_when_the_request_arrived() {
        let mut a = Arrivals::new(false);
        let w = event(1, 1000 * US, 500 * US, "epoll_wait");
        let cx = call(&w, Role::Main, None);
        a.on_call(&cx, None);
        assert_eq!(a.request_time(cx.thread, 1600 * US, Some(0)), 1500 * US);
        assert!(!a.woke_on_queued(cx.thread));
        // A read before any wait: the read itself.
        assert_eq!(a.request_time(ThreadIdx(7), 42, Some(0)), 42);
    }

    #[test]
    fn an_immediate_return_means_queued_since_the_previous_wait() {
        let mut a = Arrivals::new(false);
        let w1 = event(1, 1000 * US, 500 * US, "epoll_wait");
        let w2 = event(1, 1700 * US, 2 * US, "epoll_wait");
        let cx = call(&w1, Role::Main, None);
        a.on_call(&cx, None);
        a.on_call(&call(&w2, Role::Main, None), Some(200 * US));
        assert!(a.woke_on_queued(cx.thread));
        assert_eq!(a.request_time(cx.thread, 1710 * US, Some(0)), 1500 * US);
        // The first wait of a trace returned at once: queued since the trace began.
        let mut b = Arrivals::new(false);
        b.on_call(&call(&w2, Role::Main, None), None);
        assert_eq!(
            b.request_time(cx.thread, 1710 * US, Some(900 * US)),
            900 * US
        );
    }

    #[test]
    fn under_ptrace_a_round_trip_earlier() {
        let mut a = Arrivals::new(true);
        let r = event(1, 0, 5 * US, "read");
        let cx = call(&r, Role::Main, None);
        // The time between calls settles the round trip: the first sample is taken as is.
        a.on_call(&cx, Some(30 * US));
        let w = event(1, 1000 * US, 500 * US, "epoll_wait");
        a.on_call(&call(&w, Role::Main, None), None);
        assert_eq!(a.request_time(cx.thread, 2000 * US, Some(0)), 1470 * US);
    }
}
