//! Syscall numbers and errno values to names, for the live tracers (ptrace and perf report
//! raw numbers; every other stage speaks names). Built from the `libc` constants of the
//! architecture stallscope is compiled for, so there is no hand-kept number table to drift.

use std::collections::HashMap;
use std::sync::OnceLock;

macro_rules! sys_table {
    ($($name:ident),* $(,)?) => {
        &[$((libc::$name as i64, strip_sys(stringify!($name)))),*]
    };
}

const fn strip_sys(s: &'static str) -> &'static str {
    // "SYS_read" -> "read": the prefix is 4 ASCII bytes.
    let b = s.as_bytes();
    let (_, rest) = b.split_at(4);
    match std::str::from_utf8(rest) {
        Ok(r) => r,
        Err(_) => s,
    }
}

#[cfg(target_arch = "x86_64")]
const SYSCALLS: &[(i64, &str)] = sys_table!(
    SYS_read,
    SYS_write,
    SYS_open,
    SYS_close,
    SYS_stat,
    SYS_fstat,
    SYS_lstat,
    SYS_poll,
    SYS_lseek,
    SYS_mmap,
    SYS_mprotect,
    SYS_munmap,
    SYS_brk,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_ioctl,
    SYS_pread64,
    SYS_pwrite64,
    SYS_readv,
    SYS_writev,
    SYS_access,
    SYS_pipe,
    SYS_select,
    SYS_sched_yield,
    SYS_mremap,
    SYS_msync,
    SYS_madvise,
    SYS_dup,
    SYS_dup2,
    SYS_nanosleep,
    SYS_getpid,
    SYS_sendfile,
    SYS_socket,
    SYS_connect,
    SYS_accept,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_shutdown,
    SYS_bind,
    SYS_listen,
    SYS_getsockname,
    SYS_getpeername,
    SYS_socketpair,
    SYS_setsockopt,
    SYS_getsockopt,
    SYS_clone,
    SYS_fork,
    SYS_vfork,
    SYS_execve,
    SYS_exit,
    SYS_wait4,
    SYS_kill,
    SYS_uname,
    SYS_fcntl,
    SYS_flock,
    SYS_fsync,
    SYS_fdatasync,
    SYS_truncate,
    SYS_ftruncate,
    SYS_getdents,
    SYS_getcwd,
    SYS_chdir,
    SYS_fchdir,
    SYS_rename,
    SYS_mkdir,
    SYS_rmdir,
    SYS_creat,
    SYS_unlink,
    SYS_readlink,
    SYS_chmod,
    SYS_fchmod,
    SYS_chown,
    SYS_fchown,
    SYS_umask,
    SYS_gettimeofday,
    SYS_getrlimit,
    SYS_getrusage,
    SYS_sysinfo,
    SYS_getuid,
    SYS_getgid,
    SYS_setuid,
    SYS_setgid,
    SYS_geteuid,
    SYS_getegid,
    SYS_getppid,
    SYS_setsid,
    SYS_prctl,
    SYS_arch_prctl,
    SYS_sync,
    SYS_gettid,
    SYS_futex,
    SYS_sched_setaffinity,
    SYS_sched_getaffinity,
    SYS_epoll_create,
    SYS_getdents64,
    SYS_set_tid_address,
    SYS_fadvise64,
    SYS_clock_gettime,
    SYS_clock_nanosleep,
    SYS_exit_group,
    SYS_epoll_wait,
    SYS_epoll_ctl,
    SYS_tgkill,
    SYS_waitid,
    SYS_openat,
    SYS_mkdirat,
    SYS_newfstatat,
    SYS_unlinkat,
    SYS_renameat,
    SYS_readlinkat,
    SYS_faccessat,
    SYS_pselect6,
    SYS_ppoll,
    SYS_set_robust_list,
    SYS_splice,
    SYS_sync_file_range,
    SYS_epoll_pwait,
    SYS_timerfd_create,
    SYS_fallocate,
    SYS_accept4,
    SYS_signalfd4,
    SYS_eventfd2,
    SYS_epoll_create1,
    SYS_dup3,
    SYS_pipe2,
    SYS_preadv,
    SYS_pwritev,
    SYS_prlimit64,
    SYS_syncfs,
    SYS_sendmmsg,
    SYS_recvmmsg,
    SYS_renameat2,
    SYS_getrandom,
    SYS_memfd_create,
    SYS_statx,
    SYS_rseq,
    SYS_clone3,
    SYS_close_range,
    SYS_openat2,
    SYS_faccessat2,
    SYS_epoll_pwait2,
    SYS_restart_syscall,
    SYS_copy_file_range,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_mincore,
    SYS_getpgrp,
    SYS_setpgid,
    SYS_setrlimit,
    SYS_times,
    SYS_sched_getparam,
    SYS_sched_setscheduler,
    SYS_mlock,
    SYS_munlock,
    SYS_membarrier,
    SYS_timerfd_settime,
    SYS_fstatfs,
    SYS_statfs,
    SYS_rt_sigtimedwait,
    SYS_sigaltstack,
    SYS_tkill,
);

/// Other architectures: numbers are shown as `syscall_N` (live attach is x86_64-only for now,
/// see `live::ptrace`).
#[cfg(not(target_arch = "x86_64"))]
const SYSCALLS: &[(i64, &str)] = &[];

fn sys_map() -> &'static HashMap<i64, &'static str> {
    static MAP: OnceLock<HashMap<i64, &'static str>> = OnceLock::new();
    MAP.get_or_init(|| {
        SYSCALLS
            .iter()
            .map(|(n, s)| (*n, crate::event::intern(s.as_bytes())))
            .collect()
    })
}

/// The name of syscall `nr` on this architecture; unknown numbers become `syscall_NNN`
/// (interned, and the interner bounds how many distinct ones can exist).
pub fn syscall_name(nr: i64) -> &'static str {
    match sys_map().get(&nr) {
        Some(s) => s,
        None => crate::event::intern(format!("syscall_{nr}").as_bytes()),
    }
}

