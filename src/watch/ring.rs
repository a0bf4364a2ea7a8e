//! `watch`'s history: the last `--before` of traced events, bounded in bytes, so that an
//! incident report can be made from what happened before the stall was noticed. Events
//! are kept as they came from the tracer; time bound and byte bound both evict the oldest.
//! The records the tracer lost are kept too, as marks at their place in the stream, so an
//! incident's analysis (and its recording's `.lost` sidecar) marks the same stalls as
//! possibly incomplete as the live analysis did.

use crate::event::{DurSource, Event, EventKind, Extra, Nanos, Ret, Syscall};
use std::collections::VecDeque;

pub(crate) struct Ring {
    /// The events held, oldest first, in their compact form (`Held`).
    slots: VecDeque<Held>,
    /// The data bytes (`Extra::Data`) of the compact calls, in the order of `slots`.
    data: VecDeque<u8>,
    bytes: usize,
    max_bytes: usize,
    /// Most events held: an incident's events are handed over decoded, at an `Event`'s
    /// size each, so the count stays what the byte bound admitted of whole events (the
    /// decoded hand-over is then never more than `max_bytes` plus their heap bytes).
    max_events: usize,
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
    /// oldest held is `pushed - slots.len()`.
    pushed: u64,
    /// (sequence number of the event they came before, records lost), oldest first.
    lost: VecDeque<(u64, u64)>,
    /// Scheduler splits of evicted events, for the tracer to reuse (`Tracer::reuse`).
    #[allow(clippy::vec_box)] // the events' own boxes, handed on as they are
    pub(crate) spent: Vec<Box<crate::event::SchedSpan>>,
}

/// One event held by the ring. Nearly every event is a syscall as the live backends make
/// them (no strace `-y` paths, no split halves, no errno): those are kept as a `Slim`, a
/// third of an `Event`'s ~296 bytes, with their data bytes in the ring's byte deque. The
/// ring is written and evicted once per record, so its bytes are the watcher's memory
/// traffic per record (each 296-byte event was written to, and read back from, lines out
/// of cache). Anything else is kept whole.
enum Held {
    Call(Slim),
    Whole(Box<Event>),
}

struct Slim {
    ts: Nanos,
    dur: Nanos,
    arrived: Nanos,
    ret: i64,
    name: &'static str,
    sys: &'static crate::syscalls::SysInfo,
    sched: Option<Box<crate::event::SchedSpan>>,
    /// `Extra`'s payload: the fds of FdPair, NewFd, CloseRange; Clone's `thread`.
    a: i32,
    b: i32,
    tid: crate::event::Tid,
    fd: i32,
    /// `HAS_*` and `RET_*` bits.
    flags: u8,
    dur_src: u8,
    extra: u8,
    /// Bytes of `Extra::Data` in `Ring::data`.
    data_len: u8,
}

const HAS_DUR: u8 = 1;
const HAS_ARRIVED: u8 = 2;
const HAS_FD: u8 = 4;
const RET_VAL: u8 = 8;
const DATA_TRUNCATED: u8 = 16;

const X_NONE: u8 = 0;
const X_DATA: u8 = 1;
const X_FDPAIR: u8 = 2;
const X_NEWFD: u8 = 3;
const X_DUPFD: u8 = 4;
const X_CLOSE_RANGE: u8 = 5;
const X_CLONE: u8 = 6;

fn dur_src_code(d: DurSource) -> u8 {
    match d {
        DurSource::Measured => 0,
        DurSource::Paired => 1,
        DurSource::UpperBound => 2,
        DurSource::Unknown => 3,
    }
}

fn dur_src_of(c: u8) -> DurSource {
    match c {
        0 => DurSource::Measured,
        1 => DurSource::Paired,
        2 => DurSource::UpperBound,
        _ => DurSource::Unknown,
    }
}

impl Held {
    #[cfg(test)]
    fn ts(&self) -> Nanos {
        match self {
            Held::Call(c) => c.ts,
            Held::Whole(e) => e.ts,
        }
    }

    fn end(&self) -> Nanos {
        match self {
            Held::Call(c) if c.flags & HAS_DUR != 0 => c.ts.saturating_add(c.dur),
            Held::Call(c) => c.ts,
            Held::Whole(e) => e.end(),
        }
    }

