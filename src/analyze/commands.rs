//! Commands: how long each command waited, before, during and after a save. Requests are
//! read from client connections (RESP command names, never keys or values), timed from when
//! they arrived (measured by the live bpf backend: `Syscall::arrived`; else the most likely
//! time, from the arrivals unit) to the reply write that answered them, and
//! charged the AOF and log-file time their thread spent meanwhile (the file-time unit).
//! Names are interned once, as they are read, into small `CmdId`s: per event the unit and
//! the holds join compare and hash integers; the text is looked up only for the report.

use super::arrivals::Arrivals;
use super::call::{Facts, ResolvedCall, ThreadIdx};
use super::file_time::{FileNs, FileTime};
use super::holds::DoneCmd;
use super::phases::Segment;
use super::resp;
use super::roles::Role;
use super::stats::Agg;
use crate::event::{Nanos, Ret};
use crate::fdtable::{FileClass, ProcKey};
use crate::report::{self, CommandPhase};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// (process, fd) of a client connection.
type Conn = (ProcKey, i32);

/// A command name, interned by `CmdNames`: dense, in order of first sight.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct CmdId(u32);

/// The command names read so far, by id.
pub(crate) struct CmdNames {
    ids: HashMap<Box<[u8]>, CmdId>,
    names: Vec<Box<str>>,
    /// By id: PSYNC or SYNC, whose answer turns a connection into a replication link.
    syncs: Vec<bool>,
    /// The last name as sent (before upper-casing), its length (usize::MAX: none yet) and
    /// its id:
    /// a busy client sends the same command again and again, and the compare is cheaper
    /// than the copy, the case fold and the hash probe.
    last: ([u8; resp::NAME_MAX], usize, CmdId),
}

impl Default for CmdNames {
    fn default() -> Self {
        CmdNames {
            ids: HashMap::default(),
            names: Vec::new(),
            syncs: Vec::new(),
            last: ([0; resp::NAME_MAX], usize::MAX, CmdId(0)),
        }
    }
}

impl CmdNames {
    /// The id of a name as sent (any case; at most `resp::NAME_MAX` bytes).
    #[inline]
    pub(crate) fn intern_raw(&mut self, raw: &[u8]) -> CmdId {
        let (buf, len, id) = &self.last;
        if *len == raw.len() && buf[..*len] == *raw {
            return *id;
        }
        self.intern_raw_slow(raw)
    }

    #[inline(never)]
    fn intern_raw_slow(&mut self, raw: &[u8]) -> CmdId {
        let mut up = [0u8; resp::NAME_MAX];
        up[..raw.len()].copy_from_slice(raw);
        up[..raw.len()].make_ascii_uppercase();
        let id = self.intern(&up[..raw.len()]);
        let mut last = [0u8; resp::NAME_MAX];
        last[..raw.len()].copy_from_slice(raw);
        self.last = (last, raw.len(), id);
        id
    }

    /// The id of an upper-cased name, given one on first sight.
    #[inline]
    pub(crate) fn intern(&mut self, upper: &[u8]) -> CmdId {
        if let Some(id) = self.ids.get(upper) {
            return *id;
        }
        let id = CmdId(self.names.len() as u32);
        let name: Box<str> = String::from_utf8_lossy(upper).into();
        self.syncs.push(matches!(&*name, "PSYNC" | "SYNC"));
        self.names.push(name);
        self.ids.insert(upper.into(), id);
        id
    }

    pub(crate) fn name(&self, id: CmdId) -> &str {
        &self.names[id.0 as usize]
    }

    #[inline]
    fn is_sync(&self, id: CmdId) -> bool {
        self.syncs[id.0 as usize]
    }
}

struct PendingCmd {
    seq: u64,
    name: CmdId,
    req: Nanos,
    /// When its read began (`DoneCmd::read`).
    read: Nanos,
    at_req: FileNs,
    /// `req` is the measured arrival of its read's data (`Syscall::arrived`).
    measured: bool,
}

/// The bounds of the command state: requests queued per connection, and connections
/// accepted but not yet read from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CommandCaps {
    pub(crate) queue: usize,
    pub(crate) open: usize,
}

impl Default for CommandCaps {
    fn default() -> Self {
        CommandCaps {
            queue: 1024,
            open: 100_000,
        }
    }
}

