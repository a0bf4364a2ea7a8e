//! Read-ahead without a thread of its own, for a machine with two cores: the input's next
//! chunks (gunzip's output, a pipe's bytes, or the next mapped window of a file) are read by
//! whichever of the two pipeline threads is free. The parser reads a chunk itself when none
//! is ready; the analyzer reads ahead while it waits for events. A reader thread of its own
//! made three busy threads on two cores, each set aside in turn by the scheduler: a gzipped
//! 6M-line trace took 0.75 s for 1.1 s of CPU. Shared, it takes 0.61 s.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, TryLockError};

/// What a pump reads from: one item at a time, in order.
pub(super) trait Producer: Send {
    type Item: Send;
    /// A spent item's buffer, given back for reuse (or to be freed off the parser's path).
    type Spare: Send;
    /// The next item, and whether it is the input's last (its end, or an error). `spares`:
    /// the buffers given back so far; what the producer leaves in it is kept.
    fn produce(&mut self, spares: &mut Vec<Self::Spare>) -> (std::io::Result<Self::Item>, bool);
}

/// The one thing the analyzer's thread asks of a pump: a piece of reading ahead.
pub(crate) trait Help: Send + Sync {
    /// Reads one item ahead, unless enough are queued or the input has ended (waiting for
    /// another thread that is reading one). True if it read one (and may be asked again),
    /// false if there was nothing for it to do.
    fn help(&self) -> bool;
}

/// Whose turn it is to read is decided by `source`'s lock: the thread holding it reads the
/// next item, and queues it before letting go, so items are queued in input order.
pub(super) struct Pump<P: Producer> {
    source: Mutex<Source<P>>,
    queue: Mutex<Queue<P::Item, P::Spare>>,
    ready: Condvar,
    /// Items read ahead at most.
    depth: usize,
}

struct Source<P> {
    producer: P,
    /// The input has ended (or failed): its last item is handed out.
    done: bool,
}

struct Queue<I, S> {
    items: VecDeque<std::io::Result<I>>,
    spares: Vec<S>,
    /// Nothing more will be queued: the last item is in `items`, or already taken.
    done: bool,
    /// The parser waits for the item another thread is reading.
    waiting: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic on one thread poisons the lock; the data is still whole, and the panic is
    // reported when that thread is joined.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<P: Producer> Pump<P> {
    /// A pump that reads up to `depth` items ahead.
    pub(super) fn new(producer: P, depth: usize) -> Pump<P> {
        Pump {
            source: Mutex::new(Source {
                producer,
                done: false,
            }),
            queue: Mutex::new(Queue {
                items: VecDeque::with_capacity(depth),
                spares: Vec::new(),
                done: false,
                waiting: false,
            }),
            ready: Condvar::new(),
            depth,
        }
    }

    /// Reads the next item, with the source held; None if the last one was read already.
    fn read_one(&self, src: &mut Source<P>) -> Option<std::io::Result<P::Item>> {
        if src.done {
            return None;
        }
        let mut spares = std::mem::take(&mut lock(&self.queue).spares);
        let (item, last) = src.producer.produce(&mut spares);
        src.done = last;
        lock(&self.queue).spares.append(&mut spares);
        Some(item)
    }

