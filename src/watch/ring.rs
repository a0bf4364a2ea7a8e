//! `watch`'s history: the last `--before` of traced events, bounded in bytes, so that an
//! incident report can be made from what happened before the stall was noticed. Events
//! are kept as they came from the tracer; time bound and byte bound both evict the oldest.
//! The records the tracer lost are kept too, as marks at their place in the stream, so an
//! incident's analysis (and its recording's `.lost` sidecar) marks the same stalls as
//! possibly incomplete as the live analysis did.

use crate::event::{Event, EventKind, Extra, Nanos};
use std::collections::VecDeque;

pub(crate) struct Ring {
    events: VecDeque<Event>,
    bytes: usize,
    max_bytes: usize,
    /// How long events are kept at least (when bytes allow): `--before`, or longer while an
    /// incident is being recorded (`hold_from`).
    keep_ns: Nanos,
    hold_from: Option<Nanos>,
    /// Events evicted for lack of room while still wanted by time (ring too small for the load).
    pub(crate) evicted_early: u64,
    /// End of the newest event evicted for lack of room: an incident starting within a
    /// moment of it is losing its beginning.
    evicted_upto: Option<Nanos>,
    /// Events pushed since the ring was made: the sequence number of the next one. The
    /// oldest held is `pushed - events.len()`.
    pushed: u64,
    /// (sequence number of the event they came before, records lost), oldest first.
    lost: VecDeque<(u64, u64)>,
    /// Scheduler splits of evicted events, for the tracer to reuse (`Tracer::reuse`).
    #[allow(clippy::vec_box)] // the events' own boxes, handed on as they are
    pub(crate) spent: Vec<Box<crate::event::SchedSpan>>,
}

/// What `take_upto` hands over: the events, and the records lost before the event at each
/// index (sorted by index).
pub(crate) struct Taken {
    /// As the ring held them: a `Vec` would rotate the whole ring into place.
    pub events: VecDeque<Event>,
    pub lost: Vec<(usize, u64)>,
}

/// What an event costs in the ring: its inline size and what it owns on the heap (strings,
/// the scheduler split's box).
pub(crate) fn event_bytes(ev: &Event) -> usize {
    let mut n = std::mem::size_of::<Event>();
    match &ev.kind {
        EventKind::Syscall(sc) => {
            if sc.sched.is_some() {
                n += std::mem::size_of::<crate::event::SchedSpan>();
            }
            n += sc.fd_path.as_ref().map_or(0, |p| p.len());
            n += sc.ret_path.as_ref().map_or(0, |p| p.len());
            n += match &sc.extra {
                Extra::Path(p) => p.len(),
                Extra::Rename(a, b) => a.len() + b.len(),
                _ => 0,
            };
        }
        EventKind::ThreadName(s) => n += s.len(),
        _ => {}
    }
    n
}

/// The last finished call of each thread in `events`, as a call of no length at its end
/// (oldest first): it bounds a gap that began there, and as it lasts nothing it cannot be
/// a slow call again in the next report.
fn boundary_marks(events: &VecDeque<Event>) -> Vec<Event> {
    let mut seen: Vec<crate::event::Tid> = vec![];
    let mut marks = vec![];
    for ev in events.iter().rev() {
        let EventKind::Syscall(sc) = &ev.kind else {
            continue;
        };
        if sc.dur.is_none() || seen.contains(&ev.tid) {
            continue;
        }
        seen.push(ev.tid);
        let mut m = ev.clone();
        m.ts = ev.end();
        if let EventKind::Syscall(sc) = &mut m.kind {
            sc.dur = Some(0);
            sc.sched = None;
        }
        marks.push(m);
    }
    marks.sort_by_key(|m| m.ts);
    marks
}

impl Ring {
    pub(crate) fn new(max_bytes: usize, keep_ns: Nanos) -> Ring {
        // Sized once for the most events the byte bound admits: a VecDeque that regrows
        // doubles, and as its head wraps through the whole allocation every page of it
        // becomes resident, so RSS would step up by the old size (the second soak's floor
        // rose 245 -> 322 MB in one step at 20 min).
        let most = max_bytes / std::mem::size_of::<Event>() + 1;
        Ring {
            events: VecDeque::with_capacity(most),
            bytes: 0,
            max_bytes,
            keep_ns,
            hold_from: None,
            evicted_early: 0,
            evicted_upto: None,
            pushed: 0,
            lost: VecDeque::new(),
            spent: vec![],
        }
    }

    /// The tracer lost `n` records before the next event pushed.
    pub(crate) fn note_lost(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        match self.lost.back_mut() {
            Some((at, c)) if *at == self.pushed => *c += n,
            _ => self.lost.push_back((self.pushed, n)),
        }
    }

    /// Sequence number of the next event pushed: a cut for `take_upto`.
    pub(crate) fn next_seq(&self) -> u64 {
        self.pushed
    }

    fn front_seq(&self) -> u64 {
        self.pushed - self.events.len() as u64
    }

