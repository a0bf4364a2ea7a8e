//! The front of a strace line: the `[pid N]` / `N` column (with `-Y`'s `<comm>`), the
//! timestamp in whichever of strace's clocks the trace uses, and the `-i`/`-n` columns,
//! split off without allocating. Two fixed-position fast paths read the commonest shapes.

use crate::event::{Nanos, Tid};
use crate::source::scan::{
    eight_digits, epoch_tail_usec, is_digit, parse_decimal_ns, parse_u64, skip_ws, tod_usec,
};
use memchr::memchr;

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

/// The `-ttt` shape with no pid column, `1796078610.545264 name(...`: the commonest saved
/// form, read without the general prefix machinery (which handles it too, slower).
#[inline(always)]
fn epoch_usec_prefix(line: &[u8]) -> Option<(Prefix, &[u8])> {
    let head: &[u8; 18] = line.get(..18)?.try_into().ok()?;
    // One test first, so that lines in other formats (which try this first) leave at once.
    if head[10] != b'.' {
        return None;
    }
    let (low, usec) = epoch_tail_usec(head[2..18].try_into().ok()?)?;
    let (a, b) = (head[0].wrapping_sub(b'0'), head[1].wrapping_sub(b'0'));
    if a > 9 || b > 9 {
        return None;
    }
    let secs = (a as u64 * 10 + b as u64) * 100_000_000 + low;
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

/// The `-tt` shapes, `[pid  7313] 22:37:40.811837 name(...`, `9380  22:38:54.938004
/// name(...` and `22:37:40.811837 name(...` (no pid column): a pid, then `HH:MM:SS.ffffff `
/// read at fixed positions.
#[inline(always)]
fn pid_tod_usec_prefix<'a>(line: &'a [u8], memo: &mut PidMemo) -> Option<(Prefix, &'a [u8])> {
    let (pid, t) = if let Some((pid, n)) = memo.hit(line) {
        (Some(pid), blank_then_time(&line[n..]))
    } else if let Some((pid, n)) = bracket_pid(line) {
        // `-f`'s commonest column first: the no-pid test below costs it nothing.
        if pid > PID_MAX {
            return None;
        }
        memo.keep(line, pid as Tid, n);
        (Some(pid as Tid), blank_then_time(&line[n..]))
    } else if line.get(2) == Some(&b':') {
        // No pid column: a pid is never followed by a colon.
        (None, line)
    } else {
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
        (Some(pid as Tid), blank_then_time(rest))
    };
    let us = tod_usec(t.get(..16)?.try_into().ok()?)?;
    let rest = skip_ws(&t[15..]);
    // `-tt -r` combined (`(+     0.000012)` after the time): the general reading skips it.
    if rest.starts_with(b"(+") {
        return None;
    }
    let p = Prefix {
        pid,
        time: Some(us as i64 * 1_000),
        fmt: TimeFmt::TimeOfDayFrac,
        frac_digits: 6,
        comm: None,
    };
    Some((p, skip_extras(rest)))
}

/// The `[pid N]` column of the last `-f` line read by `bracket_pid`, by its thirteen bytes
/// (all that `bracket_pid` reads): under `-f` most lines are the same thread's as the line
/// before (a redis trace's event loop: 15 changes of column in 66,995 lines of the
/// aof-always-getsadd capture, 9,369 in 64,273 of log-verbose-bgsave), and two word compares
/// cost a fifth of reading the column again.
#[derive(Clone, Copy, Debug)]
pub struct PidMemo {
    /// Bytes 0..8 and 5..13 of that line (overlapping).
    a: u64,
    b: u64,
    pid: Tid,
    n: usize,
}

impl Default for PidMemo {
    /// None kept: a line that matches these bytes (`[` and seven NULs) is refused by every
    /// fast reading, and a "hit" refuses it too (its time is read at the `[`).
    fn default() -> Self {
        PidMemo {
            a: u64::from_le_bytes(*b"[\0\0\0\0\0\0\0"),
            b: 0,
            pid: 0,
            n: 0,
        }
    }
}

impl PidMemo {
    #[inline(always)]
    fn words(line: &[u8]) -> Option<(u64, u64)> {
        let h: &[u8; 13] = line.get(..13)?.try_into().ok()?;
        Some((
            u64::from_le_bytes(h[..8].try_into().ok()?),
            u64::from_le_bytes(h[5..].try_into().ok()?),
        ))
    }