/// The syscall number of `name` (the tracers' tests make calls by name).
#[cfg(test)]
pub fn syscall_nr(name: &str) -> Option<i64> {
    SYSCALLS.iter().find(|(_, s)| *s == name).map(|(n, _)| *n)
}

/// Kernel-internal restart codes: the call was interrupted and will run again.
pub const ERESTARTSYS: i64 = 512;
pub const ERESTARTNOINTR: i64 = 513;
pub const ERESTARTNOHAND: i64 = 514;
pub const ERESTART_RESTARTBLOCK: i64 = 516;

pub fn is_restart_errno(e: i64) -> bool {
    matches!(
        e,
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
    )
}

const ERRNOS: &[(i32, &str)] = &[
    (libc::EPERM, "EPERM"),
    (libc::ENOENT, "ENOENT"),
    (libc::ESRCH, "ESRCH"),
    (libc::EINTR, "EINTR"),
    (libc::EIO, "EIO"),
    (libc::ENXIO, "ENXIO"),
    (libc::E2BIG, "E2BIG"),
    (libc::EBADF, "EBADF"),
    (libc::ECHILD, "ECHILD"),
    (libc::EAGAIN, "EAGAIN"),
    (libc::ENOMEM, "ENOMEM"),
    (libc::EACCES, "EACCES"),
    (libc::EFAULT, "EFAULT"),
    (libc::EBUSY, "EBUSY"),
    (libc::EEXIST, "EEXIST"),
    (libc::EXDEV, "EXDEV"),
    (libc::ENODEV, "ENODEV"),
    (libc::ENOTDIR, "ENOTDIR"),
    (libc::EISDIR, "EISDIR"),
    (libc::EINVAL, "EINVAL"),
    (libc::ENFILE, "ENFILE"),
    (libc::EMFILE, "EMFILE"),
    (libc::ENOTTY, "ENOTTY"),
    (libc::EFBIG, "EFBIG"),
    (libc::ENOSPC, "ENOSPC"),
    (libc::ESPIPE, "ESPIPE"),
    (libc::EROFS, "EROFS"),
    (libc::EPIPE, "EPIPE"),
    (libc::ERANGE, "ERANGE"),
    (libc::EDEADLK, "EDEADLK"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::ENOTEMPTY, "ENOTEMPTY"),
    (libc::ENODATA, "ENODATA"),
    (libc::ETIME, "ETIME"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::EADDRINUSE, "EADDRINUSE"),
    (libc::ECONNRESET, "ECONNRESET"),
    (libc::ENOTCONN, "ENOTCONN"),
    (libc::ETIMEDOUT, "ETIMEDOUT"),
    (libc::ECONNREFUSED, "ECONNREFUSED"),
    (libc::EINPROGRESS, "EINPROGRESS"),
    (libc::ENOTSOCK, "ENOTSOCK"),
    (libc::ECONNABORTED, "ECONNABORTED"),
    (libc::ENETUNREACH, "ENETUNREACH"),
    (ERESTARTSYS as i32, "ERESTARTSYS"),
    (ERESTARTNOINTR as i32, "ERESTARTNOINTR"),
    (ERESTARTNOHAND as i32, "ERESTARTNOHAND"),
    (ERESTART_RESTARTBLOCK as i32, "ERESTART_RESTARTBLOCK"),
];

