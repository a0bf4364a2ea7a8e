//! Arrivals for the bpf backend: when the data a socket read returned was queued on the
//! socket, so that a command's latency starts when its request reached redis rather than
//! when redis's read began (the wakeup of the event loop, a wait for a CPU and the wait's
//! return lie between, and a client pays for them).
//!
//! On loopback a receiver's data-ready runs in the sender's task, so each reply redis sends
//! to a local client readies the client's socket in redis's own thread. The tp_btf
//! data-ready program skips those (the current task is the attached process and the
//! socket's local port is none of its listening ports at the attach, `Listening`): half of
//! its runs under a local benchmark, for sockets no traced task reads. The one arrival this
//! can miss is a softirq that happens to run in redis's thread for a socket redis itself
//! connected (a replica's link to its master); accepted sockets are never skipped.
//!
//! The kernel side is the `arrival_*` programs of bpf/stallscope.bpf.c: `sock:sk_data_ready`
//! stamps a TCP socket with the earliest data not yet read; the traced process's receive
//! (`sock:sock_recv_length`, inside its read) takes the stamp and puts it in the read's own
//! record (`Rec::arrival_*`), or, for a read that began before the attach, sends a REC_ARRIVAL
//! record, which the ring delivers before the record of the read it happened in;
//! `tcp:tcp_destroy_sock` drops the stamp of a socket that goes away, so an address reused by
//! a new socket never inherits it. Here a REC_ARRIVAL record is held per thread until that
//! thread's read ends, and the read's `Syscall::arrived` is set when the receive happened
//! inside it.
//!
//! Which arrival a read gets: the earliest of the data it found that no earlier read took
//! (later arrivals before the read leave the stamp alone). For a read that returns several
//! pipelined commands each gets that arrival: the first command's is exact, the later ones
//! may have arrived after it, so their latency is an upper bound. A read that leaves data in
//! the socket (a burst larger than redis's buffer) leaves the same stamp for the rest when the
//! socket saw one arrival since it was stamped, else the latest arrival (a lower bound of the
//! rest's wait). Reads of sockets of other families (unix) have none: the analyzer dates them
//! from the event loop's wait, as without these programs. Kernels without the tracepoints
//! (before 6.3) trace as before, with a warning.

use super::load::{detach, load_error, tracefs_events, verifier_refusal, Link};
use super::{Rec, DATA_MAX};
use crate::event::{Nanos, Syscall, Tid};
use crate::live::tracefs::field_offset;

/// As in bpf/stallscope.bpf.c.
pub(super) const REC_ARRIVAL: u32 = 16;
const ARRIVAL_LEN: usize = 40;

/// The programs, with the tracepoint each attaches to.
const PROGRAMS: [(&str, &str, &str); 3] = [
    ("arrival_ready", "sock", "sk_data_ready"),
    ("arrival_recv", "sock", "sock_recv_length"),
    ("arrival_destroy", "tcp", "tcp_destroy_sock"),
];

