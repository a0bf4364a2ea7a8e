//! Holds: which commands each stall held up, the one join between stalls and commands. A
//! command counts as held by a stall if its request was in (read or queued) before the stall
//! ended and its reply went out after the stall began. Stalls and commands complete in
//! either order, so both sides are remembered for a while: the answered commands in a ring,
//! the recent stalls in a window.

use super::commands::CmdId;
use super::stalls::Added;
use crate::event::Nanos;
use crate::fdtable::ProcKey;
use rustc_hash::FxHashSet as HashSet;
use std::collections::VecDeque;

/// A command answered (or, at the end, never answered: `reply` after the trace's end).
#[derive(Clone, Debug)]
pub(crate) struct DoneCmd {
    pub(crate) seq: u64,
    pub(crate) name: CmdId,
    /// (process, fd) of the connection.
    pub(crate) conn: (ProcKey, i32),
    pub(crate) req: Nanos,
    /// When the thread that read the request began that read: after a stall's end, the
    /// command cannot have run in it, however early its data arrived (a new connection's
    /// request queued in the kernel until the main thread's accept).
    pub(crate) read: Nanos,
    pub(crate) reply: Nanos,
}

/// Which held commands came in before a stall and went out after it, and which came in
/// during it: what tells which one the stall's thread ran through it.
#[derive(Clone, Default, Debug)]
struct ByOrder {
    /// The command whose request was in before the stall began and whose reply went out
    /// after it ended: the one the thread ran through it (`None` too when commands of
    /// different names did, as a pipeline does).
    running: Option<CmdId>,
    running_several: bool,
    /// Of the commands read during the stall and answered after it, the one answered
    /// first (its reply's time): with I/O threads a script's request is read by an I/O
    /// thread inside the main thread's gap, and its reply is the first to go out after.
    first_answered: Option<(Nanos, CmdId)>,
    /// The commands read during the stall and answered after it, by name (`alike`; at
    /// most `RUNNING_NAMES` names).
    read_in: Vec<(CmdId, u32)>,
    /// The commands in before the stall began and answered after it ended, by name
    /// (`odd_one_out`; at most `RUNNING_NAMES` names).
    running_names: Vec<(CmdId, u32)>,
}

/// What one stall held up.
#[derive(Clone, Default, Debug)]
pub(crate) struct Held {
    /// The candidate this belongs to (a full stall store reuses indices).
    id: u64,
    start: Nanos,
    end: Nanos,
    pub(crate) waiting: u64,
    /// Distinct connections it held (capped).
    pub(crate) clients: HashSet<(ProcKey, i32)>,
    pub(crate) worst_wait: Option<i64>,
    /// Commands (by sequence number) it held up, for merging into incidents.
    pub(crate) seqs: Vec<u64>,
    /// By name: how many it held, and how many of those were read before it ended (the
    /// ones that could have run in it).
    pub(crate) by_cmd: Vec<(CmdId, u64, u64)>,
    /// What tells which command the stall's thread ran through it (`Held::across_threads`).
    by_order: ByOrder,
    /// The command the stall's row names as the one its thread ran (`Kept`), for the
    /// findings' summaries to say the same.
    pub(crate) ran: Option<CmdId>,
    /// Other commands it may as well have run, which the trace cannot tell from `ran`
    /// (`Held::across_threads`): its row names them all ("EVAL or CONFIG").
    pub(crate) ran_or: Vec<CmdId>,
    /// Of each name (at most `RUNNING_NAMES`), the sequence number of the first command of
    /// it held: which command a name stands for when one command has it (`lone_seq`).
    first_seq: Vec<(CmdId, u64)>,
    /// The command this gap held whose own stall, an earlier one of the same thread, had
    /// ended before it began (`Kept::all`): not the one it ran.
    pub(crate) finished: Option<CmdId>,
}

/// Of commands by name (name, how many), the one name only one command has, when every other
/// name has many (3 or more): copies of a command cost alike, so one of them cannot be the
/// slow one without the others; the odd one is. None unless there are two names or more.
/// One more command of `name` in a by-name count (`Held::by_cmd`); `ran`: it could have run.
fn count(by: &mut Vec<(CmdId, u64, u64)>, name: CmdId, ran: bool) {
    let ran = u64::from(ran);
    match by.iter_mut().find(|(n, _, _)| *n == name) {
        Some(e) => (e.1, e.2) = (e.1 + 1, e.2 + ran),
        None => by.push((name, 1, ran)),
    }
}

