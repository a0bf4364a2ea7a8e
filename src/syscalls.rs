//! The syscall table: what every stage knows about a syscall by its name, in one place
//! (strace's `sysent` in miniature). The text parsers take their argument shapes from it,
//! the live decoders the same, the fd table and the recorder the fd effect, the analyzer the
//! facts. An entry is looked up once, when a name is interned, and travels with the call
//! (`Syscall::sys`): adding a syscall means adding one line here.

use crate::event::{Extra, Syscall, Tid};

/// What the analysis asks about a call (same bits as the analyzer's own set, so it can take
/// them from here).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Facts(pub u16);

impl Facts {
    /// Waits that are idle in any thread (the event loop's), and exits: a process tearing
    /// down its address space holds no one up.
    pub const ALWAYS_IDLE: u16 = 1;
    /// Waits that are idle outside the main thread.
    pub const BG_WAIT: u16 = 1 << 1;
    pub const READ: u16 = 1 << 2;
    pub const EPOLL: u16 = 1 << 3;
    pub const FSYNC: u16 = 1 << 4;
    pub const CLOSE: u16 = 1 << 5;
    /// read/write/writev: evidence of a thread doing client I/O.
    pub const CLIENT_RW: u16 = 1 << 6;
    pub const EXIT: u16 = 1 << 7;
    pub const ACCEPT: u16 = 1 << 8;
    pub const OPEN: u16 = 1 << 9;
    pub const WAIT_CHILD: u16 = 1 << 10;
    /// Calls by which a child shows what it writes.
    pub const WRITES: u16 = 1 << 11;
    pub const RECV: u16 = 1 << 12;
    pub const SEND: u16 = 1 << 13;
    /// select/poll: the event loop of a process that never waits in epoll.
    pub const POLL: u16 = 1 << 14;
    /// Serves no client and touches no file (memory management, futex, time and identity
    /// queries): the process's own housekeeping, which a main-thread gap runs through.
    pub const QUIET: u16 = 1 << 15;

    #[inline]
    pub fn has(self, bits: u16) -> bool {
        self.0 & bits != 0
    }
    /// A wait of some thread (idle in the event loop, or in a background thread).
    #[inline]
    pub fn is_wait(self) -> bool {
        self.has(Self::ALWAYS_IDLE | Self::BG_WAIT)
    }
}

/// Which arguments a parser or decoder takes from a call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ArgKind {
    /// The path is the first argument (open, unlink, stat...).
    Path0,
    /// The path follows a dirfd (openat, unlinkat, newfstatat...).
    Path1,
    Rename,
    RenameAt,
    Pipe,
    Socketpair,
    Dup2,
    Fcntl,
    CloseRange,
    /// clone: CLONE_THREAD is in the flags of the first argument.
    Clone,
    /// clone3: the flags are in the struct the first argument points to.
    Clone3,
    /// fork, vfork: a new process, never a thread.
    Fork,
    Socket,
    /// futex: a wait on a contended lock (`FUTEX_WAIT*`, value 2).
    Futex,
    /// connect: the peer's address (`{sa_family=AF_INET, sin_port=htons(6380), ...}`).
    Connect,
    /// A buffer argument after the fd (read, write, sendto...).
    Data,
    /// restart_syscall: strace names the call it continues.
    Restart,
    Nothing,
}

/// Which way a call's buffer argument carries data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DataArg {
    None,
    /// Filled by the kernel: only what the call returned is valid.
    In,
    /// Written by the process: valid whatever the outcome.
    Out,
}

/// What a call does to the process's fd table, by kind (the values come from the call:
/// `fd_effect`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FdKind {
    None,
    /// Returns an fd for a path (open, openat, creat, openat2).
    Open,
    /// Returns an fd of a kind known from the call (`NewFd`).
    New(NewFd),
    Pipe,
    Socketpair,
    Dup,
    /// A dup only with F_DUPFD.
    Fcntl,
    Listen,
    Connect,
    Close,
    CloseRange,
    Clone,
}

/// The kind of fd a call returns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NewFd {
    /// socket(): not yet a client, a listener or a replica link.
    Socket,
    /// accept(): a client connection.
    Accepted,
    Epoll,
    /// eventfd, timerfd, signalfd, memfd, inotify.
    Other,
}

