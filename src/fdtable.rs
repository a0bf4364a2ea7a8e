//! The fd table: second stage of the pipeline. It follows every call that creates, copies
//! or closes a file descriptor (open/openat/creat/socket/accept/pipe/dup*/fcntl(F_DUPFD)/
//! close/close_range), per process (threads share a table, fork copies it), so that each
//! event can be resolved to "what was fd 7 *at this moment*": redis reuses fd numbers within
//! milliseconds (the log file is opened and closed per line). Bindings are versioned by time
//! (a closed binding stays findable for lookups at earlier times); strace `-y` annotations
//! are ground truth and win; content sniffing (RESP in a regular file = AOF, redis log lines =
//! log file, `REDIS` magic = RDB) classifies what no path names.
//!
//! Memory stays bounded: per (process, fd) only the live binding and a few closed ones are
//! kept, and files are interned in a registry keyed by (process, fd, path) with client
//! connections folded into one entry per fd.

use crate::event::{Nanos, Ret, Syscall, Tid};
use crate::syscalls::{fd_effect, Facts, FdEffect, FdKind, FdUse, NewFd};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::Arc;

pub use crate::report::FileClass;

use crate::redis_conf::basename;
pub use crate::redis_conf::RedisConf;

/// Classifies a path or a strace `-y` annotation.
pub fn classify_path(path: &str, conf: Option<&RedisConf>) -> FileClass {
    let p = path.strip_suffix(" (deleted)").unwrap_or(path);
    if let Some(c) = conf {
        if c.names(p, &c.logfile) {
            return FileClass::Log;
        }
        if c.names(p, &c.dbfilename) {
            return FileClass::Rdb;
        }
    }
    // -y/-yy socket and special-file annotations.
    if p.starts_with("TCP")
        || p.starts_with("UDP")
        || p.starts_with("UNIX")
        || p.starts_with("socket:")
    {
        if p.contains("->") {
            return FileClass::Client;
        }
        // A unix socket shows its bound path (`UNIX-STREAM:[475231,"/run/redis.sock"]`) only
        // when it has one: redis's `unixsocket` listener.
        if p.starts_with("UNIX") && p.contains(",\"") {
            return FileClass::Listener;
        }
        if p.starts_with("socket:") || p.starts_with("UNIX") {
            return FileClass::Unknown;
        }
        return FileClass::Listener;
    }
    if p.starts_with("pipe:") {
        return FileClass::Pipe;
    }
    if p.starts_with("anon_inode:") {
        return if p.contains("eventpoll") {
            FileClass::Epoll
        } else {
            FileClass::AnonInode
        };
    }
    if p.starts_with("/proc/") || p.starts_with("/sys/") {
        return FileClass::Proc;
    }
    let base = basename(p);
    if base.starts_with("temp-rewriteaof") {
        return FileClass::AofRewriteTemp;
    }
    if base.ends_with(".manifest") {
        return FileClass::AofManifest;
    }
    if base.starts_with("temp-") && base.ends_with(".rdb") {
        return FileClass::RdbTemp;
    }
    if let Some(c) = conf {
        if let Some(a) = &c.appendfilename {
            if base.starts_with(a.as_str()) {
                return FileClass::Aof;
            }
        }
    }
    // Redis 7 multi-part AOF: NAME.N.incr.aof, NAME.N.base.rdb|aof.
    if base.ends_with(".aof")
        || base.contains(".incr.aof")
        || base.contains(".base.")
        || base.starts_with("appendonly")
    {
        return FileClass::Aof;
    }
    if base.ends_with(".rdb") {
        return FileClass::Rdb;
    }
    if base.ends_with(".log") || p.starts_with("/var/log/") {
        return FileClass::Log;
    }
    if p.starts_with("/dev/") {
        return FileClass::Other;
    }
    if let Some(c) = conf {
        if c.dir.as_deref() == Some(p) || c.appenddirname.as_deref().is_some_and(|d| base == d) {
            return FileClass::Dir;
        }
    }
    // A path component with no extension that redis fsyncs is its working directory or
    // appendonlydir; redis opens no extensionless regular files of its own.
    if p.starts_with('/') && !base.contains('.') || base == "appendonlydir" {
        return FileClass::Dir;
    }
    FileClass::Other
}

/// Classifies by content when no path names the file: the first bytes written or read.
pub fn sniff(data: &[u8], is_write: bool) -> Option<FileClass> {
    if data.starts_with(b"REDIS0") {
        return Some(FileClass::Rdb);
    }
    if data.len() >= 4 && data[0] == b'*' && data[1].is_ascii_digit() {
        // RESP arrays: read from a socket they are requests; written to a file, the AOF.
        return Some(if is_write {
            FileClass::Aof
        } else {
            FileClass::Client
        });
    }
    if is_log_line(data) {
        return Some(FileClass::Log);
    }
    None
}

/// `6005 (redis-server) R 1 6005 ...`: the start of a /proc/PID/stat, pid, command in
/// parentheses (which may hold anything, so up to its last `) `), state letter.
fn is_proc_stat(d: &[u8]) -> bool {
    let n = d.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 || d.get(n..n + 2) != Some(b" (") {
        return false;
    }
    let Some(close) = d
        .windows(2)
        .rposition(|w| w == b") ")
        .filter(|c| *c > n + 1)
    else {
        return false;
    };
    matches!(d.get(close + 2..close + 4), Some([st, b' ']) if st.is_ascii_alphabetic())
}

/// `8169:M 30 Nov 2026 22:38:11.272 * ...`: the redis log-line format.
fn is_log_line(d: &[u8]) -> bool {
    let n = d.iter().take_while(|b| b.is_ascii_digit()).count();
    n > 0
        && d.len() > n + 3
        && d[n] == b':'
        && matches!(d[n + 1], b'M' | b'C' | b'S' | b'X')
        && d[n + 2] == b' '
}

/// Interned identity of a file as the report shows it.
pub type FileId = u32;

/// The process an fd belongs to: the traced process, whatever its pid turns out to be (a
/// trace may name it only at its first "Process N attached", or never), or a child it forked
/// in the trace. Threads share their process's table.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum ProcKey {
    #[default]
    Root,
    /// A child forked in the trace, by its pid.
    Pid(u32),
    /// Another program's threads in a trace of many (`perf trace -a`), by the first tid
    /// seen under its comm: a process of its own, never the traced one nor its child.
    Program(u32),
}

/// One word per key, as a `u32` pid was: the fd table and the connection maps hash it on
/// every event (the derived hash writes the discriminant and the pid apart).
impl std::hash::Hash for ProcKey {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(self.word());
    }
}

impl ProcKey {
    /// One word per key, distinct for every key (as `hash` writes it).
    #[inline]
    fn word(self) -> u64 {
        match self {
            ProcKey::Root => u64::MAX,
            ProcKey::Pid(p) => u64::from(p),
            ProcKey::Program(p) => (1 << 32) | u64::from(p),
        }
    }

    pub fn is_root(self) -> bool {
        self == ProcKey::Root
    }

    /// The pid of a forked child (the traced process's pid is the world's to tell).
    pub fn child_pid(self) -> Option<u32> {
        match self {
            ProcKey::Root | ProcKey::Program(_) => None,
            ProcKey::Pid(p) => Some(p),
        }
    }
}

#[derive(Clone, Debug)]
pub struct FileInfo {
    pub proc: ProcKey,
    pub fd: i32,
    pub path: Option<Arc<str>>,
    pub class: FileClass,
    /// One connection's own record (`name_peer`): the report never folds it into another
    /// of the same identity (a reconnect to the same peer is a row of its own).
    pub own: bool,
}

#[derive(Clone, Debug)]
struct Binding {
    file: FileId,
    /// The thread whose close ended the binding (or that bound the fd anew over it).
    closed_by: Tid,
    /// A read through it returned the start of a /proc/PID/stat (`note_stat_read`).
    stat_read: bool,
    opened: Nanos,
    closed: Option<Nanos>,
    /// What the fd is known to be, whatever its class says yet (`Origin`).
    origin: Origin,
}

