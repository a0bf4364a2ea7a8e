//! Bytes to lines: a reader over a file, stdin or a gzip stream (detected from its magic)
//! that hands out each line as a slice of one reusable buffer (or of a read-only mapping of
//! a big plain file), never copying or allocating per line, with reading (gunzip, or mapping
//! the file) optionally done ahead, by a thread of its own or by the pipeline's threads in
//! turn (`pump`). Lines longer than a bound are reported once by their head and dropped, so
//! memory stays bounded.

use super::pump::{Help, Producer, Pump};
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
    buf: Buf,
    /// A plain file big enough to be worth mapping (a second handle on `inner`'s file, so
    /// the two share its offset), with the progress counter `inner` counts into.
    mappable: Option<Mappable>,
    start: usize,
    end: usize,
    eof: bool,
    /// Currently discarding the rest of an over-long line.
    skipping_long: bool,
    /// Set by `read_ahead`: chunks come from a reader thread, or from the pipeline's two
    /// threads in turn, instead of `inner`.
    ahead: Option<Ahead>,
    /// The input ended early (a truncated gzip stream).
    pub(super) cut_short: bool,
    /// Bytes the buffer is kept to between long lines (and after format detection, which
    /// peeks further): `CHUNK`, or less for each file of a set of hundreds.
    chunk: usize,
    /// The descriptor of the plain file `inner` reads (owned by `inner`, so valid while
    /// `inner` is), and the progress counter it counts into: what a peek read can be given
    /// back and read again when it is needed (`release_peek`).
    rewind: Option<(std::os::fd::RawFd, Option<ByteCounter>)>,
}

/// A plain file big enough to be worth mapping: a second handle on the reader's file (the
/// two share its offset), the progress counter the reader counts into, and the file's name
/// for the message if it shrinks while it is mapped.
struct Mappable {
    file: std::fs::File,
    counter: Option<ByteCounter>,
    path: String,
}

/// Free room at the front of each read-ahead chunk, where the unfinished end of the previous
/// chunk is copied so that a line never has to be stitched from two buffers.
const PAD: usize = 4096;
/// Filled chunks waiting for the parser (about 2 MB). As a third busy thread (on a machine
/// with more cores than two, or before `pump`), gunzip ran ahead through a few scheduler
/// slices with this room instead of stalling the other two (a gzipped run was slower with 2:
/// bench/PROFILE.md, ninth round).
const AHEAD_DEPTH: usize = 8;
/// Mapped windows waiting for the parser: their pages are resident, and mapping costs the
/// reader thread so little that it is never the stage that falls behind.
const MAPPED_DEPTH: usize = 2;

/// Plain files at least this big are mapped instead of read: below it the copy costs
/// nothing worth a thread's mappings.
pub(super) const MIN_MAP: u64 = 4 << 20;
/// Bytes of the file one mapping covers. Its pages are resident while it is queued or
/// being parsed (at most about five windows at once, 10 MB), so this bounds the memory
/// mapping adds, as `CHUNK` does for reading. Each unmap of a window the parser's thread
/// touched interrupts the other core to flush its TLB: with 512 KiB windows those flushes
/// and the mapping calls were the reader thread's main cost, and 2 MiB windows made a run
/// faster for a few MB of RSS, where larger ones cost memory and gained nothing
/// (bench/PROFILE.md, eleventh round).
const WINDOW: usize = 2 << 20;

/// The reading end of a reader thread: filled chunks, and a way to give spent buffers back
/// (for reuse, or for the reader thread to unmap, off the parser's thread).
struct ReadAhead {
    chunks: std::sync::mpsc::Receiver<std::io::Result<Chunk>>,
    spare: std::sync::mpsc::Sender<Buf>,
}

/// Where read-ahead chunks come from.
enum Ahead {
    Thread(ReadAhead),
    /// Read (or mapped) by whichever thread of the pipeline is free (`pump`): no third busy
    /// thread on a machine with two cores. The same pump twice: as the parser takes from
    /// it, and as the analyzer's thread helps it.
    Shared(std::sync::Arc<dyn Pumped>, std::sync::Arc<dyn Help>),
}

/// The parser's side of a pump of chunks, whichever producer fills it.
trait Pumped: Send + Sync {
    fn next(&self) -> Option<std::io::Result<Chunk>>;
    fn give_back(&self, spent: Buf);
}

