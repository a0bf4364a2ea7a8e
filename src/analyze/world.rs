//! The world the units borrow: who made each call, in which process, on which file, and what
//! that thread is to redis. It owns the thread and process bookkeeping, the fd table, the
//! role evidence, and turns each finished syscall into the one
//! `ResolvedCall` every unit reads (`observe`). Process structure from clone/fork is applied
//! after the units have seen the call (`after`), as the units expect the parent's view.

use super::call::{Facts, ResolvedCall, ThreadIdx, Waits};
use super::roles::{decide, Role, RoleEvidence, Situation, Why};
use crate::event::{Event, Extra, Nanos, Ret, Syscall, Tid};
use crate::fdtable::{FdTable, FileClass, FileId, FileInfo, ProcKey};
use crate::redis_conf::RedisConf;
use crate::report;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::cell::Cell;

#[derive(Default)]
struct ThreadRec {
    tid: Tid,
    proc: ProcKey,
    calls: u64,
    name: Option<String>,
    evidence: RoleEvidence,
    /// (evidence epoch, role) of the last role decision: roles change rarely, the hot path
    /// asks for them on every event.
    role_cache: Cell<Option<(u64, Role)>>,
    /// The fd of an outgoing connection this thread's last call sent a request on (or the
    /// wait for its reply that followed): its next wait or read there is for that reply.
    sent: Option<i32>,
    /// A traced clone made it: its process is its creator's, whatever its comm.
    cloned: bool,
}

pub(crate) struct World {
    threads: Vec<ThreadRec>,
    index: HashMap<Tid, ThreadIdx>,
    /// One-entry cache in front of `index`: consecutive events mostly come from one thread.
    last: Cell<(Tid, u32)>,
    /// Pids of the children forked in the trace: every other tid is the traced process's
    /// (`ProcKey::Root`) unless a clone says otherwise.
    children: HashSet<u32>,
    /// The traced process's pid, once known (given, or named by strace's first attach).
    root_pid: Option<u32>,
    /// Child processes that ran in the trace with no call in it creating them (a SIGCHLD
    /// named each): the trace left out fork, vfork and clone.
    untraced_children: HashSet<u32>,
    fds: FdTable,
    /// tid -> thread name: from `--threads FILE`, /proc live, or `-Y` names in the trace.
    names: HashMap<Tid, String>,
    /// Bumped whenever evidence that decides thread roles changes.
    role_epoch: u64,
    /// Some thread has run the event loop.
    any_epoll: bool,
    /// Some thread waited in select/poll.
    any_poll: bool,
    /// The trace is read: roles are decided on what it showed as a whole.
    finished: bool,
    /// The most threads strace said it attached to (`attached with 11 threads`).
    announced: u32,
    /// A trace that names no process (`perf trace -a`): its programs.
    progs: Programs,
}

/// The programs of a trace that names no process (`perf trace -a`), by comm.
#[derive(Default)]
struct Programs {
    /// Programs by comm other than the reported redis: the first tid seen under each (the
    /// order they are listed in).
    first_tid: HashMap<Box<str>, u32>,
    /// Threads first seen under a redis server's comm, in order: the first is the reported
    /// redis, each other a server process of its own (`program_of`).
    servers: Vec<Tid>,
    /// Threads named by their comm before their first call (`set_program`).
    by_comm: HashSet<Tid>,
}

impl World {
    pub(crate) fn new(
        root_pid: Option<Tid>,
        names: HashMap<Tid, String>,
        conf: Option<RedisConf>,
    ) -> Self {
        World {
            threads: vec![],
            index: HashMap::default(),
            last: Cell::new((0, u32::MAX)),
            children: HashSet::default(),
            root_pid,
            untraced_children: HashSet::default(),
            fds: FdTable::new(conf),
            names,
            role_epoch: 0,
            any_epoll: false,
            any_poll: false,
            finished: false,
            announced: 0,
            progs: Programs::default(),
        }
    }

    /// Live: the fd table as /proc/PID/fd showed it at attach.
    pub(crate) fn seed_fd(&mut self, pid: Tid, fd: i32, path: &str) {
        let key = self.proc_key(pid);
        self.fds.bind(key, fd, Some(path), None, i64::MIN / 4);
    }

    pub(crate) fn set_name(&mut self, tid: Tid, name: &str) {
        self.names.insert(tid, name.to_string());
        if let Some(t) = self.known(tid) {
            self.threads[t.get()].name = Some(name.to_string());
            self.role_epoch += 1;
        }
    }

