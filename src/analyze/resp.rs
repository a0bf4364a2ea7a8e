//! RESP request decoding: from the first bytes of a client socket read it takes the command
//! *names* only (never keys or values). The one decoder of command names: the per-command
//! analyzer walks every pipelined request as far as the trace shows them
//! (`for_each_command`), watch's metrics and the incident writer take the first
//! (`first_command`), and all of them accept a name by one rule (`is_command_name`).

use crate::event::DATA_CAP;

/// Command names found at the start of a request buffer. `more` is true when the buffer was
/// cut off by the tracer, so further pipelined requests may follow unseen. (The analysis
/// takes them one by one, without allocating: `for_each_command`.)
#[cfg(test)]
fn command_names(data: &[u8], truncated: bool) -> (Vec<String>, bool) {
    let mut out = vec![];
    let more = for_each_command(data, truncated, |n| {
        out.push(String::from_utf8_lossy(n).to_ascii_uppercase())
    });
    (out, more)
}

/// Calls `f` with each command name (as sent, not yet upper-cased) at the start of a request
/// buffer, allocating nothing; returns whether unseen requests may follow.
pub fn for_each_command(data: &[u8], truncated: bool, mut f: impl FnMut(&[u8])) -> bool {
    let mut s = data;
    while !s.is_empty() {
        if s[0] == b'*' {
            let (n, rest) = match int_line(&s[1..]) {
                Some(v) => v,
                None => break,
            };
            if n <= 0 {
                s = rest;
                continue;
            }
            // first bulk string is the command name
            let (name, mut rest) = match bulk(rest) {
                Some(v) => v,
                None => break,
            };
            if !clean(name) {
                break;
            }
            f(name);
            let mut complete = true;
            for _ in 1..n {
                match bulk(rest) {
                    Some((_, r)) => rest = r,
                    None => {
                        complete = false;
                        break;
                    }
                }
            }
            if !complete {
                return true;
            }
            s = rest;
        } else {
            // Inline command (`PING\r\n`), as telnet-style clients send.
            let end = s
                .iter()
                .position(|b| *b == b'\r' || *b == b'\n')
                .unwrap_or(s.len());
            let word = s[..end].split(|b| *b == b' ').next().unwrap_or(&[]);
            if !clean(word) {
                break;
            }
            f(word);
            if end == s.len() {
                return truncated;
            }
            let skip = s[end..]
                .iter()
                .take_while(|b| **b == b'\r' || **b == b'\n')
                .count();
            s = &s[end + skip..];
        }
    }
    truncated
}

/// strace's escaped text of a client read (after its opening quote) whose decoded head
/// (`Data::head`: its first `DATA_CAP` bytes) `for_each_command` walks to exactly one
/// name, read off the text without decoding it, in the commonest shape of a request:
/// `*N\r\n$L\r\nNAME\r\n`, then the end of the text (N = 1) or a first argument that
/// cannot fit in what is left of the head (the walk stops there, having read nothing of
/// it). None for anything else, for which the caller decodes the head and walks it:
/// decoding all of it and the walk cost more than the rest of the read's handling, for a
/// name in its first twenty bytes (bench/PROFILE.md's rounds on the analyzer's per-event path).
pub(crate) fn escaped_single_name(raw: &[u8]) -> Option<&[u8]> {
    // `pos`: decoded bytes so far (an escaped line end is four bytes of text, two decoded).
    let (n, mut i) = escaped_int_line(raw, 0, b'*')?;
    if n < 1 {
        return None;
    }
    let mut pos = i - 2;
    let (len, j) = escaped_int_line(raw, i, b'$')?;
    pos += j - i - 2;
    i = j;
    let len = usize::try_from(len).ok()?;
    let name = raw.get(i..i + len)?;
    if !clean(name) || raw.get(i + len..i + len + 4) != Some(b"\\r\\n") {
        return None;
    }
    pos += len + 2;
    i += len + 4;
    if pos > DATA_CAP {
        return None;
    }
    if n == 1 {
        // The head ends here (the closing quote, the end of the kept text, or the cap),
        // or the walk goes on to a pipelined request.
        return (pos == DATA_CAP || matches!(raw.get(i), None | Some(b'"'))).then_some(name);
    }
    // The first argument: a header cut off by the head, or a string longer than what is
    // left of it, stops the walk after the name.
    let (alen, j) = escaped_int_line(raw, i, b'$')?;
    let hdr_end = pos + (j - i - 2);
    if hdr_end > DATA_CAP {
        return Some(name);
    }
    let alen = usize::try_from(alen).ok()?;
    (hdr_end + alen + 2 > DATA_CAP).then_some(name)
}

/// `lead`, plain decimal digits (at most 18) and an escaped `\r\n` at `raw[i..]`: the
/// number and the index after the line end.
#[inline]
fn escaped_int_line(raw: &[u8], i: usize, lead: u8) -> Option<(i64, usize)> {
    if raw.get(i) != Some(&lead) {
        return None;
    }
    let mut k = i + 1;
    let mut v: i64 = 0;
    while let Some(&c) = raw.get(k) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        v = v * 10 + i64::from(d);
        k += 1;
    }
    let digits = k - i - 1;
    if digits == 0 || digits > 18 || raw.get(k..k + 4) != Some(b"\\r\\n") {
        return None;
    }
    Some((v, k + 4))
}

