//! Byte scanning shared by the text parsers (strace, perf trace): numbers, decimals,
//! blanks, and one scanner that knows about strace's quoted strings. Every parser walks
//! its lines with these, so a line is cut the same way whatever the tracer, and the few
//! tricks that make the hot path fast (SWAR digits, SSE2 quote counting) live in one place.

use crate::event::unescape_one;

#[inline]
pub(crate) fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// A byte of a syscall, signal or errno name: one table load (the name of every line is
/// scanned byte by byte, where the three range tests cost more).
#[inline]
pub(crate) fn is_name_byte(b: u8) -> bool {
    NAME_BYTES[b as usize]
}

static NAME_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b.is_ascii_alphanumeric() || b == b'_';
        i += 1;
    }
    t
};

/// How many bytes at the start of `s` are name bytes (`is_name_byte`): sixteen at a time
/// with SSE2 (part of every x86_64), where the byte loop over a call's name was a visible
/// cost on every line (bench/PROFILE.md, parser round from f859104); the last bytes of a
/// short line and names of sixteen bytes or more go on byte by byte.
#[inline(always)]
pub(crate) fn name_len(s: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if s.len() >= 16 {
        use std::arch::x86_64::{
            __m128i, _mm_and_si128, _mm_cmpeq_epi8, _mm_cmpgt_epi8, _mm_loadu_si128,
            _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        };
        // SAFETY: SSE2 is in the x86_64 baseline, and `s.len() >= 16` keeps the unaligned
        // 16-byte load inside `s`.
        let m = unsafe {
            let v = _mm_loadu_si128(s.as_ptr() as *const __m128i);
            // Signed compares: bytes from 0x80 up are negative, below every range.
            let within = |x: __m128i, lo: u8, hi: u8| {
                _mm_and_si128(
                    _mm_cmpgt_epi8(x, _mm_set1_epi8(lo as i8 - 1)),
                    _mm_cmpgt_epi8(_mm_set1_epi8(hi as i8 + 1), x),
                )
            };
            // `| 0x20` folds A-Z onto a-z and takes nothing else there.
            let alpha = within(_mm_or_si128(v, _mm_set1_epi8(0x20)), b'a', b'z');
            let digit = within(v, b'0', b'9');
            let under = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'_' as i8));
            _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(alpha, digit), under)) as u32
        };
        let n = (!m).trailing_zeros() as usize;
        if n < 16 {
            return n;
        }
        return 16 + s[16..].iter().take_while(|b| is_name_byte(**b)).count();
    }
    s.iter().take_while(|b| is_name_byte(**b)).count()
}

#[inline(always)]
pub(crate) fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| **b == b' ' || **b == b'\t').count();
    &s[n..]
}

#[inline]
pub(crate) fn trim_end(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .rev()
        .take_while(|b| matches!(**b, b' ' | b'\t' | b'\r'))
        .count();
    &s[..s.len() - n]
}

