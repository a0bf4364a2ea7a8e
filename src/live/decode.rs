//! Live decoders: a call's number, raw arguments (six registers, from ptrace, a perf
//! raw_syscalls record or a bpf record) and result -> the `Syscall` the analysis reads
//! (`call`), by the argument shape the syscall table gives its name, reading the tracee's
//! memory for paths and buffers. Shared by the live backends, so none imports from another.

use super::sysnames::{errno_name, syscall_name};
use crate::event::{Data, DurSource, Extra, Nanos, Ret, Syscall, Tid, DATA_CAP};
use crate::syscalls::{ArgKind, DataArg, FdKind, SysInfo};
use rustc_hash::FxHashMap;

/// Per syscall number: its name, its table entry and whether its arguments need more than
/// the fd (`decodes_more`).
#[derive(Clone, Copy)]
pub(super) struct NrInfo {
    pub name: &'static str,
    pub sys: &'static SysInfo,
    pub decode: bool,
}

/// Numbers below this are looked up once per process (every architecture's are).
const NR_CACHED: usize = 1024;

/// `NrInfo` of syscall `nr`. Looked up once per number: per record, the name's map and the
/// table's string-hashed index were a visible part of the tracer's CPU.
#[inline]
pub(super) fn nr_info(nr: i64) -> NrInfo {
    static SEEN: [std::sync::OnceLock<NrInfo>; NR_CACHED] =
        [const { std::sync::OnceLock::new() }; NR_CACHED];
    let make = || {
        let name = syscall_name(nr);
        let sys = crate::syscalls::info(name);
        NrInfo {
            name,
            sys,
            decode: decodes_more(sys),
        }
    };
    match usize::try_from(nr).ok().and_then(|i| SEEN.get(i)) {
        Some(c) => *c.get_or_init(make),
        None => make(),
    }
}

/// Whether a raw syscall result is an error: the kernel's own rule (`IS_ERR_VALUE`, what
/// ptrace's `is_error` says), -4095..-1 being -errno.
#[inline]
pub(super) fn is_errno(r: i64) -> bool {
    (-4095..0).contains(&r)
}

/// The `Ret` of a raw result (`None`: the call did not return).
#[inline]
pub(super) fn ret_of(r: Option<i64>) -> Ret {
    match r {
        Some(r) if is_errno(r) => Ret::Err(errno_name(-r)),
        Some(r) => Ret::Val(r),
        None => Ret::Unknown,
    }
}

/// What a backend knows of a call's arguments, and when it can read the tracee's memory.
pub(super) enum Args<'a> {
    /// Not known: a call already running at the attach, whose entry no backend saw.
    Unknown,
    /// Read after the call, when its record is processed (perf, bpf): the fd, and what
    /// `decodes_more` names, from process `tgid`'s memory (racy, see `open_name`);
    /// `forked` says which tasks the kernel reported new are threads.
    Late {
        args: &'a [u64; 6],
        tgid: Tid,
        forked: &'a FxHashMap<Tid, bool>,
    },
    /// Read while thread `tid` is stopped at the call's exit (ptrace): everything, the
    /// first bytes of read and write buffers included.
    Stopped { args: &'a [u64; 6], tid: Tid },
}

/// Fills `sc` (made by `Syscall::with` from `nr_info`) as every backend does: its result
/// (`ret`, None if it did not return), its duration (`dur`, measured), and what its
/// arguments say (`args`). The file an `open` returned and whether a clone made a thread
/// are taken only from a call that succeeded.
#[inline]
pub(super) fn call(sc: &mut Syscall, info: &NrInfo, ret: Option<i64>, dur: Nanos, args: Args<'_>) {
    sc.ret = ret_of(ret);
    sc.dur = Some(dur.max(0));
    sc.dur_src = DurSource::Measured;
    let ok = sc.ret.val();
    match args {
        Args::Unknown => {}
        Args::Late { args, tgid, forked } if info.decode => {
            decode_args(tgid, sc, args, ok, false);
            match (info.sys.fd, ok) {
                // Read late: the fd may name another file by now (see open_name).
                (FdKind::Open, Some(fd)) if fd >= 0 => sc.ret_path = open_name(tgid, sc, fd),
                (FdKind::Clone, Some(child)) if child > 0 => {
                    if let Some(thread) = forked.get(&(child as Tid)) {
                        sc.extra = Extra::Clone { thread: *thread };
                    }
                }
                _ => {}
            }
        }
        Args::Late { args, .. } => {
            if info.sys.fd_first {
                let fd = args[0] as i64;
                if (0..=i32::MAX as i64).contains(&fd) {
                    sc.fd = Some(fd as i32);
                }
            }
        }
        Args::Stopped { args, tid } => {
            decode_args(tid, sc, args, ok, true);
            if let (FdKind::Open, Some(fd)) = (info.sys.fd, ok) {
                if fd >= 0 {
                    // The thread is stopped at the exit: the fd's link is the file it just
                    // opened.
                    sc.ret_path = open_name(tid, sc, fd);
                }
            }
        }
    }
}

