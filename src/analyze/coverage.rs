//! Coverage: how much of this trace can be measured. It counts events and calls, how their
//! durations were known (measured by the tracer or reconstructed), the calls cut by the
//! trace's edges and the events a live backend lost, and decides once, at the end, whether
//! gaps between calls can be trusted at all (`GapVerdict`).

use super::call::{Facts, ResolvedCall};
use crate::event::{DurSource, InFlight, Nanos, Ret};
use crate::report::{self, Durations, RERUN};
use crate::source::{Clock, Counters, SourceInfo, TimeFmt};
use crate::units::human;

#[derive(Default)]
pub(crate) struct Coverage {
    /// Events that are no call (a call is counted once, in `syscalls`; the report's
    /// events are both).
    other_events: u64,
    syscalls: u64,
    /// The earliest call's start; meaningful once `syscalls > 0` (`first`): a plain
    /// minimum per call, no `Option` rebuilt on each.
    first_ts: Nanos,
    last_ts: Nanos,
    measured: u64,
    /// The shortest measured call (a trace filtered by duration has no short one).
    min_measured: Nanos,
    reconstructed: u64,
    in_flight_start: u64,
    in_flight_end: u64,
    lost_events: u64,
    /// Event-loop waits that returned ready fds, and the calls that serve them (reads,
    /// receives, accepts): a loop told of work that never takes it is a filtered trace.
    ready_waits: u64,
    takes: u64,
}

/// Ready-fd returns of event-loop waits that, with no read or accept in the trace at all,
/// show that the calls serving them were filtered out (a few could be pipe wake-ups or
/// writable sockets; every serving loop reads or accepts soon).
const READY_WITHOUT_TAKES: u64 = 3;

/// Uses of an fd by the thread that closed it, with no creating call between, that show a
/// trace without its fd-creating calls (one could be an fd passed over a unix socket); as
/// many rereads of /proc/PID/stat through one open (one could follow an lseek).
const UNTRACED_OPENS_MIN: u64 = 2;

/// Most kinds of call a trace filtered with `-e trace=` is taken to hold: redis's latency
/// guide asks for one (`-e trace=fdatasync`); a filter by class (`%file`, `%desc`) holds
/// more, but then calls of other kinds are missing too, which the other verdicts see.
pub(crate) const FILTERED_KINDS_MAX: u32 = 4;

/// Calls, all failed, that show a `-Z` trace (fewer could be a trace cut to a few lines).
const FAILED_ONLY_MIN: u64 = 5;

/// Why the gaps between a thread's calls cannot be trusted in a trace.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum GapVerdict {
    /// Not one event-loop wait (epoll, select/poll): `strace -e trace=...`, or a few lines.
    Filtered {
        syscalls: u64,
        /// Kinds of call in the trace (`Latency::kinds`): few only when `-e trace=` was used.
        kinds: u32,
        /// A perf trace: no strace option filtered it.
        perf: bool,
    },
    /// Event-loop waits returned ready fds this many times, yet no call read or accepted:
    /// `-e trace=` kept the waits and dropped the calls that serve them.
    ServingFiltered { ready: u64 },
    /// A thread used an fd it had closed this many times with no call creating it in
    /// between: `-e trace=` dropped the calls that create fds (accept, socket...).
    /// Or reads returned the start of a /proc/PID/stat again through one open (`rereads`):
    /// redis's opens and closes of it were not traced.
    UntracedOpens { reuses: u64, rereads: u64 },
    /// Child processes ran in the trace (a SIGCHLD named each) with no fork, vfork or clone
    /// in it creating them: `-e trace=` (such as `%desc`) dropped the calls that create
    /// processes, and with them a fork's own time.
    UntracedChildren { children: u64 },
    /// No call shorter than this: `perf trace --duration`.
    DurationFiltered { min: Nanos },
    /// Every call failed: `strace -Z` (`--failed-only`), or `perf trace --failure` (`perf`),
    /// printed only those.
    FailedOnly { syscalls: u64, perf: bool },
    /// Timestamps coarser than the threshold (`-t`).
    CoarseClock { resolution: Nanos },
    /// `-r` times are per printed line, not per thread.
    RelativeAcrossThreads,
    /// No timestamps at all; `measured`: `-T` still timed each call.
    NoTimestamps { measured: bool },
}