/// One more command of `name` in a by-name tally of at most `RUNNING_NAMES` names.
fn tally(names: &mut Vec<(CmdId, u32)>, name: CmdId) {
    if let Some(e) = names.iter_mut().find(|(n, _)| *n == name) {
        e.1 += 1;
    } else if names.len() < RUNNING_NAMES {
        names.push((name, 1));
    }
}

/// Of commands by name (name, how many), those of few copies (one or two), `first` first
/// if it is one: the ones a stall may have run when the trace cannot tell which. A name of
/// many copies is not the slow one (`odd_one`), so where names of few copies are, `first`
/// of many is not said. None when no name has few copies.
fn few_of(names: &[(CmdId, u32)], first: Option<CmdId>) -> Option<(CmdId, Vec<CmdId>)> {
    let few = names.iter().filter(|e| e.1 <= 2).map(|e| e.0);
    let mut out: Vec<CmdId> = first
        .filter(|f| few.clone().any(|n| n == *f))
        .into_iter()
        .collect();
    out.extend(few.filter(|n| Some(*n) != first));
    let (n, rest) = out.split_first()?;
    Some((*n, rest.to_vec()))
}

fn odd_one(names: impl Iterator<Item = (CmdId, u64)>) -> Option<CmdId> {
    let (mut single, mut singles, mut others) = (None, 0, 0);
    for (n, k) in names {
        match k {
            1 => (single, singles) = (Some(n), singles + 1),
            2 => return None,
            _ => others += 1,
        }
    }
    single.filter(|_| singles == 1 && others > 0)
}

/// "EVAL", "EVAL or CONFIG", "EVAL, CONFIG or GET": the command a stall ran, with those it
/// cannot be told from (`Held::ran_or`).
pub(crate) fn one_of(names: &super::commands::CmdNames, ran: CmdId, or: &[CmdId]) -> String {
    let mut text = names.name(ran).to_string();
    for (i, n) in or.iter().enumerate() {
        text.push_str(if i + 1 == or.len() { " or " } else { ", " });
        text.push_str(names.name(*n));
    }
    text
}

/// Names of the commands that ran through a stall kept apart, at most.
const RUNNING_NAMES: usize = 8;

/// Most clients and command numbers remembered per stall.
const HELD_MAX: usize = 4096;

impl Held {
    /// Counts the command if the stall held it.
    fn count_if_held(&mut self, d: &DoneCmd) {
        if d.req < self.end && d.reply > self.start {
            self.waiting += 1;
            if self.clients.len() < HELD_MAX {
                self.clients.insert(d.conn);
            }
            let w = d.reply - d.req;
            self.worst_wait = Some(self.worst_wait.map_or(w, |x| x.max(w)));
            if self.seqs.len() < HELD_MAX {
                self.seqs.push(d.seq);
            }
            let ran = d.read < self.end;
            count(&mut self.by_cmd, d.name, ran);
            let first = self.first_seq.iter().any(|(n, _)| *n == d.name);
            if !first && self.first_seq.len() < RUNNING_NAMES {
                self.first_seq.push((d.name, d.seq));
            }
            if !ran {
                // It waited through the stall, but was read after it: it did not run in it.
                return;
            }
            let o = &mut self.by_order;
            if d.req > self.start && d.reply >= self.end {
                if o.first_answered.is_none_or(|(r, _)| d.reply < r) {
                    o.first_answered = Some((d.reply, d.name));
                }
                tally(&mut o.read_in, d.name);
            }
            if d.req <= self.start && d.reply >= self.end {
                tally(&mut o.running_names, d.name);
                match &o.running {
                    _ if o.running_several => {}
                    None => o.running = Some(d.name),
                    Some(n) if *n == d.name => {}
                    Some(_) => {
                        o.running = None;
                        o.running_several = true;
                    }
                }
            }
        }
    }

    /// The command the stall's thread ran through all of it, when one name is known.
    pub(crate) fn running(&self) -> Option<CmdId> {
        self.by_order.running
    }

