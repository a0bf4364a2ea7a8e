//! Vocabulary: the two clocks every live layer reads. The monotonic one stamps events (a
//! wall-clock step during a trace must not move them); the wall one, read at the attach,
//! places the trace in time.

use crate::event::Nanos;

fn read(clock: libc::clockid_t) -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given and nothing else.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// CLOCK_MONOTONIC in ns: the live clock (immune to wall-clock steps during a trace).
pub fn now_mono() -> Nanos {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in ns since the epoch, read once at attach to place the trace in time.
pub fn now_wall() -> Nanos {
    read(libc::CLOCK_REALTIME)
}