/// Totals of one command over the whole trace. Its latency distribution is the merge of
/// its per-segment ones (`by_segment` takes every answered request once): one histogram
/// record per answer, not two; merging adds the same counts, so the percentiles are the
/// ones direct recording gives.
#[derive(Default)]
struct Totals {
    aof: i64,
    log: i64,
    from_arrival: u64,
}

/// A client connection's requests not yet answered, and the end of its last reply (one
/// map probe per request and per reply, not one per map).
#[derive(Default)]
struct ConnState {
    pending: VecDeque<PendingCmd>,
    last_reply: Option<Nanos>,
    /// Read from (data returned) and not written to since: a request awaits its reply,
    /// whether or not its command could be named (`Awaiting`).
    read_open: bool,
    /// Read by this own-loop I/O thread (redis 8) and not yet taken by the main thread: its
    /// request awaits its reply, but no command of it can run before the main thread reads
    /// that thread's eventfd (`Awaiting::held`).
    with_io: Option<ThreadIdx>,
}

/// Whether any client's request awaits its reply, for the main thread's gaps
/// (`Commands::quiet_since`): redis runs a command between its request's read and its
/// reply's write, so once every connection read from has been written to, no command is
/// left to run until the next read. Counted by connection, not by
/// named command, so a read whose text the trace lacks (no payloads, a truncated pipeline)
/// counts as well as a named one.
///
/// redis 8's I/O threads run event loops of their own: one reads its clients' requests,
/// then hands those clients to the main thread (it writes the main thread's eventfd for
/// it), and the main thread takes them when it reads that eventfd
/// (`handleClientsFromIOThread`), and runs their commands only then. Until that read such a
/// request is `held`, not `open`: however long the main thread goes without a call, it
/// cannot run that command meanwhile.
#[derive(Default)]
struct Awaiting {
    /// Client connections `read_open`.
    open: u32,
    /// Client connections read by an own-loop I/O thread and not yet taken by the main
    /// thread (`ConnState::with_io`).
    held: u32,
    /// The end of the latest reply write.
    last_reply: Nanos,
    /// Data was read from an fd of no known class: a client's, maybe, so the count above may
    /// miss a request (strace without -y, a connection from before the trace).
    blind: bool,
}

impl Awaiting {
    /// A connection was read from: its request awaits its reply.
    fn opened(&mut self, st: &mut ConnState) {
        if !st.read_open {
            st.read_open = true;
            self.open += 1;
        }
    }

    /// A connection was read by an own-loop I/O thread: its request is with that thread
    /// until the main thread takes it. Returns whether it was not already.
    fn held_by(&mut self, st: &mut ConnState, t: ThreadIdx) -> bool {
        if st.read_open || st.with_io.is_some() {
            return false;
        }
        st.with_io = Some(t);
        self.held += 1;
        true
    }

    /// A connection was written to (or closed): whether a request on it awaited its reply.
    fn closed(&mut self, st: &mut ConnState) -> bool {
        let was = std::mem::take(&mut st.read_open);
        self.open -= u32::from(was);
        if st.with_io.take().is_some() {
            self.held -= 1;
        }
        was
    }
}

/// Since when no client request has been in the main thread's hands unanswered
/// (`Commands::quiet_since`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Quiet {
    /// The end of the latest reply write.
    pub(crate) since: Nanos,
    /// Requests read since then await their replies with redis 8's own-loop I/O threads,
    /// not yet handed to the main thread (`Awaiting::held`).
    pub(crate) io_held: bool,
}

/// What the commands unit reads from the others for one call.
pub(crate) struct CmdInputs<'a> {
    pub(crate) arrivals: &'a Arrivals,
    pub(crate) file_time: &'a FileTime,
    pub(crate) segment: Segment,
    /// The call is on stallscope's own poller connection (`OwnConns`): its commands are no
    /// client's, but they await their replies all the same (`Awaiting`).
    pub(crate) own: bool,
    /// The call's thread is one of redis 8's I/O threads with an event loop of its own
    /// (`IoHelpers::own_loop`): the requests it reads are `Awaiting::held`.
    pub(crate) own_loop: bool,
}

