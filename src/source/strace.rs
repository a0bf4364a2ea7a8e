//! strace text -> `Event`s: the first stage of the offline pipeline and its hot path.
//!
//! `parse_line` splits one physical line into prefix (pid, timestamp) and body (call,
//! unfinished half, resumed half, signal, exit, strace's own message) without allocating;
//! `StraceParser` then keeps the per-thread state that the grammar needs: unfinished halves
//! waiting for their resumed half, a line split by strace's own "Process N attached" message,
//! the clock (midnight rollover under -t/-tt, accumulation under -r), and turns body parts into
//! events. Every line read is either used or skipped with a reason, never lost.

use crate::event::{
    self, unescape_one, Data, DurSource, Event, EventKind, Extra, InFlight, Nanos, Ret, Syscall,
    Tid,
};
use memchr::{memchr, memmem, memrchr};

/// How timestamps are written at the start of each line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeFmt {
    /// No timestamps.
    None,
    /// `-t`: HH:MM:SS
    TimeOfDay,
    /// `-tt`: HH:MM:SS.frac
    TimeOfDayFrac,
    /// `-ttt` / `--timestamps=unix,...`: seconds since the epoch
    Epoch,
    /// `-r`: seconds since the previous line
    Relative,
}

/// What the prefix of a line says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prefix {
    pub pid: Option<Tid>,
    /// Parsed timestamp in ns: epoch ns, ns since midnight, or a relative delta.
    pub time: Option<Nanos>,
    pub fmt: TimeFmt,
    /// Fraction digits of the timestamp (for printing times back as the trace did).
    pub frac_digits: u8,
    /// `-Y` (`--decode-pids=comm`): where the thread's name sits in the line, `N<name>`.
    pub comm: Option<(usize, usize)>,
}

/// The body of one line.
#[derive(Debug, PartialEq)]
pub enum Body<'a> {
    /// `name(args) = ret ...` (`args` excludes the closing paren)
    Call {
        name: &'a [u8],
        args: &'a [u8],
        tail: Tail<'a>,
    },
    /// `name(args <unfinished ...>`
    Unfinished {
        name: &'a [u8],
        args: &'a [u8],
    },
    /// `<... name resumed>rest) = ret` (`tail` None when the resumed half is unfinished again)
    Resumed {
        name: &'a [u8],
        rest: &'a [u8],
        tail: Option<Tail<'a>>,
    },
    /// `name(args <detached ...>`: strace let go while the call was running.
    Detached {
        name: &'a [u8],
        args: &'a [u8],
    },
    Signal {
        name: &'a [u8],
        si_pid: Option<u32>,
    },
    Exit {
        code: Option<i32>,
        signal: Option<&'a [u8]>,
    },
    /// `strace: Process N attached [with K threads]`
    Attached {
        pid: u32,
        threads: Option<u32>,
    },
    /// `strace: Process N detached`
    DetachedMsg {
        pid: u32,
    },
    /// Lines that are strace output but carry no event: other `strace:` messages, `-k`
    /// stack frames, `-e write=` hex dumps, tips.
    Noise,
}

/// What follows ` = ` at the end of a finished call.
#[derive(Debug, PartialEq, Clone, Copy)]
pub struct Tail<'a> {
    pub ret: Ret,
    /// `-y` annotation on a returned fd.
    pub ret_path: Option<&'a [u8]>,
    pub dur: Option<Nanos>,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum SkipReason {
    Empty,
    NoSyscall,
    BadReturn,
    ResumedWithoutName,
    TooLong,
    CutOff,
    BadTimestamp,
}

impl SkipReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            SkipReason::Empty => "empty line",
            SkipReason::NoSyscall => "not a syscall, signal, exit or strace message",
            SkipReason::BadReturn => "syscall line with an unreadable return value",
            SkipReason::ResumedWithoutName => "resumed line without a syscall name",
            SkipReason::TooLong => "line longer than the limit",
            SkipReason::CutOff => "cut-off line (no result, no <unfinished ...>)",
            SkipReason::BadTimestamp => "timestamp does not match the trace's format",
        }
    }
}

/// Interned names with the per-name facts the hot path asks for, kept in a `NameCache`:
/// `event::intern` hashes with SipHash behind a lock, and the `first_arg_is_fd` /
/// `has_data_arg` matches compare strings, both too slow per line.
#[derive(Clone, Copy)]
pub struct Name {
    pub name: &'static str,
    pub fd_first: bool,
    args: ArgKind,
}

/// Which arguments `extract_args` takes from a call, decided once per name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ArgKind {
    /// The path is the first argument (open, unlink, stat...).
    Path0,
    /// The path follows a dirfd (openat, unlinkat, newfstatat...).
    Path1,
    Rename,
    RenameAt,
    Pipe,
    Socketpair,
    Dup2,
    Fcntl,
    CloseRange,
    Clone,
    Socket,
    /// A buffer argument after the fd (read, write, sendto...).
    Data,
    Nothing,
}

fn arg_kind(name: &str) -> ArgKind {
    match name {
        "open" | "creat" | "unlink" | "stat" | "lstat" | "access" | "mkdir" | "rmdir"
        | "truncate" | "chdir" | "readlink" => ArgKind::Path0,
        "openat" | "unlinkat" | "newfstatat" | "statx" | "mkdirat" | "faccessat" | "faccessat2"
        | "readlinkat" | "openat2" => ArgKind::Path1,
        "rename" => ArgKind::Rename,
        "renameat" | "renameat2" => ArgKind::RenameAt,
        "pipe" | "pipe2" => ArgKind::Pipe,
        "socketpair" => ArgKind::Socketpair,
        "dup2" | "dup3" => ArgKind::Dup2,
        "fcntl" | "fcntl64" => ArgKind::Fcntl,
        "close_range" => ArgKind::CloseRange,
        "clone" | "clone3" | "fork" | "vfork" | "clone2" => ArgKind::Clone,
        "socket" => ArgKind::Socket,
        _ if event::has_data_arg(name) => ArgKind::Data,
        _ => ArgKind::Nothing,
    }
}

const NAME_SLOTS: usize = 256;

/// A small direct-mapped cache of `Name`s. The parser owns one for syscall names (no
/// thread-local access per line); free functions share a per-thread one.
pub struct NameCache(Box<[Option<Name>; NAME_SLOTS]>);

impl Default for NameCache {
    fn default() -> Self {
        NameCache(Box::new([None; NAME_SLOTS]))
    }
}

impl NameCache {
    #[inline]
    pub fn get(&mut self, b: &[u8]) -> Name {
        let slot = match b {
            [] => 0,
            [f, .., l] => (b.len() * 31 + *f as usize * 7 + *l as usize * 3) % NAME_SLOTS,
            [f] => *f as usize % NAME_SLOTS,
        };
        if let Some(n) = self.0[slot] {
            if n.name.as_bytes() == b {
                return n;
            }
        }
        let s = event::intern(b);
        let n = Name {
            name: s,
            fd_first: event::first_arg_is_fd(s),
            args: arg_kind(s),
        };
        // `intern` maps garbage to "?" once its table is full: do not let that evict.
        if s.as_bytes() == b {
            self.0[slot] = Some(n);
        }
        n
    }
}

thread_local! {
    static NAMES: std::cell::RefCell<NameCache> = std::cell::RefCell::new(NameCache::default());
}

/// `event::intern` through the per-thread cache.
pub fn name(b: &[u8]) -> Name {
    NAMES.with(|c| c.borrow_mut().get(b))
}

/// Interned name (syscall, errno, signal) through the per-thread cache.
pub fn intern(b: &[u8]) -> &'static str {
    name(b).name
}

fn splice_finder() -> &'static memmem::Finder<'static> {
    static F: std::sync::OnceLock<memmem::Finder<'static>> = std::sync::OnceLock::new();
    F.get_or_init(|| memmem::Finder::new(b"strace: Process "))
}

fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| **b == b' ' || **b == b'\t').count();
    &s[n..]
}

fn trim_end(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .rev()
        .take_while(|b| matches!(**b, b' ' | b'\t' | b'\r'))
        .count();
    &s[..s.len() - n]
}

