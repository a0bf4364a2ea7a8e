//! Call arguments: the few the analysis needs (the fd and its `-y` path, a pathname, the
//! two fds of a pipe, a dup target, the first bytes of a buffer) taken from a call's
//! argument text, by the argument shape its name has, decided once per name.

use super::body::annotation;
use crate::event::{self, Data, Extra, Syscall};
use crate::source::scan::{
    is_name_byte, lossy, parse_hex, parse_u64, skip_ws, unescape, Piece, Quoted,
};
use crate::syscalls::{self, ArgKind, SysInfo};
use memchr::memmem;

/// An interned name with its syscall table entry, kept in a `NameCache`: `event::intern`
/// hashes behind a lock and `syscalls::info` hashes again, both too slow per line.
#[derive(Clone, Copy)]
pub struct Name {
    pub name: &'static str,
    pub sys: &'static SysInfo,
}

const NAME_SLOTS: usize = 256;

/// A small direct-mapped cache of `Name`s. The parser owns one for syscall names (no
/// thread-local access per line); free functions share a per-thread one. Names of 4 to 16
/// bytes (nearly all syscall and errno names) are keyed by two words that hold all their
/// bytes, so a hit is a multiply for the slot and three compares; other lengths use a second
/// table, keyed and compared byte-wise.
pub struct NameCache {
    words: Box<[Option<Worded>; NAME_SLOTS]>,
    odd: Box<[Option<Name>; NAME_SLOTS]>,
}

/// A cached name with its key: its length and the two words `name_key` reads from it.
#[derive(Clone, Copy)]
struct Worded {
    key: (u64, u64),
    len: usize,
    name: Name,
}

impl Default for NameCache {
    fn default() -> Self {
        NameCache {
            words: Box::new([None; NAME_SLOTS]),
            odd: Box::new([None; NAME_SLOTS]),
        }
    }
}

/// A name of 4 to 16 bytes as two words that together hold every byte of it: the first and
/// last four (4 to 7 bytes) or eight (8 to 16 bytes), overlapping in the middle. With the
/// length, equal keys mean equal names.
#[inline(always)]
fn name_key(b: &[u8]) -> Option<(u64, u64)> {
    let n = b.len();
    let w8 = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let w4 = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes")) as u64;
    match n {
        8..=16 => Some((w8(0), w8(n - 8))),
        4..=7 => Some((w4(0) | w4(n - 4) << 32, 0)),
        _ => None,
    }
}

impl NameCache {
    /// The hit inline (once per line), the miss out of line.
    #[inline(always)]
    pub fn get(&mut self, b: &[u8]) -> Name {
        let Some(key) = name_key(b) else {
            return self.get_odd(b);
        };
        let mixed = key.0 ^ key.1.rotate_left(31) ^ b.len() as u64;
        let slot = (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % NAME_SLOTS;
        if let Some(w) = &self.words[slot] {
            if w.key == key && w.len == b.len() {
                return w.name;
            }
        }
        self.miss_worded(slot, key, b)
    }

    #[inline(never)]
    fn miss_worded(&mut self, slot: usize, key: (u64, u64), b: &[u8]) -> Name {
        let n = lookup(b);
        // `intern` maps garbage to "?" once its table is full: do not let that evict.
        if n.name.as_bytes() == b {
            self.words[slot] = Some(Worded {
                key,
                len: b.len(),
                name: n,
            });
        }
        n
    }

    /// Names shorter than four or longer than sixteen bytes.
    #[inline(never)]
    fn get_odd(&mut self, b: &[u8]) -> Name {
        let slot = match b {
            [] => 0,
            [f, .., l] => (b.len() * 31 + *f as usize * 7 + *l as usize * 3) % NAME_SLOTS,
            [f] => *f as usize % NAME_SLOTS,
        };
        if let Some(n) = self.odd[slot] {
            if n.name.as_bytes() == b {
                return n;
            }
        }
        let n = lookup(b);
        if n.name.as_bytes() == b {
            self.odd[slot] = Some(n);
        }
        n
    }
}

/// A name interned, with its syscall table entry.
fn lookup(b: &[u8]) -> Name {
    let s = event::intern(b);
    Name {
        name: s,
        sys: syscalls::info(s),
    }
}

thread_local! {
    static NAMES: std::cell::RefCell<NameCache> = std::cell::RefCell::new(NameCache::default());
}

/// Interned name (syscall, errno, signal) through the per-thread cache.
pub fn intern(b: &[u8]) -> &'static str {
    NAMES.with(|c| c.borrow_mut().get(b)).name
}