/// Reads up to `buf.len()` bytes of the tracee's memory at `addr`.
fn read_mem(tid: Tid, addr: u64, buf: &mut [u8]) -> usize {
    if addr == 0 || buf.is_empty() {
        return 0;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let n = unsafe { libc::process_vm_readv(tid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        0
    } else {
        n as usize
    }
}

/// A NUL-terminated string of the tracee, read a page piece at a time (a read crossing
/// into an unmapped page would fail whole).
fn read_cstr(tid: Tid, addr: u64) -> Option<Box<str>> {
    if addr == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut at = addr;
    let mut chunk = [0u8; 4096];
    while out.len() < 4096 {
        let to_page_end = 4096 - (at % 4096) as usize;
        let n = read_mem(tid, at, &mut chunk[..to_page_end]);
        if n == 0 {
            break;
        }
        if let Some(z) = chunk[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&chunk[..z]);
            return Some(String::from_utf8_lossy(&out).into_owned().into_boxed_str());
        }
        out.extend_from_slice(&chunk[..n]);
        at += n as u64;
    }
    if out.is_empty() {
        None
    } else {
        Some(String::from_utf8_lossy(&out).into_owned().into_boxed_str())
    }
}

const AT_FDCWD: i64 = -100;

/// Fills fd, path, data and the other `Extra`s from raw arguments. `ret`: the result when
/// the call succeeded (read-like buffers are only valid then). `data`: read the first bytes
/// of read/write buffers (only meaningful while the thread is still stopped at the exit).
fn decode_args(tid: Tid, sc: &mut Syscall, a: &[u64; 6], ret: Option<i64>, data: bool) {
    let sys = sc.sys;
    if sys.fd_first {
        let fd = a[0] as i64 as i32;
        if fd >= 0 && (a[0] as i64) != AT_FDCWD {
            sc.fd = Some(fd);
        }
    }
    match sys.args {
        ArgKind::Path0 => {
            if let Some(p) = read_cstr(tid, a[0]) {
                sc.extra = Extra::Path(p);
            }
        }
        ArgKind::Path1 => {
            if let Some(p) = read_cstr(tid, a[1]) {
                if !p.is_empty() {
                    sc.extra = Extra::Path(p);
                }
            }
        }
        ArgKind::Rename => {
            if let (Some(o), Some(n)) = (read_cstr(tid, a[0]), read_cstr(tid, a[1])) {
                sc.extra = Extra::Rename(o, n);
            }
        }
        ArgKind::RenameAt => {
            if let (Some(o), Some(n)) = (read_cstr(tid, a[1]), read_cstr(tid, a[3])) {
                sc.extra = Extra::Rename(o, n);
            }
        }
        ArgKind::Pipe | ArgKind::Socketpair if ret.is_some() => {
            let addr = if sys.args == ArgKind::Socketpair {
                a[3]
            } else {
                a[0]
            };
            let mut b = [0u8; 8];
            if read_mem(tid, addr, &mut b) == 8 {
                let x = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                let y = i32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
                sc.extra = Extra::FdPair(x, y);
            }
        }
        ArgKind::Dup2 => sc.extra = Extra::NewFd(a[1] as i64 as i32),
        // fcntl64 (32-bit) takes the same commands.
        ArgKind::Fcntl if a[1] as i32 == libc::F_DUPFD || a[1] as i32 == libc::F_DUPFD_CLOEXEC => {
            sc.extra = Extra::DupFd;
        }
        ArgKind::CloseRange => {
            sc.extra = Extra::CloseRange(a[0] as u32, a[1].min(u32::MAX as u64) as u32)
        }
        ArgKind::Clone => {
            sc.extra = Extra::Clone {
                thread: a[0] & libc::CLONE_THREAD as u64 != 0,
            }
        }
        ArgKind::Clone3 => {
            // `struct clone_args` begins with the flags.
            let mut b = [0u8; 8];
            let thread = read_mem(tid, a[0], &mut b) == 8
                && u64::from_ne_bytes(b) & libc::CLONE_THREAD as u64 != 0;
            sc.extra = Extra::Clone { thread };
        }
        ArgKind::Fork => sc.extra = Extra::Clone { thread: false },
        ArgKind::Socket => {
            sc.extra = Extra::Socket(match a[0] as i32 {
                libc::AF_INET => "AF_INET",
                libc::AF_INET6 => "AF_INET6",
                libc::AF_UNIX => "AF_UNIX",
                libc::AF_NETLINK => "AF_NETLINK",
                _ => "AF_UNSPEC",
            })
        }
        ArgKind::Data if data => {
            // Writes: the buffer holds the data whatever the outcome; reads: only what the
            // call returned.
            let avail = match (sys.data, ret) {
                (DataArg::In, Some(n)) if n > 0 => n as usize,
                (DataArg::In, _) => 0,
                _ => a[2] as usize,
            };
            let want = avail.min(DATA_CAP);
            if want > 0 {
                let mut b = [0u8; DATA_CAP];
                let n = read_mem(tid, a[1], &mut b[..want]);
                if n > 0 {
                    sc.extra = Extra::Data(Data::new(&b[..n], avail > n));
                }
            }
        }
        _ => {}
    }
}

/// Whether `decode_args` has anything to take for this call other than its fd and buffer
/// (paths, fd pairs, dup targets, clone flags): the perf backend decodes only those.
pub(super) fn decodes_more(sys: &SysInfo) -> bool {
    !matches!(
        sys.args,
        // A connect's peer address is read from strace's text only.
        ArgKind::Data | ArgKind::Restart | ArgKind::Nothing | ArgKind::Connect | ArgKind::Futex
    )
}

/// The name of the file an `open`-like call returned as `fd`, which the live fd table binds
/// and the recording writes alike (`Syscall::ret_path`), or None when nothing names it.
///
/// `/proc/PID/fd/N` is what strace -y shows, but the perf and bpf backends read it when
/// they process the call's exit, which on a loaded machine comes well after the call: by
/// then fd N may have been closed and taken by another file (redis opens /proc/self/stat
/// every 100 ms on the lowest free fd and closes it at once; the next accepted client gets
/// that number). So the link is only taken when it fits the call: an open yields a file
/// named by a path (never a socket, pipe or anon inode) whose last component is the one
/// opened. Otherwise the path the call opened names the fd, made absolute against the
/// directory it was opened in, as strace -y would print it.
pub(super) fn open_name(tgid: Tid, sc: &Syscall, fd: i64) -> Option<Box<str>> {
    let link = std::fs::read_link(format!("/proc/{tgid}/fd/{fd}"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    open_name_from(sc, link.as_deref(), |dirfd| {
        let p = match dirfd {
            Some(d) => format!("/proc/{tgid}/fd/{d}"),
            None => format!("/proc/{tgid}/cwd"),
        };
        std::fs::read_link(p)
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    })
}

/// `open_name` given what /proc said: `link` for the returned fd, `dir` for the directory
/// a relative path was opened in (`Some(fd)`: the call's dirfd; `None`: the cwd).
fn open_name_from(
    sc: &Syscall,
    link: Option<&str>,
    dir: impl Fn(Option<i32>) -> Option<String>,
) -> Option<Box<str>> {
    let path = sc.path();
    if let Some(l) = link.filter(|l| link_fits(l, path)) {
        return Some(l.into());
    }
    let p = path?;
    if p.starts_with('/') {
        return Some(p.into());
    }
    match dir(sc.fd).filter(|d| d.starts_with('/')) {
        Some(d) => Some(format!("{}/{}", d.trim_end_matches('/'), p).into()),
        // The directory is gone or not a path: the path as the call gave it.
        None => Some(p.into()),
    }
}

/// Whether a `/proc/PID/fd` link can be the file an open of `path` returned.
fn link_fits(link: &str, path: Option<&str>) -> bool {
    let link = link.strip_suffix(" (deleted)").unwrap_or(link);
    if !link.starts_with('/') {
        // socket:[N], pipe:[N], anon_inode:...: the fd was reused since.
        return false;
    }
    let Some(path) = path else {
        return true;
    };
    let last = |s: &str| -> String {
        s.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string()
    };
    match last(path).as_str() {
        // `.`, `..` or `/`: a directory whose name the path does not say.
        "" | "." | ".." => true,
        name => last(link) == name,
    }
}

/// The call `tid` sleeps in now, from /proc, if it sleeps inside one: what a backend
/// attaching to a thread already blocked learns of that call (the thread cannot be stopped
/// to read its registers). None for a thread on a CPU, or in a tracing stop (which says
/// how it left its call).
pub(super) fn blocked_in_call(tid: Tid) -> Option<(i64, [u64; 6])> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
    if !matches!(state, "D" | "S") {
        return None;
    }
    parse_proc_syscall(&std::fs::read_to_string(format!("/proc/{tid}/syscall")).ok()?)
}

/// `/proc/TID/syscall`: "NR ARG1..ARG6 SP PC" (hex args) while in a call, "-1 SP PC" when
/// blocked outside one, "running" when on a CPU.
fn parse_proc_syscall(s: &str) -> Option<(i64, [u64; 6])> {
    let mut it = s.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let mut args = [0u64; 6];
    for a in &mut args {
        let v = it.next()?;
        *a = u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?;
    }
    Some((nr, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openat(dirfd: Option<i32>, path: &str) -> Syscall {
        let mut sc = Syscall::new("openat");
        sc.fd = dirfd;
        sc.extra = Extra::Path(path.into());
        sc
    }

    fn name(sc: &Syscall, link: Option<&str>) -> Option<String> {
        open_name_from(sc, link, |d| match d {
            None => Some("/data".into()),
            Some(3) => Some("/data/appendonlydir".into()),
            Some(_) => None,
        })
        .map(String::from)
    }

    #[test]
    fn a_link_that_fits_the_open_names_the_fd() {
        let sc = openat(None, "/proc/self/stat");
        assert_eq!(
            name(&sc, Some("/proc/4362/stat")).as_deref(),
            Some("/proc/4362/stat")
        );
        let sc = openat(None, "appendonlydir/appendonly.aof.1.incr.aof");
        let l = "/data/appendonlydir/appendonly.aof.1.incr.aof";
        assert_eq!(name(&sc, Some(l)).as_deref(), Some(l));
        let sc = openat(None, "temp-1.rdb");
        assert_eq!(
            name(&sc, Some("/data/temp-1.rdb (deleted)")).as_deref(),
            Some("/data/temp-1.rdb (deleted)")
        );
        assert_eq!(
            name(&openat(None, "."), Some("/data")).as_deref(),
            Some("/data")
        );
    }

    /// The fd was closed and taken by an accepted client (or another file) before the exit
    /// was processed: the link names that, not what was opened.
    #[test]
    fn a_stale_link_gives_way_to_the_path_opened() {
        let sc = openat(None, "/proc/self/stat");
        for stale in ["socket:[361684]", "pipe:[7]", "/data/redis.log"] {
            assert_eq!(
                name(&sc, Some(stale)).as_deref(),
                Some("/proc/self/stat"),
                "{stale}"
            );
        }
        // Relative: against the cwd, or the dirfd's directory.
        let sc = openat(None, "redis.log");
        assert_eq!(
            name(&sc, Some("socket:[9]")).as_deref(),
            Some("/data/redis.log")
        );
        assert_eq!(name(&sc, None).as_deref(), Some("/data/redis.log"));
        let sc = openat(Some(3), "appendonly.aof.2.incr.aof");
        assert_eq!(
            name(&sc, None).as_deref(),
            Some("/data/appendonlydir/appendonly.aof.2.incr.aof")
        );
        // A dirfd no longer known: the path as given.
        let sc = openat(Some(4), "x.aof");
        assert_eq!(name(&sc, None).as_deref(), Some("x.aof"));
        // No path read: only a link to a path can be the file.
        let mut sc = Syscall::new("openat");
        sc.extra = Extra::None;
        assert_eq!(name(&sc, Some("socket:[1]")), None);
        assert_eq!(name(&sc, Some("/a/b")).as_deref(), Some("/a/b"));
    }

    #[test]
    fn proc_syscall_lines_give_the_call_a_blocked_thread_is_in() {
        // fdatasync(7) as a thread blocked in it shows it (Linux 6.x, x86_64).
        let (nr, args) =
            parse_proc_syscall("75 0x7 0x7ffd5a1c 0x0 0x0 0x0 0x0 0x7ffd5a1bf8 0x7f1c2d3e4f50\n")
                .expect("a call");
        assert_eq!(super::super::sysnames::syscall_name(nr), "fdatasync");
        assert_eq!(args, [7, 0x7ffd5a1c, 0, 0, 0, 0]);
        // Blocked outside any call, on a CPU, or cut short: no call.
        assert_eq!(parse_proc_syscall("-1 0x7ffd5a1bf8 0x7f1c2d3e4f50\n"), None);
        assert_eq!(parse_proc_syscall("running\n"), None);
        assert_eq!(parse_proc_syscall("3 0x8 0x0\n"), None);
        assert_eq!(parse_proc_syscall(""), None);
    }
}