    /// What it costs in the ring: its own size, its data bytes, its scheduler split's box,
    /// and a whole event's size and heap.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Held>()
            + match self {
                Held::Call(c) => {
                    c.data_len as usize
                        + c.sched
                            .as_ref()
                            .map_or(0, |_| std::mem::size_of::<crate::event::SchedSpan>())
                }
                Held::Whole(e) => event_bytes(e),
            }
    }

    /// The compact form of `ev`, whose scheduler split it takes (or, kept whole, all of
    /// it), with the data bytes to keep beside it.
    fn of(ev: &mut Event) -> (Held, Option<crate::event::Head>) {
        if let (0, EventKind::Syscall(sc)) = (ev.line, &mut ev.kind) {
            let plain = sc.fd_path.is_none()
                && sc.ret_path.is_none()
                && sc.in_flight.is_none()
                && sc.start_line.is_none()
                && !matches!(sc.ret, Ret::Err(_));
            let extra = match &sc.extra {
                Extra::None => Some((X_NONE, 0, 0)),
                Extra::Data(_) => Some((X_DATA, 0, 0)),
                Extra::FdPair(a, b) => Some((X_FDPAIR, *a, *b)),
                Extra::NewFd(a) => Some((X_NEWFD, *a, 0)),
                Extra::DupFd => Some((X_DUPFD, 0, 0)),
                Extra::CloseRange(a, b) => Some((X_CLOSE_RANGE, *a as i32, *b as i32)),
                Extra::Clone { thread } => Some((X_CLONE, *thread as i32, 0)),
                _ => None,
            };
            if let (true, Some((x, a, b))) = (plain, extra) {
                let head = sc.data().map(|d| d.head());
                let mut flags = 0;
                let mut put = |on: bool, bit: u8| {
                    if on {
                        flags |= bit
                    }
                };
                put(sc.dur.is_some(), HAS_DUR);
                put(sc.arrived.is_some(), HAS_ARRIVED);
                put(sc.fd.is_some(), HAS_FD);
                put(matches!(sc.ret, Ret::Val(_)), RET_VAL);
                put(head.is_some_and(|h| h.truncated), DATA_TRUNCATED);
                let slim = Slim {
                    ts: ev.ts,
                    dur: sc.dur.unwrap_or(0),
                    arrived: sc.arrived.unwrap_or(0),
                    ret: sc.ret.val().unwrap_or(0),
                    name: sc.name,
                    sys: sc.sys,
                    sched: sc.sched.take(),
                    a,
                    b,
                    tid: ev.tid,
                    fd: sc.fd.unwrap_or(0),
                    flags,
                    dur_src: dur_src_code(sc.dur_src),
                    extra: x,
                    data_len: head.as_ref().map_or(0, |h| h.bytes().len() as u8),
                };
                return (Held::Call(slim), head);
            }
        }
        let done_with = Event {
            tid: 0,
            ts: 0,
            line: 0,
            kind: EventKind::Detach,
        };
        (
            Held::Whole(Box::new(std::mem::replace(ev, done_with))),
            None,
        )
    }

    /// The event again, its data bytes taken from the front of `data`.
    fn into_event(self, data: &mut VecDeque<u8>) -> Event {
        let c = match self {
            Held::Whole(e) => return *e,
            Held::Call(c) => c,
        };
        let mut sc = Syscall::with(c.name, c.sys);
        let on = |bit: u8| c.flags & bit != 0;
        sc.fd = on(HAS_FD).then_some(c.fd);
        sc.ret = if on(RET_VAL) {
            Ret::Val(c.ret)
        } else {
            Ret::Unknown
        };
        sc.dur = on(HAS_DUR).then_some(c.dur);
        sc.dur_src = dur_src_of(c.dur_src);
        sc.arrived = on(HAS_ARRIVED).then_some(c.arrived);
        sc.sched = c.sched;
        sc.extra = match c.extra {
            X_DATA => {
                let bytes: Vec<u8> = data.drain(..c.data_len as usize).collect();
                Extra::Data(crate::event::Data::new(&bytes, on(DATA_TRUNCATED)))
            }
            X_FDPAIR => Extra::FdPair(c.a, c.b),
            X_NEWFD => Extra::NewFd(c.a),
            X_DUPFD => Extra::DupFd,
            X_CLOSE_RANGE => Extra::CloseRange(c.a as u32, c.b as u32),
            X_CLONE => Extra::Clone { thread: c.a != 0 },
            _ => Extra::None,
        };
        Event {
            tid: c.tid,
            ts: c.ts,
            line: 0,
            kind: EventKind::Syscall(sc),
        }
    }
}

/// What `take_upto` hands over: the events, and the records lost before the event at each
/// index (sorted by index).
pub(crate) struct Taken {
    pub events: VecDeque<Event>,
    pub lost: Vec<(usize, u64)>,
}