/// Splits off the first top-level argument: returns (arg, rest after the comma).
fn first_arg(args: &[u8]) -> (&[u8], &[u8]) {
    let mut depth = 0i32;
    let mut q = Quoted::new(args);
    while let Some((i, piece)) = q.next() {
        let Piece::Code(b) = piece else {
            continue;
        };
        match b {
            b'[' | b'{' | b'(' => depth += 1,
            b']' | b'}' | b')' => depth -= 1,
            b'<' if i > 0 && args[i - 1].is_ascii_alphanumeric() => {
                // an fd annotation: skip it whole (it may hold commas and brackets)
                if let Some((_, used)) = annotation(&args[i..]) {
                    q.pos = i + used;
                }
            }
            b',' if depth <= 0 => return (&args[..i], skip_ws(&args[i + 1..])),
            _ => {}
        }
    }
    (args, &[])
}

/// `7</path>` / `7` / `AT_FDCWD<...>` -> (fd, annotation)
fn parse_fd_arg(a: &[u8]) -> (Option<i32>, Option<&[u8]>) {
    let a = skip_ws(a);
    // perf trace style `fd: 7` is handled by its own parser; here numbers only, in hex as
    // some shims print them (`accept4(0x6, ...)`), never the `0` of a `0x`.
    let num = if a.starts_with(b"0x") {
        parse_hex(a)
    } else {
        parse_u64(a)
    };
    match num {
        Some((v, n)) if v <= i32::MAX as u64 => {
            (Some(v as i32), annotation(&a[n..]).map(|(p, _)| p))
        }
        _ => (None, None),
    }
}

fn path_arg(a: &[u8]) -> Option<Box<str>> {
    let a = skip_ws(a);
    let inner = a.strip_prefix(b"\"")?;
    let (bytes, _, _) = unescape(inner, 4096);
    Some(
        String::from_utf8_lossy(&bytes)
            .into_owned()
            .into_boxed_str(),
    )
}

/// Fills the syscall fields the analysis needs from the (entry half of the) argument text,
/// by the argument shape of the call's name (for the perf parser, which has its own cache).
pub(crate) fn extract_args_with(sc: &mut Syscall, facts: Name, args: &[u8]) {
    extract_args_named(sc, facts, args)
}

/// `extract_args_named` for the commonest shapes inline: a plain fd then a buffer (read,
/// write...) or nothing more the analysis needs, and calls that need no argument at all;
/// the rest out of line.
#[inline(always)]
pub(super) fn extract_args_hot(sc: &mut Syscall, facts: Name, args: &[u8]) {
    match (facts.sys.fd_first, facts.sys.args) {
        (true, ArgKind::Data | ArgKind::Nothing) => {
            if let Some((fd, _, rest)) = plain_fd_arg(args) {
                sc.fd = Some(fd);
                if facts.sys.args == ArgKind::Data {
                    data_from(sc, rest);
                }
                return;
            }
        }
        // `first_arg` would be taken and dropped: nothing to read.
        (false, ArgKind::Nothing) => return,
        _ => {}
    }
    extract_args_named(sc, facts, args)
}