fn int_line(s: &[u8]) -> Option<(i64, &[u8])> {
    let end = s.iter().position(|b| *b == b'\r')?;
    if s.get(end + 1) != Some(&b'\n') {
        return None;
    }
    let v = decimal(&s[..end])?;
    Some((v, &s[end + 2..]))
}

/// `s` as a decimal i64, with what `str::parse::<i64>` accepts (an optional sign, then at
/// least one digit, no overflow), without the UTF-8 check and the generic parser's setup:
/// two or three of these run per client read.
#[inline]
fn decimal(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?;
        v = if neg {
            v.checked_sub(i64::from(d))?
        } else {
            v.checked_add(i64::from(d))?
        };
    }
    Some(v)
}

fn bulk(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let s = s.strip_prefix(b"$")?;
    let (len, rest) = int_line(s)?;
    let len = usize::try_from(len).ok()?;
    if rest.len() < len + 2 {
        return None;
    }
    Some((&rest[..len], &rest[len + 2..]))
}

/// Longest command name kept: redis's own are at most 17 bytes (`GEORADIUSBYMEMBER_RO`
/// is 20), module commands a few more (`TDIGEST.TRIMMED_MEAN`).
pub const NAME_MAX: usize = 32;

/// The rule a command name follows, everywhere a name is taken: an ASCII letter, then
/// letters, digits, `_`, `-`, `|` (a subcommand as redis names it, `CONFIG|GET`) or `.` (a
/// module's command: `FT.SEARCH`, `JSON.SET`), at most `NAME_MAX` bytes. Anything else is
/// not shown (it could be data).
#[inline]
pub fn is_command_name(name: &[u8]) -> bool {
    name.first().is_some_and(u8::is_ascii_alphabetic)
        && name.len() <= NAME_MAX
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'|' | b'.'))
}

fn clean(name: &[u8]) -> bool {
    is_command_name(name)
}