#[derive(Default)]
pub(crate) struct Commands {
    caps: CommandCaps,
    conns: HashMap<Conn, ConnState>,
    /// Connections accepted but not yet read from: when their connect was noticed, and when
    /// the accept was made.
    conn_open: HashMap<Conn, (Nanos, Nanos)>,
    seq: u64,
    names: CmdNames,
    by_segment: HashMap<(CmdId, Segment), Agg>,
    /// By id, once a command of that name is answered.
    all: Vec<Option<Totals>>,
    awaiting: Awaiting,
    /// The connections `Awaiting::held` (and some no longer: checked when taken).
    held: Vec<Conn>,
    /// The eventfd (or pipe) each own-loop I/O thread writes to hand clients over, by the
    /// process's fd.
    notifiers: Vec<(Conn, ThreadIdx)>,
    /// Per process, the end of its main thread's latest write of a notification fd: its
    /// hand-back of the clients it took (or a pause of the I/O threads).
    handed_back: Vec<(ProcKey, Nanos)>,
}

impl Commands {
    pub(crate) fn new(caps: CommandCaps) -> Self {
        Commands {
            caps,
            ..Default::default()
        }
    }

    /// Client-socket reads and writes, accepts and closes. Commands answered by this call
    /// go to `answered`; returns the connection that just became a replication link.
    #[inline]
    pub(crate) fn on_call(
        &mut self,
        cx: &ResolvedCall<'_>,
        inp: &CmdInputs<'_>,
        answered: &mut Vec<DoneCmd>,
    ) -> Option<Conn> {
        let (sc, f) = (cx.sc, cx.facts);
        let mut replica = None;
        if matches!(cx.class, None | Some(FileClass::Unknown))
            && sc.fd.is_some()
            && f.has(Facts::RECV)
            && sc.ret.val() > Some(0)
        {
            self.awaiting.blind = true;
        }
        match cx.class {
            Some(FileClass::Client) => {
                if let (Some(fd), false) = (sc.fd, sc.ret.is_err()) {
                    let conn = (cx.proc, fd);
                    if f.has(Facts::RECV) {
                        self.on_request(cx, conn, inp);
                        if inp.own_loop {
                            self.bound_held();
                        }
                    } else if f.has(Facts::SEND) {
                        replica = self.on_reply(cx, conn, inp, answered);
                    }
                }
            }
            Some(FileClass::Outgoing | FileClass::Replica) => self.on_link(cx),
            Some(FileClass::AnonInode | FileClass::Pipe) => self.on_notifier(cx, inp),
            _ => {}
        }
        if f.has(Facts::CLOSE) {
            if let Some(fd) = sc.fd {
                let conn = (cx.proc, fd);
                if let Some(mut st) = self.conns.remove(&conn) {
                    self.awaiting.closed(&mut st);
                }
                self.conn_open.remove(&conn);
            }
        }
        if f.has(Facts::ACCEPT) {
            if let Ret::Val(newfd) = sc.ret {
                let req = inp.arrivals.request_time(cx.thread, cx.ts());
                if self.conn_open.len() < self.caps.open {
                    self.conn_open
                        .insert((cx.proc, newfd as i32), (req, cx.ts()));
                }
            }
        }
        replica
    }

    /// A read or write on a link redis made or serves as a primary: a replica runs the
    /// commands its primary's stream carries as it reads them, without replies, so a read
    /// there awaits (`Awaiting`) until the link is next written to (its REPLCONF ACK comes
    /// from a timer, after them).
    fn on_link(&mut self, cx: &ResolvedCall<'_>) {
        let (Some(fd), false) = (cx.sc.fd, cx.sc.ret.is_err()) else {
            return;
        };
        let st = self.conns.entry((cx.proc, fd)).or_default();
        if cx.facts.has(Facts::RECV) && cx.sc.ret.val() != Some(0) {
            self.awaiting.opened(st);
        } else if cx.facts.has(Facts::SEND) && self.awaiting.closed(st) {
            self.awaiting.last_reply = self.awaiting.last_reply.max(cx.end);
        }
    }