fn parse_u64(s: &[u8]) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    let mut i = 0;
    // 19 digits always fit in a u64: no overflow checks in the loop (this runs several
    // times per line); longer numbers take the checked path.
    let fast = s.len().min(19);
    while i < fast {
        let d = s[i].wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        v = v * 10 + d as u64;
        i += 1;
    }
    while i < s.len() && is_digit(s[i]) {
        v = v.checked_mul(10)?.checked_add((s[i] - b'0') as u64)?;
        i += 1;
    }
    if i == 0 {
        None
    } else {
        Some((v, i))
    }
}

const POW10: [i64; 10] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
];

/// `123.456789` -> (ns, digits after the point, bytes used). Any number of fraction digits.
fn parse_decimal_ns(s: &[u8]) -> Option<(i64, u8, usize)> {
    let (whole, n) = parse_u64(s)?;
    let mut ns = (whole as i64).checked_mul(1_000_000_000)?;
    if s.get(n) != Some(&b'.') {
        return Some((ns, 0, n));
    }
    let mut i = n + 1;
    let mut frac: i64 = 0;
    let mut digits = 0u8;
    while i < s.len() && is_digit(s[i]) {
        // Digits past ns precision are read and dropped.
        if digits < 9 {
            frac = frac * 10 + (s[i] - b'0') as i64;
        }
        digits = digits.saturating_add(1);
        i += 1;
    }
    if digits < 9 {
        frac *= POW10[9 - digits as usize];
    }
    ns += frac;
    if digits == 0 {
        return None;
    }
    Some((ns, digits, i))
}

/// `HH:MM:SS[.frac]` -> (ns since midnight, frac digits, bytes used)
fn parse_tod(s: &[u8]) -> Option<(i64, u8, usize)> {
    if s.len() < 8 || s[2] != b':' || s[5] != b':' {
        return None;
    }
    let two = |a: u8, b: u8| -> Option<i64> {
        if is_digit(a) && is_digit(b) {
            Some(((a - b'0') * 10 + (b - b'0')) as i64)
        } else {
            None
        }
    };
    let h = two(s[0], s[1])?;
    let m = two(s[3], s[4])?;
    let (sec, digits, n) = parse_decimal_ns(&s[6..])?;
    if h > 23 || m > 59 || sec >= 61_000_000_000 {
        return None;
    }
    Some(((h * 3600 + m * 60) * 1_000_000_000 + sec, digits, 6 + n))
}

/// Largest pid Linux can hand out (PID_MAX_LIMIT): a bare integer above it is a timestamp.
const PID_MAX: u64 = 4_194_304;

/// Digits at fixed positions -> value, or None if any is not a digit. Up to eight digits are
/// read as one word (SWAR): the `-ttt` and `-T` fields are read this way on every line.
#[inline]
fn fixed_digits<const N: usize>(d: &[u8; N]) -> Option<u64> {
    if N <= 8 {
        // Left-pad with '0' to a whole word.
        let mut w = [b'0'; 8];
        w[8 - N..].copy_from_slice(d);
        return eight_digits(u64::from_le_bytes(w));
    }
    let mut v = 0u64;
    let mut bad = 0u8;
    for &b in d {
        let x = b.wrapping_sub(b'0');
        bad |= (x > 9) as u8;
        v = v * 10 + x as u64;
    }
    (bad == 0).then_some(v)
}

