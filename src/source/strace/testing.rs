//! What the strace parser's tests share: builders of the exact events a line must give, and
//! a fresh parser fed lines. The tests themselves sit next to the module whose job they
//! check (every line shape of the captures README, DESIGN.md and issues 2/7, verbatim where
//! a capture has it).

pub(super) use super::body::*;
pub(super) use super::*;
pub(super) use crate::event::{Data, DurSource, Event, EventKind, Extra, InFlight, Ret, Syscall};

pub(super) const US: i64 = 1_000;
pub(super) const MS: i64 = 1_000_000;
pub(super) const S: i64 = 1_000_000_000;
pub(super) const DAY: i64 = 86_400 * S;

/// ns since midnight of `HH:MM:SS` + `us` microseconds.
pub(super) fn tod(h: i64, m: i64, s: i64, us: i64) -> i64 {
    (h * 3600 + m * 60 + s) * S + us * US
}

/// Builder for an expected syscall event.
pub(super) struct X(pub(super) Event);

pub(super) fn call(tid: Tid, ts: i64, line: u64, name: &'static str) -> X {
    X(Event {
        tid,
        ts,
        line,
        kind: EventKind::Syscall(Syscall::new(name)),
    })
}

impl X {
    pub(super) fn sc(&mut self) -> &mut Syscall {
        match &mut self.0.kind {
            EventKind::Syscall(s) => s,
            _ => unreachable!(),
        }
    }
    pub(super) fn fd(mut self, fd: i32) -> Self {
        self.sc().fd = Some(fd);
        self
    }
    pub(super) fn fd_path(mut self, p: &str) -> Self {
        self.sc().fd_path = Some(p.into());
        self
    }
    pub(super) fn ret(mut self, r: Ret) -> Self {
        self.sc().ret = r;
        self
    }
    pub(super) fn val(self, v: i64) -> Self {
        self.ret(Ret::Val(v))
    }
    pub(super) fn ret_path(mut self, p: &str) -> Self {
        self.sc().ret_path = Some(p.into());
        self
    }
    pub(super) fn dur(mut self, d: i64, src: DurSource) -> Self {
        self.sc().dur = Some(d);
        self.sc().dur_src = src;
        self
    }
    pub(super) fn measured(self, d: i64) -> Self {
        self.dur(d, DurSource::Measured)
    }
    pub(super) fn in_flight(mut self, f: InFlight) -> Self {
        self.sc().in_flight = Some(f);
        self
    }
    pub(super) fn extra(mut self, e: Extra) -> Self {
        self.sc().extra = e;
        self
    }
    pub(super) fn path(self, p: &str) -> Self {
        self.extra(Extra::Path(p.into()))
    }
    pub(super) fn data(self, b: &[u8], truncated: bool) -> Self {
        self.extra(Extra::Data(Data::new(b, truncated)))
    }
    pub(super) fn start_line(mut self, l: u64) -> Self {
        self.sc().start_line = Some(l);
        self
    }
}

pub(super) fn ev(tid: Tid, ts: i64, line: u64, kind: EventKind) -> Event {
    Event {
        tid,
        ts,
        line,
        kind,
    }
}

/// Feeds lines to a fresh parser, then finishes it; returns the events and the skip reasons.
pub(super) fn run_lines(lines: &[&[u8]]) -> (Vec<Event>, Vec<(u64, SkipReason)>) {
    let mut p = StraceParser::default();
    let mut out = vec![];
    let mut skips = vec![];
    for (i, l) in lines.iter().enumerate() {
        if let LineOutcome::Skipped(r) = p.feed(l, &mut out) {
            skips.push((i as u64 + 1, r));
        }
    }
    p.finish(&mut out);
    (out, skips)
}

pub(super) fn run(lines: &[&str]) -> Vec<Event> {
    let b: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    let (out, skips) = run_lines(&b);
    assert!(skips.is_empty(), "unexpected skips {skips:?} in {lines:?}");
    out
}
