//! The reader thread of the kernel-fed backends (perf, bpf): copies records out of the
//! kernel's ring buffers as soon as they are there, in batches handed to the tracer, so the
//! kernel finds room even while the analysis (niced, on a loaded machine) lags; the records
//! wait in memory instead of being dropped. Emptied batches come back to be refilled (the
//! spare pool), and a bound on what waits (`Source::BACKLOG_BYTES`) makes an analysis that never
//! catches up lose records, counted by the kernel,, instead of growing without end. The
//! backends differ only in their `Source`: what a batch holds and how a ring is read.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The kernel's side of a reader: its rings and how they are read.
pub(crate) trait Source: Send + 'static {
    /// What a batch holds (records, or their bytes).
    type Item: Send + 'static;
    /// Room a fresh batch starts with.
    const BATCH_START: usize;
    /// Emptied batches kept for refilling at most (more are freed: the reader is behind).
    const SPARES: usize;
    /// Most bytes copied out and not yet taken by the analysis (a few seconds of a
    /// saturated redis): past it the reader leaves the rings alone, and the kernel drops
    /// what finds them full, counted as lost.
    const BACKLOG_BYTES: usize = 128 << 20;
    /// Appends what the kernel has committed to `batch`, and stops once the batch is big
    /// enough to hand on (the analysis starts on a backlog before all of it is copied):
    /// true then (more may be waiting), false when everything committed was taken.
    fn fill(&mut self, batch: &mut Vec<Self::Item>) -> bool;
    /// Sleeps until the rings may have records, at most a few ms (a stop is seen within
    /// that).
    fn wait(&mut self);
}

/// The reader thread of one tracer, and the tracer's ends of its queues.
pub(crate) struct Reader<S: Source> {
    thread: Option<std::thread::JoinHandle<S>>,
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<Vec<S::Item>>,
    spares: Spares<S::Item>,
    /// Items copied out that the tracer has not taken yet.
    backlog: Arc<AtomicUsize>,
}

impl<S: Source> Reader<S> {
    /// Starts thread `name` reading `source`.
    pub(crate) fn start(name: &str, source: S) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let spares = Spares::default();
        let stop = Arc::new(AtomicBool::new(false));
        let backlog = Arc::new(AtomicUsize::new(0));
        let side = Side {
            tx,
            spares: spares.clone(),
            stop: stop.clone(),
            backlog: backlog.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || side.run(source))?;
        Ok(Reader {
            thread: Some(thread),
            stop,
            rx,
            spares,
            backlog,
        })
    }

    /// The next batch copied out, waiting at most `wait` for one (zero: only one ready now).
    #[inline]
    pub(crate) fn next(&self, wait: Duration) -> Option<Vec<S::Item>> {
        let batch = if wait.is_zero() {
            self.rx.try_recv().ok()
        } else {
            self.rx.recv_timeout(wait).ok()
        }?;
        self.backlog.fetch_sub(batch.len(), Ordering::Relaxed);
        Some(batch)
    }

    /// Gives an emptied batch back to be refilled.
    #[inline]
    pub(crate) fn give_back(&self, batch: Vec<S::Item>) {
        self.spares.give(batch, S::SPARES);
    }

    /// Stops the thread once it has read what the rings hold, and takes its source back
    /// (None when it was stopped before, or ended by a panic). Batches it copied out are
    /// still to be taken (`next`).
    pub(crate) fn stop(&mut self) -> Option<S> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take()?.join().ok()
    }
}

impl<S: Source> Drop for Reader<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Emptied batches, from the tracer back to the reader: the last one given back is the
/// first one refilled (its lines are the likeliest to be cached still), where a channel
/// would cycle through every spare in turn.
struct Spares<T>(Arc<Mutex<Vec<Vec<T>>>>);

impl<T> Clone for Spares<T> {
    fn clone(&self) -> Self {
        Spares(self.0.clone())
    }
}

impl<T> Default for Spares<T> {
    fn default() -> Self {
        Spares(Arc::default())
    }
}

impl<T> Spares<T> {
    /// Keeps `batch` (emptied) for the reader, or frees it when `keep` are kept already.
    fn give(&self, mut batch: Vec<T>, keep: usize) {
        batch.clear();
        if let Ok(mut v) = self.0.lock() {
            if v.len() < keep {
                v.push(batch);
            }
        }
    }

