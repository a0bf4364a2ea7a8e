//! The cheap tier of the bpf backend, `watch`'s default mode: the kernel programs of
//! bpf/stallscope.bpf.c's "cheap tier" section loaded on their own (no syscall tracepoint:
//! `sched_switch` as a BTF-typed raw tracepoint, a perf software event sampling the main
//! thread's CPU time), and their records read from their own small ring as `CheapRecord`s: a watched thread that was
//! blocked in a syscall past the threshold, and a main-thread stretch past the threshold on a
//! CPU (or waiting for one) without a read or write; each with the time the thread spent
//! reclaiming memory in it (the Reclaim section's programs on vmscan's tracepoints, loaded
//! with the tier's own). What the records mean is for the
//! watcher (`watch::cheap`); this module only loads, attaches and reads.

use super::load::{errno_of, load_error, verifier_refusal};
use super::{NR_MAX, OBJECT};
use crate::event::{Nanos, Tid};
use crate::live::decode;
use crate::live::AttachError;
use crate::syscalls::Facts;

/// Record kinds and the idle kinds of `cheap_idle_nr`, as in bpf/stallscope.bpf.c.
const CHEAP_BLOCKED: u32 = 1;
const CHEAP_GAP: u32 = 2;
const CHEAP_IDLE_ANY: u32 = 1;
const CHEAP_IDLE_BG: u32 = 2;

/// `struct cheap_rec`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawRec {
    kind: u32,
    tid: u32,
    nr: i64,
    args: [u64; 3],
    start: u64,
    end: u64,
    state: u32,
    samples: u32,
    /// `struct sched_snap`: its counters, of which the cheap tier sets the first four and the
    /// sixth, the reclaim time (the fifth is the full tier's throttled time, not read here).
    before: [u64; crate::live::bpf::SNAP],
    after: [u64; crate::live::bpf::SNAP],
    /// The process of the thread (a watched one, or a forked child of it) and the watched
    /// process it belongs to.
    tgid: u32,
    owner: u32,
}

/// Words of `cheap_tgid_bits` (a bit per tgid modulo their number times 64).
const BITS_WORDS: u32 = 64;

/// `struct cheap_target`: a watched process's own entry (a child's are the kernel's).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KCheapTarget {
    owner: u32,
    main_tid: u32,
}
// SAFETY: plain old data, the layout of `struct cheap_target` in the C source.
unsafe impl aya::Pod for KCheapTarget {}

/// What the programs are loaded with: the same for every process they watch.
#[derive(Clone, Debug)]
pub struct CheapConfig {
    pub threshold_ns: Nanos,
    /// The sampling period of the main thread's CPU time (task-clock), ns.
    pub sample_period_ns: u64,
    /// Watch the blocked calls of the processes it forks (a BGSAVE or AOF rewrite child)
    /// as its own threads'.
    pub follow_forks: bool,
}

/// What a record says happened.
#[derive(Clone, Debug, PartialEq)]
pub enum CheapKind {
    /// Switched out blocked and back in after the threshold: in syscall `nr` (-1: not in a
    /// syscall, a page fault) with its first arguments from the saved registers.
    Blocked {
        nr: i64,
        args: [u64; 3],
        uninterruptible: bool,
    },
    /// No read or write for the span while on a CPU or runnable; `samples`: checks that saw
    /// the counts unchanged.
    Gap { samples: u32 },
}

#[derive(Clone, Debug)]
pub struct CheapRecord {
    /// The watched process it belongs to (whose instance it goes to).
    pub owner: Tid,
    pub tid: Tid,
    /// The process of the thread: the watched process, or a child it forked.
    pub tgid: Tid,
    pub kind: CheapKind,
    /// On the monotonic clock (the full tier's too).
    pub start: Nanos,
    pub end: Nanos,
    /// The thread's scheduler counters at the start and at the end, as `live::sched_delta`
    /// takes them.
    pub before: [u64; 4],
    pub after: [u64; 4],
    /// The time the thread spent reclaiming memory itself within the record's span, exact
    /// (the memcg and direct reclaim tracepoints); None where the reclaim programs could not
    /// be attached.
    pub reclaim_ns: Option<u64>,
}

