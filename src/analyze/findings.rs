//! Diagnosis: the last analyzer. It names the cause of each stall (reusing redis's LATENCY
//! DOCTOR event names where one fits, so users can connect the two tools) and turns the
//! stalls and statistics into findings: a headline, the evidence, and the advice a redis
//! expert would give with its trade-off. A stall no rule explains says so plainly.
//!
//! Findings are data: `RULES` (from the trace) and `LIVE_RULES` (what a live backend adds)
//! are tables of rules, each fed by an explicit evidence input, in the order the findings
//! are listed before they are sorted by severity.

use super::coverage::{GapVerdict, FILTERED_KINDS_MAX};
use super::file_time::FileTime;
use super::holds::Held;
use super::phases::Phases;
use super::roles::Role;
use super::stalls::{Cand, NoCommand};
use super::world::World;
use crate::fdtable::{FileClass, FileInfo, ProcKey};
use crate::redis_conf::RedisConf;
use crate::report::{
    Bound, CommandPhase, CommandStats, Finding, FindingId, Severity, Stall, StallKind,
};
use crate::syscalls::{Blocking, Facts};
pub use crate::units::{human, plural};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

fn class_words(c: FileClass) -> &'static str {
    match c {
        FileClass::Aof => "the AOF",
        FileClass::AofManifest => "the AOF manifest",
        FileClass::AofRewriteTemp => "the AOF rewrite temp file",
        FileClass::Rdb => "the RDB file",
        FileClass::RdbTemp => "the RDB temp file",
        FileClass::Log => "the log file",
        FileClass::Client => "a client socket",
        FileClass::Listener => "the listening socket",
        FileClass::Replica => "a replication link",
        FileClass::Outgoing => "an outgoing connection",
        FileClass::Pipe => "a pipe",
        FileClass::Epoll => "the epoll fd",
        FileClass::Dir => "a directory",
        FileClass::Proc => "a /proc file",
        FileClass::AnonInode => "an in-memory fd",
        FileClass::Other => "a file",
        FileClass::Unknown => "an fd of unknown type",
    }
}

/// What the findings read from the other units: an explicit input instead of the
/// analyzer's fields.
pub(crate) struct Evidence<'a> {
    pub(crate) phases: &'a Phases,
    pub(crate) file_time: &'a FileTime,
    pub(crate) world: &'a World,
    /// Why gaps cannot be trusted, when they cannot.
    pub(crate) gaps: Option<&'a GapVerdict>,
    pub(crate) conf: Option<&'a RedisConf>,
    pub(crate) threshold_us: i64,
    /// The most bytes one copy-on-write fault copies where the trace was taken, when the
    /// tracer knows (`Options::fault_copy_bytes`).
    pub(crate) fault_copy: Option<u64>,
    /// The traced process's CPU quota and period (µs), live, when its cgroup has one.
    pub(crate) quota: Option<(u64, u64)>,
    /// Live: the cgroup's readings over the trace, for the rules that read them
    /// (`limits`: memory reclaim, and throttling where the split does not measure it).
    pub(crate) cgroup: Option<&'a super::limits::CgEvidence>,
    /// Live: the CPUs the traced process may run on (`Options::cpus`).
    pub(crate) cpus: Option<&'a crate::report::Cpus>,
    /// The tracer stopped the threads at every call (ptrace, `Options::stamped_at_stops`):
    /// the time a stop waits for it counts as blocked in the scheduler's split.
    pub(crate) stopped_by_tracer: bool,
    /// Live: the host's steal time at each /proc reading (`Options::host_steal`).
    pub(crate) host_steal: &'a [(crate::event::Nanos, u64)],
    /// Processes whose main thread's event-loop wait an I/O thread made (valkey's offloaded
    /// poll): there the main thread runs the commands its I/O threads read with no call of
    /// its own between two of its replies (`NoCommand::Replies` does not hold).
    pub(crate) polls_shared: &'a [ProcKey],
}

#[cfg(test)]
impl<'a> Evidence<'a> {
    /// A whole offline trace's evidence at a 10 ms threshold: no filter, no config, no live
    /// readings.
    pub(crate) fn plain(phases: &'a Phases, file_time: &'a FileTime, world: &'a World) -> Self {
        Evidence {
            phases,
            file_time,
            world,
            gaps: None,
            conf: None,
            threshold_us: 10_000,
            fault_copy: None,
            quota: None,
            cgroup: None,
            cpus: None,
            stopped_by_tracer: false,
            host_steal: &[],
            polls_shared: &[],
        }
    }
}

/// (finding id, plain-words cause) for one stall. `running`: the command its thread ran
/// through all of it, when known (`Held::running`).
pub(crate) fn explain(
    a: &Evidence<'_>,
    c: &Cand,
    role: Role,
    running: Option<&str>,
) -> (Option<FindingId>, String) {
    let v = explain_trace(a, c, role, running);
    match a.cgroup {
        Some(cg) if matches!(role, Role::Main | Role::IoThread | Role::Other) => {
            super::limits::amend(cg, c, v)
        }
        _ => v,
    }
}

/// `explain` from the trace and the scheduler's split alone.
fn explain_trace(
    a: &Evidence<'_>,
    c: &Cand,
    role: Role,
    running: Option<&str>,
) -> (Option<FindingId>, String) {
    let bound = bound_words(c.dur_facts.bound);
    let who = match role {
        Role::Main => "main thread".to_string(),
        Role::Child => format!("background child {}", a.world.pid_of(c.proc, c.tid)),
        r => format!("{} thread {}", r.as_str(), c.tid),
    };
    let during = c
        .phase
        .and_then(|p| a.phases.child(p))
        .map(|child| format!(" while child {child} ran"))
        .unwrap_or_default();
    if c.kind == StallKind::Gap {
        let trusted = gap_as_read(a, c);
        let c: &Cand = &trusted;
        // A gap from a call of unknown length is at most what it says.
        let d = gap_words(c, &format!("{bound}{}", human(c.dur / 1000)));
        if let Some(v) = io_wait_of(a, c, role) {
            return (
                Some(FindingId::IoThreads),
                io_wait_words(c, &who, &d, &during, &v),
            );
        }
        if let Some(v) = sched_of_gap(a, c, role, &who, &d, &during, running) {
            return v;
        }
        // No command runs after the replies, and the words are the main thread's.
        if let Some(k) = c.through.no_command.filter(|k| match k {
            NoCommand::Answered => role == Role::Main,
            _ => matches!(role, Role::Main | Role::IoThread),
        }) {
            return no_command(a, c, k, &who, &d, &during);
        }
        // Kept in a trace missing calls only because commands waited through it (`Kept`).
        if a.gaps.is_some() {
            let what = running.map_or_else(
                || "while client commands waited".to_string(),
                |n| format!("while {n} ran (from its read to its reply)"),
            );
            return (
                Some(FindingId::Command),
                format!(
                    "{who} made no traced syscall for {bound}{}{during} {what}; the trace \
                     lacks some calls (-e trace=...), so whether the thread ran on a CPU or \
                     blocked in a call that was not traced (a sleep, a lock) is not known",
                    human(c.dur / 1000)
                ),
            );
        }
        return match role {
            Role::Main if c.phase.is_some() => (
                Some(FindingId::CowPageFaults),
                format!(
                    "{who} {d}{during}: copy-on-write page faults after fork (or CPU contention)"
                ),
            ),
            Role::Main => (
                Some(FindingId::Command),
                format!(
                    "{who} {d}: a slow command{}, or the process was descheduled",
                    running.map(|n| format!(" ({n})")).unwrap_or_default()
                ),
            ),
            _ => (
                None,
                format!("{who} {d} (CPU work or descheduled); no finding explains it"),
            ),
        };
    }
    let d = human(c.dur / 1000);
    let name = c.syscall.unwrap_or("?");
    let file = c.file.map(|f| a.world.file(f));
    let edge = match c.dur_facts.in_flight {
        Some(crate::event::InFlight::AtStart) => " (already running when tracing began)",
        Some(crate::event::InFlight::AtEnd) => " (still running when tracing ended)",
        None => "",
    };
    // Joined with `push_str`: three `format!` a row showed in a profile (bench/PROFILE.md,
    // eighth round), and every stall row of the report is one of these sentences. Room for
    // a long one at once: grown from `who` it was reallocated four times.
    let mut text = String::with_capacity(256);
    for part in [&who, " blocked ", bound, &d, " in ", name, "()"] {
        text.push_str(part);
    }
    on_what(&mut text, c, file);
    if let Some(e) = c.dur_facts.error {
        text.push_str(", which failed with ");
        text.push_str(e);
    }
    text.push_str(edge);
    let (fid, why) = cause_of_wait(a, c, role, file, &during);
    text.push_str(": ");
    text.push_str(&why);
    (fid, text)
}

/// The cause of a slow call: what it waited for when the trace shows more than its name
/// (`Waits`), else the rule for its call (`cause_of_call`).
fn cause_of_wait(
    a: &Evidence<'_>,
    c: &Cand,
    role: Role,
    file: Option<&FileInfo>,
    during: &str,
) -> (Option<FindingId>, String) {
    match c.dur_facts.waits {
        super::call::Waits::Lock => (Some(FindingId::LockWait), LOCK_WAIT.to_string()),
        // redis's main thread beside its event loop keeps redis's cause (MIGRATE's and a
        // replication handshake's synchronous waits are exactly this).
        super::call::Waits::Reply(_)
            if role == Role::Main && !a.world.no_event_loop() && !a.world.loop_is_poll(c.proc) =>
        {
            cause_of_call(a, c, role, file, during)
        }
        super::call::Waits::Reply(fd) => (
            Some(FindingId::AwaitsReply),
            format!(
                "it waited for the reply to the request it had just sent on fd {fd}: the peer \
                 (or the network) was slow to answer"
            ),
        ),
        super::call::Waits::AsNamed => cause_of_call(a, c, role, file, during),
    }
}

/// The I/O threads' cover of a main-thread gap, when the gap was the main thread waiting
/// for them (`io_wait`): never a slow command.
pub(crate) fn io_wait_of(
    a: &Evidence<'_>,
    c: &Cand,
    role: Role,
) -> Option<super::io_wait::IoCover> {
    if role != Role::Main || c.kind != StallKind::Gap {
        return None;
    }
    let trusted = gap_as_read(a, c);
    let c: &Cand = &trusted;
    let main_runnable = c.sched.map(|s| s.runnable_ns as i64);
    let mut v = c.through.io?;
    let threshold = a.threshold_us * 1000;
    if v.is_wait(threshold, c.dur, main_runnable) {
        return Some(v);
    }
    // The answered tail is read (and said) only where the wait needs it; a gap wholly
    // after every reply is that (`NoCommand::Answered`), no wait for the I/O threads.
    if c.through.no_command == Some(NoCommand::Answered) {
        return None;
    }
    v.answered = c.through.answered_tail(c.start + c.dur).min(v.tail);
    v.is_wait(threshold, c.dur, main_runnable).then_some(v)
}

/// The gap as its rules read it: the reading that every request read had been answered
/// (`Through::answered_from`) holds only where the trace shows every client read: not a
/// trace missing calls (`Evidence::gaps`), nor one of the main thread alone (`strace -p`
/// without -f: valkey's I/O threads read every request, and an EVAL's gap would be read as
/// after every reply); and while a child just forked runs its copy-on-write faults are the
/// finding, whatever the main thread did meanwhile. No command between two replies holds
/// where `replies_hold` says. Copied only when a reading is dropped from a gap that had it.
fn gap_as_read<'c>(a: &Evidence<'_>, c: &'c Cand) -> Cow<'c, Cand> {
    let drop_replies = c.through.no_command == Some(NoCommand::Replies) && !replies_hold(a, c);
    let drop_answered = c.through.answered_from.is_some() && !answered_holds(a, c);
    if !drop_replies && !drop_answered {
        return Cow::Borrowed(c);
    }
    let mut c = c.clone();
    if drop_replies {
        c.through.no_command = None;
    }
    if drop_answered {
        (c.through.answered_from, c.through.answered_io) = (None, false);
        if c.through.no_command == Some(NoCommand::Answered) {
            c.through.no_command = None;
        }
    }
    Cow::Owned(c)
}

/// Whether no command ran between two of the main thread's replies (`NoCommand::Replies`)
/// holds for this gap's trace: one with every call (no filter, no lost events) of every
/// thread of the process (valkey's I/O threads read requests whose commands its main thread
/// runs without a call of its own), none of which waits in the main thread's event loop for
/// it (valkey's offloaded poll: its main thread makes no loop wait between two turns).
fn replies_hold(a: &Evidence<'_>, c: &Cand) -> bool {
    a.gaps.is_none()
        && !c.events_lost
        && a.world.threads_followed(c.proc)
        && !a.polls_shared.contains(&c.proc)
}

/// Whether the reading that every request read had been answered holds for this gap's
/// trace (`gap_as_read`).
pub(crate) fn answered_holds(a: &Evidence<'_>, c: &Cand) -> bool {
    a.gaps.is_none() && c.phase.is_none() && a.world.threads_followed(c.proc)
}

/// What redis runs that is no command: its timers and its housekeeping between turns.
const OWN_WORK: &str = "its timers: expiry, eviction, rehashing; freeing clients";

/// Where `NoCommand::Answered` lay, in words; `io`: requests read later were still with
/// redis 8's own-loop I/O threads (`Through::answered_io`).
fn answered_words(io: bool) -> &'static str {
    if io {
        "after every request handed to it was answered (those read since were still with its \
         I/O threads, which hand requests over through an eventfd it had not yet read): no \
         command runs there (redis 8 runs one between that read and its reply's write)"
    } else {
        ANSWERED_PLAIN
    }
}

const ANSWERED_PLAIN: &str = "after every request it had read was answered: no command runs \
     there (redis runs one between its request's read and its reply's write)";

/// Where a gap lay that no command runs in (`NoCommand`), in words.
fn between_words(k: NoCommand) -> &'static str {
    match k {
        NoCommand::ProcFile => {
            "between two calls on the /proc file it was reading (redis opens, reads and \
             closes one back to back, as when it samples its memory)"
        }
        NoCommand::Dispatch => {
            "between its event-loop wait's return and its read of the notification fd it \
             woke for (the event's handler reads it first, before the commands of the \
             clients handed over, as redis 8's I/O threads hand them)"
        }
        NoCommand::Replies => {
            "between two of its writes to clients (redis writes a turn's replies one after \
             another once their commands have run; a later command's request is read first)"
        }
        NoCommand::Answered => ANSWERED_PLAIN,
    }
}

/// A gap between two calls redis runs no command between (`Through::no_command`) that the
/// scheduler's split, if any, did not explain (`sched_of_gap`). Without a split: off its CPU
/// (`off-cpu`), or after every reply the server's own work as well (`own-work`); with one
/// neither is claimed (its words say what it measured), but no command either.
fn no_command(
    a: &Evidence<'_>,
    c: &Cand,
    k: NoCommand,
    who: &str,
    d: &str,
    during: &str,
) -> (Option<FindingId>, String) {
    let (unsplit, which) = match SchedSplit::of(c, a.fault_copy) {
        None => (
            true,
            "no scheduler split in this trace says which".to_string(),
        ),
        Some(s) => (false, s.words()),
    };
    if k == NoCommand::Answered {
        // Not only off its CPU: the server's own work runs there too.
        let answered = answered_words(c.through.answered_io);
        return (
            unsplit.then_some(FindingId::OwnWork),
            format!(
                "{who} {d}{during} {answered}: not a slow command; the server's own work \
                 ({OWN_WORK}) or the thread off its CPU ({which})"
            ),
        );
    }
    (
        unsplit.then_some(FindingId::OffCpu),
        format!(
            "{who} {d}{during} {}: no command runs there; the thread was off its CPU: waiting \
             for one, or, under strace or ptrace, held at a syscall stop ({which})",
            between_words(k)
        ),
    )
}

