//! The body of a strace line (after the prefix): a finished call, an unfinished or resumed
//! half, a detached call, a signal, an exit, strace's own message, or noise, cut into its
//! parts (name, argument text, result, duration) without allocating. `fast_call` reads the
//! commonest finished call from both ends in one pass; `parse_body` reads every shape.

use super::super::line::SkipReason;
use super::args::intern;
use super::prefix::parse_prefix;
use crate::event::{self, Data, Nanos, Ret};
use crate::source::scan::{
    fixed_digits, is_name_byte, outside_strings, parse_decimal_ns, parse_hex, parse_u64, skip_ws,
    trim_end, unescape_while, Piece, Quoted,
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
    let mut q = Quoted::new(args);
    let mut last = None;
    while let Some((i, piece)) = q.next() {
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
pub(super) fn fast_call(s: &[u8]) -> Option<Body<'_>> {
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

/// `strace: Process N attached [with K threads]` / `... detached` running to the end of the
/// line: only then is it strace's own message spliced into a line, not text in a string.
pub(super) fn is_process_message(s: &[u8]) -> bool {
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