    /// A thread's comm from a trace that names no process (`EventKind::Program`). perf
    /// trace prints the comm of every thread, of every program on a whole machine: a thread
    /// first seen by its comm (no traced clone made it) is given its process by
    /// `program_of`.
    pub(crate) fn set_program(&mut self, tid: Tid, comm: &str) {
        self.set_name(tid, comm);
        // A thread that never makes a call (perf's tracepoint lines) is no thread of the
        // trace: its program is given at its first call (`first_sight`).
        let Some(t) = self.known(tid) else {
            self.progs.by_comm.insert(tid);
            return;
        };
        let rec = &self.threads[t.get()];
        if rec.calls == 0 && !rec.cloned && rec.proc == ProcKey::Root {
            self.threads[t.get()].proc = self.program_of(tid, comm);
            self.role_epoch += 1;
        }
    }

    /// The process of a thread first seen under `comm` with no traced clone making it. A
    /// trace that names no process cannot tell two processes of one program (two
    /// `redis-benchmark`s, a browser's content processes) from two threads of one: each
    /// such thread is a process of its own, keyed by its tid, so that no fd, role or wait
    /// of one is taken for another's. By redis's names: the first thread under a server's
    /// comm is the reported redis (`ProcKey::Root`), a later one another server of its
    /// own; a helper (`bio_*`, `io_thd_*`) is the server's nearest below its tid (a
    /// process makes its threads after itself, with higher tids); a background child by
    /// its name is a process of its own.
    fn program_of(&mut self, tid: Tid, comm: &str) -> ProcKey {
        let key = match Role::from_name(comm) {
            Some(Role::Main) => {
                if !self.progs.servers.contains(&tid) {
                    self.progs.servers.push(tid);
                }
                self.server_proc(tid)
            }
            Some(Role::Child) => ProcKey::Pid(tid),
            Some(Role::Other) | None => ProcKey::Program(tid),
            Some(_) => {
                let server = self
                    .progs
                    .servers
                    .iter()
                    .copied()
                    .filter(|s| *s < tid)
                    .max();
                server.map_or(ProcKey::Root, |s| self.server_proc(s))
            }
        };
        // A program is listed by the threads that make a process of their own (a second
        // server's helpers are that server's).
        if key == ProcKey::Program(tid) {
            self.progs.first_tid.entry(comm.into()).or_insert(tid);
        }
        key
    }

    /// The process of the server thread `server` (`program_of`).
    fn server_proc(&self, server: Tid) -> ProcKey {
        if self.progs.servers.first() == Some(&server) {
            ProcKey::Root
        } else {
            ProcKey::Program(server)
        }
    }

    /// Some thread of the traced process (redis's, by name, in a trace of many programs)
    /// made a call: only then are the other programs' threads someone else's.
    fn traced_seen(&self) -> bool {
        self.threads
            .iter()
            .any(|t| !matches!(t.proc, ProcKey::Program(_)) && t.calls > 0)
    }

    /// The comm of `tid`'s program when it is another program than the traced redis in a
    /// trace of many (`set_program`): its waits are not redis's stalls.
    pub(crate) fn other_program(&self, tid: Tid) -> Option<&str> {
        let t = &self.threads[self.known(tid)?.get()];
        if !matches!(t.proc, ProcKey::Program(_)) || !self.traced_seen() {
            return None;
        }
        t.name.as_deref()
    }

    /// The other programs of a trace of many, by comm (once however many processes had
    /// it), ordered by the first tid seen under each (none when redis is not in it: then no
    /// program is told from the traced one).
    pub(crate) fn other_programs(&self) -> Vec<String> {
        if !self.traced_seen() {
            return vec![];
        }
        let mut v: Vec<(&u32, &Box<str>)> =
            self.progs.first_tid.iter().map(|(n, t)| (t, n)).collect();
        v.sort();
        v.into_iter().map(|(_, n)| n.to_string()).collect()
    }

    fn proc_key(&self, pid: Tid) -> ProcKey {
        if self.children.contains(&pid) {
            ProcKey::Pid(pid)
        } else {
            ProcKey::Root
        }
    }

    #[inline]
    pub(crate) fn known(&self, tid: Tid) -> Option<ThreadIdx> {
        let (lt, li) = self.last.get();
        if lt == tid && (li as usize) < self.threads.len() {
            return Some(ThreadIdx(li));
        }
        let i = *self.index.get(&tid)?;
        self.last.set((tid, i.0));
        Some(i)
    }

    /// The thread's index, its state created on first sight (in the traced process).
    #[inline(always)]
    pub(crate) fn touch(&mut self, tid: Tid) -> ThreadIdx {
        match self.known(tid) {
            Some(i) => i,
            None => self.first_sight(tid),
        }
    }

