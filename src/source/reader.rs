//! Bytes to lines: a reader over a file, stdin or a gzip stream (detected from its magic)
//! that hands out each line as a slice of one reusable buffer, never copying or allocating
//! per line, with reading (and gunzip) optionally moved to a thread of its own. Lines longer
//! than a bound are reported once by their head and dropped, so memory stays bounded.

use anyhow::{Context, Result};
use std::io::Read;

/// Longest line kept whole; longer ones (a -s 1M write) are skipped, never buffered whole,
/// so memory stays bounded whatever the input.
const MAX_LINE: usize = 1 << 20;
const CHUNK: usize = 1 << 18;

/// A byte-line reader over any `Read`: lines are slices into one reusable buffer, so the
/// hot loop copies nothing and allocates nothing.
pub struct LineReader {
    inner: Box<dyn Read + Send>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    /// Currently discarding the rest of an over-long line.
    skipping_long: bool,
    /// Set by `read_ahead`: chunks come from a reader thread instead of `inner`.
    ahead: Option<ReadAhead>,
    /// The input ended early (a truncated gzip stream).
    pub(super) cut_short: bool,
}

/// Free room at the front of each read-ahead chunk, where the unfinished end of the previous
/// chunk is copied so that a line never has to be stitched from two buffers.
const PAD: usize = 4096;
/// Filled chunks waiting for the parser.
const AHEAD_DEPTH: usize = 2;

/// The reading end of a reader thread: filled chunks (`PAD` bytes of room, then the data
/// and its length), and a way to give spent chunks back for reuse.
struct ReadAhead {
    chunks: std::sync::mpsc::Receiver<std::io::Result<(Vec<u8>, usize)>>,
    spare: std::sync::mpsc::Sender<Vec<u8>>,
}