    /// For the parser: the next item, read here if none is queued and no other thread is
    /// reading it (else waited for); None after the last one.
    pub(super) fn next(&self) -> Option<std::io::Result<P::Item>> {
        loop {
            {
                let mut q = lock(&self.queue);
                if let Some(item) = q.items.pop_front() {
                    return Some(item);
                }
                if q.done {
                    return None;
                }
            }
            match self.source.try_lock() {
                Ok(mut src) => {
                    // An item queued between the look above and the lock comes first.
                    if let Some(item) = lock(&self.queue).items.pop_front() {
                        return Some(item);
                    }
                    let item = self.read_one(&mut src);
                    lock(&self.queue).done = src.done;
                    return item;
                }
                Err(TryLockError::Poisoned(_)) => {
                    return Some(Err(std::io::Error::other("the input's reader panicked")));
                }
                Err(TryLockError::WouldBlock) => {
                    // Another thread is reading the next item: it queues it and wakes us.
                    let mut q = lock(&self.queue);
                    while q.items.is_empty() && !q.done {
                        q.waiting = true;
                        q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
        }
    }

    /// A spent item's buffer, for a later read (a few are kept; the rest are freed).
    pub(super) fn give_back(&self, spare: P::Spare) {
        let mut q = lock(&self.queue);
        if q.spares.len() < self.depth + 2 {
            q.spares.push(spare);
        }
    }
}

impl<P: Producer> Help for Pump<P> {
    fn help(&self) -> bool {
        let full = |q: &Queue<_, _>| q.done || q.items.len() >= self.depth;
        if full(&lock(&self.queue)) {
            return false;
        }
        // The parser may be reading the item it needs: the helper waits for it to finish
        // (one chunk's read) and reads the next one meanwhile parsed. Giving up instead
        // left the analyzer asleep while the parser did nearly all of gunzip's work
        // (bench/PROFILE.md, fifteenth round).
        let mut src = lock(&self.source);
        if full(&lock(&self.queue)) {
            return false;
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

    /// Hands out its bytes in uneven pieces (slowly now and then), in buffers given back
    /// when there are any; an empty piece is the end.
    struct Uneven {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Producer for Uneven {
        type Item = Vec<u8>;
        type Spare = Vec<u8>;
        fn produce(&mut self, spares: &mut Vec<Vec<u8>>) -> (std::io::Result<Vec<u8>>, bool) {
            self.step = self.step % 7 + 1;
            if self.step == 3 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            let n = (self.data.len() - self.at).min(self.step * 13);
            let mut piece = spares.pop().unwrap_or_default();
            piece.clear();
            piece.extend_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            (Ok(piece), n == 0)
        }
    }

    /// Whatever thread reads each piece, the parser gets every byte once, in order, and
    /// then the end: read by the parser alone, by turns on one thread, and with a helper
    /// thread reading ahead while the parser reads.
    #[test]
    fn every_byte_arrives_once_in_order_whoever_reads_it() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let drain = |pump: &Pump<Uneven>, mut between: Box<dyn FnMut(usize) + '_>| {
            let mut got = vec![];
            for i in 0.. {
                between(i);
                let piece = pump.next().expect("an empty piece before the end").unwrap();
                if piece.is_empty() {
                    break;
                }
                got.extend_from_slice(&piece);
                pump.give_back(piece);
            }
            // The end is the end, however often it is asked.
            assert!(pump.next().is_none());
            assert!(!pump.help());
            got
        };
        let new = || {
            Pump::new(
                Uneven {
                    data: data.clone(),
                    at: 0,
                    step: 0,
                },
                8,
            )
        };
        assert!(drain(&new(), Box::new(|_| {})) == data, "alone");
        let pump = new();
        let turns = drain(
            &pump,
            Box::new(|i| {
                // 0 to 10 pieces read ahead before each one taken: the queue fills up.
                for _ in 0..i % 11 {
                    pump.help();
                }
                assert!(lock(&pump.queue).items.len() <= 8, "at most depth ahead");
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
        impl Producer for Fails {
            type Item = u32;
            type Spare = ();
            fn produce(&mut self, _: &mut Vec<()>) -> (std::io::Result<u32>, bool) {
                self.0 += 1;
                if self.0 == 3 {
                    let e = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "cut");
                    return (Err(e), true);
                }
                (Ok(self.0), false)
            }
        }
        let pump = Pump::new(Fails(0), 8);
        assert!(pump.help());
        assert_eq!(pump.next().unwrap().unwrap(), 1);
        assert_eq!(pump.next().unwrap().unwrap(), 2);
        let e = pump.next().unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(!pump.help(), "nothing to read past the error");
        assert!(pump.next().is_none());
    }
}