/// The cheap tier's programs, attached; dropping it detaches and unloads them. One set
/// watches any number of processes (`watch`/`unwatch`): their records say whose they are.
pub struct CheapTracer {
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    bpf: aya::Ebpf,
    drops_seen: u64,
    /// The watched processes (tgid, main thread).
    targets: Vec<(Tid, Tid)>,
    cfg: CheapConfig,
    misread_said: bool,
    /// The reclaim programs run: the records' reclaim time is measured.
    reclaim: bool,
}

impl CheapTracer {
    /// Loads the cheap tier's programs from the embedded object (the full tier's maps made as
    /// small as the kernel allows: it loads none of their programs) and attaches them,
    /// watching no process yet.
    pub fn attach(cfg: &CheapConfig) -> Result<CheapTracer, AttachError> {
        let threshold = cfg.threshold_ns.max(1) as u64;
        let page = crate::live::page_size() as u32;
        let mut loader = aya::EbpfLoader::new();
        loader
            .set_global("cheap_threshold_ns", &threshold, true)
            .set_max_entries("events", page)
            .set_max_entries("inflight", 1)
            .set_max_entries("arrival_stamps", 1)
            .set_max_entries("tgids", 1)
            .set_max_entries("throttle", 1)
            // The watched threads that reclaimed (`cheap_threads` holds as many).
            .set_max_entries("reclaim", 4096);
        let mut bpf = loader
            .load(OBJECT)
            .map_err(|e| load_error("cannot load the BPF object", &e, errno_of(&e)))?;
        drop(loader);
        fill_idle(&mut bpf)?;
        let btf = super::load::kernel_btf().map_err(|e| {
            AttachError::Other(format!(
                "the cheap tier needs the kernel's BTF (/sys/kernel/btf/vmlinux): {e}; use --mode full"
            ))
        })?;
        attach_btf(&mut bpf, &btf, "cheap_switch", "sched_switch")?;
        attach_btf(&mut bpf, &btf, "cheap_exit", "sched_process_exit")?;
        if cfg.follow_forks {
            attach_btf(&mut bpf, &btf, "cheap_fork", "sched_process_fork")?;
        }
        drop(btf);
        let reclaim = match super::load::attach_reclaim(&mut bpf) {
            Ok(_) => true,
            Err(why) => {
                eprintln!("stallscope: warning: the cheap tier cannot time memory reclaim ({why}): a stall spent reclaiming memory is not named memory-reclaim");
                false
            }
        };
        attach_sampler(&mut bpf, cfg, None)?;
        let ring = bpf
            .take_map("cheap_events")
            .ok_or_else(|| AttachError::Other("the BPF object lacks cheap_events".into()))?;
        let ring = aya::maps::RingBuf::try_from(ring)
            .map_err(|e| load_error("cannot map the cheap ring buffer", &e, errno_of(&e)))?;
        Ok(CheapTracer {
            ring,
            bpf,
            drops_seen: 0,
            targets: vec![],
            cfg: cfg.clone(),
            misread_said: false,
            reclaim,
        })
    }

    /// Starts watching process `pid`, whose main thread is `main_tid`.
    pub fn watch(&mut self, pid: Tid, main_tid: Tid) -> Result<(), AttachError> {
        crate::live::check_target(pid)?;
        let mut m: aya::maps::HashMap<_, u32, KCheapTarget> = aya::maps::HashMap::try_from(
            self.bpf
                .map_mut("cheap_target")
                .ok_or_else(|| AttachError::Other("the BPF object lacks cheap_target".into()))?,
        )
        .map_err(|e| load_error("cheap_target", &e, None))?;
        let t = KCheapTarget {
            owner: pid,
            main_tid,
        };
        m.insert(pid, t, 0)
            .map_err(|e| load_error("cannot start watching", &e, errno_of(&e)))?;
        self.targets.retain(|(p, _)| *p != pid);
        self.targets.push((pid, main_tid));
        if per_task() {
            attach_sampler(&mut self.bpf, &self.cfg, Some(main_tid))?;
        }
        self.set_bits()
    }