/// Eight ASCII digits in a little-endian word -> their value: checked all digits, then
/// combined pairwise (1+1 -> 2 -> 4 -> 8 digits) with three multiplications.
#[inline]
fn eight_digits(w: u64) -> Option<u64> {
    const HIGH_NIBBLES: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    let digits = (w & HIGH_NIBBLES) | ((w.wrapping_add(0x0606_0606_0606_0606) & HIGH_NIBBLES) >> 4);
    if digits != 0x3333_3333_3333_3333 {
        return None;
    }
    let v = w - 0x3030_3030_3030_3030;
    // Each byte pair: 10 * first + second, in the low byte of each 16-bit lane.
    let v = (v * 10 + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    // Each 32-bit lane: 100 * first pair + second pair.
    let v = (v * 100 + (v >> 16)) & 0x0000_FFFF_0000_FFFF;
    // The two lanes: 10000 * first + second.
    Some((v * 10000 + (v >> 32)) & 0xFFFF_FFFF)
}

/// The `-ttt` shape with no pid column, `1796078610.545264 name(...`: the commonest saved
/// form, read without the general prefix machinery (which handles it too, slower).
#[inline]
fn epoch_usec_prefix(line: &[u8]) -> Option<(Prefix, &[u8])> {
    let head: &[u8; 18] = line.get(..18)?.try_into().ok()?;
    if head[10] != b'.' || head[17] != b' ' {
        return None;
    }
    let secs = fixed_digits::<2>(head[..2].try_into().ok()?)? * 100_000_000
        + eight_digits(u64::from_le_bytes(head[2..10].try_into().ok()?))?;
    let usec = fixed_digits::<6>(head[11..17].try_into().ok()?)?;
    // Past 2262 the ns clock overflows: the general path refuses such times.
    if secs > (i64::MAX / 1_000_000_000 - 1) as u64 {
        return None;
    }
    let p = Prefix {
        pid: None,
        time: Some(secs as i64 * 1_000_000_000 + usec as i64 * 1_000),
        fmt: TimeFmt::Epoch,
        frac_digits: 6,
        comm: None,
    };
    Some((p, skip_extras(skip_ws(&line[17..]))))
}

/// The `-f -tt` shapes, `[pid  7313] 22:37:40.811837 name(...` and `9380  22:38:54.938004
/// name(...`: a pid, then `HH:MM:SS.ffffff ` read at fixed positions.
#[inline]
fn pid_tod_usec_prefix(line: &[u8]) -> Option<(Prefix, &[u8])> {
    let (pid, rest) = if let Some(r) = line.strip_prefix(b"[pid ") {
        let r = skip_ws(r);
        let (v, n) = parse_u64(r)?;
        (v, r.get(n..)?.strip_prefix(b"]")?)
    } else {
        let (v, n) = parse_u64(line)?;
        if !matches!(line.get(n), Some(b' ')) {
            return None;
        }
        (v, &line[n..])
    };
    if pid > PID_MAX {
        return None;
    }
    let t = skip_ws(rest);
    let head: &[u8; 16] = t.get(..16)?.try_into().ok()?;
    if head[2] != b':' || head[5] != b':' || head[8] != b'.' || head[15] != b' ' {
        return None;
    }
    let h = fixed_digits::<2>(head[0..2].try_into().ok()?)?;
    let m = fixed_digits::<2>(head[3..5].try_into().ok()?)?;
    let sec = fixed_digits::<2>(head[6..8].try_into().ok()?)?;
    let us = fixed_digits::<6>(head[9..15].try_into().ok()?)?;
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let p = Prefix {
        pid: Some(pid as Tid),
        time: Some(((h * 3600 + m * 60 + sec) * 1_000_000_000 + us * 1_000) as i64),
        fmt: TimeFmt::TimeOfDayFrac,
        frac_digits: 6,
        comm: None,
    };
    Some((p, skip_extras(skip_ws(&t[15..]))))
}

/// Splits the `[pid N] ` / `N ` prefix and the timestamp off a line.
pub fn parse_prefix(line: &[u8]) -> (Prefix, &[u8]) {
    if let Some(fast) = epoch_usec_prefix(line) {
        return fast;
    }
    if let Some(fast) = pid_tod_usec_prefix(line) {
        return fast;
    }
    let mut p = Prefix {
        pid: None,
        time: None,
        fmt: TimeFmt::None,
        frac_digits: 0,
        comm: None,
    };
    let mut s = line;
    // `-Y`: the pid is followed by `<comm>`; the name ends at the first `>` that closes the
    // column (`>]` or `> `), since a thread name may itself contain `>`.
    let comm_after = |t: &[u8], n: usize, end: &[u8]| -> Option<(usize, usize)> {
        if t.get(n) != Some(&b'<') {
            return None;
        }
        let rest = &t[n + 1..t.len().min(n + 1 + 64)];
        let close = memchr::memmem::find(rest, end)?;
        let start = t.as_ptr() as usize - line.as_ptr() as usize + n + 1;
        Some((start, start + close))
    };
    if s.starts_with(b"[pid ") {
        let t = skip_ws(&s[5..]);
        if let Some((v, n)) = parse_u64(t) {
            if t.get(n) == Some(&b']') {
                p.pid = Some(v as Tid);
                s = skip_ws(&t[n + 1..]);
            } else if let Some((a, b)) = comm_after(t, n, b">]") {
                p.pid = Some(v as Tid);
                p.comm = Some((a, b));
                s = skip_ws(&line[b + 2..]);
            }
        }
    } else if let Some((v, n)) = parse_u64(s) {
        // A bare pid column (`-o FILE -f`) is an integer followed by blanks; a -ttt or -r
        // timestamp has a point, a -t time a colon, a unix,s timestamp is above PID_MAX.
        if v <= PID_MAX && matches!(s.get(n), Some(b' ') | Some(b'\t')) {
            p.pid = Some(v as Tid);
            s = skip_ws(&s[n..]);
        } else if v <= PID_MAX {
            if let Some((a, b)) = comm_after(s, n, b"> ") {
                p.pid = Some(v as Tid);
                p.comm = Some((a, b));
                s = skip_ws(&line[b + 1..]);
            }
        }
    }
    // `--secontext`: `[unconfined_t]` (or a full `[user:role:type:level]`) after the pid.
    if s.first() == Some(&b'[') && !s.starts_with(b"[pid ") {
        if let Some(close) = memchr(b']', &s[..s.len().min(256)]) {
            if close > 1 && !s[1..close].iter().any(|b| b.is_ascii_whitespace()) {
                s = skip_ws(&s[close + 1..]);
            }
        }
    }
    let t = skip_ws(s);
    if let Some((ns, digits, n)) = parse_tod(t) {
        if matches!(t.get(n), Some(b' ')) {
            p.time = Some(ns);
            p.frac_digits = digits;
            p.fmt = if digits > 0 {
                TimeFmt::TimeOfDayFrac
            } else {
                TimeFmt::TimeOfDay
            };
            s = &t[n..];
        }
    } else if let Some((ns, digits, n)) = parse_decimal_ns(t) {
        if matches!(t.get(n), Some(b' ')) {
            let leading_blank =
                t.len() != s.len() || (p.pid.is_none() && s.as_ptr() != line.as_ptr());
            // -r is right-aligned (leading blanks) and small; epoch seconds are large.
            if ns >= 100_000_000 * 1_000_000_000
                || (digits == 0 && ns as u64 > PID_MAX * 1_000_000_000)
            {
                p.fmt = TimeFmt::Epoch;
            } else if digits > 0 || leading_blank {
                p.fmt = TimeFmt::Relative;
            }
            if p.fmt != TimeFmt::None {
                p.time = Some(ns);
                p.frac_digits = digits;
                s = &t[n..];
            }
        }
    }
    s = skip_ws(s);
    // `-tt -r` combined: `20:37:49.050065 (+     0.000012) name(...)`
    if s.starts_with(b"(+") {
        if let Some(close) = memchr(b')', s) {
            s = skip_ws(&s[close + 1..]);
        }
    }
    (p, skip_extras(s))
}

/// Skips what `-i` (`[00007f4b6d52af16] `, the instruction pointer) and `-n` (`[ 219] `,
/// the syscall number) print between the timestamp and the call.
#[inline]
fn skip_extras(mut s: &[u8]) -> &[u8] {
    while s.first() == Some(&b'[') {
        let Some(close) = memchr(b']', &s[..s.len().min(24)]) else {
            break;
        };
        let inner = &s[1..close];
        let ip = !inner.is_empty() && inner.iter().all(u8::is_ascii_hexdigit);
        let nr = inner.iter().any(u8::is_ascii_digit)
            && inner.iter().all(|b| b.is_ascii_digit() || *b == b' ');
        if !(ip || nr) || s.get(close + 1) != Some(&b' ') {
            break;
        }
        s = skip_ws(&s[close + 1..]);
    }
    s
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `<DUR>` at the very end of a line -> ns. Any precision (6 digits default, 9 with ns).
fn parse_dur(s: &[u8]) -> (Option<Nanos>, &[u8]) {
    let s = trim_end(s);
    // The default `-T` shape, `<0.000071>`, read at fixed positions.
    if s.len() >= 10 {
        let t: &[u8; 10] = s[s.len() - 10..].try_into().expect("10 bytes");
        if t[0] == b'<' && t[2] == b'.' && t[9] == b'>' {
            if let (Some(sec), Some(us)) = (
                fixed_digits::<1>(&[t[1]]),
                fixed_digits::<6>(t[3..9].try_into().expect("6 bytes")),
            ) {
                return (
                    Some(sec as i64 * 1_000_000_000 + us as i64 * 1_000),
                    trim_end(&s[..s.len() - 10]),
                );
            }
        }
    }
    if s.last() == Some(&b'>') {
        if let Some(open) = memrchr(b'<', s) {
            let inner = &s[open + 1..s.len() - 1];
            if let Some((ns, _, n)) = parse_decimal_ns(inner) {
                if n == inner.len() {
                    return (Some(ns), trim_end(&s[..open]));
                }
            }
            if inner == b"unavailable" {
                return (None, trim_end(&s[..open]));
            }
        }
    }
    (None, s)
}

/// An fd annotation `<...>` at the start of `s` (the `>` that closes it is the first one
/// followed by a delimiter, since `-yy` socket text itself contains `->`).
fn annotation(s: &[u8]) -> Option<(&[u8], usize)> {
    if s.first() != Some(&b'<') {
        return None;
    }
    let mut i = 1;
    while let Some(off) = memchr(b'>', &s[i..]) {
        let at = i + off;
        match s.get(at + 1) {
            None | Some(b',') | Some(b')') | Some(b' ') | Some(b'\t') => {
                return Some((&s[1..at], at + 1))
            }
            _ => i = at + 1,
        }
    }
    None
}

/// Parses what follows ` = `: `RET [ERRNO (text)] [(text)] [<DUR>]`.
pub fn parse_tail(s: &[u8]) -> Option<Tail<'_>> {
    let (dur, s) = parse_dur(s);
    let s = skip_ws(s);
    let mut t = Tail {
        ret: Ret::Unknown,
        ret_path: None,
        dur,
    };
    let rest;
    if let Some(r) = s.strip_prefix(b"?") {
        rest = r;
    } else {
        let (neg, body) = match s.first() {
            Some(b'-') => (true, &s[1..]),
            _ => (false, s),
        };
        let (v, n) = if body.starts_with(b"0x") {
            let hex = &body[2..];
            let n = hex.iter().take_while(|b| b.is_ascii_hexdigit()).count();
            if n == 0 {
                return None;
            }
            (
                u64::from_str_radix(std::str::from_utf8(&hex[..n]).ok()?, 16).ok()?,
                n + 2,
            )
        } else {
            parse_u64(body)?
        };
        let v = v as i64;
        t.ret = Ret::Val(if neg { -v } else { v });
        let mut r = &body[n..];
        if let Some((path, used)) = annotation(r) {
            t.ret_path = Some(path);
            r = &r[used..];
        }
        rest = r;
    }
    let rest = skip_ws(rest);
    if rest.first() == Some(&b'E') {
        let n = rest
            .iter()
            .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || **b == b'_')
            .count();
        t.ret = Ret::Err(intern(&rest[..n]));
    }
    Some(t)
}

/// Whether the `)` at `i` closes an argument list: it is followed by blanks and `= ` (strace
/// pads the result column without -T: `fdatasync(7)            = 0`).
fn closes_at(args: &[u8], i: usize) -> bool {
    let mut j = i + 1;
    while j < args.len() && args[j] == b' ' {
        j += 1;
    }
    j > i + 1 && args[j..].starts_with(b"= ")
}

/// What follows the `=` after the closing `)` at `close` (which `closes_at`).
fn after_eq(args: &[u8], close: usize) -> &[u8] {
    match memchr(b'=', &args[close..]) {
        Some(off) => &args[close + off + 1..],
        None => &[],
    }
}

/// The last `)` before `end` that `closes_at`, ignoring quotes.
fn last_close_before(args: &[u8], mut end: usize) -> Option<usize> {
    loop {
        // The last ` = ` before `end`, found from its `=` (a short backward scan; a general
        // substring search costs more to set up than the scan itself).
        let mut eq = None;
        let mut e = end;
        while let Some(i) = memrchr(b'=', &args[..e]) {
            if i > 0 && args[i - 1] == b' ' && args.get(i + 1) == Some(&b' ') && i + 1 < end {
                eq = Some(i - 1);
                break;
            }
            e = i;
        }
        let eq = eq?;
        let mut k = eq;
        while k > 0 && args[k] == b' ' {
            k -= 1;
        }
        if args[k] == b')' {
            return Some(k);
        }
        // An earlier ` = ` may end at `eq`'s blank (` = = `), so keep it in the window.
        end = eq + 1;
    }
}