/// `EAGAIN` for 11; unknown values become `E123`.
pub fn errno_name(e: i64) -> &'static str {
    match ERRNOS.iter().find(|(n, _)| *n as i64 == e) {
        Some((_, s)) => crate::event::intern(s.as_bytes()),
        None => crate::event::intern(format!("E{e}").as_bytes()),
    }
}

/// The human text strace prints after an errno name (`Resource temporarily unavailable`).
pub fn errno_desc(name: &str) -> String {
    match ERRNOS.iter().find(|(_, n)| *n == name) {
        Some((e, _)) if is_restart_errno(*e as i64) => "To be restarted".to_string(),
        Some((e, _)) => {
            // strerror's words, as strace prints them ("Input/output error").
            let t = std::io::Error::from_raw_os_error(*e).to_string();
            match t.rfind(" (os error") {
                Some(i) => t[..i].to_string(),
                None => t,
            }
        }
        None => "Unknown error".to_string(),
    }
}

const SIGNALS: &[(i32, &str)] = &[
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGQUIT, "SIGQUIT"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGTRAP, "SIGTRAP"),
    (libc::SIGABRT, "SIGABRT"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGKILL, "SIGKILL"),
    (libc::SIGUSR1, "SIGUSR1"),
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGUSR2, "SIGUSR2"),
    (libc::SIGPIPE, "SIGPIPE"),
    (libc::SIGALRM, "SIGALRM"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGCHLD, "SIGCHLD"),
    (libc::SIGCONT, "SIGCONT"),
    (libc::SIGSTOP, "SIGSTOP"),
    (libc::SIGTSTP, "SIGTSTP"),
    (libc::SIGTTIN, "SIGTTIN"),
    (libc::SIGTTOU, "SIGTTOU"),
    (libc::SIGURG, "SIGURG"),
    (libc::SIGXCPU, "SIGXCPU"),
    (libc::SIGXFSZ, "SIGXFSZ"),
    (libc::SIGVTALRM, "SIGVTALRM"),
    (libc::SIGPROF, "SIGPROF"),
    (libc::SIGWINCH, "SIGWINCH"),
    (libc::SIGIO, "SIGIO"),
    (libc::SIGSYS, "SIGSYS"),
];

pub fn signal_name(sig: i32) -> &'static str {
    match SIGNALS.iter().find(|(n, _)| *n == sig) {
        Some((_, s)) => crate::event::intern(s.as_bytes()),
        None => crate::event::intern(format!("SIGRT_{sig}").as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_for_the_calls_redis_makes() {
        for name in [
            "read",
            "write",
            "fdatasync",
            "epoll_wait",
            "openat",
            "close",
            "clone",
            "wait4",
        ] {
            let nr = syscall_nr(name).unwrap_or(-1);
            assert!(nr >= 0, "{name} has no number");
            assert_eq!(syscall_name(nr), name);
        }
        assert_eq!(syscall_name(99_999), "syscall_99999");
        assert_eq!(errno_name(libc::EAGAIN as i64), "EAGAIN");
        assert_eq!(errno_name(ERESTARTSYS), "ERESTARTSYS");
        assert_eq!(signal_name(libc::SIGCHLD), "SIGCHLD");
    }
}