impl<P: Producer<Item = Chunk, Spare = Buf>> Pumped for Pump<P> {
    fn next(&self) -> Option<std::io::Result<Chunk>> {
        Pump::next(self)
    }
    fn give_back(&self, spent: Buf) {
        Pump::give_back(self, spent)
    }
}

impl Ahead {
    /// Up to `depth` chunks of `p` read ahead: by a thread of their own, or, if `shared`,
    /// by the pipeline's threads in turn.
    fn new<P: Producer<Item = Chunk, Spare = Buf> + 'static>(
        p: P,
        depth: usize,
        shared: bool,
    ) -> Ahead {
        if shared {
            let pump = std::sync::Arc::new(Pump::new(p, depth));
            return Ahead::Shared(pump.clone(), pump);
        }
        let (tx, chunks) = std::sync::mpsc::sync_channel(depth);
        let (spare, spent) = std::sync::mpsc::channel::<Buf>();
        std::thread::spawn(move || read_ahead_thread(p, tx, spent));
        Ahead::Thread(ReadAhead { chunks, spare })
    }

    /// The next chunk; a chunk of no bytes after the last.
    fn recv(&self) -> std::io::Result<Chunk> {
        let next = match self {
            // The thread ends after its last chunk.
            Ahead::Thread(t) => t.chunks.recv().ok(),
            Ahead::Shared(p, _) => p.next(),
        };
        next.unwrap_or(Ok(Chunk::Read(Vec::new(), 0)))
    }

    fn give_back(&self, spent: Buf) {
        match self {
            Ahead::Thread(t) => {
                let _ = t.spare.send(spent);
            }
            Ahead::Shared(p, _) => p.give_back(spent),
        }
    }
}

/// The reader thread's loop: the producer's chunks, until its last (or until the reader is
/// dropped early, which ends it quietly). Spent buffers come back for reuse, and spent
/// windows to be unmapped here, off the parser's thread.
fn read_ahead_thread<P: Producer<Item = Chunk, Spare = Buf>>(
    mut p: P,
    tx: std::sync::mpsc::SyncSender<std::io::Result<Chunk>>,
    spent: std::sync::mpsc::Receiver<Buf>,
) {
    let mut spares = vec![];
    loop {
        spares.extend(spent.try_iter());
        let (item, last) = p.produce(&mut spares);
        if tx.send(item).is_err() || last {
            return;
        }
    }
}

/// Chunks read from any `Read` (gunzip's output, a pipe) into buffers with `PAD` bytes of
/// room at their front.
struct Reading(Box<dyn Read + Send>);

impl Producer for Reading {
    type Item = Chunk;
    type Spare = Buf;
    fn produce(&mut self, spares: &mut Vec<Buf>) -> (std::io::Result<Chunk>, bool) {
        let mut c = match spares.pop() {
            Some(Buf::Owned(v)) if v.len() == PAD + CHUNK => v,
            _ => vec![0; PAD + CHUNK],
        };
        let n = loop {
            match self.0.read(&mut c[PAD..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let last = !matches!(n, Ok(n) if n > 0);
        (n.map(|n| Chunk::Read(c, n)), last)
    }
}

/// What the reader thread hands over: a read buffer (`PAD` bytes of room, then the data and
/// its length; a length of 0 is the end of the input), or a mapped window of the file.
enum Chunk {
    Read(Vec<u8>, usize),
    Mapped(Window),
}

/// The bytes lines are cut from.
enum Buf {
    Owned(Vec<u8>),
    Mapped(Window),
}

impl Buf {
    #[inline]
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::Owned(v) => v,
            Buf::Mapped(w) => w.bytes(),
        }
    }
}

/// A read-only private mapping of `map_len` bytes of a file, of which the chunk is the
/// `len` bytes from `skip` (mappings start on a page; chunks start where a line does).
/// Every window but the last ends just after a newline, so a line lies in one window
/// unless it is longer than a window.
///
/// A file truncated while it is mapped faults (SIGBUS) on the pages it lost: the reader
/// thread checks the file's size before each window (a shrink found there is an error), and
/// a file cut while its last few windows are being parsed is caught by `lost_pages`.
struct Window {
    base: *mut libc::c_void,
    map_len: usize,
    skip: usize,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (read-only, unmapped once, in `drop`);
// moving it to another thread moves that ownership.
unsafe impl Send for Window {}

impl Window {
    /// Maps `[off, end)` of `file` (`off < end`), from the page that holds `off`.
    fn map(file: &std::fs::File, off: u64, end: u64) -> std::io::Result<Window> {
        use std::os::fd::AsRawFd;
        let page = page_size();
        let start = off - off % page;
        let map_len = usize::try_from(end - start).map_err(std::io::Error::other)?;
        let at = libc::off_t::try_from(start).map_err(std::io::Error::other)?;
        // SAFETY: a fresh read-only private mapping of an open file; the kernel checks the
        // fd, the length and the (page-aligned) offset.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                at,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Window {
            base,
            map_len,
            skip: (off - start) as usize,
            len: (end - off) as usize,
        })
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        // SAFETY: `[skip, skip + len)` lies inside the mapping, which lives as long as self.
        unsafe { std::slice::from_raw_parts((self.base as *const u8).add(self.skip), self.len) }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped only here.
        unsafe {
            libc::munmap(self.base, self.map_len);
        }
    }
}