/// Whether the end of `s` lies outside any quoted string: quotes counted sixteen bytes at a
/// time with SSE2 (part of every x86_64). A quote right after a backslash (escaped, or after
/// an escaped backslash) sends the string to the exact byte-wise count. This runs on every
/// line with a string argument, where memchr's per-call setup cost more than the scan.
#[cfg(target_arch = "x86_64")]
fn outside_strings(s: &[u8]) -> bool {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    };
    // Quote and backslash bit masks of the 16 bytes at `at`.
    let masks = |at: usize| -> (u32, u32) {
        debug_assert!(at + 16 <= s.len());
        // SAFETY: SSE2 is in the x86_64 baseline, and every caller keeps `at + 16 <= s.len()`,
        // so the unaligned 16-byte load stays inside `s`.
        unsafe {
            let v = _mm_loadu_si128(s.as_ptr().add(at) as *const __m128i);
            (
                _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8))) as u32,
                _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8))) as u32,
            )
        }
    };
    if s.len() < 16 {
        return outside_strings_exact(s);
    }
    // Only the parity of the count matters, and count_ones(a) + count_ones(b) has the parity
    // of count_ones(a ^ b): one popcount at the end (software on baseline x86_64).
    let mut quotes = 0u32;
    // Whether the byte before the current block is a backslash.
    let mut carry = 0u32;
    let mut i = 0;
    loop {
        let (q, b) = if i + 16 <= s.len() {
            masks(i)
        } else if i < s.len() {
            // The last bytes: the final 16 of `s`, less those already counted.
            let done = 16 - (s.len() - i) as u32;
            let (q, b) = masks(s.len() - 16);
            (q >> done, b >> done)
        } else {
            break;
        };
        if ((b << 1) | carry) & q != 0 {
            return outside_strings_exact(s);
        }
        carry = (b >> 15) & 1;
        quotes ^= q;
        i += 16;
    }
    quotes.count_ones() % 2 == 0
}

#[cfg(not(target_arch = "x86_64"))]
fn outside_strings(s: &[u8]) -> bool {
    outside_strings_exact(s)
}

/// `outside_strings`, byte by byte: a quote counts unless an odd run of backslashes
/// precedes it.
fn outside_strings_exact(s: &[u8]) -> bool {
    let mut open = false;
    for q in memchr::memchr_iter(b'"', s) {
        let bs = s[..q].iter().rev().take_while(|b| **b == b'\\').count();
        if bs % 2 == 0 {
            open = !open;
        }
    }
    !open
}

/// Index of the `)` that closes the argument list of a finished call: the last `)` followed
/// by ` = ` that is outside quotes. Strings can hold anything (and a cut-off line may end
/// inside one), so when a quote precedes the candidate, quotes are tracked from the start.
fn find_close(args: &[u8]) -> Option<usize> {
    let cand = last_close_before(args, args.len())?;
    // Fast path: the candidate is outside strings when the quotes before it pair up
    // (strace escapes a quote inside a string, so a real quote is one preceded by an even
    // run of backslashes). Only a line cut off inside a string needs the full scan.
    if outside_strings(&args[..cand]) {
        return Some(cand);
    }
    let mut in_str = false;
    let mut i = 0;
    let mut last = None;
    while i < args.len() {
        if in_str {
            match memchr::memchr2(b'"', b'\\', &args[i..]) {
                Some(off) => {
                    i += off;
                    if args[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    in_str = false;
                    i += 1;
                }
                None => break,
            }
        } else {
            match memchr::memchr2(b'"', b')', &args[i..]) {
                Some(off) => {
                    i += off;
                    if args[i] == b'"' {
                        in_str = true;
                    } else if closes_at(args, i) {
                        last = Some(i);
                    }
                    i += 1;
                }
                None => break,
            }
        }
    }
    last
}

/// Classifies the body of a line (after the prefix).
pub fn parse_body(s: &[u8]) -> Result<Body<'_>, SkipReason> {
    let s = trim_end(s);
    if s.is_empty() {
        return Err(SkipReason::Empty);
    }
    match s[0] {
        b'<' => {
            if let Some(r) = s.strip_prefix(b"<... ") {
                let n = r.iter().take_while(|b| is_name_byte(**b)).count();
                let name = &r[..n];
                let after = &r[n..];
                let rest = match after.strip_prefix(b" resumed>") {
                    Some(rest) => rest,
                    None => return Err(SkipReason::ResumedWithoutName),
                };
                if name.is_empty() {
                    return Err(SkipReason::ResumedWithoutName);
                }
                if rest.ends_with(b"<unfinished ...>") {
                    return Ok(Body::Resumed {
                        name,
                        rest: &rest[..rest.len() - 16],
                        tail: None,
                    });
                }
                // The resumed half holds the rest of the arguments and the result.
                let close = match find_close_resumed(rest) {
                    Some(c) => c,
                    None => return Err(SkipReason::CutOff),
                };
                let tail = parse_tail(after_eq(rest, close)).ok_or(SkipReason::BadReturn)?;
                return Ok(Body::Resumed {
                    name,
                    rest: &rest[..close],
                    tail: Some(tail),
                });
            }
            Err(SkipReason::NoSyscall)
        }
        b'-' if s.starts_with(b"--- ") => {
            let r = &s[4..];
            let n = r.iter().take_while(|b| is_name_byte(**b)).count();
            if n == 0 {
                return Err(SkipReason::NoSyscall);
            }
            let si_pid = memmem::find(r, b"si_pid=")
                .and_then(|i| parse_u64(&r[i + 7..]))
                .map(|(v, _)| v as u32);
            Ok(Body::Signal {
                name: &r[..n],
                si_pid,
            })
        }
        b'+' if s.starts_with(b"+++ ") => {
            let r = &s[4..];
            if let Some(c) = r.strip_prefix(b"exited with ") {
                let (neg, c) = match c.first() {
                    Some(b'-') => (true, &c[1..]),
                    _ => (false, c),
                };
                let code = parse_u64(c).map(|(v, _)| if neg { -(v as i32) } else { v as i32 });
                Ok(Body::Exit { code, signal: None })
            } else if let Some(c) = r.strip_prefix(b"killed by ") {
                let n = c.iter().take_while(|b| is_name_byte(**b)).count();
                Ok(Body::Exit {
                    code: None,
                    signal: Some(&c[..n]),
                })
            } else {
                Ok(Body::Noise)
            }
        }
        b's' if s.starts_with(b"strace: ") => {
            let r = &s[8..];
            if let Some(p) = r.strip_prefix(b"Process ") {
                if let Some((pid, n)) = parse_u64(p) {
                    let after = &p[n..];
                    if after.starts_with(b" attached") {
                        let threads = memmem::find(after, b"with ")
                            .and_then(|i| parse_u64(&after[i + 5..]))
                            .map(|(v, _)| v as u32);
                        return Ok(Body::Attached {
                            pid: pid as u32,
                            threads,
                        });
                    }
                    if after.starts_with(b" detached") {
                        return Ok(Body::DetachedMsg { pid: pid as u32 });
                    }
                }
            }
            Ok(Body::Noise)
        }
        b'>' | b'|' | b'/' | b'\\' => {
            // `-k` frames (`> lib(sym+0x..) [0x..]`), `-e write=` dumps (`| 00000 ...`) and
            // the box of `--tips`: strace's own output, with no event in it.
            Ok(Body::Noise)
        }
        b'_' | b'[' if s.iter().all(|b| matches!(b, b'_' | b'[' | b']' | b' ')) => Ok(Body::Noise),
        _ => parse_call(s),
    }
}

/// In a resumed half the arguments may hold a quoted string that began in the entry half;
/// strace always prints it whole in one half, so the same quote tracking applies.
fn find_close_resumed(rest: &[u8]) -> Option<usize> {
    find_close(rest)
}

