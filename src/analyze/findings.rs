//! Diagnosis: the last analyzer. It names the cause of each stall (reusing redis's LATENCY
//! DOCTOR event names where one fits, so users can connect the two tools) and turns the
//! stalls and statistics into findings: a headline, the evidence, and the advice a redis
//! expert would give with its trade-off. A stall no rule explains says so plainly.

use super::coverage::GapVerdict;
use super::file_time::FileTime;
use super::holds::Held;
use super::phases::Phases;
use super::roles::Role;
use super::stalls::Cand;
use super::world::World;
use crate::fdtable::FileClass;
use crate::redis_conf::RedisConf;
use crate::report::{Bound, CommandStats, Finding, Severity, Stall, StallKind};
use std::collections::BTreeMap;

pub use crate::units::{human, plural};

fn class_words(c: FileClass) -> &'static str {
    match c {
        FileClass::Aof => "the AOF",
        FileClass::AofManifest => "the AOF manifest",
        FileClass::AofRewriteTemp => "the AOF rewrite temp file",
        FileClass::Rdb => "the RDB file",
        FileClass::RdbTemp => "the RDB temp file",
        FileClass::Log => "the log file",
        FileClass::Client => "a client socket",
        FileClass::Listener => "the listening socket",
        FileClass::Replica => "a replication link",
        FileClass::Pipe => "a pipe",
        FileClass::Epoll => "the epoll fd",
        FileClass::Dir => "a directory",
        FileClass::Proc => "a /proc file",
        FileClass::Other => "a file",
        FileClass::Unknown => "an fd of unknown type",
    }
}

/// What the findings read from the other units: an explicit input instead of the
/// analyzer's fields.
pub(crate) struct Evidence<'a> {
    pub(crate) phases: &'a Phases,
    pub(crate) file_time: &'a FileTime,
    pub(crate) world: &'a World,
    /// Why gaps cannot be trusted, when they cannot.
    pub(crate) gaps: Option<&'a GapVerdict>,
    pub(crate) conf: Option<&'a RedisConf>,
    pub(crate) threshold_us: i64,
}

fn overlaps_bio_fsync(a: &Evidence<'_>, c: &Cand) -> bool {
    a.file_time.overlaps_bio_fsync(c.start, c.start + c.dur)
}