/// What is known of the kind of object behind one fd lifetime: a socket (made by socket,
/// accept or socketpair, named so by `-y`, or used by a call only a socket answers) or a
/// regular file (opened by path, or fsynced, seeked or truncated with success). Content
/// classes the lifetime only on such evidence: RESP written to a socket is a connection
/// (a replica's stream, a client's request), never the AOF; RESP written to an fd of unknown
/// origin is not the AOF on that alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Origin {
    #[default]
    Unknown,
    Socket,
    File,
}

/// Calls that succeed only on a socket (a file or a pipe answers ENOTSOCK).
fn socket_only(name: &str) -> bool {
    matches!(
        name,
        "sendto"
            | "recvfrom"
            | "sendmsg"
            | "recvmsg"
            | "sendmmsg"
            | "recvmmsg"
            | "shutdown"
            | "setsockopt"
            | "getsockopt"
            | "getpeername"
            | "getsockname"
            | "bind"
            | "listen"
            | "connect"
            | "accept"
            | "accept4"
    )
}

/// A `-y`/`-yy` annotation of a socket (`socket:[N]`, `TCP:[...]`, `UNIX-STREAM:[...]`).
fn socket_path(p: &str) -> bool {
    ["TCP", "UDP", "UNIX", "socket:", "NETLINK", "RAW"]
        .iter()
        .any(|k| p.starts_with(k))
}

/// The origin a binding starts with, from its class and path.
fn origin_of(path: Option<&str>, class: FileClass) -> Origin {
    match (path, class) {
        (_, FileClass::Client | FileClass::Listener | FileClass::Replica | FileClass::Outgoing) => {
            Origin::Socket
        }
        (Some(p), _) if socket_path(p) => Origin::Socket,
        (_, c) if c.is_disk_file() && c != FileClass::Other => Origin::File,
        (Some(p), FileClass::Other) if p.starts_with('/') && !p.starts_with("/dev/") => {
            Origin::File
        }
        _ => Origin::Unknown,
    }
}

#[derive(Default, Clone)]
struct ProcFds {
    live: HashMap<i32, Binding>,
    /// Recently closed bindings per fd, newest last (bounded).
    past: HashMap<i32, VecDeque<Binding>>,
    /// Fds of files no path names that were written to (a few): one fsynced next is the AOF.
    written: Vec<i32>,
    /// Forked in the trace: a child's written and fsynced file is its save, not the AOF.
    forked: bool,
}

/// Most unnamed written fds remembered per process.
const WRITTEN_KEEP: usize = 8;

const PAST_KEEP: usize = 4;

/// Most records of their own given to lifetimes of unnamed fds of no known class (so that a
/// class learned later is the whole lifetime's, `bind`); past this they share one per fd.
const OWN_RECORDS_MAX: usize = 1 << 16;

/// The whole table: per process (an internal process key: the tgid when known).
pub struct FdTable {
    procs: HashMap<ProcKey, ProcFds>,
    files: Vec<FileInfo>,
    /// Per file, how many bindings ever pointed at it: a file of one binding is one fd's
    /// lifetime, which a class learned later may be given back to.
    bindings: Vec<u32>,
    index: HashMap<FileKey, FileId>,
    pub conf: Option<RedisConf>,
    /// Live bindings found recently, direct-mapped by fd: redis's main thread touches a
    /// handful of fds per request, and two hash lookups per event showed in profiles. An
    /// entry holds only while `generation` is unchanged (every change to a binding bumps it).
    /// `RECENT` entries (8 KB): with 16, the ~50 client fds a benchmark's connections hold
    /// shared slots, and each request missed (`lookup_slow` in the live profiles: bench/PROFILE.md,
    /// seventh round).
    recent: [std::cell::Cell<Recent>; RECENT],
    generation: u32,
    /// Classes learned from what was done with a path, which win over its name the next
    /// time it is opened (redis reopens its log file for every line).
    learned: HashMap<Arc<str>, FileClass>,
    /// Successful calls of a thread on an fd that the same thread had closed, with no call
    /// creating it in between: the calls that create fds (accept, socket, open...) were not
    /// traced (`strace -e trace=%desc`), so the trace is missing calls.
    untraced_opens: u64,
    /// Reads that returned the start of a /proc/PID/stat again through a binding that had
    /// already returned it, with no open between: redis reopens /proc/self/stat for every
    /// memory sample (serverCron), so its opens and closes were not traced.
    untraced_rereads: u64,
}

/// `Binding::closed_by` of a binding no thread closed (a new one took its fd number).
const NO_THREAD: Tid = Tid::MAX;

/// Entries of the recent-fd cache: every fd below this has its own.
const RECENT: usize = 256;

#[derive(Clone, Copy, Default)]
struct Recent {
    /// `recent_key(generation, fd)`: the generation and the fd in one compare.
    key: u64,
    /// `ProcKey::word` of the process.
    proc: u64,
    file: FileId,
    /// The file's class and whether a path names it, as `resolved` gives them: a hit
    /// answers without reading the file's record (a class changes only with a new
    /// generation, which empties the cache).
    class: FileClass,
    named: bool,
    opened: Nanos,
}

/// The generation (never 0, so that an empty entry never matches) and the fd in one word.
#[inline]
fn recent_key(generation: u32, fd: i32) -> u64 {
    (u64::from(generation) << 32) | u64::from(fd as u32)
}

/// (process, fd, path, class): what makes two bindings the same file in the report.
type FileKey = (ProcKey, i32, Option<Arc<str>>, FileClass);

/// What an fd was at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub file: FileId,
    pub class: FileClass,
    /// A path names the file (`-y`, an open, /proc): the checks of every call on an
    /// unnamed one (content sniffing, the AOF by behaviour) read this, not the record.
    pub named: bool,
}

impl FdTable {
    pub fn new(conf: Option<RedisConf>) -> Self {
        FdTable {
            procs: HashMap::default(),
            files: vec![],
            bindings: vec![],
            index: HashMap::default(),
            conf,
            recent: std::array::from_fn(|_| Default::default()),
            // Above the entries' default, so that an empty entry never matches.
            generation: 1,
            learned: HashMap::default(),
            untraced_opens: 0,
            untraced_rereads: 0,
        }
    }

    pub fn files(&self) -> &[FileInfo] {
        &self.files
    }

    pub fn file(&self, id: FileId) -> &FileInfo {
        &self.files[id as usize]
    }

    fn intern(&mut self, proc: ProcKey, fd: i32, path: Option<&str>, class: FileClass) -> FileId {
        // All connections that ever used an fd number are one row: per-connection rows
        // would grow without bound under connection churn.
        let key_path: Option<Arc<str>> = match class {
            FileClass::Client => None,
            _ => path.map(Arc::from),
        };
        let key = (proc, fd, key_path.clone(), class);
        if let Some(id) = self.index.get(&key) {
            return *id;
        }
        let id = self.files.len() as FileId;
        let shown = match class {
            FileClass::Client => Some(Arc::from(client_label(path))),
            _ => key_path,
        };
        self.files.push(FileInfo {
            proc,
            fd,
            path: shown,
            class,
            own: false,
        });
        self.bindings.push(0);
        self.index.insert(key, id);
        id
    }

    /// The record a new binding counts on. An unnamed fd of no known class (a socket before
    /// its connect, an fd from before the trace) may learn its class later, and the class is
    /// then its whole lifetime's (`reclassify_binding`): such a lifetime gets a record of its
    /// own when the shared one already served another (bounded by `OWN_RECORDS_MAX`); the
    /// report folds records of equal identity into one row (`canonical`).
    fn record_for(
        &mut self,
        proc: ProcKey,
        fd: i32,
        path: Option<&str>,
        class: FileClass,
    ) -> FileId {
        let open_class = matches!(class, FileClass::Unknown | FileClass::Other);
        if path.is_none() && open_class && self.files.len() < OWN_RECORDS_MAX {
            let shared = self.index.get(&(proc, fd, None, class)).copied();
            if shared.is_some_and(|id| self.bindings[id as usize] > 0) {
                let id = self.files.len() as FileId;
                self.files.push(FileInfo {
                    proc,
                    fd,
                    path: None,
                    class,
                    own: false,
                });
                self.bindings.push(0);
                return id;
            }
        }
        self.intern(proc, fd, path, class)
    }