    /// `touch` of a thread not seen before: out of line, so that the per-event check stays
    /// inline in `observe`.
    #[inline(never)]
    fn first_sight(&mut self, tid: Tid) -> ThreadIdx {
        self.role_epoch += 1;
        let i = ThreadIdx(self.threads.len() as u32);
        let proc = match self.names.get(&tid).cloned() {
            Some(comm) if self.progs.by_comm.remove(&tid) => self.program_of(tid, &comm),
            _ => ProcKey::Root,
        };
        self.threads.push(ThreadRec {
            tid,
            proc,
            name: self.names.get(&tid).cloned(),
            ..Default::default()
        });
        self.index.insert(tid, i);
        self.last.set((tid, i.0));
        i
    }

    /// `Process N attached with K threads`: K threads were there to trace.
    pub(crate) fn announce(&mut self, threads: Option<u32>) {
        self.announced = self.announced.max(threads.unwrap_or(0));
    }

    /// Threads strace announced at attach that made no call in the trace (at least this
    /// many: a thread created later counts as one seen): each blocked in one call since
    /// before the trace began, or never scheduled.
    pub(crate) fn silent_threads(&self) -> u64 {
        let seen = self
            .threads
            .iter()
            .filter(|t| t.proc == ProcKey::Root && t.calls > 0)
            .count();
        u64::from(self.announced).saturating_sub(seen as u64)
    }

    /// strace's first "Process N attached" names the traced process.
    pub(crate) fn on_attach(&mut self, tid: Tid) -> Option<ThreadIdx> {
        if self.root_pid.is_none() && self.threads.is_empty() {
            self.root_pid = Some(tid);
        }
        self.known(tid)
    }

    /// The child process whose first thread this is, when that thread exits.
    pub(crate) fn exiting_child(&mut self, tid: Tid) -> Option<u32> {
        let t = self.touch(tid);
        (self.threads[t.get()].proc == ProcKey::Pid(tid)).then_some(tid)
    }

    /// Resolves one finished syscall: thread, process, file (applying its fd effects), role
    /// evidence, and the role on the evidence so far.
    #[inline]
    pub(crate) fn observe<'e>(&mut self, ev: &'e Event, sc: &'e Syscall) -> ResolvedCall<'e> {
        let facts = sc.sys.facts;
        let thread = self.touch(ev.tid);
        // The thread's record looked up once for the process, the counts and the cached
        // role (three indexings, three bounds checks, before).
        let t = &mut self.threads[thread.get()];
        let proc = t.proc;
        let resolved = self.fds.apply(proc, ev.tid, ev.ts, sc);
        let class = resolved.map(|r| r.class);
        // An open touches the fd it returns (its file is what `resolved` names).
        let call_fd = if facts.has(Facts::OPEN) {
            sc.ret.val().and_then(|v| i32::try_from(v).ok())
        } else {
            sc.fd
        };
        t.calls += 1;
        let sent = t.sent;
        // The counts only grow: a first epoll or poll wait is a change `count` reports.
        if t.evidence.count(facts, class) {
            self.role_epoch += 1;
            self.any_epoll |= t.evidence.epoll > 0;
            self.any_poll |= t.evidence.poll > 0;
        }
        let role = match t.role_cache.get() {
            Some((epoch, role)) if epoch == self.role_epoch => role,
            _ => self.role_at(thread),
        };
        // Nearly every call: no request just sent, no lock: one test.
        // (A send matters only on an outgoing connection: not a reply to a client.)
        let request = facts.has(Facts::SEND) && is_outgoing(class);
        let waits = if sent.is_none() && !request && !matches!(sc.extra, Extra::LockWait(_)) {
            Waits::AsNamed
        } else {
            self.note_waits(thread, role, class, sc)
        };
        let dur = sc.dur.unwrap_or(0);
        ResolvedCall {
            ev,
            sc,
            tid: ev.tid,
            thread,
            proc,
            facts,
            role,
            // A wait for a lock or for a reply is never a wait for work.
            idle: facts.is_idle_in(role) && waits == Waits::AsNamed,
            waits,
            file: resolved.map(|r| r.file),
            class,
            call_fd,
            dur,
            timed: sc.dur.is_some(),
            end: ev.ts + dur,
        }
    }

    /// What a call that may wait for a lock or a reply waits for (`waits_for`), and the fd
    /// its thread waits for a reply on after it (`sent_after`). Out of the common path.
    #[inline(never)]
    fn note_waits(
        &mut self,
        thread: ThreadIdx,
        role: Role,
        class: Option<FileClass>,
        sc: &Syscall,
    ) -> Waits {
        let t = &mut self.threads[thread.get()];
        let proc = t.proc;
        let waits = waits_for(t.sent, sc, role);
        t.sent = sent_after(waits, class, sc);
        if class == Some(FileClass::Outgoing) && sc.sys.puts {
            if let (Some(fd), Some(d)) = (sc.fd, sc.data()) {
                if replication_request(d.head().bytes()) {
                    self.fds.outgoing_is_replication(proc, fd);
                }
            }
        }
        waits
    }

