//! The one event type that crosses every boundary of the pipeline: sources (strace text,
//! perf trace text, live tracers) produce `Event`s, the fd table resolves them, analyzers
//! consume them. It says who (tid), when (start time on the trace's clock, in ns), what
//! (syscall, signal, exit, attach/detach), and where it came from (input line, 0 if live).
//!
//! Only the few syscall arguments the analysis needs are kept (the fd, a path, the first
//! bytes of a buffer), pulled out by the source, so that an event never owns a copy of the
//! whole line and the hot path allocates only when a path is present.

use crate::syscalls::SysInfo;
use std::mem::MaybeUninit;
use std::sync::Mutex;

/// Thread id as printed by the tracer (strace prints tids, not tgids).
pub type Tid = u32;
/// Nanoseconds on the trace's clock (see `source::Clock`).
pub type Nanos = i64;

/// How many leading bytes of a read/write buffer an event keeps: enough for a RESP
/// command name (`*3\r\n$4\r\nSADD\r\n`), a redis log-line prefix or the `REDIS` magic.
pub const DATA_CAP: usize = 48;

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub tid: Tid,
    /// Start of the call (or time of the signal/exit) on the trace clock.
    pub ts: Nanos,
    /// Input line on which the event ends (the resumed half for a stitched call); 0 if live.
    pub line: u64,
    pub kind: EventKind,
}

// Nearly every event is a syscall: boxing it to shrink the rare variants would cost an
// allocation per line on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    Syscall(Syscall),
    /// `--- SIGCHLD {si_signo=SIGCHLD, si_pid=N, ...} ---`
    Signal {
        name: &'static str,
        si_pid: Option<u32>,
    },
    /// `+++ exited with N +++` / `+++ killed by SIGKILL +++`
    Exit {
        code: Option<i32>,
        signal: Option<&'static str>,
    },
    /// `strace: Process N attached [with K threads]` (or a live seize).
    Attach {
        threads: Option<u32>,
    },
    /// `strace: Process N detached` (or a live detach).
    Detach,
    /// The thread's name as the trace gives it (`strace -Y`), when it first appears or
    /// changes.
    ThreadName(Box<str>),
    /// The thread's comm from a tracer that prints one on every line and no process id
    /// (`perf trace`'s `comm/tid`), when it first appears or changes: its name, and the
    /// program it belongs to (a whole-machine trace holds many).
    Program(Box<str>),
    /// A line that could not be read (a pasted `...`, a cut line, garbage) at `line`, of no
    /// known thread (`tid` 0): the timeline is broken there, for every thread. No duration
    /// reconstructed by the source spans it; neither may a gap.
    Unreadable,
}

/// Where a syscall's duration came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DurSource {
    /// `-T`, perf trace's `( 0.037 ms)`, or a live tracer's clock.
    Measured,
    /// From the entry line of an unfinished call to its resumed line.
    Paired,
    /// Upper bound: up to the next event of the same thread.
    UpperBound,
    /// Not known (the call was cut off, or nothing followed it).
    #[default]
    Unknown,
}