/// The first command name of a request buffer (as sent, not upper-cased), framed as
/// `for_each_command` frames it: the first name that walk gives, without walking further.
pub fn first_command(data: &[u8]) -> Option<&[u8]> {
    let mut s = data;
    while !s.is_empty() {
        if s[0] == b'*' {
            let (n, rest) = int_line(&s[1..])?;
            if n <= 0 {
                s = rest;
                continue;
            }
            let (name, _) = bulk(rest)?;
            return clean(name).then_some(name);
        }
        let end = s
            .iter()
            .position(|b| *b == b'\r' || *b == b'\n')
            .unwrap_or(s.len());
        let word = s[..end].split(|b| *b == b' ').next().unwrap_or(&[]);
        return clean(word).then_some(word);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_pipelined() {
        let (c, more) = command_names(
            b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n*1\r\n$4\r\nPING\r\n",
            false,
        );
        assert_eq!(c, vec!["GET", "PING"]);
        assert!(!more);
    }

    #[test]
    fn truncated_request_keeps_name_not_key() {
        let (c, more) = command_names(b"*3\r\n$4\r\nSADD\r\n$4\r\nseen\r\n$36\r\n1234", true);
        assert_eq!(c, vec!["SADD"]);
        assert!(more);
    }

    #[test]
    fn numbers_read_as_str_parse_reads_them() {
        for t in [
            "0",
            "3",
            "+7",
            "-1",
            "-0",
            "42",
            "",
            "+",
            "-",
            "1a",
            " 1",
            "1 ",
            "--1",
            "+-1",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "00012",
            "\u{e9}",
        ] {
            assert_eq!(decimal(t.as_bytes()), t.parse::<i64>().ok(), "{t:?}");
        }
    }

    /// strace's quoting of bytes (`\r`, `\n`, `\t`, `\"`, `\\`, octal for the rest).
    fn strace_quote(b: &[u8]) -> Vec<u8> {
        let mut out = vec![];
        for &c in b {
            match c {
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\t' => out.extend_from_slice(b"\\t"),
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                0x20..=0x7e => out.push(c),
                _ => out.extend_from_slice(format!("\\{c:o}").as_bytes()),
            }
        }
        out
    }

    /// Where the shortcut names a read's one command, the walk of its whole decoded head
    /// finds that one name: requests single, pipelined, inline, malformed and cut anywhere,
    /// as strace prints them (closed by `"...`, `"`, or cut short).
    #[test]
    fn the_single_name_shortcut_agrees_with_the_walk_of_the_whole_head() {
        use crate::event::Data;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let words: [&[u8]; 8] = [
            b"GET",
            b"ft.search",
            b"HSET",
            b"PING",
            b"x\x01",
            b"",
            b"JSON.SET",
            b"A|B",
        ];
        let mut lazy_used = 0;
        for _ in 0..60_000 {
            let mut req = vec![];
            for _ in 0..1 + next() % 4 {
                let inline = next() % 8 == 0;
                let w = words[(next() % 8) as usize];
                let argc = next() % 4;
                if inline {
                    req.extend_from_slice(w);
                    req.extend_from_slice(b" k\r\n");
                    continue;
                }
                let stated = if next() % 10 == 0 {
                    argc as i64 - 1
                } else {
                    argc as i64 + 1
                };
                req.extend_from_slice(format!("*{stated}\r\n").as_bytes());
                let mut items: Vec<Vec<u8>> = vec![w.to_vec()];
                for _ in 0..argc {
                    let len = (next() % 30) as usize;
                    let arg: Vec<u8> = (0..len)
                        .map(|_| match next() % 12 {
                            0 => b'\r',
                            1 => b'\n',
                            2 => b'"',
                            3 => (next() % 256) as u8,
                            _ => b'a' + (next() % 26) as u8,
                        })
                        .collect();
                    items.push(arg);
                }
                for it in items {
                    let len = if next() % 15 == 0 {
                        it.len() + 3
                    } else {
                        it.len()
                    };
                    req.extend_from_slice(format!("${len}\r\n").as_bytes());
                    req.extend_from_slice(&it);
                    req.extend_from_slice(b"\r\n");
                }
            }
            let cut = (next() as usize) % (req.len() + 8);
            let shown = &req[..cut.min(req.len())];
            let mut text = strace_quote(shown);
            match next() % 3 {
                0 => text.extend_from_slice(b"\"..., 16384) = 90"),
                1 => text.extend_from_slice(b"\", 16384) = 61"),
                _ => {}
            }
            let d = Data::escaped(&text);
            let head = d.head();
            let (whole, _) = command_names(head.bytes(), head.truncated);
            let first = first_command(head.bytes())
                .map(|n| String::from_utf8_lossy(n).to_ascii_uppercase());
            assert_eq!(
                first.as_ref(),
                whole.first(),
                "{:?}",
                String::from_utf8_lossy(&text)
            );
            if let Some(name) = escaped_single_name(d.kept().1) {
                lazy_used += 1;
                let got = String::from_utf8_lossy(name).to_ascii_uppercase();
                assert_eq!(vec![got], whole, "{:?}", String::from_utf8_lossy(&text));
            }
        }
        // The shortcut is taken often enough to be tested.
        assert!(lazy_used > 1_000, "{lazy_used}");
    }

    /// The benchmark's request, a lone PING, and the shapes the shortcut leaves to the walk.
    #[test]
    fn the_single_name_shortcut_on_fixed_requests() {
        use crate::event::Data;
        let cases: [(&[u8], Option<&[u8]>); 7] = [
            (
                br#"*2\r\n$3\r\nGET\r\n$41\r\nuuid:d8f16adf-cd61-4b2e"..., 16384) = 61"#,
                Some(b"GET"),
            ),
            (br#"*1\r\n$4\r\nPING\r\n", 16384) = 14"#, Some(b"PING")),
            (br#"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n""#, None),
            (br#"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n""#, None),
            (br#"*2\r\n$3\r\nGET\r\n$30\r\n\0"..."#, Some(b"GET")),
            (br#"*2\r\n$3\r\nGET\r\n$20\r\n\0"..."#, None),
            (br#"*3\r\n$3\r\nset\r\n$45\r\n"#, Some(b"set")),
        ];
        for (text, want) in cases {
            assert_eq!(
                escaped_single_name(text),
                want,
                "{}",
                String::from_utf8_lossy(text)
            );
            let head = Data::escaped(text).head();
            if let Some(name) = want {
                assert_eq!(
                    command_names(head.bytes(), false).0,
                    vec![String::from_utf8_lossy(name).to_ascii_uppercase()]
                );
            }
        }
    }

    /// Module commands are names like any other; what only looks like one is not.
    #[test]
    fn the_name_rule() {
        let (c, _) = command_names(
            b"*3\r\n$9\r\nFT.SEARCH\r\n$3\r\nidx\r\n$1\r\n*\r\n*3\r\n$8\r\njson.set\r\n$1\r\nk\r\n$1\r\n1\r\n",
            false,
        );
        assert_eq!(c, vec!["FT.SEARCH", "JSON.SET"]);
        for ok in ["GET", "CONFIG|GET", "TDIGEST.TRIMMED_MEAN", "R2D2"] {
            assert!(is_command_name(ok.as_bytes()), "{ok}");
        }
        for not in [
            "",
            "1GET",
            ".SET",
            "-ERR",
            "a b",
            "GET\r",
            &"A".repeat(NAME_MAX + 1),
        ] {
            assert!(!is_command_name(not.as_bytes()), "{not:?}");
        }
        assert_eq!(
            first_command(b"*1\r\n$5\r\nDEBUG"),
            None,
            "cut before its end"
        );
        assert_eq!(first_command(b"*0\r\nPING\r\n"), Some(&b"PING"[..]));
    }

    #[test]
    fn inline_and_garbage() {
        assert_eq!(command_names(b"PING\r\n", false).0, vec!["PING"]);
        assert!(command_names(b"\x00\x01binary", false).0.is_empty());
        assert!(command_names(b"*2\r\n$3\r\n\x01\x02\x03\r\n", false)
            .0
            .is_empty());
    }
}