    /// The record that stands for `id` in the report: the first of its identity (process,
    /// fd, path, class); records given to single lifetimes (`record_for`) fold into it.
    pub fn canonical(&self, id: FileId) -> FileId {
        let f = &self.files[id as usize];
        if f.own {
            return id;
        }
        let key_path = match f.class {
            FileClass::Client => None,
            _ => f.path.clone(),
        };
        self.index
            .get(&(f.proc, f.fd, key_path, f.class))
            .copied()
            .unwrap_or(id)
    }

    /// The live binding of `fd` is a socket's.
    fn mark_socket(&mut self, proc: ProcKey, fd: i32) {
        if let Some(b) = self.live_mut(proc, fd) {
            b.origin = Origin::Socket;
        }
    }

    /// A listen or a connect: a socket, of `class` from the call itself for its whole
    /// lifetime when nothing classed it before. The call's resolution when that changed it.
    fn classed_by_call(
        &mut self,
        proc: ProcKey,
        fd: i32,
        ts: Nanos,
        class: FileClass,
    ) -> Option<Resolved> {
        self.mark_socket(proc, fd);
        let open = self
            .lookup(proc, fd, ts)
            .is_some_and(|r| r.class == FileClass::Unknown);
        if !open {
            return None;
        }
        let id = self.reclassify_binding(proc, fd, class)?;
        Some(self.resolved(id))
    }

    /// Names the outgoing connection on `fd` by its peer (`10.0.0.2:6380`, a unix socket's
    /// path) when nothing named it yet. Each connection is a row of its own, from its
    /// creation to its close: a close and a new socket connected to the same peer start a
    /// new one, and nothing of the new socket is added to the old (`FileInfo::own`). Past
    /// `OWN_RECORDS_MAX` records (a reconnect loop over a long trace) connections to one
    /// peer share a row. The call's resolution.
    fn name_peer(&mut self, proc: ProcKey, fd: i32, peer: &str) -> Option<Resolved> {
        let cur = self.procs.get(&proc)?.live.get(&fd)?.file;
        let info = &self.files[cur as usize];
        if info.path.is_some() || info.class != FileClass::Outgoing {
            return None;
        }
        let path: Arc<str> = Arc::from(peer);
        let key = (proc, fd, Some(path.clone()), FileClass::Outgoing);
        let id = if self.bindings[cur as usize] == 1 {
            // The lifetime's own record takes the name from its start.
            let old_key = (proc, fd, None, FileClass::Outgoing);
            if self.index.get(&old_key) == Some(&cur) {
                self.index.remove(&old_key);
            }
            self.index.entry(key).or_insert(cur);
            let f = &mut self.files[cur as usize];
            f.path = Some(path);
            f.own = true;
            cur
        } else {
            let id = if self.files.len() < OWN_RECORDS_MAX {
                let id = self.files.len() as FileId;
                self.files.push(FileInfo {
                    proc,
                    fd,
                    path: Some(path),
                    class: FileClass::Outgoing,
                    own: true,
                });
                self.bindings.push(0);
                self.index.entry(key).or_insert(id);
                id
            } else {
                self.intern(proc, fd, Some(peer), FileClass::Outgoing)
            };
            self.bindings[id as usize] += 1;
            self.live_mut(proc, fd)?.file = id;
            id
        };
        self.generation = self.generation.wrapping_add(1).max(1);
        Some(self.resolved(id))
    }

    /// The outgoing connection on `fd` carries replication (PSYNC, SYNC or REPLCONF sent on
    /// it): its whole lifetime is the replication link, one row, one class.
    pub fn outgoing_is_replication(&mut self, proc: ProcKey, fd: i32) {
        let Some(cur) = self
            .procs
            .get(&proc)
            .and_then(|p| p.live.get(&fd))
            .map(|b| b.file)
        else {
            return;
        };
        if self.files[cur as usize].class != FileClass::Outgoing {
            return;
        }
        if self.bindings[cur as usize] != 1 {
            self.reclassify(proc, fd, FileClass::Replica);
            return;
        }
        let path = self.files[cur as usize].path.clone();
        let old_key = (proc, fd, path.clone(), FileClass::Outgoing);
        if self.index.get(&old_key) == Some(&cur) {
            self.index.remove(&old_key);
        }
        self.index
            .entry((proc, fd, path, FileClass::Replica))
            .or_insert(cur);
        self.files[cur as usize].class = FileClass::Replica;
        self.generation = self.generation.wrapping_add(1).max(1);
    }

    /// The live binding of `fd`, for what its calls show of it.
    fn live_mut(&mut self, proc: ProcKey, fd: i32) -> Option<&mut Binding> {
        self.procs.get_mut(&proc).and_then(|p| p.live.get_mut(&fd))
    }

    /// What the live binding of `fd` is known to be.
    fn origin(&self, proc: ProcKey, fd: i32) -> Origin {
        self.procs
            .get(&proc)
            .and_then(|p| p.live.get(&fd))
            .map_or(Origin::Unknown, |b| b.origin)
    }

    /// A successful call that only a socket, or only a regular file, answers tells what the
    /// fd of unknown origin is (checked only while its class is open: a classed fd's origin
    /// came with its class).
    fn note_origin(&mut self, proc: ProcKey, fd: i32, sc: &Syscall) {
        if sc.ret.is_err() || matches!(sc.ret, Ret::Unknown) {
            return;
        }
        let seen = if sc.sys.fd_use == FdUse::File {
            Origin::File
        } else if socket_only(sc.sys.name) {
            Origin::Socket
        } else {
            return;
        };
        if let Some(b) = self.live_mut(proc, fd) {
            if b.origin == Origin::Unknown {
                b.origin = seen;
            }
        }
    }

    /// Whether a class found by content may be the lifetime's: a socket is only ever a
    /// connection, and RESP written (the AOF's content, but also a reply or a replica's
    /// stream) is the AOF only on a regular file.
    fn content_fits(origin: Origin, class: FileClass, is_write: bool) -> bool {
        match origin {
            Origin::Socket => class == FileClass::Client && !is_write,
            Origin::File => class != FileClass::Client,
            Origin::Unknown => !(class == FileClass::Aof && is_write),
        }
    }

    /// What a path is: as learned from its use, else as its name says.
    fn class_of_path(&self, p: &str) -> FileClass {
        self.learned
            .get(p)
            .copied()
            .unwrap_or_else(|| classify_path(p, self.conf.as_ref()))
    }

    /// Binds `fd` in process `proc` from time `ts`.
    pub fn bind(
        &mut self,
        proc: ProcKey,
        fd: i32,
        path: Option<&str>,
        class: Option<FileClass>,
        ts: Nanos,
    ) -> FileId {
        let class = class.unwrap_or_else(|| {
            path.map(|p| self.class_of_path(p))
                .unwrap_or(FileClass::Unknown)
        });
        let file = self.record_for(proc, fd, path, class);
        self.bindings[file as usize] += 1;
        self.generation = self.generation.wrapping_add(1).max(1);
        let p = self.procs.entry(proc).or_default();
        p.written.retain(|w| *w != fd);
        if let Some(old) = p.live.insert(
            fd,
            Binding {
                file,
                closed_by: NO_THREAD,
                stat_read: false,
                opened: ts,
                closed: None,
                origin: origin_of(path, class),
            },
        ) {
            push_past(
                p,
                fd,
                Binding {
                    closed: Some(ts),
                    ..old
                },
            );
        }
        file
    }

    /// `tid`'s close of `fd` in `proc`.
    pub fn close(&mut self, proc: ProcKey, tid: Tid, fd: i32, ts: Nanos) {
        self.generation = self.generation.wrapping_add(1).max(1);
        if let Some(p) = self.procs.get_mut(&proc) {
            p.written.retain(|w| *w != fd);
            if let Some(b) = p.live.remove(&fd) {
                push_past(
                    p,
                    fd,
                    Binding {
                        closed_by: tid,
                        closed: Some(ts),
                        ..b
                    },
                );
            }
        }
    }