/// A call that the trace only shows part of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    /// Already running when tracing began (a resumed half with no entry, restart_syscall).
    AtStart,
    /// Still running when tracing ended (unfinished with no resume, `<detached ...>`, cut-off line).
    AtEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ret {
    /// A non-negative result (or a negative one that is not an errno, e.g. lseek).
    Val(i64),
    /// `-1 EAGAIN (...)`: the errno name.
    Err(&'static str),
    /// `= ?` (the call did not return: exit, or the thread died), or not known.
    Unknown,
}

impl Ret {
    pub fn is_err(&self) -> bool {
        matches!(self, Ret::Err(_))
    }
    pub fn val(&self) -> Option<i64> {
        match self {
            Ret::Val(v) => Some(*v),
            _ => None,
        }
    }
}

/// The syscall-specific arguments the fd table and the analyzers need.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Extra {
    #[default]
    None,
    /// A pathname argument (open, openat, creat, unlink, newfstatat with a path...).
    Path(Box<str>),
    /// rename/renameat: old and new path.
    Rename(Box<str>, Box<str>),
    /// pipe/pipe2/socketpair: the two fds written by the kernel.
    FdPair(i32, i32),
    /// dup2/dup3: the target fd number.
    NewFd(i32),
    /// fcntl(fd, F_DUPFD...): the result is a copy of `fd`.
    DupFd,
    /// close_range(first, last).
    CloseRange(u32, u32),
    /// clone/clone3/fork/vfork: `thread` when CLONE_THREAD was given.
    Clone { thread: bool },
    /// socket(domain, ...): e.g. "AF_INET", "AF_UNIX".
    Socket(&'static str),
    /// The first bytes of a read/write buffer, unescaped.
    Data(Data),
    /// `futex(addr, FUTEX_WAIT_PRIVATE, 2, ...)`: 2 is glibc's value of a contended mutex,
    /// so the thread waits for a lock another thread holds, not for work. The futex's
    /// address (0 when not printed).
    LockWait(u64),
    /// Another wait on the futex at `addr`, or (`wake`) a wake of its waiters: which
    /// thread's wake ended which thread's wait.
    Futex { addr: u64, wake: bool },
    /// restart_syscall: the call it continues (`<... resuming interrupted nanosleep ...>`),
    /// a wait interrupted by a signal or by the attach, now resumed.
    Resumes(&'static str),
}

/// The first bytes of a buffer argument, stored inline (no allocation). A live tracer
/// stores the bytes themselves; the strace parser stores the quoted text as printed, C
/// escapes and all, because only a few consumers ever look inside (a client read's command
/// name, content sniffing of an unnamed file) and decoding every read and write line cost
/// the parser a seventh of its time. `head()` gives the bytes either way.
#[derive(Clone, Copy)]
pub struct Data {
    len: u8,
    form: Form,
    /// Only the first `len` bytes are ever written or read: zeroing the rest cost seven
    /// 16-byte stores on every read and write line.
    buf: [MaybeUninit<u8>; RAW_CAP],
}

/// How much of strace's quoted text a `Data` keeps: enough for `DATA_CAP` bytes of text
/// with the usual escapes (`\r\n`), and for a RESP command name even under `-xx`.
pub const RAW_CAP: usize = 112;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// The bytes themselves; `truncated` as the source said.
    Bytes { truncated: bool },
    /// strace text after the opening quote; `cut` when the line held more than `RAW_CAP`.
    Escaped { cut: bool },
}

/// `*extra = Extra::Data(d)`, without the out-of-line drop of the old value that the plain
/// assignment calls (on every read and write line) when the old value is `Extra::None`, as
/// it is on a call just built.
#[inline(always)]
fn put_empty(extra: &mut Extra, d: Data) {
    if matches!(extra, Extra::None) {
        // SAFETY: `extra` is a valid place borrowed exclusively; the value overwritten is
        // `Extra::None`, which owns nothing, so not dropping it leaks nothing.
        unsafe { std::ptr::write(extra, Extra::Data(d)) };
    } else {
        *extra = Extra::Data(d);
    }
}

/// `dst[..src.len()] = src` for a kept text (at most `RAW_CAP` bytes) as a few fixed-size,
/// possibly overlapping, 16-, 8- and 4-byte moves chosen by the length: a `memcpy` call (which
/// a plain loop is turned back into) cost as much as the copy of a ~60-byte text.
#[inline(always)]
fn copy_short(dst: &mut [MaybeUninit<u8>; RAW_CAP], src: &[u8]) {
    let n = src.len();
    assert!(n <= RAW_CAP);
    let d = dst.as_mut_ptr() as *mut u8;
    // SAFETY (all three): every move writes `dst[at..at + K]` from `src[at..at + K]` with
    // `at + K <= n <= RAW_CAP`, checked by the length tests that choose it; unaligned
    // stores of `[u8; K]` are allowed by `write_unaligned`.
    let c16 = |at: usize| unsafe {
        let v: [u8; 16] = src[at..at + 16].try_into().expect("16 bytes");
        std::ptr::write_unaligned(d.add(at) as *mut [u8; 16], v);
    };
    let c8 = |at: usize| unsafe {
        let v: [u8; 8] = src[at..at + 8].try_into().expect("8 bytes");
        std::ptr::write_unaligned(d.add(at) as *mut [u8; 8], v);
    };
    let c4 = |at: usize| unsafe {
        let v: [u8; 4] = src[at..at + 4].try_into().expect("4 bytes");
        std::ptr::write_unaligned(d.add(at) as *mut [u8; 4], v);
    };
    if n >= 16 {
        let mut i = 0;
        if n >= 64 {
            c16(0);
            c16(16);
            c16(32);
            c16(48);
            i = 64;
        }
        if n - i >= 32 {
            c16(i);
            c16(i + 16);
            i += 32;
        }
        if n - i >= 16 {
            c16(i);
            i += 16;
        }
        if i < n {
            c16(n - 16);
        }
        return;
    }
    if n >= 8 {
        c8(0);
        c8(n - 8);
    } else if n >= 4 {
        c4(0);
        c4(n - 4);
    } else {
        // Up to three bytes, one test each (a loop would be a `memcpy` call again).
        if n > 0 {
            dst[0] = MaybeUninit::new(src[0]);
        }
        if n > 1 {
            dst[1] = MaybeUninit::new(src[1]);
        }
        if n > 2 {
            dst[2] = MaybeUninit::new(src[2]);
        }
    }
}

/// The first `DATA_CAP` bytes of a buffer, decoded.
#[derive(Clone, Copy)]
pub struct Head {
    len: u8,
    /// The trace showed fewer bytes than the call transferred (`"..."...`).
    pub truncated: bool,
    buf: [u8; DATA_CAP],
}

impl Head {
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.truncated == other.truncated && self.bytes() == other.bytes()
    }
}