    fn take(&self) -> Option<Vec<T>> {
        self.0.lock().ok()?.pop()
    }
}

/// The reader thread's ends of the queues.
struct Side<T> {
    tx: mpsc::Sender<Vec<T>>,
    spares: Spares<T>,
    stop: Arc<AtomicBool>,
    backlog: Arc<AtomicUsize>,
}

impl<T: Send + 'static> Side<T> {
    /// The thread: a pass over the rings, then a sleep until they have more, until told to
    /// stop; the pass after the stop reads everything left (no record is written then: the
    /// tracer detached the programs or disabled the events before). Returns the source.
    fn run<S: Source<Item = T>>(self, mut source: S) -> S {
        let max = S::BACKLOG_BYTES / std::mem::size_of::<T>().max(1);
        let mut batch = self.fresh::<S>();
        loop {
            // Read after the flag: once it is set nothing more is written, so this pass is
            // the last and reads everything.
            let last = self.stop.load(Ordering::SeqCst);
            if !last && self.backlog.load(Ordering::Relaxed) >= max {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            while source.fill(&mut batch) {
                if self.send(std::mem::replace(&mut batch, self.fresh::<S>())) {
                    return source;
                }
                if !last && self.backlog.load(Ordering::Relaxed) >= max {
                    break;
                }
            }
            if !batch.is_empty() && self.send(std::mem::replace(&mut batch, self.fresh::<S>())) {
                return source;
            }
            if last {
                return source;
            }
            source.wait();
        }
    }

    /// A batch to fill: a spare, or a new one.
    fn fresh<S: Source<Item = T>>(&self) -> Vec<T> {
        self.spares
            .take()
            .unwrap_or_else(|| Vec::with_capacity(S::BATCH_START))
    }

    /// Hands `batch` on; true when the tracer is gone.
    fn send(&self, batch: Vec<T>) -> bool {
        self.backlog.fetch_add(batch.len(), Ordering::Relaxed);
        self.tx.send(batch).is_err()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A ring holding `left` records (u32s), read 4 to a batch, with a backlog bound of 16.
    struct Counter {
        left: Arc<AtomicUsize>,
    }

    impl Source for Counter {
        type Item = u32;
        const BATCH_START: usize = 4;
        const SPARES: usize = 2;
        const BACKLOG_BYTES: usize = 16 * 4;

        fn fill(&mut self, batch: &mut Vec<u32>) -> bool {
            while batch.len() < 4 {
                if self.left.load(Ordering::SeqCst) == 0 {
                    return false;
                }
                self.left.fetch_sub(1, Ordering::SeqCst);
                batch.push(1);
            }
            true
        }

        fn wait(&mut self) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn reader(records: usize) -> (Reader<Counter>, Arc<AtomicUsize>) {
        let left = Arc::new(AtomicUsize::new(records));
        let r = Reader::start("test-reader", Counter { left: left.clone() }).unwrap();
        (r, left)
    }

    #[test]
    fn batches_come_in_order_and_go_back_to_be_refilled() {
        let (mut r, left) = reader(10);
        let mut got = 0;
        while got < 10 {
            let b = r.next(Duration::from_secs(10)).expect("a batch");
            assert!(!b.is_empty() && b.len() <= 4, "{}", b.len());
            got += b.len();
            r.give_back(b);
        }
        assert!(r.stop().is_some(), "the source comes back");
        assert_eq!((got, left.load(Ordering::SeqCst)), (10, 0));
        assert!(r
            .spares
            .take()
            .is_some_and(|b| b.is_empty() && b.capacity() >= 4));
    }

    /// Nothing taken: the reader copies up to the bound and leaves the rest in the ring;
    /// the pass after the stop reads everything left.
    #[test]
    fn the_reader_stops_copying_at_the_backlog_bound_until_the_last_pass() {
        let (mut r, left) = reader(100);
        let deadline = Instant::now() + Duration::from_secs(20);
        while left.load(Ordering::SeqCst) > 84 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(left.load(Ordering::SeqCst), 84, "16 copied out, no more");
        r.stop();
        assert_eq!(left.load(Ordering::SeqCst), 0);
        let mut got = 0;
        while let Some(b) = r.next(Duration::ZERO) {
            got += b.len();
        }
        assert_eq!(got, 100);
    }
}