/// A main-thread gap no rule explains that began after the stall of the command it held
/// had ended (`Held::finished`): the command is not named for it, and what it was is not
/// claimed.
pub(crate) fn after_its_command(c: &Cand, cmd: &str) -> (Option<FindingId>, String) {
    let d = gap_words(
        c,
        &format!("{}{}", bound_words(c.dur_facts.bound), human(c.dur / 1000)),
    );
    (
        None,
        format!(
            "main thread {d} after {cmd}'s own stall had ended: no other command is known to \
             have run through it, so it was the end of {cmd}'s work (its reply, its slowlog \
             entry) or the process descheduled; the trace cannot tell which"
        ),
    )
}

/// "main thread made no syscall for 12 ms: it waited for its I/O threads ...".
fn io_wait_words(
    c: &Cand,
    who: &str,
    d: &str,
    during: &str,
    v: &super::io_wait::IoCover,
) -> String {
    let main_runnable = c.sched.map(|s| s.runnable_ns as i64);
    let spun_for = v.spun_for(c.dur, main_runnable);
    let mut text = if v.calls == 0 && spun_for > 0 {
        format!(
            "{who} {d}{during}: it spun for its I/O threads, which had not finished their \
             share of the hand-off when they lost the CPU (redis 6/7's busy wait, valkey's \
             spin), not a slow command"
        )
    } else if v.calls == 0 && v.starved_through > 0 && !v.adjoining {
        format!(
            "{who} {d}{during}: it spun for its I/O threads, which had work in hand through it \
             (their next call, client I/O, came after it) and waited for a CPU (valkey's spin, \
             redis 6/7's busy wait), not a slow command"
        )
    } else if v.calls == 0 {
        format!(
            "{who} {d}{during}: it lost the CPU right after it waited for its I/O threads \
             (their share of the hand-off ended as this began; they spin for the next one on a \
             CPU), no longer than the scheduler takes to give a CPU back, not a slow command"
        )
    } else if v.own_loop {
        own_loop_wait_words(who, d, during, v)
    } else {
        format!(
            "{who} {d}{during}: it waited for its I/O threads, which made {} client I/O call{} \
             meanwhile (the hand-off of redis 6/7's io-threads, valkey's spin), not a slow \
             command",
            v.calls,
            plural(v.calls as u64)
        )
    };
    if v.late_start > 0 {
        text.push_str(&format!(
            "; they began their share {} after the main thread's own (waiting for a CPU)",
            human(v.late_start / 1000)
        ));
    }
    if v.answered > 0 {
        // redis 8: the requests read meanwhile were with its I/O threads.
        let handed = if c.through.answered_io {
            " handed to it"
        } else {
            ""
        };
        text.push_str(&format!(
            "; no request{handed} awaited its reply in its last {}: no command ran there",
            human(v.answered / 1000)
        ));
    }
    let own = v.longest_own(spun_for);
    // With no call of theirs in it (`starved_through`) the whole gap is "without them":
    // the sentence before says why.
    if own > 0 && v.starved_through == 0 {
        text.push_str(&format!(
            "; its longest stretch without them, {}, is what a spinning thread loses to the \
             scheduler on a host short of CPUs",
            human(own / 1000)
        ));
    }
    if v.held > 0 {
        text.push_str(&format!(
            "; the I/O threads waited for a CPU or for the tracer {} of it ({} held stopped by \
             the tracer at their syscalls: the cost of tracing)",
            human((v.runnable + spun_for) / 1000),
            human(v.held / 1000)
        ));
    } else if v.sched || spun_for > 0 {
        text.push_str(&format!(
            "; the I/O threads waited for a CPU {} of it",
            human((v.runnable + spun_for) / 1000)
        ));
    }
    if let Some(s) = SchedSplit::of(c, None) {
        text.push_str(&format!(
            " (main thread: {} on a CPU, {} waiting for one)",
            human(s.on_ns / 1000),
            human(s.runnable_ns / 1000)
        ));
    }
    text
}

/// The same of redis 8's I/O threads, which run event loops of their own: the main thread
/// waits for them only when it pauses them, until each has finished the work in hand.
fn own_loop_wait_words(who: &str, d: &str, during: &str, v: &super::io_wait::IoCover) -> String {
    format!(
        "{who} {d}{during}: it waited for its I/O threads, busy outside their own event loops \
         through it ({} call{}): redis 8 pauses them (clientsCron every 100 ms, or to touch \
         their clients) and spins until each has finished the work in hand, not a slow command",
        v.calls,
        plural(v.calls as u64)
    )
}

/// "made no syscall for 300 ms", or for a gap that ran through the thread's own quiet
/// calls, "served no client for 300 ms (no syscall for 299 ms of it; 2 calls of its
/// own: madvise, futex)".
fn gap_words(c: &Cand, d: &str) -> String {
    let t = &c.through;
    if t.calls == 0 {
        return format!("made no syscall for {d}");
    }
    let names: Vec<&str> = t.names().collect();
    let more = if t.more { ", ..." } else { "" };
    format!(
        "served no client for {d} (no syscall for {} of it; {} of its own: {}{more})",
        human(t.no_call / 1000),
        if t.calls == 1 {
            "1 call".to_string()
        } else {
            format!("{} calls", t.calls)
        },
        names.join(", ")
    )
}

/// "at most " for an upper bound, "at least " for a lower one, nothing for an exact figure.
fn bound_words(b: Bound) -> &'static str {
    match b {
        Bound::AtLeast => "at least ",
        Bound::AtMost => "at most ",
        Bound::Exact => "",
    }
}

/// "≤" before a figure that is only an upper bound (a list of figures: the table's mark).
fn at_most(upper: bool) -> &'static str {
    if upper {
        "≤"
    } else {
        ""
    }
}

/// The sentence a finding built only on upper bounds adds to its evidence.
const UPPER_BOUNDS_ONLY: &str = "every one of these durations is an upper bound (up to the \
     thread's next event) or not known, so they support a warning at most: rerun strace with -T";

/// Where a stall's time went, by the scheduler's counters of the thread (live backends):
/// the input of the rules that tell a thread waiting for a CPU (`cpu-starvation`), one
/// copying pages after a fork (`cow-page-faults`) and one busy in a command apart.
pub(crate) struct SchedSplit {
    on_ns: i64,
    runnable_ns: i64,
    /// Of `runnable_ns`, the time the cgroup's CPU quota throttled the thread, where the
    /// backend measures it.
    throttled_ns: Option<i64>,
    /// The time it spent reclaiming memory itself, where the backend measures it (it
    /// overlaps the other parts).
    reclaim_ns: Option<i64>,
    minor_faults: u64,
    major_faults: u64,
    /// The most bytes a fault copies, when the tracer knows it.
    fault_copy: Option<u64>,
    /// A call already running at the attach: the counters cover only its traced part.
    since_attach: bool,
}

/// A burst: a minor fault for every 20 µs on a CPU, or more often. A copy-on-write fault (a
/// page allocated, 4 KiB copied) costs the thread a few µs, so at that rate faults are a
/// tenth of its time or more; a command busy on its own data faults far less often.
/// Counted in bytes (`BASE_PAGE` per 20 µs): where one fault copies a whole huge page
/// (Linux before 5.8 with transparent huge pages in use), fewer faults copy as much.
const FAULT_EVERY_NS: i64 = 20_000;
/// Fewer faults than this (in base pages copied) are no burst, whatever the time on a CPU.
const FAULT_BURST_MIN: u64 = 100;
/// What a fault copies when the tracer does not say: one base page.
const BASE_PAGE: u64 = 4096;

impl SchedSplit {
    /// Clamped as the JSON's `sched` is (`StallSched::of`: the runnable time is exact,
    /// on-CPU time a tick off either way, so it gets what the runnable time leaves).
    fn of(c: &Cand, fault_copy: Option<u64>) -> Option<Self> {
        let d = c.sched?;
        let runnable_ns = (d.runnable_ns as i64).min(c.dur.max(0));
        let on = (d.on_cpu_ns as i64).min(c.dur.max(0) - runnable_ns);
        Some(SchedSplit {
            on_ns: on,
            runnable_ns,
            throttled_ns: d.throttled_ns.map(|t| (t as i64).min(runnable_ns)),
            reclaim_ns: d.reclaim_ns.map(|t| (t as i64).min(c.dur.max(0))),
            minor_faults: d.minor_faults,
            major_faults: d.major_faults,
            fault_copy: fault_copy.filter(|b| *b > 0),
            since_attach: c.dur_facts.in_flight == Some(crate::event::InFlight::AtStart),
        })
    }
    /// At most this many bytes were copied by the minor faults.
    fn copied(&self) -> u64 {
        self.minor_faults
            .saturating_mul(self.fault_copy.unwrap_or(BASE_PAGE))
    }
    /// ", at most 39 MiB copied (4 KiB a fault on this kernel)", when the tracer said what a
    /// fault copies.
    fn copy_words(&self) -> String {
        match self.fault_copy {
            Some(b) if self.minor_faults > 0 => format!(
                ", at most {} copied ({} a fault on this kernel)",
                bytes_words(self.copied()),
                bytes_words(b)
            ),
            _ => String::new(),
        }
    }
    /// Waiting for a CPU took at least half of the stall.
    fn waited(&self, dur: i64) -> bool {
        self.runnable_ns * 2 >= dur
    }
    /// It waited for a CPU most of the stall, mostly because its cgroup's quota was spent.
    fn throttled(&self, dur: i64) -> bool {
        self.waited(dur) && self.throttled_ns.is_some_and(|t| t * 2 >= self.runnable_ns)
    }
    /// It reclaimed memory itself for at least half of the stall (measured).
    fn reclaimed(&self, dur: i64) -> bool {
        self.reclaim_ns.is_some_and(|r| r * 2 >= dur)
    }
    /// It waited for a CPU most of the stall, mostly while other work had the CPUs (not
    /// its quota: `cpu-starvation` never stands for throttled time).
    fn starved(&self, dur: i64) -> bool {
        self.waited(dur) && !self.throttled(dur)
    }
    /// On a CPU for at least half of it.
    fn busy(&self, dur: i64) -> bool {
        self.on_ns * 2 >= dur
    }
    /// A gap (no syscall) the thread spent mostly off a CPU and not runnable, with no major
    /// fault to wait for: under a tracer that stops every call, held stopped at its syscall
    /// stops (the split counts that time as neither, `live::ptrace::sched`). Less than half
    /// of it on a CPU, and more of it stopped than waiting for a CPU.
    fn held_stopped(&self, dur: i64) -> bool {
        let stopped = self.stopped(dur);
        self.major_faults == 0 && !self.busy(dur) && stopped > 0 && stopped >= self.runnable_ns
    }
    /// A gap with no call in it (`c.through.calls`), live, that the thread spent neither on
    /// a CPU nor waiting for one, more than half of it and more than a tick: a thread cannot
    /// block without a call or a major fault, and the on-CPU counter lags by a tick at most.
    /// Where the kernel accounts steal time (`PARAVIRT_TIME_ACCOUNTING`), the time the
    /// hypervisor held its virtual CPU counts as neither (live redis 7 and valkey 9 beside
    /// three CPU hogs on a 2-vCPU VM: gaps of 104 and 128 ms, 100 ms of them so).
    /// It ran no longer than a tick in it (the counter's lag), so no command of its own ran
    /// there either: a script on a CPU 100 ms, then stopped 1 s, was a slow command too.
    fn stolen(&self, dur: i64) -> bool {
        let stopped = self.stopped(dur);
        self.major_faults == 0
            && self.reclaim_ns.unwrap_or(0) * 2 < stopped
            && stopped > super::io_wait::SCHED_TICK
            && stopped * 2 >= dur
            && self.on_ns <= super::io_wait::SCHED_TICK
    }
    /// Neither on a CPU nor waiting for one.
    fn stopped(&self, dur: i64) -> i64 {
        (dur - self.on_ns - self.runnable_ns).max(0)
    }
    /// Minor faults at the rate of a burst (`FAULT_EVERY_NS`) over the time on a CPU.
    fn fault_burst(&self) -> bool {
        let pages = self.copied() / BASE_PAGE;
        pages >= FAULT_BURST_MIN && (pages as i64).saturating_mul(FAULT_EVERY_NS) >= self.on_ns
    }
    /// "240 ms waiting for a CPU, 60 ms on one, 1200 minor page faults"
    fn words(&self) -> String {
        let throttled = match self.throttled_ns {
            Some(t) if t > 0 => format!(
                " ({} of it throttled by the cgroup's CPU quota)",
                human(t / 1000)
            ),
            _ => String::new(),
        };
        let mut w = format!(
            "{} waiting for a CPU{throttled}, {} on one",
            human(self.runnable_ns / 1000),
            human(self.on_ns / 1000)
        );
        for (n, what) in [(self.minor_faults, "minor"), (self.major_faults, "major")] {
            if n > 0 {
                w.push_str(&format!(", {n} {what} page fault{}", plural(n)));
            }
        }
        if let Some(r) = self.reclaim_ns.filter(|r| *r > 0) {
            w.push_str(&format!(", {} reclaiming memory", human(r / 1000)));
        }
        if self.since_attach {
            w.push_str(", in its traced part only");
        }
        w
    }
}

/// "it reclaimed memory itself for 48 ms of this 52 ms stall (measured: ...), its cgroup at
/// its memory limit (memory.limit_in_bytes 48 MiB)", from the measured split.
fn reclaim_words(a: &Evidence<'_>, s: &SchedSplit, dur: i64) -> String {
    let limit = match a.cgroup.and_then(|c| c.limits.memory_limit()) {
        Some((name, b)) => format!(
            "its cgroup's memory limit ({name} {}) reached",
            super::limits::mib(b)
        ),
        None => "the host short of free memory, or a parent cgroup's memory limit reached (no limit on its own cgroup)".into(),
    };
    format!(
        "it reclaimed memory itself for {} of this {} stall, {limit}: memory reclaim (measured by the kernel's \
         memcg and direct reclaim tracepoints; {})",
        human(s.reclaim_ns.unwrap_or(0) / 1000),
        human(dur / 1000),
        s.words()
    )
}

/// "the container's CPU quota of 30 ms per 100 ms stopped it for 62 ms of this 68 ms stall
/// (cpu-throttled; ...)", from the measured split.
fn throttled_words(quota: Option<(u64, u64)>, s: &SchedSplit, dur: i64) -> String {
    let limit = match quota {
        Some((q, p)) => format!(
            "the container's CPU quota of {} per {}",
            human(q as i64),
            human(p as i64)
        ),
        None => "its cgroup's CPU quota (set on the cgroup or a parent)".to_string(),
    };
    format!(
        "{limit} stopped it for {} of this {} stall (throttled: {}), not other work on its CPUs",
        human(s.throttled_ns.unwrap_or(0) / 1000),
        human(dur / 1000),
        s.words()
    )
}

/// "4 KiB", "2 MiB", "39 MiB".
fn bytes_words(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 10 << 20 => format!("{} MiB", b.div_ceil(1 << 20)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{} KiB", b.div_ceil(1024)),
    }
}