fn parse_call(s: &[u8]) -> Result<Body<'_>, SkipReason> {
    let n = s.iter().take_while(|b| is_name_byte(**b)).count();
    if n == 0 || s.get(n) != Some(&b'(') || !s[0].is_ascii_alphabetic() && s[0] != b'_' {
        return Err(SkipReason::NoSyscall);
    }
    let name = &s[..n];
    let args = &s[n + 1..];
    if let Some(a) = args.strip_suffix(b"<unfinished ...>") {
        return Ok(Body::Unfinished {
            name,
            args: trim_end(a),
        });
    }
    if let Some(a) = args.strip_suffix(b"<detached ...>") {
        return Ok(Body::Detached {
            name,
            args: trim_end(a),
        });
    }
    match find_close(args) {
        Some(close) => {
            let tail = parse_tail(after_eq(args, close)).ok_or(SkipReason::BadReturn)?;
            Ok(Body::Call {
                name,
                args: &args[..close],
                tail,
            })
        }
        None => {
            // `exit_group(0)` printed with no result (the process is gone), `exit(0) = ?`.
            if args.ends_with(b")") && (name == b"exit_group" || name == b"exit") {
                return Ok(Body::Call {
                    name,
                    args: &args[..args.len() - 1],
                    tail: Tail {
                        ret: Ret::Unknown,
                        ret_path: None,
                        dur: None,
                    },
                });
            }
            Err(SkipReason::CutOff)
        }
    }
}

/// The commonest body, a finished call ending in `= N` or `= -1 ENAME (text)` and an optional
/// six-digit `<S.UUUUUU>`, read from both ends in one pass: the name forwards to its `(`, the
/// result backwards from the end to the `)` it follows. Anything else (hex or annotated
/// results, other precisions, unfinished or resumed halves, a `)` that may sit inside a
/// string) returns None and goes through `parse_body`, which gives the same answer for every
/// line this accepts (a test checks that on every real line we have).
#[inline]
fn fast_call(s: &[u8]) -> Option<Body<'_>> {
    if !s.first()?.is_ascii_alphabetic() {
        return None;
    }
    let n = 1 + s[1..].iter().take_while(|b| is_name_byte(**b)).count();
    if s.get(n) != Some(&b'(') {
        return None;
    }
    let mut e = s.len();
    let mut dur = None;
    if s[e - 1] == b'>' {
        let t: &[u8; 10] = s.get(e.checked_sub(10)?..e)?.try_into().ok()?;
        if t[0] != b'<' || t[2] != b'.' {
            return None;
        }
        let sec = fixed_digits::<1>(&[t[1]])?;
        let us = fixed_digits::<6>(t[3..9].try_into().ok()?)?;
        dur = Some(sec as i64 * 1_000_000_000 + us as i64 * 1_000);
        e -= 10;
        while e > 0 && s[e - 1] == b' ' {
            e -= 1;
        }
    }
    let mut ret_err = None;
    if e > 0 && s[e - 1] == b')' {
        // `-1 ENAME (text)`: the text must not hold a ` = ` the general path would stop at.
        let open = memrchr(b'(', &s[..e])?;
        if open < 2 || s[open - 1] != b' ' || memchr(b'=', &s[open..e]).is_some() {
            return None;
        }
        let name_end = open - 1;
        let mut k = name_end;
        while k > 0 && matches!(s[k - 1], b'A'..=b'Z' | b'0'..=b'9' | b'_') {
            k -= 1;
        }
        if k == name_end || s[k] != b'E' || k == 0 || s[k - 1] != b' ' {
            return None;
        }
        ret_err = Some(intern(&s[k..name_end]));
        e = k - 1;
    }
    let digits_end = e;
    while e > 0 && s[e - 1].is_ascii_digit() {
        e -= 1;
    }
    let (v, used) = parse_u64(&s[e..digits_end])?;
    if used != digits_end - e {
        return None;
    }
    let neg = e > 0 && s[e - 1] == b'-';
    if neg {
        e -= 1;
    }
    if e < 3 || &s[e - 3..e] != b" = " {
        return None;
    }
    e -= 3;
    while e > 0 && s[e - 1] == b' ' {
        e -= 1;
    }
    if e <= n + 1 || s[e - 1] != b')' {
        return None;
    }
    let args = &s[n + 1..e - 1];
    if !outside_strings(args) {
        return None;
    }
    let v = v as i64;
    Some(Body::Call {
        name: &s[..n],
        args,
        tail: Tail {
            ret: match ret_err {
                Some(name) => Ret::Err(name),
                None => Ret::Val(if neg { -v } else { v }),
            },
            ret_path: None,
            dur,
        },
    })
}

/// For the fuzz target: whether the fast path, wherever it accepts a line's body, reads the
/// same call from it as the general parser.
#[doc(hidden)]
pub fn fast_path_agrees(line: &[u8]) -> bool {
    let (_, body) = parse_prefix(line);
    match fast_call(body) {
        Some(fast) => parse_body(body) == Ok(fast),
        None => true,
    }
}

/// For the fuzz target: whether a string argument kept as printed (`Data::escaped`) decodes
/// to what decoding it at once, byte by byte, gives. `text` starts after the opening quote;
/// only texts that fit whole in a `Data` are compared (longer ones are cut by design).
#[doc(hidden)]
pub fn lazy_data_agrees(text: &[u8]) -> bool {
    if text.len() > event::RAW_CAP {
        return true;
    }
    let mut buf = [0u8; event::DATA_CAP];
    let mut n = 0usize;
    let (_, trunc) = unescape_while(text, |c| {
        if n < buf.len() {
            buf[n] = c;
        }
        n += 1;
        n <= buf.len()
    });
    let eager = Data::new(&buf[..n.min(buf.len())], trunc || n > buf.len());
    Data::escaped(text) == eager
}

/// Unescapes a C string literal as strace prints it (after its opening quote), handing
/// each byte to `push`. Returns (closed, truncated-marker `...` after the quote).
fn unescape_with(s: &[u8], mut push: impl FnMut(u8)) -> (bool, bool) {
    unescape_while(s, |c| {
        push(c);
        true
    })
}

/// `unescape_with`, stopping early when `push` returns false (then nothing is known about
/// the end of the string: both flags are false).
fn unescape_while(s: &[u8], mut push: impl FnMut(u8) -> bool) -> (bool, bool) {
    let mut i = 0;
    let mut closed = false;
    while i < s.len() {
        if s[i] == b'"' {
            closed = true;
            i += 1;
            break;
        }
        let (c, used) = unescape_one(s, i);
        if !push(c) {
            return (false, false);
        }
        i += used;
    }
    let truncated = closed && s[i..].starts_with(b"...");
    (closed, truncated)
}

/// Unescapes up to `cap` bytes into a new vector (for paths).
fn unescape(s: &[u8], cap: usize) -> (Vec<u8>, bool, bool) {
    let mut out = Vec::new();
    let (closed, truncated) = unescape_with(s, |c| {
        if out.len() < cap {
            out.push(c)
        }
    });
    (out, closed, truncated)
}

/// Splits off the first top-level argument: returns (arg, rest after the comma).
fn first_arg(args: &[u8]) -> (&[u8], &[u8]) {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut i = 0;
    while i < args.len() {
        let b = args[i];
        if in_str {
            if b == b'\\' {
                i += 2;
                continue;
            }
            if b == b'"' {
                in_str = false;
            }
        } else {
            match b {
                b'"' => in_str = true,
                b'[' | b'{' | b'(' => depth += 1,
                b']' | b'}' | b')' => depth -= 1,
                b'<' if i > 0 && args[i - 1].is_ascii_alphanumeric() => {
                    // an fd annotation: skip it whole (it may hold commas and brackets)
                    if let Some((_, used)) = annotation(&args[i..]) {
                        i += used;
                        continue;
                    }
                }
                b',' if depth <= 0 => return (&args[..i], skip_ws(&args[i + 1..])),
                _ => {}
            }
        }
        i += 1;
    }
    (args, &[])
}

/// `7</path>` / `7` / `AT_FDCWD<...>` -> (fd, annotation)
fn parse_fd_arg(a: &[u8]) -> (Option<i32>, Option<&[u8]>) {
    let a = skip_ws(a);
    // perf trace style `fd: 7` is handled by its own parser; here plain numbers only.
    match parse_u64(a) {
        Some((v, n)) if v <= i32::MAX as u64 => {
            (Some(v as i32), annotation(&a[n..]).map(|(p, _)| p))
        }
        _ => (None, None),
    }
}

fn path_arg(a: &[u8]) -> Option<Box<str>> {
    let a = skip_ws(a);
    let inner = a.strip_prefix(b"\"")?;
    let (bytes, _, _) = unescape(inner, 4096);
    Some(
        String::from_utf8_lossy(&bytes)
            .into_owned()
            .into_boxed_str(),
    )
}