impl Data {
    pub fn new(bytes: &[u8], truncated: bool) -> Self {
        let truncated = truncated || bytes.len() > DATA_CAP;
        Self::keep(bytes, DATA_CAP, Form::Bytes { truncated })
    }
    /// From strace's text of a string argument, starting after its opening quote (the rest
    /// of the line may follow: decoding stops at the closing quote).
    pub fn escaped(text: &[u8]) -> Self {
        let cut = text.len() > RAW_CAP;
        Self::keep(text, RAW_CAP, Form::Escaped { cut })
    }
    /// `*extra = Extra::Data(Data::escaped(text))`, built where it is kept: the parser does
    /// this for every read and write line, and the ~120-byte value built on the stack was
    /// then copied into the event.
    #[inline(always)]
    pub fn put_escaped(extra: &mut Extra, text: &[u8]) {
        put_empty(
            extra,
            Data {
                len: 0,
                form: Form::Escaped { cut: false },
                buf: [MaybeUninit::uninit(); RAW_CAP],
            },
        );
        if let Extra::Data(d) = extra {
            let n = text.len().min(RAW_CAP);
            copy_short(&mut d.buf, &text[..n]);
            d.len = n as u8;
            d.form = Form::Escaped {
                cut: text.len() > RAW_CAP,
            };
        }
    }
    /// `*extra = Extra::Data(Data::new(bytes, truncated))`, built where it is kept: the
    /// live backends do this for every read and write (see `put_escaped`).
    #[inline(always)]
    pub fn put_bytes(extra: &mut Extra, bytes: &[u8], truncated: bool) {
        put_empty(
            extra,
            Data {
                len: 0,
                form: Form::Bytes { truncated: false },
                buf: [MaybeUninit::uninit(); RAW_CAP],
            },
        );
        if let Extra::Data(d) = extra {
            let n = bytes.len().min(DATA_CAP);
            copy_short(&mut d.buf, &bytes[..n]);
            d.len = n as u8;
            d.form = Form::Bytes {
                truncated: truncated || bytes.len() > DATA_CAP,
            };
        }
    }
    fn keep(bytes: &[u8], cap: usize, form: Form) -> Self {
        let n = bytes.len().min(cap);
        let mut buf = [MaybeUninit::uninit(); RAW_CAP];
        copy_short(&mut buf, &bytes[..n]);
        Data {
            len: n as u8,
            form,
            buf,
        }
    }
    /// The kept text (or bytes): the first `len` bytes, the only ones written.
    #[inline(always)]
    fn raw(&self) -> &[u8] {
        let n = (self.len as usize).min(RAW_CAP);
        // SAFETY: every constructor writes `buf[..len]` (`copy_short` of `len` bytes), and
        // `Data` is only ever changed whole.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const u8, n) }
    }
    /// What was kept, undecoded: strace's escaped text after its opening quote (`true`), or
    /// the bytes themselves (`false`, at most `DATA_CAP`), for a reader that decodes only
    /// as far as it reads (the analyzer's RESP walk); `head` decodes all of it.
    #[inline]
    pub fn kept(&self) -> (bool, &[u8]) {
        (matches!(self.form, Form::Escaped { .. }), self.raw())
    }
    /// The first `DATA_CAP` bytes, decoded.
    pub fn head(&self) -> Head {
        let mut h = Head {
            len: 0,
            truncated: false,
            buf: [0; DATA_CAP],
        };
        let raw = self.raw();
        match self.form {
            Form::Bytes { truncated } => {
                h.buf[..raw.len()].copy_from_slice(raw);
                h.len = raw.len() as u8;
                h.truncated = truncated;
            }
            Form::Escaped { cut } => {
                let (n, end) = decode_head(raw, &mut h.buf);
                h.len = n as u8;
                h.truncated = match end {
                    End::Cap => true,
                    // The string goes on past what was kept; or the line itself was cut off.
                    End::OutOfText => cut,
                    // `"...` says strace cut it; a kept text that ends too soon to show
                    // whether the marker follows counts as cut.
                    End::Quote(after) => {
                        let rest = &raw[after..];
                        rest.starts_with(b"...") || (cut && b"...".starts_with(rest))
                    }
                };
            }
        }
        h
    }
}