/// The tracepoint field offsets the programs read (the loader sets them as globals), from
/// the kernel's format files; an error says which tracepoint or field is missing.
pub(super) type Layout = Result<[(&'static str, u32); 7], String>;

/// Set to 1 to trace as on a kernel without the tracepoints (tests of that path).
pub const NO_ARRIVALS_ENV: &str = "STALLSCOPE_BPF_TEST_NO_ARRIVALS";

pub(super) fn layout() -> Layout {
    if std::env::var(NO_ARRIVALS_ENV).is_ok_and(|v| v == "1") {
        return Err(format!(
            "{NO_ARRIVALS_ENV}=1 (tracing as on a kernel without sock:sk_data_ready)"
        ));
    }
    let ev = tracefs_events()?;
    let mut out = [("", 0u32); 7];
    let want = [
        ("ready_sk_off", "sock", "sk_data_ready", "skaddr"),
        ("ready_family_off", "sock", "sk_data_ready", "family"),
        ("ready_protocol_off", "sock", "sk_data_ready", "protocol"),
        ("recv_sk_off", "sock", "sock_recv_length", "sk"),
        ("recv_ret_off", "sock", "sock_recv_length", "ret"),
        ("recv_flags_off", "sock", "sock_recv_length", "flags"),
        ("destroy_sk_off", "tcp", "tcp_destroy_sock", "skaddr"),
    ];
    for (i, (global, cat, name, field)) in want.into_iter().enumerate() {
        let p = ev.join(cat).join(name).join("format");
        let f = std::fs::read_to_string(&p)
            .map_err(|_| format!("this kernel has no {cat}:{name} tracepoint"))?;
        let off =
            field_offset(&f, field).ok_or_else(|| format!("{cat}:{name} has no {field} field"))?;
        out[i] = (global, off);
    }
    Ok(out)
}

/// Sets the offsets (the programs' defaults stay when the layout is unknown: they are then
/// loaded but never attached).
pub(super) fn set_globals<'a>(loader: &mut aya::EbpfLoader<'a>, layout: &'a Layout) {
    if let Ok(l) = layout {
        for (global, off) in l {
            loader.set_global(global, off, true);
        }
    }
}

/// As `LISTEN_MAX` in bpf/stallscope.bpf.c.
const LISTEN_MAX: usize = 8;

/// What the data-ready program needs to skip the traced process's own sends to local peers:
/// its listening TCP ports at the attach, and their count (past `LISTEN_MAX` when unknown:
/// then nothing is skipped).
pub(super) struct Listening {
    ports: [u16; LISTEN_MAX],
    count: u32,
}

impl Listening {
    /// No ports known: nothing is skipped (programs shared by several processes).
    pub(super) fn unknown() -> Listening {
        Listening {
            ports: [0; LISTEN_MAX],
            count: LISTEN_MAX as u32 + 1,
        }
    }

    pub(super) fn of(pid: Tid) -> Listening {
        let unknown = Listening {
            ports: [0; LISTEN_MAX],
            count: LISTEN_MAX as u32 + 1,
        };
        let Some(mut found) = listening_ports(pid) else {
            return unknown;
        };
        found.sort_unstable();
        found.dedup();
        if found.len() > LISTEN_MAX {
            return unknown;
        }
        let mut ports = [0; LISTEN_MAX];
        ports[..found.len()].copy_from_slice(&found);
        Listening {
            ports,
            count: found.len() as u32,
        }
    }

    /// The ports, for the attach message; None when unknown.
    pub(super) fn ports(&self) -> Option<&[u16]> {
        (self.count as usize <= LISTEN_MAX).then(|| &self.ports[..self.count as usize])
    }

    pub(super) fn set_globals<'a>(&'a self, loader: &mut aya::EbpfLoader<'a>) {
        loader
            .set_global("listen_ports", &self.ports, true)
            .set_global("listen_count", &self.count, true);
    }
}

/// The local ports of the TCP sockets `pid` listens on: the LISTEN rows of its network
/// namespace's /proc/PID/net/tcp{,6} whose inode is one of its fds. None if /proc cannot say.
fn listening_ports(pid: Tid) -> Option<Vec<u16>> {
    let mut inodes = std::collections::HashSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        if let Ok(l) = std::fs::read_link(e.path()) {
            let l = l.to_string_lossy();
            if let Some(ino) = l.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(ino.to_string());
            }
        }
    }
    let mut ports = vec![];
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            // No IPv6 in this kernel: no tcp6 table.
            if table == "tcp6" {
                continue;
            }
            return None;
        };
        ports.extend(listening_in(&text, &inodes)?);
    }
    Some(ports)
}

/// The listening rows' local ports of a /proc/net/tcp table whose inode is in `inodes`; None
/// if a row does not parse.
fn listening_in(text: &str, inodes: &std::collections::HashSet<String>) -> Option<Vec<u16>> {
    const TCP_LISTEN: &str = "0A";
    let mut ports = vec![];
    for row in text.lines().skip(1) {
        let f: Vec<&str> = row.split_whitespace().collect();
        let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
            return None;
        };
        if *state != TCP_LISTEN || !inodes.contains(*inode) {
            continue;
        }
        let port = local.rsplit_once(':')?.1;
        ports.push(u16::from_str_radix(port, 16).ok()?);
    }
    Some(ports)
}

/// The same on the BTF-typed raw tracepoints (preferred, as the syscall programs: no trace
/// record is filled for them, and they read the socket's fields with plain loads).
const BTF_PROGRAMS: [(&str, &str); 3] = [
    ("btf_arrival_ready", "sk_data_ready"),
    ("btf_arrival_recv", "sock_recv_length"),
    ("btf_arrival_destroy", "tcp_destroy_sock"),
];

/// Loads and attaches the programs (the tp_btf ones unless `classic` or they cannot load,
/// then the classic ones); on any failure detaches those already attached and says why
/// (tracing goes on without arrivals). Ok says which flavour runs.
pub(super) fn attach(
    bpf: &mut aya::Ebpf,
    layout: &Layout,
    links: &mut Vec<(&'static str, Link)>,
    classic: bool,
    btf: &super::load::KernelBtf,
) -> Result<&'static str, String> {
    layout.as_ref().map_err(|e| e.clone())?;
    if !classic {
        if let Ok(l) = attach_btf(bpf, btf) {
            links.extend(l);
            return Ok("tp_btf");
        }
    }
    attach_classic(bpf, links).map(|()| "classic tracepoints")
}

