//! Syscall numbers and errno values to names, for the live tracers (ptrace and perf report
//! raw numbers; every other stage speaks names). Built from the `libc` constants of the
//! architecture stallscope is compiled for (every `SYS_` constant libc has for it), so there
//! is no hand-kept number table to drift.

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
    SYS_mincore,
    SYS_madvise,
    SYS_shmget,
    SYS_shmat,
    SYS_shmctl,
    SYS_dup,
    SYS_dup2,
    SYS_pause,
    SYS_nanosleep,
    SYS_getitimer,
    SYS_alarm,
    SYS_setitimer,
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
    SYS_semget,
    SYS_semop,
    SYS_semctl,
    SYS_shmdt,
    SYS_msgget,
    SYS_msgsnd,
    SYS_msgrcv,
    SYS_msgctl,
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
    SYS_link,
    SYS_unlink,
    SYS_symlink,
    SYS_readlink,
    SYS_chmod,
    SYS_fchmod,
    SYS_chown,
    SYS_fchown,
    SYS_lchown,
    SYS_umask,
    SYS_gettimeofday,
    SYS_getrlimit,
    SYS_getrusage,
    SYS_sysinfo,
    SYS_times,
    SYS_ptrace,
    SYS_getuid,
    SYS_syslog,
    SYS_getgid,
    SYS_setuid,
    SYS_setgid,
    SYS_geteuid,
    SYS_getegid,
    SYS_setpgid,
    SYS_getppid,
    SYS_getpgrp,
    SYS_setsid,
    SYS_setreuid,
    SYS_setregid,
    SYS_getgroups,
    SYS_setgroups,
    SYS_setresuid,
    SYS_getresuid,
    SYS_setresgid,
    SYS_getresgid,
    SYS_getpgid,
    SYS_setfsuid,
    SYS_setfsgid,
    SYS_getsid,
    SYS_capget,
    SYS_capset,
    SYS_rt_sigpending,
    SYS_rt_sigtimedwait,
    SYS_rt_sigqueueinfo,
    SYS_rt_sigsuspend,
    SYS_sigaltstack,
    SYS_utime,
    SYS_mknod,
    SYS_uselib,
    SYS_personality,
    SYS_ustat,
    SYS_statfs,
    SYS_fstatfs,
    SYS_sysfs,
    SYS_getpriority,
    SYS_setpriority,
    SYS_sched_setparam,
    SYS_sched_getparam,
    SYS_sched_setscheduler,
    SYS_sched_getscheduler,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_rr_get_interval,
    SYS_mlock,
    SYS_munlock,
    SYS_mlockall,
    SYS_munlockall,
    SYS_vhangup,
    SYS_modify_ldt,
    SYS_pivot_root,
    SYS__sysctl,
    SYS_prctl,
    SYS_arch_prctl,
    SYS_adjtimex,
    SYS_setrlimit,
    SYS_chroot,
    SYS_sync,
    SYS_acct,
    SYS_settimeofday,
    SYS_mount,
    SYS_umount2,
    SYS_swapon,
    SYS_swapoff,
    SYS_reboot,
    SYS_sethostname,
    SYS_setdomainname,
    SYS_iopl,
    SYS_ioperm,
    SYS_init_module,
    SYS_delete_module,
    SYS_quotactl,
    SYS_nfsservctl,
    SYS_getpmsg,
    SYS_putpmsg,
    SYS_afs_syscall,
    SYS_tuxcall,
    SYS_security,
    SYS_gettid,
    SYS_readahead,
    SYS_setxattr,
    SYS_lsetxattr,
    SYS_fsetxattr,
    SYS_getxattr,
    SYS_lgetxattr,
    SYS_fgetxattr,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_flistxattr,
    SYS_removexattr,
    SYS_lremovexattr,
    SYS_fremovexattr,
    SYS_tkill,
    SYS_time,
    SYS_futex,
    SYS_sched_setaffinity,
    SYS_sched_getaffinity,
    SYS_set_thread_area,
    SYS_io_setup,
    SYS_io_destroy,
    SYS_io_getevents,
    SYS_io_submit,
    SYS_io_cancel,
    SYS_get_thread_area,
    SYS_lookup_dcookie,
    SYS_epoll_create,
    SYS_epoll_ctl_old,
    SYS_epoll_wait_old,
    SYS_remap_file_pages,
    SYS_getdents64,
    SYS_set_tid_address,
    SYS_restart_syscall,
    SYS_semtimedop,
    SYS_fadvise64,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_timer_gettime,
    SYS_timer_getoverrun,
    SYS_timer_delete,
    SYS_clock_settime,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_clock_nanosleep,
    SYS_exit_group,
    SYS_epoll_wait,
    SYS_epoll_ctl,
    SYS_tgkill,
    SYS_utimes,
    SYS_vserver,
    SYS_mbind,
    SYS_set_mempolicy,
    SYS_get_mempolicy,
    SYS_mq_open,
    SYS_mq_unlink,
    SYS_mq_timedsend,
    SYS_mq_timedreceive,
    SYS_mq_notify,
    SYS_mq_getsetattr,
    SYS_kexec_load,
    SYS_waitid,
    SYS_add_key,
    SYS_request_key,
    SYS_keyctl,
    SYS_ioprio_set,
    SYS_ioprio_get,
    SYS_inotify_init,
    SYS_inotify_add_watch,
    SYS_inotify_rm_watch,
    SYS_migrate_pages,
    SYS_openat,
    SYS_mkdirat,
    SYS_mknodat,
    SYS_fchownat,
    SYS_futimesat,
    SYS_newfstatat,
    SYS_unlinkat,
    SYS_renameat,
    SYS_linkat,
    SYS_symlinkat,
    SYS_readlinkat,
    SYS_fchmodat,
    SYS_faccessat,
    SYS_pselect6,
    SYS_ppoll,
    SYS_unshare,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_splice,
    SYS_tee,
    SYS_sync_file_range,
    SYS_vmsplice,
    SYS_move_pages,
    SYS_utimensat,
    SYS_epoll_pwait,
    SYS_signalfd,
    SYS_timerfd_create,
    SYS_eventfd,
    SYS_fallocate,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    SYS_accept4,
    SYS_signalfd4,
    SYS_eventfd2,
    SYS_epoll_create1,
    SYS_dup3,
    SYS_pipe2,
    SYS_inotify_init1,
    SYS_preadv,
    SYS_pwritev,
    SYS_rt_tgsigqueueinfo,
    SYS_perf_event_open,
    SYS_recvmmsg,
    SYS_fanotify_init,
    SYS_fanotify_mark,
    SYS_prlimit64,
    SYS_name_to_handle_at,
    SYS_open_by_handle_at,
    SYS_clock_adjtime,
    SYS_syncfs,
    SYS_sendmmsg,
    SYS_setns,
    SYS_getcpu,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_kcmp,
    SYS_finit_module,
    SYS_sched_setattr,
    SYS_sched_getattr,
    SYS_renameat2,
    SYS_seccomp,
    SYS_getrandom,
    SYS_memfd_create,
    SYS_kexec_file_load,
    SYS_bpf,
    SYS_execveat,
    SYS_userfaultfd,
    SYS_membarrier,
    SYS_mlock2,
    SYS_copy_file_range,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_pkey_mprotect,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_statx,
    SYS_rseq,
    SYS_pidfd_send_signal,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_open_tree,
    SYS_move_mount,
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_fspick,
    SYS_pidfd_open,
    SYS_clone3,
    SYS_close_range,
    SYS_openat2,
    SYS_pidfd_getfd,
    SYS_faccessat2,
    SYS_process_madvise,
    SYS_epoll_pwait2,
    SYS_mount_setattr,
    SYS_quotactl_fd,
    SYS_landlock_create_ruleset,
    SYS_landlock_add_rule,
    SYS_landlock_restrict_self,
    SYS_memfd_secret,
    SYS_process_mrelease,
    SYS_futex_waitv,
    SYS_set_mempolicy_home_node,
    SYS_fchmodat2,
    SYS_mseal,
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
        // Numbers the hand-picked subset of libc's list left as `syscall_N` (pause was
        // `syscall_34` in a live report): the list is now all of libc's for x86_64.
        #[cfg(target_arch = "x86_64")]
        for (nr, name) in [
            (34, "pause"),
            (29, "shmget"),
            (38, "setitimer"),
            (149, "mlock"),
        ] {
            assert_eq!(syscall_name(nr), name);
        }
        assert_eq!(errno_name(libc::EAGAIN as i64), "EAGAIN");
        assert_eq!(errno_name(ERESTARTSYS), "ERESTARTSYS");
        assert_eq!(signal_name(libc::SIGCHLD), "SIGCHLD");
    }
}