    /// fork: the child starts with a copy of the parent's table.
    pub fn fork(&mut self, parent: ProcKey, child: ProcKey, ts: Nanos) {
        let src: Vec<(i32, FileId)> = self
            .procs
            .get(&parent)
            .map(|p| p.live.iter().map(|(fd, b)| (*fd, b.file)).collect())
            .unwrap_or_default();
        let mut fresh = ProcFds::default();
        for (fd, file) in src {
            let info = self.files[file as usize].clone();
            let id = self.intern(child, fd, info.path.as_deref(), info.class);
            self.bindings[id as usize] += 1;
            fresh.live.insert(
                fd,
                Binding {
                    file: id,
                    closed_by: NO_THREAD,
                    stat_read: false,
                    opened: ts,
                    closed: None,
                    origin: origin_of(info.path.as_deref(), info.class),
                },
            );
        }
        self.generation = self.generation.wrapping_add(1).max(1);
        fresh.forked = true;
        self.procs.insert(child, fresh);
    }

    /// What `fd` of `proc` was at time `ts` (the live binding, or a closed one that covered ts).
    #[inline]
    /// When the live binding of `fd` in `proc` began (tests: one fd lifetime's identity).
    #[cfg(test)]
    pub(crate) fn live_since(&self, proc: ProcKey, fd: i32) -> Option<Nanos> {
        self.procs.get(&proc)?.live.get(&fd).map(|b| b.opened)
    }

    pub fn lookup(&self, proc: ProcKey, fd: i32, ts: Nanos) -> Option<Resolved> {
        let r = self.recent[fd as usize % RECENT].get();
        if r.key == recent_key(self.generation, fd) && r.proc == proc.word() && r.opened <= ts {
            return Some(Resolved {
                file: r.file,
                class: r.class,
                named: r.named,
            });
        }
        self.lookup_slow(proc, fd, ts)
    }

    /// `lookup` past the recent-fd cache: out of line, so the cache hit of nearly every
    /// event stays inline in `apply` (the call's entry and exit cost as much as the hit).
    #[inline(never)]
    fn lookup_slow(&self, proc: ProcKey, fd: i32, ts: Nanos) -> Option<Resolved> {
        let slot = &self.recent[fd as usize % RECENT];
        let p = self.procs.get(&proc)?;
        if let Some(b) = p.live.get(&fd) {
            if b.opened <= ts {
                let r = self.resolved(b.file);
                slot.set(Recent {
                    key: recent_key(self.generation, fd),
                    proc: proc.word(),
                    file: b.file,
                    class: r.class,
                    named: r.named,
                    opened: b.opened,
                });
                return Some(r);
            }
        }
        let past = p.past.get(&fd)?;
        past.iter()
            .rev()
            .find(|b| b.opened <= ts && b.closed.is_none_or(|c| ts <= c))
            .or_else(|| p.live.get(&fd))
            .map(|b| self.resolved(b.file))
    }

    #[inline]
    fn resolved(&self, file: FileId) -> Resolved {
        let f = &self.files[file as usize];
        Resolved {
            file,
            class: f.class,
            named: f.path.is_some(),
        }
    }

    /// A call on an fd with no live binding: when it succeeded and the same thread had
    /// closed that fd last, something created the fd again without a call in the trace
    /// (an fd from before the trace has no closed binding).
    #[cold]
    fn note_reuse(&mut self, proc: ProcKey, tid: Tid, fd: i32, sc: &Syscall) {
        if sc.ret.is_err() || matches!(sc.ret, Ret::Unknown) {
            return;
        }
        let closed_here = self
            .procs
            .get(&proc)
            .and_then(|p| p.past.get(&fd))
            .and_then(|q| q.back())
            .is_some_and(|b| b.closed.is_some() && b.closed_by == tid);
        if closed_here {
            self.untraced_opens += 1;
        }
    }

    /// How many times a thread used an fd it had closed, with no call creating it in
    /// between (`note_reuse`).
    pub fn untraced_opens(&self) -> u64 {
        self.untraced_opens
    }

    /// A read of `fd` returned the start of a /proc/PID/stat: a second one through the same
    /// binding (plain read(), which moves the offset) means the file was opened again.
    #[cold]
    fn note_stat_read(&mut self, proc: ProcKey, fd: i32) {
        let Some(b) = self.procs.get_mut(&proc).and_then(|p| p.live.get_mut(&fd)) else {
            return;
        };
        if b.stat_read {
            self.untraced_rereads += 1;
        }
        b.stat_read = true;
    }

    /// How many reads returned a /proc/PID/stat's start again with no open between
    /// (`note_stat_read`).
    pub fn untraced_rereads(&self) -> u64 {
        self.untraced_rereads
    }

    /// Content sniffing: gives a class to a file no path named.
    pub fn reclassify(&mut self, proc: ProcKey, fd: i32, class: FileClass) -> Option<FileId> {
        let cur = self.procs.get(&proc)?.live.get(&fd)?.clone();
        let info = self.files[cur.file as usize].clone();
        if info.class == class {
            return Some(cur.file);
        }
        // A client's shown path is the shared "client connections" label, not its own.
        let path = match info.class {
            FileClass::Client => None,
            _ => info.path.as_deref(),
        };
        let id = self.intern(proc, fd, path, class);
        self.bindings[id as usize] += 1;
        self.generation = self.generation.wrapping_add(1).max(1);
        if let Some(b) = self.procs.get_mut(&proc).and_then(|p| p.live.get_mut(&fd)) {
            b.file = id;
        }
        Some(id)
    }

    /// Gives the live binding of `fd` a class learned from its use, back to the binding's
    /// start: when its file is its alone (one binding ever: the same fd, with no close or
    /// reuse since it was bound), the file itself takes the class, so the calls made before
    /// the class was known count for it too. Otherwise as `reclassify`, from now on.
    fn reclassify_binding(&mut self, proc: ProcKey, fd: i32, class: FileClass) -> Option<FileId> {
        let cur = self.procs.get(&proc)?.live.get(&fd)?.file;
        let info = &self.files[cur as usize];
        // A named file keeps its path's class, but a socket `-y` names (`socket:[N]`) is
        // classed by its connect or listen like an unnamed one.
        let named_open = info.path.is_some()
            && (!matches!(info.class, FileClass::Unknown | FileClass::Dir)
                || matches!(class, FileClass::Client));
        if self.bindings[cur as usize] != 1 || named_open || info.class == class {
            return self.reclassify(proc, fd, class);
        }
        let path = info.path.clone();
        let old_key = (proc, fd, path.clone(), info.class);
        if self.index.get(&old_key) == Some(&cur) {
            self.index.remove(&old_key);
        }
        // A client's shown path is the shared label of the fd's connections.
        let key_path = if class == FileClass::Client {
            None
        } else {
            path
        };
        self.index.entry((proc, fd, key_path, class)).or_insert(cur);
        if class == FileClass::Client {
            self.files[cur as usize].path = Some(Arc::from(client_label(None)));
        }
        self.files[cur as usize].class = class;
        self.generation = self.generation.wrapping_add(1).max(1);
        Some(cur)
    }

    /// Classes a file no path names by what the process does with it when its content says
    /// nothing (perf trace prints no buffers; strace without -y sniffs them instead): a
    /// file written and then fsynced by the traced process is the AOF. Only the AOF and the
    /// saves are, and a file no path names was opened before the trace: a save is a forked
    /// child's or opened while traced (named then), the AOF stays open for the process's
    /// life. The new file, when reclassified.
    fn by_behaviour(
        &mut self,
        proc: ProcKey,
        fd: i32,
        r: Resolved,
        sc: &Syscall,
    ) -> Option<FileId> {
        if r.named || !matches!(r.class, FileClass::Unknown | FileClass::Other) {
            return None;
        }
        // A failed call says nothing of the file (fsync of a socket or pipe is EINVAL).
        if matches!(sc.ret, Ret::Err(_)) || self.origin(proc, fd) == Origin::Socket {
            return None;
        }
        let p = self.procs.get_mut(&proc)?;
        if sc.sys.puts {
            if !p.written.contains(&fd) && p.written.len() < WRITTEN_KEEP {
                p.written.push(fd);
            }
            None
        } else if sc.sys.facts.has(Facts::FSYNC) && p.written.contains(&fd) && !p.forked {
            // The writes before this fsync were to the AOF too.
            self.reclassify_binding(proc, fd, FileClass::Aof)
        } else {
            None
        }
    }