    /// The command read during the stall and answered first after it
    /// (`first_answered`).
    /// None when commands of several names were already in when the stall began: which
    /// of them ran through it is not known.
    pub(crate) fn first_answered(&self) -> Option<CmdId> {
        if self.by_order.running_several {
            return None;
        }
        self.by_order.first_answered.map(|(_, n)| n)
    }

    /// Of a batch of commands that were all in before the stall and answered after it (the
    /// main thread of redis 6/7 runs every command its I/O threads read in one turn), the
    /// one whose name no other command of the batch shares, when the rest are many copies
    /// of other names: those copies cost alike, so one of them cannot be the slow one
    /// without the others; the odd one is.
    pub(crate) fn odd_one_out(&self) -> Option<CmdId> {
        let o = &self.by_order;
        let names = o.running_names.iter().map(|(n, k)| (*n, u64::from(*k)));
        odd_one(names).filter(|_| o.running_several)
    }

    /// The command a gap of a main thread with I/O threads ran. An I/O thread may have read
    /// its request inside the gap (the main thread waits for it without a call of its own),
    /// while the requests of the batch before it, run first but answered with it, were in
    /// before the gap and out after it: `running` names those (valkey under a GET load: an
    /// EVAL's gap was "a slow command (GET)"). So of every command the gap held: the one name
    /// when all share it (and one was still unanswered at its end), else the odd one out of
    /// them all; else the command in before it and
    /// out after when it was alone (the main thread read it itself as the gap began, no copy
    /// of it queued with it), else the first answered of those read in it with the others
    /// it may as well have run (`alike`), else the odd one of those in before it and out
    /// after, else all of those of few copies (`few_of`).
    pub(crate) fn across_threads(&self) -> Option<(CmdId, Vec<CmdId>)> {
        // One name: unless no command of it was still unanswered at the gap's end (then
        // none of them ran through it).
        let mut could_run = self
            .by_cmd
            .iter()
            .filter(|e| e.2 > 0)
            .map(|&(n, _, k)| (n, k));
        if let (Some((n, _)), None) = (could_run.next(), could_run.next()) {
            let open = self.running() == Some(n) || self.first_answered() == Some(n);
            return open.then_some((n, vec![]));
        }
        let alone = self.running().filter(|n| {
            let names = &self.by_order.running_names;
            names.iter().any(|(m, k)| m == n && *k == 1)
        });
        odd_one(
            self.by_cmd
                .iter()
                .filter(|e| e.2 > 0)
                .map(|&(n, _, k)| (n, k)),
        )
        .or(alone)
        .map(|n| (n, vec![]))
        .or_else(|| self.first_answered().map(|n| self.alike(n)))
        .or_else(|| self.odd_one_out().map(|n| (n, vec![])))
        .or_else(|| {
            // Several in before it and out after, of few copies each (a script and a GET
            // the main thread read just before it): one of them ran through it.
            let o = &self.by_order;
            few_of(&o.running_names, None).filter(|_| o.running_several)
        })
    }

    /// The first answered of the commands read in a gap, `first`, and those read in it it
    /// cannot be told from (`few_of`). The main thread runs the commands its I/O threads
    /// read in an order the trace does not show, and writes their replies in one turn after
    /// the slow one ended, so the first reply out does not say which ran through the gap.
    fn alike(&self, first: CmdId) -> (CmdId, Vec<CmdId>) {
        few_of(&self.by_order.read_in, Some(first)).unwrap_or((first, vec![]))
    }

    /// The sequence number of the one command of this name the stall held, when it held
    /// one only: the same command as another stall's when the numbers match.
    pub(crate) fn lone_seq(&self, name: CmdId) -> Option<u64> {
        let one = self.by_cmd.iter().any(|(n, k, _)| *n == name && *k == 1);
        let seq = self.first_seq.iter().find(|(n, _)| *n == name);
        seq.filter(|_| one).map(|(_, s)| *s)
    }

    /// Only the threads that serve clients hold them up: a child or bio thread's stall that
    /// overlaps a command did not delay it (had it, the main thread would have stalled too).
    pub(crate) fn client_facing_only(&mut self) {
        self.waiting = 0;
        self.clients.clear();
        self.worst_wait = None;
        self.seqs.clear();
        self.by_cmd.clear();
        self.by_order = ByOrder::default();
        self.ran = None;
        self.ran_or.clear();
        self.first_seq.clear();
        self.finished = None;
    }
}

