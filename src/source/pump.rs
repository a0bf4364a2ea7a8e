//! Read-ahead without a thread of its own, for a machine with two cores: the input's next
//! chunks (gunzip's output, or a pipe's bytes) are read by whichever of the two pipeline
//! threads has nothing else to do. The parser reads a chunk itself when none is ready; the
//! analyzer reads ahead while it waits for events. A reader thread of its own made three
//! busy threads on two cores, and whichever the scheduler set aside held up the other two:
//! a gzipped 6M-line trace ran 0.71-0.79 s for 1.1 s of CPU, where two threads that share
//! the three stages' work keep both cores busy to the end.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Condvar, Mutex, MutexGuard, TryLockError};

/// Chunks read ahead of the parser (as many as a reader thread keeps queued).
const DEPTH: usize = 8;

/// One read of the input: the buffer (`room` bytes of free space at its front, then what
/// was read) and how many bytes were read; 0 is the end of the input.
pub(super) type Item = std::io::Result<(Vec<u8>, usize)>;

/// Whose turn it is to read is decided by `source`'s lock: the thread holding it reads the
/// next chunk, and queues it before letting go, so chunks are queued in input order.
pub(crate) struct Pump {
    source: Mutex<Source>,
    queue: Mutex<Queue>,
    ready: Condvar,
    room: usize,
    chunk: usize,
}

struct Source {
    inner: Box<dyn Read + Send>,
    /// The input has ended (or failed): its last item is handed out.
    done: bool,
}

struct Queue {
    items: VecDeque<Item>,
    /// Spent buffers, for reuse.
    spares: Vec<Vec<u8>>,
    /// Nothing more will be queued: the last item is in `items`, or already taken.
    done: bool,
    /// The parser waits for the chunk another thread is reading.
    waiting: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic on one thread poisons the lock; the data is still whole, and the panic is
    // reported when that thread is joined.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pump {
    /// Reads `inner` in chunks of `chunk` bytes, each after `room` bytes of free space.
    pub(super) fn new(inner: Box<dyn Read + Send>, room: usize, chunk: usize) -> Pump {
        Pump {
            source: Mutex::new(Source { inner, done: false }),
            queue: Mutex::new(Queue {
                items: VecDeque::with_capacity(DEPTH),
                spares: Vec::new(),
                done: false,
                waiting: false,
            }),
            ready: Condvar::new(),
            room,
            chunk,
        }
    }