/// A gap of a client-facing thread explained by the scheduler, when it says enough.
fn sched_of_gap(
    a: &Evidence<'_>,
    c: &Cand,
    role: Role,
    who: &str,
    d: &str,
    during: &str,
    running: Option<&str>,
) -> Option<(Option<FindingId>, String)> {
    if !matches!(role, Role::Main | Role::IoThread) {
        return None;
    }
    let s = SchedSplit::of(c, a.fault_copy)?;
    let w = s.words();
    if s.reclaimed(c.dur) {
        return Some((
            Some(FindingId::MemoryReclaim),
            format!("{who} {d}{during}: {}", reclaim_words(a, &s, c.dur)),
        ));
    }
    if s.throttled(c.dur) {
        return Some((
            Some(FindingId::CpuThrottled),
            format!("{who} {d}{during}: {}", throttled_words(a.quota, &s, c.dur)),
        ));
    }
    if s.starved(c.dur) {
        // The command it ran through the gap is what held the clients; the missing CPU is
        // why it took so long.
        let cmd = running
            .map(|n| format!(" while {n} ran"))
            .unwrap_or_default();
        return Some((
            Some(FindingId::CpuStarvation),
            format!("{who} {d}{during}{cmd}: it was waiting for a CPU ({w}): CPU starvation"),
        ));
    }
    if a.stopped_by_tracer && s.held_stopped(c.dur) {
        return Some((
            Some(FindingId::TracerOverhead),
            format!(
                "{who} {d}{during}: it was held stopped by the tracer {} of it ({w}; off a \
                 CPU with no syscall and no major fault: under ptrace, its syscall stops \
                 waiting for the tracer to handle them), the cost of tracing, not a slow \
                 command",
                human(s.stopped(c.dur) / 1000)
            ),
        ));
    }
    if role == Role::Main && !a.stopped_by_tracer && c.through.calls == 0 && s.stolen(c.dur) {
        let head = format!(
            "{who} {d}{during}: it had no CPU for {} of it, though it was neither waiting for \
             one nor in a call ({w}): the CPU was taken from under it, not a slow command",
            human(s.stopped(c.dur) / 1000)
        );
        return Some(taken_words(a.host_steal, c, s.stopped(c.dur), head));
    }
    if c.phase.is_some() && s.fault_burst() {
        return Some((
            Some(FindingId::CowPageFaults),
            format!(
                "{who} {d}{during}: copy-on-write page faults after fork ({w}{})",
                s.copy_words()
            ),
        ));
    }
    if role == Role::Main && s.busy(c.dur) {
        return Some(busy_words(c, who, d, during, &w, running));
    }
    None
}

/// A main-thread gap on a CPU through most of it: a slow command, unless it lay where no
/// command runs (`NoCommand`): the server's own work there (`own-work`).
fn busy_words(
    c: &Cand,
    who: &str,
    d: &str,
    during: &str,
    w: &str,
    running: Option<&str>,
) -> (Option<FindingId>, String) {
    let text = match c.through.no_command {
        None => {
            let cmd = running.map(|n| format!(" ({n})")).unwrap_or_default();
            return (
                Some(FindingId::Command),
                format!("{who} {d}: a slow command{cmd}, on a CPU ({w})"),
            );
        }
        Some(NoCommand::Answered) => format!(
            "{who} {d}{during} {}, on a CPU ({w}): not a slow command; the server's own work \
             ({OWN_WORK})",
            answered_words(c.through.answered_io)
        ),
        // Between two calls of one piece of redis's own work (freeing what a reply held,
        // say), not a command.
        Some(k) => format!(
            "{who} {d}{during} {}, on a CPU ({w}): no command runs there, not a slow command: \
             the server's own work",
            between_words(k)
        ),
    };
    (Some(FindingId::OwnWork), text)
}

/// Who took the CPU from under a thread that was neither on one nor waiting for one
/// (`SchedSplit::stolen`, `stopped` ns of the gap), by the host's steal time over the /proc
/// readings around the gap: the hypervisor, when it stole at least half that much (of all
/// the CPUs: the thread's one among them); otherwise the process was stopped or frozen.
/// Without readings (a replayed recording) both are said.
fn taken_words(
    steal: &[(crate::event::Nanos, u64)],
    c: &Cand,
    stopped: i64,
    head: String,
) -> (Option<FindingId>, String) {
    let a = steal.iter().rev().find(|r| r.0 <= c.start);
    let b = steal.iter().find(|r| r.0 >= c.start + c.dur);
    let Some(((t0, s0), (t1, s1))) = a.zip(b) else {
        return (
            Some(FindingId::CpuStarvation),
            format!(
                "{head}; on a virtual machine, the hypervisor ran something else on it (steal \
                 time, which the kernel keeps out of a thread's counters: check steal in top or \
                 /proc/stat), otherwise the process was stopped or frozen (SIGSTOP, a cgroup \
                 freezer such as docker pause)"
            ),
        );
    };
    let rose = s1.saturating_sub(*s0) as i64;
    let over = format!(
        "the host's steal time rose {} over the {} of /proc readings around it",
        human(rose / 1000),
        human((t1 - t0) / 1000)
    );
    if rose * 2 >= stopped {
        (
            Some(FindingId::CpuStarvation),
            format!(
                "{head}: the hypervisor ran something else on its CPU ({over}; steal time is \
                 kept out of a thread's counters)"
            ),
        )
    } else {
        (
            None,
            format!(
                "{head}: the process was stopped or frozen (SIGSTOP, a debugger, a cgroup \
                 freezer such as docker pause), not the hypervisor ({over})"
            ),
        )
    }
}

/// Appends " on the AOF appendonly.aof", " on fd 7", or nothing, to `text`.
fn on_what(text: &mut String, c: &Cand, file: Option<&FileInfo>) {
    let what = match file {
        Some(f) => match (&f.path, f.class) {
            (Some(p), FileClass::Client) => format!("{} ({p})", class_words(f.class)),
            // A connect named its peer (`FdTable::name_peer`); `-y` names a socket so too.
            (Some(p), FileClass::Outgoing) if p.contains(":[") => format!("a connection ({p})"),
            (Some(p), FileClass::Outgoing) => format!("a connection to {p}"),
            (Some(p), FileClass::Replica) if !p.contains(":[") => {
                format!("the replication link to {p}")
            }
            (Some(p), _) => format!(
                "{} {}",
                class_words(f.class),
                p.rsplit('/').next().unwrap_or(p)
            ),
            (None, _) => class_words(f.class).to_string(),
        },
        None => match c.fd {
            Some(fd) => format!("fd {fd}"),
            None => String::new(),
        },
    };
    if !what.is_empty() {
        text.push_str(" on ");
        text.push_str(&what);
    }
}

/// Why a wait on a contended lock took long: what the trace can say of it.
const LOCK_WAIT: &str = "it waited for a lock another thread held (futex value 2, glibc's \
     contended mutex), not for work; the holder is the thread that wakes it (FUTEX_WAKE \
     on the same address), if the trace shows one";

/// The rule for a slow call: by the thread's role, the file's class and the call.
fn cause_of_call(
    a: &Evidence<'_>,
    c: &Cand,
    role: Role,
    file: Option<&FileInfo>,
    during: &str,
) -> (Option<FindingId>, String) {
    let sys = c
        .syscall
        .map_or(&crate::syscalls::UNKNOWN, crate::syscalls::info);
    let fsync = sys.facts.has(Facts::FSYNC);
    let class = file.map(|f| f.class).unwrap_or(FileClass::Unknown);
    let sched = SchedSplit::of(c, a.fault_copy);
    if let Some(v) = cpu_wait_cause(a, c, role, sched.as_ref(), during) {
        return v;
    }
    match (role, class, sys.blocking) {
        (Role::Main, FileClass::Client, _) if c.phase.is_some() && sched.as_ref().is_some_and(SchedSplit::fault_burst) => (
            Some(FindingId::CowPageFaults),
            format!(
                "copy-on-write page faults after fork, in the kernel's copy of the buffer ({}{}){during}",
                sched.as_ref().map(SchedSplit::words).unwrap_or_default(),
                sched.as_ref().map(SchedSplit::copy_words).unwrap_or_default()
            ),
        ),
        (Role::Main, _, Blocking::Sleep) => (
            Some(FindingId::Command),
            "the main thread slept: a command that sleeps (DEBUG SLEEP, a module or script) holds every client".into(),
        ),
        (Role::Main, _, Blocking::SyncWait) => (
            Some(FindingId::Command),
            "the main thread waited outside its event loop: synchronous I/O (MIGRATE, a replication \
             handshake with the master, a module) holds every client"
                .into(),
        ),
        (Role::Main, _, Blocking::Spawn) => {
            (Some(FindingId::Fork), "fork() copies the page tables of the whole dataset in the main thread".into())
        }
        (Role::Child, FileClass::Proc, _)
            if file
                .and_then(|f| f.path.as_deref())
                .is_some_and(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("smaps"))) =>
        {
            (
                Some(FindingId::ChildCowReport),
                "the save child reads /proc/self/smaps to report its copy-on-write memory, and the kernel \
                 walks every mapping to answer; not client-facing"
                    .into(),
            )
        }
        (Role::Child, _, _) if class.is_disk_file() => {
            (Some(FindingId::ChildDiskIo), "the save child waits on the disk; not client-facing by itself".into())
        }
        (Role::BioAof, c2, _) if fsync && c2.is_aof() => (
            Some(FindingId::AofFsyncBackground),
            "the background AOF fsync waited on the disk; redis blocks writers only after 2 s".into(),
        ),
        (Role::Main | Role::IoThread, c2, _) if c2.is_aof() && c.phase.is_some() => (
            Some(FindingId::AofWriteActiveChild),
            format!("AOF I/O in the main thread competes with the child's writes{during}"),
        ),
        (Role::Main, c2, _) if fsync && c2.is_aof() => {
            (Some(FindingId::AofFsyncAlways), "appendfsync always: the main thread fsyncs the AOF before replying".into())
        }
        (Role::Main | Role::IoThread, c2, _) if c2.is_aof() && a.file_time.overlaps_bio_fsync(c.start, c.start + c.dur) => (
            Some(FindingId::AofWritePendingFsync),
            "write() to the AOF waited behind the background thread's fdatasync of it".into(),
        ),
        (Role::Main | Role::IoThread, c2, _) if c2.is_aof() => {
            (Some(FindingId::AofWriteAlone), "write() to the AOF blocked with no fsync or child to blame: the kernel held it (dirty-page throttling or writeback on a busy disk, a FUSE or network filesystem's round trip), or redis was descheduled".into())
        }
        (r, FileClass::Log, _) if r != Role::Child => (
            Some(FindingId::LogFileBlocking),
            format!("redis opens, writes and closes its log file per log line, in the main thread{during}"),
        ),
        (Role::Main, FileClass::Client, _) if c.phase.is_some() => (
            Some(FindingId::CowPageFaults),
            format!("a socket call does not wait for the disk; slowed by page faults or CPU contention{during}"),
        ),
        (Role::Main, c2, _) if c2.is_disk_file() => disk_cause(a, c, fsync),
        (Role::Main, FileClass::Unknown, _) if sys.facts.has(Facts::CLOSE) && c.file.is_none() && c.dur_facts.in_flight.is_some() => (
            None,
            "the fd was opened before tracing began, so its file is unknown; in redis a close() \
             that blocks the main thread for long is most often the log file, which is closed \
             after every log line (rerun with -y, or attach earlier, to confirm)"
                .into(),
        ),
        (Role::Main | Role::IoThread, _, _) if c.sched.is_none() && c.phase.is_none() => {
            off_cpu(sys, file)
        }
        _ => (None, "no finding explains it".into()),
    }
}

/// A client-facing thread's call with no scheduler split: off its CPU where the call
/// returns at once in redis (`returns_at_once`), else nothing known.
fn off_cpu(sys: &crate::syscalls::SysInfo, file: Option<&FileInfo>) -> (Option<FindingId>, String) {
    match returns_at_once(sys, file) {
        Some(why) => (
            Some(FindingId::OffCpu),
            format!(
                "the call returns at once in redis ({why}), so the thread was off its CPU: \
                 waiting for one, or, under strace or ptrace, held at a syscall stop (no \
                 scheduler split in this trace says which)"
            ),
        ),
        None => (None, "no finding explains it".into()),
    }
}

/// Why a call of a client-facing thread returns at once in redis, whatever it is asked:
/// the ones a long duration can only mean the thread lost its CPU (or the tracer held it).
/// Not a pipe (redis logs to stdout through one, which blocks when the reader lags), a
/// replication link or an outgoing connection (redis makes those blocking for a diskless
/// load or a synchronous handshake), nor smaps (the kernel walks every mapping, on a CPU).
fn returns_at_once(
    sys: &crate::syscalls::SysInfo,
    file: Option<&FileInfo>,
) -> Option<&'static str> {
    if matches!(
        sys.name,
        "getpeername" | "getsockname" | "getsockopt" | "setsockopt" | "epoll_ctl"
    ) {
        return Some("it reads or sets a socket's or the event loop's settings");
    }
    let f = file?;
    let io = sys.facts.has(Facts::CLIENT_RW | Facts::RECV | Facts::SEND);
    let path = f.path.as_deref().unwrap_or("");
    match f.class {
        FileClass::Client if io || sys.facts.has(Facts::CLOSE) => {
            Some("its client sockets are non-blocking")
        }
        FileClass::Listener if sys.facts.has(Facts::ACCEPT) => {
            Some("its listening socket is non-blocking")
        }
        FileClass::AnonInode if io && path.contains("eventfd") => {
            Some("its eventfds are non-blocking")
        }
        FileClass::Proc if matches!(path.rsplit('/').next(), Some("stat" | "statm" | "status")) => {
            Some("the kernel answers /proc/PID/stat from memory")
        }
        _ => None,
    }
}

/// A call of a client-facing thread that reclaimed memory itself most of its time (where
/// measured), or was ready to go on and waited for a CPU most of it: the quota's
/// throttling, or other work on its CPUs.
fn cpu_wait_cause(
    a: &Evidence<'_>,
    c: &Cand,
    role: Role,
    sched: Option<&SchedSplit>,
    during: &str,
) -> Option<(Option<FindingId>, String)> {
    let s = sched.filter(|_| matches!(role, Role::Main | Role::IoThread))?;
    if s.reclaimed(c.dur) {
        return Some((
            Some(FindingId::MemoryReclaim),
            format!(
                "the call was held while {}{during}",
                reclaim_words(a, s, c.dur)
            ),
        ));
    }
    if s.throttled(c.dur) {
        return Some((
            Some(FindingId::CpuThrottled),
            format!(
                "the call was ready to go on but {}{during}",
                throttled_words(a.quota, s, c.dur)
            ),
        ));
    }
    s.starved(c.dur).then(|| {
        (
            Some(FindingId::CpuStarvation),
            format!(
                "the call was ready to go on but waited for a CPU ({}): CPU starvation{during}",
                s.words()
            ),
        )
    })
}

/// Fsyncs of one file by the main thread from which on they are steady: redis's
/// `appendfsync always` fsyncs the AOF once per event-loop turn that wrote.
const STEADY_FSYNCS: u64 = 8;

/// A main-thread call on a disk file: a busy disk only on evidence of another writer (a
/// background child ran, or another thread or program of the trace was in disk I/O at the
/// time); otherwise the call's own wait, with what the trace cannot show said plainly.
fn disk_cause(a: &Evidence<'_>, c: &Cand, fsync: bool) -> (Option<FindingId>, String) {
    let end = c.start + c.dur;
    if c.phase.is_some() || a.file_time.other_disk_io(c.tid, c.start, end) {
        return (
            Some(FindingId::DiskContention),
            "file I/O in the main thread waited on a busy disk (another writer was in disk I/O at the time)".into(),
        );
    }
    let steady = fsync
        && c.file
            .is_some_and(|f| a.file_time.main_fsyncs_of(f) >= STEADY_FSYNCS);
    let why = if steady {
        format!(
            "the thread that owns the process fsyncs this fd steadily ({} times), the signature of \
             appendfsync always; the trace shows no other writer and names no file, so whether the \
             disk was busy or is simply this slow to make data durable is not known",
            c.file.map_or(0, |f| a.file_time.main_fsyncs_of(f))
        )
    } else {
        "the main thread waited for the disk in its own call; the trace shows no other writer, so \
         whether the disk was busy is not known"
            .to_string()
    };
    (Some(FindingId::SlowFileIo), why)
}