pub(crate) struct Holds {
    /// Answered commands, newest last, at most `done_keep`.
    done: VecDeque<DoneCmd>,
    done_keep: usize,
    /// The most recent stalls (index, id, latest end of it and of every stall before it),
    /// for matching commands as they complete. The running maximum lets a command that
    /// arrived after all of them stop at the newest entry instead of testing every one.
    recent: VecDeque<(usize, u64, Nanos)>,
    recent_keep: usize,
    /// By stall index.
    held: Vec<Held>,
}

impl Holds {
    pub(crate) fn new(done_keep: usize, recent_keep: usize) -> Self {
        Holds {
            done: VecDeque::new(),
            done_keep,
            recent: VecDeque::new(),
            recent_keep,
            held: vec![],
        }
    }

    /// A stall was stored: the commands already answered that waited through it.
    pub(crate) fn on_stall(&mut self, a: Added) {
        let mut h = Held {
            id: a.id,
            start: a.start,
            end: a.end,
            ..Default::default()
        };
        for d in self.done.iter().rev() {
            if d.reply < a.start {
                break;
            }
            h.count_if_held(d);
        }
        if a.idx >= self.held.len() {
            self.held.resize_with(a.idx + 1, Held::default);
        }
        self.held[a.idx] = h;
        if self.recent.len() == self.recent_keep {
            self.recent.pop_front();
        }
        let max_end = self.recent.back().map_or(a.end, |r| r.2.max(a.end));
        self.recent.push_back((a.idx, a.id, max_end));
    }

    /// A command was answered: the stalls already found that it waited through.
    pub(crate) fn on_answered(&mut self, d: DoneCmd) {
        for (idx, id, max_end) in self.recent.iter().rev() {
            if *max_end <= d.req {
                break;
            }
            if let Some(h) = self.held.get_mut(*idx) {
                if h.id == *id {
                    h.count_if_held(&d);
                }
            }
        }
        if self.done.len() == self.done_keep {
            self.done.pop_front();
        }
        self.done.push_back(d);
    }

    /// Requests never answered before the trace ended waited through every stall after them.
    pub(crate) fn unanswered(&mut self, cmds: &[DoneCmd]) {
        for d in cmds {
            for h in self.held.iter_mut() {
                h.count_if_held(d);
            }
        }
    }

    /// What the stall at this index held.
    pub(crate) fn held(&self, idx: usize) -> Held {
        self.held.get(idx).cloned().unwrap_or_default()
    }

