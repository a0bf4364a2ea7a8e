//! The bounded queue between two threads of the offline pipeline (the parser and the
//! analyzer). Its one job is to wake the other side rarely: a stage that finds the queue
//! empty (or full) sleeps until several items (or slots) are there, not until the first
//! one is. With `std::sync::mpsc::sync_channel` the analyzer, which keeps up with the
//! parser, slept and was woken again for nearly every batch, and each wake was a futex
//! call and an interrupt on the parser's core, the busier of the two (measured in
//! bench/PROFILE.md, twelfth round).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

struct State<T> {
    queue: VecDeque<T>,
    /// The sending side is gone: what is queued is all there will be.
    closed: bool,
    /// The receiving side is gone: nothing sent will be read.
    dropped: bool,
    receiver_asleep: bool,
    sender_asleep: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    depth: usize,
    /// A sleeping receiver is woken once this many items are queued.
    wake_at: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic on the other side poisons the lock; the queue itself is still whole, and
        // the panic is reported by the thread's join.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) struct Sender<T>(Arc<Shared<T>>);
pub(crate) struct Receiver<T>(Arc<Shared<T>>);

/// A queue of at most `depth` items; a receiver that waits is woken when `wake_at` are
/// queued (or the sender is gone), a sender that waits when half the slots are free.
pub(crate) fn bounded<T>(depth: usize, wake_at: usize) -> (Sender<T>, Receiver<T>) {
    assert!(depth >= 1 && (1..=depth).contains(&wake_at));
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::with_capacity(depth),
            closed: false,
            dropped: false,
            receiver_asleep: false,
            sender_asleep: false,
        }),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
        depth,
        wake_at,
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queues `item`, waiting for room; gives it back if the receiver is gone.
    pub(crate) fn send(&self, item: T) -> Result<(), T> {
        let s = &self.0;
        let mut st = s.lock();
        while st.queue.len() >= s.depth && !st.dropped {
            st.sender_asleep = true;
            st = s.not_full.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.dropped {
            return Err(item);
        }
        st.queue.push_back(item);
        if st.receiver_asleep && st.queue.len() >= s.wake_at {
            st.receiver_asleep = false;
            s.not_empty.notify_one();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.closed = true;
        st.receiver_asleep = false;
        self.0.not_empty.notify_one();
    }
}

impl<T> Receiver<T> {
    /// The next item, waiting for one; `None` once the sender is gone and all is read.
    pub(crate) fn recv(&self) -> Option<T> {
        self.recv_helping(|| false)
    }

    /// `recv`, but while the queue is empty the receiver first does other work: `idle`,
    /// called without the lock, does a piece of it and says whether it found any. Only
    /// when it found none does the receiver sleep.
    pub(crate) fn recv_helping(&self, mut idle: impl FnMut() -> bool) -> Option<T> {
        let s = &self.0;
        let mut st = s.lock();
        let mut may_help = true;
        loop {
            if let Some(item) = st.queue.pop_front() {
                if st.sender_asleep && st.queue.len() <= s.depth / 2 {
                    st.sender_asleep = false;
                    s.not_full.notify_one();
                }
                return Some(item);
            }
            if st.closed {
                return None;
            }
            if may_help {
                drop(st);
                may_help = idle();
                st = s.lock();
                continue;
            }
            st.receiver_asleep = true;
            st = s.not_empty.wait(st).unwrap_or_else(|e| e.into_inner());
            may_help = true;
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.dropped = true;
        st.sender_asleep = false;
        self.0.not_full.notify_one();
    }
}

impl<T> Iterator for Receiver<T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything sent is received, in order, whichever side is faster, and the end is
    /// seen once the sender is gone, though fewer than `wake_at` items are left.
    #[test]
    fn all_items_arrive_in_order_and_the_end_is_seen() {
        for (depth, wake_at, slow_receiver) in
            [(4, 2, false), (4, 2, true), (16, 4, false), (1, 1, true)]
        {
            let (tx, rx) = bounded::<u32>(depth, wake_at);
            let t = std::thread::spawn(move || {
                for i in 0..1003 {
                    tx.send(i).expect("the receiver is there");
                }
            });
            let mut got = vec![];
            for i in rx {
                if slow_receiver && i % 100 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                got.push(i);
            }
            t.join().unwrap();
            assert_eq!(
                got,
                (0..1003).collect::<Vec<_>>(),
                "depth {depth} wake_at {wake_at}"
            );
        }
    }

    /// A receiver that finds the queue empty does its other work first, as long as there
    /// is some, then sleeps; nothing sent meanwhile is missed, and the end is seen.
    #[test]
    fn an_idle_receiver_works_before_it_sleeps_and_misses_nothing() {
        use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
        let (tx, rx) = bounded::<u32>(4, 2);
        let pieces = std::sync::Arc::new(AtomicU32::new(0));
        let t = {
            let pieces = pieces.clone();
            std::thread::spawn(move || {
                // Sends only once the receiver has done five pieces of its other work.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while pieces.load(Relaxed) < 5 {
                    assert!(std::time::Instant::now() < deadline, "no idle work done");
                    std::thread::yield_now();
                }
                for i in 0..100 {
                    tx.send(i).expect("the receiver is there");
                }
            })
        };
        let mut got = vec![];
        // Five pieces of work, then none: the receiver sleeps until items come.
        let idle = || pieces.load(Relaxed) < 5 && pieces.fetch_add(1, Relaxed) < 5;
        while let Some(i) = rx.recv_helping(idle) {
            got.push(i);
        }
        t.join().unwrap();
        assert_eq!(pieces.load(Relaxed), 5);
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }

    /// A sender blocked on a full queue is let go, with its item back, when the receiver
    /// goes away (the analyzer's error ends the run; the parser must not hang).
    #[test]
    fn a_blocked_sender_is_released_when_the_receiver_goes() {
        let (tx, rx) = bounded::<u32>(2, 1);
        let t = std::thread::spawn(move || {
            let mut back = None;
            for i in 0..10 {
                if let Err(item) = tx.send(i) {
                    back = Some(item);
                    break;
                }
            }
            back
        });
        assert_eq!(rx.recv(), Some(0));
        // The sender fills the two slots (1, 2) and sleeps on 3.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !rx.0.lock().sender_asleep {
            assert!(
                std::time::Instant::now() < deadline,
                "the sender never blocked"
            );
            std::thread::yield_now();
        }
        drop(rx);
        assert_eq!(t.join().unwrap(), Some(3));
    }
}