    /// An own-loop I/O thread's write of an eventfd (or pipe) is its hand-over to the main
    /// thread; the main thread's read of one takes the clients handed over through it, or,
    /// of one no such thread was seen writing, every client the I/O threads hold (a take
    /// too many only keeps the `Awaiting` reading from a gap).
    fn on_notifier(&mut self, cx: &ResolvedCall<'_>, inp: &CmdInputs<'_>) {
        let (Some(fd), Some(n)) = (cx.sc.fd, cx.sc.ret.val()) else {
            return;
        };
        let key = (cx.proc, fd);
        if cx.role == Role::Main && cx.facts.has(Facts::SEND) {
            match self.handed_back.iter_mut().find(|(p, _)| *p == cx.proc) {
                Some(e) => e.1 = cx.end,
                None => self.handed_back.push((cx.proc, cx.end)),
            }
        } else if inp.own_loop && cx.facts.has(Facts::SEND) {
            match self.notifiers.iter_mut().find(|(k, _)| *k == key) {
                Some(e) => e.1 = cx.thread,
                None => self.notifiers.push((key, cx.thread)),
            }
        } else if cx.role == Role::Main && cx.facts.has(Facts::RECV) && n > 0 {
            if self.awaiting.held == 0 {
                return;
            }
            let from = self.notifiers.iter().find(|(k, _)| *k == key).map(|e| e.1);
            let (conns, awaiting) = (&mut self.conns, &mut self.awaiting);
            self.held.retain(|k| {
                let Some(st) = conns.get_mut(k).filter(|_| k.0 == cx.proc) else {
                    return k.0 != cx.proc;
                };
                match st.with_io {
                    Some(t) if from.is_none_or(|f| f == t) => {
                        st.with_io = None;
                        awaiting.held -= 1;
                        awaiting.opened(st);
                        false
                    }
                    Some(_) => true,
                    None => false,
                }
            });
        }
    }

    /// Entries of `held` whose connections were taken or closed since are dropped at the
    /// next take; one that never comes (no main-thread eventfd read seen) must not grow it.
    #[cold]
    fn compact_held(&mut self) {
        let conns = &self.conns;
        self.held
            .retain(|k| conns.get(k).is_some_and(|s| s.with_io.is_some()));
    }

    #[inline]
    fn bound_held(&mut self) {
        if self.held.len() >= 2 * self.awaiting.held as usize + 64 {
            self.compact_held();
        }
    }

    fn on_request(&mut self, cx: &ResolvedCall<'_>, conn: Conn, inp: &CmdInputs<'_>) {
        if cx.sc.ret.val() == Some(0) {
            return;
        }
        let st = self.conns.entry(conn).or_default();
        if !inp.own_loop {
            self.awaiting.opened(st);
        } else if self.awaiting.held_by(st, cx.thread) {
            self.held.push(conn);
        }
        let Some(data) = cx.sc.data().filter(|_| !inp.own) else {
            return;
        };
        let mut ids = [CmdId(0); 8];
        let mut n = 0;
        let names = &mut self.names;
        // The commonest request, one command, named without decoding the read's text.
        let (escaped, kept) = data.kept();
        match escaped.then(|| resp::escaped_single_name(kept)).flatten() {
            Some(name) => {
                ids[0] = names.intern_raw(name);
                n = 1;
            }
            None => {
                let head = data.head();
                resp::for_each_command(head.bytes(), head.truncated, |raw| {
                    if n < ids.len() {
                        ids[n] = names.intern_raw(raw);
                        n += 1;
                    }
                });
            }
        }
        if n == 0 {
            return;
        }
        let ts = cx.ts();
        let at_req = inp.file_time.so_far(cx.thread);
        // Measured (live bpf): when the read's data was queued on the socket, the earliest
        // data no earlier read took; the later commands of a pipelined read share it.
        // Nothing below applies to it: they are estimates from the thread's calls, and a
        // client with several requests in flight sends before a reply.
        if let Some(arrived) = cx.sc.arrived {
            if !self.conn_open.is_empty() {
                self.conn_open.remove(&conn);
            }
            let caps = self.caps.queue;
            queue(
                &mut st.pending,
                &mut self.seq,
                caps,
                &ids[..n],
                (arrived, ts),
                at_req,
                true,
            );
            return;
        }
        let mut req = inp.arrivals.request_time(cx.thread, ts);
        // A client cannot have sent what it sends after a reply before that reply: for
        // synchronous clients this bounds the estimate tightly.
        if let Some(last) = st.last_reply {
            req = req.max(last.min(ts));
        }
        // A new connection's first request, found by a wait that returned at once, may
        // have been queued since the connect: it waited for the accept too. Only if no
        // wait came between the accept and the one that found it: the connection was
        // registered for that wait, which would have returned a request already there, so
        // the request came after it. Never before a stall of the thread that ended before
        // the wait that found it: the trace cannot show the request was sent while the
        // stall ran (issue 13), however likely.
        let queued = inp.arrivals.woke_on_queued(cx.thread);
        let opened = if self.conn_open.is_empty() {
            None
        } else {
            self.conn_open.remove(&conn)
        };
        let req = match opened {
            Some((t, accepted)) if queued && !inp.arrivals.waited_since(cx.thread, accepted) => {
                req.min(t.max(inp.arrivals.not_before(cx.thread)))
            }
            _ => req,
        };
        let caps = self.caps.queue;
        queue(
            &mut st.pending,
            &mut self.seq,
            caps,
            &ids[..n],
            (req, ts),
            at_req,
            false,
        );
    }