    /// The process structure a clone or fork creates, applied once every unit has seen the
    /// call.
    pub(crate) fn after(&mut self, cx: &ResolvedCall<'_>) {
        // The extra first: nearly every call is no clone (no copy of the result for them).
        let Extra::Clone { thread } = &cx.sc.extra else {
            return;
        };
        let Ret::Val(child) = cx.sc.ret else {
            return;
        };
        if child <= 0 {
            return;
        }
        let child = child as u32;
        if *thread {
            let t = self.touch(child);
            self.threads[t.get()].proc = cx.proc;
            self.threads[t.get()].cloned = true;
        } else {
            self.fds.fork(cx.proc, ProcKey::Pid(child), cx.ts());
            self.children.insert(child);
            let t = self.touch(child);
            self.threads[t.get()].proc = ProcKey::Pid(child);
            self.threads[t.get()].cloned = true;
        }
        self.role_epoch += 1;
    }

    /// What `fd` of thread `tid` was at `ts` (`watch`'s per-syscall metrics).
    pub(crate) fn file_class_at(&self, tid: Tid, fd: i32, ts: Nanos) -> Option<FileClass> {
        let proc = self
            .known(tid)
            .map_or(ProcKey::Root, |t| self.threads[t.get()].proc);
        self.fds.lookup(proc, fd, ts).map(|r| r.class)
    }

    /// An answered PSYNC/SYNC turned a client connection into a replication link.
    pub(crate) fn became_replica(&mut self, conn: (ProcKey, i32)) {
        self.fds.reclassify(conn.0, conn.1, FileClass::Replica);
    }

    /// The thread received, sent or accepted on something other than a disk file
    /// (`RoleEvidence::serves`).
    pub(crate) fn serves(&self, tid: Tid) -> bool {
        self.known(tid)
            .is_some_and(|t| self.threads[t.get()].evidence.serves)
    }

    /// The role a thread has on current evidence (final at `finish`).
    pub(crate) fn role(&self, tid: Tid) -> Role {
        match self.known(tid) {
            Some(t) => self.role_at(t),
            None => Role::Other,
        }
    }

    #[inline]
    fn role_at(&self, i: ThreadIdx) -> Role {
        let t = &self.threads[i.get()];
        if let Some((epoch, role)) = t.role_cache.get() {
            if epoch == self.role_epoch {
                return role;
            }
        }
        let role = self.role_and_why(t).0;
        t.role_cache.set(Some((self.role_epoch, role)));
        role
    }

    fn role_and_why(&self, t: &ThreadRec) -> (Role, Why) {
        // A second server's threads (`program_of`) have its roles, not the reported redis's.
        if matches!(t.proc, ProcKey::Program(_))
            && t.name
                .as_deref()
                .and_then(Role::from_name)
                .is_some_and(|r| r != Role::Other)
        {
            return (Role::Other, Why::Rule("a thread of another server process"));
        }
        // The first-thread rule needs a scan of every thread: only asked for when the pid is
        // unknown and no thread runs the event loop.
        // The only thread seen is not main for that alone (a filtered or cut trace of any
        // program has one) once the whole trace is read; while it is, a trace's first
        // thread is the best guess for the calls it makes before its first wait.
        let first_without_loop = self.root_pid.is_none()
            && t.evidence.epoll == 0
            && self.no_event_loop()
            && t.tid == self.root_display()
            && (!self.finished
                || self
                    .threads
                    .iter()
                    .filter(|o| o.proc == t.proc)
                    .nth(1)
                    .is_some());
        let other_main = t.evidence.epoll > 0
            && self.threads.iter().any(|o| {
                o.tid != t.tid
                    && o.proc == t.proc
                    && ((self.root_pid == Some(o.tid) && o.evidence.epoll > 0)
                        || o.name.as_deref().and_then(Role::from_name) == Some(Role::Main)
                        || (o.evidence.epoll > 0 && o.tid < t.tid))
            });
        // redis's event loop is epoll on Linux: a poll() loop beside a thread (any program's
        // worker waiting on a pipe) does not make that thread a redis background thread.
        let loop_beside = self
            .threads
            .iter()
            .any(|o| o.tid != t.tid && o.proc == t.proc && o.evidence.epoll > 0);
        decide(
            &t.evidence,
            Situation {
                name: t.name.as_deref(),
                is_child: matches!(t.proc, ProcKey::Pid(_)),
                is_root_tid: self.root_pid == Some(t.tid),
                first_without_loop,
                other_main,
                loop_beside,
            },
        )
    }