pub enum Line<'a> {
    Text(&'a [u8]),
    TooLong(&'a [u8]),
}

impl LineReader {
    pub fn new(inner: Box<dyn Read + Send>) -> Self {
        LineReader {
            inner,
            buf: vec![0; CHUNK],
            start: 0,
            end: 0,
            eof: false,
            skipping_long: false,
            ahead: None,
            cut_short: false,
        }
    }

    /// Moves the reading (the kernel's copy out of the page cache, or gunzip) to a thread of
    /// its own, so that it overlaps with parsing: for one big input the parser's thread is
    /// the slowest stage of the pipeline. Lines are unchanged; memory grows by a few chunks
    /// (about 1 MB).
    pub fn read_ahead(&mut self) {
        if self.ahead.is_some() || self.eof {
            return;
        }
        let mut inner: Box<dyn Read + Send> =
            std::mem::replace(&mut self.inner, Box::new(std::io::empty()));
        let (tx, chunks) = std::sync::mpsc::sync_channel(AHEAD_DEPTH);
        let (spare, spares) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || loop {
            let mut c = spares.try_recv().unwrap_or_else(|_| vec![0; PAD + CHUNK]);
            let n = loop {
                match inner.read(&mut c[PAD..]) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            let last = !matches!(n, Ok(n) if n > 0);
            // The receiver is gone when the reader was dropped early: stop quietly.
            if tx.send(n.map(|n| (c, n))).is_err() || last {
                return;
            }
        });
        self.ahead = Some(ReadAhead { chunks, spare });
    }

    /// `fill` from the reader thread: the next chunk becomes the buffer, with the unread
    /// rest of the current one copied into its front room.
    fn fill_ahead(&mut self) -> std::io::Result<bool> {
        let Some(a) = &self.ahead else {
            return Ok(false);
        };
        let rest = self.end - self.start;
        if rest >= MAX_LINE {
            return Ok(false);
        }
        let (mut c, n) = match a.chunks.recv() {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.cut_short = true;
                (Vec::new(), 0)
            }
            Ok(r) => r?,
            // The thread ended after its last chunk.
            Err(_) => (Vec::new(), 0),
        };
        if n == 0 {
            self.eof = true;
            return Ok(true);
        }
        if rest <= PAD {
            c[PAD - rest..PAD].copy_from_slice(&self.buf[self.start..self.end]);
            let old = std::mem::replace(&mut self.buf, c);
            self.start = PAD - rest;
            self.end = PAD + n;
            if old.len() == PAD + CHUNK {
                let _ = a.spare.send(old);
            }
        } else {
            // A line longer than the room: grow this buffer instead (rare, bounded by
            // MAX_LINE plus a chunk).
            self.buf.copy_within(self.start..self.end, 0);
            self.buf.truncate(rest);
            self.buf.extend_from_slice(&c[PAD..PAD + n]);
            self.start = 0;
            self.end = self.buf.len();
            let _ = a.spare.send(c);
        }
        Ok(true)
    }

    fn fill(&mut self) -> std::io::Result<bool> {
        if self.ahead.is_some() {
            return self.fill_ahead();
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            if self.buf.len() >= MAX_LINE {
                return Ok(false);
            }
            self.buf.resize((self.buf.len() * 2).min(MAX_LINE), 0);
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(true);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    // A gzip stream that stops mid-member: the file was copied while it
                    // was being written. What came before is good; say where it ended.
                    self.cut_short = true;
                    self.eof = true;
                    return Ok(true);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The first bytes of the input, without consuming them (for format detection).
    pub fn peek(&mut self, want: usize) -> std::io::Result<&[u8]> {
        while self.end - self.start < want && !self.eof {
            if !self.fill()? {
                break;
            }
        }
        Ok(&self.buf[self.start..self.end])
    }

    pub fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        loop {
            let avail = &self.buf[self.start..self.end];
            if let Some(nl) = find_newline(avail) {
                let s = self.start;
                self.start += nl + 1;
                if self.skipping_long {
                    self.skipping_long = false;
                    continue;
                }
                if nl >= MAX_LINE {
                    // Only a read-ahead buffer can hold one whole: the same verdict as when
                    // the buffer fills first.
                    return Ok(Some(Line::TooLong(&self.buf[s..s + 120])));
                }
                return Ok(Some(Line::Text(&self.buf[s..s + nl])));
            }
            if self.eof {
                if self.start == self.end {
                    return Ok(None);
                }
                let s = self.start;
                self.start = self.end;
                if self.skipping_long {
                    self.skipping_long = false;
                    return Ok(None);
                }
                return Ok(Some(Line::Text(&self.buf[s..self.end])));
            }
            if !self.fill()? {
                // Buffer full without a newline: report the line once, drop the rest of it.
                let keep = 120.min(self.end);
                let head_end = self.start + keep;
                self.skipping_long = true;
                let s = self.start;
                self.start = self.end;
                // The head is still in the buffer until the next fill.
                return Ok(Some(Line::TooLong(&self.buf[s..head_end])));
            }
        }
    }
}

/// The first newline in `s`. Lines are short (about a hundred bytes), so the setup of a
/// general `memchr` call (alignment, dispatch) cost as much as the scan itself: this looks
/// at 64 bytes a step with four SSE2 compares (part of every x86_64), inline in the line loop,
/// then 32, and hands the last few bytes to `memchr`. 64 a step: a line is two steps, not
/// four, and the four masks are combined only in the step that holds the newline.
#[cfg(target_arch = "x86_64")]
#[inline]
fn find_newline(s: &[u8]) -> Option<usize> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let mut i = 0;
    // SAFETY (both loops): SSE2 is in the x86_64 baseline, and `i + 64 <= s.len()` (or
    // `i + 32`) keeps every unaligned 16-byte load inside `s`.
    let eq = |i: usize| unsafe {
        _mm_cmpeq_epi8(
            _mm_loadu_si128(s.as_ptr().add(i) as *const __m128i),
            _mm_set1_epi8(b'\n' as i8),
        )
    };
    while i + 64 <= s.len() {
        let (a, b, c, d) = (eq(i), eq(i + 16), eq(i + 32), eq(i + 48));
        // SAFETY: as above (SSE2 only).
        let m = unsafe {
            if _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d))) == 0 {
                0
            } else {
                let mask = |v| _mm_movemask_epi8(v) as u32 as u64;
                mask(a) | mask(b) << 16 | mask(c) << 32 | mask(d) << 48
            }
        };
        if m != 0 {
            return Some(i + m.trailing_zeros() as usize);
        }
        i += 64;
    }
    if i + 32 <= s.len() {
        let (a, b) = (eq(i), eq(i + 16));
        // SAFETY: as above (SSE2 only).
        let m = unsafe { _mm_movemask_epi8(a) as u32 | (_mm_movemask_epi8(b) as u32) << 16 };
        if m != 0 {
            return Some(i + m.trailing_zeros() as usize);
        }
        i += 32;
    }
    memchr::memchr(b'\n', &s[i..]).map(|k| i + k)
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn find_newline(s: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', s)
}

