//! RESP request decoding for the per-command analyzer: from the first bytes of a client
//! socket read it takes the command *names* only (never keys or values), counting pipelined
//! requests as far as the trace shows them.

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

/// A command name is a short alphabetic word; anything else is not shown (it could be data).
pub const NAME_MAX: usize = 24;

fn clean(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name
            .iter()
            .all(|b| b.is_ascii_alphabetic() || *b == b'_' || *b == b'-' || *b == b'|')
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

    #[test]
    fn inline_and_garbage() {
        assert_eq!(command_names(b"PING\r\n", false).0, vec!["PING"]);
        assert!(command_names(b"\x00\x01binary", false).0.is_empty());
        assert!(command_names(b"*2\r\n$3\r\n\x01\x02\x03\r\n", false)
            .0
            .is_empty());
    }
}