    /// Adds an event at time `now` (the tracer's clock) and evicts what is too old or does
    /// not fit.
    pub(crate) fn push(&mut self, ev: Event, now: Nanos) {
        self.bytes += event_bytes(&ev);
        self.events.push_back(ev);
        self.pushed += 1;
        let horizon = match self.hold_from {
            Some(h) => h.min(now - self.keep_ns),
            None => now - self.keep_ns,
        };
        while let Some(front) = self.events.front() {
            let too_old = front.end() < horizon;
            let too_big = self.bytes > self.max_bytes;
            if !(too_old || too_big) {
                break;
            }
            let mut ev = self.events.pop_front().expect("front exists");
            if !too_old {
                self.evicted_early += 1;
                self.evicted_upto = Some(ev.end());
            }
            self.bytes -= event_bytes(&ev);
            crate::live::spend(&mut ev, &mut self.spent);
        }
        // Losses before an event no longer held are no incident's.
        let front = self.front_seq();
        while self.lost.front().is_some_and(|(at, _)| *at < front) {
            self.lost.pop_front();
        }
    }

    /// Keeps everything from `from` on (an incident being recorded) until `release`.
    pub(crate) fn hold(&mut self, from: Nanos) {
        self.hold_from = Some(self.hold_from.map_or(from, |h| h.min(from)));
    }

    pub(crate) fn release(&mut self) {
        self.hold_from = None;
    }

    /// Hands over the events pushed before sequence number `cut` (`next_seq` when the
    /// incident was complete) that end at or after `from`, oldest first, with the losses
    /// among them; the later ones stay. Moved, not copied: an incident's report is made from
    /// them while the ring refills, and a copy would double the ring's memory at every
    /// incident. Nothing handed over is wanted again: the next report starts after this
    /// one's last event.
    pub(crate) fn take_upto(&mut self, from: Nanos, cut: u64) -> Taken {
        let front = self.front_seq();
        let n = (cut.saturating_sub(front) as usize).min(self.events.len());
        // The next allocation is as large, but only the pages the ring refills become
        // resident; the handed-over one is freed when its report is written.
        let mut rest = VecDeque::with_capacity(self.events.capacity());
        rest.extend(self.events.drain(n..));
        let mut out = std::mem::replace(&mut self.events, rest);
        // Each thread's last call handed over stays behind as a mark at its end: a gap that
        // began there and ends after the cut (the main thread spinning in a script when an
        // incident is cut early) is then seen by the next report, which starts at that
        // gap. Without it the gap was in neither report: the first ends before the gap's
        // end, the second starts after its beginning.
        for m in boundary_marks(&out).into_iter().rev() {
            self.events.push_front(m);
        }
        self.bytes = self.events.iter().map(event_bytes).sum();
        self.hold_from = None;
        let mut first = front;
        while out.front().is_some_and(|e| e.end() < from) {
            out.pop_front();
            first += 1;
        }
        let mut lost: Vec<(usize, u64)> = vec![];
        while let Some(&(at, c)) = self.lost.front() {
            if at >= front + n as u64 {
                break;
            }
            self.lost.pop_front();
            // Lost just before the first event handed over (or before those skipped as
            // too old): its analysis starts after a loss.
            let i = at.saturating_sub(first) as usize;
            match lost.last_mut() {
                Some((j, k)) if *j == i => *k += c,
                _ => lost.push((i, c)),
            }
        }
        Taken { events: out, lost }
    }

    /// End of the newest event dropped for lack of room (see `evicted_upto`).
    pub(crate) fn evicted_upto(&self) -> Option<Nanos> {
        self.evicted_upto
    }

    /// End of the newest event held.
    pub(crate) fn newest(&self) -> Option<Nanos> {
        self.events.back().map(|e| e.end())
    }

    /// Start of the oldest event held.
    #[cfg(test)]
    pub(crate) fn oldest(&self) -> Option<Nanos> {
        self.events.front().map(|e| e.ts)
    }

    pub(crate) fn clear(&mut self) {
        self.events.clear();
        self.lost.clear();
        self.bytes = 0;
        self.hold_from = None;
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Syscall, Tid};

    fn call(ts: Nanos) -> Event {
        let mut sc = Syscall::new("read");
        sc.dur = Some(0);
        Event {
            tid: 1,
            ts,
            line: 0,
            kind: EventKind::Syscall(sc),
        }
    }

    #[test]
    fn keeps_the_last_window_by_time() {
        let mut r = Ring::new(1 << 30, 10);
        for t in 0..100 {
            r.push(call(t), t);
        }
        let kept: Vec<Event> = r.events.iter().cloned().collect();
        assert!(
            kept.first().unwrap().ts >= 89,
            "{}",
            kept.first().unwrap().ts
        );
        assert_eq!(kept.last().unwrap().ts, 99);
        assert_eq!(r.evicted_early, 0);
    }