impl PartialEq for Data {
    fn eq(&self, other: &Self) -> bool {
        self.head() == other.head()
    }
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = self.head();
        write!(
            f,
            "Data({:?}{})",
            String::from_utf8_lossy(h.bytes()),
            if h.truncated { "..." } else { "" }
        )
    }
}

/// Where `decode_head` stopped.
enum End {
    /// `DATA_CAP` bytes decoded and more follow.
    Cap,
    /// At the closing quote; the index just after it.
    Quote(usize),
    /// The text ran out before the closing quote.
    OutOfText,
}

const ONES: u64 = u64::from_le_bytes([1; 8]);
const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);

/// High bit set in each byte of `x` that is a quote or a backslash. Exact for the lowest
/// such byte (the borrow of the zero-byte trick only spills upwards), which is all
/// `decode_head` reads.
#[inline]
fn quote_or_backslash(x: u64) -> u64 {
    let q = x ^ (ONES * b'"' as u64);
    let b = x ^ (ONES * b'\\' as u64);
    (q.wrapping_sub(ONES) & !q | b.wrapping_sub(ONES) & !b) & HIGHS
}

/// Unescapes the first `DATA_CAP` bytes of a C string literal as strace prints it (after
/// its opening quote) into `buf`. Runs of plain bytes are copied sixteen (SSE2) or eight
/// (SWAR) at a time, and RESP's `\r\n`, the commonest escape, is taken in one step: a
/// client request is mostly short runs between line ends, so the cost is per run.
fn decode_head(s: &[u8], buf: &mut [u8; DATA_CAP]) -> (usize, End) {
    let (mut n, mut i) = (0, 0);
    loop {
        // A run of plain bytes: store a whole block, keep what is plain.
        if n + 16 <= DATA_CAP && i + 16 <= s.len() {
            let (block, m) = block16(s, i);
            buf[n..n + 16].copy_from_slice(&block);
            if m == 0 {
                n += 16;
                i += 16;
                continue;
            }
            let k = m.trailing_zeros() as usize;
            n += k;
            i += k;
        } else {
            while n + 8 <= DATA_CAP && i + 8 <= s.len() {
                let x = u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"));
                // Store all 8, keep what is plain.
                buf[n..n + 8].copy_from_slice(&x.to_le_bytes());
                let m = quote_or_backslash(x);
                let k = if m == 0 {
                    8
                } else {
                    (m.trailing_zeros() / 8) as usize
                };
                n += k;
                i += k;
                if k < 8 {
                    break;
                }
            }
        }
        let Some(&b) = s.get(i) else {
            return (n, End::OutOfText);
        };
        // RESP's line end, the commonest escape pair, in one step.
        if s.get(i..i + 4) == Some(b"\\r\\n") && n + 2 <= DATA_CAP {
            buf[n] = b'\r';
            buf[n + 1] = b'\n';
            n += 2;
            i += 4;
            continue;
        }
        let (c, used) = match b {
            b'"' => return (n, End::Quote(i + 1)),
            b'\\' if s.get(i + 1) == Some(&b'r') => (b'\r', 2),
            b'\\' if s.get(i + 1) == Some(&b'n') => (b'\n', 2),
            _ => unescape_one(s, i),
        };
        if n == DATA_CAP {
            return (n, End::Cap);
        }
        buf[n] = c;
        n += 1;
        i += used;
    }
}