#[inline]
pub(crate) fn parse_u64(s: &[u8]) -> Option<(u64, usize)> {
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

/// `0x1f` -> (31, bytes used): a hex number with its prefix, as strace prints addresses,
/// flags and, in traces from some shims, fds.
pub(crate) fn parse_hex(s: &[u8]) -> Option<(u64, usize)> {
    let hex = s.strip_prefix(b"0x")?;
    let n = hex.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if n == 0 {
        return None;
    }
    let mut v = 0u64;
    for d in &hex[..n] {
        let x = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        if v >> 60 != 0 {
            return None;
        }
        v = v << 4 | x as u64;
    }
    Some((v, n + 2))
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
pub(crate) fn parse_decimal_ns(s: &[u8]) -> Option<(i64, u8, usize)> {
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

/// Digits at fixed positions -> value, or None if any is not a digit. Up to eight digits are
/// read as one word (SWAR): the `-ttt` and `-T` fields are read this way on every line.
#[inline(always)]
pub(crate) fn fixed_digits<const N: usize>(d: &[u8; N]) -> Option<u64> {
    if N <= 2 {
        // One or two digits: the arithmetic itself is cheaper than the padded word (whose
        // copy through the stack was not inlined, three times a `-tt` line: bench/PROFILE.md,
        // parser side from 55f41f7).
        let mut v = 0u64;
        let mut bad = false;
        for &b in d {
            let x = b.wrapping_sub(b'0');
            bad |= x > 9;
            v = v * 10 + x as u64;
        }
        return (!bad).then_some(v);
    }
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

/// The last `N` of eight bytes at fixed positions -> their value, or None if any is not a
/// digit: the word is loaded whole and its first `8 - N` bytes replaced by '0' in a
/// register, cheaper than `fixed_digits`' padded copy when the digits follow other bytes
/// of the line (the six fraction digits of a timestamp or a `-T` duration).
#[inline(always)]
pub(crate) fn fixed_digits_tail<const N: usize>(w: &[u8; 8]) -> Option<u64> {
    const { assert!(matches!(N, 1..=8)) };
    let w = u64::from_le_bytes(*w);
    let keep = u64::MAX << (8 * (8 - N));
    eight_digits((w & keep) | (0x3030_3030_3030_3030 & !keep))
}

/// `HH:MM:SS` (eight bytes) -> (hours, minutes, seconds), or None unless both colons sit at
/// their places and the six others are digits (the fields are not range-checked here). One
/// word: the three pairs are moved to "00HHMMSS" in a register, checked as eight digits, and
/// each pair's value taken from its 16-bit lane (the first step of `eight_digits`).
#[inline(always)]
pub(crate) fn hms_seconds(w: &[u8; 8]) -> Option<(u64, u64, u64)> {
    if w[2] != b':' || w[5] != b':' {
        return None;
    }
    const HIGH_NIBBLES: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    let x = u64::from_le_bytes(*w);
    let y = ((x & 0xFFFF) << 16) | ((x & 0xFFFF << 24) << 8) | (x & 0xFFFF << 48) | 0x3030;
    let digits = (y & HIGH_NIBBLES) | ((y.wrapping_add(0x0606_0606_0606_0606) & HIGH_NIBBLES) >> 4);
    if digits != 0x3333_3333_3333_3333 {
        return None;
    }
    let v = y - 0x3030_3030_3030_3030;
    let v = (v * 10 + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    Some(((v >> 16) & 0xFF, (v >> 32) & 0xFF, v >> 48))
}

/// `w`'s sixteen bytes less `'0'` each, or None unless each byte `at_digits` marks (-1) is
/// a digit and each other byte is the one `marks` holds there: the shape test both SSE2 stamp
/// readings share.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn digits_and_marks(
    w: &[u8; 16],
    at_digits: std::arch::x86_64::__m128i,
    marks: std::arch::x86_64::__m128i,
) -> Option<std::arch::x86_64::__m128i> {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_andnot_si128, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8,
        _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8, _mm_sub_epi8,
    };
    // SAFETY: SSE2 is in the x86_64 baseline; the load reads the sixteen bytes of `w`.
    unsafe {
        let v = _mm_loadu_si128(w.as_ptr() as *const __m128i);
        let d = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
        // A digit is a byte whose distance above '0' is at most 9 (unsigned).
        let digit = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
        let ok = _mm_or_si128(
            _mm_and_si128(at_digits, digit),
            _mm_andnot_si128(at_digits, _mm_cmpeq_epi8(v, marks)),
        );
        (_mm_movemask_epi8(ok) == 0xFFFF).then_some(d)
    }
}

/// `HH:MM:SS.ffffff ` (sixteen bytes: `-tt`'s stamp and the blank after it) -> µs since
/// midnight, or None unless the colons, the point and the blank sit at their places, the
/// twelve others are digits, and the time is a time of day (hours to 23, minutes to 59,
/// seconds to 60 for a leap second). One SSE2 pass (part of every x86_64): all sixteen bytes
/// checked at once, the digit pairs combined by two `pmaddwd`s, where the word-at-a-time
/// reading (`hms_seconds`, then `fixed_digits_tail` for the fraction, then the range tests)
/// cost more on every `-tt` line (bench/PROFILE.md, parser round from 545d9c0).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn tod_usec(w: &[u8; 16]) -> Option<u64> {
    use std::arch::x86_64::{
        _mm_cmpgt_epi32, _mm_cvtsi128_si64, _mm_madd_epi16, _mm_movemask_epi8, _mm_packs_epi32,
        _mm_setr_epi16, _mm_setr_epi32, _mm_setr_epi8, _mm_setzero_si128, _mm_srli_si128,
        _mm_unpackhi_epi8, _mm_unpacklo_epi8,
    };
    // SAFETY: SSE2 is in the x86_64 baseline.
    unsafe {
        let d = digits_and_marks(
            w,
            _mm_setr_epi8(-1, -1, 0, -1, -1, 0, -1, -1, 0, -1, -1, -1, -1, -1, -1, 0),
            _mm_setr_epi8(
                0, 0, b':' as i8, 0, 0, b':' as i8, 0, 0, b'.' as i8, 0, 0, 0, 0, 0, 0, b' ' as i8,
            ),
        )?;
        // Bytes to 16-bit lanes; the marks' lanes get weight 0. First pairs:
        // [H0 H1 : M0 M1 : S0 S1] -> [h, 10*M0, M1, s]; [. f0 f1 f2 f3 f4 f5 _] -> [f0, f1f2, f3f4, f5].
        let zero = _mm_setzero_si128();
        let lo = _mm_madd_epi16(
            _mm_unpacklo_epi8(d, zero),
            _mm_setr_epi16(10, 1, 0, 10, 1, 0, 10, 1),
        );
        let hi = _mm_madd_epi16(
            _mm_unpackhi_epi8(d, zero),
            _mm_setr_epi16(0, 1, 10, 1, 10, 1, 1, 0),
        );
        // Minutes to 59 is a tens digit to 5; the units of minutes are a digit already.
        if _mm_movemask_epi8(_mm_cmpgt_epi32(lo, _mm_setr_epi32(23, 50, 9, 60))) != 0 {
            return None;
        }
        // Then [3600 h + 600 M0, 60 M1 + s, f0f1f2, f3f4f5] (every lane below 2^15 before).
        let r = _mm_madd_epi16(
            _mm_packs_epi32(lo, hi),
            _mm_setr_epi16(3600, 60, 60, 1, 100, 1, 10, 1),
        );
        let a = _mm_cvtsi128_si64(r) as u64;
        let b = _mm_cvtsi128_si64(_mm_srli_si128(r, 8)) as u64;
        let secs = (a & 0xFFFF_FFFF) + (a >> 32);
        Some(secs * 1_000_000 + (b & 0xFFFF_FFFF) * 1000 + (b >> 32))
    }
}

/// `DDDDDDDD.ffffff ` (sixteen bytes: the last eight digits of `-ttt`'s seconds, the point,
/// the microseconds and the blank after them) -> (those eight digits' value, µs), or None
/// unless the point and the blank sit at their places and the fourteen others are digits.
/// The same SSE2 pass as `tod_usec`, with the pairs combined to four-digit groups.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn epoch_tail_usec(w: &[u8; 16]) -> Option<(u64, u64)> {
    use std::arch::x86_64::{
        _mm_cvtsi128_si64, _mm_madd_epi16, _mm_packs_epi32, _mm_setr_epi16, _mm_setr_epi8,
        _mm_setzero_si128, _mm_srli_si128, _mm_unpackhi_epi8, _mm_unpacklo_epi8,
    };
    // SAFETY: SSE2 is in the x86_64 baseline.
    unsafe {
        let d = digits_and_marks(
            w,
            _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 0, -1, -1, -1, -1, -1, -1, 0),
            _mm_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, b'.' as i8, 0, 0, 0, 0, 0, 0, b' ' as i8,
            ),
        )?;
        let zero = _mm_setzero_si128();
        // Pairs: [d0d1, d2d3, d4d5, d6d7] and [f0, f1f2, f3f4, f5], then
        // [d0d1d2d3, d4d5d6d7, f0f1f2, f3f4f5].
        let lo = _mm_madd_epi16(
            _mm_unpacklo_epi8(d, zero),
            _mm_setr_epi16(10, 1, 10, 1, 10, 1, 10, 1),
        );
        let hi = _mm_madd_epi16(
            _mm_unpackhi_epi8(d, zero),
            _mm_setr_epi16(0, 1, 10, 1, 10, 1, 1, 0),
        );
        let r = _mm_madd_epi16(
            _mm_packs_epi32(lo, hi),
            _mm_setr_epi16(100, 1, 100, 1, 100, 1, 10, 1),
        );
        let a = _mm_cvtsi128_si64(r) as u64;
        let b = _mm_cvtsi128_si64(_mm_srli_si128(r, 8)) as u64;
        Some((
            (a & 0xFFFF_FFFF) * 10_000 + (a >> 32),
            (b & 0xFFFF_FFFF) * 1000 + (b >> 32),
        ))
    }
}