    fn on_reply(
        &mut self,
        cx: &ResolvedCall<'_>,
        conn: Conn,
        inp: &CmdInputs<'_>,
        answered: &mut Vec<DoneCmd>,
    ) -> Option<Conn> {
        let end = cx.end;
        let Some(st) = self.conns.get_mut(&conn) else {
            self.awaiting.last_reply = self.awaiting.last_reply.max(end);
            return None;
        };
        // An own-loop I/O thread writes the reply of a request the main thread took only
        // once the main thread has handed the client back (its write of that thread's
        // eventfd): the request left its hands then, at the latest at its last such write.
        let handed_back = || self.handed_back.iter().find(|(p, _)| *p == cx.proc);
        let left = match (inp.own_loop && st.read_open).then(handed_back).flatten() {
            Some(&(_, h)) => h.min(end),
            None => end,
        };
        self.awaiting.last_reply = self.awaiting.last_reply.max(left);
        self.awaiting.closed(st);
        if st.pending.is_empty() {
            return None;
        }
        st.last_reply = Some(end);
        let q = &mut st.pending;
        let now = inp.file_time.so_far(cx.thread);
        // Once a replica's PSYNC (or SYNC) is answered, the connection carries the
        // replication stream out and REPLCONF ACKs in, which are not requests and replies.
        let to_replica = q.iter().any(|p| self.names.is_sync(p.name));
        // One reply write answers every request read so far on this connection (pipelined
        // requests are answered together).
        for p in q.drain(..) {
            let lat = end - p.req;
            self.by_segment
                .entry((p.name, inp.segment))
                .or_default()
                .add(lat);
            let i = p.name.0 as usize;
            if i >= self.all.len() {
                self.all.resize_with(i + 1, || None);
            }
            let e = self.all[i].get_or_insert_with(Totals::default);
            e.aof += now.aof - p.at_req.aof;
            e.log += now.log - p.at_req.log;
            e.from_arrival += p.measured as u64;
            answered.push(DoneCmd {
                seq: p.seq,
                name: p.name,
                conn,
                req: p.req,
                read: p.read,
                reply: end,
            });
        }
        if to_replica {
            self.conns.remove(&conn);
            return Some(conn);
        }
        None
    }

    /// Since when no client request read has awaited its reply in the main thread's hands
    /// (the end of the latest reply write), when none does now; None while one does, or
    /// when data was read from an fd of no known class (`Awaiting`).
    #[inline]
    pub(crate) fn quiet_since(&self) -> Option<Quiet> {
        let a = &self.awaiting;
        (a.open == 0 && !a.blind).then_some(Quiet {
            since: a.last_reply,
            io_held: a.held > 0,
        })
    }

    /// Requests still unanswered when the trace ended (`end`), as if answered just after.
    pub(crate) fn unanswered(&self, end: Nanos) -> Vec<DoneCmd> {
        self.conns
            .iter()
            .flat_map(|(k, st)| {
                st.pending.iter().map(|p| DoneCmd {
                    seq: p.seq,
                    name: p.name,
                    conn: *k,
                    req: p.req,
                    read: p.read,
                    reply: end + 1,
                })
            })
            .collect()
    }