/// The sixteen bytes at `s[i..]` and the bit mask of those that are a quote or a backslash.
#[inline(always)]
fn block16(s: &[u8], i: usize) -> ([u8; 16], u32) {
    let block: [u8; 16] = s[i..i + 16].try_into().expect("16 bytes");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8,
        };
        // SAFETY: SSE2 is in the x86_64 baseline; the load reads the 16 bytes of `block`.
        let m = unsafe {
            let v = _mm_loadu_si128(block.as_ptr() as *const __m128i);
            let q = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let b = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            _mm_movemask_epi8(_mm_or_si128(q, b)) as u32
        };
        (block, m)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let m = block
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'"' || **b == b'\\')
            .fold(0u32, |m, (k, _)| m | 1 << k);
        (block, m)
    }
}

/// The byte that starts at `s[i]` of a C string literal as strace prints it (an escape
/// sequence or a plain byte) and how many bytes of text it took.
#[inline]
pub(crate) fn unescape_one(s: &[u8], i: usize) -> (u8, usize) {
    let b = s[i];
    if b != b'\\' || i + 1 == s.len() {
        return (b, 1);
    }
    match s[i + 1] {
        b'n' => (b'\n', 2),
        b'r' => (b'\r', 2),
        b't' => (b'\t', 2),
        b'v' => (0x0b, 2),
        b'f' => (0x0c, 2),
        b'a' => (0x07, 2),
        b'b' => (0x08, 2),
        b'e' => (0x1b, 2),
        b'x' => {
            let h = s[i + 2..]
                .iter()
                .take(2)
                .take_while(|b| b.is_ascii_hexdigit())
                .count();
            let v = s[i + 2..i + 2 + h]
                .iter()
                .fold(0u8, |a, d| a.wrapping_mul(16) | hex_val(*d));
            (if h == 0 { b'?' } else { v }, 2 + h)
        }
        b'0'..=b'7' => {
            let o = s[i + 1..]
                .iter()
                .take(3)
                .take_while(|b| (b'0'..=b'7').contains(b))
                .count();
            let v = s[i + 1..i + 1 + o]
                .iter()
                .fold(0u32, |a, d| a * 8 + (d - b'0') as u32);
            (v as u8, 1 + o)
        }
        c => (c, 2),
    }
}

