//! File time: how much of the serving threads' time went to disk files, by phase segment
//! (before, during and after each background child) and per thread as running totals that
//! commands read at request and reply; plus the main thread's fsyncs per file and when the
//! background fsyncs of the AOF ran (for aof-fsync-always and aof-write-pending-fsync).

use super::call::{Facts, PerThread, ResolvedCall, ThreadIdx};
use super::phases::Segment;
use super::roles::Role;
use super::stats::Agg;
use super::world::World;
use crate::event::{DurSource, Nanos, Tid};
use crate::fdtable::{FileClass, FileId};
use crate::report::Dist;
use hdrhistogram::Histogram;
use rustc_hash::FxHashMap as HashMap;

/// A serving thread's running totals in AOF and log-file syscalls.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct FileNs {
    pub(crate) aof: i64,
    pub(crate) log: i64,
}

/// The main thread's fsyncs of the AOF: how many, their distribution, and how many of them
/// were timed only as upper bounds (and the longest of those).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MainFsyncs {
    pub(crate) n: u64,
    pub(crate) p50_us: i64,
    pub(crate) p99_us: i64,
    pub(crate) max_us: i64,
    pub(crate) upper: u64,
    pub(crate) upper_max_us: i64,
}

impl MainFsyncs {
    /// Which of p50, p99 and max rest on upper bounds: a figure does when some call timed
    /// only up to its thread's next event is at least as long (its real, shorter length
    /// could lower the figure); calls below a quantile can only get shorter, which leaves
    /// the quantile where it is.
    pub(crate) fn upper_bounds(&self) -> (bool, bool, bool) {
        let rests = |x: i64| self.upper > 0 && self.upper_max_us >= x;
        (rests(self.p50_us), rests(self.p99_us), rests(self.max_us))
    }
}

/// The aggregate at `i`, the vector grown to hold it.
#[inline]
fn grown(v: &mut Vec<Agg>, i: usize) -> &mut Agg {
    if i >= v.len() {
        v.resize_with(i + 1, Agg::default);
    }
    &mut v[i]
}

/// Tag bit of a main-thread fsync of its file (`FileTime::on_call`).
const MAIN_FSYNC: u32 = 1;

/// Tag bits of a serving thread's disk-file call in this segment: its index + 1, above
/// `MAIN_FSYNC` (0: in no segment's distribution).
fn seg_tag(s: Segment) -> u32 {
    u32::try_from(s.index() + 1)
        .ok()
        .filter(|t| *t < 1 << 31)
        .expect("fewer than 2^31 phase segments")
        << 1
}

/// Most background fsyncs remembered.
const BIO_FSYNCS_MAX: usize = 1 << 20;

#[derive(Default)]
pub(crate) struct FileTime {
    /// Serving threads' disk-file syscalls by phase segment (`Segment::index`).
    seg: Vec<Agg>,
    per: PerThread<FileNs>,
    /// By file id (count 0: no such fsync of it).
    main_fsync_by_file: Vec<Agg>,
    /// Of those, the calls timed only as upper bounds (no -T: up to the thread's next event).
    main_fsync_upper: HashMap<FileId, (u64, Nanos)>,
    /// Serving threads' time in AOF calls, and the part of it timed only as upper bounds:
    /// the AOF time charged to commands rests on those when they are most of it.
    aof_ns: i64,
    aof_upper_ns: i64,
    /// (start, end) of background fsyncs of the AOF of at least 1 ms, in trace order.
    bio_fsyncs: Vec<(Nanos, Nanos)>,
    /// (start, end, thread) of disk-file calls of at least 1 ms by threads other than the
    /// main thread (a save child, a background thread, another program of a whole-machine
    /// trace), in trace order: the other writers a busy-disk finding needs to point at.
    others_disk: Vec<(Nanos, Nanos, Tid)>,
}