/// What an fd first seen in a call (opened before the trace) is, known by that call alone.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FdUse {
    None,
    Listener,
    Epoll,
    /// A file on disk (fsynced, seeked, truncated).
    File,
}

/// What a main thread blocked in a call is doing, where a finding names the cause by the
/// call alone.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Blocking {
    Other,
    /// It sleeps (nanosleep, pause): a command that sleeps.
    Sleep,
    /// It waits for an fd or a signal outside the event loop (poll, select, sigtimedwait).
    SyncWait,
    /// It makes a process or a thread (a fork copies the page tables).
    Spawn,
}

/// One syscall's entry.
#[derive(PartialEq, Eq)]
pub struct SysInfo {
    pub name: &'static str,
    pub facts: Facts,
    pub args: ArgKind,
    pub fd: FdKind,
    /// The first argument is an fd.
    pub fd_first: bool,
    pub data: DataArg,
    /// What the fd of the first argument is, by this call alone.
    pub fd_use: FdUse,
    /// Puts bytes into its fd (content sniffing reads them as written, not read).
    pub puts: bool,
    pub blocking: Blocking,
}

impl std::fmt::Debug for SysInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SysInfo({})", self.name)
    }
}

impl SysInfo {
    const fn new(name: &'static str) -> Self {
        SysInfo {
            name,
            facts: Facts(0),
            args: ArgKind::Nothing,
            fd: FdKind::None,
            fd_first: false,
            data: DataArg::None,
            fd_use: FdUse::None,
            puts: false,
            blocking: Blocking::Other,
        }
    }
    const fn facts(mut self, bits: u16) -> Self {
        self.facts = Facts(bits);
        self
    }
    const fn args(mut self, a: ArgKind) -> Self {
        self.args = a;
        self
    }
    const fn fd(mut self, k: FdKind) -> Self {
        self.fd = k;
        self
    }
    /// The first argument is an fd.
    const fn on_fd(mut self) -> Self {
        self.fd_first = true;
        self
    }
    const fn data(mut self, d: DataArg) -> Self {
        self.data = d;
        self.args = ArgKind::Data;
        self
    }
    const fn used_as(mut self, u: FdUse) -> Self {
        self.fd_use = u;
        self
    }
    const fn puts(mut self) -> Self {
        self.puts = true;
        self
    }
    const fn blocking(mut self, b: Blocking) -> Self {
        self.blocking = b;
        self
    }
    /// Whether the call has a buffer argument.
    #[inline]
    pub fn data_arg(&self) -> bool {
        self.data != DataArg::None
    }
}

use ArgKind as A;
use Blocking as B;
use Facts as F;
use FdKind as K;

/// Entry of every name not in the table.
pub static UNKNOWN: SysInfo = SysInfo::new("");