    /// Applies the fd-table effect of a finished syscall of process `proc`.
    /// Returns the file the call resolved to (for its fd argument).
    /// `tid`: the calling thread.
    pub fn apply(&mut self, proc: ProcKey, tid: Tid, ts: Nanos, sc: &Syscall) -> Option<Resolved> {
        let mut resolved = None;
        if let Some(fd) = sc.fd {
            resolved = self.resolve_arg(proc, tid, ts, sc, fd);
            if let Some(d) = sc.data() {
                self.check_stat_read(proc, fd, sc, d);
            }
            // Nearly every call is on an fd whose class is settled (a client, the AOF, the
            // epoll fd): nothing to learn from it, one test. Only an fd of open class (or
            // a path taken for a directory) is looked at further, out of line: the learning
            // inline cost ~20 instructions an event (bench/ab.result.txt [I18]).
            // A failed call with no data (`read(3, ...) = -1 EAGAIN`) teaches nothing either:
            // each step of `learn` wants content or a success.
            if let Some(r) = resolved.filter(|r| {
                matches!(
                    r.class,
                    FileClass::Unknown | FileClass::Other | FileClass::Dir
                ) && (sc.data().is_some() || !sc.ret.is_err())
            }) {
                resolved = Some(self.learn(proc, fd, r, sc));
            }
        }
        // Most calls (reads, writes, waits, fsyncs) create, copy or close no fd: no trip
        // through `fd_effect` for them.
        if sc.sys.fd == FdKind::None {
            return resolved;
        }
        self.apply_effect(proc, tid, ts, sc).or(resolved)
    }

    /// What the fd argument is at the call: `-y` annotations are ground truth; otherwise
    /// the table's binding, or a new one for an fd from before the trace.
    #[inline]
    fn resolve_arg(
        &mut self,
        proc: ProcKey,
        tid: Tid,
        ts: Nanos,
        sc: &Syscall,
        fd: i32,
    ) -> Option<Resolved> {
        let mut resolved;
        if let Some(path) = sc.fd_path.as_deref() {
            let cur = self.lookup(proc, fd, ts);
            let same = cur.is_some_and(|r| {
                let f = &self.files[r.file as usize];
                // A socket sniffed as a client (or found to be a replica) keeps its
                // class under a `socket:[N]` annotation.
                f.path.as_deref() == Some(path)
                    || (matches!(
                        f.class,
                        FileClass::Client
                            | FileClass::Replica
                            | FileClass::Outgoing
                            | FileClass::Listener
                    ) && (path.contains("->") || path.starts_with("socket:")))
            });
            resolved = if same {
                cur
            } else {
                if cur.is_none() {
                    self.note_reuse(proc, tid, fd, sc);
                }
                let id = self.bind(proc, fd, Some(path), None, ts);
                Some(self.resolved(id))
            };
        } else {
            resolved = self.lookup(proc, fd, ts);
            if resolved.is_none() && sc.sys.fd != FdKind::Close {
                self.note_reuse(proc, tid, fd, sc);
                // An fd from before the trace: known only by what it is used for.
                let class = match sc.sys.fd_use {
                    FdUse::Listener => Some(FileClass::Listener),
                    FdUse::Epoll => Some(FileClass::Epoll),
                    FdUse::File => Some(FileClass::Other),
                    FdUse::None => None,
                };
                let id = self.bind(proc, fd, None, class, ts);
                resolved = Some(self.resolved(id));
            }
        }
        resolved
    }

    /// A read that returned the start of a /proc/PID/stat (`note_stat_read`).
    #[inline]
    fn check_stat_read(&mut self, proc: ProcKey, fd: i32, sc: &Syscall, d: &crate::event::Data) {
        // Reads of client requests start with `*` or a letter, replies and log lines are
        // writes: a read starting with a digit is rare enough to look at.
        let (_, raw) = d.kept();
        if raw.first().is_some_and(u8::is_ascii_digit)
            && !sc.sys.puts
            && sc.sys.name == "read"
            && sc.ret.val().is_some_and(|n| n > 0)
            && is_proc_stat(raw)
        {
            self.note_stat_read(proc, fd);
        }
    }

    /// What a call on an fd of open class (or a path taken for a directory) shows of it:
    /// its content, then its kind. The resolution, as it is after.
    #[inline(never)]
    fn learn(&mut self, proc: ProcKey, fd: i32, r: Resolved, sc: &Syscall) -> Resolved {
        let r = self.learn_from_content(proc, fd, r, sc);
        self.learn_from_use(proc, fd, r, sc)
    }

    /// What the call's data shows of its fd: a path taken for a directory that data was
    /// read from or written to, content that classes an fd no path names
    /// (`content_fits`). The resolution, as it is after.
    #[inline]
    fn learn_from_content(
        &mut self,
        proc: ProcKey,
        fd: i32,
        r: Resolved,
        sc: &Syscall,
    ) -> Resolved {
        let mut resolved = r;
        if let Some(d) = sc.data() {
            let unnamed = !r.named || r.class == FileClass::Unknown;
            let is_write = sc.sys.puts;
            // An extensionless path was taken for a directory (redis fsyncs its
            // directories), but a directory cannot be written: it is a file, such as a
            // log file named `log`.
            // Nor read: a directory's read() fails (EISDIR), so data read is a file's
            // (`/etc/hosts` is no directory).
            let got = is_write || sc.ret.val().is_some_and(|n| n > 0);
            if r.class == FileClass::Dir && got && !sc.sys.name.starts_with("getdents") {
                let c = sniff(d.head().bytes(), true).unwrap_or(FileClass::Other);
                if let Some(p) = self.files[r.file as usize].path.clone() {
                    self.learned.insert(p, c);
                }
                if let Some(id) = self.reclassify_binding(proc, fd, c) {
                    resolved = self.resolved(id);
                }
            } else if matches!(r.class, FileClass::Unknown | FileClass::Other) && unnamed {
                self.note_origin(proc, fd, sc);
                let origin = self.origin(proc, fd);
                let found = sniff(d.head().bytes(), is_write)
                    .filter(|c| Self::content_fits(origin, *c, is_write));
                if let Some(c) = found {
                    if let Some(id) = self.reclassify_binding(proc, fd, c) {
                        resolved = self.resolved(id);
                    }
                }
            }
        }
        resolved
    }

    /// What the call's kind shows of its fd: a socket or a file (`note_origin`), a
    /// listener or an epoll fd from before the trace, the AOF by behaviour.
    #[inline]
    fn learn_from_use(&mut self, proc: ProcKey, fd: i32, r: Resolved, sc: &Syscall) -> Resolved {
        let mut resolved = Some(r);
        if matches!(r.class, FileClass::Unknown | FileClass::Other) {
            self.note_origin(proc, fd, sc);
            // An fd from before the trace first seen in a call that told nothing is
            // known by a later use that does, for the whole of its lifetime.
            let by_use = match sc.sys.fd_use {
                FdUse::Listener => Some(FileClass::Listener),
                FdUse::Epoll => Some(FileClass::Epoll),
                _ => None,
            };
            if let Some(c) = by_use.filter(|_| r.class == FileClass::Unknown && !r.named) {
                if !sc.ret.is_err() {
                    if let Some(id) = self.reclassify_binding(proc, fd, c) {
                        resolved = Some(self.resolved(id));
                    }
                }
            }
        }
        if let Some(id) = self.by_behaviour(proc, fd, r, sc) {
            resolved = Some(self.resolved(id));
        }
        resolved.unwrap_or(r)
    }