    fn role_why(&self, t: &ThreadRec) -> String {
        if let Some(p) = self.other_program(t.tid) {
            // A second server on the machine: the report is of the first one seen.
            if let (ProcKey::Program(server), false) =
                (t.proc, Role::from_name(p) == Some(Role::Other))
            {
                return format!(
                    "a thread ({p:?}) of another server process (its thread {server}), not the \
                     redis reported"
                );
            }
            return format!("a thread of another program ({p:?}), not redis's");
        }
        match self.role_and_why(t) {
            (_, Why::Name) => format!("thread name {:?}", t.name.as_deref().unwrap_or("")),
            (_, Why::Rule(why)) => why.into(),
        }
    }

    /// The pid shown for the traced process.
    fn root_display(&self) -> u32 {
        if let Some(pid) = self.root_pid {
            return pid;
        }
        self.threads
            .iter()
            .filter(|t| t.proc == ProcKey::Root)
            .map(|t| t.tid)
            .min()
            .unwrap_or(0)
    }

    /// The pid the report shows for a process key.
    pub(crate) fn show_pid(&self, proc: ProcKey) -> u32 {
        match proc {
            ProcKey::Root => self.root_display(),
            ProcKey::Pid(pid) | ProcKey::Program(pid) => pid,
        }
    }

    /// The traced process's pid, when known.
    pub(crate) fn root_pid(&self) -> Option<u32> {
        self.root_pid
    }

    /// No thread has waited in an event loop (so far): no epoll wait, and no select/poll.
    pub(crate) fn no_event_loop(&self) -> bool {
        !self.any_epoll && !self.any_poll
    }

    /// A SIGCHLD from `pid`: a child process. If its calls are in the trace but no fork,
    /// vfork or clone in it made `pid` (`after`), `strace -f -e trace=...` followed the
    /// child yet left out the calls that create processes (`-e trace=%desc` does), and the
    /// child's calls were taken for the traced process's own.
    ///
    /// From here on (and in the report, whose roles are decided at the end) the thread is
    /// that child's, not a thread of the traced process: its fds stay where its calls put
    /// them (the traced process's table), which the verdict says.
    pub(crate) fn on_sigchld(&mut self, pid: u32) {
        if self.root_pid == Some(pid) || self.children.contains(&pid) {
            return;
        }
        let Some(&i) = self.index.get(&pid) else {
            return;
        };
        if self.untraced_children.insert(pid) {
            self.threads[i.get()].proc = ProcKey::Pid(pid);
            self.role_epoch += 1;
        }
    }

    /// The pid to show for a record of thread `tid` made in process `proc`: a child process
    /// found only by its SIGCHLD (`on_sigchld`) had its calls recorded as the traced
    /// process's, and its one thread's tid is its pid.
    pub(crate) fn pid_of(&self, proc: ProcKey, tid: Tid) -> u32 {
        if self.untraced_children.contains(&tid) {
            tid
        } else {
            self.show_pid(proc)
        }
    }

    /// Child processes seen without a traced call creating them (`on_sigchld`).
    pub(crate) fn untraced_children(&self) -> u64 {
        self.untraced_children.len() as u64
    }

    /// Uses of an fd by the thread that had closed it with no creating call in between, and
    /// rereads of /proc/PID/stat through one open: signs of untraced opens.
    pub(crate) fn untraced_opens(&self) -> (u64, u64) {
        (self.fds.untraced_opens(), self.fds.untraced_rereads())
    }

    /// The whole trace is read: roles from here on are final.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
        self.role_epoch += 1;
    }

    /// select/poll is this process's event loop: it waits there and never in epoll.
    pub(crate) fn loop_is_poll(&self, proc: ProcKey) -> bool {
        let mine = || self.threads.iter().filter(|t| t.proc == proc);
        mine().all(|t| t.evidence.epoll == 0) && mine().any(|t| t.evidence.poll > 0)
    }

    /// Some thread of this process is an I/O thread (by name or behaviour).
    pub(crate) fn has_io_threads(&self, proc: ProcKey) -> bool {
        (0..self.threads.len() as u32).any(|i| {
            self.threads[i as usize].proc == proc && self.role_at(ThreadIdx(i)) == Role::IoThread
        })
    }

    pub(crate) fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Whether the trace shows more than one thread of this process (it followed them:
    /// `strace -f`, or live).
    pub(crate) fn threads_followed(&self, proc: ProcKey) -> bool {
        self.threads
            .iter()
            .filter(|t| t.proc == proc)
            .nth(1)
            .is_some()
    }

    pub(crate) fn process_count(&self) -> usize {
        self.threads
            .iter()
            .map(|t| t.proc)
            .collect::<HashSet<_>>()
            .len()
    }

    pub(crate) fn file(&self, id: FileId) -> &FileInfo {
        self.fds.file(id)
    }

    /// The file that stands for `id` in the report's rows (`FdTable::canonical`).
    pub(crate) fn canonical_file(&self, id: FileId) -> FileId {
        self.fds.canonical(id)
    }

    /// Some file of the trace is an AOF.
    pub(crate) fn aof_seen(&self) -> bool {
        self.fds.files().iter().any(|f| f.class == FileClass::Aof)
    }

    pub(crate) fn conf(&self) -> &Option<RedisConf> {
        &self.fds.conf
    }

    /// Every thread by tid, with its final role and why.
    pub(crate) fn threads_report(&self) -> Vec<report::ThreadInfo> {
        let mut v: Vec<&ThreadRec> = self.threads.iter().collect();
        v.sort_by_key(|t| t.tid);
        v.into_iter()
            .map(|t| report::ThreadInfo {
                pid: self.show_pid(t.proc),
                tid: t.tid,
                role: self.role(t.tid),
                name: t.name.clone(),
                why: self.role_why(t),
                syscalls: t.calls,
            })
            .collect()
    }

    /// Final roles of every thread seen, for the report builders.
    pub(crate) fn roles(&self) -> impl Iterator<Item = (ThreadIdx, Role)> + '_ {
        (0..self.threads.len() as u32).map(|i| (ThreadIdx(i), self.role_at(ThreadIdx(i))))
    }
}