/// `extract_args` with the name facts already looked up: out of line, off the common
/// path (a plain fd first, which `extract_args` reads itself).
#[inline(never)]
pub(super) fn extract_args_named(sc: &mut Syscall, facts: Name, args: &[u8]) {
    let (a0, rest) = fd_and_first_arg(sc, facts, args);
    match facts.sys.args {
        ArgKind::Data => data_from(sc, rest),
        ArgKind::Nothing => {}
        kind => {
            if let Some(extra) = extra_of(kind, a0, rest, args) {
                sc.extra = extra;
            }
        }
    }
}

/// The fd of a call whose first argument is one (with its `-y` annotation), and the first
/// argument's text and the rest after it.
fn fd_and_first_arg<'a>(sc: &mut Syscall, facts: Name, args: &'a [u8]) -> (&'a [u8], &'a [u8]) {
    let plain = if facts.sys.fd_first {
        plain_fd_arg(args)
    } else {
        None
    };
    match plain {
        Some((fd, a0, rest)) => {
            sc.fd = Some(fd);
            (a0, rest)
        }
        _ => {
            let (a0, rest) = first_arg(args);
            if facts.sys.fd_first {
                let (fd, ann) = parse_fd_arg(a0);
                sc.fd = fd;
                if let Some(p) = ann {
                    sc.fd_path = Some(lossy(p));
                }
            }
            (a0, rest)
        }
    }
}

/// What a call's arguments say beyond its fd (`Extra`), by the kind of its arguments
/// (`args` whole, `a0` the first and `rest` what follows it).
fn extra_of(kind: ArgKind, a0: &[u8], rest: &[u8], args: &[u8]) -> Option<Extra> {
    match kind {
        ArgKind::Path0 => path_arg(a0).map(Extra::Path),
        ArgKind::Path1 => path_arg(first_arg(rest).0)
            .filter(|p| !p.is_empty())
            .map(Extra::Path),
        ArgKind::Rename => {
            let (a1, _) = first_arg(rest);
            Some(Extra::Rename(path_arg(a0)?, path_arg(a1)?))
        }
        ArgKind::RenameAt => {
            let (a1, r) = first_arg(rest);
            let (_, r) = first_arg(r);
            let (a3, _) = first_arg(r);
            Some(Extra::Rename(path_arg(a1)?, path_arg(a3)?))
        }
        ArgKind::Pipe => fd_pair(a0),
        ArgKind::Socketpair => {
            let (_, r) = first_arg(rest);
            let (_, r) = first_arg(r);
            fd_pair(first_arg(r).0)
        }
        ArgKind::Dup2 => parse_fd_arg(first_arg(rest).0).0.map(Extra::NewFd),
        ArgKind::Fcntl => skip_ws(first_arg(rest).0)
            .starts_with(b"F_DUPFD")
            .then_some(Extra::DupFd),
        ArgKind::CloseRange => close_range(a0, first_arg(rest).0),
        ArgKind::Clone | ArgKind::Clone3 | ArgKind::Fork => Some(Extra::Clone {
            thread: clone_thread(args),
        }),
        ArgKind::Socket => {
            let a = skip_ws(a0);
            let n = a.iter().take_while(|b| is_name_byte(**b)).count();
            Some(Extra::Socket(intern(&a[..n])))
        }
        ArgKind::Restart => {
            // `<... resuming interrupted nanosleep ...>`: the call this one continues.
            let i = memmem::find(args, b"interrupted ")?;
            let r = &args[i + 12..];
            let n = r.iter().take_while(|b| is_name_byte(**b)).count();
            (n > 0).then(|| Extra::Resumes(intern(&r[..n])))
        }
        ArgKind::Futex => futex(a0, first_arg(rest)),
        ArgKind::Connect => peer_address(first_arg(rest).0).map(Extra::Path),
        ArgKind::Data | ArgKind::Nothing => None,
    }
}