fn attach_btf(
    bpf: &mut aya::Ebpf,
    btf: &super::load::KernelBtf,
) -> Result<Vec<(&'static str, Link)>, String> {
    let btf = btf.as_ref().map_err(String::clone)?;
    let mut mine = vec![];
    for (prog, tp) in BTF_PROGRAMS {
        let r = (|| {
            let p: &mut aya::programs::BtfTracePoint = bpf
                .program_mut(prog)
                .ok_or_else(|| format!("the BPF object lacks {prog}"))?
                .try_into()
                .map_err(|e| format!("{prog}: {e}"))?;
            p.load(tp, btf)
                .map_err(|e| verifier_refusal(prog, &e).to_string())?;
            p.attach()
                .map_err(|e| format!("cannot attach {prog} to tp_btf/{tp}: {e}"))
        })();
        match r {
            Ok(id) => mine.push((prog, Link::Btf(id))),
            Err(e) => {
                for (prog, link) in mine {
                    detach(bpf, prog, link);
                }
                return Err(e);
            }
        }
    }
    Ok(mine)
}

fn attach_classic(
    bpf: &mut aya::Ebpf,
    links: &mut Vec<(&'static str, Link)>,
) -> Result<(), String> {
    let mut mine = vec![];
    let mut result = Ok(());
    for (prog, cat, name) in PROGRAMS {
        match attach_one(bpf, prog, cat, name) {
            Ok(id) => mine.push((prog, id)),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_err() {
        for (prog, id) in mine {
            if let Some(p) = bpf.program_mut(prog) {
                let p: Result<&mut aya::programs::TracePoint, _> = p.try_into();
                if let Ok(p) = p {
                    let _ = p.detach(id);
                }
            }
        }
    } else {
        links.extend(mine.into_iter().map(|(p, id)| (p, Link::Tp(id))));
    }
    result
}

fn attach_one(
    bpf: &mut aya::Ebpf,
    prog: &'static str,
    cat: &str,
    name: &str,
) -> Result<aya::programs::trace_point::TracePointLinkId, String> {
    let p: &mut aya::programs::TracePoint = bpf
        .program_mut(prog)
        .ok_or_else(|| format!("the BPF object lacks {prog}"))?
        .try_into()
        .map_err(|e| format!("{prog}: {e}"))?;
    p.load()
        .map_err(|e| verifier_refusal(prog, &e).to_string())?;
    p.attach(cat, name).map_err(|e| {
        load_error(&format!("cannot attach {prog} to {cat}:{name}"), &e, None).to_string()
    })
}

/// A REC_ARRIVAL record, carried in a `Rec`: `nr` the bytes received, `enter_ns` the stamp
/// (when the earliest data was queued), `exit_ns` when the receive ended. None for any other
/// record.
pub(super) fn parse(b: &[u8]) -> Option<Rec> {
    if b.len() < ARRIVAL_LEN {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_ne_bytes(a)
    };
    if u32_at(0) != REC_ARRIVAL {
        return None;
    }
    Some(Rec {
        kind: REC_ARRIVAL,
        tid: u32_at(4),
        tgid: u32_at(8),
        data_len: 0,
        nr: u32_at(12) as i32 as i64,
        ret: 0,
        enter_ns: u64_at(24) as Nanos,
        exit_ns: u64_at(32) as Nanos,
        args: [0; 6],
        sched_enter: [0; crate::live::bpf::SNAP],
        sched_exit: [0; crate::live::bpf::SNAP],
        arrival_first: 0,
        arrival_at: 0,
        data: [0; DATA_MAX],
    })
}

/// The user-space half: receives waiting for the end of their read, by thread.
#[derive(Default)]
pub(super) struct Arrivals {
    /// Whether the programs are attached.
    on: bool,
    /// Per thread: (stamp, when its receive ended).
    pending: rustc_hash::FxHashMap<Tid, (Nanos, Nanos)>,
    /// Reads dated by an arrival (for the report's `summary.command_start`).
    pub(super) dated: u64,
}

impl Arrivals {
    pub(super) fn started(&mut self, attached: Result<(), String>, warnings: &mut Vec<String>) {
        match attached {
            Ok(()) => self.on = true,
            Err(e) => warnings.push(format!(
                "per-command latency starts when redis's event loop found the request, not when it arrived \
                 (what a client waits for the wakeup is not counted): {e}"
            )),
        }
    }

    pub(super) fn on(&self) -> bool {
        self.on
    }

    pub(super) fn on_record(&mut self, r: &Rec) {
        self.pending.insert(r.tid, (r.enter_ns, r.exit_ns));
    }

    /// A call of `r.tid` ended: if the receive was inside it, that is its data's arrival.
    #[inline]
    pub(super) fn date(&mut self, r: &Rec, sc: &mut Syscall) {
        // The kernel puts the stamp in the call's own record when it saw the call enter,
        // else in a REC_ARRIVAL record of its own before it (`pending`).
        let carried = (r.arrival_at != 0).then_some((r.arrival_first, r.arrival_at));
        if carried.is_none() && self.pending.is_empty() {
            return;
        }
        let pending = self.pending.remove(&r.tid);
        if let Some((stamp, at)) = carried.or(pending) {
            if r.enter_ns <= at && at <= r.exit_ns && sc.sys.facts.has(crate::syscalls::Facts::RECV)
            {
                sc.arrived = Some(stamp.min(r.exit_ns));
                self.dated += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: u32, tid: Tid, enter: Nanos, exit: Nanos) -> Rec {
        Rec {
            kind,
            tid,
            tgid: tid,
            data_len: 0,
            nr: 0,
            ret: 36,
            enter_ns: enter,
            exit_ns: exit,
            args: [0; 6],
            sched_enter: [0; crate::live::bpf::SNAP],
            sched_exit: [0; crate::live::bpf::SNAP],
            arrival_first: 0,
            arrival_at: 0,
            data: [0; DATA_MAX],
        }
    }

    #[test]
    fn listening_ports_are_the_listen_rows_of_the_process_own_sockets() {
        // Rows of a real /proc/net/tcp: a listener of the process (6379), a listener of
        // another process (22), an established connection of the process (state 01).
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4242 1 0000000000000000 100 0 0 10 0\n\
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0\n\
   2: 0100007F:18EB 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000   999        0 4343 1 0000000000000000 20 4 30 10 -1\n";
        let mine: std::collections::HashSet<String> =
            ["4242", "4343"].iter().map(|s| s.to_string()).collect();
        assert_eq!(listening_in(text, &mine), Some(vec![6379]));
        assert_eq!(listening_in("header\n  0: garbage\n", &mine), None);
        // This test's own listener, found through /proc.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let found = listening_ports(std::process::id()).expect("/proc readable");
        assert!(found.contains(&port), "{port} not in {found:?}");
    }

    #[test]
    fn an_arrival_record_is_told_from_the_others_and_read_field_by_field() {
        let mut b = vec![0u8; ARRIVAL_LEN];
        b[0..4].copy_from_slice(&REC_ARRIVAL.to_ne_bytes());
        b[4..8].copy_from_slice(&7u32.to_ne_bytes());
        b[12..16].copy_from_slice(&36i32.to_ne_bytes());
        b[24..32].copy_from_slice(&1_000u64.to_ne_bytes());
        b[32..40].copy_from_slice(&9_000u64.to_ne_bytes());
        let r = parse(&b).expect("an arrival");
        assert_eq!((r.tid, r.nr, r.enter_ns, r.exit_ns), (7, 36, 1_000, 9_000));
        b[0..4].copy_from_slice(&1u32.to_ne_bytes());
        assert!(parse(&b).is_none());
        assert!(parse(&b[..ARRIVAL_LEN - 1]).is_none());
    }

    #[test]
    fn a_read_gets_the_arrival_of_the_receive_inside_it_and_no_other() {
        let mut a = Arrivals::default();
        let mut arr = rec(REC_ARRIVAL, 7, 1_000, 5_500);
        a.on_record(&arr);
        let read = Syscall::new("read");
        // Another thread's read, then this thread's read that contains the receive.
        let mut other = read.clone();
        a.date(&rec(1, 8, 5_000, 6_000), &mut other);
        assert_eq!(other.arrived, None);
        let mut mine = read.clone();
        a.date(&rec(1, 7, 5_000, 6_000), &mut mine);
        assert_eq!(mine.arrived, Some(1_000));
        // Used once: the thread's next read has none.
        let mut next = read.clone();
        a.date(&rec(1, 7, 7_000, 8_000), &mut next);
        assert_eq!(next.arrived, None);
        // A receive outside the call that ended (a surprise ordering) dates nothing.
        arr.exit_ns = 9_500;
        a.on_record(&arr);
        let mut early = read.clone();
        a.date(&rec(1, 7, 7_000, 8_000), &mut early);
        assert_eq!((early.arrived, a.dated), (None, 1));
    }

    #[test]
    fn a_stamp_carried_in_the_reads_own_record_dates_it() {
        let mut a = Arrivals::default();
        let read = Syscall::new("read");
        let mut r = rec(1, 7, 5_000, 6_000);
        r.arrival_first = 1_000;
        r.arrival_at = 5_500;
        let mut mine = read.clone();
        a.date(&r, &mut mine);
        assert_eq!((mine.arrived, a.dated), (Some(1_000), 1));
        // The same thread's next read without a stamp has none.
        let mut next = read.clone();
        a.date(&rec(1, 7, 7_000, 8_000), &mut next);
        assert_eq!(next.arrived, None);
    }
}