    /// Stops watching process `pid` (gone, or no longer wanted).
    pub fn unwatch(&mut self, pid: Tid) {
        self.targets.retain(|(p, _)| *p != pid);
        // Bits first: a switch that still finds the entry is harmless, one that finds the bit
        // and no entry just looks in vain.
        let _ = self.set_bits();
        if let Some(m) = self.bpf.map_mut("cheap_target") {
            if let Ok(mut m) = aya::maps::HashMap::<_, u32, KCheapTarget>::try_from(m) {
                let _ = m.remove(&pid);
            }
        }
    }

    /// Rewrites `cheap_tgid_bits` from the watched set (a bit can be shared by two tgids).
    fn set_bits(&mut self) -> Result<(), AttachError> {
        let mut words = [0u64; BITS_WORDS as usize];
        for (p, _) in &self.targets {
            words[((p >> 6) % BITS_WORDS) as usize] |= 1 << (p & 63);
        }
        let mut m: aya::maps::Array<_, u64> =
            aya::maps::Array::try_from(self.bpf.map_mut("cheap_tgid_bits").ok_or_else(|| {
                AttachError::Other("the BPF object lacks cheap_tgid_bits".into())
            })?)
            .map_err(|e| load_error("cheap_tgid_bits", &e, None))?;
        for (i, w) in words.iter().enumerate() {
            m.set(i as u32, w, 0)
                .map_err(|e| load_error("cannot set cheap_tgid_bits", &e, errno_of(&e)))?;
        }
        Ok(())
    }

    /// Appends the records the kernel has sent since the last call.
    pub fn poll(&mut self, out: &mut Vec<CheapRecord>) {
        while let Some(item) = self.ring.next() {
            match parse(&item) {
                Some(mut r) => {
                    if !self.reclaim {
                        r.reclaim_ns = None;
                    }
                    out.push(r)
                }
                None if !self.misread_said => {
                    self.misread_said = true;
                    eprintln!(
                        "stallscope: warning: the cheap tier sent a record of {} bytes, which this build does not read ({} expected): its BPF object and its code disagree; such records are dropped",
                        item.len(),
                        std::mem::size_of::<RawRec>()
                    );
                }
                None => {}
            }
        }
    }

    /// Records the kernel had no room for since the last call.
    pub fn take_drops(&mut self) -> u64 {
        let Some(m) = self.bpf.map("cheap_drops") else {
            return 0;
        };
        let Ok(arr) = aya::maps::PerCpuArray::<_, u64>::try_from(m) else {
            return 0;
        };
        let total: u64 = arr.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0);
        let new = total.saturating_sub(self.drops_seen);
        self.drops_seen = total;
        new
    }
}

/// The call a blocked record was in, decoded as the full tier decodes a call read after the
/// fact (its fd, a path argument read from process `tgid`'s memory); None outside a syscall.
pub fn call_of(r: &CheapRecord, tgid: Tid) -> Option<crate::event::Syscall> {
    let CheapKind::Blocked { nr, args, .. } = &r.kind else {
        return None;
    };
    if *nr < 0 {
        return None;
    }
    let info = decode::nr_info(*nr);
    let mut sc = crate::event::Syscall::with(info.name, info.sys);
    let all = [args[0], args[1], args[2], 0, 0, 0];
    let forked = rustc_hash::FxHashMap::default();
    let late = decode::Args::Late {
        args: &all,
        tgid,
        forked: &forked,
    };
    decode::call(&mut sc, &info, None, r.end - r.start, late);
    Some(sc)
}

/// None for a record that is not one: of another length than `RawRec` (the C struct grew
/// without this one: each field after the change would be misread, as the scheduler
/// counters once were when `struct sched_snap` gained its fifth) or of an unknown kind.
fn parse(b: &[u8]) -> Option<CheapRecord> {
    if b.len() != std::mem::size_of::<RawRec>() {
        return None;
    }
    // SAFETY: `RawRec` is `repr(C)` of integers only; the record is exactly that long.
    let r: RawRec = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
    let kind = match r.kind {
        CHEAP_BLOCKED => CheapKind::Blocked {
            nr: r.nr,
            args: r.args,
            // TASK_UNINTERRUPTIBLE: a disk wait, not a sleep or a wait on a socket.
            uninterruptible: r.state & 2 != 0,
        },
        CHEAP_GAP => CheapKind::Gap { samples: r.samples },
        _ => return None,
    };
    Some(CheapRecord {
        tgid: r.tgid,
        owner: r.owner,
        tid: r.tid,
        kind,
        start: r.start as Nanos,
        end: r.end as Nanos,
        before: first4(&r.before),
        after: first4(&r.after),
        reclaim_ns: Some(r.after[5].saturating_sub(r.before[5])),
    })
}