/// What a call waits for, given the fd its thread had just sent a request on. redis's I/O
/// threads park on a mutex the main thread holds while there is no work (redis 6/7's
/// io_threads_mutex, valkey's the same way): their lock wait is a wait for work.
fn waits_for(sent: Option<i32>, sc: &Syscall, role: Role) -> Waits {
    if matches!(sc.extra, Extra::LockWait(_)) {
        return if role == Role::IoThread {
            Waits::AsNamed
        } else {
            Waits::Lock
        };
    }
    match sent {
        Some(fd)
            if sc.sys.facts.has(Facts::POLL)
                || (sc.fd == Some(fd) && sc.sys.facts.has(Facts::RECV)) =>
        {
            Waits::Reply(fd)
        }
        _ => Waits::AsNamed,
    }
}

/// A connection the process made (`FileClass::Outgoing`), or one found to be the
/// replication link.
fn is_outgoing(class: Option<FileClass>) -> bool {
    matches!(class, Some(FileClass::Outgoing | FileClass::Replica))
}

/// The first bytes sent are a replication handshake's (`PSYNC`, `SYNC`, `REPLCONF`), as a
/// RESP array or inline.
fn replication_request(b: &[u8]) -> bool {
    let name = match b.strip_prefix(b"*") {
        Some(r) => {
            // `*3\r\n$5\r\nPSYNC\r\n...`: past the count and the first length.
            let Some(i) = r.windows(3).position(|w| w == b"\r\n$") else {
                return false;
            };
            let r = &r[i + 3..];
            let Some(j) = r.windows(2).position(|w| w == b"\r\n") else {
                return false;
            };
            &r[j + 2..]
        }
        None => b,
    };
    let n = name.iter().take_while(|c| c.is_ascii_alphabetic()).count();
    let word = name[..n].to_ascii_uppercase();
    matches!(&word[..], b"PSYNC" | b"SYNC" | b"REPLCONF")
}