impl GapVerdict {
    /// The sentence the findings show.
    pub(crate) fn why(&self) -> String {
        match self {
            GapVerdict::Filtered { kinds, perf, .. } if !*perf && *kinds <= FILTERED_KINDS_MAX => {
                "the trace looks filtered (-e trace=...)".into()
            }
            GapVerdict::Filtered { .. } => "the trace has no wait of an event loop".into(),
            GapVerdict::ServingFiltered { ready } => format!(
                "event-loop waits returned ready fds {ready} times, yet the trace has not one \
                 read, receive or accept: strace was probably run with -e trace=..., and a gap \
                 may be calls that were not traced"
            ),
            GapVerdict::UntracedOpens { reuses, rereads } => {
                let mut seen = vec![];
                if *reuses > 0 {
                    seen.push(format!(
                        "{reuses} times a thread read or wrote an fd it had closed itself, with \
                         no call in the trace creating it again (accept, socket, open...)"
                    ));
                }
                if *rereads > 0 {
                    seen.push(format!(
                        "{rereads} reads returned the start of /proc/PID/stat again through \
                         an fd with no open of it in between (redis opens it anew for every \
                         memory sample)"
                    ));
                }
                format!(
                    "{}: strace was probably run with -e trace=... (such as %desc, \
                     %file,%desc or a list of calls), and a gap may be calls that were not \
                     traced",
                    seen.join("; ")
                )
            }
            GapVerdict::UntracedChildren { children } => format!(
                "{children} child process{} of redis ran in the trace (a SIGCHLD named {}) \
                 with no fork, vfork or clone in the trace creating {}: strace was probably \
                 run with -e trace=... that leaves out process calls (such as %desc or \
                 %network,%desc), so a gap may be calls that were not traced, a fork's own \
                 time among them, and the child's calls were counted as the traced \
                 process's",
                if *children == 1 { "" } else { "es" },
                if *children == 1 { "it" } else { "each" },
                if *children == 1 { "it" } else { "them" },
            ),
            GapVerdict::DurationFiltered { min } => format!(
                "no call in the trace is shorter than {}: it was filtered by duration \
                 (perf trace --duration), so calls are missing between the ones shown",
                human(min / 1000)
            ),
            GapVerdict::FailedOnly { syscalls, perf } => format!(
                "all {syscalls} calls in the trace failed: {} was run with {}, so the calls \
                 that succeeded between them are missing",
                if *perf { "perf trace" } else { "strace" },
                if *perf {
                    "--failure"
                } else {
                    "-Z (--failed-only)"
                }
            ),
            GapVerdict::CoarseClock { resolution } => format!(
                "timestamps have a resolution of {}, so neither gaps nor commands' times from \
                 read to reply (nor clients' waits) can be measured, only each call's own -T \
                 time{}",
                human(resolution / 1000),
                // Only strace -t prints whole seconds.
                if *resolution >= 1_000_000_000 {
                    " (strace -t): use -tt or -ttt"
                } else {
                    ""
                }
            ),
            GapVerdict::NoTimestamps { measured: true } => format!(
                "the trace has no timestamps: gaps between calls cannot be measured, only \
                 each call's own -T time; {RERUN}"
            ),
            GapVerdict::NoTimestamps { measured: false } => format!(
                "the trace has no timestamps and no -T: no duration can be known, so no \
                 stall can be found; {RERUN}"
            ),
            GapVerdict::RelativeAcrossThreads => {
                "-r times are relative to the previous line, not to the thread's previous call"
                    .into()
            }
        }
    }
    /// Calls are missing, but the event loop's waits are in the trace: a main-thread gap
    /// is still time in which the loop did not wait for work, though what the thread did
    /// then (an untraced call, or CPU) is not known.
    pub(crate) fn loop_traced(&self) -> bool {
        matches!(
            self,
            GapVerdict::UntracedOpens { .. }
                | GapVerdict::ServingFiltered { .. }
                | GapVerdict::UntracedChildren { .. }
        )
    }
    /// Times are too coarse (or absent) to order calls of different threads or to time
    /// anything spanning two calls: which commands waited through a stall, and which
    /// stalls overlapped, are not known.
    pub(crate) fn coarse(&self) -> bool {
        matches!(
            self,
            GapVerdict::CoarseClock { .. } | GapVerdict::NoTimestamps { .. }
        )
    }
    /// Calls are missing from the trace (rather than times being imprecise).
    pub(crate) fn is_filtered(&self) -> bool {
        matches!(
            self,
            GapVerdict::Filtered { .. }
                | GapVerdict::ServingFiltered { .. }
                | GapVerdict::UntracedOpens { .. }
                | GapVerdict::UntracedChildren { .. }
                | GapVerdict::DurationFiltered { .. }
                | GapVerdict::FailedOnly { .. }
        )
    }
}