/// A `struct sched_snap`'s counters as `live::sched_delta` takes them (its fifth, the full
/// tier's throttled time, is not measured by the cheap tier; its sixth, the reclaim time,
/// is the record's `reclaim_ns`).
fn first4(v: &[u64; crate::live::bpf::SNAP]) -> [u64; 4] {
    [v[0], v[1], v[2], v[3]]
}

/// Tells the programs which syscalls are a wait for work, by the syscall table's facts.
fn fill_idle(bpf: &mut aya::Ebpf) -> Result<(), AttachError> {
    let mut m: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
        bpf.map_mut("cheap_idle_nr")
            .ok_or_else(|| AttachError::Other("the BPF object lacks cheap_idle_nr".into()))?,
    )
    .map_err(|e| load_error("cheap_idle_nr", &e, None))?;
    for nr in 0..NR_MAX {
        let f = crate::syscalls::info(crate::live::sysnames::syscall_name(nr)).facts;
        let k = if f.has(Facts::ALWAYS_IDLE | Facts::EPOLL | Facts::POLL | Facts::ACCEPT) {
            CHEAP_IDLE_ANY
        } else if f.has(Facts::BG_WAIT) {
            CHEAP_IDLE_BG
        } else {
            continue;
        };
        m.set(nr as u32, k, 0)
            .map_err(|e| load_error("cannot fill cheap_idle_nr", &e, errno_of(&e)))?;
    }
    Ok(())
}

/// Loads program `prog` and attaches it to the BTF-typed raw tracepoint `tp`.
fn attach_btf(
    bpf: &mut aya::Ebpf,
    btf: &aya::Btf,
    prog: &str,
    tp: &str,
) -> Result<(), AttachError> {
    let p: &mut aya::programs::BtfTracePoint = bpf
        .program_mut(prog)
        .ok_or_else(|| AttachError::Other(format!("the BPF object lacks {prog}")))?
        .try_into()
        .map_err(|e| load_error(prog, &e, None))?;
    p.load(tp, btf).map_err(|e| verifier_refusal(prog, &e))?;
    p.attach().map_err(|e| {
        load_error(
            &format!("cannot attach {prog} to tp_btf/{tp}"),
            &e,
            errno_of(&e),
        )
    })?;
    Ok(())
}

/// For measurement only (bench/watch.sh's A/B): `task` samples with a task-clock event
/// opened on each watched main thread instead of a cpu-clock event per CPU.
pub const SAMPLER_ENV: &str = "STALLSCOPE_CHEAP_SAMPLER";

fn per_task() -> bool {
    std::env::var(SAMPLER_ENV).is_ok_and(|v| v == "task")
}

