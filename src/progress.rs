//! A progress bar on stderr for long offline inputs, beside the source readers: it shows how
//! far into the input files the reader is, so a 20 GB trace does not look like a hang. It
//! draws only when stderr is a terminal and the input is big enough to take a while, at most
//! ~10 times a second, and erases itself when done, so piped and scripted runs (and the
//! JSON on stdout) never see it.
//!
//! The reader counts raw bytes pulled from the files (`source`'s `CountingRead`, under any gzip
//! decoder, so the count matches the on-disk size), and the main loop calls
//! [`Progress::update`] with that count as often as it likes: the call costs a compare until
//! 64 KiB more have been read.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

/// Inputs smaller than this finish before a bar would help.
pub const MIN_BYTES: u64 = 8 << 20;
const INTERVAL: Duration = Duration::from_millis(100);
const CHECK_EVERY: u64 = 64 << 10;
const BAR: usize = 30;

pub struct Progress {
    total: u64,
    out: Option<Box<dyn Write + Send>>,
    started: Instant,
    last_draw: Option<Instant>,
    last_bytes: u64,
    drawn: bool,
}

impl Progress {
    /// The bar for reading `total` bytes of input files: drawn on stderr only when stderr is
    /// a terminal and `total` is at least [`MIN_BYTES`]; otherwise every call is a no-op.
    /// `total` is 0 for stdin (size unknown), which disables the bar.
    pub fn for_files(total: u64) -> Self {
        let tty = io::stderr().is_terminal();
        let out: Option<Box<dyn Write + Send>> = if tty && total >= MIN_BYTES {
            Some(Box::new(io::stderr()))
        } else {
            None
        };
        Progress::with_writer(total, out)
    }

    /// A bar drawn on any writer (None: silent). For tests and for callers that decide
    /// themselves.
    pub fn with_writer(total: u64, out: Option<Box<dyn Write + Send>>) -> Self {
        Progress {
            total,
            out,
            started: Instant::now(),
            last_draw: None,
            last_bytes: 0,
            drawn: false,
        }
    }

    pub fn is_active(&self) -> bool {
        self.out.is_some()
    }

    /// Reports that `bytes_read` bytes of the input (in total, not since the last call) have
    /// been consumed. Redraws at most every 100 ms.
    pub fn update(&mut self, bytes_read: u64) {
        if self.out.is_none() || bytes_read < self.last_bytes + CHECK_EVERY {
            return;
        }
        self.last_bytes = bytes_read;
        let now = Instant::now();
        if self
            .last_draw
            .is_some_and(|t| now.duration_since(t) < INTERVAL)
        {
            return;
        }
        self.last_draw = Some(now);
        let line = self.line(bytes_read, now.duration_since(self.started));
        if let Some(out) = self.out.as_mut() {
            // A progress bar that cannot be drawn is not worth failing the analysis for.
            let _ = write!(out, "\r{line}\x1b[K");
            let _ = out.flush();
            self.drawn = true;
        }
    }

    /// Erases the bar (if it was ever drawn) so the report starts on a clean line.
    pub fn finish(&mut self) {
        if let Some(out) = self.out.as_mut() {
            if self.drawn {
                let _ = write!(out, "\r\x1b[K");
                let _ = out.flush();
            }
        }
        self.out = None;
    }

    fn line(&self, done: u64, elapsed: Duration) -> String {
        let total = self.total.max(1);
        let frac = (done as f64 / total as f64).clamp(0.0, 1.0);
        let filled = (frac * BAR as f64).round() as usize;
        let secs = elapsed.as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let eta = if rate > 0.0 && done < total {
            Some(((total - done) as f64 / rate) as u64)
        } else {
            None
        };
        let mut s = format!(
            "reading [{}{}] {:3.0}% {}/{} {}/s",
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            frac * 100.0,
            mb(done),
            mb(total),
            mb(rate as u64)
        );
        if let Some(e) = eta {
            s.push_str(&format!(" eta {}:{:02}", e / 60, e % 60));
        }
        s
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn mb(b: u64) -> String {
    let m = b as f64 / (1024.0 * 1024.0);
    if m >= 1024.0 {
        format!("{:.1} GB", m / 1024.0)
    } else {
        format!("{m:.1} MB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer the test can read back after the bar took ownership of it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Shared {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
        }
    }

    #[test]
    fn progress_draws_throttled_and_erases_on_finish() {
        let out = Shared::default();
        let mut p = Progress::with_writer(100 << 20, Some(Box::new(out.clone())));
        p.update(50 << 20);
        let first = out.text();
        assert!(first.contains(" 50%"), "{first:?}");
        assert!(first.contains("50.0 MB/100.0 MB"), "{first:?}");
        // Within 100 ms of the last draw: nothing new.
        p.update(60 << 20);
        assert_eq!(out.text(), first);
        std::thread::sleep(INTERVAL + Duration::from_millis(20));
        p.update(75 << 20);
        assert!(out.text().contains(" 75%"));
        p.finish();
        assert!(out.text().ends_with("\r\x1b[K"));
        // After finish the bar is gone for good.
        let done = out.text();
        p.update(100 << 20);
        assert_eq!(out.text(), done);
    }

    #[test]
    fn progress_silent_without_writer_or_when_never_drawn() {
        let mut p = Progress::with_writer(100 << 20, None);
        p.update(1 << 30);
        p.finish();
        assert!(!p.is_active());
        let out = Shared::default();
        let mut p = Progress::with_writer(100 << 20, Some(Box::new(out.clone())));
        p.update(10); // below the 64 KiB step: no clock read, no draw
        p.finish();
        assert_eq!(out.text(), "");
    }
}