/// `epoch_tail_usec` word by word, where SSE2 is not the baseline.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn epoch_tail_usec(w: &[u8; 16]) -> Option<(u64, u64)> {
    epoch_tail_usec_words(w)
}

/// `epoch_tail_usec` without SIMD: the reference its tests compare with.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn epoch_tail_usec_words(w: &[u8; 16]) -> Option<(u64, u64)> {
    if w[8] != b'.' || w[15] != b' ' {
        return None;
    }
    let secs = eight_digits(u64::from_le_bytes(w[0..8].try_into().ok()?))?;
    let us = fixed_digits_tail::<6>(w[7..15].try_into().ok()?)?;
    Some((secs, us))
}

/// `tod_usec` word by word, where SSE2 is not the baseline.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn tod_usec(w: &[u8; 16]) -> Option<u64> {
    tod_usec_words(w)
}

/// `tod_usec` without SIMD: the reference its tests compare with.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn tod_usec_words(w: &[u8; 16]) -> Option<u64> {
    if w[8] != b'.' || w[15] != b' ' {
        return None;
    }
    let (h, m, sec) = hms_seconds(w[0..8].try_into().ok()?)?;
    let us = fixed_digits_tail::<6>(w[7..15].try_into().ok()?)?;
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    Some((h * 3600 + m * 60 + sec) * 1_000_000 + us)
}