fn hex_val(d: u8) -> u8 {
    match d {
        b'0'..=b'9' => d - b'0',
        b'a'..=b'f' => d - b'a' + 10,
        b'A'..=b'F' => d - b'A' + 10,
        _ => 0,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Syscall {
    pub name: &'static str,
    /// The syscall table's entry for `name`, looked up once when the call was made.
    pub sys: &'static SysInfo,
    /// The fd argument, for syscalls whose first argument is an fd.
    pub fd: Option<i32>,
    /// strace `-y` annotation of that fd (ground truth when present).
    pub fd_path: Option<Box<str>>,
    pub ret: Ret,
    /// strace `-y` annotation of a returned fd (`= 8</proc/8169/stat>`).
    pub ret_path: Option<Box<str>>,
    pub dur: Option<Nanos>,
    pub dur_src: DurSource,
    pub in_flight: Option<InFlight>,
    pub extra: Extra,
    /// Line of the entry half when the call was split (unfinished ... resumed).
    pub start_line: Option<u64>,
    /// What the scheduler did with the thread during the call and in the gap before it
    /// (live bpf backend only).
    pub sched: Option<Box<SchedSpan>>,
    /// A socket read: when the earliest data it returned was queued on the socket (live bpf
    /// backend on kernels with the `sock:sk_data_ready` tracepoint; None elsewhere).
    pub arrived: Option<Nanos>,
}

/// The scheduler's counters of one thread over a span of time: time on a CPU, time waiting
/// for one (runnable), and page faults. The rest of the span the thread was blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SchedDelta {
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    pub minor_faults: u64,
    pub major_faults: u64,
    /// Of the runnable time, the part the thread's cgroup was throttled (its CPU quota
    /// spent): None where the backend does not measure it.
    pub throttled_ns: Option<u64>,
    /// The time the thread spent reclaiming memory itself (its cgroup's limit, or the
    /// host short of free memory): exact where the backend measures it (bpf on the
    /// kernel's vmscan tracepoints), None elsewhere. It overlaps the other parts: a
    /// reclaim runs on a CPU and waits for writeback.
    pub reclaim_ns: Option<u64>,
}

/// `during`: from the call's entry to its exit; `before`: from the end of the thread's
/// previous call to this one's entry (the gap), when that call was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SchedSpan {
    pub during: SchedDelta,
    pub before: Option<SchedDelta>,
}

impl Syscall {
    /// A call by name (its table entry is looked up: parsers with a name cache use `with`).
    pub fn new(name: &'static str) -> Self {
        Self::with(name, crate::syscalls::info(name))
    }
    #[inline]
    pub fn with(name: &'static str, sys: &'static SysInfo) -> Self {
        Syscall {
            name,
            sys,
            fd: None,
            fd_path: None,
            ret: Ret::Unknown,
            ret_path: None,
            dur: None,
            dur_src: DurSource::Unknown,
            in_flight: None,
            extra: Extra::None,
            start_line: None,
            sched: None,
            arrived: None,
        }
    }
    pub fn data(&self) -> Option<&Data> {
        match &self.extra {
            Extra::Data(d) => Some(d),
            _ => None,
        }
    }
    /// The path argument, if the call names one.
    pub fn path(&self) -> Option<&str> {
        match &self.extra {
            Extra::Path(p) => Some(p),
            _ => None,
        }
    }
}

impl Event {
    /// Whether dropping this event frees anything. A batch of events that own nothing can
    /// be emptied without visiting each one (`run::pipelined`). Every field is named, so a
    /// new owning field cannot be forgotten here: it does not compile until it is sorted.
    #[inline]
    pub fn owns_heap(&self) -> bool {
        let Event {
            tid: _,
            ts: _,
            line: _,
            kind,
        } = self;
        match kind {
            EventKind::Syscall(Syscall {
                name: _,
                sys: _,
                fd: _,
                fd_path,
                ret: _,
                ret_path,
                dur: _,
                dur_src: _,
                in_flight: _,
                extra,
                start_line: _,
                sched,
                arrived: _,
            }) => {
                fd_path.is_some()
                    || ret_path.is_some()
                    || sched.is_some()
                    || match extra {
                        Extra::Path(_) | Extra::Rename(..) => true,
                        Extra::None
                        | Extra::FdPair(..)
                        | Extra::NewFd(_)
                        | Extra::DupFd
                        | Extra::CloseRange(..)
                        | Extra::Clone { .. }
                        | Extra::Socket(_)
                        | Extra::Data(_)
                        | Extra::Resumes(_)
                        | Extra::LockWait(_)
                        | Extra::Futex { .. } => false,
                    }
            }
            EventKind::ThreadName(_) | EventKind::Program(_) => true,
            EventKind::Signal { .. }
            | EventKind::Exit { .. }
            | EventKind::Attach { .. }
            | EventKind::Detach
            | EventKind::Unreadable => false,
        }
    }

