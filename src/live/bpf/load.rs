//! Loading the bpf backend's kernel side: the compiled object with its globals set, the
//! syscall-kind table the programs read, the programs attached (tp_btf where the kernel
//! allows it, classic tracepoints otherwise), the process put into the filter maps, and the
//! errors of each step in words a user can act on (the verifier's own, when it refuses).

use super::{
    arrivals, kernel_kind, BpfConfig, KTarget, Measure, CLASSIC_ENV, NR_MAX, OBJECT, REFUSE_ENV,
};
use crate::event::Tid;
use crate::live::sysnames::syscall_name;
use crate::live::tracefs::{self, field_offset};
use crate::live::AttachError;

/// Loads the object with its globals set (what the programs follow, where fields are, the
/// ring's size), and the program the verifier refuses when `REFUSE_ENV` asks for it.
pub(super) fn load(
    cfg: &BpfConfig,
    measure: Measure,
    ring_bytes: u32,
    layout: &arrivals::Layout,
    listening: &arrivals::Listening,
) -> Result<aya::Ebpf, AttachError> {
    let child_off = check_layouts().map_err(AttachError::Other)?;
    let follow = cfg.follow_forks as u32;
    let ring_bytes64 = ring_bytes as u64;
    let filter_only = (measure == Measure::FilterOnly) as u32;
    let mut loader = aya::EbpfLoader::new();
    loader
        .set_global("measure_filter_only", &filter_only, true)
        .set_global("follow_forks", &follow, true)
        .set_global("fork_child_pid_off", &child_off, true)
        .set_global("ring_bytes", &ring_bytes64, true)
        .set_max_entries("events", ring_bytes);
    arrivals::set_globals(&mut loader, layout);
    listening.set_globals(&mut loader);
    let mut bpf = loader
        .load(OBJECT)
        .map_err(|e| load_error("cannot load the BPF object", &e, errno_of(&e)))?;
    if std::env::var(REFUSE_ENV).is_ok_and(|v| v == "1") {
        let p: &mut aya::programs::TracePoint = bpf
            .program_mut("refused_by_verifier")
            .ok_or_else(|| AttachError::Other("the BPF object lacks refused_by_verifier".into()))?
            .try_into()
            .map_err(|e| load_error("refused_by_verifier", &e, None))?;
        if let Err(e) = p.load() {
            return Err(verifier_refusal("refused_by_verifier", &e));
        }
    }
    fill_nr_kinds(&mut bpf)?;
    Ok(bpf)
}

/// The kernel's BTF for attaching tp_btf programs, parsed once and lent to each: a parse of
/// /sys/kernel/btf/vmlinux costs tens of milliseconds and about 20 MB of short-lived heap,
/// and the syscall, throttle and arrival programs each parsed it again (a watcher's peak
/// RSS, its escalation's delay). aya's loader parses its own copy in `EbpfLoader::new()`
/// (it has no constructor that borrows one): parse this one after the loader is dropped,
/// so that two are never held at once.
pub(in crate::live) type KernelBtf = Result<aya::Btf, String>;

pub(in crate::live) fn kernel_btf() -> KernelBtf {
    aya::Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))
}

/// Tells the programs which syscall numbers have a buffer to copy or clone flags to read.
fn fill_nr_kinds(bpf: &mut aya::Ebpf) -> Result<(), AttachError> {
    let mut kinds: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
        bpf.map_mut("nr_kinds")
            .ok_or_else(|| AttachError::Other("the BPF object lacks nr_kinds".into()))?,
    )
    .map_err(|e| load_error("nr_kinds", &e, None))?;
    for nr in 0..NR_MAX {
        let k = kernel_kind(crate::syscalls::info(syscall_name(nr)));
        if k != 0 {
            kinds
                .set(nr as u32, k, 0)
                .map_err(|e| load_error("cannot fill nr_kinds", &e, errno_of(&e)))?;
        }
    }
    Ok(())
}