static TABLE: &[SysInfo] = &[
    // Reads and writes.
    SysInfo::new("read")
        .on_fd()
        .data(DataArg::In)
        .facts(F::READ | F::CLIENT_RW | F::RECV),
    SysInfo::new("write")
        .on_fd()
        .data(DataArg::Out)
        .puts()
        .facts(F::CLIENT_RW | F::WRITES | F::SEND),
    SysInfo::new("pread64").on_fd().data(DataArg::In),
    SysInfo::new("pwrite64")
        .on_fd()
        .data(DataArg::Out)
        .puts()
        .facts(F::WRITES),
    SysInfo::new("readv").on_fd().facts(F::RECV),
    SysInfo::new("writev")
        .on_fd()
        .puts()
        .facts(F::CLIENT_RW | F::WRITES | F::SEND),
    SysInfo::new("preadv").on_fd(),
    SysInfo::new("pwritev").on_fd(),
    SysInfo::new("preadv2").on_fd(),
    SysInfo::new("pwritev2").on_fd(),
    SysInfo::new("sendto")
        .on_fd()
        .data(DataArg::Out)
        .puts()
        .facts(F::SEND),
    SysInfo::new("recvfrom")
        .on_fd()
        .data(DataArg::In)
        .facts(F::RECV),
    SysInfo::new("sendmsg").on_fd().facts(F::SEND),
    SysInfo::new("recvmsg").on_fd().facts(F::RECV),
    SysInfo::new("sendmmsg").on_fd(),
    SysInfo::new("recvmmsg").on_fd(),
    SysInfo::new("sendfile").on_fd(),
    SysInfo::new("splice").on_fd(),
    SysInfo::new("copy_file_range").on_fd(),
    // Pushing data to disk.
    SysInfo::new("fdatasync")
        .on_fd()
        .used_as(FdUse::File)
        .facts(F::FSYNC | F::WRITES),
    SysInfo::new("fsync")
        .on_fd()
        .used_as(FdUse::File)
        .facts(F::FSYNC | F::WRITES),
    SysInfo::new("sync_file_range").on_fd().used_as(FdUse::File),
    SysInfo::new("syncfs").on_fd(),
    SysInfo::new("sync"),
    SysInfo::new("msync"),
    SysInfo::new("ftruncate").on_fd().used_as(FdUse::File),
    SysInfo::new("fallocate").on_fd(),
    SysInfo::new("fadvise64").on_fd(),
    SysInfo::new("lseek").on_fd().used_as(FdUse::File),
    SysInfo::new("_llseek").on_fd(),
    // Opening, naming, closing.
    SysInfo::new("open")
        .args(A::Path0)
        .fd(K::Open)
        .facts(F::OPEN),
    SysInfo::new("creat")
        .args(A::Path0)
        .fd(K::Open)
        .facts(F::OPEN),
    SysInfo::new("openat")
        .on_fd()
        .args(A::Path1)
        .fd(K::Open)
        .facts(F::OPEN),
    SysInfo::new("openat2")
        .on_fd()
        .args(A::Path1)
        .fd(K::Open)
        .facts(F::OPEN),
    SysInfo::new("close").on_fd().fd(K::Close).facts(F::CLOSE),
    SysInfo::new("close_range")
        .args(A::CloseRange)
        .fd(K::CloseRange),
    SysInfo::new("dup").on_fd().fd(K::Dup),
    SysInfo::new("dup2").on_fd().args(A::Dup2).fd(K::Dup),
    SysInfo::new("dup3").on_fd().args(A::Dup2).fd(K::Dup),
    SysInfo::new("fcntl").on_fd().args(A::Fcntl).fd(K::Fcntl),
    SysInfo::new("fcntl64").on_fd().args(A::Fcntl).fd(K::Fcntl),
    SysInfo::new("pipe").args(A::Pipe).fd(K::Pipe),
    SysInfo::new("pipe2").args(A::Pipe).fd(K::Pipe),
    SysInfo::new("unlink").args(A::Path0),
    SysInfo::new("unlinkat").on_fd().args(A::Path1),
    SysInfo::new("rename").args(A::Rename).facts(F::WRITES),
    SysInfo::new("renameat")
        .on_fd()
        .args(A::RenameAt)
        .facts(F::WRITES),
    SysInfo::new("renameat2").on_fd().args(A::RenameAt),
    SysInfo::new("stat").args(A::Path0),
    SysInfo::new("lstat").args(A::Path0),
    SysInfo::new("access").args(A::Path0),
    SysInfo::new("mkdir").args(A::Path0),
    SysInfo::new("rmdir").args(A::Path0),
    SysInfo::new("truncate").args(A::Path0),
    SysInfo::new("chdir").args(A::Path0),
    SysInfo::new("readlink").args(A::Path0),
    SysInfo::new("newfstatat").on_fd().args(A::Path1),
    SysInfo::new("statx").on_fd().args(A::Path1),
    SysInfo::new("mkdirat").on_fd().args(A::Path1),
    SysInfo::new("faccessat").on_fd().args(A::Path1),
    SysInfo::new("faccessat2").on_fd().args(A::Path1),
    SysInfo::new("readlinkat").on_fd().args(A::Path1),
    SysInfo::new("fstat").on_fd(),
    SysInfo::new("fstat64").on_fd(),
    SysInfo::new("fstatfs").on_fd(),
    SysInfo::new("getdents64").on_fd(),
    SysInfo::new("getdents").on_fd(),
    SysInfo::new("ioctl").on_fd(),
    SysInfo::new("flock").on_fd(),
    SysInfo::new("fchmod").on_fd(),
    SysInfo::new("fchown").on_fd(),
    SysInfo::new("fchdir").on_fd(),
    SysInfo::new("fgetxattr").on_fd(),
    SysInfo::new("fsetxattr").on_fd(),
    SysInfo::new("getcwd"),
    SysInfo::new("umask"),
    // Sockets.
    SysInfo::new("socket")
        .args(A::Socket)
        .fd(K::New(NewFd::Socket)),
    SysInfo::new("socketpair")
        .args(A::Socketpair)
        .fd(K::Socketpair),
    SysInfo::new("accept")
        .on_fd()
        .used_as(FdUse::Listener)
        .fd(K::New(NewFd::Accepted))
        .facts(F::ACCEPT),
    SysInfo::new("accept4")
        .on_fd()
        .used_as(FdUse::Listener)
        .fd(K::New(NewFd::Accepted))
        .facts(F::ACCEPT),
    SysInfo::new("listen")
        .on_fd()
        .used_as(FdUse::Listener)
        .fd(K::Listen),
    SysInfo::new("connect")
        .on_fd()
        .fd(K::Connect)
        .args(A::Connect),
    SysInfo::new("bind").on_fd(),
    SysInfo::new("shutdown").on_fd(),
    SysInfo::new("setsockopt").on_fd(),
    SysInfo::new("getsockopt").on_fd(),
    SysInfo::new("getpeername").on_fd().facts(F::QUIET),
    SysInfo::new("getsockname").on_fd().facts(F::QUIET),
    // Other fds.
    SysInfo::new("epoll_create").fd(K::New(NewFd::Epoll)),
    SysInfo::new("epoll_create1").fd(K::New(NewFd::Epoll)),
    SysInfo::new("epoll_ctl").on_fd().used_as(FdUse::Epoll),
    SysInfo::new("eventfd").fd(K::New(NewFd::Other)),
    SysInfo::new("eventfd2").fd(K::New(NewFd::Other)),
    SysInfo::new("timerfd_create").fd(K::New(NewFd::Other)),
    SysInfo::new("signalfd4").fd(K::New(NewFd::Other)),
    SysInfo::new("memfd_create").fd(K::New(NewFd::Other)),
    SysInfo::new("inotify_init1").fd(K::New(NewFd::Other)),
    // Waits.
    SysInfo::new("epoll_wait")
        .on_fd()
        .used_as(FdUse::Epoll)
        .facts(F::ALWAYS_IDLE | F::EPOLL),
    SysInfo::new("epoll_pwait")
        .on_fd()
        .used_as(FdUse::Epoll)
        .facts(F::ALWAYS_IDLE | F::EPOLL),
    SysInfo::new("epoll_pwait2")
        .on_fd()
        .used_as(FdUse::Epoll)
        .facts(F::ALWAYS_IDLE | F::EPOLL),
    // A continuation of a timed wait interrupted before tracing began.
    SysInfo::new("restart_syscall")
        .args(A::Restart)
        .facts(F::ALWAYS_IDLE),
    // In a background thread these wait for work; redis's main thread never sleeps or
    // polls while idle (its loop waits in epoll), so there they hold every client.
    SysInfo::new("poll")
        .facts(F::BG_WAIT | F::POLL)
        .blocking(B::SyncWait),
    SysInfo::new("ppoll")
        .facts(F::BG_WAIT | F::POLL)
        .blocking(B::SyncWait),
    SysInfo::new("select")
        .facts(F::BG_WAIT | F::POLL)
        .blocking(B::SyncWait),
    SysInfo::new("pselect6")
        .facts(F::BG_WAIT | F::POLL)
        .blocking(B::SyncWait),
    SysInfo::new("nanosleep")
        .facts(F::BG_WAIT)
        .blocking(B::Sleep),
    SysInfo::new("clock_nanosleep")
        .facts(F::BG_WAIT)
        .blocking(B::Sleep),
    SysInfo::new("pause").facts(F::BG_WAIT).blocking(B::Sleep),
    SysInfo::new("rt_sigtimedwait")
        .facts(F::BG_WAIT)
        .blocking(B::SyncWait),
    SysInfo::new("rt_sigsuspend")
        .facts(F::BG_WAIT)
        .blocking(B::SyncWait),
    SysInfo::new("futex")
        .facts(F::BG_WAIT | F::QUIET)
        .args(A::Futex),
    SysInfo::new("wait4").facts(F::BG_WAIT | F::WAIT_CHILD),
    SysInfo::new("waitid").facts(F::BG_WAIT | F::WAIT_CHILD),
    SysInfo::new("sched_yield").facts(F::QUIET),
    // Processes and threads.
    SysInfo::new("clone")
        .args(A::Clone)
        .fd(K::Clone)
        .blocking(B::Spawn),
    SysInfo::new("clone2").args(A::Clone),
    SysInfo::new("clone3")
        .args(A::Clone3)
        .fd(K::Clone)
        .blocking(B::Spawn),
    SysInfo::new("fork")
        .args(A::Fork)
        .fd(K::Clone)
        .blocking(B::Spawn),
    SysInfo::new("vfork")
        .args(A::Fork)
        .fd(K::Clone)
        .blocking(B::Spawn),
    SysInfo::new("execve"),
    SysInfo::new("exit").facts(F::ALWAYS_IDLE | F::EXIT),
    SysInfo::new("exit_group").facts(F::ALWAYS_IDLE | F::EXIT),
    SysInfo::new("kill"),
    SysInfo::new("tgkill"),
    SysInfo::new("getpid").facts(F::QUIET),
    SysInfo::new("gettid").facts(F::QUIET),
    SysInfo::new("getuid").facts(F::QUIET),
    SysInfo::new("prctl"),
    SysInfo::new("arch_prctl"),
    SysInfo::new("set_tid_address"),
    SysInfo::new("set_robust_list"),
    SysInfo::new("rseq"),
    SysInfo::new("prlimit64"),
    SysInfo::new("getrusage").facts(F::QUIET),
    SysInfo::new("sysinfo").facts(F::QUIET),
    SysInfo::new("uname"),
    SysInfo::new("getrandom").facts(F::QUIET),
    SysInfo::new("rt_sigaction"),
    SysInfo::new("rt_sigprocmask").facts(F::QUIET),
    SysInfo::new("rt_sigreturn"),
    // Memory.
    SysInfo::new("mmap").facts(F::QUIET),
    SysInfo::new("munmap").facts(F::QUIET),
    SysInfo::new("mremap").facts(F::QUIET),
    SysInfo::new("madvise").facts(F::QUIET),
    SysInfo::new("mprotect").facts(F::QUIET),
    SysInfo::new("brk").facts(F::QUIET),
    // Time (usually answered in the vDSO, seen when it is not).
    SysInfo::new("clock_gettime").facts(F::QUIET),
    SysInfo::new("gettimeofday").facts(F::QUIET),
    SysInfo::new("time").facts(F::QUIET),
];

