//! Helpers shared by the live (ptrace/perf) integration tests.

use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the right to trace: ptrace tests run one at a time within a test binary (the
/// mutex) and across test binaries and concurrent `cargo test` runs on the machine (an
/// flock, released when the file closes).
pub struct Serial {
    _m: std::sync::MutexGuard<'static, ()>,
    _f: Option<std::fs::File>,
}

pub fn serial() -> Serial {
    let m = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::env::temp_dir().join("stallscope-ptrace-tests.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok();
    if let Some(f) = &f {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on an fd this function owns for the guard's lifetime.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    }
    Serial { _m: m, _f: f }
}