/// What the stalls of one finding add up to.
struct ByFinding {
    n: u64,
    total: i64,
    worst: i64,
    worst_line: Option<u64>,
    worst_path: Option<String>,
    /// How the worst stall's duration is bounded.
    worst_bound: Bound,
    /// Stalls whose duration is only an upper bound, and only a lower bound.
    at_most: u64,
    at_least: u64,
    /// The longest stall whose duration was measured or paired: only these can make a
    /// finding critical (an upper bound supports a warning at most).
    worst_known: Option<i64>,
    /// Distinct commands held by any of the stalls.
    held: HashSet<u64>,
    /// The commands the threads ran through stalls the scheduler split (live bpf and perf
    /// backends; a stall without the split names none, so offline reports stay as they were).
    running: std::collections::BTreeSet<String>,
    /// Of stalls whose I/O threads the scheduler measured (`io-threads`): their total, and
    /// the part of it the I/O threads waited for a CPU.
    io_measured: i64,
    io_runnable: i64,
    /// Stalls whose throttled time (`cpu-throttled`) or reclaim (`memory-reclaim`) was
    /// inferred from the cgroup's readings, not measured (`limits`): a warning at most.
    estimated: u64,
    /// The measured reclaim time of the stalls (µs; `memory-reclaim`).
    reclaim_us: i64,
}

/// Everything a trace rule reads.
struct Ctx<'a> {
    ev: &'a Evidence<'a>,
    commands: &'a [CommandStats],
    by: BTreeMap<FindingId, ByFinding>,
}