/// Names that are not syscalls but are interned as well: signals and errnos.
pub(crate) const OTHER_NAMES: &[&str] = &[
    "SIGCHLD",
    "SIGTERM",
    "SIGINT",
    "SIGKILL",
    "SIGPIPE",
    "SIGSEGV",
    "SIGUSR1",
    "SIGUSR2",
    "SIGHUP",
    "SIGALRM",
    "SIGSTOP",
    "SIGCONT",
    "SIGWINCH",
    "SIGQUIT",
    "SIGABRT",
    "SIGBUS",
    "SIGSYS",
    "SIGTRAP",
    "SIGURG",
    "SIGPROF",
    "SIGVTALRM",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGIO",
    "EAGAIN",
    "ENOENT",
    "EINTR",
    "EBADF",
    "EINVAL",
    "EEXIST",
    "EPIPE",
    "ECONNRESET",
    "ETIMEDOUT",
    "ECHILD",
    "ENOTCONN",
    "EINPROGRESS",
    "ERESTARTSYS",
    "ERESTARTNOINTR",
    "ERESTARTNOHAND",
    "ERESTART_RESTARTBLOCK",
    "EACCES",
    "EPERM",
    "ENOSYS",
    "ENOTTY",
    "ESPIPE",
    "ENOSPC",
    "EIO",
    "EFAULT",
    "ENOMEM",
    "EBUSY",
    "ESRCH",
    "ENOTDIR",
    "EISDIR",
    "EXDEV",
    "ERANGE",
    "ENXIO",
    "EOPNOTSUPP",
    "ECONNREFUSED",
    "EADDRINUSE",
    "ENODATA",
];