    /// Reads the next chunk; None if the last one was read already.
    fn read_one(&self, src: &mut Source) -> Option<Item> {
        if src.done {
            return None;
        }
        let spare = lock(&self.queue).spares.pop();
        let mut buf = spare.unwrap_or_else(|| vec![0; self.room + self.chunk]);
        let n = loop {
            match src.inner.read(&mut buf[self.room..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        src.done = !matches!(n, Ok(n) if n > 0);
        Some(n.map(|n| (buf, n)))
    }

    /// For a thread with nothing else to do: reads one chunk ahead, unless enough are
    /// queued, the input has ended, or another thread is reading. True if it read one (and
    /// may be asked again), false if there was nothing for it to do.
    pub(crate) fn help(&self) -> bool {
        {
            let q = lock(&self.queue);
            if q.done || q.items.len() >= DEPTH {
                return false;
            }
        }
        let mut src = match self.source.try_lock() {
            Ok(s) => s,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let item = self.read_one(&mut src);
        let mut q = lock(&self.queue);
        if let Some(item) = item {
            q.items.push_back(item);
        }
        q.done = src.done;
        drop(src);
        if q.waiting {
            q.waiting = false;
            self.ready.notify_one();
        }
        true
    }

    /// For the parser: the next chunk, read here if none is queued and no other thread is
    /// reading it (else waited for).
    pub(super) fn next(&self) -> Item {
        loop {
            {
                let mut q = lock(&self.queue);
                if let Some(item) = q.items.pop_front() {
                    return item;
                }
                if q.done {
                    return Ok((Vec::new(), 0));
                }
            }
            match self.source.try_lock() {
                Ok(mut src) => {
                    // A chunk queued between the look above and the lock comes first.
                    if let Some(item) = lock(&self.queue).items.pop_front() {
                        return item;
                    }
                    let item = self.read_one(&mut src);
                    lock(&self.queue).done = src.done;
                    return item.unwrap_or_else(|| Ok((Vec::new(), 0)));
                }
                Err(TryLockError::Poisoned(_)) => {
                    return Err(std::io::Error::other("the input's reader panicked"));
                }
                Err(TryLockError::WouldBlock) => {
                    // Another thread is reading the next chunk: it queues it and wakes us.
                    let mut q = lock(&self.queue);
                    while q.items.is_empty() && !q.done {
                        q.waiting = true;
                        q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
        }
    }

    /// A spent buffer, for a later read.
    pub(super) fn give_back(&self, buf: Vec<u8>) {
        let mut q = lock(&self.queue);
        if q.spares.len() < DEPTH && buf.len() == self.room + self.chunk {
            q.spares.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its bytes in uneven pieces, slowly now and then.
    struct Uneven {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Uneven {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            self.step = self.step % 7 + 1;
            if self.step == 3 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            let n = (self.data.len() - self.at)
                .min(out.len())
                .min(self.step * 13);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// Whatever thread reads each chunk, the parser gets every byte once, in order, and
    /// then the end: read by the parser alone, by turns on one thread, and with a helper
    /// thread reading ahead while the parser reads.
    #[test]
    fn every_byte_arrives_once_in_order_whoever_reads_it() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let drain = |pump: &Pump, mut between: Box<dyn FnMut(usize) + '_>| {
            let mut got = vec![];
            for i in 0.. {
                between(i);
                let (buf, n) = pump.next().expect("no error");
                if n == 0 {
                    break;
                }
                assert_eq!(&buf[..4], &[0; 4], "the room at the front is left free");
                got.extend_from_slice(&buf[4..4 + n]);
                pump.give_back(buf);
            }
            // The end is the end, however often it is asked.
            assert_eq!(pump.next().unwrap().1, 0);
            assert!(!pump.help());
            got
        };
        let new = || {
            Pump::new(
                Box::new(Uneven {
                    data: data.clone(),
                    at: 0,
                    step: 0,
                }),
                4,
                64,
            )
        };
        assert!(drain(&new(), Box::new(|_| {})) == data, "alone");
        let pump = new();
        let turns = drain(
            &pump,
            Box::new(|i| {
                // 0 to 10 chunks read ahead before each one taken: the queue fills up.
                for _ in 0..i % 11 {
                    pump.help();
                }
            }),
        );
        assert!(turns == data, "by turns");
        let pump = std::sync::Arc::new(new());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let helped = std::sync::Arc::new(AtomicU64::new(0));
        let helper = {
            let (pump, stop, helped) = (pump.clone(), stop.clone(), helped.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    if pump.help() {
                        helped.fetch_add(1, Relaxed);
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
        };
        // The parser starts once the helper has read ahead, so both read some.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while helped.load(Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the helper never read"
            );
            std::thread::yield_now();
        }
        let threads = drain(&pump, Box::new(|_| {}));
        stop.store(true, Relaxed);
        helper.join().unwrap();
        assert!(threads == data, "with a helper thread");
    }

    /// A read error reaches the parser once, and the input ends there.
    #[test]
    fn an_error_is_handed_on_and_ends_the_input() {
        struct Fails(u32);
        impl Read for Fails {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                self.0 += 1;
                if self.0 == 3 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "cut",
                    ));
                }
                out[0] = b'x';
                Ok(1)
            }
        }
        let pump = Pump::new(Box::new(Fails(0)), 0, 16);
        assert!(pump.help());
        assert_eq!(pump.next().unwrap().1, 1);
        assert_eq!(pump.next().unwrap().1, 1);
        let e = pump.next().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(!pump.help(), "nothing to read past the error");
        assert_eq!(pump.next().unwrap().1, 0);
    }
}