/// The types of a table of rules over one input (`$cx`, read by reference whatever it
/// borrows): a rule says when it is reported, how severe, and its words, each fixed or made
/// from the input.
macro_rules! rule_table_types {
    ($rule:ident, $text:ident, $cx:ty) => {
        enum $text {
            Fixed(&'static str),
            Made(fn(&$cx, Option<&ByFinding>) -> String),
        }

        struct $rule {
            id: FindingId,
            /// Whether it is reported; most rules report when stalls have their id.
            applies: fn(&$cx, Option<&ByFinding>) -> bool,
            severity: fn(&$cx, Option<&ByFinding>) -> Severity,
            title: $text,
            evidence: $text,
            advice: $text,
            /// How many stalls it explains (a trace rule: the stalls that have its id).
            stalls: fn(&$cx, Option<&ByFinding>) -> u64,
        }

        impl $rule {
            fn finding(&self, cx: &$cx, e: Option<&ByFinding>) -> Option<Finding> {
                if !(self.applies)(cx, e) {
                    return None;
                }
                let text = |t: &$text| match t {
                    $text::Fixed(s) => s.to_string(),
                    $text::Made(f) => f(cx, e),
                };
                Some(Finding {
                    id: self.id,
                    severity: (self.severity)(cx, e),
                    title: text(&self.title),
                    evidence: text(&self.evidence),
                    advice: text(&self.advice),
                    stalls: (self.stalls)(cx, e),
                    redis_signals: None,
                })
            }
        }
    };
}

rule_table_types!(Rule, Text, Ctx<'_>);
rule_table_types!(LiveRule, LiveText, LiveEvidence<'_>);

fn on_stalls(_: &Ctx<'_>, e: Option<&ByFinding>) -> bool {
    e.is_some()
}

fn with_id(_: &Ctx<'_>, e: Option<&ByFinding>) -> u64 {
    e.map_or(0, |e| e.n)
}

/// Critical when one stall of measured or paired duration reached 100 ms, else at least a
/// warning when stalls have it: an upper bound supports a warning at most.
fn by_stalls(e: Option<&ByFinding>, base: Severity) -> Severity {
    match e {
        Some(e) if e.worst_known.is_some_and(|w| w >= 100_000) => Severity::Critical,
        Some(_) => base.max(Severity::Warning),
        None => base,
    }
}

fn warning(_: &Ctx<'_>, e: Option<&ByFinding>) -> Severity {
    by_stalls(e, Severity::Warning)
}

/// Critical on a measured throttled or reclaim stall of 100 ms; never on an estimate.
fn measured_severity(_: &Ctx<'_>, e: Option<&ByFinding>) -> Severity {
    let s = by_stalls(e, Severity::Warning);
    if e.is_some_and(|e| e.estimated > 0) {
        s.min(Severity::Warning)
    } else {
        s
    }
}

fn throttled_title(cx: &Ctx<'_>, _: Option<&ByFinding>) -> String {
    match cx.ev.quota {
        Some((q, p)) => format!(
            "The container's CPU quota ({} per {}) stopped redis (CPU throttling)",
            human(q as i64),
            human(p as i64)
        ),
        None => "The cgroup's CPU quota stopped redis (CPU throttling)".into(),
    }
}

/// The quota's advice, with the cgroup's CPU burst where the kernel has one (`burst_words`).
fn throttled_advice(cx: &Ctx<'_>, _: Option<&ByFinding>) -> String {
    format!(
        "Redis was ready to run but its container's CPU quota for the period was spent: the kernel stops every \
         thread of the cgroup until the next period (100 ms by default), however idle the host's CPUs are. Raise \
         or remove the CPU limit (docker --cpus, Kubernetes resources.limits.cpu, cpu.max or cpu.cfs_quota_us) so \
         that a period's quota covers redis's bursts (its save and rewrite children and io-threads spend the same \
         quota). A shorter period (cpu.cfs_period_us) shortens each stop at the same share. {} Trade-off: a higher \
         limit lets redis take CPU its neighbours on the host were promised (the limit is what protects them, and \
         what you pay for). Giving the CPUs to no one else is not the fix: throttling is not CPU starvation.",
        burst_words(cx.ev.cgroup)
    )
}

/// What the advice says of a CPU burst (quota left unused in a period, carried into the next):
/// whether this kernel has it for the cgroup, and what it is set to.
fn burst_words(cg: Option<&super::limits::CgEvidence>) -> String {
    const TRADE: &str = "A burst only carries over quota left unused, up to the burst, so a steady load above \
         the quota still throttles; while the cgroup bursts it runs beyond its share and its neighbours on the \
         host wait for the CPUs it takes (their latency, not redis's, pays for it).";
    let Some(cg) = cg else {
        return format!(
            "Or allow a burst (cpu.max.burst, cpu.cfs_burst_us: Linux 5.14 and later). {TRADE}"
        );
    };
    let Some(file) = cg.burst_file else {
        return "This kernel has no CPU burst for the cgroup (no cpu.max.burst or cpu.cfs_burst_us: it \
                came with Linux 5.14), so raising the quota is the way."
            .into();
    };
    match cg.limits.cpu_burst_us.filter(|b| *b > 0) {
        Some(b) => format!(
            "{file} is {} here: the stalls came with that burst, so redis's need in a period exceeds the \
             quota and the burst together; raise the quota rather than the burst. {TRADE}",
            human(b as i64)
        ),
        None => format!(
            "Or allow a burst: {file} is 0 here; set to up to the quota{}, it lets unused quota carry into \
             the next period, so a spike after a quieter period runs on. {TRADE}",
            cg.limits
                .quota()
                .map(|(q, _)| format!(" ({})", human(q as i64)))
                .unwrap_or_default()
        ),
    }
}

fn throttled_evidence(cx: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let mut ev = stall_evidence(cx, e);
    match e {
        Some(e) if e.estimated > 0 => ev.push_str(&format!(
            "; the throttled time of {} of them is estimated from the cgroup's cpu.stat over the readings \
             around each (this backend does not measure it), so this is a warning at most",
            e.estimated
        )),
        Some(_) => ev.push_str(
            "; the throttled time of each stall is measured: the thread's wait for a CPU while its cgroup \
             was throttled (bpf, the scheduler's own throttle state)",
        ),
        None => {}
    }
    ev
}

fn reclaim_evidence(cx: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let mut ev = stall_evidence(cx, e);
    match e {
        Some(e) if e.estimated > 0 => ev.push_str(&format!(
            "; {} of them inferred from the cgroup's counters over the readings around each (this backend does \
             not measure the thread's own reclaim), so this is a warning at most",
            e.estimated
        )),
        Some(e) => ev.push_str(&format!(
            "; the thread's own reclaim time is measured (bpf on the kernel's vmscan memcg and direct reclaim \
             tracepoints): {} of these stalls",
            human(e.reclaim_us)
        )),
        None => {}
    }
    let Some(cg) = cx.ev.cgroup else {
        return ev;
    };
    if let Some((name, b)) = cg.limits.memory_limit() {
        ev.push_str(&format!("; limit: {name} {}", super::limits::mib(b)));
    }
    if let Some((_, last)) = cg.readings.last() {
        ev.push_str(&format!(
            "; charged at the end: {} in all, {} anonymous (redis's data), {} page cache (the AOF's, RDB's \
             and log's pages among it)",
            super::limits::mib(last.usage),
            super::limits::mib(last.anon),
            super::limits::mib(last.file)
        ));
    }
    ev
}

/// A warning, never critical: what these stalls were is not measured (no scheduler split,
/// or one that says only that no command ran), however long they took.
fn unsplit_warning(_: &Ctx<'_>, _: Option<&ByFinding>) -> Severity {
    Severity::Warning
}

fn info(_: &Ctx<'_>, _: Option<&ByFinding>) -> Severity {
    Severity::Info
}

fn stall_evidence(cx: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let Some(e) = e else {
        return String::new();
    };
    let at = e
        .worst_line
        .map(|l| format!(" (line {l})"))
        .unwrap_or_default();
    let path = e
        .worst_path
        .as_ref()
        .map(|p| format!(" on {p}"))
        .unwrap_or_default();
    let held = if e.held.is_empty() {
        String::new()
    } else {
        format!(
            "; {} client command{} waited through them",
            e.held.len(),
            plural(e.held.len() as u64)
        )
    };
    let running = if e.running.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = e.running.iter().map(String::as_str).collect();
        format!("; running through them: {}", names.join(", "))
    };
    // A sum with upper bounds in it is one too (and with lower bounds, one of those).
    let total = match (e.at_most, e.at_least) {
        (0, 0) => Bound::Exact,
        (_, 0) => Bound::AtMost,
        (0, _) => Bound::AtLeast,
        _ => Bound::Exact,
    };
    format!(
        "{} stall{} over {}, {}{} in total, worst {}{}{path}{at}{held}{running}{}",
        e.n,
        plural(e.n),
        human(cx.ev.threshold_us),
        bound_words(total),
        human(e.total),
        bound_words(e.worst_bound),
        human(e.worst),
        upper_bounds_only(e)
    )
}

/// What the evidence adds when no stall of a finding has a measured or paired duration.
fn upper_bounds_only(e: &ByFinding) -> String {
    if e.worst_known.is_some() {
        String::new()
    } else {
        format!("; {UPPER_BOUNDS_ONLY}")
    }
}

// aof-fsync-always fires on the pattern even when no single fsync crosses the threshold:
// every write command pays for one.
fn fsync_always_applies(cx: &Ctx<'_>, e: Option<&ByFinding>) -> bool {
    cx.ev.file_time.main_aof_fsync(cx.ev.world).n >= 10 || e.is_some()
}

/// Every write command waits for one of these fsyncs: when the median one is over the
/// threshold, the typical write is itself a stall, however short the longest one was. Only
/// on exact figures: a median that is an upper bound may be far below the threshold.
fn fsync_always_severity(cx: &Ctx<'_>, e: Option<&ByFinding>) -> Severity {
    let f = cx.ev.file_time.main_aof_fsync(cx.ev.world);
    let (p50_upper, _, _) = f.upper_bounds();
    if f.n >= 10 && !p50_upper && f.p50_us >= cx.ev.threshold_us {
        return Severity::Critical;
    }
    by_stalls(e, Severity::Warning)
}

fn fsync_always_evidence(cx: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let f = cx.ev.file_time.main_aof_fsync(cx.ev.world);
    // Figures from calls timed only up to the thread's next event are at most what they say.
    let (p50, p99, max) = f.upper_bounds();
    let (m50, m99, mmax) = (at_most(p50), at_most(p99), at_most(max));
    let mut ev = format!(
        "{} fdatasync()/fsync() calls on the AOF in the main thread: p50 {m50}{}, p99 {m99}{}, max {mmax}{}",
        f.n,
        human(f.p50_us),
        human(f.p99_us),
        human(f.max_us)
    );
    let aof = at_most(cx.ev.file_time.aof_time_is_upper_bound());
    let heavy: Vec<String> = cx
        .commands
        .iter()
        .filter(|c| c.phase == CommandPhase::All && c.aof_us > 0 && c.calls > 0)
        .take(3)
        .map(|c| {
            format!(
                "{} p50 {} ({aof}{} per call in AOF syscalls)",
                c.command,
                human(c.p50_us),
                human(c.aof_us / c.calls as i64)
            )
        })
        .collect();
    if !heavy.is_empty() {
        ev.push_str(&format!("; {}", heavy.join(", ")));
    }
    match e {
        Some(_) => ev.push_str(&format!("; {}", stall_evidence(cx, e))),
        // Built on the fsyncs alone: say when every one of them is only an upper bound.
        None if f.n > 0 && f.upper == f.n => ev.push_str(&format!("; {UPPER_BOUNDS_ONLY}")),
        None => {}
    }
    ev
}

fn active_child_advice(cx: &Ctx<'_>, _: Option<&ByFinding>) -> String {
    let dur = cx
        .ev
        .phases
        .longest_ended()
        .map(|d| human(d / 1000))
        .unwrap_or_else(|| "the child's lifetime".into());
    format!(
        "Set `no-appendfsync-on-rewrite yes`: redis skips the AOF fsync while a child writes. Trade-off: on a crash \
         you can lose up to the rewrite's duration of writes (here up to {dur}). Alternatives: `appendfsync everysec`, \
         rewrite less often (raise `auto-aof-rewrite-percentage`/`auto-aof-rewrite-min-size`) or off-peak, or give \
         the AOF its own disk."
    )
}

fn log_title(cx: &Ctx<'_>, _: Option<&ByFinding>) -> String {
    let level = cx
        .ev
        .conf
        .and_then(|c| c.loglevel.clone())
        .map(|l| format!(" (loglevel {l})"))
        .unwrap_or_default();
    format!("Writing the log file blocks the main thread{level}")
}

fn worst_fork_us(cx: &Ctx<'_>) -> i64 {
    cx.ev.phases.fork_durs().iter().max().copied().unwrap_or(0) / 1000
}

/// The longest fork's duration is only an upper bound.
fn worst_fork_upper(cx: &Ctx<'_>) -> bool {
    cx.ev
        .phases
        .forks_bounded()
        .map(|(f, upper, _)| (f, upper))
        .max_by_key(|(f, upper)| (*f, !upper))
        .is_some_and(|(_, upper)| upper)
}

// fork: always worth a line when a child was forked; a stall when it crossed the threshold.
fn fork_applies(cx: &Ctx<'_>, e: Option<&ByFinding>) -> bool {
    !cx.ev.phases.is_empty() && (e.is_some() || worst_fork_us(cx) > 0)
}

fn fork_severity(_: &Ctx<'_>, e: Option<&ByFinding>) -> Severity {
    if e.is_some() {
        by_stalls(e, Severity::Warning)
    } else {
        Severity::Info
    }
}

fn fork_title(cx: &Ctx<'_>, _: Option<&ByFinding>) -> String {
    let bound = if worst_fork_upper(cx) { "at most " } else { "" };
    format!(
        "fork() for a background save blocked the main thread {bound}{}",
        human(worst_fork_us(cx))
    )
}

fn fork_evidence(cx: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let forks: Vec<(i64, bool, u32)> = cx.ev.phases.forks_bounded().collect();
    let list: Vec<String> = forks
        .iter()
        .map(|(f, upper, child)| format!("{}{} (child {child})", at_most(*upper), human(f / 1000)))
        .collect();
    let mut ev = format!("fork durations: {}", list.join(", "));
    // Only upper bounds, and no stall of measured or paired duration beside them.
    let known_stall = e.is_some_and(|e| e.worst_known.is_some());
    if !forks.is_empty() && forks.iter().all(|(_, upper, _)| *upper) && !known_stall {
        ev.push_str(&format!("; {UPPER_BOUNDS_ONLY}"));
    }
    ev
}

fn background_fsync_severity(_: &Ctx<'_>, e: Option<&ByFinding>) -> Severity {
    match e {
        Some(e) if e.worst >= 1_000_000 => Severity::Warning,
        _ => Severity::Info,
    }
}

fn background_fsync_title(cx: &Ctx<'_>, _: Option<&ByFinding>) -> String {
    if cx.by.contains_key(&FindingId::AofWritePendingFsync) {
        "The background AOF fsync was slow, and the main thread's AOF writes waited for it".into()
    } else {
        "The background AOF fsync was slow (clients were not blocked by it)".into()
    }
}

fn gaps_filtered(cx: &Ctx<'_>, _: Option<&ByFinding>) -> bool {
    cx.ev.gaps.is_some_and(|v| v.is_filtered())
}

fn gaps_unmeasurable(cx: &Ctx<'_>, _: Option<&ByFinding>) -> bool {
    cx.ev.gaps.is_some_and(|v| !v.is_filtered())
}

fn gaps_evidence(cx: &Ctx<'_>, _: Option<&ByFinding>) -> String {
    match cx.ev.gaps {
        Some(GapVerdict::Filtered {
            syscalls,
            kinds,
            perf,
        }) => filtered_words(*syscalls, *kinds, *perf),
        Some(v) if v.loop_traced() => format!(
            "{}; only the main thread's gaps that client commands waited through are shown \
             (the event loop's waits are in the trace, so such a gap is time the loop did \
             not turn)",
            v.why()
        ),
        Some(v) => v.why(),
        None => String::new(),
    }
}

/// The I/O threads waited for a CPU through at least a quarter of the measured waits:
/// they cost the main thread more than they give it.
fn io_threads_starved(e: Option<&ByFinding>) -> bool {
    e.is_some_and(|e| e.io_measured > 0 && e.io_runnable * 4 >= e.io_measured)
}

/// The I/O threads of the trace (by name or behaviour).
fn io_thread_count(cx: &Ctx<'_>) -> u64 {
    cx.ev
        .world
        .roles()
        .filter(|(_, r)| *r == Role::IoThread)
        .count() as u64
}

/// How many CPUs the process may use, live: those its threads' affinity allows, fewer
/// where its cgroup's quota gives less (quota / period, in CPUs). None offline.
fn usable_cpus(cx: &Ctx<'_>) -> Option<f64> {
    let allowed = f64::from(cx.ev.cpus?.allowed);
    let quota = cx
        .ev
        .quota
        .filter(|(_, p)| *p > 0)
        .map(|(q, p)| q as f64 / p as f64);
    Some(quota.map_or(allowed, |q| q.min(allowed)))
}

/// More threads wait for each other (the I/O threads, and the main thread that waits for
/// them on a CPU) than the process may use CPUs: one of them waits for a CPU while the
/// others wait for it. Known live only.
fn io_threads_crowded(cx: &Ctx<'_>) -> bool {
    usable_cpus(cx).is_some_and(|u| (io_thread_count(cx) + 1) as f64 > u)
}

fn io_threads_severity(cx: &Ctx<'_>, e: Option<&ByFinding>) -> Severity {
    if io_threads_starved(e) || io_threads_crowded(cx) {
        Severity::Warning
    } else {
        Severity::Info
    }
}

fn io_threads_title(cx: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let n = io_thread_count(cx);
    if io_threads_starved(e) {
        format!(
            "I/O threads cost more than they give: the main thread spun while its {n} I/O thread{} waited for a CPU",
            plural(n)
        )
    } else if let Some(u) = usable_cpus(cx).filter(|_| io_threads_crowded(cx)) {
        format!(
            "I/O threads cost more than they give: the main thread and its {n} I/O thread{} may use {} CPU{}",
            plural(n),
            cpus_words(u),
            if u == 1.0 { "" } else { "s" }
        )
    } else {
        format!(
            "The main thread waited for its {n} I/O thread{} (no command was slow)",
            plural(n)
        )
    }
}

/// A count of CPUs, whole or to a tenth (a quota of 150 ms per 100 ms: 1.5).
fn cpus_words(n: f64) -> String {
    if n.fract() == 0.0 {
        format!("{n:.0}")
    } else {
        format!("{n:.1}")
    }
}

/// "2 I/O threads and the main thread, which waits for them: 3 threads on 2 CPUs (0-1 of 2
/// online, by their affinity): more threads than CPUs ...", or offline, that the CPUs are
/// not in a trace.
fn io_threads_cpu_words(cx: &Ctx<'_>) -> String {
    let n = io_thread_count(cx);
    let head = format!(
        "{n} I/O thread{} and the main thread, which waits for {} on a CPU",
        plural(n),
        if n == 1 { "it" } else { "them" }
    );
    let Some(c) = cx.ev.cpus else {
        return format!(
            "{head}: the CPUs they may use are not in a trace (an attach reads the threads' \
             affinity, the online CPUs and the cgroup's CPU quota)"
        );
    };
    let mut text = format!(
        "{head}: {} threads on {} CPU{} ({} of {} online, by their affinity)",
        n + 1,
        c.allowed,
        plural(u64::from(c.allowed)),
        c.allowed_list,
        c.online
    );
    if let Some((q, p)) = cx.ev.quota.filter(|(_, p)| *p > 0) {
        text.push_str(&format!(
            ", {} CPUs by the cgroup's quota of {} per {}",
            cpus_words(q as f64 / p as f64),
            human(q as i64),
            human(p as i64)
        ));
    }
    if io_threads_crowded(cx) {
        text.push_str(
            ": more threads than CPUs, so while the main thread waits on a CPU an I/O thread \
             may wait for one",
        );
    } else {
        text.push_str(
            ": no more threads than CPUs, free only if nothing else runs there (the clients \
             included)",
        );
    }
    text
}

fn io_threads_evidence(cx: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let mut ev = stall_evidence(cx, e);
    ev.push_str("; ");
    ev.push_str(&io_threads_cpu_words(cx));
    match e.filter(|e| e.io_measured > 0) {
        Some(e) => ev.push_str(&format!(
            "; the I/O threads waited for a CPU {} of the {} the scheduler measured",
            human(e.io_runnable),
            human(e.io_measured)
        )),
        None => ev.push_str(
            "; how long the I/O threads themselves waited for a CPU is not measured over \
             these stalls (the trace has no scheduler split of their calls in them)",
        ),
    }
    ev
}

/// Why a trace with no event-loop wait shows no gaps, saying it was filtered only on
/// evidence: a perf trace is never strace's `-e trace=`, and a trace of many kinds of call
/// is a program that waits for work some other way, or a cut.
fn filtered_words(syscalls: u64, kinds: u32, perf: bool) -> String {
    let head = format!(
        "{syscalls} syscall{} and not one wait of an event loop (epoll_wait, or select/poll)",
        plural(syscalls)
    );
    if !perf && kinds <= FILTERED_KINDS_MAX {
        format!(
            "{head}, in only {kinds} kind{} of call: strace was probably run with -e trace=..., \
             so calls between the ones shown are missing and gaps are not time a client waited",
            plural(u64::from(kinds))
        )
    } else {
        format!(
            "{head}, in {kinds} kinds of call: the traced program waits for work some other way \
             (or not at all), or the trace is cut to a few lines, so a gap is not time a client \
             waited"
        )
    }
}

fn unexplained_title(_: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let n = e.map_or(0, |e| e.n);
    format!("{n} stall{} no rule explains", plural(n))
}

fn unexplained_evidence(_: &Ctx<'_>, e: Option<&ByFinding>) -> String {
    let only = e.map(upper_bounds_only).unwrap_or_default();
    format!("see the stalls marked without a finding{only}")
}

const GAPS_TITLE: &str = "Gaps between syscalls are not reported for this trace";
const GAPS_ADVICE: &str =
    "Slow commands and copy-on-write stalls show as gaps in a thread's syscalls. Trace \
     every syscall (no -e trace, no --duration) with -tt or -ttt timestamps (and -f \
     rather than -r) to see them.";

/// A rule reported on its stalls, warning-level, with the stall summary as evidence.
const fn on_its_stalls(id: FindingId, title: &'static str, advice: &'static str) -> Rule {
    Rule {
        id,
        applies: on_stalls,
        severity: warning,
        title: Text::Fixed(title),
        evidence: Text::Made(stall_evidence),
        advice: Text::Fixed(advice),
        stalls: with_id,
    }
}

/// The trace's findings, in the order they are listed before sorting by severity.
static RULES: &[Rule] = &[
    Rule {
        id: FindingId::AofFsyncAlways,
        applies: fsync_always_applies,
        severity: fsync_always_severity,
        title: Text::Fixed("appendfsync always: every write command waits for an fsync of the AOF"),
        evidence: Text::Made(fsync_always_evidence),
        advice: Text::Fixed(
            "Set `appendfsync everysec`: the fsync moves to a background thread and writes stop waiting for the disk. \
             Trade-off: up to about 1 s of acknowledged writes can be lost on a crash (none with `always`). If every \
             write must be durable, keep `always` and put the AOF on a faster disk (local NVMe, write-back cache).",
        ),
        stalls: with_id,
    },
    Rule {
        id: FindingId::AofWriteActiveChild,
        applies: on_stalls,
        severity: warning,
        title: Text::Fixed("AOF writes/fsyncs in the main thread stall while a BGSAVE/AOF-rewrite child writes"),
        evidence: Text::Made(stall_evidence),
        advice: Text::Made(active_child_advice),
        stalls: with_id,
    },
    on_its_stalls(
        FindingId::AofWritePendingFsync,
        "write() to the AOF blocked behind the background fsync (appendfsync everysec on a slow disk)",
        "The bio thread's fdatasync is slow, so the main thread's write() to the same file waits for it \
         (redis logs \"Asynchronous AOF fsync is taking too long\"). Put the AOF on a faster or less contended disk; \
         `no-appendfsync-on-rewrite yes` helps when it happens during rewrites (with its data-loss trade-off).",
    ),
    on_its_stalls(
        FindingId::AofWriteAlone,
        "write() to the AOF blocked with no fsync or child running",
        "A write() only copies to the page cache unless the kernel holds it: look for another writer on that \
         disk (iostat -x, pidstat -d) and for CPU starvation (load, steal); check the AOF's filesystem \
         (findmnt -T DIR: a FUSE or network mount answers each write in user space or over the wire); move \
         the AOF to its own local disk, or lower vm.dirty_bytes so writeback starts earlier.",
    ),
    Rule {
        id: FindingId::LogFileBlocking,
        applies: on_stalls,
        severity: warning,
        title: Text::Made(log_title),
        evidence: Text::Made(stall_evidence),
        advice: Text::Fixed(
            "Redis opens, writes and closes its log file for every line, in the main thread, so a busy disk (a \
             BGSAVE or AOF rewrite writing) stalls every client. Use `loglevel notice` (or `warning`), or log to \
             syslog (`syslog-enabled yes`, `logfile \"\"`) or stdout; never keep the log file on the disk that saves \
             and the AOF saturate. Trade-off: fewer log lines to debug with.",
        ),
        stalls: with_id,
    },
    Rule {
        id: FindingId::Fork,
        applies: fork_applies,
        severity: fork_severity,
        title: Text::Made(fork_title),
        evidence: Text::Made(fork_evidence),
        advice: Text::Fixed(
            "fork() copies the page tables: about 10-20 ms per GB of RSS, with the main thread stopped. Disable \
             Transparent Huge Pages (`never`), keep instances smaller, and run BGSAVE/BGREWRITEAOF off-peak or on \
             a replica.",
        ),
        stalls: with_id,
    },
    on_its_stalls(
        FindingId::CowPageFaults,
        "The main thread slows down while a forked child runs (copy-on-write)",
        "After fork every first write to a shared page copies it (a minor page fault in the main thread). \
         Disable Transparent Huge Pages, schedule saves off-peak or on a replica, save less often (`save` \
         policy), or reduce write traffic during saves. Live mode shows the minor-fault rate to confirm.",
    ),
    on_its_stalls(
        FindingId::CpuStarvation,
        "The main thread waited for a CPU (CPU starvation)",
        "Redis was ready to run but other work had the CPUs: find it (top, pidstat -u, \
         /proc/pressure/cpu; on a VM, steal time) and give redis a core of its own (taskset, cpusets, \
         CPUAffinity) or lower the others' priority (nice). Save and rewrite children, io-threads \
         beyond the free cores and busy neighbours on the same cores all compete for it.",
    ),
    Rule {
        id: FindingId::CpuThrottled,
        applies: on_stalls,
        severity: measured_severity,
        title: Text::Made(throttled_title),
        evidence: Text::Made(throttled_evidence),
        advice: Text::Made(throttled_advice),
        stalls: with_id,
    },
    Rule {
        id: FindingId::MemoryReclaim,
        applies: on_stalls,
        severity: measured_severity,
        title: Text::Fixed("The container's memory limit made its tasks reclaim memory during stalls"),
        evidence: Text::Made(reclaim_evidence),
        advice: Text::Fixed(
            "At memory.high (or memory.max, v1 limit_in_bytes) the kernel makes the cgroup's own allocating threads \
             reclaim memory before they go on: redis's main thread pays for it, and the page cache of its AOF, RDB \
             and log counts against the same limit. Set redis `maxmemory` well below the limit, leaving room for \
             client buffers, copy-on-write during BGSAVE and AOF rewrites, and page cache; or raise the container's \
             memory limit (memory.high / memory.max, Kubernetes resources.limits.memory). Trade-off: a lower \
             maxmemory evicts (or refuses writes) sooner; a higher limit reserves memory neighbours cannot use.",
        ),
        stalls: with_id,
    },
    on_its_stalls(
        FindingId::Command,
        "Commands held the main thread: slow, sleeping or blocking commands, or descheduling",
        "Check `SLOWLOG GET` and `LATENCY LATEST` for the commands; avoid O(N) commands on big keys (KEYS, \
         SMEMBERS/HGETALL of large sets, long Lua scripts), DEBUG SLEEP and synchronous MIGRATE in \
         production. If no command is slow, the process was descheduled: check CPU steal and other \
         processes on the same cores.",
    ),
    Rule {
        id: FindingId::IoThreads,
        applies: on_stalls,
        severity: io_threads_severity,
        title: Text::Made(io_threads_title),
        evidence: Text::Made(io_threads_evidence),
        advice: Text::Fixed(
            "With io-threads the main thread hands the clients' reads and writes to its I/O threads and waits \
             for them without a syscall (redis 6/7 busy-waits, valkey spins): each I/O thread needs a core of its \
             own beside the main thread and the clients, or the main thread spins while the I/O thread waits for \
             a CPU. Set `io-threads` to at most the cores left free (nproc, minus one for the main thread, minus \
             what else runs there, clients included); on a host of 2-4 cores `io-threads 1` (off) is usually \
             faster. Trade-off: without I/O threads the main thread does every socket read and write itself, \
             which caps throughput on large hosts with many clients; I/O threads pay off only with idle cores. \
             SLOWLOG will not show these waits: no command was slow.",
        ),
        stalls: with_id,
    },
    on_its_stalls(
        FindingId::DiskContention,
        "File I/O in the main thread waited on a busy disk",
        "Find what saturates the disk (iostat -x, pidstat -d) and move redis's files to a disk of their own.",
    ),
    on_its_stalls(
        FindingId::SlowFileIo,
        "File I/O in the main thread waited for the disk, with no other writer in the trace",
        "These calls wait for the device itself (an fsync returns only once the data is on stable storage), \
         with every client waiting behind the main thread. Measure the device (iostat -x: w_await, %util) and \
         look for writers the trace does not show (pidstat -d, iotop). A steady fsync in the main thread is \
         redis's `appendfsync always`: `appendfsync everysec` moves it to a background thread (trade-off: up \
         to about 1 s of acknowledged writes lost on a crash); or put the file on a faster disk.",
    ),
    Rule {
        id: FindingId::AofFsyncBackground,
        applies: on_stalls,
        severity: background_fsync_severity,
        title: Text::Made(background_fsync_title),
        evidence: Text::Made(stall_evidence),
        advice: Text::Fixed(
            "With appendfsync everysec redis only delays writes when one background fsync takes more than 2 s. \
             If fsyncs approach that, give the AOF a faster or dedicated disk.",
        ),
        stalls: with_id,
    },
    Rule {
        id: FindingId::ChildCowReport,
        applies: on_stalls,
        severity: info,
        title: Text::Fixed("The save child was slow reading its own memory map (copy-on-write report)"),
        evidence: Text::Made(stall_evidence),
        advice: Text::Fixed(
            "Nothing to change for clients: the child, not the main thread, pays for it. Redis reads \
             /proc/self/smaps in the child to report copy-on-write memory (INFO `current_cow_size`) and \
             already spaces the reads out when they are slow; they are slow because the dataset has many \
             mappings. A large copy-on-write figure is the thing to act on (see cow-page-faults).",
        ),
        stalls: with_id,
    },
    Rule {
        id: FindingId::ChildDiskIo,
        applies: on_stalls,
        severity: info,
        title: Text::Fixed("The background save child waited on the disk"),
        evidence: Text::Made(stall_evidence),
        advice: Text::Fixed(
            "Not client-facing by itself, but it makes the save longer and fills the disk queue that the main \
             thread's own file I/O (AOF, log) then waits in. A dedicated disk for saves helps.",
        ),
        stalls: with_id,
    },
    Rule {
        id: FindingId::FilteredTrace,
        applies: gaps_filtered,
        severity: info,
        title: Text::Fixed(GAPS_TITLE),
        evidence: Text::Made(gaps_evidence),
        advice: Text::Fixed(GAPS_ADVICE),
        stalls: with_id,
    },
    Rule {
        id: FindingId::GapsUnmeasurable,
        applies: gaps_unmeasurable,
        severity: info,
        title: Text::Fixed(GAPS_TITLE),
        evidence: Text::Made(gaps_evidence),
        advice: Text::Fixed(GAPS_ADVICE),
        stalls: with_id,
    },
    Rule {
        id: FindingId::Unexplained,
        applies: on_stalls,
        severity: info,
        title: Text::Made(unexplained_title),
        evidence: Text::Made(unexplained_evidence),
        advice: Text::Fixed(
            "Look at the thread and syscall of each; a socket or pipe call that blocks usually means CPU starvation \
             (check load and steal) or tracing overhead.",
        ),
        stalls: with_id,
    },
    on_its_stalls(
        FindingId::TracerOverhead,
        "The tracer held redis's threads stopped (ptrace stops every syscall)",
        "These stalls are the tracing's own cost: the thread made no syscall and was neither on a CPU nor \
         waiting for one, held at a syscall stop until the tracer (stallscope, one thread for every stop of \
         every traced thread) handled it, which takes longest when the tracer itself waits for a CPU. \
         Redis without the tracer does not have them. Use --backend bpf or perf (they never stop redis), or \
         leave the tracer a free core.",
    ),
    on_its_stalls(
        FindingId::AwaitsReply,
        "A thread waited for the reply to a request it had sent on an outgoing connection",
        "The thread sent a request (on a connection it made: to a primary, a cluster peer, a server it is a \
         client of) and then waited in poll/select or in the read for the answer: the time is the peer's, or \
         the network's. Look at the peer named by the connection (its own latency, SLOWLOG if it is a redis) \
         and at the network between them.",
    ),
    on_its_stalls(
        FindingId::LockWait,
        "A thread waited for a lock another thread held",
        "futex(..., FUTEX_WAIT*, 2, ...) is glibc's wait on a contended mutex: the thread waits for the one \
         holding the lock, not for work. The holder is the thread that wakes it (FUTEX_WAKE on the same \
         address); if every thread waits so, the process is deadlocked: take its stacks (gdb -p PID, \
         `thread apply all bt`, or eu-stack -p PID).",
    ),
    Rule {
        id: FindingId::OffCpu,
        applies: on_stalls,
        severity: unsplit_warning,
        title: Text::Fixed(
            "Threads were off their CPU where nothing waits: not a slow command, not the disk",
        ),
        evidence: Text::Made(stall_evidence),
        advice: Text::Fixed(
            "A call that returns at once in redis (its client sockets and eventfds are non-blocking, \
             /proc/PID/stat is answered from memory), or a gap where redis runs no command, takes long \
             only while the thread is off its CPU: waiting for one, throttled by its cgroup's CPU quota, \
             or, under strace or ptrace, held at a syscall stop (strace stops every traced thread at \
             every call, and under strace -f many of these are its own cost; perf trace stops none). To tell them apart attach with `--backend bpf` (its \
             scheduler split names CPU starvation and throttling); meanwhile check the load against \
             the cores, steal time, and the cgroup's cpu.stat (nr_throttled).",
        ),
        stalls: with_id,
    },
    Rule {
        id: FindingId::OwnWork,
        applies: on_stalls,
        severity: unsplit_warning,
        title: Text::Fixed("The main thread stalled between commands, not in one"),
        evidence: Text::Made(stall_evidence),
        advice: Text::Fixed(
            "No command ran in these gaps: each began after every request read had been answered, or \
             lay between two calls of one piece of redis's own work. On a CPU (where the trace's \
             scheduler split says so) that is redis's own work: active expiry of many keys with TTLs at \
             once, eviction at maxmemory, rehashing a large dict, freeing a large value or client \
             (lazyfree-lazy-* moves that to a background thread); set latency-monitor-threshold and \
             read LATENCY LATEST (expire-cycle, eviction-cycle, active-defrag-cycle). Without a split \
             the thread may as well have been off its CPU: attach with `--backend bpf` to tell them \
             apart.",
        ),
        stalls: with_id,
    },
];

/// All findings of the trace, most severe first. `held[i]` is what `stalls[i]` held.
pub(crate) fn findings(
    a: &Evidence<'_>,
    held: &[Held],
    commands: &[CommandStats],
    stalls: &[Stall],
    names: &super::commands::CmdNames,
) -> Vec<Finding> {
    let mut by: BTreeMap<FindingId, ByFinding> = BTreeMap::new();
    for (h, s) in held.iter().zip(stalls) {
        // Stalls no rule explains are the `unexplained` finding's.
        let e = by
            .entry(s.finding.unwrap_or(FindingId::Unexplained))
            .or_insert(ByFinding {
                n: 0,
                total: 0,
                worst: 0,
                worst_line: None,
                worst_path: None,
                worst_bound: Bound::Exact,
                at_most: 0,
                at_least: 0,
                worst_known: None,
                held: Default::default(),
                running: Default::default(),
                io_measured: 0,
                io_runnable: 0,
                estimated: 0,
                reclaim_us: 0,
            });
        let measured = match s.finding {
            Some(FindingId::CpuThrottled) => s.sched.as_ref().and_then(|x| x.throttled_us),
            Some(FindingId::MemoryReclaim) => s.sched.as_ref().and_then(|x| x.reclaim_us),
            _ => Some(0),
        };
        match measured {
            None => e.estimated += 1,
            Some(r) if s.finding == Some(FindingId::MemoryReclaim) => e.reclaim_us += r,
            Some(_) => {}
        }
        if let Some(r) = s.sched.as_ref().and_then(|x| x.io_threads_runnable_us) {
            e.io_measured += s.duration_us;
            e.io_runnable += r;
        }
        if s.duration_known.is_known() {
            e.worst_known = Some(e.worst_known.unwrap_or(0).max(s.duration_us));
        }
        e.n += 1;
        e.total += s.duration_us;
        e.held.extend(h.seqs.iter().copied());
        match s.bound {
            Bound::AtMost => e.at_most += 1,
            Bound::AtLeast => e.at_least += 1,
            Bound::Exact => {}
        }
        if let (Some(n), Some(_)) = (h.ran, &s.sched) {
            e.running.insert(super::holds::one_of(names, n, &h.ran_or));
        }
        if s.duration_us >= e.worst {
            e.worst = s.duration_us;
            e.worst_line = s.line;
            e.worst_path = s.target.path.clone();
            e.worst_bound = s.bound;
        }
    }
    let cx = Ctx {
        ev: a,
        commands,
        by,
    };
    let mut out: Vec<Finding> = RULES
        .iter()
        .filter_map(|r| r.finding(&cx, cx.by.get(&r.id)))
        .collect();
    out.sort_by(|x, y| y.severity.cmp(&x.severity).then(y.stalls.cmp(&x.stalls)));
    out
}

/// What a live backend knows that the trace does not show: the input of `LIVE_RULES`, for
/// `attach` and for each incident report of `watch`.
pub struct LiveEvidence<'a> {
    /// The backend reads request and reply buffers (ptrace and bpf do; perf does not).
    pub sees_commands: bool,
    /// Why tracing itself slowed redis down, when it did substantially.
    pub tracing_cost: Option<&'a str>,
    /// The report is a `watch` incident's: the window it covers (the advice says "watch",
    /// not "trace").
    pub watch: Option<WatchWindow>,
}

/// A `watch` incident report: the window of events it covers, the input of the
/// `watch-incident` rule.
#[derive(Clone, Copy, Debug)]
pub struct WatchWindow {
    /// Stalls of the incident.
    pub stalls: u64,
    pub threshold_ns: i64,
    /// The span of the events the watcher held when the incident ended.
    pub span_ns: i64,
    /// The history ring held less than --before (it was full).
    pub ring_short: bool,
    /// Incidents not written before this one (--max-incidents-per-hour).
    pub suppressed: u64,
    /// Incidents that ended while the previous report was being written, joined in this one.
    pub joined: u64,
    /// What opened the incident when it was not a stall: redis's own sign of one
    /// (`watch --mode cheap --redis`), in words.
    pub opened_by: Option<&'static str>,
}

fn in_watch(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> bool {
    l.watch.is_some()
}

fn watch_stalls(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> u64 {
    l.watch.map_or(0, |w| w.stalls)
}

/// The live rules other than the incident's explain no stall.
fn no_stalls(_: &LiveEvidence<'_>, _: Option<&ByFinding>) -> u64 {
    0
}

fn watch_title(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> String {
    let Some(w) = l.watch else {
        return String::new();
    };
    let by = w.opened_by.map(|b| format!(" on {b}")).unwrap_or_default();
    format!(
        "Incident caught by stallscope watch{by}: {} stall{} over {}",
        w.stalls,
        plural(w.stalls),
        human(w.threshold_ns / 1000)
    )
}

fn watch_evidence(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> String {
    let Some(w) = l.watch else {
        return String::new();
    };
    let mut s = format!(
        "this report covers the {} of events the watcher held when the incident ended",
        human(w.span_ns.max(0) / 1000)
    );
    if w.ring_short {
        s.push_str(" (less than --before: the history ring was full; raise --ring-size)");
    }
    if w.suppressed > 0 {
        s.push_str(&format!(
            "; {} incident{} before this one were not written (--max-incidents-per-hour)",
            w.suppressed,
            plural(w.suppressed)
        ));
    }
    if w.joined > 0 {
        s.push_str(&format!(
            "; {} more incident{} that ended while the previous report was being written {} in it",
            w.joined,
            plural(w.joined),
            if w.joined == 1 { "is" } else { "are" }
        ));
    }
    s
}

fn perf_cannot_see_commands(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> bool {
    !l.sees_commands
}

fn tracing_was_costly(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> bool {
    l.tracing_cost.is_some()
}

fn tracing_cost(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> String {
    l.tracing_cost.unwrap_or_default().to_string()
}

fn live_info(_: &LiveEvidence<'_>, _: Option<&ByFinding>) -> Severity {
    Severity::Info
}

fn live_warning(_: &LiveEvidence<'_>, _: Option<&ByFinding>) -> Severity {
    Severity::Warning
}

fn backend_limits_advice(l: &LiveEvidence<'_>, _: Option<&ByFinding>) -> String {
    let verb = if l.watch.is_some() { "watch" } else { "trace" };
    format!(
        "If you need them, use --backend bpf (as root: it reads request buffers in the \
         kernel without stopping redis), or {verb} briefly with --backend ptrace (it slows \
         redis about as much as strace), or on a replica."
    )
}

/// What a live backend adds to the findings, after the trace's.
static LIVE_RULES: &[LiveRule] = &[
    // What a `watch` incident report covers, first: the rest of the report is about it.
    LiveRule {
        id: FindingId::WatchIncident,
        applies: in_watch,
        severity: live_info,
        title: LiveText::Made(watch_title),
        evidence: LiveText::Made(watch_evidence),
        advice: LiveText::Fixed(
            "The stalls and findings above are from this window only; the watcher's metrics \
             count every stall.",
        ),
        stalls: watch_stalls,
    },
    // Say what this backend cannot show, rather than leave empty tables unexplained.
    LiveRule {
        id: FindingId::BackendLimits,
        applies: perf_cannot_see_commands,
        severity: live_info,
        title: LiveText::Fixed("No per-command latency with --backend perf"),
        evidence: LiveText::Fixed(
            "the perf backend never stops redis, so it cannot read request and reply \
             buffers: command names, per-command latency and the commands each stall held \
             up are not available in this report",
        ),
        advice: LiveText::Made(backend_limits_advice),
        stalls: no_stalls,
    },
    LiveRule {
        id: FindingId::TracerOverhead,
        applies: tracing_was_costly,
        severity: live_warning,
        title: LiveText::Fixed("Tracing itself slowed redis down"),
        evidence: LiveText::Made(tracing_cost),
        advice: LiveText::Fixed(
            "trace for a shorter time, trace a replica, or use a backend that does not stop redis (--backend perf)",
        ),
        stalls: no_stalls,
    },
];

/// The live backend's findings, appended after the trace's (they explain no stall).
pub fn live_findings(l: &LiveEvidence<'_>) -> Vec<Finding> {
    LIVE_RULES
        .iter()
        .filter_map(|r| r.finding(l, None))
        .collect()
}

/// The ids of the live backend's findings, as the JSON spells them.
#[cfg(test)]
pub(crate) fn live_rule_ids() -> Vec<&'static str> {
    LIVE_RULES.iter().map(|r| r.id.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{InFlight, Nanos};

    const MS: Nanos = 1_000_000;

    fn cand(kind: StallKind, syscall: Option<&'static str>, phase: Option<usize>) -> Cand {
        Cand {
            tid: 101,
            proc: crate::fdtable::ProcKey::Root,
            kind,
            syscall,
            fd: Some(7),
            file: None,
            start: 0,
            dur: 50 * MS,
            line: Some(3),
            dur_facts: crate::analyze::stalls::DurFacts {
                bound: Bound::Exact,
                known: crate::report::DurationKnown::Measured,
                in_flight: None,
                ..Default::default()
            },
            phase,
            events_lost: false,
            id: 1,
            sched: None,
            through: Default::default(),
        }
    }

    /// A gap of `dur` ns its thread spent `on` ns on a CPU and `run` ns waiting for one.
    fn split_gap(dur: Nanos, on: u64, run: u64) -> Cand {
        let mut c = cand(StallKind::Gap, None, None);
        c.dur = dur;
        c.sched = Some(crate::event::SchedDelta {
            on_cpu_ns: on,
            runnable_ns: run,
            ..Default::default()
        });
        c
    }

    fn with_evidence<T>(f: impl FnOnce(&Evidence<'_>) -> T) -> T {
        with_cgroup(None, None, f)
    }

    fn with_cgroup<T>(
        quota: Option<(u64, u64)>,
        cgroup: Option<&super::super::limits::CgEvidence>,
        f: impl FnOnce(&Evidence<'_>) -> T,
    ) -> T {
        let world = World::new(Some(100), Default::default(), None);
        let (phases, file_time) = (Phases::default(), FileTime::default());
        f(&Evidence {
            quota,
            cgroup,
            ..Evidence::plain(&phases, &file_time, &world)
        })
    }

    /// `with_evidence` of a trace whose tracer stopped the threads at every call (ptrace).
    /// `with_evidence` with the host's steal readings of a live session.
    fn with_steal<T>(steal: &[(Nanos, u64)], f: impl FnOnce(&Evidence<'_>) -> T) -> T {
        with_evidence(|ev| {
            f(&Evidence {
                host_steal: steal,
                ..*ev
            })
        })
    }

    fn with_stops<T>(f: impl FnOnce(&Evidence<'_>) -> T) -> T {
        with_evidence(|ev| {
            f(&Evidence {
                stopped_by_tracer: true,
                ..*ev
            })
        })
    }

    /// A thread that waited for a CPU mostly while its cgroup was throttled is
    /// `cpu-throttled`, with the quota in the words; other waiting is `cpu-starvation`,
    /// which never stands for throttled time.
    #[test]
    fn throttled_time_is_its_own_cause_and_never_starvation() {
        use crate::event::SchedDelta;
        let with = |kind, syscall, on_ms: u64, run_ms: u64, thr_ms: Option<u64>| {
            let mut c = cand(kind, syscall, None);
            c.sched = Some(SchedDelta {
                on_cpu_ns: on_ms * MS as u64,
                runnable_ns: run_ms * MS as u64,
                throttled_ns: thr_ms.map(|t| t * MS as u64),
                ..Default::default()
            });
            c
        };
        let (gap, call) = (StallKind::Gap, StallKind::SlowSyscall);
        let cases: &[(Cand, Option<FindingId>, &str)] = &[
            (with(gap, None, 5, 45, Some(40)), Some(FindingId::CpuThrottled),
             "the container's CPU quota of 30 ms per 100 ms stopped it for 40 ms of this 50 ms stall"),
            (with(gap, None, 5, 45, Some(0)), Some(FindingId::CpuStarvation), "45 ms waiting for a CPU, 5.0 ms on one"),
            // Most of the wait was other work's: starvation, the throttled part said.
            (with(gap, None, 5, 45, Some(20)), Some(FindingId::CpuStarvation), "(20 ms of it throttled by the cgroup's CPU quota)"),
            (with(call, Some("write"), 1, 30, Some(28)), Some(FindingId::CpuThrottled), "ready to go on but the container's CPU quota"),
            // Mostly on a CPU: throttled or not, a command.
            (with(gap, None, 45, 5, Some(5)), Some(FindingId::Command), "a slow command"),
        ];
        with_cgroup(Some((30_000, 100_000)), None, |ev| {
            for (i, (c, want, words)) in cases.iter().enumerate() {
                let (id, why) = explain(ev, c, Role::Main, None);
                assert_eq!(id, *want, "case {i}: {why}");
                assert!(why.contains(words), "case {i}: {why}");
            }
        });
        // The quota unknown (set on a parent, or unreadable): still throttling.
        with_evidence(|ev| {
            let (id, why) = explain(ev, &cases[0].0, Role::Main, None);
            assert_eq!(id, Some(FindingId::CpuThrottled));
            assert!(why.contains("its cgroup's CPU quota"), "{why}");
        });
    }

    /// The runnable time is exact, the on-CPU time a tick off: a gap whose counters add up
    /// to more than it lasted keeps its runnable time whole (valkey 9 live under bpf beside
    /// three CPU hogs on 2 CPUs: 15.985 ms, 8.000 on a CPU and 7.997 waiting for one read, the
    /// main thread and its I/O thread each spinning a tick for the other; clamped the other
    /// way it was 7.984 waiting, under half, and "a slow command, on a CPU").
    #[test]
    fn a_split_over_its_gap_keeps_the_runnable_time_whole() {
        let c = split_gap(15_985_000, 8_000_000, 7_997_000);
        with_evidence(|ev| {
            let (id, why) = explain(ev, &c, Role::Main, None);
            assert_eq!(id, Some(FindingId::CpuStarvation), "{why}");
            assert!(
                why.contains("8.0 ms waiting for a CPU, 8.0 ms on one"),
                "{why}"
            );
        });
    }

    /// A main-thread gap with no call that the split leaves mostly neither on a CPU nor
    /// waiting for one, by more than the on-CPU counter's lag, is the CPU taken from under
    /// the thread (live valkey 9 beside three CPU hogs on 2 vCPUs: 104 ms, 2.5 on a CPU and
    /// 1.6 waiting, was "a slow command (GET), or the process was descheduled").
    #[test]
    fn a_gap_neither_on_a_cpu_nor_runnable_is_the_hypervisors() {
        let gap = |dur_us: i64, on_us: u64, run_us: u64| {
            split_gap(dur_us * 1000, on_us * 1000, run_us * 1000)
        };
        with_evidence(|ev| {
            let (id, why) = explain(ev, &gap(104_026, 2459, 1552), Role::Main, None);
            assert_eq!(id, Some(FindingId::CpuStarvation), "{why}");
            assert!(why.contains("it had no CPU for 100 ms of it"), "{why}");
            assert!(why.contains("steal time"), "{why}");
            // Within a tick, the on-CPU counter's lag: nothing said of it.
            let (id, why) = explain(ev, &gap(3609, 0, 0), Role::Main, None);
            assert_eq!(id, Some(FindingId::Command), "{why}");
            // A script on a CPU 100 ms, then stopped a second: a slow command as well.
            let (id, why) = explain(ev, &gap(1_100_000, 100_000, 0), Role::Main, None);
            assert_ne!(id, Some(FindingId::CpuStarvation), "{why}");
            assert!(!why.contains("not a slow command"), "{why}");
        });
        // Live, the host's steal over the /proc readings around the gap says who took the
        // CPU: the hypervisor (steal rose by half of it or more), or nobody's steal (the
        // process was stopped or frozen: `kill -STOP`, `docker pause`).
        let stolen = gap(104_026, 2459, 1552);
        let readings = |rose_ms: u64| {
            [
                (-50 * MS, 7 * MS as u64),
                (150 * MS, (7 + rose_ms) * MS as u64),
            ]
        };
        let steal = readings(60);
        with_steal(&steal, |ev| {
            let (id, why) = explain(ev, &stolen, Role::Main, None);
            assert_eq!(id, Some(FindingId::CpuStarvation), "{why}");
            assert!(why.contains("the hypervisor ran something else"), "{why}");
            assert!(
                why.contains("steal time rose 60 ms over the 200 ms"),
                "{why}"
            );
        });
        let steal = readings(10);
        with_steal(&steal, |ev| {
            let (id, why) = explain(ev, &stolen, Role::Main, None);
            assert_eq!(id, None, "{why}");
            assert!(why.contains("stopped or frozen"), "{why}");
            assert!(why.contains("not the hypervisor"), "{why}");
        });
        // Under ptrace the thread is held at its syscall stops: the tracer's cost.
        with_stops(|ev| {
            let (id, _) = explain(ev, &gap(104_026, 2459, 1552), Role::Main, None);
            assert_eq!(id, Some(FindingId::TracerOverhead));
        });
    }

    /// The cgroup's readings around a stall: an estimate of the throttled time where the
    /// split does not measure it (said so), and memory reclaim.
    #[test]
    fn the_cgroups_readings_estimate_throttling_and_show_reclaim() {
        use crate::live::cgroup::CgRaw;
        use crate::report::CgroupLimits;
        let reading = |at_ms: i64, throttled_ms: u64, high: u64| {
            (
                at_ms * MS,
                CgRaw {
                    throttled_ns: throttled_ms * MS as u64,
                    nr_throttled: throttled_ms / 40,
                    mem_high: high,
                    ..Default::default()
                },
            )
        };
        let limits = CgroupLimits {
            cpu_quota_us: Some(30_000),
            cpu_period_us: Some(100_000),
            memory_high_bytes: Some(256 << 20),
            ..Default::default()
        };
        let cg = |exact, readings| super::super::limits::CgEvidence {
            limits: limits.clone(),
            readings,
            exact_throttle: exact,
            burst_file: None,
        };
        // A 50 ms gap at 0..50 ms; readings at -100, 0 (none yet), 100 ms.
        let gap = cand(StallKind::Gap, None, None);
        let throttled = cg(
            false,
            vec![reading(-100, 0, 0), reading(0, 0, 0), reading(100, 40, 0)],
        );
        with_cgroup(limits.quota(), Some(&throttled), |ev| {
            let (id, why) = explain(ev, &gap, Role::Main, None);
            assert_eq!(id, Some(FindingId::CpuThrottled), "{why}");
            assert!(why.contains("about 40 ms of this 50 ms stall"), "{why}");
            assert!(why.contains("estimated"), "{why}");
        });
        // Where the backend measures it, no estimate: the split said no throttle.
        let exact = cg(true, throttled.readings.clone());
        with_cgroup(limits.quota(), Some(&exact), |ev| {
            assert_eq!(
                explain(ev, &gap, Role::Main, None).0,
                Some(FindingId::Command)
            );
        });
        // A window in which the cgroup throttled less than half the stall: not throttling.
        let little = cg(false, vec![reading(0, 0, 0), reading(100, 10, 0)]);
        with_cgroup(limits.quota(), Some(&little), |ev| {
            assert_eq!(
                explain(ev, &gap, Role::Main, None).0,
                Some(FindingId::Command)
            );
        });
        let reclaim = cg(true, vec![reading(0, 0, 0), reading(100, 0, 3)]);
        with_cgroup(limits.quota(), Some(&reclaim), |ev| {
            let (id, why) = explain(ev, &gap, Role::Main, None);
            assert_eq!(id, Some(FindingId::MemoryReclaim), "{why}");
            assert!(
                why.contains("memory.high 256 MiB") && why.contains("3 memory.high events"),
                "{why}"
            );
            // A stall another rule explains keeps its finding; the reclaim is said.
            let mut starved = gap.clone();
            starved.sched = Some(crate::event::SchedDelta {
                runnable_ns: 45 * MS as u64,
                throttled_ns: Some(0),
                ..Default::default()
            });
            let (id, why) = explain(ev, &starved, Role::Main, None);
            assert_eq!(id, Some(FindingId::CpuStarvation), "{why}");
            assert!(
                why.contains("meanwhile the cgroup hit its memory limit"),
                "{why}"
            );
        });
    }

    /// A stall the thread spent mostly reclaiming memory itself (measured) is
    /// `memory-reclaim`, whatever its call, with the limit and what was charged; where the
    /// thread's reclaim was measured small, the cgroup's counters around it name nothing.
    #[test]
    fn measured_reclaim_is_memory_reclaim_and_counters_alone_are_not() {
        use crate::event::SchedDelta;
        use crate::live::cgroup::CgRaw;
        use crate::report::CgroupLimits;
        let limits = CgroupLimits {
            memory_limit_in_bytes: Some(48 << 20),
            ..Default::default()
        };
        let at = |ms: i64, failcnt: u64| {
            (
                ms * MS,
                CgRaw {
                    failcnt,
                    usage: 47 << 20,
                    anon: 9 << 20,
                    file: 38 << 20,
                    ..Default::default()
                },
            )
        };
        let cg = super::super::limits::CgEvidence {
            limits,
            readings: vec![at(-100, 0), at(100, 700)],
            exact_throttle: true,
            burst_file: None,
        };
        let with = |kind, syscall, on_ms: i64, reclaim_ms: i64| {
            let mut c = cand(kind, syscall, None);
            c.sched = Some(SchedDelta {
                on_cpu_ns: (on_ms * MS) as u64,
                throttled_ns: Some(0),
                reclaim_ns: Some((reclaim_ms * MS) as u64),
                ..Default::default()
            });
            c
        };
        with_cgroup(None, Some(&cg), |ev| {
            let write = with(StallKind::SlowSyscall, Some("write"), 20, 40);
            let (id, why) = explain(ev, &write, Role::Main, None);
            assert_eq!(id, Some(FindingId::MemoryReclaim), "{why}");
            for part in [
                "reclaimed memory itself for 40 ms of this 50 ms stall",
                "memory.limit_in_bytes 48 MiB",
                "700 memory.failcnt charges",
                "9 MiB anonymous",
                "38 MiB page cache",
            ] {
                assert!(why.contains(part), "{part:?} not in {why}");
            }
            let gap = with(StallKind::Gap, None, 45, 30);
            assert_eq!(
                explain(ev, &gap, Role::Main, None).0,
                Some(FindingId::MemoryReclaim)
            );
            // Measured small: the cgroup reclaimed meanwhile, this thread hardly did.
            let busy = with(StallKind::Gap, None, 45, 5);
            let (id, why) = explain(ev, &busy, Role::Main, None);
            assert_eq!(id, Some(FindingId::Command), "{why}");
            assert!(why.contains("this thread reclaimed for 5.0 ms"), "{why}");
        });
        // The same counters without the measurement: inferred, said so.
        let unmeasured = cand(StallKind::Gap, None, None);
        with_cgroup(None, Some(&cg), |ev| {
            let (id, why) = explain(ev, &unmeasured, Role::Main, None);
            assert_eq!(id, Some(FindingId::MemoryReclaim), "{why}");
            assert!(why.contains("700 memory.failcnt charges"), "{why}");
        });
    }

    /// The quota's advice says what this kernel offers of a CPU burst: none (raise the quota),
    /// a burst file at 0 (set it, with its trade-off), or one already set (then the quota).
    #[test]
    fn the_throttling_advice_names_the_burst_the_kernel_has() {
        use crate::report::CgroupLimits;
        let cg = |file, burst| super::super::limits::CgEvidence {
            limits: CgroupLimits {
                cpu_quota_us: Some(30_000),
                cpu_period_us: Some(100_000),
                cpu_burst_us: burst,
                ..Default::default()
            },
            burst_file: file,
            ..Default::default()
        };
        let none = burst_words(Some(&cg(None, None)));
        assert!(
            none.contains("no CPU burst") && none.contains("5.14"),
            "{none}"
        );
        let zero = burst_words(Some(&cg(Some("cpu.max.burst"), Some(0))));
        for part in [
            "cpu.max.burst is 0 here",
            "up to the quota (30 ms)",
            "neighbours",
        ] {
            assert!(zero.contains(part), "{part:?}: {zero}");
        }
        let set = burst_words(Some(&cg(Some("cpu.cfs_burst_us"), Some(20_000))));
        assert!(
            set.contains("cpu.cfs_burst_us is 20 ms here") && set.contains("raise the quota"),
            "{set}"
        );
        assert!(burst_words(None).contains("Linux 5.14"));
    }

    #[test]
    fn explain_by_role_and_call() {
        let cases: &[(Cand, Role, Option<FindingId>)] = &[
            (
                cand(StallKind::Gap, None, None),
                Role::Main,
                Some(FindingId::Command),
            ),
            (
                cand(StallKind::Gap, None, Some(0)),
                Role::Main,
                Some(FindingId::CowPageFaults),
            ),
            (cand(StallKind::Gap, None, None), Role::BioLazyFree, None),
            (
                cand(StallKind::SlowSyscall, Some("nanosleep"), None),
                Role::Main,
                Some(FindingId::Command),
            ),
            (
                cand(StallKind::SlowSyscall, Some("clone"), None),
                Role::Main,
                Some(FindingId::Fork),
            ),
            (
                cand(StallKind::SlowSyscall, Some("write"), None),
                Role::Main,
                None,
            ),
        ];
        with_evidence(|ev| {
            for (i, (c, role, want)) in cases.iter().enumerate() {
                assert_eq!(explain(ev, c, *role, None).0, *want, "case {i}");
            }
            let mut c = cand(StallKind::SlowSyscall, Some("close"), None);
            c.dur_facts.in_flight = Some(InFlight::AtStart);
            let (id, why) = explain(ev, &c, Role::Main, None);
            assert_eq!(id, None);
            assert!(
                why.starts_with("main thread blocked 50 ms in close() on fd 7 (already running"),
                "{why}"
            );
        });
    }

    /// The scheduler's split of a stall (bpf) decides between a thread waiting for a CPU,
    /// copying pages after a fork, and busy in a command; without it the rules are as before.
    #[test]
    fn the_scheduler_split_names_starvation_copy_on_write_or_a_command() {
        use crate::event::SchedDelta;
        let with = |kind, syscall, phase, on_ms: u64, run_ms: u64, minor: u64| {
            let mut c = cand(kind, syscall, phase);
            c.sched = Some(SchedDelta {
                on_cpu_ns: on_ms * MS as u64,
                runnable_ns: run_ms * MS as u64,
                minor_faults: minor,
                major_faults: 0,
                throttled_ns: None,
                reclaim_ns: None,
            });
            c
        };
        let gap = StallKind::Gap;
        let call = StallKind::SlowSyscall;
        // (stall of 50 ms, role, finding, words the cause must have)
        let cases: &[(Cand, Role, Option<FindingId>, &str)] = &[
            (with(gap, None, None, 10, 40, 0), Role::Main, Some(FindingId::CpuStarvation), "40 ms waiting for a CPU, 10 ms on one"),
            // Waiting for a CPU wins over faults: the thread was not running most of the time.
            (with(gap, None, Some(0), 5, 45, 5000), Role::Main, Some(FindingId::CpuStarvation), "5000 minor page faults"),
            (with(gap, None, Some(0), 45, 5, 10_000), Role::Main, Some(FindingId::CowPageFaults), "copy-on-write page faults after fork (5.0 ms waiting for a CPU, 45 ms on one, 10000 minor"),
            // A child ran, but too few faults to matter: the command itself.
            (with(gap, None, Some(0), 45, 5, 50), Role::Main, Some(FindingId::Command), "a slow command, on a CPU"),
            // A fault per 45 µs on a CPU is no burst; one per 15 µs is.
            (with(gap, None, Some(0), 45, 5, 1000), Role::Main, Some(FindingId::Command), "1000 minor page faults"),
            (with(gap, None, Some(0), 45, 5, 3000), Role::Main, Some(FindingId::CowPageFaults), "3000 minor page faults"),
            // Faults without a child are no copy-on-write.
            (with(gap, None, None, 45, 5, 10_000), Role::Main, Some(FindingId::Command), "on a CPU"),
            (with(gap, None, None, 10, 40, 0), Role::IoThread, Some(FindingId::CpuStarvation), "CPU starvation"),
            (with(gap, None, None, 10, 40, 0), Role::BioAof, None, "no finding explains it"),
            (with(call, Some("write"), None, 1, 30, 0), Role::Main, Some(FindingId::CpuStarvation), "waited for a CPU (30 ms"),
            // Mostly blocked: the rules of the call, as without the split.
            (with(call, Some("nanosleep"), None, 1, 2, 0), Role::Main, Some(FindingId::Command), "slept"),
        ];
        with_evidence(|ev| {
            for (i, (c, role, want, words)) in cases.iter().enumerate() {
                let (id, why) = explain(ev, c, *role, None);
                assert_eq!(id, *want, "case {i}: {why}");
                assert!(why.contains(words), "case {i}: {why}");
            }
            // The command the thread ran through a gap mostly on a CPU is named.
            let (id, why) = explain(ev, &cases[3].0, Role::Main, Some("EVAL"));
            assert_eq!(id, Some(FindingId::Command));
            assert!(why.contains("a slow command (EVAL), on a CPU"), "{why}");
            // Through a gap mostly waiting for a CPU, the command held the thread too.
            let (id, why) = explain(ev, &cases[0].0, Role::Main, Some("EVAL"));
            assert_eq!(id, Some(FindingId::CpuStarvation));
            assert!(
                why.contains("while EVAL ran: it was waiting for a CPU"),
                "{why}"
            );
        });
    }

    /// Under ptrace the split counts a thread held stopped at its syscall stops as neither on
    /// a CPU nor waiting for one: a gap (no syscall) spent mostly so, with no major fault, is
    /// the tracer's cost (`tracer-overhead`), not a slow command; waiting for a CPU most of
    /// it is still starvation, and on a CPU most of it still a command. Without a tracer
    /// that stops calls (bpf, perf) the same split is no tracer's doing: the CPU taken from
    /// under the thread, by the hypervisor or by a stop (`SchedSplit::stolen`).
    #[test]
    fn a_gap_held_stopped_by_the_tracer_is_its_cost_not_a_command() {
        let gap = |on_ms: u64, run_ms: u64, major: u64| {
            let mut c = split_gap(50 * MS, on_ms * MS as u64, run_ms * MS as u64);
            if let Some(s) = c.sched.as_mut() {
                s.major_faults = major;
            }
            c
        };
        let tracer = Some(FindingId::TracerOverhead);
        let cases: &[(Cand, Role, Option<FindingId>, &str)] = &[
            (
                gap(1, 0, 0),
                Role::Main,
                tracer,
                "held stopped by the tracer 49 ms of it (0 µs waiting for a CPU, 1.0 ms on one",
            ),
            (
                gap(1, 20, 0),
                Role::Main,
                tracer,
                "held stopped by the tracer 29 ms",
            ),
            (gap(1, 0, 0), Role::IoThread, tracer, "io_thread thread 101"),
            (
                gap(1, 30, 0),
                Role::Main,
                Some(FindingId::CpuStarvation),
                "waiting for a CPU",
            ),
            (
                gap(30, 0, 0),
                Role::Main,
                Some(FindingId::Command),
                "a slow command, on a CPU",
            ),
            // Waiting for a page from disk is no stop of the tracer's.
            (
                gap(1, 0, 3),
                Role::Main,
                Some(FindingId::Command),
                "or the process was descheduled",
            ),
        ];
        with_stops(|ev| {
            for (i, (c, role, want, words)) in cases.iter().enumerate() {
                let (id, why) = explain(ev, c, *role, None);
                assert_eq!(id, *want, "case {i}: {why}");
                assert!(why.contains(words), "case {i}: {why}");
            }
        });
        with_evidence(|ev| {
            let (id, why) = explain(ev, &cases[0].0, Role::Main, None);
            assert_eq!(id, Some(FindingId::CpuStarvation), "{why}");
            assert!(why.contains("steal time"), "{why}");
        });
    }

    /// The copy-on-write burst is counted in bytes copied: where a fault copies a whole huge
    /// page (a kernel before 5.8 with transparent huge pages), a few faults are a burst; where
    /// the tracer says a fault copies a base page the verdict is the count's, and the cause
    /// says how much was copied at most.
    #[test]
    fn the_copy_on_write_burst_is_counted_in_bytes_copied() {
        use crate::event::SchedDelta;
        let gap = |minor: u64| {
            let mut c = cand(StallKind::Gap, None, Some(0));
            c.sched = Some(SchedDelta {
                on_cpu_ns: 45 * MS as u64,
                runnable_ns: 5 * MS as u64,
                minor_faults: minor,
                major_faults: 0,
                throttled_ns: None,
                reclaim_ns: None,
            });
            c
        };
        let world = World::new(Some(100), Default::default(), None);
        let (phases, file_time) = (Phases::default(), FileTime::default());
        let ev = |fault_copy: Option<u64>| Evidence {
            fault_copy,
            ..Evidence::plain(&phases, &file_time, &world)
        };
        let huge = Some(2 << 20);
        let base = Some(4096);
        // (faults, what a fault copies, finding, words of the cause)
        let cases: &[(u64, Option<u64>, FindingId, &str)] = &[
            // 20 faults of 4 KiB in 45 ms on a CPU: the command's own work.
            (20, None, FindingId::Command, "a slow command, on a CPU"),
            (20, base, FindingId::Command, "20 minor page faults"),
            // The same 20 faults copying 2 MiB each: 40 MiB copied, a burst.
            (
                20,
                huge,
                FindingId::CowPageFaults,
                "20 minor page faults, at most 40 MiB copied (2.0 MiB a fault on this kernel)",
            ),
            // 3000 faults of a base page: a burst, and what it copied at most.
            (
                3000,
                base,
                FindingId::CowPageFaults,
                "3000 minor page faults, at most 12 MiB copied (4 KiB a fault on this kernel)",
            ),
            // Not known (offline): the count's verdict, no bytes said.
            (
                3000,
                None,
                FindingId::CowPageFaults,
                "3000 minor page faults)",
            ),
            // One huge page copied in 45 ms on a CPU is no burst.
            (1, huge, FindingId::Command, "1 minor page fault"),
        ];
        for (i, (minor, copy, want, words)) in cases.iter().enumerate() {
            let (id, why) = explain(&ev(*copy), &gap(*minor), Role::Main, None);
            assert_eq!(id, Some(*want), "case {i}: {why}");
            assert!(why.contains(words), "case {i}: {why}");
        }
        // A call already running at the attach: its split is of the traced part, and says so.
        let mut c = cand(StallKind::SlowSyscall, Some("write"), None);
        c.dur_facts.in_flight = Some(crate::event::InFlight::AtStart);
        c.sched = Some(SchedDelta {
            on_cpu_ns: MS as u64,
            runnable_ns: 30 * MS as u64,
            minor_faults: 0,
            major_faults: 0,
            throttled_ns: None,
            reclaim_ns: None,
        });
        let (id, why) = explain(&ev(base), &c, Role::Main, None);
        assert_eq!(id, Some(FindingId::CpuStarvation), "{why}");
        assert!(
            why.contains("1.0 ms on one, in its traced part only"),
            "{why}"
        );
    }

    #[test]
    fn stalls_of_a_rule_make_its_finding_and_the_rest_are_unexplained() {
        let stall = |finding: Option<FindingId>, us: i64| Stall {
            ts: String::new(),
            ts_iso: None,
            at_us: 0,
            who: crate::report::ThreadRef {
                pid: 100,
                tid: 100,
                thread: Role::Main,
            },
            kind: StallKind::Gap,
            syscall: None,
            target: crate::report::FdRef {
                fd: None,
                path: None,
                class: None,
            },
            duration_us: us,
            line: None,
            cause: String::new(),
            finding,
            bound: Bound::Exact,
            duration_known: crate::report::DurationKnown::Measured,
            in_flight: None,
            waiting: crate::report::Waiting {
                commands: 0,
                by_command: Default::default(),
                clients: 0,
                worst_us: None,
            },
            phase: None,
            events_lost: false,
            sched: None,
            quiet_calls: None,
            redis_evidence: None,
        };
        let stalls = [
            stall(Some(FindingId::Command), 20_000),
            stall(Some(FindingId::Command), 200_000),
            stall(None, 30_000),
        ];
        let held = vec![Held::default(); 3];
        let out = with_evidence(|ev| findings(ev, &held, &[], &stalls, &Default::default()));
        let got: Vec<(FindingId, Severity, u64)> =
            out.iter().map(|f| (f.id, f.severity, f.stalls)).collect();
        assert_eq!(
            got,
            vec![
                (FindingId::Command, Severity::Critical, 2),
                (FindingId::Unexplained, Severity::Info, 1)
            ]
        );
        assert!(out[0]
            .evidence
            .starts_with("2 stalls over 10 ms, 220 ms in total, worst 200 ms"));
    }

    #[test]
    fn rules_are_listed_once_each_in_a_fixed_order() {
        let ids: Vec<FindingId> = RULES.iter().map(|r| r.id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            ids, sorted,
            "RULES follow FindingId's order, one row per id"
        );
    }

    #[test]
    fn live_backend_findings() {
        let ids = |l: &LiveEvidence<'_>| -> Vec<FindingId> {
            live_findings(l).iter().map(|f| f.id).collect()
        };
        let ptrace = LiveEvidence {
            sees_commands: true,
            tracing_cost: None,
            watch: None,
        };
        assert!(ids(&ptrace).is_empty());
        let slow = LiveEvidence {
            sees_commands: true,
            tracing_cost: Some("tracing is slowing redis down"),
            watch: None,
        };
        let f = live_findings(&slow);
        assert_eq!(
            (f[0].id, f[0].severity),
            (FindingId::TracerOverhead, Severity::Warning)
        );
        assert_eq!(f[0].evidence, "tracing is slowing redis down");
        let window = WatchWindow {
            stalls: 3,
            threshold_ns: 10_000_000,
            span_ns: 32_000_000_000,
            ring_short: false,
            suppressed: 0,
            joined: 0,
            opened_by: None,
        };
        let perf = |watch| LiveEvidence {
            sees_commands: false,
            tracing_cost: None,
            watch,
        };
        assert_eq!(ids(&perf(None)), vec![FindingId::BackendLimits]);
        let limits = |watch| live_findings(&perf(watch)).pop().unwrap().advice;
        assert!(limits(None).contains("or trace briefly with --backend ptrace"));
        assert!(limits(Some(window)).contains("or watch briefly with --backend ptrace"));
        // A watch incident: its window first, with the incident's stalls.
        let f = live_findings(&perf(Some(window)));
        assert_eq!(
            f.iter().map(|f| (f.id, f.stalls)).collect::<Vec<_>>(),
            vec![(FindingId::WatchIncident, 3), (FindingId::BackendLimits, 0)]
        );
        assert_eq!(
            f[0].title,
            "Incident caught by stallscope watch: 3 stalls over 10 ms"
        );
        assert_eq!(
            f[0].evidence,
            "this report covers the 32.00 s of events the watcher held when the incident ended"
        );
    }

    /// Each way a watch window is cut short is said, once.
    #[test]
    fn a_watch_window_says_what_it_lacks() {
        let w = WatchWindow {
            stalls: 1,
            threshold_ns: 50_000_000,
            span_ns: 2_000_000_000,
            ring_short: true,
            suppressed: 2,
            joined: 1,
            opened_by: None,
        };
        let l = LiveEvidence {
            sees_commands: true,
            tracing_cost: None,
            watch: Some(w),
        };
        let f = &live_findings(&l)[0];
        assert_eq!(
            f.title,
            "Incident caught by stallscope watch: 1 stall over 50 ms"
        );
        assert!(f
            .evidence
            .contains("(less than --before: the history ring was full"));
        assert!(f
            .evidence
            .contains("; 2 incidents before this one were not written"));
        assert!(f.evidence.ends_with(
            "; 1 more incident that ended while the previous report was being written is in it"
        ));
        assert_eq!(f.severity, Severity::Info);
    }

    #[test]
    fn finding_ids_serialize_as_their_names() {
        let ids = RULES
            .iter()
            .map(|r| r.id)
            .chain(LIVE_RULES.iter().map(|r| r.id));
        for id in ids {
            assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
        }
    }
}