/// Every syscall name of the table.
pub(crate) fn names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|s| s.name)
}

/// The entry's position in the table (None for `UNKNOWN`): per-syscall state of the
/// analyzer's hot path lives in a `Vec` indexed by it instead of a map keyed by name.
#[inline]
pub(crate) fn index_of(sys: &'static SysInfo) -> Option<usize> {
    let off = (sys as *const SysInfo as usize).wrapping_sub(TABLE.as_ptr() as usize);
    let i = off / std::mem::size_of::<SysInfo>();
    (i < TABLE.len()).then_some(i)
}

/// The entry of a syscall name (`UNKNOWN` for names not in the table). A hash lookup:
/// callers on the hot path keep the result (the parsers' name caches, `Syscall::sys`).
pub fn info(name: &str) -> &'static SysInfo {
    static INDEX: std::sync::OnceLock<rustc_hash::FxHashMap<&'static str, &'static SysInfo>> =
        std::sync::OnceLock::new();
    INDEX
        .get_or_init(|| TABLE.iter().map(|s| (s.name, s)).collect())
        .get(name)
        .copied()
        .unwrap_or(&UNKNOWN)
}

/// What one call did to its process's fd table, decoded once from the call and its
/// result: the fd table and the recorder's fd map both follow these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdEffect<'a> {
    None,
    /// A new fd for a path (the `-y` path of the result, else the path argument).
    Open {
        fd: i32,
        path: Option<&'a str>,
    },
    /// A new fd of a kind known from the call (`-y` path of the result, if any).
    New {
        fd: i32,
        kind: NewFd,
        path: Option<&'a str>,
    },
    /// Two new fds (pipe, socketpair).
    Pair {
        a: i32,
        b: i32,
        socket: bool,
    },
    /// `dst` is now a copy of `src`.
    Dup {
        src: i32,
        dst: i32,
    },
    /// The fd was closed (the kernel frees the number at the start of close()).
    Close(i32),
    CloseRange(u32, u32),
    Listen(i32),
    Connect(i32),
    /// A new thread or process.
    Clone {
        child: Tid,
        thread: bool,
    },
}

