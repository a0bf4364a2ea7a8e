//! The ptrace backend's scheduler split (`Syscall::sched`): a traced thread's counters (on
//! a CPU, waiting for one, minor and major faults; the fields `super::super::sched_counters`
//! reads) taken from /proc at each of its syscall stops, while it is stopped and they are
//! still. A call's `during` runs from its entry stop to its exit stop, its `before` from the
//! thread's previous exit stop to this entry stop.
//!
//! What ptrace itself puts into those spans: a stopped tracee is off its CPU and not
//! runnable, so the time from its stop to the tracer's resume counts as neither (blocked,
//! as a sleep does); the time after the resume until a CPU takes it is runnable, a real
//! wait for a CPU (which the tracer, one more busy thread, makes likelier on a small host).
//! The tracer's own handling of the stops is therefore never counted as waiting for a CPU.
//!
//! The files are opened once per thread and read with `pread` from offset 0 (seq_file
//! regenerates them there), into stack buffers, parsed without allocating. `schedstat` is
//! read at every stop; `stat` (the faults), which costs the kernel three times as much to
//! write, only at a stop that ends a span of `LONG_SPAN` or more, or once the thread has run
//! `FAULTS_CPU` on a CPU since it was last read (faults are taken on a CPU): a span's fault
//! counts may include those of at most that much CPU time before it, and never miss one.
//! Read at every stop, the two took the tracer's time a stop from 2.9 to 7.5 us (median of 9
//! alternated rounds on a shared 2-core VM, bench/ptrace_sched.sh [PS1]); so, 3.3 to 4.4 us
//! [PS2].

use crate::event::{Nanos, Tid};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Set to 1 to trace without reading the counters at the stops (no `sched` split): what
/// the reads cost, measured against the same backend with them (bench/ptrace_sched.sh).
pub const NO_SCHED_ENV: &str = "STALLSCOPE_PTRACE_NO_SCHED";

/// Whether this run reads the counters (`NO_SCHED_ENV` unset or not 1).
pub(crate) fn wanted() -> bool {
    std::env::var_os(NO_SCHED_ENV).is_none_or(|v| v != "1")
}

/// A thread's counters: ns on a CPU, ns runnable, minor faults, major faults (cumulative).
pub(super) type Counters = [u64; 4];

/// A span between two stops this long or longer ends with fresh fault counts: a stall's
/// split is exact at its end (stalls are a threshold long, 1 ms and more in practice).
const LONG_SPAN: Nanos = 1_000_000;

/// Fault counts are read again once the thread has run this long on a CPU since they were.
const FAULTS_CPU: u64 = 100_000;

/// A traced thread's `schedstat` and `stat`, open for its life (closed with it), and the
/// faults `stat` gave last.
pub(super) struct SchedFiles {
    schedstat: File,
    stat: File,
    /// Minor and major faults at the last read of `stat`, and its ns on a CPU then.
    faults: [u64; 2],
    faults_cpu: u64,
    /// When its last stop was (the tracer's clock), None before the first read.
    last: Option<Nanos>,
}

impl SchedFiles {
    /// `/proc/TID/task/TID` names the thread itself whatever its process (and `stat` there
    /// is the thread's own, not the process's sum). None once the thread is gone, or on a
    /// kernel without schedstat (CONFIG_SCHED_INFO).
    pub(super) fn open(tid: Tid) -> Option<Self> {
        let dir = format!("/proc/{tid}/task/{tid}");
        Some(SchedFiles {
            schedstat: File::open(format!("{dir}/schedstat")).ok()?,
            stat: File::open(format!("{dir}/stat")).ok()?,
            faults: [0; 2],
            faults_cpu: 0,
            last: None,
        })
    }

