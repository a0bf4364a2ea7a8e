//! The body of a strace line (after the prefix): a finished call, an unfinished or resumed
//! half, a detached call, a signal, an exit, strace's own message, or noise, cut into its
//! parts (name, argument text, result, duration) without allocating. `fast_call` reads the
//! commonest finished call from both ends in one pass; `parse_body` reads every shape.

use super::super::line::SkipReason;
use super::args::{intern, NameCache};
use super::prefix::parse_prefix;
use crate::event::{self, Data, Nanos, Ret};
use crate::source::scan::{
    eight_digits, fixed_digits, fixed_digits_tail, is_name_byte, name_len, outside_strings,
    parse_decimal_ns, parse_hex, parse_u64, skip_ws, trim_end, unescape_while, Piece, Quoted,
};
use memchr::{memchr, memmem, memrchr};

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

/// `<DUR>` at the very end of a line -> ns. Any precision (6 digits default, 9 with ns).
fn parse_dur(s: &[u8]) -> (Option<Nanos>, &[u8]) {
    let s = trim_end(s);
    // The default `-T` shape, `<0.000071>`, read at fixed positions.
    if s.len() >= 10 {
        let t: &[u8; 10] = s[s.len() - 10..].try_into().expect("10 bytes");
        if t[0] == b'<' && t[2] == b'.' && t[9] == b'>' {
            if let (Some(sec), Some(us)) = (
                fixed_digits::<1>(&[t[1]]),
                fixed_digits_tail::<6>(t[1..9].try_into().expect("8 bytes")),
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

/// `S.ffffff` (the inside of `-T`'s default `<0.000071>`, the point checked by the caller)
/// -> µs: the seconds digit moved into the point's place in a register, so the seven
/// digits are one eight-digit word (`0Sffffff`) read at once.
#[inline(always)]
fn dur_usec(w: &[u8; 8]) -> Option<u64> {
    let x = u64::from_le_bytes(*w);
    eight_digits((x & !0xFFFF) | ((x & 0xFF) << 8) | b'0' as u64)
}

/// An fd annotation `<...>` at the start of `s` (the `>` that closes it is the first one
/// followed by a delimiter, since `-yy` socket text itself contains `->`).
pub(super) fn annotation(s: &[u8]) -> Option<(&[u8], usize)> {
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
            parse_hex(body)?
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
    let mut last = None;
    for (i, piece) in Quoted::new(args) {
        if piece == Piece::Code(b')') && closes_at(args, i) {
            last = Some(i);
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
        b's' if s.starts_with(b"strace: ") => Ok(process_message(&s[8..]).unwrap_or(Body::Noise)),
        // strace 4.x prints its messages without the `strace: ` prefix.
        b'P' if s.starts_with(b"Process ") => process_message(s).ok_or(SkipReason::NoSyscall),
        b'>' | b'|' | b'/' | b'\\' => {
            // `-k` frames (`> lib(sym+0x..) [0x..]`), `-e write=` dumps (`| 00000 ...`) and
            // the box of `--tips`: strace's own output, with no event in it.
            Ok(Body::Noise)
        }
        b'_' | b'[' if s.iter().all(|b| matches!(b, b'_' | b'[' | b']' | b' ')) => Ok(Body::Noise),
        _ => parse_call(s),
    }
}

/// `Process N attached [with K threads] [- interrupt to quit]` / `Process N detached`.
fn process_message(r: &[u8]) -> Option<Body<'_>> {
    let p = r.strip_prefix(b"Process ")?;
    let (pid, n) = parse_u64(p)?;
    let after = &p[n..];
    if after.starts_with(b" attached") {
        let threads = memmem::find(after, b"with ")
            .and_then(|i| parse_u64(&after[i + 5..]))
            .map(|(v, _)| v as u32);
        return Some(Body::Attached {
            pid: pid as u32,
            threads,
        });
    }
    if after.starts_with(b" detached") {
        return Some(Body::DetachedMsg { pid: pid as u32 });
    }
    None
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
            let exits = || {
                std::str::from_utf8(name).is_ok_and(|n| {
                    crate::syscalls::info(n)
                        .facts
                        .has(crate::syscalls::Facts::EXIT)
                })
            };
            if args.ends_with(b")") && exits() {
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
///
/// `names`: the parser's own name cache, for the errno name (the shared per-thread cache sits
/// behind a thread-local and a RefCell, paid on every `-1 EAGAIN` line: bench/PROFILE.md,
/// parser side from 55f41f7).
#[inline(always)]
pub(super) fn fast_call<'a>(s: &'a [u8], names: &mut NameCache) -> Option<FastCall<'a>> {
    if !s.first()?.is_ascii_alphabetic() {
        return None;
    }
    // The first byte is a letter, itself a name byte.
    let n = name_len(s);
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
        dur = Some(dur_usec(t[1..9].try_into().ok()?)? as i64 * 1_000);
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
        ret_err = Some(names.get(&s[k..name_end]).name);
        e = k - 1;
    }
    // The result's digits, valued as they are read backwards (up to 18: no overflow; a
    // longer number goes to the general path).
    let digits_end = e;
    let (mut v, mut scale) = (0u64, 1u64);
    while e > 0 && digits_end - e < 18 {
        let d = s[e - 1].wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        v += d as u64 * scale;
        scale *= 10;
        e -= 1;
    }
    if e == digits_end || (e > 0 && s[e - 1].is_ascii_digit()) {
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
    Some((
        &s[..n],
        args,
        Tail {
            ret: match ret_err {
                Some(name) => Ret::Err(name),
                None => Ret::Val(if neg { -v } else { v }),
            },
            ret_path: None,
            dur,
        },
    ))
}

/// What `fast_call` reads: the name, the argument text and the tail of a `Body::Call`, kept
/// as parts so that the commonest line goes to `call` without building and matching a body.
pub(super) type FastCall<'a> = (&'a [u8], &'a [u8], Tail<'a>);

/// `fast_call`'s parts as the body `parse_body` gives for the same line.
fn as_body(c: FastCall<'_>) -> Body<'_> {
    let (name, args, tail) = c;
    Body::Call { name, args, tail }
}

/// For the fuzz target: whether the fast path, wherever it accepts a line's body, reads the
/// same call from it as the general parser.
#[doc(hidden)]
pub fn fast_path_agrees(line: &[u8]) -> bool {
    let (_, body) = parse_prefix(line);
    match fast_call(body, &mut NameCache::default()) {
        Some(fast) => parse_body(body) == Ok(as_body(fast)),
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

/// `strace: Process N attached [with K threads]` / `... detached` running to the end of the
/// line: only then is it strace's own message spliced into a line, not text in a string.
#[inline(always)]
pub(super) fn is_process_message(s: &[u8]) -> bool {
    // Nearly every line ends in `>` (a `-T` duration) or a digit: no for those without
    // trimming (only blanks are trimmed, so any other last byte stays last), inline.
    matches!(s.last(), Some(b'd' | b's' | b't' | b' ' | b'\t' | b'\r')) && ends_as_message(s)
}

#[inline(never)]
fn ends_as_message(s: &[u8]) -> bool {
    let s = trim_end(s);
    match s.last() {
        Some(b'd') => s.ends_with(b" attached") || s.ends_with(b" detached"),
        Some(b's') => s.ends_with(b" threads"),
        Some(b't') => s.ends_with(b" - interrupt to quit"),
        _ => false,
    }
}

/// A line of the count table `strace -C` prints after the trace (`% time  seconds ...`
/// header, `------` rules, `45.52  0.009211  12  752  write` rows): the trace's own
/// summary, read as noise. Only asked of lines that are no call.
pub(super) fn is_summary_line(raw: &[u8]) -> bool {
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    /// One line, one event: the table of single-line shapes.
    #[test]
    fn single_line_shapes() {
        let table: Vec<(&str, Event)> = vec![
            // -f to stderr: `[pid N]`, -tt, -T.
            (
                "[pid  7313] 22:37:40.811837 fdatasync(7) = 0 <0.000311>",
                call(7313, tod(22, 37, 40, 811_837), 1, "fdatasync").fd(7).val(0).measured(311 * US).0,
            ),
            // -r: right-aligned time since the previous line, no pid.
            (
                r#"     0.000151 write(8, "$901\r\n# Persistence\r\nloading:0\r\n"..., 909) = 909 <0.000067>"#,
                call(0, 151 * US, 1, "write")
                    .fd(8)
                    .data(b"$901\r\n# Persistence\r\nloading:0\r\n", true)
                    .val(909)
                    .measured(67 * US)
                    .0,
            ),
            // -ttt.
            (
                "1796078610.545264 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7fae39d06510) = 13504 <0.017751>",
                call(0, 1_796_078_610_545_264_000, 1, "clone")
                    .extra(Extra::Clone { thread: false })
                    .val(13504)
                    .measured(17_751 * US)
                    .0,
            ),
            // -tt without -T: aligned result column, no duration.
            ("22:37:51.226702 fdatasync(7)            = 0", call(0, tod(22, 37, 51, 226_702), 1, "fdatasync").fd(7).val(0).0),
            // -y on the fd.
            (
                r#"[pid  8169] 22:38:11.273154 write(11<WORKDIR/redis.log>, "8169:M 30 Nov 2026 22:38:11.272 "..., 59) = 59 <0.000031>"#,
                call(8169, tod(22, 38, 11, 273_154), 1, "write")
                    .fd(11)
                    .fd_path("WORKDIR/redis.log")
                    .data(b"8169:M 30 Nov 2026 22:38:11.272 ", true)
                    .val(59)
                    .measured(31 * US)
                    .0,
            ),
            // -y on AT_FDCWD and on the returned fd.
            (
                r#"[pid  8169] 22:38:10.102487 openat(AT_FDCWD<WORKDIR>, "/proc/self/stat", O_RDONLY) = 8</proc/8169/stat> <0.000036>"#,
                call(8169, tod(22, 38, 10, 102_487), 1, "openat")
                    .path("/proc/self/stat")
                    .val(8)
                    .ret_path("/proc/8169/stat")
                    .measured(36 * US)
                    .0,
            ),
            // -yy: `->` inside the annotation; bare pid column (-o FILE -f).
            (
                r#"11461 22:41:05.800513 read(8<TCP:[127.0.0.1:6394->127.0.0.1:50418]>, "*2\r\n$4\r\nINFO\r\n$11\r\npersistence\r\n", 20474) = 32 <0.000028>"#,
                call(11461, tod(22, 41, 5, 800_513), 1, "read")
                    .fd(8)
                    .fd_path("TCP:[127.0.0.1:6394->127.0.0.1:50418]")
                    .data(b"*2\r\n$4\r\nINFO\r\n$11\r\npersistence\r\n", false)
                    .val(32)
                    .measured(28 * US)
                    .0,
            ),
            // An errno.
            (
                "1796078608.540434 accept4(6, 0x7ffd77cb23d0, [128], SOCK_CLOEXEC|SOCK_NONBLOCK) = -1 EAGAIN (Resource temporarily unavailable) <0.000014>",
                call(0, 1_796_078_608_540_434_000, 1, "accept4").fd(6).ret(Ret::Err("EAGAIN")).measured(14 * US).0,
            ),
            // -t: whole seconds, bare pid, aligned hex result.
            (
                "46099 15:53:49 brk(NULL)                = 0x5607bac04000",
                call(46099, tod(15, 53, 49, 0), 1, "brk").val(0x5607bac04000).0,
            ),
            // --timestamps=unix,s / unix,ms / unix,ns, and -T at ns precision.
            ("1796078610 fdatasync(7) = 0 <0.000311>", call(0, 1_796_078_610 * S, 1, "fdatasync").fd(7).val(0).measured(311 * US).0),
            (
                "1796078610.545 fdatasync(7) = 0 <0.000311>",
                call(0, 1_796_078_610 * S + 545 * MS, 1, "fdatasync").fd(7).val(0).measured(311 * US).0,
            ),
            (
                "1796078610.545264123 fdatasync(7) = 0 <0.000311123>",
                call(0, 1_796_078_610_545_264_123, 1, "fdatasync").fd(7).val(0).measured(311_123).0,
            ),
            // -T with fewer digits, and several seconds.
            ("[pid  8176] 22:38:19.531396 fsync(6) = 0 <9.5>", call(8176, tod(22, 38, 19, 531_396), 1, "fsync").fd(6).val(0).measured(9_500 * MS).0),
            // -tt -r combined: the relative part is ignored, the time of day is the clock.
            (
                "20:37:49.050065 (+     0.000012) semop(9928704, [{sem_num=0, sem_op=-1, sem_flg=SEM_UNDO}], 1) = 0 <5.030807>",
                call(0, tod(20, 37, 49, 50_065), 1, "semop").val(0).measured(5_030_807 * US).0,
            ),
            // The same with -f (the fixed-position `-tt` reading once took `(+` for the call).
            (
                "[pid  7313] 20:37:49.050065 (+     0.000012) semop(9928704, [{sem_num=0, sem_op=-1, sem_flg=SEM_UNDO}], 1) = 0 <5.030807>",
                call(7313, tod(20, 37, 49, 50_065), 1, "semop").val(0).measured(5_030_807 * US).0,
            ),
            // No timestamps at all.
            ("getpid()                                = 19349", call(0, 0, 1, "getpid").val(19349).0),
            // A path that was deleted.
            (
                r#"write(7</var/lib/redis/appendonly.aof (deleted)>, "*1\r\n", 4) = 4"#,
                call(0, 0, 1, "write").fd(7).fd_path("/var/lib/redis/appendonly.aof (deleted)").data(b"*1\r\n", false).val(4).0,
            ),
            // `= ?`
            ("exit_group(0)                           = ?", call(0, 0, 1, "exit_group").0),
            ("26695 _exit(0)                          = ?", call(26695, 0, 1, "_exit").0),
            // ERESTARTSYS (`= ?` plus an errno-like name).
            (
                "[pid  9386] 22:38:55.152372 futex(0x55, FUTEX_WAIT_PRIVATE, 0, NULL) = ? ERESTARTSYS (To be restarted if SA_RESTART is set) <2.208605>",
                call(9386, tod(22, 38, 55, 152_372), 1, "futex")
                    .ret(Ret::Err("ERESTARTSYS"))
                    .measured(2_208_605 * US)
                    .extra(Extra::Futex { addr: 0x55, wake: false })
                    .0,
            ),
            // (INJECTED) after the errno text.
            (
                r#"chdir(".")  = -1 ENOENT (No such file or directory) (INJECTED)"#,
                call(0, 0, 1, "chdir").path(".").ret(Ret::Err("ENOENT")).0,
            ),
            (
                "exit_group(42)                          = -1 ENOSYS (Function not implemented) (INJECTED)",
                call(0, 0, 1, "exit_group").ret(Ret::Err("ENOSYS")).0,
            ),
            // wait4 status with `&&` and `==`.
            (
                "9380  22:38:57.215446 wait4(-1, [{WIFEXITED(s) && WEXITSTATUS(s) == 0}], WNOHANG, NULL) = 9569 <0.000049>",
                call(9380, tod(22, 38, 57, 215_446), 1, "wait4").val(9569).measured(49 * US).0,
            ),
            // A string that contains `) = `.
            (
                r#"write(1, "f(x) = 5\n", 9) = 9 <0.000010>"#,
                call(0, 0, 1, "write").fd(1).data(b"f(x) = 5\n", false).val(9).measured(10 * US).0,
            ),
            // `) = ` inside a string and an aligned result column after it.
            (
                r#"write(1, "f(x) = 5\n", 9)            = 9"#,
                call(0, 0, 1, "write").fd(1).data(b"f(x) = 5\n", false).val(9).0,
            ),
            // 32-bit _llseek (leading underscore), result column aligned.
            ("31442 _llseek(3, 0, [3564], SEEK_CUR)   = 0", call(31442, 0, 1, "_llseek").fd(3).val(0).0),
            // --secontext after the pid and after an fd annotation.
            (
                r#"151020 [unconfined_t] 14:37:21.990449 connect(3<UNIX-STREAM:[524197]> [unconfined_t], {sa_family=AF_UNIX, sun_path="/run/dbus/system_bus_socket" [system_dbusd_var_run_t]}, 30) = 0 <0.000033>"#,
                call(151020, tod(14, 37, 21, 990_449), 1, "connect").fd(3).fd_path("UNIX-STREAM:[524197]").extra(Extra::Path("/run/dbus/system_bus_socket".into())).val(0).measured(33 * US).0,
            ),
            // -yy on a returned socket fd.
            (
                "accept4(3<socket:[15157]>, {sa_family=AF_INET, sin_port=htons(62958), sin_addr=inet_addr(\"1.2.3.4\")}, [16], SOCK_CLOEXEC) = 29<socket:[91704707]>",
                call(0, 0, 1, "accept4").fd(3).fd_path("socket:[15157]").val(29).ret_path("socket:[91704707]").0,
            ),
            // pipe and dup2 arguments the fd table needs.
            ("pipe([0, 1]) = 0", call(0, 0, 1, "pipe").extra(Extra::FdPair(0, 1)).val(0).0),
            ("dup2(5, 1) = 1", call(0, 0, 1, "dup2").fd(5).extra(Extra::NewFd(1)).val(1).0),
            (
                r#"rename("temp-8335.rdb", "dump.rdb") = 0 <0.000040>"#,
                call(0, 0, 1, "rename").extra(Extra::Rename("temp-8335.rdb".into(), "dump.rdb".into())).val(0).measured(40 * US).0,
            ),
        ];
        for (line, want) in table {
            let got = run(&[line]);
            assert_eq!(got, vec![want], "line: {line}");
        }
    }

    /// Raw non-UTF-8 bytes (and in a path annotation) are read as bytes, never rejected.
    #[test]
    fn non_utf8_bytes() {
        let (got, skips) = run_lines(&[
            b"[pid  7313] 22:37:40.811837 write(7</tmp/\xff>, \"\xff\xfe\\x00\", 3) = 3 <0.000010>",
        ]);
        assert!(skips.is_empty());
        assert_eq!(
            got,
            vec![
                call(7313, tod(22, 37, 40, 811_837), 1, "write")
                    .fd(7)
                    .fd_path("/tmp/\u{fffd}")
                    .data(&[0xff, 0xfe, 0], false)
                    .val(3)
                    .measured(10 * US)
                    .0
            ]
        );
    }

    #[test]
    fn signals_exits_and_strace_messages() {
        let table: Vec<(&str, Event)> = vec![
            (
                "9380  22:38:57.152385 --- SIGCHLD {si_signo=SIGCHLD, si_code=CLD_EXITED, si_pid=9569, si_uid=0, si_status=0, si_utime=98 /* 0.98 s */, si_stime=20 /* 0.20 s */} ---",
                ev(9380, tod(22, 38, 57, 152_385), 1, EventKind::Signal { name: "SIGCHLD", si_pid: Some(9569) }),
            ),
            (
                "--- SIGUSR1 {si_signo=SIGUSR1, si_code=SI_KERNEL} ---",
                ev(0, 0, 1, EventKind::Signal { name: "SIGUSR1", si_pid: None }),
            ),
            (
                "9569  22:38:57.152275 +++ exited with 0 +++",
                ev(9569, tod(22, 38, 57, 152_275), 1, EventKind::Exit { code: Some(0), signal: None }),
            ),
            (
                "10031 21:14:55.795950 +++ killed by SIGTERM +++",
                ev(10031, tod(21, 14, 55, 795_950), 1, EventKind::Exit { code: None, signal: Some("SIGTERM") }),
            ),
            ("+++ killed by SIGSEGV (core dumped) +++", ev(0, 0, 1, EventKind::Exit { code: None, signal: Some("SIGSEGV") })),
            ("strace: Process 8169 attached with 5 threads", ev(8169, 0, 1, EventKind::Attach { threads: Some(5) })),
            ("strace: Process 8335 attached", ev(8335, 0, 1, EventKind::Attach { threads: None })),
            ("strace: Process 7317 detached", ev(7317, 0, 1, EventKind::Detach)),
        ];
        for (line, want) in table {
            assert_eq!(run(&[line]), vec![want], "line: {line}");
        }
    }

    #[test]
    fn noise_lines_are_used_without_events() {
        for line in [
            " > /usr/lib64/libc.so.6(_exit+0x1d) [0xdb44d] ../sysdeps/unix/sysv/linux/_exit.c:30",
            " | 00000  61 62 63 64 65 66 67 68  69 6a 6b 6c 6d 6e 6f 70  abcdefghijklmnop |",
            "strace: System call limit has been reached, detaching tracees",
            "  ______________________________________________         ____",
            " /                                              \\       /    \\",
            "                                                         [  ]",
        ] {
            assert_eq!(run(&[line]), vec![], "line: {line}");
        }
    }

    #[test]
    fn garbage_is_skipped_with_a_reason() {
        let (out, skips) = run_lines(&[
            b"this line is not valid strace output and should be skipped",
            b"",
            b"27369 <... no really why am I doin this",
            b"1796078610.545264 write(1, \"x\", 1) = banana",
        ]);
        assert_eq!(out, vec![]);
        assert_eq!(
            skips,
            vec![
                (1, SkipReason::NoSyscall),
                (2, SkipReason::Empty),
                (3, SkipReason::ResumedWithoutName),
                (4, SkipReason::BadReturn),
            ]
        );
    }

    /// `strace -C` prints its count table after the trace: read as noise, not skipped lines.
    /// Lines from strace 6.1.
    #[test]
    fn count_table_after_the_trace_is_noise() {
        let lines: &[&[u8]] = &[
            b"28471 04:55:11.056073 close(8)          = 0 <0.000008>",
            b"% time     seconds  usecs/call     calls    errors syscall",
            b"------ ----------- ----------- --------- --------- ----------------",
            b" 45.52    0.009211          12       752           write",
            b"  0.10    0.000021           2         8         3 accept4",
            b"------ ----------- ----------- --------- --------- ----------------",
            b"100.00    0.020237          10      1952         3 total",
        ];
        let (out, skips) = run_lines(lines);
        assert!(skips.is_empty(), "{skips:?}");
        assert_eq!(out.len(), 1);
        // A line that only looks numeric is still skipped.
        let (_, skips) = run_lines(&[
            b"28471 04:55:11.056073 close(8) = 0 <0.000008>",
            b" 45.52 oops",
        ]);
        assert_eq!(skips.len(), 1);
    }

    /// Every line of every capture and peer trace, plus edge shapes: wherever the fast path
    /// accepts a body, the general parser reads the same call from it; and every string in
    /// them, kept as printed, decodes as the eager decoder would.
    /// A kept string decodes lazily to what the eager decoder gives, for texts built from plain
    /// runs of every length around the 8- and 16-byte steps, RESP line ends, other escapes,
    /// quotes and strace's cut marker, at every offset against the 48-byte head.
    #[test]
    fn lazy_data_agrees_on_generated_texts() {
        let pieces: [&[u8]; 10] = [
            b"\\r\\n",
            b"\\n",
            b"\\r",
            b"\\x41",
            b"\\0",
            b"\\\"",
            b"\\\\",
            b"\"...",
            b"\", 16384) = 61",
            b"\\",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..30_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut r = seed;
            let mut t = vec![];
            for _ in 0..(r % 12) {
                r = r.rotate_left(7) ^ 0x2545_f491;
                let run = (r >> 8) % 24;
                t.extend((0..run).map(|k| b'a' + (k % 26) as u8));
                t.extend_from_slice(pieces[(r % 10) as usize]);
            }
            assert!(lazy_data_agrees(&t), "{}", String::from_utf8_lossy(&t));
        }
    }

    #[test]
    fn fast_path_agrees_with_the_general_parser() {
        use std::io::Read;
        let mut lines: Vec<Vec<u8>> = [
            "read(3, \"a) = 1 <0.000001>\", 10) = 10 <0.000002>",
            "read(3, \"a\\\") = 1\", 10) = 10",
            "write(1, \"x\"..., 9) = -1 EAGAIN (Resource temporarily unavailable) <0.000009>",
            "close(3) = -1 EBADF (Bad file descriptor = 3)",
            "select(4, [3], NULL, NULL, NULL) = 1 (in [3])",
            "mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, 3, 0) = 0x7f0000000000 <0.000010>",
            "openat(AT_FDCWD, \"/x\", O_RDONLY) = 3</x> <0.000010>",
            "fdatasync(7)            = 0",
            "fdatasync(7) = 0 <12.000010>",
            "fdatasync(7) = 0 <0.000010000>",
            "fdatasync(7) = 0\t<0.000010>",
            "fdatasync(7) = 99999999999999999999999",
            "fdatasync(7) = -5 <0.000010>",
            "exit_group(0) = ?",
            "f() = 0",
            "f(= 0",
            "f) = 0",
            "x(1) = 0 ENOENT (a) <0.000001>",
            "x(1) = -1  ENOENT (a) <0.000001>",
            "x(1) = -1 eNOENT (a)",
        ]
        .iter()
        .map(|l| l.as_bytes().to_vec())
        .collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![];
        for dir in [root.join("fixtures")] {
            let mut stack = vec![dir];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        files.push(p);
                    }
                }
            }
        }
        assert!(files.len() > 10, "the fixtures are where they should be");
        for f in files {
            let raw = std::fs::read(&f).unwrap();
            let text = if f.extension().is_some_and(|e| e == "gz") {
                let mut out = vec![];
                if flate2::read::MultiGzDecoder::new(&raw[..])
                    .read_to_end(&mut out)
                    .is_err()
                {
                    continue;
                }
                out
            } else {
                raw
            };
            lines.extend(text.split(|b| *b == b'\n').map(|l| l.to_vec()));
        }
        let mut accepted = 0;
        let mut names = super::super::args::NameCache::default();
        for line in &lines {
            // Every string argument decodes lazily to what the eager decoder gives.
            for q in memchr::memchr_iter(b'"', line) {
                assert!(
                    lazy_data_agrees(&line[q + 1..]),
                    "{}",
                    String::from_utf8_lossy(line)
                );
            }
            let (_, body) = parse_prefix(line);
            if let Some(fast) = fast_call(body, &mut names) {
                accepted += 1;
                assert_eq!(
                    Ok(super::as_body(fast)),
                    parse_body(body),
                    "{}",
                    String::from_utf8_lossy(line)
                );
            }
        }
        assert!(
            accepted > 10_000,
            "the fast path takes the common lines ({accepted})"
        );
    }
}