/// CLONE_THREAD among a clone's flags: `flags=CLONE_VM|...|CLONE_THREAD|...` (strace), or
/// `clone_flags: VM|...|THREAD|...` (perf trace, which prints the flags without their
/// prefix): a thread of the caller's process, not a new process.
fn clone_thread(args: &[u8]) -> bool {
    // A whole flag name: after a separator or `CLONE_`, before a separator.
    let starts_flag = |at: usize| {
        let head = &args[..at];
        let head = head.strip_suffix(b"CLONE_").unwrap_or(head);
        head.last().is_none_or(|b| !is_name_byte(*b))
    };
    memmem::find_iter(args, b"THREAD")
        .any(|i| starts_flag(i) && !args.get(i + 6).is_some_and(|b| is_name_byte(*b)))
}

/// `[3, 4]`: the two fds a pipe or a socketpair made.
fn fd_pair(arr: &[u8]) -> Option<Extra> {
    let inner = skip_ws(arr).strip_prefix(b"[")?;
    let (x, r) = first_arg(inner);
    Some(Extra::FdPair(parse_fd_arg(x).0?, parse_fd_arg(r).0?))
}

/// `close_range(3, ~0U, 0)`: the fds it closes, `~0` (or its value) meaning all above.
fn close_range(a0: &[u8], a1: &[u8]) -> Option<Extra> {
    let lo = parse_u64(skip_ws(a0)).map(|v| v.0 as u32)?;
    let a1 = skip_ws(a1);
    let hi = if a1.starts_with(b"~0") || a1.starts_with(b"4294967295") {
        u32::MAX
    } else {
        parse_u64(a1).map(|v| v.0.min(u32::MAX as u64) as u32)?
    };
    Some(Extra::CloseRange(lo, hi))
}

/// `futex(addr, FUTEX_WAIT_PRIVATE, 2, NULL)` (perf trace: `uaddr: 0x7f.., op:
/// WAIT|PRIVATE_FLAG, val: 2`, its labels stripped): a wait on a lock glibc marked
/// contended (2). Another wait or a wake: on which futex, so that a wake is tied to the
/// wait it ended.
fn futex(a0: &[u8], (op, r): (&[u8], &[u8])) -> Option<Extra> {
    let addr = parse_hex(skip_ws(a0)).map(|v| v.0);
    let val = parse_u64(skip_ws(first_arg(r).0)).map(|v| v.0);
    let op = skip_ws(op);
    let op = op.strip_prefix(b"FUTEX_").unwrap_or(op);
    let wait = op.starts_with(b"WAIT") && !op.starts_with(b"WAIT_REQUEUE");
    if wait && val == Some(2) {
        return Some(Extra::LockWait(addr.unwrap_or(0)));
    }
    let wake = op.starts_with(b"WAKE");
    addr.filter(|_| wait || wake)
        .map(|addr| Extra::Futex { addr, wake })
}

/// The peer a connect names, as the report shows it: `10.0.0.2:6380`, `[::1]:6379`, a unix
/// socket's path (`@name` for an abstract one). None for a family or shape not known here.
fn peer_address(a: &[u8]) -> Option<Box<str>> {
    let field = |key: &[u8]| memmem::find(a, key).map(|i| &a[i + key.len()..]);
    let quoted = |key: &[u8]| -> Option<String> {
        let r = field(key)?;
        let (abstract_ns, r) = match r.strip_prefix(b"@") {
            Some(r) => (true, r),
            None => (false, r),
        };
        let (bytes, _, _) = unescape(r.strip_prefix(b"\"")?, 256);
        let s = String::from_utf8_lossy(&bytes);
        Some(if abstract_ns {
            format!("@{s}")
        } else {
            s.into_owned()
        })
    };
    if let Some(p) = quoted(b"sun_path=") {
        return Some(p.into_boxed_str());
    }
    let port = parse_u64(field(b"port=htons(")?)?.0;
    let addr = if let Some(v4) = quoted(b"inet_addr(") {
        v4
    } else {
        let r = field(b"inet_pton(")?;
        let r = &r[memchr::memchr(b',', r)? + 1..];
        format!("[{}]", path_arg(r)?)
    };
    Some(format!("{addr}:{port}").into_boxed_str())
}

