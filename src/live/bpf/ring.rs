//! The bpf backend's ring buffer, as its reader thread reads it (`reader.rs` runs the
//! thread): records copied out of the kernel's pages in batches of `Rec`s, or, for
//! `MEASURE_ENV`'s discard mode, only counted.

use super::{push_parsed, u32_at, Rec, MEASURE_ENV};
use crate::live::reader::Source;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

/// Batches handed back to the reader at most (each of `BATCH_MAX` records, allocated at
/// that size once): the reader refills them instead of growing a new vector (copies, fresh
/// pages) per batch. 32 x 512 records is under 4 MiB kept idle.
const SPARE_BATCHES: usize = 32;
/// Records per batch: 512 of them (120 KiB) stay in the caches between the reader that
/// writes them and the analysis that reads them on the other CPU; batches of 2048, handed
/// back and refilled in turn through a queue of 8, went through 4 MiB and missed them.
const BATCH_MAX: usize = 512;

/// The ring, for the reader thread.
pub(super) struct BpfRing {
    map: RingMap,
    /// aya's ring keeps the map (and its fd) open; records are read through `map`.
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    /// `MEASURE_ENV=discard`: records counted by kind, and their bytes, instead of read.
    discarded: Option<([u64; 17], u64)>,
}

impl BpfRing {
    /// Maps `ring` (of `data_bytes`) for reading; `discard`: `MEASURE_ENV=discard`.
    pub(super) fn new(
        ring: aya::maps::RingBuf<aya::maps::MapData>,
        data_bytes: usize,
        discard: bool,
    ) -> std::io::Result<Self> {
        Ok(BpfRing {
            map: RingMap::new(ring.as_raw_fd(), data_bytes)?,
            ring,
            discarded: discard.then_some(([0; 17], 0)),
        })
    }

    /// Says on stderr what discard mode threw away (nothing in the usual mode).
    pub(super) fn tell_discarded(&self) {
        let Some((kinds, bytes)) = &self.discarded else {
            return;
        };
        let total: u64 = kinds.iter().sum();
        let by_kind: Vec<String> = kinds
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("kind {k}: {n}"))
            .collect();
        eprintln!(
            "stallscope: {MEASURE_ENV}: discarded {total} records, {bytes} bytes ({})",
            by_kind.join(", ")
        );
    }
}

impl Source for BpfRing {
    type Item = Rec;
    const BATCH_START: usize = BATCH_MAX;
    const SPARES: usize = SPARE_BATCHES;

    #[inline]
    fn fill(&mut self, batch: &mut Vec<Rec>) -> bool {
        if let Some((kinds, bytes)) = &mut self.discarded {
            // The same reading as the usual mode's, so that it measures that.
            self.map.drain(usize::MAX, |item| {
                let k = if item.len() >= 4 { u32_at(item, 0) } else { 0 };
                kinds[(k as usize).min(kinds.len() - 1)] += 1;
                *bytes += item.len() as u64;
            });
            return false;
        }
        let room = BATCH_MAX.saturating_sub(batch.len());
        self.map.drain(room, |item| push_parsed(item, batch));
        batch.len() >= BATCH_MAX
    }

    fn wait(&mut self) {
        wait_readable(self.ring.as_raw_fd());
    }
}

/// The ring's pages as the kernel lays them out (kernel/bpf/ringbuf.c): the consumer
/// position's page (written by us), then the producer position's page and the data pages
/// mapped twice, so a record that wraps reads on contiguously. Read here rather than
/// through aya's `RingBuf::next`, which publishes the consumer position with a full
/// barrier after every record: that store, on a line the kernel reads at every reserve,
/// was half of the reader thread's samples. Here it is published every `PUBLISH_EVERY`
/// records and when the ring is empty.
struct RingMap {
    consumer: *mut u8,
    meta: *mut u8,
    meta_len: usize,
    page: usize,
    mask: usize,
}

/// Records read between two publications of the consumer position (a few KiB of the ring
/// held back at most).
const PUBLISH_EVERY: usize = 64;
const RINGBUF_BUSY_BIT: u32 = 1 << 31;
const RINGBUF_DISCARD_BIT: u32 = 1 << 30;
const RINGBUF_HDR_SZ: usize = 8;

impl RingMap {
    fn new(fd: i32, data_bytes: usize) -> std::io::Result<RingMap> {
        let page = crate::live::page_size();
        let meta_len = page + 2 * data_bytes;
        // SAFETY: fresh shared mappings of the ring's fd, unmapped in Drop.
        unsafe {
            let consumer = libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if consumer == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            let meta = libc::mmap(
                std::ptr::null_mut(),
                meta_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                page as libc::off_t,
            );
            if meta == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                libc::munmap(consumer, page);
                return Err(e);
            }
            Ok(RingMap {
                consumer: consumer.cast(),
                meta: meta.cast(),
                meta_len,
                page,
                mask: data_bytes - 1,
            })
        }
    }

    fn consumer_pos(&self) -> &std::sync::atomic::AtomicUsize {
        // SAFETY: the page starts with the kernel's consumer position (unsigned long).
        unsafe { &*(self.consumer as *const std::sync::atomic::AtomicUsize) }
    }

    fn producer_pos(&self) -> &std::sync::atomic::AtomicUsize {
        // SAFETY: as consumer_pos, for the producer's page.
        unsafe { &*(self.meta as *const std::sync::atomic::AtomicUsize) }
    }

    /// Calls `each` with every record committed now, in order, up to `limit` of them (the
    /// discarded ones skipped); returns how many were given. Stops at a record still being
    /// written.
    fn drain(&self, limit: usize, mut each: impl FnMut(&[u8])) -> usize {
        let cons_at = self.consumer_pos();
        let mut cons = cons_at.load(Ordering::Relaxed);
        let mut prod = self.producer_pos().load(Ordering::Acquire);
        let mut given = 0;
        let mut unpublished = 0;
        // SAFETY: the data pages follow the producer's page; offsets are masked into the
        // first copy, and a record (at most the ring's size) ends inside the second.
        let data = unsafe { self.meta.add(self.page) };
        while given < limit {
            if cons == prod {
                prod = self.producer_pos().load(Ordering::Acquire);
                if cons == prod {
                    break;
                }
            }
            let off = cons & self.mask;
            // SAFETY: the header is 8-byte aligned inside the data pages; the kernel writes
            // its length word with release order once the record is committed.
            let hdr = unsafe { &*(data.add(off) as *const std::sync::atomic::AtomicU32) }
                .load(Ordering::Acquire);
            if hdr & RINGBUF_BUSY_BIT != 0 {
                break;
            }
            let len = (hdr & !(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT)) as usize;
            if hdr & RINGBUF_DISCARD_BIT == 0 {
                // SAFETY: the record's bytes follow its header, contiguous (double mapping).
                let rec =
                    unsafe { std::slice::from_raw_parts(data.add(off + RINGBUF_HDR_SZ), len) };
                each(rec);
                given += 1;
            }
            cons += (RINGBUF_HDR_SZ + len).next_multiple_of(8);
            unpublished += 1;
            if unpublished >= PUBLISH_EVERY {
                cons_at.store(cons, Ordering::Release);
                unpublished = 0;
            }
        }
        cons_at.store(cons, Ordering::Release);
        given
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: the mappings made in new, used by nothing once this is dropped.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(self.meta.cast(), self.meta_len);
        }
    }
}

// SAFETY: the mappings are used only by the one thread that owns the RingMap.
unsafe impl Send for RingMap {}

/// Sleeps until the ring has records or 5 ms have passed (a stop is seen within that).
fn wait_readable(fd: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, 5) };
}