/// The main thread's time on a CPU, sampled every `sample_period_ns`: a cpu-clock event on
/// each CPU, whose program keeps only the samples that find the main thread running. An
/// event opened on the thread itself (task-clock) samples only its time too, but it lives in
/// the thread's perf context, which the kernel switches out and in (a timer cancelled and
/// armed) at each of the thread's context switches: redis's cost, paid per switch, where a
/// per-CPU event costs a sample every period whoever runs.
/// With `main_tid` (the task-clock A/B, `SAMPLER_ENV`), its own event; without, the per-CPU
/// events (loading the program first).
fn attach_sampler(
    bpf: &mut aya::Ebpf,
    cfg: &CheapConfig,
    main_tid: Option<Tid>,
) -> Result<(), AttachError> {
    use aya::programs::perf_event::{perf_sw_ids, PerfEventScope, PerfTypeId, SamplePolicy};
    let prog = "cheap_sample";
    let p: &mut aya::programs::PerfEvent = bpf
        .program_mut(prog)
        .ok_or_else(|| AttachError::Other(format!("the BPF object lacks {prog}")))?
        .try_into()
        .map_err(|e| load_error(prog, &e, None))?;
    let scopes: Vec<(u64, PerfEventScope)> = match main_tid {
        Some(pid) => vec![(
            perf_sw_ids::PERF_COUNT_SW_TASK_CLOCK as u64,
            PerfEventScope::OneProcessAnyCpu { pid },
        )],
        None => {
            p.load().map_err(|e| verifier_refusal(prog, &e))?;
            if per_task() {
                return Ok(());
            }
            online_cpus()
                .into_iter()
                .map(|cpu| {
                    (
                        perf_sw_ids::PERF_COUNT_SW_CPU_CLOCK as u64,
                        PerfEventScope::AllProcessesOneCpu { cpu },
                    )
                })
                .collect()
        }
    };
    for (config, scope) in scopes {
        p.attach(
            PerfTypeId::Software,
            config,
            scope,
            SamplePolicy::Period(cfg.sample_period_ns),
            false,
        )
        .map_err(|e| {
            load_error(
                "cannot sample the main thread's CPU time (perf cpu-clock)",
                &e,
                errno_of(&e),
            )
        })?;
    }
    Ok(())
}

/// The CPUs that are online (/sys/devices/system/cpu/online: "0-3,6").
fn online_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = vec![];
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
            cpus.extend(a..=b);
        }
    }
    if cpus.is_empty() {
        cpus.extend(0..std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_the_kernel_laid_it_out() {
        // struct sched_snap holds 6 counters (the throttled time and the reclaim time came
        // with issue 41).
        assert_eq!(std::mem::size_of::<RawRec>(), 168);
        let mut b = vec![0u8; 168];
        b[160..164].copy_from_slice(&40u32.to_ne_bytes());
        // `after`'s on-CPU time, at its own offset (after `before`'s six counters).
        b[112..120].copy_from_slice(&9u64.to_ne_bytes());
        b[0..4].copy_from_slice(&CHEAP_BLOCKED.to_ne_bytes());
        b[4..8].copy_from_slice(&42u32.to_ne_bytes());
        b[8..16].copy_from_slice(&3i64.to_ne_bytes());
        b[16..24].copy_from_slice(&7u64.to_ne_bytes());
        b[40..48].copy_from_slice(&1_000u64.to_ne_bytes());
        b[48..56].copy_from_slice(&401_000u64.to_ne_bytes());
        b[56..60].copy_from_slice(&2u32.to_ne_bytes());
        // before: six counters from 64, after: six from 112 (the first four of each read).
        b[64..72].copy_from_slice(&5u64.to_ne_bytes());
        b[96..104].copy_from_slice(&99u64.to_ne_bytes());
        b[164..168].copy_from_slice(&39u32.to_ne_bytes());
        // The sixth counters, the reclaim time: `before`'s at 104, `after`'s at 152.
        b[104..112].copy_from_slice(&1_000u64.to_ne_bytes());
        b[152..160].copy_from_slice(&31_000u64.to_ne_bytes());
        let r = parse(&b).expect("parsed");
        assert_eq!(r.reclaim_ns, Some(30_000));
        assert_eq!((r.tgid, r.owner, r.tid), (40, 39, 42));
        assert_eq!((r.start, r.end), (1_000, 401_000));
        assert_eq!((r.before, r.after), ([5, 0, 0, 0], [9, 0, 0, 0]));
        assert_eq!(
            r.kind,
            CheapKind::Blocked {
                nr: 3,
                args: [7, 0, 0],
                uninterruptible: true,
            }
        );
        b[0..4].copy_from_slice(&CHEAP_GAP.to_ne_bytes());
        b[60..64].copy_from_slice(&90u32.to_ne_bytes());
        let r = parse(&b).expect("parsed");
        assert_eq!(r.kind, CheapKind::Gap { samples: 90 });
        assert!(parse(&b[..167]).is_none());
        assert!(parse(&[b.clone(), vec![0; 8]].concat()).is_none());
    }
}