/// Eight ASCII digits in a little-endian word -> their value: checked all digits, then
/// combined pairwise (1+1 -> 2 -> 4 -> 8 digits) with three multiplications.
#[inline(always)]
pub(crate) fn eight_digits(w: u64) -> Option<u64> {
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

/// Whether the end of `s` lies outside any quoted string: quotes counted sixteen bytes at a
/// time with SSE2 (part of every x86_64). A quote right after a backslash (escaped, or after
/// an escaped backslash) sends the string to the exact byte-wise count. This runs on every
/// line with a string argument, where memchr's per-call setup cost more than the scan.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn outside_strings(s: &[u8]) -> bool {
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
    // A quote right after a backslash, counting one carried over from the previous step.
    let escaped = |q: u32, b: u32, carry: u32| ((b << 1) | carry) & q != 0;
    // Only the parity of the count matters, and count_ones(a) + count_ones(b) has the parity
    // of count_ones(a ^ b): the masks are xored and one parity taken at the end.
    let mut quotes = 0u32;
    // Whether the byte before the current step is a backslash.
    let mut carry = 0u32;
    let mut i = 0;
    // Thirty-two bytes a step: one test and one carry for two loads.
    while i + 32 <= s.len() {
        let (q0, b0) = masks(i);
        let (q1, b1) = masks(i + 16);
        let (q, b) = (q0 | q1 << 16, b0 | b1 << 16);
        if escaped(q, b, carry) {
            return outside_strings_exact(s);
        }
        carry = b >> 31;
        quotes ^= q;
        i += 32;
    }
    // The last 1 to 31 bytes: the final 16 of `s` (and the 16 at `i` before them), less
    // what was already counted.
    let rem = s.len() - i;
    if rem > 0 {
        let (q, b) = if rem <= 16 {
            let done = 16 - rem as u32;
            let (q, b) = masks(s.len() - 16);
            (q >> done, b >> done)
        } else {
            let done = 32 - rem as u32;
            let (q0, b0) = masks(i);
            let (q1, b1) = masks(s.len() - 16);
            (q0 | (q1 >> done) << 16, b0 | (b1 >> done) << 16)
        };
        if escaped(q, b, carry) {
            return outside_strings_exact(s);
        }
        quotes ^= q;
    }
    // Parity by folding to four bits and a 16-entry bit table (no popcnt in baseline x86_64).
    let x = quotes ^ (quotes >> 16);
    let x = x ^ (x >> 8);
    let x = x ^ (x >> 4);
    (0x6996u32 >> (x & 0xF)) & 1 == 0
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn outside_strings(s: &[u8]) -> bool {
    outside_strings_exact(s)
}

/// `outside_strings`, byte by byte: a quote counts unless an odd run of backslashes
/// precedes it.
pub(crate) fn outside_strings_exact(s: &[u8]) -> bool {
    let mut open = false;
    for q in memchr::memchr_iter(b'"', s) {
        let bs = s[..q].iter().rev().take_while(|b| **b == b'\\').count();
        if bs % 2 == 0 {
            open = !open;
        }
    }
    !open
}

/// One step of `Quoted`: what the bytes at the scanner's position are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// A byte outside any string (never a quote).
    Code(u8),
    /// The quote that opens a string.
    Open,
    /// A run of plain bytes inside a string (no quote, no backslash).
    Text(usize, usize),
    /// A backslash and the byte it escapes inside a string (`end` may be past the text
    /// when the backslash is its last byte).
    Escape(usize, usize),
    /// The quote that closes a string.
    Close,
}