/// A bare fd number as the whole first argument (`8, ...` or `8`), the common case that
/// needs none of `first_arg`'s bracket and string tracking: (fd, its text, the rest after
/// `, `). Inline: out of line, the three-part result went through memory on every line.
#[inline(always)]
fn plain_fd_arg(args: &[u8]) -> Option<(i32, &[u8], &[u8])> {
    // Up to ten digits, read as they are counted (ten fit a u64 without overflow).
    let (mut v, mut n) = (0u64, 0);
    while n < 10 {
        let Some(d) = args
            .get(n)
            .map(|b| b.wrapping_sub(b'0'))
            .filter(|d| *d <= 9)
        else {
            break;
        };
        v = v * 10 + d as u64;
        n += 1;
    }
    if n == 0 {
        return None;
    }
    let rest = match args.get(n..) {
        // `8, ...`: the one blank strace prints, without the loop.
        Some([b',', b' ', c, ..]) if *c != b' ' && *c != b'\t' => &args[n + 2..],
        Some([b',', ..]) => skip_ws(&args[n + 1..]),
        Some([]) => &args[n..],
        _ => return None,
    };
    Some((i32::try_from(v).ok()?, &args[..n], rest))
}

/// Takes the buffer argument (a quoted string) at the start of `s`, if that is what it is.
/// The text is kept as printed and decoded only if someone asks (`Data::head`).
#[inline(always)]
pub(super) fn data_from(sc: &mut Syscall, s: &[u8]) {
    let s = skip_ws(s);
    if let Some(inner) = s.strip_prefix(b"\"") {
        Data::put_escaped(&mut sc.extra, inner);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    /// The name cache gives the interned name for every length around its word sizes, for
    /// names differing in any one byte, and for many names sharing the table (collisions).
    #[test]
    fn name_cache_gives_each_name_its_own_entry() {
        let mut c = super::NameCache::default();
        let mut names: Vec<Vec<u8>> = vec![];
        for n in 0..24usize {
            let a: Vec<u8> = (0..n as u8).map(|i| b'a' + i).collect();
            names.push(a.clone());
            for at in 0..n {
                let mut b = a.clone();
                b[at] = b'_';
                names.push(b);
            }
        }
        for round in 0..2 {
            for b in &names {
                let got = c.get(b);
                assert_eq!(got.name.as_bytes(), &b[..], "round {round}");
                assert!(std::ptr::eq(
                    got.sys,
                    crate::syscalls::info(crate::event::intern(b))
                ));
            }
        }
        assert_eq!(c.get(b"epoll_wait").name, "epoll_wait");
        assert_eq!(c.get(b"read").name, "read");
    }

    /// `restart_syscall(<... resuming interrupted nanosleep ...>)` carries the wait it resumes.
    #[test]
    fn restart_syscall_names_the_call_it_resumes() {
        let got = run(&["restart_syscall(<... resuming interrupted clock_nanosleep ...>) = 0"]);
        assert_eq!(
            got[0],
            call(0, 0, 1, "restart_syscall")
                .extra(Extra::Resumes("clock_nanosleep"))
                .val(0)
                .in_flight(InFlight::AtStart)
                .0
        );
    }

    /// Hex fds (`accept4(0x6, ...)`, from non-Linux shims) are read as numbers, never as the
    /// `0` of `0x`.
    #[test]
    fn hex_fds_are_numbers() {
        let got = run(&[
            "accept4(0x6, NULL, NULL, SOCK_CLOEXEC) = 0x9",
            "close(0x1f) = 0",
            "pipe2([0x3, 0x4], O_CLOEXEC) = 0",
        ]);
        assert_eq!(got[0].syscall().unwrap().fd, Some(6));
        assert_eq!(got[0].syscall().unwrap().ret, Ret::Val(9));
        assert_eq!(got[1].syscall().unwrap().fd, Some(31));
        assert_eq!(got[2].syscall().unwrap().extra, Extra::FdPair(3, 4));
    }
}
