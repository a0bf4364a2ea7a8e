//! The inputs of one run as one stream: several files (`strace -ff` sets, or any several
//! traces) merged by time, and durations the trace did not print filled in as an upper bound
//! up to the thread's next event (never across an unreadable line).

use super::counters::Counters;
use super::file::FileSource;
use super::{ByteCounter, InputFormat, SourceInfo, TidMap};
use crate::event::{DurSource, Event, EventKind, Nanos, Tid};
use anyhow::{bail, Result};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// A finished call whose duration the trace did not print: it waits for the thread's next
/// event, which bounds it.
fn needs_hold(e: &Event) -> bool {
    matches!(&e.kind, EventKind::Syscall(sc) if sc.dur.is_none() && sc.in_flight.is_none())
}

/// Several `strace -ff` files (or any several inputs) merged by time into one stream.
pub struct Inputs {
    files: Vec<FileSource>,
    /// Per-thread hold-back for calls without a printed duration (see `next`).
    held: TidMap<Event>,
    ready: VecDeque<Event>,
    finished: bool,
}

/// Expands the command line's inputs: a prefix whose `PREFIX.PID` files exist stands for
/// them all; each such file gets its pid from its name.
pub fn expand_inputs(args: &[String]) -> Result<Vec<(String, Option<Tid>)>> {
    let mut out = vec![];
    for a in args {
        if a == "-" || Path::new(a).is_file() {
            out.push((a.clone(), pid_suffix(a)));
            continue;
        }
        let p = PathBuf::from(a);
        let dir = p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let base = p
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut found = vec![];
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(rest) = name.strip_prefix(&format!("{base}.")) {
                    if let Ok(pid) = rest.parse::<Tid>() {
                        found.push((dir.join(&name).to_string_lossy().into_owned(), Some(pid)));
                    }
                }
            }
        }
        if found.is_empty() {
            // Neither a file nor an -ff prefix: let opening it report why.
            out.push((a.clone(), None));
            continue;
        }
        found.sort();
        out.extend(found);
    }
    if out.is_empty() {
        bail!("no input: give a trace file, `-` for stdin, or an `strace -ff` prefix");
    }
    Ok(out)
}

/// Reading buffers of all the files of one run, together (a single file gets the most
/// one may have).
const READ_BUDGET: usize = 8 << 20;

/// An -ff set can hold more files than the default soft limit on open files (1024): the
/// soft limit is raised to the hard one, best effort (an open that still fails says so).
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

fn pid_suffix(path: &str) -> Option<Tid> {
    let ext = Path::new(path).extension()?.to_str()?;
    ext.parse().ok()
}

impl Inputs {
    pub fn open(args: &[String], format: InputFormat, strict: bool) -> Result<Self> {
        Self::open_counted(args, format, strict, None)
    }

    /// `open`, counting bytes read from the files into `counter` (see `ByteCounter`).
    pub fn open_counted(
        args: &[String],
        format: InputFormat,
        strict: bool,
        counter: Option<ByteCounter>,
    ) -> Result<Self> {
        let expanded = expand_inputs(args)?;
        let many = expanded.len() > 1;
        if many {
            raise_open_files_limit();
        }
        // Every file of a set is open, each with its buffer, for the whole run: a few MB in
        // all, whether the set has two files or two thousand (a redis watched for days
        // leaves an -ff file per save child).
        let buffer = (READ_BUDGET / expanded.len()).max(16 << 10);
        let mut files = vec![];
        for (path, pid) in expanded {
            // A pid suffix only names the process for -ff sets; a lone `trace.1234` file
            // may well have a pid column of its own, which wins anyway.
            let mut f = FileSource::open_counted(
                &path,
                format,
                if many || pid.is_some() { pid } else { None },
                strict,
                counter.clone(),
                buffer,
            )?;
            if many {
                // Only a lone file is mapped: the second handle a big file keeps for it,
                // closed as soon as the file is open, never doubles the set's open files.
                f.reader.no_mapping();
            }
            files.push(f);
        }
        if let [one] = &mut files[..] {
            one.reader.read_ahead();
        }
        Ok(Inputs {
            files,
            held: TidMap::default(),
            ready: VecDeque::new(),
            finished: false,
        })
    }

    /// The read-ahead a free thread can drive (`Pump`): a lone input's, on a machine with
    /// two cores.
    pub(crate) fn reading_help(&self) -> Option<std::sync::Arc<dyn super::pump::Help>> {
        match &self.files[..] {
            [one] => one.reader.reading_help(),
            _ => None,
        }
    }