    /// `bracket_pid(line)` when the line starts with the kept line's thirteen bytes.
    #[inline(always)]
    fn hit(&self, line: &[u8]) -> Option<(Tid, usize)> {
        let (a, b) = Self::words(line)?;
        (a == self.a && b == self.b).then_some((self.pid, self.n))
    }

    #[inline(always)]
    fn keep(&mut self, line: &[u8], pid: Tid, n: usize) {
        if let Some((a, b)) = Self::words(line) {
            *self = PidMemo { a, b, pid, n };
        }
    }
}

/// What follows the pid column: one blank, as strace prints it, without the loop.
#[inline(always)]
fn blank_then_time(rest: &[u8]) -> &[u8] {
    match rest {
        [b' ', t @ ..] if t.first().is_some_and(|b| b.is_ascii_digit()) => t,
        _ => skip_ws(rest),
    }
}

/// `[pid  7313]` as strace prints it (the pid right-aligned in a blank-padded field of up
/// to seven bytes, `]` within the first eight bytes after `[pid `) -> (pid, bytes up to and
/// with the `]`), read as one word: the field's leading blanks are counted and replaced by
/// '0' in a register, and the digits checked and combined as eight at once, where a blank
/// skip and a digit loop were a visible cost on every `-f` line (bench/PROFILE.md, parser
/// round from c923c8a). Anything else: `None` (the caller's general reading handles it).
#[inline(always)]
fn bracket_pid(line: &[u8]) -> Option<(u64, usize)> {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const LOW7: u64 = u64::from_le_bytes([0x7f; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let head: &[u8; 13] = line.get(..13)?.try_into().ok()?;
    if &head[..5] != b"[pid " {
        return None;
    }
    let w = u64::from_le_bytes(head[5..13].try_into().ok()?);
    // High bit of each byte equal to `b` (exact in every byte: no borrow between lanes).
    let eq = |b: u8| {
        let x = w ^ (ONES * b as u64);
        !(((x & LOW7) + LOW7) | x) & HIGHS
    };
    let close = eq(b']');
    if close == 0 {
        return None;
    }
    // Bytes before the first `]`, and the leading blanks among them.
    let k = (close.trailing_zeros() / 8) as usize;
    let lead = ((!eq(b' ') & HIGHS).trailing_zeros() / 8) as usize;
    if lead >= k {
        return None;
    }
    // The field's digits moved to the top of the word; everything below them becomes '0'.
    let top = w << (8 * (8 - k));
    let keep = u64::MAX << (8 * (8 - k + lead));
    let v = eight_digits((top & keep) | (0x3030_3030_3030_3030 & !keep))?;
    Some((v, 5 + k + 1))
}

/// Splits the `[pid N] ` / `N ` prefix and the timestamp off a line. The two fixed-position
/// shapes inline (every line asks), everything else out of line.
#[inline(always)]
pub fn parse_prefix(line: &[u8]) -> (Prefix, &[u8]) {
    parse_prefix_memo(line, &mut PidMemo::default())
}

/// `parse_prefix` with the `[pid N]` column of the line before kept in `memo` (the hot
/// loop's reading; the same answer for every line).
#[inline(always)]
pub(super) fn parse_prefix_memo<'a>(line: &'a [u8], memo: &mut PidMemo) -> (Prefix, &'a [u8]) {
    if let Some(fast) = epoch_usec_prefix(line) {
        return fast;
    }
    if let Some(fast) = pid_tod_usec_prefix(line, memo) {
        return fast;
    }
    parse_prefix_general(line)
}

#[inline(never)]
fn parse_prefix_general(line: &[u8]) -> (Prefix, &[u8]) {
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
#[inline(always)]
pub(super) fn skip_extras(s: &[u8]) -> &[u8] {
    // Nearly every line has neither: one test inline.
    if s.first() == Some(&b'[') {
        skip_extras_columns(s)
    } else {
        s
    }
}

#[inline(never)]
fn skip_extras_columns(mut s: &[u8]) -> &[u8] {
    while s.first() == Some(&b'[') {
        let Some(close) = memchr(b']', &s[..s.len().min(24)]) else {
            break;
        };
        let inner = &s[1..close];
        // `[????????????????]`: no instruction pointer to show (a thread's exit line).
        let ip = !inner.is_empty()
            && (inner.iter().all(u8::is_ascii_hexdigit) || inner.iter().all(|b| *b == b'?'));
        let nr = inner.iter().any(u8::is_ascii_digit)
            && inner.iter().all(|b| b.is_ascii_digit() || *b == b' ');
        if !(ip || nr) || s.get(close + 1) != Some(&b' ') {
            break;
        }
        s = skip_ws(&s[close + 1..]);
    }
    s
}

pub(super) fn looks_like_prefix(raw: &[u8]) -> bool {
    let (p, _) = parse_prefix(raw);
    p.pid.is_some() || p.time.is_some()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn parse_prefix_shapes() {
        type Case<'a> = (&'a str, Option<Tid>, Option<i64>, TimeFmt, &'a str);
        let cases: Vec<Case> = vec![
            (
                "[pid  7313] 22:37:40.811837 x()",
                Some(7313),
                Some(tod(22, 37, 40, 811_837)),
                TimeFmt::TimeOfDayFrac,
                "x()",
            ),
            (
                "9380  22:38:54.938004 x()",
                Some(9380),
                Some(tod(22, 38, 54, 938_004)),
                TimeFmt::TimeOfDayFrac,
                "x()",
            ),
            (
                "     0.000151 x()",
                None,
                Some(151 * US),
                TimeFmt::Relative,
                "x()",
            ),
            (
                "9380       0.000151 x()",
                Some(9380),
                Some(151 * US),
                TimeFmt::Relative,
                "x()",
            ),
            (
                "1796078610.545264 x()",
                None,
                Some(1_796_078_610_545_264_000),
                TimeFmt::Epoch,
                "x()",
            ),
            (
                "1796078610 x()",
                None,
                Some(1_796_078_610 * S),
                TimeFmt::Epoch,
                "x()",
            ),
            (
                "22:37:51 x()",
                None,
                Some(tod(22, 37, 51, 0)),
                TimeFmt::TimeOfDay,
                "x()",
            ),
            ("x()", None, None, TimeFmt::None, "x()"),
            ("4194304 x()", Some(4_194_304), None, TimeFmt::None, "x()"),
        ];
        for (line, pid, time, fmt, body) in cases {
            let (p, b) = parse_prefix(line.as_bytes());
            assert_eq!(
                (p.pid, p.time, p.fmt, b),
                (pid, time, fmt, body.as_bytes()),
                "line: {line}"
            );
        }
    }

    /// The reading with the last `[pid N]` column kept gives the plain reading's answer on
    /// each line of a sequence where columns repeat, change, and come back after other lines
    /// (a column kept from one line is never a wrong pid for the next).
    #[test]
    fn pid_memo_keeps_the_answer() {
        let lines = [
            "[pid  7313] 22:37:40.811837 x() = 0",
            "[pid  7313] 22:37:40.811838 y(1) = 0",
            "[pid  7313] +++ exited with 0 +++",
            "[pid  7314] 22:37:40.811839 x() = 0",
            "[pid 7313] 22:37:40.811840 x() = 0",
            "[pid  7313] 22:37:40.811841 x() = 0",
            "22:37:40.811842 x() = 0",
            "[pid  7313] 22:37:40",
            "[pid  7313]  22:37:40.811843 x() = 0",
            "[pid 12345678] 22:37:40.811844 x() = 0",
            "[pid 12345678] 22:37:40.811845 x() = 0",
            "[pid 4194305] 22:37:40.811846 x() = 0",
            "[pid 4194305] 22:37:40.811847 x() = 0",
            "[pid  7313] 1796078610.545264 x() = 0",
            "[\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            "[pid  7313] 22:37:40.811848 x() = 0",
        ];
        let mut memo = super::PidMemo::default();
        for _ in 0..2 {
            for line in lines {
                let kept = super::parse_prefix_memo(line.as_bytes(), &mut memo);
                assert_eq!(kept, parse_prefix(line.as_bytes()), "line: {line:?}");
            }
        }
        let fresh = "[\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
        assert_eq!(
            super::parse_prefix_memo(fresh.as_bytes(), &mut super::PidMemo::default()),
            super::parse_prefix_general(fresh.as_bytes())
        );
    }

    /// The one-word `[pid N]` reading agrees with the general one on every field shape around
    /// it: widths, blanks and tabs, leading zeros, too many digits, a `-Y` name, a cut line.
    #[test]
    fn bracket_pid_agrees_with_the_general_reading() {
        let fields = [
            "7313",
            " 7313",
            "  7313",
            "     1",
            "0009085",
            "4194304",
            "4194305",
            "12345678",
            "  ",
            "",
            "\t7313",
            " 73 13",
            "7313 ",
            "x7313",
            "-1",
            "7313<redis>",
        ];
        for f in fields {
            for stamp in [
                " 22:37:40.811837 x()",
                "  22:37:40.811837 x()",
                " 22:37:40",
                "",
            ] {
                let line = format!("[pid {f}]{stamp}");
                let fast = parse_prefix(line.as_bytes());
                let general = super::parse_prefix_general(line.as_bytes());
                assert_eq!(fast, general, "line: {line:?}");
            }
        }
        for line in [
            "22:37:40.811837 x()",
            "22:37:40.811837  x()",
            "22:37:40.811837 (+     0.000012) x()",
            "[pid  7313] 22:37:40.811837 (+     0.000012) x()",
            "22:37:40.81183 x()",
            "22:37:40 x()",
            "24:37:40.811837 x()",
            "22:37:40.811837 [00007f4b6d52af16] x()",
        ] {
            let fast = parse_prefix(line.as_bytes());
            let general = super::parse_prefix_general(line.as_bytes());
            assert_eq!(fast, general, "line: {line:?}");
        }
        assert_eq!(super::bracket_pid(b"[pid  7313] 22:"), Some((7313, 11)));
        assert_eq!(
            super::bracket_pid(b"[pid 4194304] 2"),
            Some((4_194_304, 13))
        );
        assert_eq!(super::bracket_pid(b"[pid  73 3] 22:"), None);
    }

    /// `-Y` names the thread beside its pid (`[pid N<comm>]` on stderr, `N<comm>` with -o), once
    /// per thread as an event before its first call and again if the name changes; `-n`
    /// (`[ 202]`) and `-i` (`[00007f4b6d52af16]`) between the time and the call are skipped.
    /// Lines from strace 6.1 on redis-server 7.0.
    #[test]
    fn comm_syscall_number_and_instruction_pointer_columns() {
        let out = run(&[
            "[pid 28473<bio_aof_fsync>] 04:52:04.985231 [ 202] [00007f4b6d52af16] fdatasync(7) = 0 <0.000311>",
            "[pid 28473<bio_aof_fsync>] 04:52:05.985231 [ 202] [00007f4b6d52af16] fdatasync(7) = 0 <0.000200>",
            "28471<redis-server> 04:52:06.000001 [00007f4b6d508f36] epoll_wait(5, [], 10128, 91) = 0 <0.091215>",
            "28471<redis-serv>er> 04:52:07.000001 [ 232] getpid() = 28471 <0.000003>",
        ]);
        let names: Vec<(Tid, &str)> = out
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ThreadName(n) => Some((e.tid, &n[..])),
                _ => None,
            })
            .collect();
        assert_eq!(
            names,
            [
                (28473, "bio_aof_fsync"),
                (28471, "redis-server"),
                (28471, "redis-serv>er")
            ]
        );
        let calls: Vec<(Tid, i64, &str, Option<i64>)> = out
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Syscall(sc) => Some((e.tid, e.ts, sc.name, sc.dur)),
                _ => None,
            })
            .collect();
        assert_eq!(
            calls,
            [
                (28473, tod(4, 52, 4, 985_231), "fdatasync", Some(311 * US)),
                (28473, tod(4, 52, 5, 985_231), "fdatasync", Some(200 * US)),
                (28471, tod(4, 52, 6, 1), "epoll_wait", Some(91_215 * US)),
                (28471, tod(4, 52, 7, 1), "getpid", Some(3 * US)),
            ]
        );
        // A bracket that is neither (a secontext, text) is left alone.
        let (_, body) = parse_prefix(b"04:52:07.000001 [not-hex] getpid() = 1");
        assert!(body.starts_with(b"[not-hex]"));
    }
}