/// A walk over strace text that knows whether it is inside a quoted string: strace escapes
/// every quote and backslash inside a string, so a backslash there always takes the next
/// byte with it. The argument splitter, the redactor and the perf label stripper all walk
/// lines this way; `pos` may be moved forward by the caller (to skip an `<annotation>`).
pub(crate) struct Quoted<'a> {
    s: &'a [u8],
    pub pos: usize,
    in_str: bool,
}

impl<'a> Quoted<'a> {
    #[inline]
    pub(crate) fn new(s: &'a [u8]) -> Self {
        Quoted {
            s,
            pos: 0,
            in_str: false,
        }
    }

    /// Whether the scanner stands inside a string (a text cut off there ends inside one).
    #[inline]
    pub(crate) fn in_string(&self) -> bool {
        self.in_str
    }
}

impl Iterator for Quoted<'_> {
    type Item = (usize, Piece);

    #[inline]
    fn next(&mut self) -> Option<(usize, Piece)> {
        let at = self.pos;
        let b = *self.s.get(at)?;
        let piece = if self.in_str {
            match b {
                b'\\' => {
                    self.pos += 2;
                    Piece::Escape(at, at + 2)
                }
                b'"' => {
                    self.in_str = false;
                    self.pos += 1;
                    Piece::Close
                }
                _ => {
                    let n =
                        memchr::memchr2(b'"', b'\\', &self.s[at..]).unwrap_or(self.s.len() - at);
                    self.pos += n;
                    Piece::Text(at, at + n)
                }
            }
        } else if b == b'"' {
            self.in_str = true;
            self.pos += 1;
            Piece::Open
        } else {
            self.pos += 1;
            Piece::Code(b)
        };
        Some((at, piece))
    }
}

/// Unescapes a C string literal as strace prints it (after its opening quote), handing
/// each byte to `push`. Returns (closed, truncated-marker `...` after the quote).
pub(crate) fn unescape_with(s: &[u8], mut push: impl FnMut(u8)) -> (bool, bool) {
    unescape_while(s, |c| {
        push(c);
        true
    })
}