/// The fd effect of a finished call.
#[inline]
pub fn fd_effect(sc: &Syscall) -> FdEffect<'_> {
    let ret = sc.ret.val();
    match sc.sys.fd {
        FdKind::None => FdEffect::None,
        FdKind::Open => match ret {
            Some(fd) => FdEffect::Open {
                fd: fd as i32,
                path: sc.ret_path.as_deref().or(sc.path()),
            },
            None => FdEffect::None,
        },
        FdKind::New(kind) => match ret {
            Some(fd) => FdEffect::New {
                fd: fd as i32,
                kind,
                path: sc.ret_path.as_deref(),
            },
            None => FdEffect::None,
        },
        FdKind::Pipe | FdKind::Socketpair => match (&sc.extra, ret) {
            (Extra::FdPair(a, b), Some(_)) => FdEffect::Pair {
                a: *a,
                b: *b,
                socket: sc.sys.fd == FdKind::Socketpair,
            },
            _ => FdEffect::None,
        },
        FdKind::Dup | FdKind::Fcntl => {
            let is_dup = sc.sys.fd == FdKind::Dup || matches!(sc.extra, Extra::DupFd);
            match (is_dup, ret, sc.fd) {
                (true, Some(dst), Some(src)) => FdEffect::Dup {
                    src,
                    dst: dst as i32,
                },
                _ => FdEffect::None,
            }
        }
        FdKind::Listen => sc.fd.map_or(FdEffect::None, FdEffect::Listen),
        FdKind::Connect => sc.fd.map_or(FdEffect::None, FdEffect::Connect),
        FdKind::Close => sc.fd.map_or(FdEffect::None, FdEffect::Close),
        FdKind::CloseRange => match sc.extra {
            Extra::CloseRange(lo, hi) => FdEffect::CloseRange(lo, hi),
            _ => FdEffect::None,
        },
        FdKind::Clone => match (ret, &sc.extra) {
            (Some(child), Extra::Clone { thread }) if child > 0 => FdEffect::Clone {
                child: child as Tid,
                thread: *thread,
            },
            _ => FdEffect::None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Ret;

    #[test]
    fn every_name_once_and_lookups_find_them() {
        let mut seen = std::collections::HashSet::new();
        for s in TABLE {
            assert!(seen.insert(s.name), "{} twice", s.name);
            assert!(std::ptr::eq(info(s.name), s));
            // A buffer argument follows an fd.
            assert!(!s.data_arg() || s.fd_first, "{}", s.name);
        }
        assert!(std::ptr::eq(info("no_such_call"), &UNKNOWN));
    }

    /// openat2 and epoll_pwait2 are what openat and epoll_pwait are, everywhere.
    #[test]
    fn the_newer_variants_match_their_elders() {
        for (new, old) in [("openat2", "openat"), ("epoll_pwait2", "epoll_pwait")] {
            let (n, o) = (info(new), info(old));
            assert_eq!(
                (n.facts, n.args, n.fd, n.fd_first, n.fd_use),
                (o.facts, o.args, o.fd, o.fd_first, o.fd_use),
                "{new}"
            );
        }
    }

    /// The calls a finding reads by what they do (`Blocking`), and how a live decoder finds
    /// the clone flags (`ArgKind`).
    #[test]
    fn calls_by_what_they_do() {
        let of = |b: Blocking| -> Vec<&str> {
            let mut v: Vec<_> = TABLE
                .iter()
                .filter(|s| s.blocking == b)
                .map(|s| s.name)
                .collect();
            v.sort_unstable();
            v
        };
        assert_eq!(
            of(Blocking::Sleep),
            ["clock_nanosleep", "nanosleep", "pause"]
        );
        assert_eq!(
            of(Blocking::SyncWait),
            [
                "poll",
                "ppoll",
                "pselect6",
                "rt_sigsuspend",
                "rt_sigtimedwait",
                "select"
            ]
        );
        assert_eq!(of(Blocking::Spawn), ["clone", "clone3", "fork", "vfork"]);
        for s in TABLE {
            // A spawn is a clone of some shape, and the fd table follows it.
            if s.blocking == Blocking::Spawn {
                assert!(
                    matches!(s.args, A::Clone | A::Clone3 | A::Fork),
                    "{}",
                    s.name
                );
                assert_eq!(s.fd, K::Clone, "{}", s.name);
            }
        }
        // The buffers the bpf programs copy, by who fills them.
        let data = |d: DataArg| -> Vec<&str> {
            let mut v: Vec<_> = TABLE
                .iter()
                .filter(|s| s.data == d)
                .map(|s| s.name)
                .collect();
            v.sort_unstable();
            v
        };
        assert_eq!(data(DataArg::In), ["pread64", "read", "recvfrom"]);
        assert_eq!(data(DataArg::Out), ["pwrite64", "sendto", "write"]);
        assert_eq!(info("clone3").args, A::Clone3);
        assert_eq!((info("fork").args, info("vfork").args), (A::Fork, A::Fork));
    }

    #[test]
    fn fd_effects_from_calls() {
        let mut sc = Syscall::new("openat2");
        sc.ret = Ret::Val(9);
        sc.extra = Extra::Path("/data/appendonly.aof".into());
        assert_eq!(
            fd_effect(&sc),
            FdEffect::Open {
                fd: 9,
                path: Some("/data/appendonly.aof")
            }
        );
        let mut sc = Syscall::new("fcntl");
        sc.fd = Some(3);
        sc.ret = Ret::Val(10);
        assert_eq!(fd_effect(&sc), FdEffect::None);
        sc.extra = Extra::DupFd;
        assert_eq!(fd_effect(&sc), FdEffect::Dup { src: 3, dst: 10 });
        let mut sc = Syscall::new("clone3");
        sc.ret = Ret::Val(77);
        sc.extra = Extra::Clone { thread: true };
        assert_eq!(
            fd_effect(&sc),
            FdEffect::Clone {
                child: 77,
                thread: true
            }
        );
        let mut sc = Syscall::new("close");
        sc.fd = Some(5);
        sc.ret = Ret::Err("EBADF");
        assert_eq!(fd_effect(&sc), FdEffect::Close(5));
    }
}