/// The attached programs, the arrival programs' flavour (or why they do not run), and
/// which of the throttle and reclaim programs run.
pub(super) type Attached = (
    Vec<(&'static str, Link)>,
    Result<&'static str, String>,
    super::Extras,
);

/// Attaches the programs, says on stderr which ones run, and returns their links.
pub(super) fn attach_programs(
    bpf: &mut aya::Ebpf,
    layout: &arrivals::Layout,
    listening: &arrivals::Listening,
    btf: &KernelBtf,
) -> Result<Attached, AttachError> {
    // The fork and exit programs first: a child forked once the syscall programs run is
    // then always seen.
    let mut links = vec![];
    for (prog, cat, name) in PROGRAMS {
        links.push((prog, attach_tp(bpf, prog, cat, name)?));
    }
    let classic = std::env::var(CLASSIC_ENV).is_ok_and(|v| v == "1");
    let arrivals = arrivals::attach(bpf, layout, &mut links, classic, btf);
    let syscalls = if classic {
        Err(format!("{CLASSIC_ENV}=1"))
    } else {
        attach_btf(bpf, &BTF_SYSCALL_PROGRAMS, btf)
    };
    let programs = match syscalls {
        Ok(l) => {
            links.extend(l);
            "BTF-typed raw tracepoints (tp_btf/sys_enter, tp_btf/sys_exit)".to_string()
        }
        Err(why) => {
            for (prog, cat, name) in SYSCALL_PROGRAMS {
                links.push((prog, attach_tp(bpf, prog, cat, name)?));
            }
            format!("classic tracepoints (raw_syscalls:sys_enter, sys_exit), as tp_btf cannot be used: {why}")
        }
    };
    let throttle = match attach_btf(bpf, &THROTTLE_PROGRAMS, btf) {
        Ok(l) => {
            links.extend(l);
            "; throttle programs on tp_btf/sched_switch, sched_wakeup".to_string()
        }
        Err(why) => format!("; no throttled time in the scheduler's split: {why}"),
    };
    let reclaim = match attach_reclaim(bpf) {
        Ok(l) => {
            links.extend(l);
            "; reclaim programs on vmscan:mm_vmscan_memcg_reclaim_begin/end, mm_vmscan_direct_reclaim_begin/end".to_string()
        }
        Err(why) => format!("; no reclaim time in the scheduler's split: {why}"),
    };
    eprintln!(
        "stallscope: bpf syscall programs on {programs}{}{throttle}{reclaim}",
        arrival_programs(&arrivals, listening)
    );
    let extras = super::Extras {
        throttle: throttle.starts_with("; throttle"),
        reclaim: reclaim.starts_with("; reclaim"),
    };
    Ok((links, arrivals, extras))
}

/// What the startup line says of the arrival programs.
fn arrival_programs(
    arrivals: &Result<&'static str, String>,
    listening: &arrivals::Listening,
) -> String {
    let Ok(flavour) = arrivals else {
        return String::new();
    };
    let own = match (*flavour, listening.ports()) {
        ("tp_btf", Some(p)) => format!(
            ", skipping the data-ready of its own sends to local peers (listening ports {})",
            if p.is_empty() {
                "none".to_string()
            } else {
                p.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        _ => String::new(),
    };
    format!("; arrival programs on {flavour}{own}")
}

/// Starts tracing process `pid`: from here every thread of it is traced, including those
/// born meanwhile (the programs filter on the `tgids` map).
pub(super) fn start_tracing(bpf: &mut aya::Ebpf, pid: Tid) -> Result<(), AttachError> {
    let mut tgids: aya::maps::HashMap<_, u32, u32> = aya::maps::HashMap::try_from(
        bpf.map_mut("tgids")
            .ok_or_else(|| AttachError::Other("the BPF object lacks tgids".into()))?,
    )
    .map_err(|e| load_error("tgids", &e, None))?;
    tgids
        .insert(pid, 1, 0)
        .map_err(|e| load_error("cannot start tracing", &e, errno_of(&e)))?;
    let mut target: aya::maps::Array<_, KTarget> = aya::maps::Array::try_from(
        bpf.map_mut("target")
            .ok_or_else(|| AttachError::Other("the BPF object lacks target".into()))?,
    )
    .map_err(|e| load_error("target", &e, None))?;
    let t = KTarget {
        tgid: pid,
        children: 0,
    };
    target
        .set(0, t, 0)
        .map_err(|e| load_error("cannot start tracing", &e, errno_of(&e)))
}

/// Where tracefs is, for the format files.
pub(super) fn tracefs_events() -> Result<std::path::PathBuf, String> {
    tracefs::find_tracepoints().map(|t| t.events())
}

/// Checks the layouts the programs assume and returns sched_process_fork's child_pid offset.
pub(super) fn check_layouts() -> Result<u32, String> {
    let ev = tracefs_events()?;
    let read = |cat: &str, name: &str| tracefs::read_event_file(&ev, cat, name, "format");
    for (cat, name, field, want) in [
        ("raw_syscalls", "sys_enter", "id", 8),
        ("raw_syscalls", "sys_enter", "args", 16),
        ("raw_syscalls", "sys_exit", "id", 8),
        ("raw_syscalls", "sys_exit", "ret", 16),
    ] {
        let f = read(cat, name)?;
        if field_offset(&f, field) != Some(want) {
            return Err(format!(
                "the kernel's {cat}:{name} tracepoint does not have `{field}` at offset {want} (its format file differs from what the programs read)"
            ));
        }
    }
    read("sched", "sched_process_exit")?;
    let f = read("sched", "sched_process_fork")?;
    field_offset(&f, "child_pid")
        .ok_or_else(|| "sched:sched_process_fork has no child_pid field".to_string())
}

/// Turns aya's load and attach errors into the reason a user can act on.
pub(super) fn load_error(what: &str, e: &dyn std::fmt::Display, errno: Option<i32>) -> AttachError {
    let root = unsafe { libc::geteuid() } == 0;
    let hint = match errno {
        Some(libc::EPERM) | Some(libc::EACCES) if !root => {
            ": BPF needs root (or CAP_BPF and CAP_PERFMON)"
        }
        Some(libc::EPERM) | Some(libc::EACCES) => {
            ": refused even to root (kernel.unprivileged_bpf_disabled does not apply to root: a lockdown, a security module, or a container without CAP_BPF)"
        }
        Some(libc::ENOSYS) => ": this kernel has no bpf() system call (CONFIG_BPF_SYSCALL)",
        _ => "",
    };
    AttachError::Other(format!("{what}: {e}{hint}"))
}

/// The errno inside an aya error, if it carries one.
pub(super) fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = cur {
        if let Some(io) = x.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        cur = x.source();
    }
    None
}

/// The verifier's refusal in its own words: the last lines of its log say why.
pub(super) fn verifier_refusal(prog: &str, e: &aya::programs::ProgramError) -> AttachError {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    {
        let log = verifier_log.to_string();
        let lines: Vec<&str> = log
            .lines()
            .map(str::trim)
            .filter(|l| {
                !l.is_empty()
                    && !l.starts_with("processed ")
                    && !l.starts_with("verification time")
                    && !l.starts_with("stack depth")
            })
            .collect();
        let tail = lines[lines.len().saturating_sub(2)..].join("; ");
        return AttachError::Other(format!(
            "the kernel refused BPF program {prog} ({io_error}); the verifier said: {}",
            if tail.is_empty() { "nothing" } else { &tail }
        ));
    }
    load_error(&format!("cannot load BPF program {prog}"), e, errno_of(e))
}

/// An attached program, to detach it before the ring is emptied for the last time.
pub(super) enum Link {
    Tp(aya::programs::trace_point::TracePointLinkId),
    Btf(aya::programs::tp_btf::BtfTracePointLinkId),
}

/// The syscall programs on the BTF-typed raw tracepoints (preferred: the kernel fills no
/// trace record for them, and they read the task's counters with plain loads), and the same
/// programs on the classic tracepoints (kernels without BTF or tp_btf).
const BTF_SYSCALL_PROGRAMS: [(&str, &str); 2] =
    [("btf_sys_enter", "sys_enter"), ("btf_sys_exit", "sys_exit")];
const SYSCALL_PROGRAMS: [(&str, &str, &str); 2] = [
    ("sys_enter", "raw_syscalls", "sys_enter"),
    ("sys_exit", "raw_syscalls", "sys_exit"),
];
const PROGRAMS: [(&str, &str, &str); 2] = [
    ("process_fork", "sched", "sched_process_fork"),
    ("process_exit", "sched", "sched_process_exit"),
];

/// Loads and attaches a classic tracepoint program.
fn attach_tp(
    bpf: &mut aya::Ebpf,
    prog: &'static str,
    cat: &str,
    name: &str,
) -> Result<Link, AttachError> {
    let mut links = vec![];
    attach_each(bpf, prog, cat, &[name], &mut links)?;
    let (_, link) = links.pop().expect("one link per tracepoint");
    Ok(link)
}

/// Loads classic tracepoint program `prog` and attaches it to each tracepoint of `names`
/// (one program can run on several: the records it reads are laid out alike, or not read).
fn attach_each(
    bpf: &mut aya::Ebpf,
    prog: &'static str,
    cat: &str,
    names: &[&str],
    links: &mut Vec<(&'static str, Link)>,
) -> Result<(), AttachError> {
    let p: &mut aya::programs::TracePoint = bpf
        .program_mut(prog)
        .ok_or_else(|| AttachError::Other(format!("the BPF object lacks {prog}")))?
        .try_into()
        .map_err(|e| load_error(prog, &e, None))?;
    p.load().map_err(|e| verifier_refusal(prog, &e))?;
    for name in names {
        let id = p.attach(cat, name).map_err(|e| {
            load_error(
                &format!("cannot attach BPF program {prog} to {cat}:{name}"),
                &e,
                errno_of(&e),
            )
        })?;
        links.push((prog, Link::Tp(id)));
    }
    Ok(())
}

/// The programs that split a thread's wait for a CPU into the part its cgroup was throttled
/// (the Throttling section of the C source): tp_btf only (they read the scheduler's
/// runqueues through BTF); without them the split has no throttled part.
const THROTTLE_PROGRAMS: [(&str, &str); 2] = [
    ("btf_throttle_switch", "sched_switch"),
    ("btf_throttle_wakeup", "sched_wakeup"),
];

/// The programs that time a thread's own memory reclaim (the Reclaim section of the C
/// source), on classic tracepoints: one program per edge of a reclaim, on both reclaim
/// paths' tracepoints (memcg and direct). All four attachments or none (a kernel without the
/// vmscan tracepoints, or one that renamed them, leaves the split without a reclaim part).
const RECLAIM_PROGRAMS: [(&str, &str, [&str; 2]); 2] = [
    (
        "reclaim_begin",
        "vmscan",
        [
            "mm_vmscan_memcg_reclaim_begin",
            "mm_vmscan_direct_reclaim_begin",
        ],
    ),
    (
        "reclaim_end",
        "vmscan",
        [
            "mm_vmscan_memcg_reclaim_end",
            "mm_vmscan_direct_reclaim_end",
        ],
    ),
];

/// Loads and attaches the reclaim programs, all or none (then says why): the full tier's,
/// and the cheap tier's (`cheap::CheapTracer`, whose records carry the same reclaim time).
pub(super) fn attach_reclaim(bpf: &mut aya::Ebpf) -> Result<Vec<(&'static str, Link)>, String> {
    let mut links = vec![];
    for (prog, cat, names) in RECLAIM_PROGRAMS {
        if let Err(e) = attach_each(bpf, prog, cat, &names, &mut links) {
            for (prog, link) in links {
                detach(bpf, prog, link);
            }
            return Err(e.to_string());
        }
    }
    Ok(links)
}

/// Loads and attaches tp_btf programs (name, tracepoint), all or none, or says why they
/// cannot run here.
fn attach_btf(
    bpf: &mut aya::Ebpf,
    progs: &[(&'static str, &str)],
    btf: &KernelBtf,
) -> Result<Vec<(&'static str, Link)>, String> {
    let btf = btf.as_ref().map_err(String::clone)?;
    let mut links = vec![];
    for &(prog, tp) in progs {
        let p: &mut aya::programs::BtfTracePoint = bpf
            .program_mut(prog)
            .ok_or_else(|| format!("the BPF object lacks {prog}"))?
            .try_into()
            .map_err(|e| format!("{prog}: {e}"))?;
        let r = match p.load(tp, btf) {
            Err(e) => Err(verifier_refusal(prog, &e).to_string()),
            Ok(()) => p
                .attach()
                .map_err(|e| format!("cannot attach {prog} to tp_btf/{tp}: {e}")),
        };
        match r {
            Ok(id) => links.push((prog, Link::Btf(id))),
            Err(e) => {
                for (prog, link) in links {
                    detach(bpf, prog, link);
                }
                return Err(e);
            }
        }
    }
    Ok(links)
}

pub(super) fn detach(bpf: &mut aya::Ebpf, prog: &str, link: Link) {
    let Some(p) = bpf.program_mut(prog) else {
        return;
    };
    match link {
        Link::Tp(id) => {
            let p: Result<&mut aya::programs::TracePoint, _> = p.try_into();
            if let Ok(p) = p {
                let _ = p.detach(id);
            }
        }
        Link::Btf(id) => {
            let p: Result<&mut aya::programs::BtfTracePoint, _> = p.try_into();
            if let Ok(p) = p {
                let _ = p.detach(id);
            }
        }
    }
}