impl Coverage {
    pub(crate) fn new() -> Self {
        Coverage {
            min_measured: Nanos::MAX,
            first_ts: Nanos::MAX,
            ..Default::default()
        }
    }

    /// An event that is no call: counted; strace's own messages may have no
    /// trustworthy time, so only calls move the trace's first and last time.
    #[inline]
    pub(crate) fn on_event(&mut self) {
        self.other_events += 1;
    }

    /// A call (an event too: the kind is matched once, in `Analyzer::push`, feed.rs).
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) {
        let sc = cx.sc;
        let ts = cx.ts();
        self.first_ts = self.first_ts.min(ts);
        // As `Event::end`: saturating.
        self.last_ts = self.last_ts.max(ts.saturating_add(cx.dur));
        self.syscalls += 1;
        // The edges of a trace, exits, and the calls an exit cut short (`= ?`) are timed
        // by pairing even under -T: none of them counts as measured or reconstructed. The
        // common case (measured, none of those) is tested first.
        let edge = sc.in_flight.is_some() || cx.facts.has(Facts::EXIT);
        match sc.dur_src {
            DurSource::Measured if !edge => {
                self.measured += 1;
                self.min_measured = self.min_measured.min(cx.dur);
            }
            DurSource::UpperBound if !edge => self.reconstructed += 1,
            DurSource::Paired if !edge && !matches!(sc.ret, Ret::Unknown) => {
                self.reconstructed += 1
            }
            _ => {}
        }
        if cx.facts.has(Facts::RECV | Facts::ACCEPT) {
            self.takes += 1;
        } else if cx.facts.has(Facts::EPOLL | Facts::POLL) && sc.ret.val().is_some_and(|n| n > 0) {
            self.ready_waits += 1;
        }
        if let Some(f) = sc.in_flight {
            match f {
                InFlight::AtStart => self.in_flight_start += 1,
                InFlight::AtEnd => self.in_flight_end += 1,
            }
        }
    }

    /// Live perf backend: events lost to ring-buffer overflow.
    pub(crate) fn add_lost(&mut self, n: u64) {
        self.lost_events += n;
    }
    pub(crate) fn lost(&self) -> u64 {
        self.lost_events
    }
    pub(crate) fn first(&self) -> Option<Nanos> {
        (self.syscalls > 0).then_some(self.first_ts)
    }
    pub(crate) fn last(&self) -> Nanos {
        self.last_ts
    }

    /// A trace with no short call at all was filtered by duration (`perf trace --duration`):
    /// redis makes calls of a few microseconds every 100 ms even when idle (serverCron reads
    /// /proc), so between two printed calls there were unprinted ones.
    fn duration_filter(&self) -> Option<Nanos> {
        (self.measured >= 20 && self.min_measured >= 100_000).then_some(self.min_measured)
    }

    /// Why gaps between syscalls cannot be trusted in this trace, if they cannot: a filtered
    /// trace (`no_event_loop`: not one epoll_wait), a clock coarser than the threshold, or
    /// `-r` times across threads. The clock is explicit: live, the caller's, while tracing.
    /// `failed`: how many calls returned an error; `untraced`: uses of an fd by the thread
    /// that had closed it with no creating call in between (`FdTable::note_reuse`), and
    /// rereads of /proc/PID/stat through one open (`FdTable::note_stat_read`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gap_verdict(
        &self,
        clock: &Clock,
        threshold_ns: Nanos,
        no_event_loop: bool,
        untraced: (u64, u64),
        untraced_children: u64,
        threads: usize,
        failed: u64,
    ) -> Option<GapVerdict> {
        if !has_timestamps(clock) {
            return Some(GapVerdict::NoTimestamps {
                measured: self.measured > 0,
            });
        }
        // A running redis's calls nearly all succeed (its event loop's waits, reads and
        // writes): a trace in which a few and every one failed printed only failures.
        if self.syscalls >= FAILED_ONLY_MIN && failed == self.syscalls {
            return Some(GapVerdict::FailedOnly {
                syscalls: self.syscalls,
                perf: clock.perf,
            });
        }
        // Gaps are time between waits for work: with no such wait at all the trace was
        // filtered (-e trace=...) or cut to a few lines, and a gap may be untraced calls.
        if self.syscalls > 0 && no_event_loop {
            return Some(GapVerdict::Filtered {
                syscalls: self.syscalls,
                // Filled in by the analyzer from the latency unit's per-syscall table
                // (`Latency::kinds`), which holds every call already: a bit per call here
                // cost ~6 instructions an event.
                kinds: 0,
                perf: clock.perf,
            });
        }
        if let Some(min) = self.duration_filter() {
            return Some(GapVerdict::DurationFiltered { min });
        }
        // After the duration filter: a trace cut by duration misses its short reads too.
        if self.takes == 0 && self.ready_waits >= READY_WITHOUT_TAKES {
            return Some(GapVerdict::ServingFiltered {
                ready: self.ready_waits,
            });
        }
        // A live backend that lost events may have lost the creating calls: the lost count
        // already says the trace is incomplete, and where.
        let (reuses, rereads) = untraced;
        if (reuses >= UNTRACED_OPENS_MIN || rereads >= UNTRACED_OPENS_MIN) && self.lost_events == 0
        {
            return Some(GapVerdict::UntracedOpens { reuses, rereads });
        }
        if untraced_children > 0 && self.lost_events == 0 {
            return Some(GapVerdict::UntracedChildren {
                children: untraced_children,
            });
        }
        // perf trace prints milliseconds: its fraction digits count from 1 ms, strace's
        // from 1 s.
        let unit: u32 = if clock.perf { 6 } else { 9 };
        let resolution = 10i64.pow(unit.saturating_sub(clock.frac_digits as u32).min(9));
        let precise = clock.frac_digits > 0 || clock.wall_at_first.is_some();
        if !precise || resolution * 2 > threshold_ns {
            return Some(GapVerdict::CoarseClock { resolution });
        }
        if clock.fmt == TimeFmt::Relative && !clock.perf && threads > 1 {
            return Some(GapVerdict::RelativeAcrossThreads);
        }
        None
    }

    /// Nothing in the trace measures time: no timestamps and no -T.
    pub(crate) fn measures_nothing(&self, clock: &Clock) -> bool {
        !has_timestamps(clock) && self.measured == 0
    }

    fn durations(&self, clock: &Clock) -> Durations {
        if self.measures_nothing(clock) {
            return Durations::None;
        }
        match (self.measured, self.reconstructed) {
            (_, 0) => Durations::Measured,
            (0, _) => Durations::Reconstructed,
            _ => Durations::Mixed,
        }
    }

    /// The summary block, but for the stall counts (known once stalls are kept) and the
    /// thread counts (the world's).
    pub(crate) fn summary(&self, counters: &Counters, clock: &Clock) -> report::Summary {
        let first = self.first().unwrap_or(0);
        report::Summary {
            lines: counters.lines,
            events: self.other_events + self.syscalls,
            syscalls: self.syscalls,
            start: self.first().map(|_| clock.format(first)),
            start_iso: clock.iso(first),
            span_us: (self.last_ts - first).max(0) / 1000,
            skipped_lines: counters.skips.total,
            durations: self.durations(clock),
            lost_events: self.lost_events,
            in_flight_at_end: self.in_flight_end,
            in_flight_at_start: self.in_flight_start,
            command_start: None,
            ..Default::default()
        }
    }
}