/// A mapped file that shrinks while it is read (truncated, or rotated with `copytruncate`)
/// takes the pages past its new end out of every mapping, and the next touch of one raises
/// SIGBUS, which would end the process with the shell's bare "Bus error" and no word of which
/// file or why. The handler says it in the usual error form and exits 2; any other SIGBUS
/// goes back to the default action and faults again as it would have.
mod lost_pages {
    use std::sync::OnceLock;

    /// The whole message, made before the handler is installed: the handler may only write.
    static MESSAGE: OnceLock<Box<[u8]>> = OnceLock::new();

    pub(super) fn guard(path: &str) {
        if MESSAGE
            .set(
                format!(
                    "stallscope: error: cannot read {path}: the file shrank while it was being read (truncated or rotated?), and its mapped pages are gone; analyze a copy of it\n"
                )
                .into_bytes()
                .into_boxed_slice(),
            )
            .is_err()
        {
            return;
        }
        // The handler only calls async-signal-safe functions (write, _exit, signal's reset).
        crate::signals::install(
            libc::SIGBUS,
            on_sigbus as *const () as usize,
            libc::SA_SIGINFO,
        );
    }

    extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo; MESSAGE was set before installation.
        unsafe {
            // BUS_ADRERR: an address with no backing page, what a lost file page is.
            if (*info).si_code == libc::BUS_ADRERR {
                if let Some(m) = MESSAGE.get() {
                    libc::write(2, m.as_ptr().cast(), m.len());
                }
                libc::_exit(2);
            }
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    }
}

/// A mapped file, one window after another, each ending after its last newline, until the
/// end of the file (its size asked again before each window, so a trace still being written
/// is read to where it has got, as reading would). `counted`: the bytes the progress
/// counter has already seen (read before the mapping began).
struct Windows {
    file: std::fs::File,
    off: u64,
    counted: u64,
    window: usize,
    counter: Option<ByteCounter>,
}

impl Producer for Windows {
    type Item = Chunk;
    type Spare = Buf;
    fn produce(&mut self, spares: &mut Vec<Buf>) -> (std::io::Result<Chunk>, bool) {
        // Spent windows are unmapped first: their pages stop counting as resident.
        spares.clear();
        let size = match self.file.metadata() {
            Ok(m) => m.len(),
            Err(e) => return (Err(e), true),
        };
        let off = self.off;
        if off > size {
            // Truncated (or rotated by copying and truncating) under us: the lines after
            // `off` are gone, and a report that ended there would pass for the whole trace.
            return (
                Err(std::io::Error::other(format!(
                    "the file shrank from at least {off} to {size} bytes while it was being read (truncated or rotated?); analyze a copy of it"
                ))),
                true,
            );
        }
        if off == size {
            return (Ok(Chunk::Read(Vec::new(), 0)), true);
        }
        let end = size.min(off + self.window as u64);
        let mut w = match Window::map(&self.file, off, end) {
            Ok(w) => w,
            Err(e) => return (Err(e), true),
        };
        if end < size {
            // A window with no newline at all is inside an over-long line: handed on
            // whole, as a read chunk would be.
            if let Some(nl) = memchr::memrchr(b'\n', w.bytes()) {
                w.len = nl + 1;
            }
        }
        self.off += w.len as u64;
        if let Some(c) = &self.counter {
            if self.off > self.counted {
                c.fetch_add(
                    self.off - self.counted,
                    std::sync::atomic::Ordering::Relaxed,
                );
                self.counted = self.off;
            }
        }
        (Ok(Chunk::Mapped(w)), false)
    }
}