fn lossy(b: &[u8]) -> Box<str> {
    String::from_utf8_lossy(b).into_owned().into_boxed_str()
}

/// Fills the syscall fields the analysis needs from the (entry half of the) argument text.
pub fn extract_args(sc: &mut Syscall, args: &[u8]) {
    let n = name(sc.name.as_bytes());
    extract_args_named(sc, n, args)
}

/// `extract_args` with the name facts already looked up.
fn extract_args_named(sc: &mut Syscall, facts: Name, args: &[u8]) {
    let plain = if facts.fd_first {
        plain_fd_arg(args)
    } else {
        None
    };
    let (a0, rest) = match plain {
        Some((fd, a0, rest)) => {
            sc.fd = Some(fd);
            (a0, rest)
        }
        _ => {
            let (a0, rest) = first_arg(args);
            if facts.fd_first {
                let (fd, ann) = parse_fd_arg(a0);
                sc.fd = fd;
                if let Some(p) = ann {
                    sc.fd_path = Some(lossy(p));
                }
            }
            (a0, rest)
        }
    };
    match facts.args {
        ArgKind::Path0 => {
            if let Some(p) = path_arg(a0) {
                sc.extra = Extra::Path(p);
            }
        }
        ArgKind::Path1 => {
            let (a1, _) = first_arg(rest);
            if let Some(p) = path_arg(a1) {
                if !p.is_empty() {
                    sc.extra = Extra::Path(p);
                }
            }
        }
        ArgKind::Rename => {
            let (a1, _) = first_arg(rest);
            if let (Some(o), Some(n)) = (path_arg(a0), path_arg(a1)) {
                sc.extra = Extra::Rename(o, n);
            }
        }
        ArgKind::RenameAt => {
            let (a1, r) = first_arg(rest);
            let (_, r) = first_arg(r);
            let (a3, _) = first_arg(r);
            if let (Some(o), Some(n)) = (path_arg(a1), path_arg(a3)) {
                sc.extra = Extra::Rename(o, n);
            }
        }
        ArgKind::Pipe | ArgKind::Socketpair => {
            let arr = if facts.args == ArgKind::Socketpair {
                let (_, r) = first_arg(rest);
                let (_, r) = first_arg(r);
                first_arg(r).0
            } else {
                a0
            };
            let arr = skip_ws(arr);
            if let Some(inner) = arr.strip_prefix(b"[") {
                let (x, r) = first_arg(inner);
                let (a, _) = parse_fd_arg(x);
                let (b, _) = parse_fd_arg(r);
                if let (Some(a), Some(b)) = (a, b) {
                    sc.extra = Extra::FdPair(a, b);
                }
            }
        }
        ArgKind::Dup2 => {
            let (a1, _) = first_arg(rest);
            if let (Some(fd), _) = parse_fd_arg(a1) {
                sc.extra = Extra::NewFd(fd);
            }
        }
        ArgKind::Fcntl => {
            let (a1, _) = first_arg(rest);
            if skip_ws(a1).starts_with(b"F_DUPFD") {
                sc.extra = Extra::DupFd;
            }
        }
        ArgKind::CloseRange => {
            let (a1, _) = first_arg(rest);
            let lo = parse_u64(skip_ws(a0)).map(|v| v.0 as u32);
            let a1 = skip_ws(a1);
            let hi = if a1.starts_with(b"~0") || a1.starts_with(b"4294967295") {
                Some(u32::MAX)
            } else {
                parse_u64(a1).map(|v| v.0.min(u32::MAX as u64) as u32)
            };
            if let (Some(lo), Some(hi)) = (lo, hi) {
                sc.extra = Extra::CloseRange(lo, hi);
            }
        }
        ArgKind::Clone => {
            sc.extra = Extra::Clone {
                thread: memmem::find(args, b"CLONE_THREAD").is_some(),
            };
        }
        ArgKind::Socket => {
            let a = skip_ws(a0);
            let n = a.iter().take_while(|b| is_name_byte(**b)).count();
            sc.extra = Extra::Socket(intern(&a[..n]));
        }
        ArgKind::Data => data_from(sc, rest),
        ArgKind::Nothing => {}
    }
}

/// A bare fd number as the whole first argument (`8, ...` or `8`), the common case that
/// needs none of `first_arg`'s bracket and string tracking: (fd, its text, the rest after
/// `, `).
#[inline]
fn plain_fd_arg(args: &[u8]) -> Option<(i32, &[u8], &[u8])> {
    let n = args
        .iter()
        .take(10)
        .take_while(|b| b.is_ascii_digit())
        .count();
    if n == 0 {
        return None;
    }
    let rest = match args.get(n) {
        None => &args[n..],
        Some(b',') => skip_ws(&args[n + 1..]),
        _ => return None,
    };
    let (v, _) = parse_u64(&args[..n])?;
    Some((i32::try_from(v).ok()?, &args[..n], rest))
}

/// Takes the buffer argument (a quoted string) at the start of `s`, if that is what it is.
/// The text is kept as printed and decoded only if someone asks (`Data::head`).
fn data_from(sc: &mut Syscall, s: &[u8]) {
    let s = skip_ws(s);
    if let Some(inner) = s.strip_prefix(b"\"") {
        sc.extra = Extra::Data(Data::escaped(inner));
    }
}

/// A partial call waiting for its resumed half.
#[derive(Debug)]
struct Pending {
    ts: Nanos,
    line: u64,
    sc: Syscall,
}

/// Turns lines into events, keeping the per-thread state the strace grammar needs.
pub struct StraceParser {
    /// The pid for lines that carry none (single-process traces, `-ff` files).
    pub default_pid: Tid,
    pending: super::TidMap<Pending>,
    /// The start of a line that strace split by printing its own message into it.
    dangling: Option<(Vec<u8>, u64)>,
    pub clock: ClockState,
    /// Number of the line being parsed (1-based).
    pub line: u64,
    pub seen_pid_column: bool,
    pub seen_dur: bool,
    pub seen_annotation: bool,
    pub seen_yy: bool,
    pub last_ts: Nanos,
    /// The parser's own copy of the name cache: the per-thread one sits behind a
    /// thread-local and a RefCell, which cost more than the lookup on every line.
    names: NameCache,
    /// Thread names last given by `-Y`.
    comms: super::TidMap<Box<[u8]>>,
}

/// The trace clock: turns per-line times into one monotonic-ish ns scale.
#[derive(Debug, Clone)]
pub struct ClockState {
    pub fmt: TimeFmt,
    pub frac_digits: u8,
    /// Days added for midnight rollovers (-t/-tt).
    day: i64,
    /// Highest time seen so far, on the unified scale.
    high: Nanos,
    /// Running sum for -r.
    rel: Nanos,
    pub first: Option<Nanos>,
    pub first_text: Option<String>,
}

const DAY_NS: i64 = 86_400 * 1_000_000_000;

impl ClockState {
    fn new() -> Self {
        ClockState {
            fmt: TimeFmt::None,
            frac_digits: 0,
            day: 0,
            high: 0,
            rel: 0,
            first: None,
            first_text: None,
        }
    }

    /// Maps a line's timestamp onto the trace scale. `None` when the line has none.
    fn map(&mut self, p: &Prefix, raw_line: &[u8]) -> Option<Nanos> {
        let t = p.time?;
        if self.fmt == TimeFmt::None {
            self.fmt = p.fmt;
            self.frac_digits = p.frac_digits;
        }
        let v = match p.fmt {
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => {
                let mut v = t + self.day * DAY_NS;
                if self.first.is_some() && v < self.high - DAY_NS / 2 {
                    // Far behind the latest time: the clock passed midnight.
                    self.day += 1;
                    v += DAY_NS;
                } else if v > self.high + DAY_NS / 2 && self.day > 0 {
                    // A late line printed out of order from before midnight.
                    v -= DAY_NS;
                }
                v
            }
            TimeFmt::Relative => {
                self.rel += t;
                self.rel
            }
            _ => t,
        };
        if self.first.is_none() {
            self.first = Some(v);
            let txt = parse_prefix_time_text(raw_line);
            self.first_text = Some(txt);
        }
        if v > self.high || self.first == Some(v) {
            self.high = self.high.max(v);
        }
        Some(v)
    }
}