/// What an event costs kept whole: its inline size and what it owns on the heap (strings,
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
        EventKind::ThreadName(s) | EventKind::Program(s) => n += s.len(),
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
        // Sized once for the most events the bounds admit: a VecDeque that regrows
        // doubles, and as its head wraps through the whole allocation every page of it
        // becomes resident, so RSS would step up by the old size (seen as a step in the
        // second soak's floor: bench/RESULTS.md, Soak).
        let max_events = max_bytes / std::mem::size_of::<Event>() + 1;
        let most = max_events.min(max_bytes / std::mem::size_of::<Held>() + 1);
        Ring {
            slots: VecDeque::with_capacity(most),
            data: VecDeque::new(),
            bytes: 0,
            max_bytes,
            max_events,
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
        self.pushed - self.slots.len() as u64
    }

    /// Adds an event at time `now` (the tracer's clock) and evicts what is too old or does
    /// not fit.
    #[cfg(test)]
    pub(crate) fn push(&mut self, mut ev: Event, now: Nanos) {
        self.push_from(&mut ev, now);
    }

    /// `push`, taking what `ev` owns and leaving the rest of it (an event still in the
    /// tracer's batch is not moved out first).
    pub(crate) fn push_from(&mut self, ev: &mut Event, now: Nanos) {
        let (held, head) = Held::of(ev);
        if let Some(h) = &head {
            self.data.extend(h.bytes());
        }
        self.bytes += held.bytes();
        self.slots.push_back(held);
        self.pushed += 1;
        let horizon = match self.hold_from {
            Some(h) => h.min(now - self.keep_ns),
            None => now - self.keep_ns,
        };
        while let Some(front) = self.slots.front() {
            let too_old = front.end() < horizon;
            let too_big = self.bytes > self.max_bytes || self.slots.len() > self.max_events;
            if !(too_old || too_big) {
                break;
            }
            let held = self.slots.pop_front().expect("front exists");
            if !too_old {
                self.evicted_early += 1;
                self.evicted_upto = Some(held.end());
            }
            self.bytes -= held.bytes();
            match held {
                Held::Call(c) => {
                    self.data.drain(..c.data_len as usize);
                    if let Some(b) = c.sched {
                        self.spent.push(b);
                    }
                }
                Held::Whole(mut e) => crate::live::spend(&mut e, &mut self.spent),
            }
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
    /// among them; the later ones stay. Decoded here, once per incident (the ring keeps
    /// them compact); nothing handed over is wanted again: the next report starts after
    /// this one's last event.
    pub(crate) fn take_upto(&mut self, from: Nanos, cut: u64) -> Taken {
        let front = self.front_seq();
        let n = (cut.saturating_sub(front) as usize).min(self.slots.len());
        let mut out = VecDeque::with_capacity(n);
        for held in self.slots.drain(..n) {
            out.push_back(held.into_event(&mut self.data));
        }
        // Each thread's last call handed over stays behind as a mark at its end: a gap that
        // began there and ends after the cut (the main thread spinning in a script when an
        // incident is cut early) is then seen by the next report, which starts at that
        // gap. Without it the gap was in neither report: the first ends before the gap's
        // end, the second starts after its beginning.
        for mut m in boundary_marks(&out).into_iter().rev() {
            let (held, head) = Held::of(&mut m);
            if let Some(h) = &head {
                for b in h.bytes().iter().rev() {
                    self.data.push_front(*b);
                }
            }
            self.slots.push_front(held);
        }
        self.bytes = self.slots.iter().map(Held::bytes).sum();
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
        self.slots.back().map(|e| e.end())
    }

    /// Start of the oldest event held.
    #[cfg(test)]
    pub(crate) fn oldest(&self) -> Option<Nanos> {
        self.slots.front().map(|e| e.ts())
    }

    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.data.clear();
        self.lost.clear();
        self.bytes = 0;
        self.hold_from = None;
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The ring's share of `--ring-size` changed (instances came or went): events past the
    /// new bound are evicted at the next push, and the slots' allocation follows a smaller
    /// bound down, so that the rings of every instance together stay within the budget.
    pub(crate) fn set_max_bytes(&mut self, max_bytes: usize) {
        if max_bytes == self.max_bytes {
            return;
        }
        self.max_bytes = max_bytes;
        self.max_events = max_bytes / std::mem::size_of::<Event>() + 1;
        let most = self
            .max_events
            .min(max_bytes / std::mem::size_of::<Held>() + 1);
        if self.slots.capacity() > most * 2 {
            self.slots.shrink_to(most.max(self.slots.len()));
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
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

    fn held_bytes(mut ev: Event) -> usize {
        Held::of(&mut ev).0.bytes()
    }

    /// Events as the live backends make them, and the rarer ones kept whole, come back
    /// from the ring as they went in; the compact ones cost a third of an event or less.
    #[test]
    fn events_come_back_as_they_went_in_and_the_compact_ones_are_small() {
        use crate::event::{Data, SchedDelta, SchedSpan};
        let mut evs = vec![];
        let mut read = call(5);
        if let EventKind::Syscall(sc) = &mut read.kind {
            sc.fd = Some(7);
            sc.ret = Ret::Val(31);
            sc.dur = Some(1234);
            sc.dur_src = DurSource::Measured;
            sc.arrived = Some(3);
            sc.extra = Extra::Data(Data::new(
                b"*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000001\r\n",
                true,
            ));
            sc.sched = Some(Box::new(SchedSpan {
                during: SchedDelta {
                    on_cpu_ns: 9,
                    runnable_ns: 8,
                    minor_faults: 7,
                    major_faults: 6,
                    throttled_ns: None,
                    reclaim_ns: None,
                },
                before: Some(SchedDelta::default()),
            }));
        }
        evs.push(read);
        for extra in [
            Extra::FdPair(3, 4),
            Extra::NewFd(9),
            Extra::DupFd,
            Extra::CloseRange(3, u32::MAX),
            Extra::Clone { thread: true },
            Extra::Data(Data::new(b"+OK\r\n", false)),
            Extra::Path("/var/lib/redis/dump.rdb".into()),
            Extra::Socket("AF_INET"),
        ] {
            let mut e = call(6);
            if let EventKind::Syscall(sc) = &mut e.kind {
                sc.extra = extra;
                sc.ret = Ret::Unknown;
            }
            evs.push(e);
        }
        let mut err = call(7);
        if let EventKind::Syscall(sc) = &mut err.kind {
            sc.ret = Ret::Err("EAGAIN");
            sc.fd = Some(0);
            sc.dur = None;
        }
        evs.push(err);
        let mut stamped = call(8);
        stamped.line = 12;
        evs.push(stamped);
        evs.push(Event {
            tid: 3,
            ts: 9,
            line: 0,
            kind: EventKind::ThreadName("io_thd_1".into()),
        });
        let mut r = Ring::new(1 << 30, 1_000);
        for e in &evs {
            r.push(e.clone(), 10);
        }
        let counted: usize = evs.iter().map(|e| held_bytes(e.clone())).sum();
        assert_eq!(r.bytes(), counted);
        let got = r.take_upto(0, r.next_seq()).events;
        assert_eq!(got.iter().cloned().collect::<Vec<_>>(), evs);
        assert!(
            std::mem::size_of::<Held>() * 3 <= std::mem::size_of::<Event>(),
            "{} bytes",
            std::mem::size_of::<Held>()
        );
    }

    #[test]
    fn keeps_the_last_window_by_time() {
        let mut r = Ring::new(1 << 30, 10);
        for t in 0..100 {
            r.push(call(t), t);
        }
        assert!(r.oldest().unwrap() >= 89, "{:?}", r.oldest());
        assert_eq!(r.newest(), Some(99));
        assert_eq!(r.evicted_early, 0);
    }

    #[test]
    fn bytes_bound_wins_over_time_and_is_counted() {
        // Events kept whole (a strace line's): the byte bound is the one reached.
        let whole = |t: Nanos| {
            let mut e = call(t);
            e.line = 1 + t as u64;
            e
        };
        let one = held_bytes(whole(0));
        let mut r = Ring::new(one * 5, 1_000_000);
        for t in 0..50 {
            r.push(whole(t), t);
        }
        assert_eq!(r.len(), 5);
        assert!(r.bytes() <= one * 5);
        assert_eq!(r.evicted_early, 45);
        assert_eq!(r.evicted_upto(), Some(44));
        // Compact ones: a third of the bytes each, but no more of them than whole events
        // the bound admits (their hand-over is decoded to whole events).
        let mut r = Ring::new(std::mem::size_of::<Event>() * 5, 1_000_000);
        for t in 0..50 {
            r.push(call(t), t);
        }
        assert_eq!(r.len(), 6);
        assert_eq!(r.bytes(), 6 * held_bytes(call(0)));
        assert_eq!(r.evicted_early, 44);
        assert_eq!(r.evicted_upto(), Some(43));
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
        assert_eq!(r.bytes(), 11 * held_bytes(call(0)));
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