    /// The call's effect on the table (an open, a new fd, a connect, a dup, a close): the
    /// resolution it gives the call, when it changes it.
    fn apply_effect(
        &mut self,
        proc: ProcKey,
        tid: Tid,
        ts: Nanos,
        sc: &Syscall,
    ) -> Option<Resolved> {
        let mut resolved = None;
        match fd_effect(sc) {
            FdEffect::Open { fd, path } => {
                let class = path.map(|p| {
                    let c = self.class_of_path(p);
                    // redis fsyncs its directories after renames: opened O_DIRECTORY or not.
                    if c == FileClass::Other && p.ends_with('/') {
                        FileClass::Dir
                    } else {
                        c
                    }
                });
                // The file an open touches is the one it opens, not its directory fd.
                let id = self.bind(proc, fd, path, class, ts);
                resolved = Some(self.resolved(id));
            }
            FdEffect::New { fd, kind, path } => {
                let class = match kind {
                    NewFd::Socket => FileClass::Unknown,
                    NewFd::Accepted => FileClass::Client,
                    NewFd::Epoll => FileClass::Epoll,
                    NewFd::Other => FileClass::AnonInode,
                };
                self.bind(proc, fd, path, Some(class), ts);
                if kind == NewFd::Socket {
                    self.mark_socket(proc, fd);
                }
            }
            // A listen or a connect classes the socket from the call itself, for its whole
            // lifetime (its setsockopt calls before count for the class it got).
            FdEffect::Listen(fd) | FdEffect::Connect(fd) => {
                let class = match fd_effect(sc) {
                    FdEffect::Listen(_) => FileClass::Listener,
                    _ => FileClass::Outgoing,
                };
                resolved = self.classed_by_call(proc, fd, ts, class);
                // A connect names its peer (strace's `{sa_family=AF_INET, ...}`): the
                // lifetime's row is that connection's.
                if let (FileClass::Outgoing, Some(peer)) = (class, sc.path()) {
                    resolved = self.name_peer(proc, fd, peer).or(resolved);
                }
            }
            FdEffect::Pair { a, b, socket } => {
                let class = if socket {
                    FileClass::Other
                } else {
                    FileClass::Pipe
                };
                self.bind(proc, a, None, Some(class), ts);
                self.bind(proc, b, None, Some(class), ts);
                if socket {
                    self.mark_socket(proc, a);
                    self.mark_socket(proc, b);
                }
            }
            FdEffect::Dup { src, dst } => {
                if dst != src {
                    let from = self
                        .lookup(proc, src, ts)
                        .map(|r| self.files[r.file as usize].clone());
                    let (path, class) = match &from {
                        Some(f) => (f.path.as_deref().map(str::to_string), Some(f.class)),
                        None => (None, None),
                    };
                    self.bind(proc, dst, path.as_deref(), class, ts);
                }
            }
            // The kernel frees the number at the start of close(), before any flush.
            FdEffect::Close(fd) => self.close(proc, tid, fd, ts),
            FdEffect::CloseRange(lo, hi) => {
                if let Some(p) = self.procs.get(&proc) {
                    let fds: Vec<i32> = p
                        .live
                        .keys()
                        .copied()
                        .filter(|f| *f >= 0 && (*f as u32) >= lo && (*f as u32) <= hi)
                        .collect();
                    for fd in fds {
                        self.close(proc, tid, fd, ts);
                    }
                }
            }
            // Threads and processes are followed by the analyzer (`fork`).
            FdEffect::Clone { .. } | FdEffect::None => {}
        }
        resolved
    }
}

fn push_past(p: &mut ProcFds, fd: i32, b: Binding) {
    let q = p.past.entry(fd).or_default();
    if q.len() == PAST_KEEP {
        q.pop_front();
    }
    q.push_back(b);
}