/// The timestamp text of a line as printed (for `summary.start`).
fn parse_prefix_time_text(line: &[u8]) -> String {
    let mut s = line;
    if s.starts_with(b"[pid ") {
        if let Some(c) = memchr(b']', s) {
            s = &s[c + 1..];
        }
    } else if let Some((v, n)) = parse_u64(s) {
        if v <= PID_MAX && matches!(s.get(n), Some(b' ') | Some(b'\t')) {
            s = &s[n..];
        }
    }
    let s = skip_ws(s);
    let n = s.iter().take_while(|b| !b.is_ascii_whitespace()).count();
    String::from_utf8_lossy(&s[..n]).into_owned()
}

/// What one line produced.
#[derive(Debug, PartialEq)]
pub enum LineOutcome {
    /// Used; zero or more events were pushed.
    Used,
    Skipped(SkipReason),
}

impl Default for StraceParser {
    fn default() -> Self {
        Self::new(0)
    }
}

impl StraceParser {
    /// Whether the trace names its threads (`-Y`).
    pub fn seen_comm(&self) -> bool {
        !self.comms.is_empty()
    }

    pub fn new(default_pid: Tid) -> Self {
        StraceParser {
            default_pid,
            pending: Default::default(),
            dangling: None,
            clock: ClockState::new(),
            line: 0,
            seen_pid_column: false,
            seen_dur: false,
            seen_annotation: false,
            seen_yy: false,
            last_ts: 0,
            names: NameCache::default(),
            comms: Default::default(),
        }
    }

    /// Parses one physical line (without its newline), pushing the events it completes.
    pub fn feed(&mut self, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
        self.line += 1;
        let line_no = self.line;
        // strace's own message printed into the middle of an open line (stderr output):
        // `clone(...SIGCHLDstrace: Process 8335 attached`. Keep the start of the line, use
        // the message, and finish the line with the next bare continuation.
        // The message runs to the end of the line, so test the cheap suffix before
        // searching the whole line for it.
        let spliced = if is_process_message(raw) {
            splice_finder().find(raw)
        } else {
            None
        };
        if let Some(at) = spliced {
            if at > 0 && is_process_message(&raw[at..]) {
                // A previous split line still waiting for its end never got it.
                if let Some((head, head_line)) = self.dangling.take() {
                    self.feed_full_line(&head, head_line, head_line, out);
                }
                let head = &raw[..at];
                // The message happened when the open line was printed: give it that time,
                // without moving the clock (the head is mapped again once it is finished).
                let (pfx, _) = parse_prefix(head);
                let ts = self.clock.clone().map(&pfx, head);
                self.dangling = Some((head.to_vec(), line_no));
                return self.feed_body_line(&raw[at..], ts, line_no, out);
            }
        }
        if let Some((mut head, head_line)) = self.dangling.take() {
            let t = skip_ws(raw);
            let continues = t.starts_with(b"<unfinished ...>")
                || t.starts_with(b"<detached ...>")
                || (!raw.is_empty()
                    && (raw[0] == b' ' || raw[0] == b',')
                    && !looks_like_prefix(raw));
            if continues {
                if !head.ends_with(b" ") && !raw.starts_with(b" ") && !raw.starts_with(b",") {
                    head.push(b' ');
                }
                head.extend_from_slice(raw);
                let outcome = self.feed_full_line(&head, head_line, line_no, out);
                return if outcome == LineOutcome::Used {
                    LineOutcome::Used
                } else {
                    outcome
                };
            }
            // The split line never got its end: its head alone is a call in flight.
            self.feed_full_line(&head, head_line, head_line, out);
        }
        self.feed_full_line(raw, line_no, line_no, out)
    }

    fn feed_body_line(
        &mut self,
        raw: &[u8],
        ts: Option<Nanos>,
        line_no: u64,
        out: &mut Vec<Event>,
    ) -> LineOutcome {
        match parse_body(raw) {
            Ok(body) => {
                let pfx = Prefix {
                    pid: None,
                    time: None,
                    fmt: TimeFmt::None,
                    frac_digits: 0,
                    comm: None,
                };
                self.apply(pfx, ts, body, line_no, line_no, out);
                LineOutcome::Used
            }
            Err(r) => LineOutcome::Skipped(r),
        }
    }

    fn feed_full_line(
        &mut self,
        raw: &[u8],
        start_line: u64,
        line_no: u64,
        out: &mut Vec<Event>,
    ) -> LineOutcome {
        let (pfx, body) = parse_prefix(raw);
        if pfx.pid.is_some() {
            self.seen_pid_column = true;
        }
        if self.clock.fmt != TimeFmt::None && pfx.fmt != self.clock.fmt && pfx.time.is_some() {
            // A different timestamp format mid-file: the times cannot be placed on one scale.
            let compatible = matches!(
                (self.clock.fmt, pfx.fmt),
                (TimeFmt::TimeOfDay, TimeFmt::TimeOfDayFrac)
                    | (TimeFmt::TimeOfDayFrac, TimeFmt::TimeOfDay)
            );
            if !compatible {
                if is_summary_line(raw) {
                    return LineOutcome::Used;
                }
                return LineOutcome::Skipped(SkipReason::BadTimestamp);
            }
        }
        let body = match fast_call(body).map_or_else(|| parse_body(body), Ok) {
            Ok(b) => b,
            Err(SkipReason::CutOff) => {
                // A call line with no result and no marker: the trace was cut off there (or
                // strace was killed). Keep it as a call in flight at the end.
                let (_, b) = parse_prefix(raw);
                let b = trim_end(b);
                let n = b.iter().take_while(|c| is_name_byte(**c)).count();
                if n > 0 && b.get(n) == Some(&b'(') {
                    let ts = self.clock.map(&pfx, raw);
                    self.note_comm(&pfx, raw, ts, line_no, out);
                    let args = &b[n + 1..];
                    let body = Body::Detached {
                        name: &b[..n],
                        args,
                    };
                    self.apply(pfx, ts, body, start_line, line_no, out);
                    return LineOutcome::Used;
                }
                return LineOutcome::Skipped(SkipReason::CutOff);
            }
            Err(_) if is_summary_line(raw) => return LineOutcome::Used,
            Err(r) => return LineOutcome::Skipped(r),
        };
        let ts = if matches!(body, Body::Noise) {
            None
        } else {
            self.clock.map(&pfx, raw)
        };
        self.note_comm(&pfx, raw, ts, line_no, out);
        self.apply(pfx, ts, body, start_line, line_no, out);
        LineOutcome::Used
    }

    /// `-Y` names each line's thread: an event when a thread's name is first seen or
    /// changes, so roles come from names without a `--threads` file.
    fn note_comm(
        &mut self,
        pfx: &Prefix,
        raw: &[u8],
        ts: Option<Nanos>,
        line_no: u64,
        out: &mut Vec<Event>,
    ) {
        let Some(name) = pfx.comm.and_then(|(a, b)| raw.get(a..b)) else {
            return;
        };
        let tid = pfx.pid.unwrap_or(self.default_pid);
        if self.comms.get(&tid).map(|n| &n[..]) != Some(name) {
            self.comms.insert(tid, name.into());
            out.push(Event {
                tid,
                ts: ts.unwrap_or(self.last_ts),
                line: line_no,
                kind: EventKind::ThreadName(String::from_utf8_lossy(name).into()),
            });
        }
    }