/// `unescape_with`, stopping early when `push` returns false (then nothing is known about
/// the end of the string: both flags are false).
pub(crate) fn unescape_while(s: &[u8], mut push: impl FnMut(u8) -> bool) -> (bool, bool) {
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
pub(crate) fn unescape(s: &[u8], cap: usize) -> (Vec<u8>, bool, bool) {
    let mut out = Vec::new();
    let (closed, truncated) = unescape_with(s, |c| {
        if out.len() < cap {
            out.push(c)
        }
    });
    (out, closed, truncated)
}

pub(crate) fn lossy(b: &[u8]) -> Box<str> {
    String::from_utf8_lossy(b).into_owned().into_boxed_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &[u8]) -> Vec<Piece> {
        Quoted::new(s).map(|(_, p)| p).collect()
    }

    #[test]
    fn quoted_scanner_steps_over_strings_and_escapes() {
        use Piece::*;
        assert_eq!(
            pieces(br#"a"b\"c"d"#),
            [
                Code(b'a'),
                Open,
                Text(2, 3),
                Escape(3, 5),
                Text(5, 6),
                Close,
                Code(b'd')
            ]
        );
        // Cut off inside a string, and after a lone backslash.
        let mut q = Quoted::new(br#"x, "abc"#);
        assert_eq!(q.by_ref().count(), 5);
        assert!(q.in_string());
        assert_eq!(pieces(br#""\"#), [Open, Escape(1, 3)]);
    }

    /// `HH:MM:SS` in one word: the fields, and None for a misplaced colon or a non-digit.
    #[test]
    fn hms_seconds_reads_time_of_day() {
        assert_eq!(hms_seconds(b"01:10:29"), Some((1, 10, 29)));
        assert_eq!(hms_seconds(b"23:59:60"), Some((23, 59, 60)));
        assert_eq!(hms_seconds(b"00:00:00"), Some((0, 0, 0)));
        assert_eq!(hms_seconds(b"99:98:97"), Some((99, 98, 97)));
        assert_eq!(hms_seconds(b"10:09:01"), Some((10, 9, 1)));
        for bad in [
            b"1:10:290",
            b"01.10:29",
            b"01:10.29",
            b"0a:10:29",
            b"01:10:2 ",
            b"01:1::29",
        ] {
            assert_eq!(hms_seconds(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(fixed_digits::<2>(b"07"), Some(7));
        assert_eq!(fixed_digits::<2>(b"7:"), None);
        assert_eq!(fixed_digits::<1>(b"/"), None);
    }

    /// The SSE2 stamp reader reads what the word-by-word one reads, and refuses what it
    /// refuses: every byte value at every place of a few stamps, and the range edges.
    #[test]
    fn tod_usec_agrees_with_the_word_reader() {
        for base in [
            b"01:10:29.000043 ",
            b"23:59:60.999999 ",
            b"00:00:00.000000 ",
            b"19:05:59.123456 ",
        ] {
            for at in 0..16 {
                for b in 0..=255u8 {
                    let mut w = *base;
                    w[at] = b;
                    assert_eq!(tod_usec(&w), tod_usec_words(&w), "{at} {b}");
                }
            }
        }
        assert_eq!(
            tod_usec(b"01:10:29.000043 "),
            Some((3600 + 600 + 29) * 1_000_000 + 43)
        );
        assert_eq!(tod_usec(b"23:59:60.999999 "), Some(86_400_999_999));
        for bad in [
            b"24:00:00.000000 ",
            b"23:60:00.000000 ",
            b"23:59:61.000000 ",
            b"23:59:59.000000x",
            b"23:59:59,000000 ",
        ] {
            assert_eq!(tod_usec(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    /// The SSE2 epoch reader reads what the word-by-word one reads, and refuses what it
    /// refuses, for every byte value at every place.
    #[test]
    fn epoch_tail_usec_agrees_with_the_word_reader() {
        for base in [
            b"54669829.000043 ",
            b"99999999.999999 ",
            b"00000000.000000 ",
        ] {
            for at in 0..16 {
                for b in 0..=255u8 {
                    let mut w = *base;
                    w[at] = b;
                    assert_eq!(epoch_tail_usec(&w), epoch_tail_usec_words(&w), "{at} {b}");
                }
            }
        }
        assert_eq!(epoch_tail_usec(b"54669829.000043 "), Some((54_669_829, 43)));
        assert_eq!(
            epoch_tail_usec(b"12345678.901234 "),
            Some((12_345_678, 901_234))
        );
    }

    /// The sixteen-byte name scan counts what the byte loop counts, for every byte value at
    /// every place of a 16- to 40-byte text and for short texts.
    #[test]
    fn name_len_agrees_with_the_byte_loop() {
        let slow = |s: &[u8]| s.iter().take_while(|b| is_name_byte(**b)).count();
        for len in [0usize, 1, 5, 15, 16, 17, 31, 40] {
            for at in 0..len.max(1) {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    if at < len {
                        s[at] = b;
                    }
                    assert_eq!(name_len(&s), slow(&s), "{len} {at} {b}");
                }
            }
        }
        assert_eq!(name_len(b"epoll_wait(5, [{events=EPOLLIN"), 10);
        assert_eq!(name_len(b"Z9_zA0(xxxxxxxxxxxxxxxxxxxxx"), 6);
    }

    #[test]
    fn hex_numbers() {
        assert_eq!(parse_hex(b"0x6, "), Some((6, 3)));
        assert_eq!(parse_hex(b"0xfF"), Some((255, 4)));
        assert_eq!(parse_hex(b"0x"), None);
        assert_eq!(parse_hex(b"12"), None);
    }

    /// The word-at-a-time digit reader agrees with plain arithmetic, and refuses non-digits.
    #[test]
    fn eight_digits_reads_words_of_digits() {
        for v in [
            0u64, 7, 10, 99, 12_345_678, 99_999_999, 40_000_001, 10_203_040,
        ] {
            let text = format!("{v:08}");
            let w = u64::from_le_bytes(text.as_bytes().try_into().unwrap());
            assert_eq!(eight_digits(w), Some(v), "{text}");
            assert_eq!(
                fixed_digits::<8>(text.as_bytes().try_into().unwrap()),
                Some(v)
            );
        }
        assert_eq!(fixed_digits::<6>(b"000071"), Some(71));
        assert_eq!(fixed_digits::<1>(b"9"), Some(9));
        assert_eq!(fixed_digits::<10>(b"1354669829"), Some(1_354_669_829));
        for bad in [
            *b"1234567a",
            *b"1234 678",
            *b"/2345678",
            *b":2345678",
            *b"\xb012345\x007",
        ] {
            assert_eq!(eight_digits(u64::from_le_bytes(bad)), None, "{bad:?}");
        }
        assert_eq!(fixed_digits::<6>(b"00.071"), None);
        assert_eq!(fixed_digits_tail::<6>(b"9.000071"), Some(71));
        assert_eq!(fixed_digits_tail::<6>(b"<0123456"), Some(123_456));
        assert_eq!(fixed_digits_tail::<6>(b"00.0a071"), None);
        assert_eq!(fixed_digits_tail::<8>(b"12345678"), Some(12_345_678));
        assert_eq!(fixed_digits_tail::<1>(b"xxxxxxx7"), Some(7));
    }

    /// The sixteen-bytes-at-a-time quote count agrees with the byte-wise one: quotes at every
    /// position of a block, escaped quotes and backslashes, runs across block ends.
    #[test]
    fn outside_strings_matches_the_exact_count() {
        let pieces: [&[u8]; 8] = [
            b"\"", b"\\\"", b"\\\\", b"a", b"\\\\\"", b"xyz, ", b"\"...", b"1",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut r = seed;
            let mut s = vec![];
            for _ in 0..(r % 24) {
                r = r.rotate_left(5) ^ 0x9e37_79b9;
                s.extend_from_slice(pieces[(r % 8) as usize]);
            }
            assert_eq!(
                outside_strings(&s),
                outside_strings_exact(&s),
                "{}",
                String::from_utf8_lossy(&s)
            );
        }
        // Every length across the 16- and 32-byte steps and their tails, one quote (or an
        // escaped one) at every position.
        for n in 1..100usize {
            for at in 0..n {
                let mut s = vec![b'a'; n];
                s[at] = b'"';
                assert!(!outside_strings(&s), "{n} {at}");
                if at > 0 {
                    s[at - 1] = b'\\';
                    assert_eq!(outside_strings(&s), outside_strings_exact(&s), "{n} {at}");
                }
                s[n - 1 - (at == n - 1) as usize * (n > 1) as usize] = b'"';
                assert_eq!(outside_strings(&s), outside_strings_exact(&s), "{n} {at}");
            }
        }
    }
}