/// The fd a thread waits for a reply on after this call: a request sent on an outgoing
/// connection (its class from the connect), kept through a poll/select for the reply.
fn sent_after(waits: Waits, class: Option<FileClass>, sc: &Syscall) -> Option<i32> {
    let sent_now = sc.sys.facts.has(Facts::SEND)
        && sc.sys.puts
        && is_outgoing(class)
        && sc.ret.val().is_some_and(|n| n > 0);
    match waits {
        _ if sent_now => sc.fd,
        Waits::Reply(fd) if sc.sys.facts.has(Facts::POLL) => Some(fd),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::event;
    use crate::event::{EventKind, Nanos, Syscall};

    fn clone_ev(tid: Tid, ts: Nanos, child: i64, thread: bool) -> Event {
        let mut sc = Syscall::new("clone");
        sc.ret = Ret::Val(child);
        sc.dur = Some(1000);
        sc.extra = Extra::Clone { thread };
        Event {
            tid,
            ts,
            line: 1,
            kind: EventKind::Syscall(sc),
        }
    }

    #[test]
    fn thread_indices_are_dense_and_stable() {
        let mut w = World::new(Some(100), HashMap::default(), None);
        let a = w.touch(100);
        let b = w.touch(101);
        assert_eq!((a, b), (ThreadIdx(0), ThreadIdx(1)));
        assert_eq!(w.touch(100), a);
        assert_eq!(w.known(101), Some(b));
        assert_eq!(w.known(102), None);
    }

    #[test]
    fn attach_names_the_traced_process() {
        let mut w = World::new(None, HashMap::default(), None);
        assert_eq!(w.root_pid(), None);
        w.on_attach(4242);
        assert_eq!(w.root_pid(), Some(4242));
        let t = w.touch(4242);
        assert_eq!(w.role_at(t), Role::Main, "tid == pid");
    }

    #[test]
    fn the_traced_process_is_shown_by_its_lowest_tid_until_its_pid_is_known() {
        let mut w = World::new(None, HashMap::default(), None);
        for tid in [9, 7] {
            let e = event(tid, 0, 10, "futex");
            assert_eq!(w.observe(&e, e.syscall().unwrap()).proc, ProcKey::Root);
        }
        assert_eq!((w.root_pid(), w.show_pid(ProcKey::Root)), (None, 7));
        let ev = clone_ev(7, 1000, 200, false);
        let cx = w.observe(&ev, ev.syscall().unwrap());
        w.after(&cx);
        let e = event(200, 2000, 10, "write");
        let child = w.observe(&e, e.syscall().unwrap()).proc;
        assert_eq!((child, w.show_pid(child)), (ProcKey::Pid(200), 200));
        assert_eq!(w.process_count(), 2);
    }

    #[test]
    fn fork_makes_a_child_process_and_clone_a_thread() {
        let mut w = World::new(Some(100), HashMap::default(), None);
        for (child, thread) in [(200, false), (101, true)] {
            let ev = clone_ev(100, 1000, child, thread);
            let cx = w.observe(&ev, ev.syscall().unwrap());
            w.after(&cx);
        }
        assert_eq!(w.role(200), Role::Child);
        assert_ne!(w.role(101), Role::Child);
        assert_eq!(w.process_count(), 2);
        assert_eq!(w.exiting_child(200), Some(200));
        assert_eq!(w.exiting_child(101), None);
    }

    /// A SIGCHLD names a child process. One whose calls are in the trace but whose fork is
    /// not (`-e trace=%desc`) is counted, once, and becomes a child process; a child the
    /// trace saw forked, the traced process itself and a pid with no calls are not.
    #[test]
    fn a_sigchld_finds_a_child_whose_fork_was_not_traced() {
        let mut w = World::new(Some(100), HashMap::default(), None);
        let fork = clone_ev(100, 1000, 200, false);
        let cx = w.observe(&fork, fork.syscall().unwrap());
        w.after(&cx);
        for (tid, ts) in [(100, 1500), (200, 2000), (300, 3000)] {
            let e = event(tid, ts, 10, "close");
            w.observe(&e, e.syscall().unwrap());
        }
        assert_ne!(w.role(300), Role::Child);
        for pid in [200, 100, 999, 300, 300] {
            w.on_sigchld(pid);
        }
        assert_eq!(w.untraced_children(), 1);
        assert_eq!(w.role(300), Role::Child);
        assert_eq!(w.process_count(), 3);
        assert_eq!(
            (w.pid_of(ProcKey::Root, 300), w.pid_of(ProcKey::Root, 100)),
            (300, 100)
        );
    }

    #[test]
    fn the_event_loop_decides_main_and_the_cache_follows_new_evidence() {
        let mut w = World::new(None, HashMap::default(), None);
        let e = event(7, 0, 10, "futex");
        let cx = w.observe(&e, e.syscall().unwrap());
        // No event loop anywhere: the first thread is main while the trace is read...
        assert_eq!(cx.role, Role::Main);
        let mut alone = World::new(None, HashMap::default(), None);
        alone.observe(&e, e.syscall().unwrap());
        alone.finish();
        // ...but once it is read, not for being the only thread seen.
        assert_eq!(alone.role(7), Role::Other);
        let e9 = event(9, 5, 10, "futex");
        alone.observe(&e9, e9.syscall().unwrap());
        // Two threads, no event loop: the first is main.
        assert_eq!(alone.role(7), Role::Main);
        let e = event(8, 10, 10, "epoll_wait");
        assert_eq!(w.observe(&e, e.syscall().unwrap()).role, Role::Main);
        assert_eq!(w.role(7), Role::Other, "8 runs the loop now");
        assert!(!w.no_event_loop());
    }

    /// Every trace under fixtures/ (ours, the variants, the peer traces, the wild shapes).
    fn fixture_traces() -> Vec<std::path::PathBuf> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                if p.is_dir() {
                    walk(&p, out);
                } else if name.ends_with(".strace")
                    || name.ends_with(".strace.gz")
                    || name.ends_with(".perf.txt")
                    || name.ends_with(".perf.txt.gz")
                    || (p.to_string_lossy().contains("peer")
                        && name.ends_with(".txt")
                        && !name.starts_with("SOURCES")
                        && !name.starts_with("README"))
                {
                    out.push(p);
                }
            }
        }
        let mut out = vec![];
        walk(std::path::Path::new("fixtures"), &mut out);
        out.sort();
        out
    }

    /// One fd lifetime: its process, fd, start, and how many calls made that fd before (a
    /// trace without timestamps starts every binding at 0).
    type Lifetime = (ProcKey, i32, Nanos, u32);

    /// Lifetimes of one trace through the world (its processes as the analysis groups them:
    /// clones, forks, the programs of a whole-machine perf trace), each a binding of an fd
    /// from the call that made it, or the trace's first use of it, to its close: per
    /// lifetime, the classes of the rows its calls count in and whether a call showed it
    /// is a socket. None for a trace with a line that could not be read (it may have been
    /// the clone or the open a lifetime starts with).
    fn lifetimes(path: &std::path::Path) -> Option<Vec<(Vec<FileClass>, bool)>> {
        use crate::source::{InputFormat, Inputs};
        use crate::syscalls::{fd_effect, FdEffect, NewFd};
        let Ok(mut input) = Inputs::open(
            &[path.to_string_lossy().into_owned()],
            InputFormat::Auto,
            false,
        ) else {
            return Some(vec![]);
        };
        let mut w = World::new(None, HashMap::default(), None);
        let mut made: HashMap<(ProcKey, i32), u32> = HashMap::default();
        let mut all: HashMap<Lifetime, (Vec<FileId>, bool)> = HashMap::default();
        let lifetime = |w: &World, made: &HashMap<(ProcKey, i32), u32>, proc, fd| {
            let n = made.get(&(proc, fd)).copied().unwrap_or(0);
            w.fds.live_since(proc, fd).map(|s| (proc, fd, s, n))
        };
        while let Ok(Some(ev)) = input.next_event() {
            let sc = match &ev.kind {
                EventKind::Syscall(sc) => sc,
                EventKind::Unreadable => return None,
                EventKind::Program(comm) => {
                    w.set_program(ev.tid, comm);
                    continue;
                }
                EventKind::ThreadName(name) => {
                    w.touch(ev.tid);
                    w.set_name(ev.tid, name);
                    continue;
                }
                _ => continue,
            };
            let t = w.touch(ev.tid);
            let proc = w.threads[t.get()].proc;
            let effect = fd_effect(sc);
            for fd in match effect {
                FdEffect::Open { fd, .. } | FdEffect::New { fd, .. } => vec![fd],
                FdEffect::Dup { dst, .. } => vec![dst],
                FdEffect::Pair { a, b, .. } => vec![a, b],
                _ => vec![],
            } {
                *made.entry((proc, fd)).or_default() += 1;
            }
            let before = sc.fd.and_then(|fd| lifetime(&w, &made, proc, fd));
            let cx = w.observe(&ev, sc);
            let file = cx.file;
            w.after(&cx);
            let shows_socket =
                matches!(sc.sys.name, "sendto" | "recvfrom" | "connect") && !sc.ret.is_err();
            if let (Some(fd), Some(file)) = (sc.fd, file) {
                if !sc.sys.facts.has(Facts::OPEN) {
                    if let Some(k) = lifetime(&w, &made, proc, fd).or(before) {
                        let l = all.entry(k).or_default();
                        l.0.push(file);
                        l.1 |= shows_socket;
                    }
                }
            }
            if let FdEffect::New { fd, kind, .. } = effect {
                if let Some(k) = lifetime(&w, &made, proc, fd) {
                    all.entry(k).or_default().1 |= matches!(kind, NewFd::Socket | NewFd::Accepted);
                }
            }
        }
        let all = all
            .into_values()
            .map(|(files, sock)| {
                let mut c: Vec<FileClass> = files
                    .iter()
                    .map(|f| w.file(w.canonical_file(*f)).class)
                    .collect();
                c.sort_unstable();
                c.dedup();
                (c, sock)
            })
            .collect();
        Some(all)
    }

    /// Issue 39, over every trace in fixtures/ (whole-machine perf traces too, their
    /// programs' threads grouped as the analysis groups them): the calls of one fd lifetime
    /// (from the call that made the fd, or the trace's first use of it, to its close) all
    /// have one class, and a lifetime a call showed to be a socket is never a file on disk.
    #[test]
    fn every_fixture_fd_lifetime_has_one_class_and_no_socket_is_a_disk_file() {
        let traces = fixture_traces();
        assert!(traces.len() > 40, "{} traces", traces.len());
        let mut checked = 0;
        for p in traces {
            let Some(lifetimes) = lifetimes(&p) else {
                continue;
            };
            checked += 1;
            for (classes, sock) in lifetimes {
                assert!(
                    classes.len() <= 1,
                    "{}: a lifetime of classes {classes:?}",
                    p.display()
                );
                assert!(
                    !(sock
                        && classes
                            .iter()
                            .any(|c| c.is_disk_file() && *c != FileClass::Other)),
                    "{}: a socket's lifetime is {classes:?}",
                    p.display()
                );
            }
        }
        assert!(checked > 30, "{checked} traces checked");
    }
}