/// `TCP:[127.0.0.1:6394->127.0.0.1:36610]` -> `TCP:[127.0.0.1:6394] clients`: the local side.
fn client_label(path: Option<&str>) -> String {
    match path {
        Some(p) => match (p.find('['), p.find("->")) {
            (Some(o), Some(a)) if o < a => format!("{}] clients", &p[..a]),
            _ => "client connections".to_string(),
        },
        None => "client connections".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Extra, Ret, Syscall};

    const P1: ProcKey = ProcKey::Root;
    const P2: ProcKey = ProcKey::Pid(2);
    const P3: ProcKey = ProcKey::Pid(3);
    /// The calling thread, where which thread it is does not matter.
    const T1: Tid = 1;

    fn call(name: &'static str, fd: Option<i32>, ret: i64, path: Option<&str>) -> Syscall {
        let mut sc = Syscall::new(name);
        sc.fd = fd;
        sc.ret = Ret::Val(ret);
        if let Some(p) = path {
            sc.extra = Extra::Path(p.into());
        }
        sc
    }

    #[test]
    fn classifies_redis_files() {
        let c = |p| classify_path(p, None);
        assert_eq!(
            c("/d/appendonlydir/appendonly.aof.1.incr.aof"),
            FileClass::Aof
        );
        assert_eq!(
            c("/d/appendonlydir/appendonly.aof.2.base.rdb"),
            FileClass::Aof
        );
        assert_eq!(
            c("/d/appendonlydir/appendonly.aof.manifest"),
            FileClass::AofManifest
        );
        assert_eq!(
            c("/d/appendonlydir/temp-appendonly.aof.manifest"),
            FileClass::AofManifest
        );
        assert_eq!(c("/d/temp-rewriteaof-9569.aof"), FileClass::AofRewriteTemp);
        assert_eq!(
            c("/d/temp-rewriteaof-bg-9569.aof"),
            FileClass::AofRewriteTemp
        );
        assert_eq!(c("/d/temp-8335.rdb"), FileClass::RdbTemp);
        assert_eq!(c("/d/dump.rdb"), FileClass::Rdb);
        assert_eq!(c("/d/redis.log"), FileClass::Log);
        assert_eq!(c("/proc/8169/stat"), FileClass::Proc);
        assert_eq!(
            c("TCP:[127.0.0.1:6394->127.0.0.1:36610]"),
            FileClass::Client
        );
        assert_eq!(c("TCP:[127.0.0.1:6394]"), FileClass::Listener);
        assert_eq!(
            c("UNIX-STREAM:[475231,\"/tmp/r.sock\"]"),
            FileClass::Listener
        );
        assert_eq!(
            c("UNIX-STREAM:[475237->476335,\"/tmp/r.sock\"]"),
            FileClass::Client
        );
        assert_eq!(c("UNIX-STREAM:[475240]"), FileClass::Unknown);
        assert_eq!(c("TCPv6:[[::1]:6434->[::1]:50102]"), FileClass::Client);
        assert_eq!(c("anon_inode:[eventpoll]"), FileClass::Epoll);
        // redis 8's hand-off eventfds and other in-memory fds are no disk files.
        assert_eq!(c("anon_inode:[eventfd]"), FileClass::AnonInode);
        assert!(!c("anon_inode:[timerfd]").is_disk_file());
        assert_eq!(c("pipe:[1234]"), FileClass::Pipe);
        assert_eq!(c("/var/lib/redis"), FileClass::Dir);
    }

    /// Without a redis.conf, an extensionless path looks like a directory until something
    /// is written to it: a log line makes it the log file, also when it is opened again.
    #[test]
    fn extensionless_file_written_with_log_lines_is_the_log_from_then_on() {
        let mut t = FdTable::new(None);
        let open = || call("openat", None, 11, Some("/data/out"));
        t.apply(P1, T1, 0, &open());
        let r = t
            .apply(P1, T1, 1, &call("lseek", Some(11), 0, None))
            .unwrap();
        assert_eq!(r.class, FileClass::Dir);
        let mut w = call("write", Some(11), 40, None);
        w.extra = Extra::Data(crate::event::Data::new(
            b"2550:M 01 Dec 2026 05:05:00.705 * Ready to accept connections\n",
            false,
        ));
        assert_eq!(t.apply(P1, T1, 2, &w).unwrap().class, FileClass::Log);
        assert_eq!(
            t.apply(P1, T1, 3, &call("close", Some(11), 0, None))
                .unwrap()
                .class,
            FileClass::Log
        );
        let r = t.apply(P1, T1, 4, &open()).unwrap();
        assert_eq!(r.class, FileClass::Log);
    }

    #[test]
    fn conf_names_the_log_file_even_without_log_extension() {
        let conf =
            RedisConf::parse("dir /data\nlogfile \"/data/redis-out\"\ndbfilename snap.bin\n");
        assert_eq!(
            classify_path("/data/redis-out", Some(&conf)),
            FileClass::Log
        );
        assert_eq!(classify_path("/data/snap.bin", Some(&conf)), FileClass::Rdb);
    }

    #[test]
    fn reused_fd_number_resolves_by_time() {
        let mut t = FdTable::new(None);
        t.apply(
            P1,
            T1,
            100,
            &call("openat", None, 8, Some("/proc/self/stat")),
        );
        t.apply(P1, T1, 200, &call("close", Some(8), 0, None));
        t.apply(P1, T1, 300, &call("accept4", Some(6), 8, None));
        assert_eq!(t.lookup(P1, 8, 150).unwrap().class, FileClass::Proc);
        assert_eq!(t.lookup(P1, 8, 350).unwrap().class, FileClass::Client);
    }

    /// A thread that reads an fd it closed, with no call creating it in between, shows
    /// creating calls missing from the trace; an fd from before the trace, a failed read of
    /// the closed fd, another thread's close, or a traced reopen show nothing.
    #[test]
    fn use_after_own_close_counts_as_untraced_open() {
        const T2: Tid = 2;
        let mut t = FdTable::new(None);
        t.apply(P1, T1, 10, &call("read", Some(9), 5, None));
        assert_eq!(t.untraced_opens(), 0, "an fd from before the trace");
        t.apply(
            P1,
            T1,
            100,
            &call("openat", None, 8, Some("/proc/self/stat")),
        );
        t.apply(P1, T1, 200, &call("close", Some(8), 0, None));
        let mut bad = call("read", Some(8), 0, None);
        bad.ret = Ret::Err("EBADF");
        t.apply(P1, T1, 250, &bad);
        assert_eq!(t.untraced_opens(), 0, "a failed read of the closed fd");
        t.apply(P1, T1, 300, &call("close", Some(8), 0, None));
        t.apply(P1, T1, 400, &call("accept4", Some(6), 8, None));
        t.apply(P1, T1, 450, &call("read", Some(8), 10, None));
        assert_eq!(t.untraced_opens(), 0, "a traced accept");
        t.apply(P1, T1, 500, &call("close", Some(8), 0, None));
        t.apply(P1, T1, 600, &call("read", Some(8), 10, None));
        assert_eq!(t.untraced_opens(), 1, "accept not traced");
        t.apply(P1, T2, 700, &call("close", Some(8), 0, None));
        t.apply(P1, T1, 800, &call("read", Some(8), 10, None));
        assert_eq!(t.untraced_opens(), 1, "another thread closed it");
    }

    /// redis opens /proc/self/stat anew for each memory sample: the start of the file read
    /// twice through one open (no openat between) shows opens missing from the trace; a
    /// traced reopen, a client's reads and pread show nothing.
    #[test]
    fn proc_stat_read_twice_without_an_open_counts_as_untraced() {
        let read = |fd, text: &str| {
            let mut sc = call("read", Some(fd), text.len() as i64, None);
            sc.extra = Extra::Data(crate::event::Data::escaped(format!("{text}\"").as_bytes()));
            sc
        };
        let stat = "6005 (redis-server) R 1 6005 6005 0 -1 4194560";
        assert!(is_proc_stat(stat.as_bytes()));
        assert!(is_proc_stat(b"7 (a) b) S 1 "), "a ') ' inside the command");
        assert!(!is_proc_stat(b"8169:M 30 Nov 2026 22:38:11.272 * x"));
        assert!(!is_proc_stat(b"123 (x"));
        let mut t = FdTable::new(None);
        t.apply(
            P1,
            T1,
            10,
            &call("openat", None, 7, Some("/proc/self/stat")),
        );
        t.apply(P1, T1, 20, &read(7, stat));
        t.apply(P1, T1, 30, &call("close", Some(7), 0, None));
        t.apply(
            P1,
            T1,
            40,
            &call("openat", None, 7, Some("/proc/self/stat")),
        );
        t.apply(P1, T1, 50, &read(7, stat));
        t.apply(P1, T1, 60, &read(8, "*1\r\n$4\r\nPING\r\n"));
        let mut pread = read(7, stat);
        pread.sys = crate::syscalls::info("pread64");
        t.apply(P1, T1, 70, &pread);
        assert_eq!(t.untraced_rereads(), 0);
        t.apply(P1, T1, 80, &read(7, stat));
        t.apply(P1, T1, 90, &read(7, stat));
        assert_eq!(t.untraced_rereads(), 2, "no open between the reads");
    }

    /// The cache of recent lookups never outlives a change: a reused fd, another process
    /// with the same fd, a fork, and a reclassification each give the current answer.
    #[test]
    fn recent_lookups_follow_every_change() {
        let mut t = FdTable::new(None);
        t.apply(
            P1,
            T1,
            100,
            &call("openat", None, 7, Some("/data/appendonly.aof")),
        );
        assert_eq!(t.lookup(P1, 7, 150).unwrap().class, FileClass::Aof);
        assert_eq!(t.lookup(P1, 7, 150).unwrap().class, FileClass::Aof);
        // Same fd in another process: not the cached one.
        t.apply(
            P2,
            T1,
            160,
            &call("openat", None, 7, Some("/data/redis.log")),
        );
        assert_eq!(t.lookup(P2, 7, 170).unwrap().class, FileClass::Log);
        assert_eq!(t.lookup(P1, 7, 170).unwrap().class, FileClass::Aof);
        // Reused in process 1.
        t.apply(P1, T1, 200, &call("close", Some(7), 0, None));
        t.apply(
            P1,
            T1,
            300,
            &call("openat", None, 7, Some("/data/dump.rdb")),
        );
        assert_eq!(t.lookup(P1, 7, 350).unwrap().class, FileClass::Rdb);
        // Before the current binding opened, the cached one does not apply.
        assert_eq!(t.lookup(P1, 7, 150).unwrap().class, FileClass::Aof);
        // A fork copies; a reclassification is seen at once.
        t.fork(P1, P3, 400);
        assert_eq!(t.lookup(P3, 7, 450).unwrap().class, FileClass::Rdb);
        t.apply(P1, T1, 500, &call("socket", None, 9, None));
        let before = t.lookup(P1, 9, 550).unwrap().class;
        t.reclassify(P1, 9, FileClass::Client);
        assert_ne!(before, FileClass::Client);
        assert_eq!(t.lookup(P1, 9, 560).unwrap().class, FileClass::Client);
    }

    /// A benchmark's ~50 client connections each keep their own cache entry: after one
    /// round of lookups every one of them is a hit, not a trip to `lookup_slow`.
    #[test]
    fn fifty_client_fds_stay_in_the_recent_cache() {
        let mut t = FdTable::new(None);
        for fd in 8..58 {
            t.apply(P1, T1, 100, &call("accept4", None, fd, None));
        }
        for fd in 8..58 {
            assert_eq!(t.lookup(P1, fd, 200).unwrap().class, FileClass::Client);
        }
        for fd in 8..58 {
            let r = t.recent[fd as usize % RECENT].get();
            assert_eq!(r.key, recent_key(t.generation, fd), "fd {fd}");
        }
    }

    #[test]
    fn fork_copies_and_then_diverges() {
        let mut t = FdTable::new(None);
        t.apply(
            P1,
            T1,
            10,
            &call("openat", None, 7, Some("/d/appendonly.aof")),
        );
        t.fork(P1, P2, 20);
        t.apply(P2, T1, 30, &call("close", Some(7), 0, None));
        assert_eq!(t.lookup(P1, 7, 40).unwrap().class, FileClass::Aof);
        assert_eq!(t.lookup(P2, 7, 25).unwrap().class, FileClass::Aof);
        assert!(
            t.lookup(P2, 7, 40).is_none() || t.lookup(P2, 7, 40).unwrap().class == FileClass::Aof
        );
    }

    #[test]
    fn sniffs_aof_log_and_rdb_by_content() {
        assert_eq!(sniff(b"*3\r\n$3\r\nset\r\n", true), Some(FileClass::Aof));
        assert_eq!(
            sniff(b"*3\r\n$3\r\nset\r\n", false),
            Some(FileClass::Client)
        );
        assert_eq!(
            sniff(b"8169:M 30 Nov 2026 22:38:11.272 * x", true),
            Some(FileClass::Log)
        );
        assert_eq!(sniff(b"REDIS0011\xfa", true), Some(FileClass::Rdb));
        assert_eq!(sniff(b"+OK\r\n", true), None);
    }

    #[test]
    fn annotation_wins_over_table() {
        let mut t = FdTable::new(None);
        t.apply(P1, T1, 10, &call("openat", None, 9, Some("/d/x.rdb")));
        let mut w = call("write", Some(9), 4, None);
        w.fd_path = Some("/d/redis.log".into());
        let r = t.apply(P1, T1, 20, &w).unwrap();
        assert_eq!(r.class, FileClass::Log);
    }

    /// perf trace prints no buffers and, without augmentation, no path: a file the traced
    /// process writes and then fsyncs is the AOF (issue 13), as sniffing its writes would
    /// say under strace without -y. Not a socket (its fsync fails), not a child's save.
    #[test]
    fn a_file_written_then_fsynced_is_the_aof() {
        let mut t = FdTable::new(None);
        let class = |t: &FdTable, pid, fd| t.lookup(pid, fd, 100).map(|r| r.class);
        t.apply(P1, T1, 10, &call("write", Some(7), 45, None));
        assert_eq!(class(&t, P1, 7), Some(FileClass::Unknown));
        let r = t.apply(P1, T1, 20, &call("fdatasync", Some(7), 0, None));
        assert_eq!(r.map(|r| r.class), Some(FileClass::Aof), "the call itself");
        assert_eq!(class(&t, P1, 7), Some(FileClass::Aof));
        // Never written: an fsynced directory or file says nothing.
        t.apply(P1, T1, 30, &call("fsync", Some(8), 0, None));
        assert_eq!(class(&t, P1, 8), Some(FileClass::Other));
        // A socket: its fsync fails.
        t.apply(P1, T1, 40, &call("write", Some(9), 5, None));
        let mut bad = call("fdatasync", Some(9), 0, None);
        bad.ret = Ret::Err("EINVAL");
        t.apply(P1, T1, 50, &bad);
        assert_eq!(class(&t, P1, 9), Some(FileClass::Unknown));
        // A forked child's written and fsynced file is its save.
        t.fork(P1, P2, 60);
        t.apply(P2, T1, 70, &call("write", Some(10), 4096, None));
        t.apply(P2, T1, 80, &call("fsync", Some(10), 0, None));
        assert_ne!(class(&t, P2, 10), Some(FileClass::Aof));
    }

    /// Issue 13: once the fd is known as the AOF by what is done with it, the calls made on
    /// it before, in the same fd lifetime, are the AOF's too (the first write before the
    /// first fdatasync was "unknown"); not across a close and a reuse of the number.
    #[test]
    fn the_aof_found_by_behaviour_takes_its_earlier_calls_in_the_same_lifetime() {
        let mut t = FdTable::new(None);
        let first = t
            .apply(P1, T1, 10, &call("write", Some(7), 45, None))
            .unwrap();
        assert_eq!(first.class, FileClass::Unknown);
        let r = t
            .apply(P1, T1, 20, &call("fdatasync", Some(7), 0, None))
            .unwrap();
        assert_eq!(r.file, first.file, "the same file, now the AOF");
        assert_eq!(t.file(first.file).class, FileClass::Aof);
        // A later unnamed binding of another fd number that is closed, reused and only then
        // written and fsynced: the first lifetime keeps what it was.
        let a = t
            .apply(P1, T1, 30, &call("write", Some(8), 45, None))
            .unwrap();
        t.apply(P1, T1, 40, &call("close", Some(8), 0, None));
        let b = t
            .apply(P1, T1, 50, &call("write", Some(8), 45, None))
            .unwrap();
        // Each lifetime has a record of its own, and the report folds those of one
        // (fd, class) into one row.
        assert_ne!(a.file, b.file);
        assert_eq!(t.canonical(a.file), t.canonical(b.file));
        let r = t
            .apply(P1, T1, 60, &call("fdatasync", Some(8), 0, None))
            .unwrap();
        assert_eq!(r.class, FileClass::Aof);
        assert_ne!(r.file, a.file);
        assert_eq!(t.file(a.file).class, FileClass::Unknown);
    }

    fn with_data(mut sc: Syscall, text: &str) -> Syscall {
        sc.extra = Extra::Data(crate::event::Data::escaped(format!("{text}\"").as_bytes()));
        sc
    }

    /// Issue 39: RESP written with sendto, or on a socket made in the trace, is a
    /// connection; written on an fd of unknown origin it is not the AOF on that alone, but
    /// it is once an fsync of the fd succeeds (only a regular file's does); on an fd an
    /// fsync showed to be a file, RESP makes it the AOF from its first call.
    #[test]
    fn resp_makes_the_aof_only_of_a_regular_file() {
        let resp = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
        let mut t = FdTable::new(None);
        let sendto = with_data(call("sendto", Some(5), 29, None), resp);
        assert_eq!(
            t.apply(P1, T1, 10, &sendto).unwrap().class,
            FileClass::Unknown
        );
        t.apply(P1, T1, 20, &call("fdatasync", Some(5), 0, None));
        assert_ne!(t.lookup(P1, 5, 30).unwrap().class, FileClass::Aof);
        t.apply(P1, T1, 30, &call("socket", None, 6, None));
        let w = with_data(call("write", Some(6), 29, None), resp);
        assert_eq!(t.apply(P1, T1, 40, &w).unwrap().class, FileClass::Unknown);
        let w = with_data(call("write", Some(9), 29, None), resp);
        assert_eq!(t.apply(P1, T1, 50, &w).unwrap().class, FileClass::Unknown);
        let r = t
            .apply(P1, T1, 60, &call("fdatasync", Some(9), 0, None))
            .unwrap();
        assert_eq!(r.class, FileClass::Aof);
        // fsync first (a file, class unknown yet), then the RESP write: one record, the AOF.
        let first = t
            .apply(P1, T1, 70, &call("fdatasync", Some(7), 0, None))
            .unwrap();
        let w = with_data(call("write", Some(7), 29, None), resp);
        let r = t.apply(P1, T1, 80, &w).unwrap();
        assert_eq!((r.file, r.class), (first.file, FileClass::Aof));
    }

    /// A connect classes its socket from the call itself, and back to the socket's start;
    /// a new socket on the same number is a new lifetime.
    #[test]
    fn a_connect_classes_the_socket_from_its_own_call() {
        let mut t = FdTable::new(None);
        t.apply(P1, T1, 10, &call("socket", None, 4, None));
        let opt = t
            .apply(P1, T1, 20, &call("setsockopt", Some(4), 0, None))
            .unwrap();
        let mut c = call("connect", Some(4), 0, None);
        c.ret = Ret::Err("EINPROGRESS");
        let r = t.apply(P1, T1, 30, &c).unwrap();
        assert_eq!(r.class, FileClass::Outgoing, "the connect itself");
        assert_eq!(r.file, opt.file, "the setsockopt before it too");
        t.apply(P1, T1, 40, &call("close", Some(4), 0, None));
        t.apply(P1, T1, 50, &call("socket", None, 4, None));
        let fresh = t
            .apply(P1, T1, 60, &call("setsockopt", Some(4), 0, None))
            .unwrap();
        assert_eq!(fresh.class, FileClass::Unknown);
        assert_ne!(fresh.file, r.file);
        assert_eq!(t.file(r.file).class, FileClass::Outgoing);
    }

    /// An extensionless path taken for a directory is a file once data is read from it.
    #[test]
    fn a_path_read_from_is_no_directory() {
        let mut t = FdTable::new(None);
        let o = t
            .apply(P1, T1, 10, &call("openat", None, 3, Some("/etc/hosts")))
            .unwrap();
        assert_eq!(o.class, FileClass::Dir);
        let r = t
            .apply(
                P1,
                T1,
                20,
                &with_data(call("read", Some(3), 20, None), "127.0.0.1 x\n"),
            )
            .unwrap();
        assert_eq!((r.file, r.class), (o.file, FileClass::Other));
    }
}