impl FileTime {
    /// Returns the call's tag for its `Cells` cell (`tag`): which of this unit's
    /// distributions its duration belongs to; this unit keeps their counts, totals and
    /// maxima, the latency unit the one histogram record, folded back in by `merge_cell`.
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>, segment: Segment) -> u32 {
        let role = cx.role;
        let Some(c) = cx.class else {
            return 0;
        };
        let mut tag = 0;
        if (role == Role::Main || role == Role::IoThread) && c.is_disk_file() && cx.timed {
            tag = seg_tag(segment);
            grown(&mut self.seg, segment.index()).add_unrecorded(cx.dur);
            let t = self.per.at(cx.thread);
            if c.is_aof() {
                t.aof += cx.dur;
                self.aof_ns += cx.dur;
                if cx.dur_src() == DurSource::UpperBound {
                    self.aof_upper_ns += cx.dur;
                }
            } else if c == FileClass::Log {
                t.log += cx.dur;
            }
        }
        let fsync = cx.facts.has(Facts::FSYNC);
        if role == Role::Main && fsync && cx.timed {
            if let Some(f) = cx.file {
                tag |= MAIN_FSYNC;
                grown(&mut self.main_fsync_by_file, f as usize).add_unrecorded(cx.dur);
                if cx.dur_src() == DurSource::UpperBound {
                    let u = self.main_fsync_upper.entry(f).or_default();
                    u.0 += 1;
                    u.1 = u.1.max(cx.dur);
                }
            }
        }
        // Calls of 1 ms or more outside the main thread, tested once for both lists (nearly
        // every call of a trace is the main thread's, or shorter).
        if role != Role::Main && cx.dur >= 1_000_000 {
            if fsync && c.is_aof() && self.bio_fsyncs.len() < BIO_FSYNCS_MAX {
                self.bio_fsyncs.push((cx.ts(), cx.end));
            }
            if c.is_disk_file() && cx.timed && self.others_disk.len() < BIO_FSYNCS_MAX {
                self.others_disk.push((cx.ts(), cx.end, cx.tid));
            }
        }
        tag
    }

    /// The histogram of a `Cells` cell of file `file` whose tag `on_call` gave.
    pub(crate) fn merge_cell(&mut self, file: FileId, tag: u32, h: &Histogram<u64>) {
        if tag & MAIN_FSYNC != 0 {
            self.main_fsync_by_file[file as usize].merge_hist(h);
        }
        if tag >> 1 != 0 {
            self.seg[(tag >> 1) as usize - 1].merge_hist(h);
        }
    }

    /// The thread's totals so far.
    pub(crate) fn so_far(&self, t: ThreadIdx) -> FileNs {
        self.per.get(t).copied().unwrap_or_default()
    }

    /// Distribution of the serving threads' disk-file syscalls in one segment.
    pub(crate) fn segment(&self, s: Segment) -> Dist {
        self.seg
            .get(s.index())
            .map(|a| a.dist())
            .unwrap_or_default()
    }

    /// fdatasync/fsync on the AOF by main-thread calls.
    pub(crate) fn main_aof_fsync(&self, world: &World) -> MainFsyncs {
        let mut agg = Agg::default();
        let (mut upper, mut upper_max) = (0, 0);
        // Merging is order-free (counts add up): the files in id order.
        let files = self.main_fsync_by_file.iter().enumerate();
        for (f, s) in files.filter(|(_, s)| s.count > 0) {
            let f = &(f as FileId);
            if world.file(*f).class.is_aof() {
                agg.merge(s);
                let (n, max) = self.main_fsync_upper.get(f).copied().unwrap_or_default();
                upper += n;
                upper_max = upper_max.max(max);
            }
        }
        MainFsyncs {
            n: agg.count,
            p50_us: agg.pct_us(0.5),
            p99_us: agg.pct_us(0.99),
            max_us: agg.max_us(),
            upper,
            upper_max_us: upper_max / 1000,
        }
    }

    /// Most of the serving threads' AOF time was timed only as upper bounds.
    pub(crate) fn aof_time_is_upper_bound(&self) -> bool {
        self.aof_upper_ns > 0 && self.aof_upper_ns * 2 >= self.aof_ns
    }

    /// How many fsyncs of file `f` the main thread made (timed ones).
    pub(crate) fn main_fsyncs_of(&self, f: FileId) -> u64 {
        self.main_fsync_by_file
            .get(f as usize)
            .map_or(0, |a| a.count)
    }

    /// Another thread than `not` (a child, a background thread, another program) was in a
    /// disk-file call of at least 1 ms at some time in [start, end): evidence of another
    /// writer on the disks the trace can show.
    pub(crate) fn other_disk_io(&self, not: Tid, start: Nanos, end: Nanos) -> bool {
        self.others_disk
            .iter()
            .any(|(s, e, t)| *t != not && *s < end && *e > start)
    }

    /// A background fsync of the AOF ran at some time in [start, end).
    pub(crate) fn overlaps_bio_fsync(&self, start: Nanos, end: Nanos) -> bool {
        self.bio_fsyncs
            .iter()
            .any(|(fs, fe)| *fs < end && *fe > start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};

    const MS: Nanos = 1_000_000;

    #[test]
    fn serving_threads_file_time_by_segment_and_thread() {
        let mut f = FileTime::default();
        let w = event(1, 0, 2 * MS, "write");
        f.on_call(
            &call(&w, Role::Main, Some(FileClass::Aof)),
            Segment::during(0),
        );
        f.on_call(
            &call(&w, Role::Main, Some(FileClass::Log)),
            Segment::during(0),
        );
        f.on_call(
            &call(&w, Role::Main, Some(FileClass::Client)),
            Segment::during(0),
        );
        // A child's disk time is its own.
        f.on_call(
            &call(&w, Role::Child, Some(FileClass::Aof)),
            Segment::during(0),
        );
        let cx = call(&w, Role::Main, None);
        assert_eq!(
            f.so_far(cx.thread),
            FileNs {
                aof: 2 * MS,
                log: 2 * MS
            }
        );
        assert_eq!(f.segment(Segment::during(0)).count, 2);
        assert_eq!(f.segment(Segment::before(0)).count, 0);
    }

    #[test]
    fn background_fsyncs_are_remembered_for_overlaps() {
        let mut f = FileTime::default();
        let s = event(2, 10 * MS, 5 * MS, "fdatasync");
        f.on_call(
            &call(&s, Role::BioAof, Some(FileClass::Aof)),
            Segment::before(0),
        );
        let short = event(2, 30 * MS, MS / 2, "fdatasync");
        f.on_call(
            &call(&short, Role::BioAof, Some(FileClass::Aof)),
            Segment::before(0),
        );
        assert!(f.overlaps_bio_fsync(12 * MS, 20 * MS));
        assert!(!f.overlaps_bio_fsync(15 * MS, 20 * MS));
        assert!(
            !f.overlaps_bio_fsync(30 * MS, 31 * MS),
            "under 1 ms: not kept"
        );
    }

    /// Issue 13: a figure is marked as an upper bound only where it rests on upper bounds:
    /// a perf trace's few interrupted fsyncs (no duration printed) mark only the figures
    /// they reach.
    #[test]
    fn only_figures_that_rest_on_upper_bounds_are_marked() {
        let f = |n, upper, upper_max_us| MainFsyncs {
            n,
            p50_us: 150,
            p99_us: 900,
            max_us: 2_000,
            upper,
            upper_max_us,
        };
        assert_eq!(f(100, 0, 0).upper_bounds(), (false, false, false));
        assert_eq!(f(100, 100, 2_000).upper_bounds(), (true, true, true));
        assert_eq!(f(300, 2, 2_000).upper_bounds(), (true, true, true));
        assert_eq!(f(100, 2, 900).upper_bounds(), (true, true, false));
        assert_eq!(f(100, 60, 300).upper_bounds(), (true, false, false));
        assert_eq!(f(100, 2, 100).upper_bounds(), (false, false, false));
    }
}