    #[test]
    fn bytes_bound_wins_over_time_and_is_counted() {
        let one = event_bytes(&call(0));
        let mut r = Ring::new(one * 5, 1_000_000);
        for t in 0..50 {
            r.push(call(t), t);
        }
        assert_eq!(r.len(), 5);
        assert!(r.bytes() <= one * 5);
        assert_eq!(r.evicted_early, 45);
        assert_eq!(r.evicted_upto(), Some(44));
    }

    #[test]
    fn take_upto_moves_the_events_out_and_keeps_what_came_after_the_cut() {
        let mut r = Ring::new(1 << 30, 1_000);
        for t in 0..100 {
            r.push(call(t), t);
        }
        let cut = r.next_seq();
        for t in 100..110 {
            r.push(call(t), t);
        }
        let got = r.take_upto(40, cut).events;
        assert_eq!(got.front().unwrap().ts, 40);
        assert_eq!(got.len(), 60);
        // The thread's last call handed over stays as a mark at its end.
        assert_eq!((r.len(), r.oldest(), r.newest()), (11, Some(99), Some(109)));
        assert_eq!(r.bytes(), 11 * event_bytes(&call(0)));
        // A cut at the newest event leaves only the mark of its last call.
        let got = r.take_upto(0, r.next_seq()).events;
        assert_eq!(got.len(), 11);
        assert_eq!((r.len(), r.oldest(), r.newest()), (1, Some(109), Some(109)));
        r.push(call(110), 110);
        assert_eq!(r.newest(), Some(110));
    }

    #[test]
    fn a_gap_across_a_cut_is_bounded_in_the_next_take() {
        // Thread 1 ends a call at 50 and makes no other until 300 (a spin); thread 2 made
        // a slow call (10..40). A report cut at 100 holds neither the gap's end nor,
        // without the mark, would the next one hold its beginning.
        let mut r = Ring::new(1 << 30, 1_000);
        let mut slow = call(10);
        slow.tid = 2;
        if let EventKind::Syscall(sc) = &mut slow.kind {
            sc.dur = Some(30);
        }
        r.push(slow, 40);
        r.push(call(50), 50);
        let cut = r.next_seq();
        r.push(call(300), 300);
        let first = r.take_upto(0, cut).events;
        assert_eq!(first.len(), 2);
        // The next report starts at the gap's beginning: thread 1's call at its end, and
        // thread 2's slow call as a call of no length (not a slow call twice).
        let next = r.take_upto(50, r.next_seq()).events;
        let got: Vec<(Tid, Nanos, Nanos)> = next.iter().map(|e| (e.tid, e.ts, e.end())).collect();
        assert_eq!(got, vec![(1, 50, 50), (1, 300, 300)]);
        // Each thread's last call stays marked (until --before passes).
        let next2 = r.take_upto(0, r.next_seq()).events;
        let got: Vec<(Tid, Nanos)> = next2.iter().map(|e| (e.tid, e.ts)).collect();
        assert_eq!(got, vec![(2, 40), (1, 300)]);
        let mut r = Ring::new(1 << 30, 1_000);
        let mut slow = call(10);
        slow.tid = 2;
        if let EventKind::Syscall(sc) = &mut slow.kind {
            sc.dur = Some(30);
        }
        r.push(slow, 40);
        let cut = r.next_seq();
        r.take_upto(0, cut);
        let marks = r.take_upto(0, r.next_seq()).events;
        assert_eq!(marks.len(), 1);
        assert_eq!((marks[0].ts, marks[0].end()), (40, 40));
    }

    #[test]
    fn losses_are_handed_over_at_their_place_and_forgotten_with_their_events() {
        let mut r = Ring::new(1 << 30, 1_000);
        r.note_lost(7);
        for t in 0..10 {
            if t == 4 {
                r.note_lost(2);
                r.note_lost(1);
            }
            r.push(call(t), t);
        }
        let cut = r.next_seq();
        r.note_lost(5);
        r.push(call(10), 10);
        let got = r.take_upto(2, cut);
        // Lost before event 0, which is skipped as older than `from`: before the first one
        // handed over. The loss after the cut stays with the event it came before.
        assert_eq!(got.events.front().unwrap().ts, 2);
        assert_eq!(got.lost, vec![(0, 7), (2, 3)]);
        let got = r.take_upto(0, r.next_seq());
        // After the mark of the last call handed over, before event 10.
        assert_eq!(got.lost, vec![(1, 5)]);
        // A loss whose event is evicted by time goes with it.
        let mut r = Ring::new(1 << 30, 5);
        r.note_lost(9);
        for t in 0..20 {
            r.push(call(t), t);
        }
        assert!(r.lost.is_empty());
    }

    #[test]
    fn hold_keeps_an_incident_beyond_the_window() {
        let mut r = Ring::new(1 << 30, 10);
        for t in 0..20 {
            r.push(call(t), t);
        }
        r.hold(12);
        for t in 20..40 {
            r.push(call(t), t);
        }
        assert_eq!(r.oldest(), Some(12));
        r.release();
        r.push(call(40), 40);
        assert!(r.oldest().unwrap() >= 29);
        assert_eq!(r.evicted_upto(), None);
    }
}