pub enum Line<'a> {
    Text(&'a [u8]),
    TooLong(&'a [u8]),
}

impl LineReader {
    pub fn new(inner: Box<dyn Read + Send>) -> Self {
        Self::with_chunk(inner, CHUNK)
    }

    /// A reader whose buffer is `chunk` bytes (at least 4 KiB), grown only while a long line
    /// or a peek needs more, and brought back to `chunk` afterwards.
    pub fn with_chunk(inner: Box<dyn Read + Send>, chunk: usize) -> Self {
        let chunk = chunk.clamp(4096, CHUNK);
        LineReader {
            inner,
            buf: Buf::Owned(vec![0; chunk]),
            chunk,
            mappable: None,
            start: 0,
            end: 0,
            eof: false,
            skipping_long: false,
            ahead: None,
            cut_short: false,
            rewind: None,
        }
    }

    /// Reads ahead of the parser (the kernel's copy out of the page cache, gunzip, or the
    /// mapping of the next window), so that reading overlaps with parsing. A big plain file
    /// is mapped instead of read, window by window, which saves the kernel's copy of every
    /// byte (a tenth of the run's CPU time). With a third core the reading has a thread of
    /// its own; with two it is done by whichever pipeline thread is free (`pump`), since a
    /// third busy thread takes turns on the cores the parser and the analyzer need. Lines
    /// are unchanged; memory grows by a few chunks (about 2 MB) or windows (about 10 MB).
    pub fn read_ahead(&mut self) {
        let shared = std::thread::available_parallelism().is_ok_and(|n| n.get() <= 2);
        self.read_ahead_with(WINDOW, shared);
    }

    /// The read-ahead's producer, when the pipeline's threads are to take turns at it:
    /// the analyzer asks it for work while it waits for events.
    pub(crate) fn reading_help(&self) -> Option<std::sync::Arc<dyn Help>> {
        match &self.ahead {
            Some(Ahead::Shared(_, h)) => Some(h.clone()),
            _ => None,
        }
    }

    /// `shared`: the chunks come from a `Pump` the pipeline's threads drive, instead of a
    /// thread of their own.
    fn read_ahead_with(&mut self, window: usize, shared: bool) {
        if self.ahead.is_some() || self.eof {
            return;
        }
        // `inner` (and with it the file `rewind` names) is about to move to another thread.
        self.rewind = None;
        if let Some(Mappable {
            file,
            counter,
            path,
        }) = self.mappable.take()
        {
            use std::io::Seek;
            // The buffered bytes are mapped again: the mapping starts where they did.
            let buffered = (self.end - self.start) as u64;
            if let Ok(pos) = (&file).stream_position() {
                // A file system that cannot map files (some FUSE mounts) is read instead.
                let maps = |off: u64| Window::map(&file, off, off + 1).is_ok();
                if let Some(off) = pos.checked_sub(buffered).filter(|&off| maps(off)) {
                    lost_pages::guard(&path);
                    self.start = self.end;
                    let windows = Windows {
                        file,
                        off,
                        counted: pos,
                        window,
                        counter,
                    };
                    self.ahead = Some(Ahead::new(windows, MAPPED_DEPTH, shared));
                    return;
                }
            }
        }
        let inner = std::mem::replace(&mut self.inner, Box::new(std::io::empty()));
        self.ahead = Some(Ahead::new(Reading(inner), AHEAD_DEPTH, shared));
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
        let chunk = match a.recv() {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.cut_short = true;
                Chunk::Read(Vec::new(), 0)
            }
            r => r?,
        };
        let next = match chunk {
            Chunk::Read(_, 0) => {
                self.eof = true;
                return Ok(true);
            }
            Chunk::Mapped(w) if rest == 0 => {
                self.start = 0;
                self.end = w.len;
                Buf::Mapped(w)
            }
            Chunk::Read(mut c, n) if rest <= PAD => {
                c[PAD - rest..PAD].copy_from_slice(&self.buf.bytes()[self.start..self.end]);
                self.start = PAD - rest;
                self.end = PAD + n;
                Buf::Owned(c)
            }
            // A line runs on past the chunk's front room (or past a window's end: a line
            // longer than a window): the two are joined in a buffer of their own (rare,
            // bounded by MAX_LINE plus a chunk or a window).
            chunk => {
                let tail = &self.buf.bytes()[self.start..self.end];
                let (more, spent) = match chunk {
                    Chunk::Read(c, n) => (c[PAD..PAD + n].to_vec(), Buf::Owned(c)),
                    Chunk::Mapped(w) => (w.bytes().to_vec(), Buf::Mapped(w)),
                };
                let mut joined = Vec::with_capacity(rest + more.len());
                joined.extend_from_slice(tail);
                joined.extend_from_slice(&more);
                a.give_back(spent);
                self.start = 0;
                self.end = joined.len();
                Buf::Owned(joined)
            }
        };
        let old = std::mem::replace(&mut self.buf, next);
        if matches!(&old, Buf::Mapped(_)) || matches!(&old, Buf::Owned(v) if v.len() == PAD + CHUNK)
        {
            a.give_back(old);
        }
        Ok(true)
    }

    fn fill(&mut self) -> std::io::Result<bool> {
        if self.ahead.is_some() {
            return self.fill_ahead();
        }
        // Only a reader thread hands out mapped windows.
        let Buf::Owned(buf) = &mut self.buf else {
            return Ok(false);
        };
        if self.start > 0 {
            buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if buf.len() > self.chunk && self.end < self.chunk {
                // A long line or the format's peek is behind us: give the room back, which
                // for a set of hundreds of files is most of the run's memory.
                buf.truncate(self.chunk);
                buf.shrink_to_fit();
            }
        }
        if self.end == buf.len() {
            if buf.len() >= MAX_LINE {
                return Ok(false);
            }
            buf.resize((buf.len() * 2).min(MAX_LINE), 0);
        }
        loop {
            match self.inner.read(&mut buf[self.end..]) {
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

    /// This input will be read, never mapped: the mapping's second handle on the file is
    /// closed.
    pub fn no_mapping(&mut self) {
        self.mappable = None;
    }

    /// Gives back the room a peek grew the buffer to, beyond `chunk`: the peeked bytes are
    /// read again from the file when they are needed. Every file of an `-ff` set is opened,
    /// and its format detected, before the merge reads any: without this, each one kept its
    /// 64 KiB detection read resident for the whole run. Only for a plain file not yet
    /// handed to a reader thread; anything else (stdin, gzip) keeps its bytes.
    pub fn release_peek(&mut self) {
        let Some((fd, counter)) = &self.rewind else {
            return;
        };
        let Buf::Owned(buf) = &mut self.buf else {
            return;
        };
        if self.ahead.is_some() || buf.len() <= self.chunk {
            return;
        }
        let unread = self.end - self.start;
        let Ok(back) = libc::off_t::try_from(unread) else {
            return;
        };
        // SAFETY: `fd` is the descriptor of the file `inner` owns, which is still open (a
        // reader thread or a decoder taking `inner` clears `rewind` first or never sets it).
        if unsafe { libc::lseek(*fd, -back, libc::SEEK_CUR) } < 0 {
            return;
        }
        if let Some(c) = counter {
            c.fetch_sub(unread as u64, std::sync::atomic::Ordering::Relaxed);
        }
        self.start = 0;
        self.end = 0;
        self.eof = false;
        buf.truncate(self.chunk);
        buf.shrink_to_fit();
    }

    /// The first bytes of the input, without consuming them (for format detection).
    pub fn peek(&mut self, want: usize) -> std::io::Result<&[u8]> {
        while self.end - self.start < want && !self.eof {
            if !self.fill()? {
                break;
            }
        }
        Ok(&self.buf.bytes()[self.start..self.end])
    }

    pub fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        loop {
            if let Some(nl) = find_newline(&self.buf.bytes()[self.start..self.end]) {
                let s = self.start;
                self.start += nl + 1;
                if self.skipping_long {
                    self.skipping_long = false;
                    continue;
                }
                let buf = self.buf.bytes();
                if nl >= MAX_LINE {
                    // Only a read-ahead buffer can hold one whole: the same verdict as when
                    // the buffer fills first.
                    return Ok(Some(Line::TooLong(&buf[s..s + 120])));
                }
                return Ok(Some(Line::Text(&buf[s..s + nl])));
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
                return Ok(Some(Line::Text(&self.buf.bytes()[s..self.end])));
            }
            if !self.fill()? {
                // Buffer full without a newline: report the line once, drop the rest of it.
                let keep = 120.min(self.end);
                let head_end = self.start + keep;
                self.skipping_long = true;
                let s = self.start;
                self.start = self.end;
                // The head is still in the buffer until the next fill.
                return Ok(Some(Line::TooLong(&self.buf.bytes()[s..head_end])));
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
/// from the file (under any gzip decoder) into `counter`, for a progress bar; `chunk` is the
/// reading buffer's size (see `LineReader::with_chunk`).
pub fn open_input_counted(
    path: &str,
    counter: Option<ByteCounter>,
    chunk: usize,
) -> Result<LineReader> {
    let mut mappable = None;
    let mut rewind = None;
    // `analyze - < trace.txt`: stdin is the file itself, read (and mapped) as one.
    let stdin_file = if path == "-" {
        use std::os::fd::AsFd;
        regular_file(std::io::stdin().as_fd())
    } else {
        None
    };
    let raw: Box<dyn Read + Send> = if path == "-" && stdin_file.is_none() {
        widen_stdin_pipe();
        Box::new(std::io::stdin())
    } else {
        let f = match stdin_file {
            Some(f) => f,
            None => std::fs::File::open(path).with_context(|| format!("cannot open {path}"))?,
        };
        mappable = f
            .metadata()
            .is_ok_and(|m| m.is_file() && m.len() >= MIN_MAP)
            .then(|| f.try_clone().ok())
            .flatten()
            .map(|file| Mappable {
                file,
                counter: counter.clone(),
                path: if path == "-" {
                    "<stdin>".to_owned()
                } else {
                    path.to_owned()
                },
            });
        use std::os::fd::AsRawFd;
        rewind = Some((f.as_raw_fd(), counter.clone()));
        match counter {
            Some(c) => Box::new(CountingRead::new(f, c)),
            None => Box::new(f),
        }
    };
    let mut r = LineReader::with_chunk(raw, chunk);
    let head = r.peek(2).with_context(|| format!("cannot read {path}"))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        // Hand the already-read bytes back to the decoder.
        let pre = head.to_vec();
        let rest = std::mem::replace(&mut r.inner, Box::new(std::io::empty()));
        let chained = std::io::Cursor::new(pre).chain(rest);
        return Ok(LineReader::with_chunk(
            Box::new(flate2::read::MultiGzDecoder::new(chained)),
            chunk,
        ));
    }
    r.mappable = mappable;
    r.rewind = rewind;
    Ok(r)
}

/// `fd` as a `File` of its own (a second descriptor sharing its offset), when it is a
/// regular file: stdin redirected from a trace (`analyze - < trace.txt`) is then read, and
/// mapped, as the file it is, instead of copied through `read` (a fifth less time on a big
/// trace). A pipe, a terminal or a socket gives None and stays stdin.
fn regular_file(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::fs::File> {
    let f = std::fs::File::from(fd.try_clone_to_owned().ok()?);
    f.metadata().is_ok_and(|m| m.is_file()).then_some(f)
}

/// A trace piped in (`zcat trace.gz | stallscope analyze -`) arrives 64 KiB at a time
/// through the default pipe: asking for a 1 MiB pipe lets the writer run ahead and the
/// reader thread wake a sixteenth as often. Best effort: the kernel's pipe-max-size, or a
/// file or terminal as stdin, leaves things as they are.
fn widen_stdin_pipe() {
    // SAFETY: fcntl on fd 0 with integer arguments; a failure only returns -1.
    unsafe {
        libc::fcntl(0, libc::F_SETPIPE_SZ, 1 << 20);
    }
}

/// Bytes read so far from the input files (shared with the progress bar).
pub type ByteCounter = std::sync::Arc<std::sync::atomic::AtomicU64>;

/// A reader that adds every byte it passes through to a shared counter: wrap the raw file
/// (before any decompression) and give a clone of the counter to the main loop.
pub(crate) struct CountingRead<R> {
    inner: R,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R> CountingRead<R> {
    pub(crate) fn new(inner: R, count: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        CountingRead { inner, count }
    }
}

impl<R: std::io::Read> std::io::Read for CountingRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_read_counts_bytes() {
        let c = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut r = CountingRead::new(&b"hello world"[..], c.clone());
        let mut s = String::new();
        std::io::Read::read_to_string(&mut r, &mut s).unwrap_or_default();
        assert_eq!(s, "hello world");
        assert_eq!(c.load(std::sync::atomic::Ordering::Relaxed), 11);
    }
    use std::io::Write;

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

    /// A small reader (one file of a big -ff set) grows for a long line and for the format's
    /// peek, and gives the room back once they are read: every line intact either way.
    #[test]
    fn small_buffer_grows_for_a_long_line_then_shrinks_back() {
        let long = vec![b'x'; 100_000];
        let mut data = vec![];
        for i in 0..50 {
            data.extend_from_slice(format!("short line {i}\n").as_bytes());
        }
        data.extend_from_slice(&long);
        data.push(b'\n');
        for i in 0..2000 {
            data.extend_from_slice(format!("after {i}\n").as_bytes());
        }
        let mut r = LineReader::with_chunk(Box::new(Pieces { data, at: 0, n: 1 }), 16 << 10);
        assert!(r.peek(64 << 10).unwrap().len() >= 64 << 10);
        let mut got = vec![];
        let mut widest = 0;
        while let Some(l) = r.next_line().unwrap() {
            let Line::Text(t) = l else {
                panic!("a 100 KB line is under MAX_LINE: kept whole")
            };
            got.push(t.len());
            widest = widest.max(r.buf.bytes().len());
        }
        assert_eq!(got.len(), 50 + 1 + 2000);
        assert_eq!(got[50], 100_000);
        assert!(widest >= 100_000);
        assert_eq!(r.buf.bytes().len(), 16 << 10, "shrunk back to its chunk");
    }

    /// A file of a big -ff set gives its detection peek back right away and reads those
    /// bytes again when it gets to them: the same lines, the progress counter ends at the
    /// file's size, and stdin or gzip (which cannot be read again) keep what they read.
    #[test]
    fn a_released_peek_is_read_again_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for size in [5_000usize, 200_000] {
            let mut data = vec![];
            let mut i = 0;
            while data.len() < size {
                data.extend_from_slice(format!("line {i} of a file in a set\n").as_bytes());
                i += 1;
            }
            let path = dir.path().join(format!("t.{size}"));
            std::fs::write(&path, &data).unwrap();
            let counter = ByteCounter::default();
            let mut r = open_input_counted(path.to_str().unwrap(), Some(counter.clone()), 16 << 10)
                .unwrap();
            let head = r.peek(64 << 10).unwrap().to_vec();
            assert_eq!(head, data[..data.len().min(64 << 10)]);
            r.release_peek();
            assert_eq!(
                r.buf.bytes().len(),
                16 << 10,
                "size {size}: room given back"
            );
            // A file that fits the small buffer did not grow it: nothing to give back.
            let kept = if data.len() <= 16 << 10 {
                data.len()
            } else {
                0
            };
            assert_eq!(
                counter.load(std::sync::atomic::Ordering::Relaxed),
                kept as u64
            );
            let mut got = vec![];
            while let Some(Line::Text(t)) = r.next_line().unwrap() {
                got.extend_from_slice(t);
                got.push(b'\n');
            }
            assert!(got == data, "size {size}: the lines changed");
            let read = counter.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(read, data.len() as u64, "size {size}");
        }
        // Gzip cannot be read again: the peek stays.
        let gz = dir.path().join("t.gz");
        let mut e = flate2::write::GzEncoder::new(vec![], flate2::Compression::fast());
        for i in 0..10_000 {
            e.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        std::fs::write(&gz, e.finish().unwrap()).unwrap();
        let mut r = open_input_counted(gz.to_str().unwrap(), None, 16 << 10).unwrap();
        let n = r.peek(64 << 10).unwrap().len();
        r.release_peek();
        assert_eq!(r.end - r.start, n, "a gzip stream keeps its peek");
    }

    /// How a test reads: straight, with a reader thread, or with a shared pump that only
    /// the reading thread drives, or that a helper thread drives too.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Via {
        Plain,
        Thread,
        Pump,
        HelpedPump,
    }

    fn lines(data: &[u8], via: Via) -> Vec<(bool, Vec<u8>)> {
        let mut r = LineReader::new(Box::new(Pieces {
            data: data.to_vec(),
            at: 0,
            n: 1,
        }));
        r.peek(100).unwrap();
        if via != Via::Plain {
            r.read_ahead_with(WINDOW, matches!(via, Via::Pump | Via::HelpedPump));
        }
        // An input that ended within the peek needs no reading ahead.
        let shared = matches!(via, Via::Pump | Via::HelpedPump) && !data.is_empty();
        assert_eq!(r.reading_help().is_some(), shared);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let helper = (via == Via::HelpedPump && shared).then(|| {
            let (pump, stop) = (r.reading_help().unwrap(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if !pump.help() {
                        std::thread::yield_now();
                    }
                }
            })
        });
        let mut out = vec![];
        while let Some(l) = r.next_line().unwrap() {
            out.push(match l {
                Line::Text(t) => (true, t.to_vec()),
                Line::TooLong(h) => (false, h.to_vec()),
            });
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = helper {
            h.join().unwrap();
        }
        out
    }

    /// Stdin redirected from a file is read as that file, from where the redirect stands;
    /// a pipe is not a file.
    #[test]
    fn only_a_regular_file_is_read_as_one() {
        use std::io::{Seek, SeekFrom, Write};
        use std::os::fd::AsFd;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"0123456789").unwrap();
        f.seek(SeekFrom::Start(4)).unwrap();
        let mut g = regular_file(f.as_fd()).expect("a regular file");
        // The same open file: the offset is shared, so a redirect that starts mid-file
        // (`(head -n 1; stallscope analyze -) < trace`) reads on from there.
        let mut rest = String::new();
        g.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "456789");
        let (r, w) = nix::unistd::pipe().unwrap();
        assert!(regular_file(r.as_fd()).is_none(), "a pipe");
        assert!(regular_file(w.as_fd()).is_none(), "a pipe");
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
        let plain = lines(&data, Via::Plain);
        assert_eq!(plain.len(), 41);
        assert!(
            plain.iter().any(|(text, _)| !text),
            "some lines are too long"
        );
        for via in [Via::Thread, Via::Pump, Via::HelpedPump] {
            let ahead = lines(&data, via);
            assert!(
                plain == ahead,
                "{via:?}: the read-ahead reader changed the lines"
            );
            assert_eq!(lines(b"", via), vec![]);
        }
    }

    /// Lines of a file read through mapped windows of `window` bytes, mapped by a thread of
    /// their own or (`shared`) on the reading thread.
    fn mapped_lines(
        path: &std::path::Path,
        window: usize,
        shared: bool,
    ) -> (Vec<(bool, Vec<u8>)>, u64) {
        let counter = ByteCounter::default();
        let mut r =
            open_input_counted(path.to_str().unwrap(), Some(counter.clone()), CHUNK).unwrap();
        assert!(r.mappable.is_some(), "a big plain file is mapped");
        r.peek(100).unwrap();
        r.read_ahead_with(window, shared);
        assert_eq!(r.reading_help().is_some(), shared);
        let mut out = vec![];
        while let Some(l) = r.next_line().unwrap() {
            out.push(match l {
                Line::Text(t) => (true, t.to_vec()),
                Line::TooLong(h) => (false, h.to_vec()),
            });
        }
        (out, counter.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// A mapped file yields exactly the lines read from it: across window ends (windows not
    /// a multiple of the page, so that mappings start inside a page), lines longer than a
    /// window, over-long lines and a last line with no newline; and the progress counter
    /// ends at the file's size.
    #[test]
    fn mapped_windows_yield_the_same_lines() {
        let mut data = vec![];
        let lens = [
            0,
            1,
            80,
            4095,
            4097,
            9000,
            70_000,
            MAX_LINE - 1,
            MAX_LINE + 5,
        ];
        let mut i = 0;
        while data.len() < MIN_MAP as usize + 3 * MAX_LINE {
            let len = lens[i % lens.len()];
            data.extend((0..len).map(|j| b'a' + ((i + j) % 26) as u8));
            data.push(b'\n');
            i += 1;
        }
        data.extend_from_slice(b"last line without a newline");
        let dir = std::env::temp_dir().join(format!("stallscope-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.txt");
        std::fs::write(&path, &data).unwrap();
        let plain = lines(&data, Via::Plain);
        assert!(
            plain.iter().any(|(text, _)| !text),
            "some lines are too long"
        );
        for window in [5000, 65_537, WINDOW] {
            for shared in [false, true] {
                let (mapped, counted) = mapped_lines(&path, window, shared);
                assert_eq!(mapped.len(), plain.len(), "window {window} shared {shared}");
                assert!(
                    mapped == plain,
                    "window {window}: the mapped reader changed the lines"
                );
                assert_eq!(counted, data.len() as u64, "window {window}");
            }
        }
        // A small file is read, not mapped.
        let small = dir.join("small.txt");
        std::fs::write(&small, b"one\ntwo\n").unwrap();
        assert!(open_input_counted(small.to_str().unwrap(), None, CHUNK)
            .unwrap()
            .mappable
            .is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