/// Whether the trace's events carry times (live sources always do).
fn has_timestamps(clock: &Clock) -> bool {
    clock.fmt != TimeFmt::None || clock.perf || clock.wall_at_first.is_some()
}

/// A clock coarser than the threshold (strace -t's whole seconds) times each call only by
/// its -T: what spans two calls, a command's read to its reply, is unknown to a tick either
/// way (a SET read at :46 and answered in the same millisecond at :47 would read as 1 s).
/// The commands table and its per-phase rows are left out.
pub(crate) fn without_command_times(r: &mut report::Report) {
    r.commands.clear();
    r.phase_stats
        .retain(|p| !matches!(p.what, report::PhaseStatsOf::Command(_)));
}

/// As `without_command_times`: a client's wait through a stall spans two calls too.
pub(crate) fn without_waits(r: &mut report::Report) {
    r.stalls.iter_mut().for_each(|s| s.waiting.worst_us = None);
    r.incidents.iter_mut().for_each(|i| i.worst_wait_us = None);
}

/// The first skipped lines, each named by its file when there are several.
pub(crate) fn skipped(counters: &Counters, info: &SourceInfo) -> Vec<report::Skipped> {
    counters
        .skips
        .first
        .iter()
        .map(|(file, line, reason, text)| report::Skipped {
            line: *line,
            file: (info.files.len() > 1).then(|| file.clone()),
            reason: *reason,
            text: text.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};
    use crate::analyze::roles::Role;

    fn clock(fmt: TimeFmt, frac_digits: u8) -> Clock {
        Clock {
            fmt,
            frac_digits,
            ..Clock::none()
        }
    }

    #[test]
    fn verdicts() {
        let mut c = Coverage::new();
        let e = event(1, 0, 5_000, "read");
        for _ in 0..1000 {
            c.on_call(&call(&e, Role::Main, None));
        }
        let epoch = clock(TimeFmt::Epoch, 6);
        assert_eq!(
            c.gap_verdict(&epoch, 10_000_000, true, (0, 0), 0, 1, 0),
            Some(GapVerdict::Filtered {
                syscalls: 1000,
                kinds: 0,
                perf: false
            })
        );
        assert_eq!(
            c.gap_verdict(&epoch, 10_000_000, false, (0, 0), 0, 1, 0),
            None
        );
        assert_eq!(
            c.gap_verdict(&epoch, 10_000_000, false, (2, 0), 0, 1, 0),
            Some(GapVerdict::UntracedOpens {
                reuses: 2,
                rereads: 0
            })
        );
        assert_eq!(
            c.gap_verdict(&epoch, 10_000_000, false, (1, 0), 0, 1, 0),
            None,
            "one reuse could be an fd passed over a unix socket"
        );
        // A child process ran in the trace with no fork or clone in it (-e trace=%desc).
        let v = c.gap_verdict(&epoch, 10_000_000, false, (0, 0), 1, 1, 0);
        assert_eq!(v, Some(GapVerdict::UntracedChildren { children: 1 }));
        let v = v.unwrap();
        assert!(v.is_filtered() && v.loop_traced());
        assert!(v
            .why()
            .starts_with("1 child process of redis ran in the trace"));
        let secs = clock(TimeFmt::Epoch, 0);
        assert_eq!(
            c.gap_verdict(&secs, 10_000_000, false, (0, 0), 0, 1, 0),
            Some(GapVerdict::CoarseClock {
                resolution: 1_000_000_000
            })
        );
        assert_eq!(
            c.gap_verdict(&Clock::none(), 10_000_000, false, (0, 0), 0, 1, 0),
            Some(GapVerdict::NoTimestamps { measured: true }),
            "-T but no timestamps"
        );
        let rel = clock(TimeFmt::Relative, 6);
        assert_eq!(
            c.gap_verdict(&rel, 10_000_000, false, (0, 0), 0, 2, 0),
            Some(GapVerdict::RelativeAcrossThreads)
        );
        assert_eq!(
            c.gap_verdict(&rel, 10_000_000, false, (0, 0), 0, 1, 0),
            None
        );
        // strace -Z: every call printed failed.
        let v = c.gap_verdict(&epoch, 10_000_000, false, (0, 0), 0, 1, 1000);
        assert_eq!(
            v,
            Some(GapVerdict::FailedOnly {
                syscalls: 1000,
                perf: false
            })
        );
        assert!(v.as_ref().unwrap().is_filtered());
        assert!(v.unwrap().why().contains("strace was run with -Z"));
        // perf trace --failure: the same, in perf's words.
        let mut perf = epoch.clone();
        perf.perf = true;
        let v = c
            .gap_verdict(&perf, 10_000_000, false, (0, 0), 0, 1, 1000)
            .unwrap();
        assert_eq!(
            v.why(),
            "all 1000 calls in the trace failed: perf trace was run with --failure, so the \
             calls that succeeded between them are missing"
        );
        assert_eq!(
            c.gap_verdict(&epoch, 10_000_000, false, (0, 0), 0, 1, 999),
            None
        );
    }

    #[test]
    fn only_long_calls_mean_a_duration_filter() {
        let mut c = Coverage::new();
        let e = event(1, 0, 150_000, "read");
        for _ in 0..20 {
            c.on_call(&call(&e, Role::Main, None));
        }
        let epoch = clock(TimeFmt::Epoch, 6);
        let v = c.gap_verdict(&epoch, 10_000_000, false, (0, 0), 0, 1, 0);
        assert_eq!(v, Some(GapVerdict::DurationFiltered { min: 150_000 }));
        assert!(v.unwrap().is_filtered());
        let short = event(1, 0, 3_000, "read");
        c.on_call(&call(&short, Role::Main, None));
        assert_eq!(
            c.gap_verdict(&epoch, 10_000_000, false, (0, 0), 0, 1, 0),
            None
        );
        assert_eq!(c.durations(&epoch), Durations::Measured);
        assert_eq!(
            c.durations(&Clock::none()),
            Durations::Measured,
            "-T measures"
        );
        assert_eq!(
            Coverage::new().durations(&Clock::none()),
            Durations::None,
            "nothing measures"
        );
    }
}