/// Opens a file (or `-` for stdin), transparently gunzipping, counting the raw bytes read
/// from the file (under any gzip decoder) into `counter`, for a progress bar.
pub fn open_input_counted(path: &str, counter: Option<ByteCounter>) -> Result<LineReader> {
    let raw: Box<dyn Read + Send> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        let f = std::fs::File::open(path).with_context(|| format!("cannot open {path}"))?;
        match counter {
            Some(c) => Box::new(crate::progress::CountingRead::new(f, c)),
            None => Box::new(f),
        }
    };
    let mut r = LineReader::new(raw);
    let head = r.peek(2).with_context(|| format!("cannot read {path}"))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        // Hand the already-read bytes back to the decoder.
        let pre = head.to_vec();
        let rest = std::mem::replace(&mut r.inner, Box::new(std::io::empty()));
        let chained = std::io::Cursor::new(pre).chain(rest);
        return Ok(LineReader::new(Box::new(
            flate2::read::MultiGzDecoder::new(chained),
        )));
    }
    Ok(r)
}

/// Bytes read so far from the input files (shared with the progress bar).
pub type ByteCounter = std::sync::Arc<std::sync::atomic::AtomicU64>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its bytes in uneven pieces, as pipes and decoders do.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        n: usize,
    }

    impl Read for Pieces {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            self.n = (self.n * 7 + 3) % 70_000 + 1;
            let k = self.n.min(out.len()).min(self.data.len() - self.at);
            out[..k].copy_from_slice(&self.data[self.at..self.at + k]);
            self.at += k;
            Ok(k)
        }
    }

    fn lines(data: &[u8], ahead: bool) -> Vec<(bool, Vec<u8>)> {
        let mut r = LineReader::new(Box::new(Pieces {
            data: data.to_vec(),
            at: 0,
            n: 1,
        }));
        r.peek(100).unwrap();
        if ahead {
            r.read_ahead();
        }
        let mut out = vec![];
        while let Some(l) = r.next_line().unwrap() {
            out.push(match l {
                Line::Text(t) => (true, t.to_vec()),
                Line::TooLong(h) => (false, h.to_vec()),
            });
        }
        out
    }

    /// The inline newline scan finds what `memchr` finds, at every offset and length
    /// around its 64- and 32-byte steps.
    #[test]
    fn find_newline_agrees_with_memchr() {
        for len in 0..200 {
            for at in 0..=len {
                let mut s = vec![b'x'; len];
                if at < len {
                    s[at] = b'\n';
                    // A second newline later must not win.
                    if at + 5 < len {
                        s[at + 5] = b'\n';
                    }
                }
                assert_eq!(find_newline(&s), memchr::memchr(b'\n', &s), "{len} {at}");
            }
        }
    }

    /// The read-ahead reader yields exactly the lines of the plain one: across chunk ends,
    /// lines longer than its front room, over-long lines and a last line with no newline.
    #[test]
    fn read_ahead_yields_the_same_lines() {
        let mut data = vec![];
        let lens = [
            0,
            1,
            80,
            PAD - 1,
            PAD,
            PAD + 1,
            CHUNK - 1,
            CHUNK + 7,
            MAX_LINE - 1,
            MAX_LINE,
            MAX_LINE + 5,
            3 * CHUNK,
        ];
        for (i, len) in lens.iter().cycle().take(40).enumerate() {
            data.extend((0..*len).map(|j| b'a' + ((i + j) % 26) as u8));
            data.push(b'\n');
        }
        data.extend_from_slice(b"last line without a newline");
        let plain = lines(&data, false);
        let ahead = lines(&data, true);
        assert_eq!(plain.len(), 41);
        assert!(
            plain.iter().any(|(text, _)| !text),
            "some lines are too long"
        );
        assert!(plain == ahead, "the read-ahead reader changed the lines");
        assert_eq!(lines(b"", true), vec![]);
    }
}