    /// Per command: all calls, and before/during/after the longest phase (its index).
    pub(crate) fn report(&self, longest_phase: Option<usize>) -> Vec<report::CommandStats> {
        let mut out = vec![];
        // Every command's whole-trace distribution: its segments merged (order-free).
        let mut lats: Vec<Agg> = Vec::new();
        lats.resize_with(self.all.len(), Agg::default);
        for ((id, _), a) in &self.by_segment {
            lats[id.0 as usize].merge(a);
        }
        for id in self.in_name_order() {
            let Some(t) = &self.all[id.0 as usize] else {
                continue;
            };
            let lat = &lats[id.0 as usize];
            let n = self.names.name(id);
            out.push(report::CommandStats {
                command: n.to_string(),
                phase: CommandPhase::All,
                calls: lat.count,
                p50_us: lat.pct_us(0.5),
                p99_us: lat.pct_us(0.99),
                max_us: lat.max_us(),
                aof_us: t.aof / 1000,
                log_us: t.log / 1000,
                from_arrival: t.from_arrival,
            });
            if let Some(i) = longest_phase {
                for (label, s) in [
                    (CommandPhase::Before, Segment::before(i)),
                    (CommandPhase::During, Segment::during(i)),
                    (CommandPhase::After, Segment::after(i)),
                ] {
                    if let Some(a) = self.by_segment.get(&(id, s)) {
                        out.push(report::CommandStats {
                            command: n.to_string(),
                            phase: label,
                            calls: a.count,
                            p50_us: a.pct_us(0.5),
                            p99_us: a.pct_us(0.99),
                            max_us: a.max_us(),
                            aof_us: 0,
                            log_us: 0,
                            from_arrival: 0,
                        });
                    }
                }
            }
        }
        out.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.command.cmp(&b.command)));
        out
    }

    /// The answered commands, in the order of their names (the per-phase rows).
    pub(crate) fn in_name_order(&self) -> Vec<CmdId> {
        let mut ids: Vec<CmdId> = (0..self.all.len() as u32)
            .map(CmdId)
            .filter(|id| self.all[id.0 as usize].is_some())
            .collect();
        ids.sort_by(|a, b| self.names.name(*a).cmp(self.names.name(*b)));
        ids
    }

    /// What each command id is called.
    pub(crate) fn names(&self) -> &CmdNames {
        &self.names
    }

    /// Latency distribution of one command in one segment.
    pub(crate) fn segment(&self, name: CmdId, s: Segment) -> report::Dist {
        self.by_segment
            .get(&(name, s))
            .map(|a| a.dist())
            .unwrap_or_default()
    }
}

