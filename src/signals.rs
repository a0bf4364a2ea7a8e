//! Vocabulary: the process's signal handlers, installed in one place. `attach` and `watch`
//! stop on SIGINT or SIGTERM (the flag is read by their loops, which then detach cleanly);
//! the file reader turns a SIGBUS on a mapped file that shrank into an error message.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT/SIGTERM: stop tracing, detach, report.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM ask the live loops to stop (`stop_requested`) instead of
/// killing the process: a tracer killed mid-trace would leave nothing of its report.
pub(crate) fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        install(sig, on_stop_signal as *const () as usize, 0);
    }
}

/// Whether SIGINT or SIGTERM came since `install_stop_handlers`.
pub(crate) fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Installs `handler` (an `extern "C"` function's address, of the shape `flags` says:
/// `SA_SIGINFO` for the three-argument one) for `sig`, with nothing masked.
pub(crate) fn install(sig: libc::c_int, handler: usize, flags: libc::c_int) {
    // SAFETY: a zeroed, then filled, sigaction; the handlers given here only call
    // async-signal-safe functions.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}