    /// What every stall held, by index, taken out for the final report (a copy of each
    /// stall's clients and commands would cost an allocation apiece).
    pub(crate) fn take_all(&mut self) -> Vec<Held> {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::commands::CmdNames;

    fn set() -> CmdId {
        CmdNames::default().intern(b"SET")
    }

    fn done(seq: u64, conn: i32, req: Nanos, reply: Nanos) -> DoneCmd {
        DoneCmd {
            seq,
            name: set(),
            conn: (ProcKey::Root, conn),
            req,
            read: req,
            reply,
        }
    }
    fn added(idx: usize, id: u64, start: Nanos, end: Nanos) -> Added {
        Added {
            idx,
            id,
            start,
            end,
        }
    }

    #[test]
    fn held_through_truth_table() {
        // Stall [100, 200).
        for (req, reply, held) in [
            (50, 150, true),   // in before, out during
            (150, 250, true),  // in during, out after
            (50, 250, true),   // spans it
            (50, 100, false),  // answered as it began
            (200, 300, false), // read as it ended
            (10, 20, false),
        ] {
            let mut h = Held {
                start: 100,
                end: 200,
                ..Default::default()
            };
            h.count_if_held(&done(1, 5, req, reply));
            assert_eq!(h.waiting == 1, held, "req {req} reply {reply}");
        }
    }

    #[test]
    fn either_order_counts_once() {
        let mut h = Holds::new(16, 4);
        // Answered before the stall is found.
        h.on_answered(done(1, 5, 50, 150));
        h.on_stall(added(0, 1, 100, 200));
        // Answered after.
        h.on_answered(done(2, 6, 120, 400));
        h.on_answered(done(3, 6, 300, 400));
        let x = h.held(0);
        assert_eq!((x.waiting, x.clients.len()), (2, 2));
        assert_eq!(x.worst_wait, Some(280));
        assert_eq!(x.by_cmd, vec![(set(), 2, 2)]);
    }

    #[test]
    fn clients_are_counted_once_each_up_to_the_cap() {
        let mut h = Held {
            start: 100,
            end: 200,
            ..Default::default()
        };
        for i in 0..(HELD_MAX as i32 + 500) {
            h.count_if_held(&done(i as u64, i % (HELD_MAX as i32 + 100), 50, 150));
        }
        assert_eq!(h.clients.len(), HELD_MAX);
        assert_eq!(h.waiting, HELD_MAX as u64 + 500);
        assert_eq!(h.by_cmd.len(), 1);
    }

    #[test]
    fn a_reused_index_starts_afresh_and_the_windows_are_bounded() {
        let mut h = Holds::new(2, 1);
        h.on_stall(added(0, 1, 100, 200));
        h.on_answered(done(1, 5, 150, 250));
        // The store evicted stall 1; index 0 is now stall 2, which held nothing yet.
        h.on_stall(added(0, 2, 1000, 1100));
        assert_eq!(h.held(0).waiting, 0);
        // Only the newest answered commands are remembered.
        h.on_answered(done(2, 5, 10, 20));
        h.on_answered(done(3, 5, 10, 20));
        h.on_answered(done(4, 5, 1050, 1200));
        assert_eq!(h.done.len(), 2);
        h.on_stall(added(1, 3, 1000, 1100));
        assert_eq!(h.held(1).seqs, vec![4]);
        assert_eq!(h.recent.len(), 1);
        h.unanswered(&[done(5, 7, 1090, 5000)]);
        assert_eq!(h.held(1).waiting, 2);
    }

    /// A stall from 100 to 200 ns and the commands (name, request, reply) it held.
    fn held_through_100_200(cmds: &[(&str, Nanos, Nanos)]) -> (Held, CmdNames) {
        let mut names = CmdNames::default();
        let mut h = Held {
            start: 100,
            end: 200,
            ..Default::default()
        };
        for (i, (name, req, reply)) in cmds.iter().enumerate() {
            h.count_if_held(&DoneCmd {
                seq: i as u64,
                name: names.intern(name.as_bytes()),
                conn: (ProcKey::Root, i as i32),
                req: *req,
                read: *req,
                reply: *reply,
            });
        }
        (h, names)
    }

    /// The command a stall ran through is the one in before it and out after it, when a
    /// single name is: EVAL through its own gap, not the GETs that queued behind it.
    #[test]
    fn the_command_running_through_a_stall_is_named_when_one_name_is() {
        let named = |cmds: &[(&str, Nanos, Nanos)]| {
            let (h, names) = held_through_100_200(cmds);
            h.running().map(|k| names.name(k).to_string())
        };
        assert_eq!(
            named(&[("EVAL", 90, 205), ("GET", 150, 210), ("GET", 120, 230)]),
            Some("EVAL".into())
        );
        assert_eq!(named(&[("GET", 150, 210)]), None, "queued, not running");
        assert_eq!(
            named(&[("EVAL", 90, 205), ("EVAL", 95, 206)]).as_deref(),
            Some("EVAL")
        );
        assert_eq!(
            named(&[("EVAL", 90, 205), ("KEYS", 95, 206)]),
            None,
            "which?"
        );
        assert_eq!(named(&[("EVAL", 90, 150)]), None, "answered during it");
    }

    /// A request read after the stall ended did not run in it, however early its data
    /// arrived: valkey's EVAL gap under bpf held the EVAL and a CONFIG GET whose new
    /// connection the main thread accepted only after the EVAL (its data queued in the
    /// kernel meanwhile), and answered first after it (the main thread ran it at once; the
    /// EVAL's reply went out through the I/O thread). Read in the gap, the CONFIG would be
    /// the first answered of those read in it, the name; read after it, it is not a
    /// candidate, and the EVAL is named.
    #[test]
    fn a_request_read_after_the_stall_did_not_run_in_it() {
        let mut names = CmdNames::default();
        let (eval, config) = (names.intern(b"EVAL"), names.intern(b"CONFIG"));
        let named = |config_read: Nanos| {
            let mut h = Held {
                start: 100,
                end: 200,
                ..Default::default()
            };
            for (i, (name, req, read, reply)) in
                [(eval, 110, 110, 205), (config, 150, config_read, 203)]
                    .into_iter()
                    .enumerate()
            {
                h.count_if_held(&DoneCmd {
                    seq: i as u64,
                    name,
                    conn: (ProcKey::Root, i as i32),
                    req,
                    read,
                    reply,
                });
            }
            (h.across_threads(), h.waiting)
        };
        // Both read in it, one each: which ran through it the trace cannot tell, and the
        // row says both, the first answered first.
        assert_eq!(
            named(150),
            (Some((config, vec![eval])), 2),
            "read in it, answered first"
        );
        assert_eq!(
            named(201),
            (Some((eval, vec![])), 2),
            "the CONFIG waited, but ran after"
        );
    }

    /// With I/O threads (issue 40) the command a gap ran is told from everything it held:
    /// a script read inside the gap by an I/O thread, answered after it with the GETs run
    /// before it, is named, where `running` names the GETs.
    #[test]
    fn across_threads_the_odd_one_of_everything_held_is_named() {
        let named = |cmds: &[(&str, Nanos, Nanos)]| {
            let (h, names) = held_through_100_200(cmds);
            let n = |k: Option<CmdId>| k.map(|k| names.name(k).to_string());
            let across = h.across_threads().map(|(k, or)| one_of(&names, k, &or));
            (n(h.running()), across)
        };
        let gets = [("GET", 90, 205), ("GET", 91, 206), ("GET", 92, 207)];
        let mut v = gets.to_vec();
        v.push(("EVAL", 150, 210));
        assert_eq!(named(&v), (Some("GET".into()), Some("EVAL".into())));
        // The GETs alone: they are what ran.
        assert_eq!(named(&gets).1.as_deref(), Some("GET"));
        // GETs all answered inside the gap: none ran through it.
        assert_eq!(named(&[("GET", 90, 150), ("GET", 120, 160)]).1, None);
        // Two GETs are no batch of copies: the one read in it and answered first after.
        assert_eq!(named(&v[1..]).1.as_deref(), Some("EVAL"));
        // Two of every name: which one is not known, and both are said.
        let two_each = [("GET", 90, 205), ("KEYS", 91, 206)];
        assert_eq!(
            named(&[two_each, two_each].concat()).1.as_deref(),
            Some("GET or KEYS")
        );
        // The EVAL in before it too: the same answer either way.
        v[3].1 = 80;
        assert_eq!(named(&v).1.as_deref(), Some("EVAL"));
        // A script the main thread read itself as the gap began, one SET an I/O thread read
        // in it: the lone command in before it and out after.
        assert_eq!(
            named(&[("EVAL", 90, 205), ("SET", 150, 206)]).1.as_deref(),
            Some("EVAL")
        );
        // Two singles read in it, and fifty GETs: the first answered is a GET, but a copy
        // of fifty is not the slow one, and the two singles cannot be told apart.
        let mut w: Vec<(&str, Nanos, Nanos)> = (0..50).map(|i| ("GET", 120, 201 + i)).collect();
        w.extend([("EVAL", 130, 260), ("CONFIG", 140, 255)]);
        assert_eq!(named(&w).1.as_deref(), Some("EVAL or CONFIG"));
        // One of each of three: all three, the first answered first.
        let three = [("SET", 110, 203), ("EVAL", 120, 201), ("KEYS", 130, 202)];
        assert_eq!(named(&three).1.as_deref(), Some("EVAL, SET or KEYS"));
        // A script and one GET the main thread read just before the gap, both answered
        // after it (redis 7 under bpf, live_iothreads_backends::redis7_bpf 1 run in 6):
        // one of the two ran through it; GETs of many copies in before too are not named.
        let two = [("EVAL", 90, 205), ("GET", 91, 206)];
        assert_eq!(named(&two).1.as_deref(), Some("EVAL or GET"));
        let mut v2 = two.to_vec();
        v2.extend([("SET", 92, 207), ("SET", 93, 208), ("SET", 94, 209)]);
        assert_eq!(named(&v2).1.as_deref(), Some("EVAL or GET"));
    }
}