    pub fn syscall(&self) -> Option<&Syscall> {
        match &self.kind {
            EventKind::Syscall(s) => Some(s),
            _ => None,
        }
    }
    /// End time: start plus duration when known.
    pub fn end(&self) -> Nanos {
        match &self.kind {
            EventKind::Syscall(s) => self.ts.saturating_add(s.dur.unwrap_or(0)),
            _ => self.ts,
        }
    }
}

/// Syscall, signal and errno names live for the whole run: interning them once lets every
/// event carry a `&'static str` instead of an owned copy. Names come from the syscall table
/// and a list of signals and errnos; anything else (other architectures, garbage) is leaked once, and only a
/// bounded number of distinct names is ever leaked so corrupt input cannot grow memory.
pub fn intern(name: &[u8]) -> &'static str {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<&'static [u8], &'static str>> =
        std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        crate::syscalls::names()
            .chain(crate::syscalls::OTHER_NAMES.iter().copied())
            .map(|k| (k.as_bytes(), k))
            .collect()
    });
    if let Some(s) = table.get(name) {
        return s;
    }
    static EXTRA: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut extra = EXTRA.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = extra.iter().find(|k| k.as_bytes() == name) {
        return s;
    }
    if extra.len() >= 4096 {
        return "?";
    }
    let s: &'static str = Box::leak(String::from_utf8_lossy(name).into_owned().into_boxed_str());
    extra.push(s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch whose events own nothing is emptied without dropping them one by one: an
    /// owning event taken for one that owns nothing would leak, so each owning field counts.
    #[test]
    fn owns_heap_sees_every_owning_field() {
        let call = |f: &dyn Fn(&mut Syscall)| {
            let mut sc = Syscall::new("read");
            f(&mut sc);
            Event {
                tid: 1,
                ts: 0,
                line: 1,
                kind: EventKind::Syscall(sc),
            }
        };
        let mut plain = Syscall::new("read");
        plain.fd = Some(8);
        Data::put_escaped(&mut plain.extra, b"*1\\r\\n$4\\r\\nPING\\r\\n");
        let plain = Event {
            tid: 1,
            ts: 0,
            line: 1,
            kind: EventKind::Syscall(plain),
        };
        assert!(!plain.owns_heap());
        assert!(!call(&|_| {}).owns_heap());
        assert!(call(&|sc| sc.fd_path = Some("/data/appendonly.aof".into())).owns_heap());
        assert!(call(&|sc| sc.ret_path = Some("/proc/1/stat".into())).owns_heap());
        assert!(call(&|sc| sc.extra = Extra::Path("/tmp/x".into())).owns_heap());
        assert!(call(&|sc| sc.extra = Extra::Rename("a".into(), "b".into())).owns_heap());
        assert!(call(&|sc| sc.sched = Some(Box::default())).owns_heap());
        let named = Event {
            tid: 1,
            ts: 0,
            line: 1,
            kind: EventKind::ThreadName("bio_aof".into()),
        };
        assert!(named.owns_heap());
        for kind in [EventKind::Detach, EventKind::Unreadable] {
            let ev = Event {
                tid: 1,
                ts: 0,
                line: 1,
                kind,
            };
            assert!(!ev.owns_heap());
        }
    }

    /// Every batch of events is written by the parser and read back by the analyzer on the
    /// other core: its size is the pipeline's memory traffic per line. A bound, so that
    /// growth is a decision (the figure is in bench/PROFILE.md).
    #[test]
    fn event_size_is_bounded() {
        let n = std::mem::size_of::<Event>();
        eprintln!(
            "size_of::<Event>() = {n}, Syscall {}, Extra {}, Data {}",
            std::mem::size_of::<Syscall>(),
            std::mem::size_of::<Extra>(),
            std::mem::size_of::<Data>()
        );
        assert!(n <= 296, "size_of::<Event>() = {n}");
    }

    #[test]
    fn intern_returns_same_static_for_known_and_unknown() {
        assert_eq!(intern(b"fdatasync"), "fdatasync");
        let a = intern(b"mmap2");
        let b = intern(b"mmap2");
        assert!(std::ptr::eq(a, b));
    }

    #[test]
    fn data_keeps_prefix_and_marks_truncation() {
        let d = Data::new(&[b'x'; 100], false).head();
        assert_eq!(d.bytes().len(), DATA_CAP);
        assert!(d.truncated);
        let d = Data::new(b"*1\r\n", false).head();
        assert_eq!(d.bytes(), b"*1\r\n");
        assert!(!d.truncated);
    }

    /// strace's text, kept as printed, decodes to the same head as the bytes themselves.
    #[test]
    fn escaped_text_decodes_on_demand() {
        let head = |t: &[u8]| {
            let h = Data::escaped(t).head();
            (String::from_utf8_lossy(h.bytes()).into_owned(), h.truncated)
        };
        let s = |x: &str| x.to_string();
        // Whole string, rest of the line after it.
        assert_eq!(
            head(br#"*1\r\n$4\r\nPING\r\n", 14) = 14"#),
            (s("*1\r\n$4\r\nPING\r\n"), false)
        );
        // strace's own cut marker.
        assert_eq!(
            head(br#"abcdefghij"..., 16384) = 61"#),
            (s("abcdefghij"), true)
        );
        // A quote, backslash and octal/hex escapes inside an 8-byte run.
        assert_eq!(
            head(br#"ab\"c\\d\0\x41\177", 9) = 9"#),
            (s("ab\"c\\d\0A\u{7f}"), false)
        );
        // Past DATA_CAP bytes: the head is full and marked truncated.
        let long = [b'x'; 60];
        let mut t = long.to_vec();
        t.extend_from_slice(b"\", 60) = 60");
        let (h, tr) = head(&t);
        assert_eq!((h.len(), tr), (DATA_CAP, true));
        // Exactly DATA_CAP bytes then the closing quote: not truncated.
        let mut t = vec![b'y'; DATA_CAP];
        t.extend_from_slice(b"\", 48) = 48");
        assert_eq!(head(&t), (s(&"y".repeat(DATA_CAP)), false));
        // More text than is kept (all escapes, as under -xx): what fits, and truncated.
        let t = b"\\x41".repeat(60);
        let (h, tr) = head(&t);
        assert_eq!((h, tr), (s(&"A".repeat(RAW_CAP / 4)), true));
        // A line cut off inside the string (not more than is kept): not known to be longer.
        assert_eq!(head(b"abc"), (s("abc"), false));
        // A kept text that ends right after the closing quote cannot show the marker.
        let mut t = b"\\x41".repeat(27);
        t.extend_from_slice(b"zzz\"...");
        assert_eq!(t.iter().position(|b| *b == b'"'), Some(RAW_CAP - 1));
        assert_eq!(head(&t), (s(&format!("{}zzz", "A".repeat(27))), true));
        // A line end pair that straddles the cap: the first byte fits, then truncated.
        let mut t = vec![b'x'; DATA_CAP - 1];
        t.extend_from_slice(br#"\r\n", 50) = 50"#);
        assert_eq!(head(&t), (format!("{}\r", "x".repeat(DATA_CAP - 1)), true));
        let mut t = vec![b'x'; DATA_CAP - 2];
        t.extend_from_slice(br#"\r\n", 48) = 48"#);
        assert_eq!(
            head(&t),
            (format!("{}\r\n", "x".repeat(DATA_CAP - 2)), false)
        );
        // A backslash as the last byte is itself.
        assert_eq!(head(b"a\\"), (s("a\\"), false));
        // Built in place, the same value as built and moved, at every length the copy
        // distinguishes.
        let texts: Vec<Vec<u8>> = (0..=RAW_CAP + 2)
            .map(|n| (0..n).map(|i| b'a' + (i % 26) as u8).collect())
            .chain([b"abc\", 1) = 1".to_vec(), vec![b'x'; 200]])
            .collect();
        for t in texts.iter().map(|t| &t[..]) {
            let mut e = Extra::Path("p".into());
            Data::put_escaped(&mut e, t);
            assert_eq!(e, Extra::Data(Data::escaped(t)));
            let (Extra::Data(a), b) = (e, Data::escaped(t)) else {
                unreachable!()
            };
            assert!(a.len == b.len && a.form == b.form && a.raw() == b.raw());
        }
    }
}
