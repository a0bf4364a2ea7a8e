//! The front of a strace line: the `[pid N]` / `N` column (with `-Y`'s `<comm>`), the
//! timestamp in whichever of strace's clocks the trace uses, and the `-i`/`-n` columns,
//! split off without allocating. Two fixed-position fast paths read the commonest shapes.

use crate::event::{Nanos, Tid};
use crate::source::scan::{
    eight_digits, fixed_digits, fixed_digits_tail, hms_seconds, is_digit, parse_decimal_ns,
    parse_u64, skip_ws,
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
#[inline]
fn epoch_usec_prefix(line: &[u8]) -> Option<(Prefix, &[u8])> {
    let head: &[u8; 18] = line.get(..18)?.try_into().ok()?;
    if head[10] != b'.' || head[17] != b' ' {
        return None;
    }
    let secs = fixed_digits::<2>(head[..2].try_into().ok()?)? * 100_000_000
        + eight_digits(u64::from_le_bytes(head[2..10].try_into().ok()?))?;
    let usec = fixed_digits_tail::<6>(head[9..17].try_into().ok()?)?;
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
    if head[8] != b'.' || head[15] != b' ' {
        return None;
    }
    let (h, m, sec) = hms_seconds(head[0..8].try_into().ok()?)?;
    let us = fixed_digits_tail::<6>(head[7..15].try_into().ok()?)?;
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