/// (finding id, plain-words cause) for one stall.
pub(crate) fn explain(a: &Evidence<'_>, c: &Cand, role: Role) -> (Option<String>, String) {
    let d = human(c.dur / 1000);
    let bound = match c.bound {
        Bound::AtLeast => "at least ",
        Bound::AtMost => "at most ",
        Bound::Exact => "",
    };
    let edge = match c.in_flight {
        Some(crate::event::InFlight::AtStart) => " (already running when tracing began)",
        Some(crate::event::InFlight::AtEnd) => " (still running when tracing ended)",
        None => "",
    };
    let who = match role {
        Role::Main => "main thread".to_string(),
        Role::Child => format!("background child {}", c.proc),
        r => format!("{} thread {}", r.as_str(), c.tid),
    };
    let during = c
        .phase
        .and_then(|p| a.phases.get(p))
        .map(|p| format!(" while child {} ran", p.child))
        .unwrap_or_default();
    let id = |s: &str| Some(s.to_string());
    if c.kind == StallKind::Gap {
        return match role {
            Role::Main if c.phase.is_some() => (
                id("cow-page-faults"),
                format!("{who} made no syscall for {d}{during}: copy-on-write page faults after fork (or CPU contention)"),
            ),
            Role::Main => (id("command"), format!("{who} made no syscall for {d}: a slow command, or the process was descheduled")),
            _ => (None, format!("{who} made no syscall for {d} (CPU work or descheduled); no finding explains it")),
        };
    }
    let name = c.syscall.unwrap_or("?");
    let file = c.file.map(|f| a.world.file(f));
    let class = file.map(|f| f.class).unwrap_or(FileClass::Unknown);
    let what = match file {
        Some(f) => match (&f.path, f.class) {
            (Some(p), FileClass::Client) => format!("{} ({p})", class_words(f.class)),
            (Some(p), _) => format!(
                "{} {}",
                class_words(f.class),
                p.rsplit('/').next().unwrap_or(p)
            ),
            (None, _) => class_words(f.class).to_string(),
        },
        None => match c.fd {
            Some(fd) => format!("fd {fd}"),
            None => String::new(),
        },
    };
    let on = if what.is_empty() {
        String::new()
    } else {
        format!(" on {what}")
    };
    let base = format!("{who} blocked {bound}{d} in {name}(){on}{edge}");
    let (fid, why): (Option<String>, String) = match (role, class, name) {
        (Role::Main, _, "nanosleep" | "clock_nanosleep" | "pause") => (
            id("command"),
            "the main thread slept: a command that sleeps (DEBUG SLEEP, a module or script) holds every client".into(),
        ),
        (Role::Main, _, "poll" | "ppoll" | "select" | "pselect6" | "rt_sigtimedwait" | "rt_sigsuspend") => (
            id("command"),
            "the main thread waited outside its event loop: synchronous I/O (MIGRATE, a replication \
             handshake with the master, a module) holds every client"
                .into(),
        ),
        (Role::Main, _, "clone" | "clone3" | "fork" | "vfork") => {
            (id("fork"), "fork() copies the page tables of the whole dataset in the main thread".into())
        }
        (Role::Child, FileClass::Proc, _)
            if file
                .and_then(|f| f.path.as_deref())
                .is_some_and(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("smaps"))) =>
        {
            (
                id("child-cow-report"),
                "the save child reads /proc/self/smaps to report its copy-on-write memory, and the kernel \
                 walks every mapping to answer; not client-facing"
                    .into(),
            )
        }
        (Role::Child, _, _) if class.is_disk_file() => {
            (id("child-disk-io"), "the save child waits on the disk; not client-facing by itself".into())
        }
        (Role::BioAof, c2, "fdatasync" | "fsync") if c2.is_aof() => (
            id("aof-fsync-background"),
            "the background AOF fsync waited on the disk; redis blocks writers only after 2 s".into(),
        ),
        (Role::Main | Role::IoThread, c2, _) if c2.is_aof() && c.phase.is_some() => (
            id("aof-write-active-child"),
            format!("AOF I/O in the main thread competes with the child's writes{during}"),
        ),
        (Role::Main, c2, "fdatasync" | "fsync") if c2.is_aof() => {
            (id("aof-fsync-always"), "appendfsync always: the main thread fsyncs the AOF before replying".into())
        }
        (Role::Main | Role::IoThread, c2, _) if c2.is_aof() && overlaps_bio_fsync(a, c) => (
            id("aof-write-pending-fsync"),
            "write() to the AOF waited behind the background thread's fdatasync of it".into(),
        ),
        (Role::Main | Role::IoThread, c2, _) if c2.is_aof() => {
            (id("aof-write-alone"), "write() to the AOF blocked with no fsync or child to blame: the disk is saturated".into())
        }
        (r, FileClass::Log, _) if r != Role::Child => (
            id("log-file-blocking"),
            format!("redis opens, writes and closes its log file per log line, in the main thread{during}"),
        ),
        (Role::Main, FileClass::Client, _) if c.phase.is_some() => (
            id("cow-page-faults"),
            format!("a socket call does not wait for the disk; slowed by page faults or CPU contention{during}"),
        ),
        (Role::Main, c2, _) if c2.is_disk_file() => {
            (id("disk-contention"), "file I/O in the main thread waited on a busy disk".into())
        }
        (Role::Main, FileClass::Unknown, "close") if c.file.is_none() && c.in_flight.is_some() => (
            None,
            "the fd was opened before tracing began, so its file is unknown; in redis a close() \
             that blocks the main thread for long is most often the log file, which is closed \
             after every log line (rerun with -y, or attach earlier, to confirm)"
                .into(),
        ),
        _ => (None, "no finding explains it".into()),
    };
    (fid, format!("{base}: {why}"))
}

struct ByFinding {
    n: u64,
    total: i64,
    worst: i64,
    worst_line: Option<u64>,
    worst_path: Option<String>,
    /// Distinct commands held by any of the stalls.
    held: std::collections::HashSet<u64>,
}