    /// The counters at a stop at `now` (or, `full`, read whole as they stand: at the attach
    /// and the detach). `stat` is read only as far as the major faults (its first 13 fields
    /// fit in 256 bytes: a 64-byte name at most, then numbers).
    #[inline]
    pub(super) fn read(&mut self, now: Nanos, full: bool) -> Option<Counters> {
        let mut ss = [0u8; 96];
        let n = self.schedstat.read_at(&mut ss, 0).ok()?;
        let [on, run] = super::super::parse_schedstat(&ss[..n])?;
        let due = full || self.faults_due(now, on);
        self.last = Some(now);
        if due {
            let mut st = [0u8; 256];
            let m = self.stat.read_at(&mut st, 0).ok()?;
            self.faults = super::super::parse_stat_faults(&st[..m])?;
            self.faults_cpu = on;
        }
        Some([on, run, self.faults[0], self.faults[1]])
    }

    /// Whether a stop at `now`, the thread `on` ns on a CPU, reads the faults again: after
    /// a long span, or once it has run `FAULTS_CPU` since they were read.
    fn faults_due(&self, now: Nanos, on: u64) -> bool {
        self.last.is_none_or(|l| now - l >= LONG_SPAN)
            || on.saturating_sub(self.faults_cpu) >= FAULTS_CPU
    }
}

/// The split of a call from its entry's counters to `end`'s, and of the gap before it
/// from the thread's previous exit (`last_exit`), when that is known.
pub(super) fn span(
    entry: Counters,
    end: Counters,
    last_exit: Option<Counters>,
) -> crate::event::SchedSpan {
    crate::event::SchedSpan {
        during: super::super::sched_delta(&entry, &end),
        before: last_exit.map(|l| super::super::sched_delta(&l, &entry)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_files_read_again_and_again_give_its_counters() {
        let tid = unsafe { libc::gettid() } as Tid;
        let mut f = SchedFiles::open(tid).expect("this thread's files");
        let a = f.read(0, false).expect("counters");
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(20) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let b = f.read(1_000, false).expect("counters again");
        // 20 ms spinning: on a CPU or, on a loaded machine, waiting for one.
        let (on, run) = (b[0] - a[0], b[1] - a[1]);
        assert!(on + run >= 15_000_000, "20 ms counted: {a:?} {b:?} ({x})");
        assert!(b[1] >= a[1] && b[2] >= a[2] && b[3] >= a[3], "{a:?} {b:?}");
        // The same fields /proc's other reader gives.
        let c = crate::live::sched_counters(std::process::id(), tid).unwrap();
        assert!(c[0] >= b[0] && c[2] >= b[2], "{b:?} {c:?}");
        assert!(SchedFiles::open(0x7fff_fff0).is_none());
        // Faults are read again after a long span, or FAULTS_CPU on a CPU; not in between.
        // The on-CPU counter of a running thread lags by up to a tick, so a short span may
        // still show FAULTS_CPU more: the rule is asserted on the counters read.
        let before = f.faults_cpu;
        let c = f.read(2_000, false).unwrap();
        if c[0] - before < FAULTS_CPU {
            assert_eq!(
                (f.faults_cpu, c[2]),
                (before, b[2]),
                "a short span, little CPU"
            );
        } else {
            assert_eq!(f.faults_cpu, c[0], "a short span, a tick's CPU: read again");
        }
        f.last = Some(10_000);
        f.faults_cpu = 1_000_000;
        assert!(!f.faults_due(10_000 + LONG_SPAN - 1, 1_000_000 + FAULTS_CPU - 1));
        assert!(f.faults_due(10_000 + LONG_SPAN, 1_000_000));
        assert!(f.faults_due(10_001, 1_000_000 + FAULTS_CPU));
        f.last = None;
        assert!(f.faults_due(10_001, 1_000_000), "the first read");
        let pages: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 1 << 16]).collect();
        let d = f.read(2_000_000, false).unwrap();
        assert!(
            d[2] > c[2] && f.faults_cpu >= c[0],
            "faulted in {} KiB",
            pages.len() * 64
        );
        let s = span([10, 20, 3, 0], [15, 21, 3, 1], Some([1, 2, 0, 0]));
        assert_eq!((s.during.on_cpu_ns, s.during.major_faults), (5, 1));
        assert_eq!(s.before.map(|b| b.runnable_ns), Some(18));
    }
}