    fn apply(
        &mut self,
        pfx: Prefix,
        ts: Option<Nanos>,
        body: Body<'_>,
        start_line: u64,
        line_no: u64,
        out: &mut Vec<Event>,
    ) {
        let tid = pfx.pid.unwrap_or(self.default_pid);
        let ts = ts.unwrap_or(self.last_ts);
        if ts > self.last_ts {
            self.last_ts = ts;
        }
        match body {
            Body::Call { name, args, tail } => {
                let facts = self.names.get(name);
                // Built in place in `out`: an event is 200 bytes, and moving it from the
                // stack into the vector was a visible share of the hot path.
                out.push(Event {
                    tid,
                    ts,
                    line: line_no,
                    kind: EventKind::Syscall(Syscall::new(facts.name)),
                });
                let Some(Event {
                    kind: EventKind::Syscall(sc),
                    ..
                }) = out.last_mut()
                else {
                    return;
                };
                extract_args_named(sc, facts, args);
                finish(sc, &tail);
                if sc.name == "restart_syscall" {
                    // The thread was blocked in a call when tracing began.
                    sc.in_flight = Some(InFlight::AtStart);
                }
                if let Some(p) = &sc.fd_path {
                    self.seen_annotation = true;
                    self.seen_yy |= p.contains("->");
                }
                self.seen_dur |= tail.dur.is_some();
            }
            Body::Unfinished { name, args } => {
                let facts = self.names.get(name);
                let mut sc = Syscall::new(facts.name);
                extract_args_named(&mut sc, facts, args);
                self.note_annotations(&sc);
                if sc.name == "restart_syscall" {
                    sc.in_flight = Some(InFlight::AtStart);
                }
                sc.start_line = Some(start_line);
                if let Some(prev) = self.pending.insert(
                    tid,
                    Pending {
                        ts,
                        line: start_line,
                        sc,
                    },
                ) {
                    // A new call on a thread whose previous call never resumed: that one
                    // ended unseen. Keep it, marked in flight.
                    out.push(dangling_event(tid, prev, ts));
                }
            }
            Body::Resumed { name, rest, tail } => {
                let facts = self.names.get(name);
                let name = facts.name;
                let (mut sc, start_ts, entry_line) = match self.pending.remove(&tid) {
                    Some(p) if p.sc.name == name => (p.sc, p.ts, Some(p.line)),
                    other => {
                        if let Some(p) = other {
                            out.push(dangling_event(tid, p, ts));
                        }
                        // No entry half: the call was already running when tracing began.
                        // Whatever arguments the resumed half shows are all we know.
                        let mut sc = Syscall::new(name);
                        extract_args_named(&mut sc, facts, rest);
                        sc.in_flight = Some(InFlight::AtStart);
                        (sc, ts, None)
                    }
                };
                if sc.data().is_none() && facts.args == ArgKind::Data {
                    data_from(&mut sc, rest);
                }
                match tail {
                    None => {
                        // Resumed and interrupted again (`<... x resumed> <unfinished ...>`).
                        self.pending.insert(
                            tid,
                            Pending {
                                ts: start_ts,
                                line: entry_line.unwrap_or(line_no),
                                sc,
                            },
                        );
                    }
                    Some(tail) => {
                        finish(&mut sc, &tail);
                        let start = match (entry_line, tail.dur) {
                            (Some(_), _) => start_ts,
                            // With -T strace times the call from the attach: place it there.
                            (None, Some(d)) => ts - d,
                            // No entry half and no -T: running at least since the trace began.
                            (None, None) => self.clock.first.unwrap_or(ts).min(ts),
                        };
                        if tail.dur.is_some() {
                            self.seen_dur = true;
                        } else {
                            sc.dur = Some((ts - start).max(0));
                            sc.dur_src = DurSource::Paired;
                        }
                        sc.start_line = entry_line;
                        out.push(Event {
                            tid,
                            ts: start,
                            line: line_no,
                            kind: EventKind::Syscall(sc),
                        });
                    }
                }
            }
            Body::Detached { name, args } => {
                // strace let go (or the trace was cut) while the call ran: like an unfinished
                // half that never resumes, it is timed up to the last event of the trace.
                let facts = self.names.get(name);
                let mut sc = Syscall::new(facts.name);
                extract_args_named(&mut sc, facts, args);
                sc.in_flight = Some(InFlight::AtEnd);
                sc.start_line = Some(start_line);
                if let Some(prev) = self.pending.insert(
                    tid,
                    Pending {
                        ts,
                        line: line_no,
                        sc,
                    },
                ) {
                    out.push(dangling_event(tid, prev, ts));
                }
            }
            Body::Signal { name, si_pid } => {
                out.push(Event {
                    tid,
                    ts,
                    line: line_no,
                    kind: EventKind::Signal {
                        name: intern(name),
                        si_pid,
                    },
                });
            }
            Body::Exit { code, signal } => {
                if let Some(p) = self.pending.remove(&tid) {
                    // `exit_group(0) <unfinished ...>` then `+++ exited`: the call ended here.
                    let mut sc = p.sc;
                    if sc.name == "exit_group" || sc.name == "exit" {
                        sc.dur = Some((ts - p.ts).max(0));
                        sc.dur_src = DurSource::Paired;
                        sc.start_line = Some(p.line);
                        out.push(Event {
                            tid,
                            ts: p.ts,
                            line: line_no,
                            kind: EventKind::Syscall(sc),
                        });
                    } else {
                        out.push(dangling_event(tid, Pending { sc, ..p }, ts));
                    }
                }
                out.push(Event {
                    tid,
                    ts,
                    line: line_no,
                    kind: EventKind::Exit {
                        code,
                        signal: signal.map(intern),
                    },
                });
            }
            Body::Attached { pid, threads } => {
                out.push(Event {
                    tid: pid,
                    ts,
                    line: line_no,
                    kind: EventKind::Attach { threads },
                });
            }
            Body::DetachedMsg { pid } => {
                out.push(Event {
                    tid: pid,
                    ts,
                    line: line_no,
                    kind: EventKind::Detach,
                });
            }
            Body::Noise => {}
        }
    }

    fn note_annotations(&mut self, sc: &Syscall) {
        if let Some(p) = &sc.fd_path {
            self.seen_annotation = true;
            if p.contains("->") {
                self.seen_yy = true;
            }
        }
    }

    /// End of input: a split line with no end and calls that never resumed are kept as
    /// calls still in flight when the trace ended.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        if let Some((head, head_line)) = self.dangling.take() {
            self.feed_full_line(&head, head_line, head_line, out);
        }
        let mut rest: Vec<(Tid, Pending)> = self.pending.drain().collect();
        rest.sort_by_key(|(_, p)| p.line);
        let end = self.last_ts;
        for (tid, p) in rest {
            out.push(dangling_event(tid, p, end));
        }
    }
}

/// `strace: Process N attached [with K threads]` / `... detached` running to the end of the
/// line: only then is it strace's own message spliced into a line, not text in a string.
fn is_process_message(s: &[u8]) -> bool {
    let s = trim_end(s);
    match s.last() {
        Some(b'd') => s.ends_with(b" attached") || s.ends_with(b" detached"),
        Some(b's') => s.ends_with(b" threads"),
        _ => false,
    }
}

/// A line of the count table `strace -C` prints after the trace (`% time  seconds ...`
/// header, `------` rules, `45.52  0.009211  12  752  write` rows): the trace's own
/// summary, read as noise. Only asked of lines that are no call.
fn is_summary_line(raw: &[u8]) -> bool {
    let t = trim_end(skip_ws(raw));
    if t.starts_with(b"% time") {
        return true;
    }
    if t.starts_with(b"------") && t.iter().all(|b| *b == b'-' || *b == b' ') {
        return true;
    }
    let Ok(text) = std::str::from_utf8(t) else {
        return false;
    };
    let cols: Vec<&str> = text.split_whitespace().collect();
    let decimal = |c: &str| {
        parse_decimal_ns(c.as_bytes()).is_some_and(|(_, digits, n)| digits > 0 && n == c.len())
    };
    let name_ok = |c: &str| c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    matches!(cols.len(), 5 | 6)
        && decimal(cols[0])
        && decimal(cols[1])
        && cols[2..cols.len() - 1]
            .iter()
            .all(|c| c.bytes().all(|d| d.is_ascii_digit()))
        && name_ok(cols[cols.len() - 1])
}

fn looks_like_prefix(raw: &[u8]) -> bool {
    let (p, _) = parse_prefix(raw);
    p.pid.is_some() || p.time.is_some()
}

/// An entry half that never saw its end: in flight at the end, known part up to `until`.
fn dangling_event(tid: Tid, p: Pending, until: Nanos) -> Event {
    let mut sc = p.sc;
    sc.in_flight = Some(InFlight::AtEnd);
    sc.dur = Some((until - p.ts).max(0));
    sc.dur_src = DurSource::Paired;
    Event {
        tid,
        ts: p.ts,
        line: p.line,
        kind: EventKind::Syscall(sc),
    }
}

fn finish(sc: &mut Syscall, tail: &Tail<'_>) {
    sc.ret = tail.ret;
    if let Some(d) = tail.dur {
        sc.dur = Some(d);
        sc.dur_src = DurSource::Measured;
    }
    if let Some(p) = tail.ret_path {
        sc.ret_path = Some(lossy(p));
    }
}

#[cfg(test)]
mod tests;