/// All findings, most severe first.
pub(crate) fn findings(
    a: &Evidence<'_>,
    held: &[Held],
    commands: &[CommandStats],
    stalls: &[Stall],
) -> Vec<Finding> {
    let mut by: BTreeMap<String, ByFinding> = BTreeMap::new();
    for (c, s) in held.iter().zip(stalls) {
        if let Some(f) = &s.finding {
            let e = by.entry(f.clone()).or_insert(ByFinding {
                n: 0,
                total: 0,
                worst: 0,
                worst_line: None,
                worst_path: None,
                held: Default::default(),
            });
            e.n += 1;
            e.total += s.duration_us;
            e.held.extend(c.seqs.iter().copied());
            if s.duration_us >= e.worst {
                e.worst = s.duration_us;
                e.worst_line = s.line;
                e.worst_path = s.path.clone();
            }
        }
    }
    let mut out = vec![];
    let thr = a.threshold_us;
    let stall_evidence = |e: &ByFinding| {
        let at = e
            .worst_line
            .map(|l| format!(" (line {l})"))
            .unwrap_or_default();
        let path = e
            .worst_path
            .as_ref()
            .map(|p| format!(" on {p}"))
            .unwrap_or_default();
        let held = if e.held.is_empty() {
            String::new()
        } else {
            format!(
                "; {} client command{} waited through them",
                e.held.len(),
                plural(e.held.len() as u64)
            )
        };
        format!(
            "{} stall{} over {}, {} in total, worst {}{path}{at}{held}",
            e.n,
            plural(e.n),
            human(thr),
            human(e.total),
            human(e.worst)
        )
    };
    let sev = |e: Option<&ByFinding>, base: Severity| match e {
        Some(e) if e.worst >= 100_000 => Severity::Critical,
        Some(_) => base.max(Severity::Warning),
        None => base,
    };

    // aof-fsync-always fires on the pattern even when no single fsync crosses the threshold:
    // every write command pays for one.
    let main_aof_fsync = a.file_time.main_aof_fsync(a.world);
    if main_aof_fsync.0 >= 10 || by.contains_key("aof-fsync-always") {
        let e = by.get("aof-fsync-always");
        let (n, p50, p99, max) = main_aof_fsync;
        let mut ev = format!(
            "{n} fdatasync()/fsync() calls on the AOF in the main thread: p50 {}, p99 {}, max {}",
            human(p50),
            human(p99),
            human(max)
        );
        let heavy: Vec<String> = commands
            .iter()
            .filter(|c| c.phase == "all" && c.aof_us > 0 && c.calls > 0)
            .take(3)
            .map(|c| {
                format!(
                    "{} p50 {} ({} per call in AOF syscalls)",
                    c.command,
                    human(c.p50_us),
                    human(c.aof_us / c.calls as i64)
                )
            })
            .collect();
        if !heavy.is_empty() {
            ev.push_str(&format!("; {}", heavy.join(", ")));
        }
        if let Some(e) = e {
            ev.push_str(&format!("; {}", stall_evidence(e)));
        }
        out.push(Finding {
            id: "aof-fsync-always".into(),
            severity: sev(e, Severity::Warning),
            title: "appendfsync always: every write command waits for an fsync of the AOF".into(),
            evidence: ev,
            advice: "Set `appendfsync everysec`: the fsync moves to a background thread and writes stop waiting for the disk. \
                     Trade-off: up to about 1 s of acknowledged writes can be lost on a crash (none with `always`). If every \
                     write must be durable, keep `always` and put the AOF on a faster disk (local NVMe, write-back cache)."
                .into(),
            stalls: e.map_or(0, |e| e.n),
        });
    }
    if let Some(e) = by.get("aof-write-active-child") {
        let dur = a
            .phases
            .iter()
            .filter_map(|p| p.end.map(|end| end - p.start))
            .max()
            .map(|d| human(d / 1000))
            .unwrap_or_else(|| "the child's lifetime".into());
        out.push(Finding {
            id: "aof-write-active-child".into(),
            severity: sev(Some(e), Severity::Warning),
            title: "AOF writes/fsyncs in the main thread stall while a BGSAVE/AOF-rewrite child writes".into(),
            evidence: stall_evidence(e),
            advice: format!(
                "Set `no-appendfsync-on-rewrite yes`: redis skips the AOF fsync while a child writes. Trade-off: on a crash \
                 you can lose up to the rewrite's duration of writes (here up to {dur}). Alternatives: `appendfsync everysec`, \
                 rewrite less often (raise `auto-aof-rewrite-percentage`/`auto-aof-rewrite-min-size`) or off-peak, or give \
                 the AOF its own disk."
            ),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("aof-write-pending-fsync") {
        out.push(Finding {
            id: "aof-write-pending-fsync".into(),
            severity: sev(Some(e), Severity::Warning),
            title: "write() to the AOF blocked behind the background fsync (appendfsync everysec on a slow disk)".into(),
            evidence: stall_evidence(e),
            advice: "The bio thread's fdatasync is slow, so the main thread's write() to the same file waits for it \
                     (redis logs \"Asynchronous AOF fsync is taking too long\"). Put the AOF on a faster or less contended disk; \
                     `no-appendfsync-on-rewrite yes` helps when it happens during rewrites (with its data-loss trade-off)."
                .into(),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("aof-write-alone") {
        out.push(Finding {
            id: "aof-write-alone".into(),
            severity: sev(Some(e), Severity::Warning),
            title: "write() to the AOF blocked with no fsync or child running".into(),
            evidence: stall_evidence(e),
            advice: "Something else saturates the disk (or its page-cache writeback): find the other writer (iostat -x, \
                     pidstat -d), move the AOF to its own disk, or lower vm.dirty_bytes so writeback starts earlier."
                .into(),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("log-file-blocking") {
        let level = a
            .conf
            .and_then(|c| c.loglevel.clone())
            .map(|l| format!(" (loglevel {l})"))
            .unwrap_or_default();
        out.push(Finding {
            id: "log-file-blocking".into(),
            severity: sev(Some(e), Severity::Warning),
            title: format!("Writing the log file blocks the main thread{level}"),
            evidence: stall_evidence(e),
            advice: "Redis opens, writes and closes its log file for every line, in the main thread, so a busy disk (a \
                     BGSAVE or AOF rewrite writing) stalls every client. Use `loglevel notice` (or `warning`), or log to \
                     syslog (`syslog-enabled yes`, `logfile \"\"`) or stdout; never keep the log file on the disk that saves \
                     and the AOF saturate. Trade-off: fewer log lines to debug with."
                .into(),
            stalls: e.n,
        });
    }
    // fork: always worth a line when a child was forked; a stall when it crossed the threshold.
    if !a.phases.is_empty() {
        let e = by.get("fork");
        let worst = a.phases.fork_durs().iter().max().copied().unwrap_or(0) / 1000;
        if e.is_some() || worst > 0 {
            let list: Vec<String> = a
                .phases
                .iter()
                .filter_map(|p| {
                    p.fork_ns
                        .map(|f| format!("{} (child {})", human(f / 1000), p.child))
                })
                .collect();
            out.push(Finding {
                id: "fork".into(),
                severity: if e.is_some() { sev(e, Severity::Warning) } else { Severity::Info },
                title: format!("fork() for a background save blocked the main thread {}", human(worst)),
                evidence: format!("fork durations: {}", list.join(", ")),
                advice: "fork() copies the page tables: about 10-20 ms per GB of RSS, with the main thread stopped. Disable \
                         Transparent Huge Pages (`never`), keep instances smaller, and run BGSAVE/BGREWRITEAOF off-peak or on \
                         a replica."
                    .into(),
                stalls: e.map_or(0, |e| e.n),
            });
        }
    }
    if let Some(e) = by.get("cow-page-faults") {
        out.push(Finding {
            id: "cow-page-faults".into(),
            severity: sev(Some(e), Severity::Warning),
            title: "The main thread slows down while a forked child runs (copy-on-write)".into(),
            evidence: stall_evidence(e),
            advice: "After fork every first write to a shared page copies it (a minor page fault in the main thread). \
                     Disable Transparent Huge Pages, schedule saves off-peak or on a replica, save less often (`save` \
                     policy), or reduce write traffic during saves. Live mode shows the minor-fault rate to confirm."
                .into(),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("command") {
        out.push(Finding {
            id: "command".into(),
            severity: sev(Some(e), Severity::Warning),
            title: "Commands held the main thread: slow, sleeping or blocking commands, or descheduling".into(),
            evidence: stall_evidence(e),
            advice: "Check `SLOWLOG GET` and `LATENCY LATEST` for the commands; avoid O(N) commands on big keys (KEYS, \
                     SMEMBERS/HGETALL of large sets, long Lua scripts), DEBUG SLEEP and synchronous MIGRATE in \
                     production. If no command is slow, the process was descheduled: check CPU steal and other \
                     processes on the same cores."
                .into(),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("disk-contention") {
        out.push(Finding {
            id: "disk-contention".into(),
            severity: sev(Some(e), Severity::Warning),
            title: "File I/O in the main thread waited on a busy disk".into(),
            evidence: stall_evidence(e),
            advice: "Find what saturates the disk (iostat -x, pidstat -d) and move redis's files to a disk of their own.".into(),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("aof-fsync-background") {
        out.push(Finding {
            id: "aof-fsync-background".into(),
            severity: if e.worst >= 1_000_000 { Severity::Warning } else { Severity::Info },
            title: if by.contains_key("aof-write-pending-fsync") {
                "The background AOF fsync was slow, and the main thread's AOF writes waited for it".into()
            } else {
                "The background AOF fsync was slow (clients were not blocked by it)".into()
            },
            evidence: stall_evidence(e),
            advice: "With appendfsync everysec redis only delays writes when one background fsync takes more than 2 s. \
                     If fsyncs approach that, give the AOF a faster or dedicated disk."
                .into(),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("child-cow-report") {
        out.push(Finding {
            id: "child-cow-report".into(),
            severity: Severity::Info,
            title: "The save child was slow reading its own memory map (copy-on-write report)".into(),
            evidence: stall_evidence(e),
            advice: "Nothing to change for clients: the child, not the main thread, pays for it. Redis reads \
                     /proc/self/smaps in the child to report copy-on-write memory (INFO `current_cow_size`) and \
                     already spaces the reads out when they are slow; they are slow because the dataset has many \
                     mappings. A large copy-on-write figure is the thing to act on (see cow-page-faults)."
                .into(),
            stalls: e.n,
        });
    }
    if let Some(e) = by.get("child-disk-io") {
        out.push(Finding {
            id: "child-disk-io".into(),
            severity: Severity::Info,
            title: "The background save child waited on the disk".into(),
            evidence: stall_evidence(e),
            advice: "Not client-facing by itself, but it makes the save longer and fills the disk queue that the main \
                     thread's own file I/O (AOF, log) then waits in. A dedicated disk for saves helps."
                .into(),
            stalls: e.n,
        });
    }
    if let Some(v) = a.gaps {
        out.push(Finding {
            id: if v.is_filtered() {
                "filtered-trace"
            } else {
                "gaps-unmeasurable"
            }
            .into(),
            severity: Severity::Info,
            title: "Gaps between syscalls are not reported for this trace".into(),
            evidence: match v {
                GapVerdict::Filtered { syscalls } => format!(
                    "{syscalls} syscalls and not one epoll_wait: strace was probably run with -e trace=..."
                ),
                v => v.why(),
            },
            advice: "Slow commands and copy-on-write stalls show as gaps in a thread's syscalls. Trace \
                     every syscall (no -e trace, no --duration) with -tt or -ttt timestamps (and -f \
                     rather than -r) to see them."
                .into(),
            stalls: 0,
        });
    }
    let unexplained = stalls.iter().filter(|s| s.finding.is_none()).count();
    if unexplained > 0 {
        out.push(Finding {
            id: "unexplained".into(),
            severity: Severity::Info,
            title: format!(
                "{unexplained} stall{} no rule explains",
                plural(unexplained as u64)
            ),
            evidence: "see the stalls marked without a finding".into(),
            advice: "Look at the thread and syscall of each; a socket or pipe call that blocks usually means CPU starvation \
                     (check load and steal) or tracing overhead."
                .into(),
            stalls: unexplained as u64,
        });
    }
    out.sort_by(|x, y| y.severity.cmp(&x.severity).then(y.stalls.cmp(&x.stalls)));
    out
}