    /// Next event in merged time order (across files), with durations the trace did not
    /// print reconstructed as an upper bound: up to the next event of the same thread.
    pub fn next_event(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(Some(e));
            }
            if self.finished {
                return Ok(None);
            }
            let ev = match self.next_merged()? {
                Some(e) => e,
                None => {
                    let mut rest: Vec<Event> = self.held.drain().map(|(_, e)| e).collect();
                    rest.sort_by_key(|e| (e.ts, e.line));
                    self.ready.extend(rest);
                    self.finished = true;
                    continue;
                }
            };
            // Most events need no hold-back: hand them over without the queue.
            if self.held.is_empty() && self.ready.is_empty() && !needs_hold(&ev) {
                return Ok(Some(ev));
            }
            self.route(ev);
        }
    }

    /// Appends up to `max` events to `out` (fewer only at the end of input); false once
    /// the input is exhausted. The same events, in the same order, as `next_event`, but a
    /// single input with printed durations is parsed straight into `out`.
    pub fn next_batch(&mut self, out: &mut Vec<Event>, max: usize) -> Result<bool> {
        let fast = self.files.len() == 1
            && self.held.is_empty()
            && self.ready.is_empty()
            && !self.finished;
        if fast && self.files[0].queue.is_empty() && self.files[0].scratch.is_empty() {
            let start = out.len();
            self.files[0].pump_into(out, start + max)?;
            if let Some(first) = out[start..].iter().position(needs_hold) {
                // A call without a printed duration: from here on, the per-thread hold-back
                // of `next_event` decides the order.
                let tail: Vec<Event> = out.drain(start + first..).collect();
                for ev in tail {
                    self.route(ev);
                }
                while let Some(e) = self.ready.pop_front() {
                    out.push(e);
                }
            }
            if self.files[0].done
                && self.files[0].queue.is_empty()
                && self.files[0].scratch.is_empty()
            {
                // Flush what is held (nothing, unless durations were missing).
                while let Some(e) = self.next_event()? {
                    out.push(e);
                }
                return Ok(false);
            }
            return Ok(true);
        }
        if self.files.len() > 1 && self.held.is_empty() && self.ready.is_empty() && !self.finished {
            return self.merge_batch(out, max);
        }
        let target = out.len() + max;
        while out.len() < target {
            match self.next_event()? {
                Some(e) => out.push(e),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Events each file's stage is refilled with: enough that a run of one thread's calls
    /// moves as one copy, few enough that a set of hundreds of files stays small.
    fn stage(&self) -> usize {
        (16_384 / self.files.len()).clamp(8, 256)
    }

    /// `next_batch` for several files, with nothing held back: the merge of `next_merged`,
    /// but each pick moves the whole run of the earliest file's staged events that come
    /// before every other file's head (ties go to the lower file, as there), straight into
    /// `out`. Per event, taking heads one by one moved each event four times.
    fn merge_batch(&mut self, out: &mut Vec<Event>, max: usize) -> Result<bool> {
        let start = out.len();
        let target = start + max;
        let stage = self.stage();
        let mut heads = Heads::new(self.files.len());
        for (i, f) in self.files.iter_mut().enumerate() {
            f.refill(stage)?;
            heads.put(i, f.staged.front().map(Event::end));
        }
        let mut drained = false;
        while out.len() < target {
            let (best, bound) = heads.pick();
            let Some((_, i)) = best else {
                drained = true;
                break;
            };
            let staged = &mut self.files[i].staged;
            let room = target - out.len();
            let run = staged
                .pending()
                .iter()
                .take(room)
                .take_while(|e| bound.is_none_or(|b| (e.end(), i) < b))
                .count()
                .max(1);
            staged.move_into(out, run);
            let f = &mut self.files[i];
            f.refill(stage)?;
            heads.put(i, f.staged.front().map(Event::end));
        }
        if let Some(first) = out[start..].iter().position(needs_hold) {
            // A call without a printed duration: from it on, the per-thread hold-back of
            // `next_event` decides the order, as in the one-file batch.
            let tail: Vec<Event> = out.drain(start + first..).collect();
            for ev in tail {
                self.route(ev);
            }
            while let Some(e) = self.ready.pop_front() {
                out.push(e);
            }
        }
        if drained {
            // Every file is drained: the end-of-input flush of `next_event`, after the
            // batch's own calls were routed.
            while let Some(e) = self.next_event()? {
                out.push(e);
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// The hold-back step of `next_event` for one event taken from the parser.
    fn route(&mut self, ev: Event) {
        if matches!(ev.kind, EventKind::Unreadable) {
            // What the unreadable line held is unknown: no call held for its bound may
            // take it across. Their durations stay unknown.
            let mut rest: Vec<Event> = self.held.drain().map(|(_, e)| e).collect();
            rest.sort_by_key(|e| (e.ts, e.line));
            self.ready.extend(rest);
            self.ready.push_back(ev);
            return;
        }
        if let Some(mut prev) = self.held.remove(&ev.tid) {
            if let EventKind::Syscall(sc) = &mut prev.kind {
                sc.dur = Some((ev.ts - prev.ts).max(0));
                sc.dur_src = DurSource::UpperBound;
            }
            self.ready.push_back(prev);
        }
        if needs_hold(&ev) {
            self.held.insert(ev.tid, ev);
        } else {
            self.ready.push_back(ev);
        }
    }

    fn next_merged(&mut self) -> Result<Option<Event>> {
        if self.files.len() == 1 {
            return self.files[0].next_event();
        }
        // The heads are the fronts of the files' stages, which `merge_batch` shares. Few
        // files (one per thread): a scan beats a heap.
        let stage = self.stage();
        let mut best: Option<(Nanos, usize)> = None;
        for i in 0..self.files.len() {
            self.files[i].refill(stage)?;
            if let Some(e) = self.files[i].staged.front() {
                if best.is_none_or(|b| (e.end(), i) < b) {
                    best = Some((e.end(), i));
                }
            }
        }
        Ok(best.and_then(|(_, i)| self.files[i].staged.pop_front()))
    }

    /// Everything the report's `source` block needs; call after draining.
    pub fn info(&self) -> SourceInfo {
        let f = &self.files[0];
        let mut clock = f.clock();
        clock.first = self
            .files
            .iter()
            .map(|f| f.clock().first)
            .filter(|v| *v != 0)
            .min()
            .unwrap_or(clock.first);
        SourceInfo {
            kind: if f.is_perf() {
                crate::report::SourceKind::Perf
            } else {
                crate::report::SourceKind::Strace
            },
            files: self
                .files
                .iter()
                .filter(|f| f.label != "<stdin>")
                .map(|f| f.label.clone())
                .collect(),
            format: f.describe(self.files.len()),
            pid: None,
            clock,
        }
    }

    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for f in &self.files {
            c.lines += f.counters.lines;
            c.used += f.counters.used;
            c.events += f.counters.events;
            c.lost_events += f.counters.lost_events;
            c.skips.merge(&f.counters.skips);
        }
        c
    }
}

/// The merge's files by their staged head, (end, file): a pick changes only the picked
/// file's head, so only it is put back. A few files are scanned (for two, a heap's pop and
/// push cost more than the scan); many are kept in a heap, earliest first: scanning every
/// file at every pick made a set of hundreds of files cost microseconds an event
/// (bench/PROFILE.md, eleventh round, big `-ff` sets).
enum Heads {
    Few(Vec<Option<Nanos>>),
    Many(BinaryHeap<Reverse<Head>>),
}

/// A staged head: its end, then its file (ties go to the lower file).
type Head = (Nanos, usize);

impl Heads {
    fn new(files: usize) -> Self {
        if files <= 8 {
            Heads::Few(vec![None; files])
        } else {
            Heads::Many(BinaryHeap::with_capacity(files))
        }
    }

    /// File `i`'s head is now `end` (None: nothing staged, the file is drained).
    fn put(&mut self, i: usize, end: Option<Nanos>) {
        match self {
            Heads::Few(keys) => keys[i] = end,
            Heads::Many(heap) => {
                if let Some(end) = end {
                    heap.push(Reverse((end, i)));
                }
            }
        }
    }

    /// The earliest head, taken out until it is put back, and the earliest of the others.
    fn pick(&mut self) -> (Option<Head>, Option<Head>) {
        match self {
            Heads::Few(keys) => {
                let mut best: Option<Head> = None;
                let mut bound: Option<Head> = None;
                for (i, k) in keys.iter().enumerate() {
                    if let Some(end) = *k {
                        let k = (end, i);
                        if best.is_none_or(|b| k < b) {
                            bound = best;
                            best = Some(k);
                        } else if bound.is_none_or(|b| k < b) {
                            bound = Some(k);
                        }
                    }
                }
                if let Some((_, i)) = best {
                    keys[i] = None;
                }
                (best, bound)
            }
            Heads::Many(heap) => (heap.pop().map(|h| h.0), heap.peek().map(|h| h.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::no_events_error;
    use std::io::Write;

    /// A gzip file cut short (copied while it was being written): what was read is kept,
    /// and the missing rest is a skipped line that names the file and where it ended.
    #[test]
    fn a_truncated_gzip_gives_what_was_read() {
        let mut text = Vec::new();
        for i in 0..20_000 {
            writeln!(
                text,
                "1796078610.{:06} getpid() = 7 <0.000002>",
                i % 1_000_000
            )
            .unwrap();
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&text).unwrap();
        let gz = gz.finish().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.strace.gz");
        std::fs::write(&path, &gz[..gz.len() / 2]).unwrap();
        let name = path.to_string_lossy().into_owned();
        let mut inp = Inputs::open(std::slice::from_ref(&name), InputFormat::Auto, false).unwrap();
        let mut n = 0;
        while inp.next_event().unwrap().is_some() {
            n += 1;
        }
        let c = inp.counters();
        assert!(n > 1000 && n < 20_000, "{n} events");
        assert_eq!(c.used + c.skips.total, c.lines);
        let (file, line, reason, _) = c.skips.first.last().unwrap();
        assert_eq!(
            (file, *line, *reason),
            (&name, c.lines, crate::source::SkipReason::CutShort)
        );
    }

    /// A forced --input-format that reads no event from the file says so.
    #[test]
    fn a_forced_format_that_reads_nothing_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.strace");
        std::fs::write(
            &path,
            "1796078610.545264 fdatasync(7) = 0 <0.000311>\n 1796078610.6 ( x\n",
        )
        .unwrap();
        let name = path.to_string_lossy().into_owned();
        let mut inp = Inputs::open(std::slice::from_ref(&name), InputFormat::Perf, false).unwrap();
        while inp.next_event().unwrap().is_some() {}
        let c = inp.counters();
        assert_eq!((c.lines, c.events), (2, 0));
        let e = no_events_error(&name, &c, InputFormat::Perf).to_string();
        assert!(e.contains("--input-format perf"), "{e}");
    }
}

#[cfg(test)]
mod unreadable_tests {
    use super::*;
    use crate::source::perf;

    fn events(text: &str) -> Vec<Event> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.strace");
        std::fs::write(&path, text).unwrap();
        let mut inp = Inputs::open(
            &[path.to_string_lossy().into_owned()],
            InputFormat::Auto,
            false,
        )
        .unwrap();
        let mut out = vec![];
        while let Some(e) = inp.next_event().unwrap() {
            out.push(e);
        }
        out
    }

    /// An `-ff` set merged in batches (whole runs of one file at a time) is the stream of
    /// the event-by-event merge: the same events in the same order, across equal ends (the
    /// lower file first), calls without a printed duration (held back for their bound),
    /// a file that ends early and an unreadable line, at batch sizes that split the runs.
    #[test]
    fn batched_merge_is_the_event_by_event_merge() {
        // Three files take the scan of the heads, twelve the heap.
        for files in [3u64, 12] {
            batched_merge_of(files);
        }
    }

    fn batched_merge_of(files: u64) {
        let dir = tempfile::tempdir().unwrap();
        let mut texts = vec![String::new(); files as usize];
        for i in 0..600u64 {
            let f = (i * 7 % files.max(11) % files) as usize;
            // Groups of equal start times across files, and runs within one file.
            let ts = 1_796_078_610_000_000 + (i / 3) * 40;
            let line = match i % 13 {
                // No -T duration: bounded by the thread's next call.
                5 => format!("{}.{:06} getpid() = 7\n", ts / 1_000_000, ts % 1_000_000),
                9 if f == 2 => "garbage that is no strace line\n".to_string(),
                _ => format!(
                    "{}.{:06} read(3, \"x\", 1) = 1 <0.0000{:02}>\n",
                    ts / 1_000_000,
                    ts % 1_000_000,
                    i % 4 * 10
                ),
            };
            // The third file stops at half way.
            if f != 2 || i < 300 {
                texts[f].push_str(&line);
            }
        }
        let paths: Vec<String> = texts
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let p = dir.path().join(format!("set.{}", 100 + k));
                std::fs::write(&p, t).unwrap();
                p.to_string_lossy().into_owned()
            })
            .collect();
        let key = |e: &Event| format!("{} {} {} {:?}", e.tid, e.ts, e.line, e.kind);
        let open = || Inputs::open(&paths, InputFormat::Auto, false).unwrap();
        let mut one = open();
        let mut want = vec![];
        while let Some(e) = one.next_event().unwrap() {
            want.push(key(&e));
        }
        assert!(want.len() > 500, "{}", want.len());
        assert!(want.iter().any(|k| k.contains("UpperBound")));
        assert!(want.iter().any(|k| k.contains("Unreadable")));
        for max in [1, 2, 7, 64, 1024] {
            let mut inp = open();
            let mut got = vec![];
            let mut batch = vec![];
            loop {
                batch.clear();
                let more = inp.next_batch(&mut batch, max).unwrap();
                assert!(batch.len() <= max + 1 || !more, "batch of {}", batch.len());
                got.extend(batch.iter().map(key));
                if !more {
                    break;
                }
            }
            assert!(
                got == want,
                "{files} files: batches of {max} changed the merged stream"
            );
        }
    }

    /// Each file of a set is open once: only a lone file is mapped, so a big file of a set
    /// keeps no second handle for it (a set of thousands of files would need twice the fds).
    #[test]
    fn a_set_holds_one_fd_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let line = "1796078610.000000 read(3, \"x\", 1) = 1 <0.000010>\n";
        let big = line.repeat((super::super::reader::MIN_MAP as usize) / line.len() + 1);
        let paths: Vec<String> = (0..2)
            .map(|k| {
                let p = dir.path().join(format!("set.{}", 100 + k));
                std::fs::write(&p, &big).unwrap();
                p.to_string_lossy().into_owned()
            })
            .collect();
        let open_fds = |path: &str| {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t.to_str() == Some(path))
                .count()
        };
        let inp = Inputs::open(&paths, InputFormat::Auto, false).unwrap();
        for p in &paths {
            assert_eq!(open_fds(p), 1, "{p}");
        }
        drop(inp);
    }

    /// `close(3) = 0`, then a pasted `...`, then a line 5 s later: not a 5 s close(). The
    /// unreadable line is an event of its own, where the timeline breaks.
    #[test]
    fn no_upper_bound_spans_an_unreadable_line() {
        let got = events(
            "1796078610.000000 close(3) = 0\n...\n1796078615.000000 getpid() = 7\n1796078615.100000 getpid() = 7\n",
        );
        let kinds: Vec<String> = got
            .iter()
            .map(|e| match &e.kind {
                EventKind::Syscall(sc) => format!("{} {:?} {:?}", sc.name, sc.dur, sc.dur_src),
                k => format!("{k:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "close None Unknown",
                "Unreadable",
                "getpid Some(100000000) UpperBound",
                "getpid None Unknown",
            ]
        );
        assert_eq!(got[1].line, 2);
        // Without the pasted line the bound is what it was.
        let got = events("1796078610.000000 close(3) = 0\n1796078615.000000 getpid() = 7\n");
        assert_eq!(got[0].syscall().unwrap().dur, Some(5_000_000_000));
    }

    /// The parsers' own reconstructions stop at an unreadable line too: an unfinished call
    /// whose resumed half may have been that line has no known duration.
    #[test]
    fn no_paired_duration_spans_an_unreadable_line() {
        let got = events(
            "1796078610.000000 close(3 <unfinished ...>\n1796078610.5 <... close resu\n1796078615.000000 close(4) = 0 <0.000010>\n",
        );
        let c = got
            .iter()
            .find(|e| e.syscall().is_some_and(|s| s.fd == Some(3)))
            .unwrap()
            .syscall()
            .unwrap();
        assert_eq!(
            (c.dur, c.in_flight),
            (None, Some(crate::event::InFlight::AtEnd))
        );
        let mut p = perf::PerfParser::default();
        let mut out = vec![];
        for l in [
            "   10.000 (         ): redis-server/7 fdatasync(fd: 7) ...",
            "   10.5 garbage",
            "   12.500 ( 0.002 ms): redis-server/7 getpid() = 7",
        ] {
            p.feed(l.as_bytes(), &mut out);
        }
        out.retain(|e| !matches!(e.kind, EventKind::Program(_)));
        let f = out[0].syscall().unwrap();
        assert_eq!((f.name, f.dur, f.in_flight), ("fdatasync", None, None));
    }
}