/// Queues a read's commands on their connection (at most `cap` waiting), each with the time
/// its request is dated from and whether that time was measured (an arrival) or estimated.
fn queue(
    q: &mut VecDeque<PendingCmd>,
    seq: &mut u64,
    cap: usize,
    ids: &[CmdId],
    (req, read): (Nanos, Nanos),
    at_req: FileNs,
    measured: bool,
) {
    for &name in ids {
        *seq += 1;
        if q.len() < cap {
            q.push_back(PendingCmd {
                seq: *seq,
                name,
                req,
                read,
                at_req,
                measured,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};
    use crate::analyze::roles::Role;
    use crate::event::{Data, Event, EventKind, Extra};

    fn io(ts: Nanos, name: &'static str, fd: i32, data: &[u8], ret: i64) -> Event {
        let mut e = event(1, ts, 1_000, name);
        if let EventKind::Syscall(sc) = &mut e.kind {
            sc.fd = Some(fd);
            sc.ret = Ret::Val(ret);
            sc.extra = Extra::Data(Data::new(data, false));
        }
        e
    }

    fn since(c: &Commands) -> Option<Nanos> {
        c.quiet_since().map(|q| q.since)
    }

    fn run(c: &mut Commands, evs: &[Event]) -> (Vec<DoneCmd>, Option<Conn>) {
        let client =
            |e: &Event| (e.syscall().unwrap().name != "accept").then_some(FileClass::Client);
        run_as(c, evs, client)
    }

    /// `run` with each call's fd of the class `class_of` gives it.
    fn run_as(
        c: &mut Commands,
        evs: &[Event],
        class_of: impl Fn(&Event) -> Option<FileClass>,
    ) -> (Vec<DoneCmd>, Option<Conn>) {
        let (arrivals, file_time) = (Arrivals::new(false, 10_000_000), FileTime::default());
        let mut inp = CmdInputs {
            arrivals: &arrivals,
            file_time: &file_time,
            segment: Segment::default(),
            own: false,
            own_loop: false,
        };
        let mut out = vec![];
        let mut replica = None;
        for e in evs {
            // Thread 1 is the main one; others are redis 8's own-loop I/O threads.
            let role = if e.tid == 1 {
                Role::Main
            } else {
                Role::IoThread
            };
            inp.own_loop = role == Role::IoThread;
            let cx = call(e, role, class_of(e));
            replica = replica.or(c.on_call(&cx, &inp, &mut out));
        }
        (out, replica)
    }

    #[test]
    fn pipelined_requests_are_answered_by_one_write() {
        let mut c = Commands::default();
        let req = b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
        let (done, _) = run(
            &mut c,
            &[
                io(0, "read", 7, req, req.len() as i64),
                io(5_000, "write", 7, b"+PONG\r\n+OK\r\n", 12),
            ],
        );
        let names: Vec<&str> = done.iter().map(|d| c.names().name(d.name)).collect();
        assert_eq!(names, vec!["PING", "SET"]);
        assert_eq!(done[0].reply, 6_000);
        assert_eq!(c.report(None).len(), 2);
        assert!(c.unanswered(10).is_empty());
    }

    /// Whether a request awaits its reply is counted by connection, named or not: a read
    /// without its text (perf, no payloads) counts; a reply, or a close, ends it; a read of
    /// an fd of no known class makes it unknowable.
    #[test]
    fn no_request_awaits_a_reply_once_every_connection_read_is_written_to() {
        let mut c = Commands::default();
        let set = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
        assert_eq!(since(&c), Some(0), "nothing read yet");
        let mut blind = io(0, "read", 8, b"", 40);
        if let EventKind::Syscall(sc) = &mut blind.kind {
            sc.extra = Extra::None;
        }
        run(&mut c, &[io(0, "read", 7, set, set.len() as i64), blind]);
        assert_eq!(since(&c), None);
        run(&mut c, &[io(5_000, "write", 7, b"+OK\r\n", 5)]);
        assert_eq!(since(&c), None, "fd 8's request, unnamed, still awaits");
        run(&mut c, &[io(9_000, "read", 8, b"", 0)]);
        assert_eq!(since(&c), None, "an EOF is no request, nor an answer");
        run(&mut c, &[io(10_000, "close", 8, b"", 0)]);
        assert_eq!(since(&c), Some(6_000), "since the last reply's end");
        run(&mut c, &[io(20_000, "write", 7, b"+OK\r\n", 5)]);
        assert_eq!(
            since(&c),
            Some(21_000),
            "a reply with nothing read is one too"
        );
        // A replica's link to its primary: the stream's commands run as they are read.
        let link = |_: &Event| Some(FileClass::Outgoing);
        run_as(
            &mut c,
            &[io(22_000, "read", 10, set, set.len() as i64)],
            link,
        );
        assert_eq!(since(&c), None, "the primary's stream");
        run_as(&mut c, &[io(25_000, "write", 10, b"*3\r\n", 5)], link);
        let ack = "its REPLCONF ACK came after them";
        assert_eq!(since(&c), Some(26_000), "{ack}");
        let unknown = |_: &Event| Some(FileClass::Unknown);
        run_as(
            &mut c,
            &[io(30_000, "read", 9, set, set.len() as i64)],
            unknown,
        );
        assert_eq!(since(&c), None, "fd 9 may be a client's");
    }

    /// redis 8: a request an own-loop I/O thread read is not in the main thread's hands
    /// until the main thread reads the eventfd that thread writes to hand it over; another
    /// I/O thread's hand-over takes none of it.
    #[test]
    fn a_request_with_an_own_loop_io_thread_awaits_the_main_threads_eventfd_read() {
        let mut c = Commands::default();
        let set = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
        let on = |tid: u32, e: Event| Event { tid, ..e };
        let notify = |e: &Event| {
            Some(if e.syscall().unwrap().fd.unwrap() >= 14 {
                FileClass::AnonInode
            } else {
                FileClass::Client
            })
        };
        let quiet = |c: &Commands| c.quiet_since().map(|q| (q.since, q.io_held));
        run_as(
            &mut c,
            &[
                on(2, io(0, "read", 7, set, set.len() as i64)),
                on(2, io(2_000, "write", 15, b"", 8)),
                on(3, io(3_000, "read", 9, set, set.len() as i64)),
                on(3, io(3_500, "write", 18, b"", 8)),
            ],
            notify,
        );
        assert_eq!(quiet(&c), Some((0, true)), "both with their I/O threads");
        run_as(&mut c, &[io(4_000, "read", 15, b"", 8)], notify);
        assert_eq!(quiet(&c), None, "fd 7 taken by the main thread");
        run_as(
            &mut c,
            &[on(2, io(9_000, "write", 7, b"+OK\r\n", 5))],
            notify,
        );
        assert_eq!(quiet(&c), Some((10_000, true)), "fd 9 still with thread 3");
        // A notification fd no own-loop thread was seen writing takes every one.
        run_as(&mut c, &[io(12_000, "read", 21, b"", 8)], notify);
        assert_eq!(quiet(&c), None);
        run_as(
            &mut c,
            &[on(3, io(14_000, "write", 9, b"+OK\r\n", 5))],
            notify,
        );
        assert_eq!(quiet(&c), Some((15_000, false)));
        // Read by the I/O thread and closed before any hand-over: nothing left with it.
        run_as(
            &mut c,
            &[
                on(2, io(20_000, "read", 7, set, set.len() as i64)),
                on(2, io(21_000, "close", 7, b"", 0)),
            ],
            notify,
        );
        assert_eq!(quiet(&c), Some((15_000, false)));
    }

    #[test]
    fn a_measured_arrival_starts_the_clock_and_is_counted() {
        let mut c = Commands::default();
        let get = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        let mut first = io(10_000, "read", 7, get, get.len() as i64);
        let mut second = io(30_000, "read", 7, get, get.len() as i64);
        if let (EventKind::Syscall(a), EventKind::Syscall(b)) = (&mut first.kind, &mut second.kind)
        {
            a.arrived = Some(4_000);
            // Sent before the first reply (a client with two requests in flight): the
            // estimate would start it at that reply; the measurement is kept.
            b.arrived = Some(12_000);
        }
        let (done, _) = run(
            &mut c,
            &[
                first,
                io(20_000, "write", 7, b"$1\r\nv\r\n", 7),
                second,
                io(40_000, "write", 7, b"$1\r\nv\r\n", 7),
                // Without one: dated as before (no event-loop wait here: from its read).
                io(50_000, "read", 7, get, get.len() as i64),
                io(60_000, "write", 7, b"$1\r\nv\r\n", 7),
            ],
        );
        let reqs: Vec<Nanos> = done.iter().map(|d| d.req).collect();
        assert_eq!(reqs, vec![4_000, 12_000, 50_000]);
        let all = &c.report(None)[0];
        assert_eq!((all.calls, all.from_arrival), (3, 2));
    }

    #[test]
    fn names_are_interned_once_each_and_read_back_only_by_id() {
        let mut n = CmdNames::default();
        let (get_raw, set_raw) = (n.intern_raw(b"get"), n.intern_raw(b"SET"));
        assert_eq!(
            (n.intern_raw(b"GET"), n.intern_raw(b"Get")),
            (get_raw, get_raw)
        );
        assert_eq!(
            (n.intern_raw(b"get"), n.intern_raw(b"set")),
            (get_raw, set_raw)
        );
        let (get, set) = (n.intern(b"GET"), n.intern(b"SET"));
        assert_eq!((n.intern(b"GET"), n.name(set)), (get, "SET"));
        assert_ne!(get, set);
        let psync = n.intern(b"PSYNC");
        assert!(n.is_sync(psync) && !n.is_sync(get));
    }

    #[test]
    fn an_answered_psync_makes_a_replica() {
        let mut c = Commands::default();
        let req = b"*3\r\n$5\r\nPSYNC\r\n$1\r\n?\r\n$2\r\n-1\r\n";
        let (_, replica) = run(
            &mut c,
            &[
                io(0, "read", 9, req, req.len() as i64),
                io(5_000, "write", 9, b"+FULLRESYNC\r\n", 13),
            ],
        );
        assert_eq!(replica, Some((ProcKey::Root, 9)));
    }

    #[test]
    fn the_queue_cap_bounds_what_one_connection_keeps() {
        let mut c = Commands::new(CommandCaps { queue: 2, open: 1 });
        let req = b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n";
        run(&mut c, &[io(0, "read", 7, req, req.len() as i64)]);
        assert_eq!(c.unanswered(10).len(), 2);
        // Only one accepted connection is remembered before its first read.
        run(
            &mut c,
            &[io(0, "accept", 3, b"", 11), io(0, "accept", 3, b"", 12)],
        );
        assert_eq!(c.conn_open.len(), 1);
    }
}
