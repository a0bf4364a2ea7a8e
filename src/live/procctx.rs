//! What only a live process can tell, read from /proc through the `procfs` crate, beside
//! the tracer: the fd table at attach (seeds the analyzer's fd table, so fds opened before
//! tracing are named, not guessed), thread names (`comm`: main, bio_aof, io_thd_N...), the
//! redis config (from the command line, the config file it names, and the working
//! directory redis chdir()s into), the CPUs it may run on (its threads' affinity, the online
//! CPUs), and the notes that compare the host's samples (taken by
//! `host::Sampler`) across phases and stalls in `report.host`.

use super::container::Root;
use crate::event::Tid;
use crate::report::{Cpus, HostContext, HostSample, Report};
use procfs::process::{FDTarget, Process};
use std::collections::HashMap;
use std::time::Duration;

/// The process as seen at attach.
#[derive(Clone, Debug, Default)]
pub struct ProcContext {
    pub pid: Tid,
    /// (fd, what it is, in strace `-yy` words: a path, `TCP:[a:p->b:p]`, `pipe:[ino]`...).
    pub fds: Vec<(i32, String)>,
    pub thread_names: HashMap<Tid, String>,
    pub cmdline: Vec<String>,
    pub cwd: Option<String>,
    /// redis.conf-style text assembled from what the process tells (see `redis_conf_text`).
    pub redis_conf: String,
    /// Where each part of `redis_conf` came from, for the report's notes.
    pub conf_sources: Vec<String>,
    /// How the host reads the process's paths (through /proc/PID/root in a container);
    /// `cwd` and the fd table's paths are the process's own.
    pub root: Root,
}

/// Reads the fd table, thread names and config of `pid`. Parts that cannot be read (a
/// thread that just exited, an fd closed meanwhile) are left out, never fatal.
pub fn gather(pid: Tid) -> ProcContext {
    let mut ctx = ProcContext {
        pid,
        ..Default::default()
    };
    let proc_ = match Process::new(pid as i32) {
        Ok(p) => p,
        Err(_) => return ctx,
    };
    ctx.root = Root::of(pid);
    ctx.cmdline = proc_.cmdline().unwrap_or_default();
    ctx.cwd = proc_
        .cwd()
        .ok()
        .map(|p| ctx.root.target_path(&p.to_string_lossy()));
    ctx.fds = fd_table(&proc_, &ctx.root);
    ctx.thread_names = thread_names(pid);
    let (text, sources) = redis_conf_text(&ctx.cmdline, ctx.cwd.as_deref(), &ctx.root);
    ctx.redis_conf = text;
    ctx.conf_sources = sources;
    ctx
}

pub fn thread_names(pid: Tid) -> HashMap<Tid, String> {
    let mut m = HashMap::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            let tid: Tid = match e.file_name().to_str().and_then(|s| s.parse().ok()) {
                Some(t) => t,
                None => continue,
            };
            if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
                m.insert(tid, c.trim_end_matches('\n').to_string());
            }
        }
    }
    m
}

fn fd_table(p: &Process, root: &Root) -> Vec<(i32, String)> {
    let sockets = socket_names(p);
    let mut v = vec![];
    let fds = match p.fd() {
        Ok(f) => f,
        Err(_) => return v,
    };
    for fd in fds.flatten() {
        let what = match &fd.target {
            FDTarget::Path(path) => root.target_path(&path.to_string_lossy()),
            FDTarget::Socket(ino) => sockets
                .get(ino)
                .cloned()
                .unwrap_or_else(|| format!("socket:[{ino}]")),
            FDTarget::Net(ino) => format!("net:[{ino}]"),
            FDTarget::Pipe(ino) => format!("pipe:[{ino}]"),
            FDTarget::AnonInode(s) => format!("anon_inode:{s}"),
            FDTarget::MemFD(s) => format!("/memfd:{s}"),
            FDTarget::Other(k, ino) => format!("{k}:[{ino}]"),
        };
        v.push((fd.fd, what));
    }
    v.sort();
    v
}

/// Socket inode -> strace `-yy` style name, so that live seeds and `-yy` traces classify
/// sockets (client, listener) the same way.
fn socket_names(p: &Process) -> HashMap<u64, String> {
    use procfs::net::TcpState;
    let mut m = HashMap::new();
    for (v6, entries) in [(false, p.tcp()), (true, p.tcp6())] {
        for e in entries.into_iter().flatten() {
            let kind = if v6 { "TCPv6" } else { "TCP" };
            let name = if e.state == TcpState::Listen {
                format!("{kind}:[{}]", e.local_address)
            } else {
                format!("{kind}:[{}->{}]", e.local_address, e.remote_address)
            };
            m.insert(e.inode, name);
        }
    }
    for e in p.unix().into_iter().flatten() {
        let name = match &e.path {
            Some(path) => format!("UNIX-STREAM:[{},\"{}\"]", e.inode, path.display()),
            None => format!("UNIX-STREAM:[{}]", e.inode),
        };
        m.insert(e.inode, name);
    }
    m
}

/// The redis settings that name files, as a redis.conf text. Order of precedence, later
/// wins as in redis itself: the config file named on the command line, then `--option value`
/// arguments, then the working directory (redis chdir()s into `dir` at startup, so
/// /proc/PID/cwd is `dir` whatever the config said). The config file is read through
/// `root` (a container's `/data/redis.conf` is under /proc/PID/root on the host).
pub fn redis_conf_text(
    cmdline: &[String],
    cwd: Option<&str>,
    root: &Root,
) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut sources = vec![];
    // redis rewrites its process title ("redis-server 127.0.0.1:6379"), which drops the
    // config path; it survives when set-proc-title is off or the title template keeps it.
    let args: Vec<&str> = cmdline
        .iter()
        .flat_map(|a| a.split(' '))
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(conf) = args.iter().skip(1).find(|a| a.ends_with(".conf")) {
        let path = if conf.starts_with('/') {
            conf.to_string()
        } else {
            // Relative to where redis was started, which is not known any more; the
            // working directory is the best guess left.
            format!("{}/{}", cwd.unwrap_or("."), conf)
        };
        let read_at = root.host_path(&path);
        if let Ok(t) = std::fs::read_to_string(&read_at) {
            text.push_str(&t);
            text.push('\n');
            sources.push(format!("config file {read_at}"));
        }
    }
    let mut i = 1;
    while i < args.len() {
        if let Some(opt) = args[i].strip_prefix("--") {
            let mut vals = vec![];
            let mut j = i + 1;
            while j < args.len() && !args[j].starts_with("--") {
                vals.push(args[j]);
                j += 1;
            }
            text.push_str(&format!("{opt} {}\n", vals.join(" ")));
            sources.push(format!("--{opt} on the command line"));
            i = j;
        } else {
            i += 1;
        }
    }
    if let Some(d) = cwd {
        text.push_str(&format!("dir {d}\n"));
        sources.push("dir from the process's working directory".into());
    }
    (text, sources)
}

#[derive(Default, Clone, Copy)]
struct Means {
    n: usize,
    minflt: f64,
    majflt: f64,
    wbytes: f64,
    iowait: f64,
}

/// Means of the samples that overlap [from, to) µs.
fn means(samples: &[HostSample], interval_us: i64, from: i64, to: i64) -> Means {
    let mut m = Means::default();
    for s in samples
        .iter()
        .filter(|s| s.at_us + interval_us > from && s.at_us < to)
    {
        m.n += 1;
        m.minflt += s.minflt_per_s;
        m.majflt += s.majflt_per_s;
        m.wbytes += s.write_bytes_per_s;
        m.iowait += s.iowait_pct;
    }
    if m.n > 0 {
        let n = m.n as f64;
        m.minflt /= n;
        m.majflt /= n;
        m.wbytes /= n;
        m.iowait /= n;
    }
    m
}

fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn mb(v: f64) -> String {
    format!("{:.1} MB/s", v / 1e6)
}

/// Puts the samples in the report and writes the comparisons an engineer reads first:
/// each background phase against the time before it, and the longest stalls.
pub fn attach_host_context(report: &mut Report, samples: Vec<HostSample>, interval: Duration) {
    let iv = interval.as_micros() as i64;
    let mut notes = vec![];
    for ph in report.phases.iter().take(5) {
        let end = ph.end_at_us.unwrap_or(i64::MAX);
        let during = means(&samples, iv, ph.start_at_us, end);
        // "Before": up to 5 s before the fork.
        let before = means(
            &samples,
            iv,
            (ph.start_at_us - 5_000_000).max(0),
            ph.start_at_us,
        );
        if during.n == 0 {
            continue;
        }
        let mut s = format!(
            "during the {} (child {}): minor faults {}/s",
            ph.kind.as_str().replace('_', " "),
            ph.child_pid,
            thousands(during.minflt)
        );
        if before.n > 0 {
            s.push_str(&format!(" vs {}/s before", thousands(before.minflt)));
        }
        s.push_str(&format!("; major faults {}/s", thousands(during.majflt)));
        s.push_str(&format!("; iowait {:.0}%", during.iowait));
        if before.n > 0 {
            s.push_str(&format!(" vs {:.0}% before", before.iowait));
        }
        s.push_str(&format!("; redis disk writes {}", mb(during.wbytes)));
        notes.push(s);
    }
    let mut idx: Vec<usize> = (0..report.stalls.len()).collect();
    idx.sort_by_key(|i| std::cmp::Reverse(report.stalls[*i].duration_us));
    for i in idx.into_iter().take(3) {
        let st = &report.stalls[i];
        let m = means(&samples, iv, st.at_us, st.at_us + st.duration_us.max(1));
        if m.n == 0 {
            continue;
        }
        let what = st.syscall.clone().unwrap_or_else(|| "gap".into());
        notes.push(format!(
            "during the {:.1} ms {} stall of {} at {}: minor faults {}/s, major faults {}/s, iowait {:.0}%",
            st.duration_us as f64 / 1000.0,
            what,
            st.who.thread,
            st.ts,
            thousands(m.minflt),
            thousands(m.majflt),
            m.iowait
        ));
    }
    let all = means(&samples, iv, 0, i64::MAX);
    if all.n > 0 {
        notes.push(format!(
            "whole trace: minor faults {}/s, major faults {}/s, iowait {:.0}%, redis disk writes {}",
            thousands(all.minflt),
            thousands(all.majflt),
            all.iowait,
            mb(all.wbytes)
        ));
    }
    report.live.host = Some(HostContext {
        sample_interval_ms: interval.as_millis() as u64,
        samples,
        notes,
        pressure: None,
    });
}

/// The most bytes one copy-on-write page fault of `pid` copies on this kernel: a base page,
/// except on a kernel before 5.8 while the process has memory in transparent huge pages,
/// where a write to a shared huge page copied all of it (5.8 made it split the huge page
/// and copy the base page written, as for files). None when the kernel says too little.
pub fn cow_fault_bytes(pid: Tid) -> Option<u64> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let huge = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let anon_huge_kb = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        });
    cow_copy(
        &release,
        super::page_size() as u64,
        huge,
        anon_huge_kb.unwrap_or(0),
    )
}

/// `cow_fault_bytes` from what the kernel says: its release ("6.18.44-..."), its base and
/// huge page sizes, and how much of the process is in huge pages now.
fn cow_copy(release: &str, base: u64, huge: Option<u64>, anon_huge_kb: u64) -> Option<u64> {
    let mut v = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    let (major, minor) = (v.next()??, v.next()??);
    if (major, minor) >= (5, 8) || anon_huge_kb == 0 {
        return Some(base);
    }
    huge.or(Some(base))
}

/// The CPUs `pid` may run on: those online that any of its threads' affinity allows. None
/// when the kernel's lists cannot be read (the process gone, no /sys).
pub fn cpus(pid: Tid) -> Option<Cpus> {
    let online = cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?)?;
    let mut allowed = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        // A thread that exited meanwhile is skipped.
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        if let Some(list) = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .and_then(cpu_list)
        {
            allowed.extend(list);
        }
    }
    cpus_of(&allowed, &online)
}

/// `cpus` from the threads' allowed CPUs and the online ones: an affinity mask may name
/// CPUs that are not online (all those possible), which run nothing.
fn cpus_of(allowed: &std::collections::BTreeSet<u32>, online: &[u32]) -> Option<Cpus> {
    let usable: Vec<u32> = online
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .collect();
    if usable.is_empty() {
        return None;
    }
    Some(Cpus {
        allowed_list: cpu_list_text(&usable),
        allowed: usable.len() as u32,
        online: online.len() as u32,
    })
}

/// The CPUs of a kernel CPU list ("0-3,8,10-11"), sorted; None when the text is not one.
fn cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut v = vec![];
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                // A range no machine has is a misread, not 4 billion CPUs.
                if b < a || b - a >= 1 << 16 {
                    return None;
                }
                v.extend(a..=b);
            }
            None => v.push(part.parse().ok()?),
        }
    }
    v.sort_unstable();
    v.dedup();
    (!v.is_empty()).then_some(v)
}

/// Sorted CPUs in the kernel's list form: "0-1,4".
fn cpu_list_text(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = vec![];
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_are_those_online_that_some_thread_may_run_on() {
        assert_eq!(cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("1"), Some(vec![1]));
        for bad in ["", "\n", "a-b", "3-1", "0-4294967295", "0,x"] {
            assert_eq!(cpu_list(bad), None, "{bad:?}");
        }
        assert_eq!(cpu_list_text(&[0, 1, 2, 4, 6, 7]), "0-2,4,6-7");
        // An affinity over every possible CPU on a host with 2 online: 2.
        let all: std::collections::BTreeSet<u32> = (0..64).collect();
        let c = cpus_of(&all, &[0, 1]).unwrap();
        assert_eq!(
            (c.allowed, c.online, c.allowed_list.as_str()),
            (2, 2, "0-1")
        );
        // Pinned to CPU 1 of 4 (taskset, server-cpulist).
        let one: std::collections::BTreeSet<u32> = [1].into();
        let c = cpus_of(&one, &[0, 1, 2, 3]).unwrap();
        assert_eq!((c.allowed, c.online, c.allowed_list.as_str()), (1, 4, "1"));
        // Only offline CPUs allowed: nothing it can run on is known.
        let off: std::collections::BTreeSet<u32> = [5].into();
        assert_eq!(cpus_of(&off, &[0, 1]), None);
    }

    /// This test's own process: at least one CPU, no more than are online.
    #[test]
    fn cpus_of_a_live_process_are_read() {
        let c = cpus(std::process::id() as Tid).expect("this process's CPUs");
        assert!(c.allowed >= 1 && c.allowed <= c.online, "{c:?}");
    }

    #[test]
    fn a_copy_on_write_fault_copies_a_huge_page_only_before_linux_5_8() {
        let huge = Some(2 << 20);
        assert_eq!(cow_copy("6.18.44-fc-v657\n", 4096, huge, 65536), Some(4096));
        assert_eq!(cow_copy("5.8.0", 4096, huge, 65536), Some(4096));
        assert_eq!(
            cow_copy("5.4.0-150-generic", 4096, huge, 65536),
            Some(2 << 20)
        );
        // No memory in huge pages: a base page, whatever the kernel.
        assert_eq!(cow_copy("4.19.0", 4096, huge, 0), Some(4096));
        assert_eq!(cow_copy("4.19.0", 16384, None, 2048), Some(16384));
        assert_eq!(cow_copy("", 4096, huge, 0), None);
    }

    /// What `cow_fault_bytes` says, against this kernel: memory in huge pages (asked for with
    /// madvise), shared with a forked child, then written in the parent every 4 KiB. The
    /// faults times what each is said to copy must be the bytes written, neither less (huge
    /// pages copied whole) nor far more.
    #[test]
    fn what_a_fault_copies_is_what_this_kernel_copies() {
        const LEN: usize = 16 << 20;
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            // Refused where THP is off: the memory is in base pages then, as the answer says.
            libc::madvise(p, LEN, libc::MADV_HUGEPAGE);
            let b = p as *mut u8;
            for off in (0..LEN).step_by(4096) {
                b.add(off).write_volatile(1);
            }
            let copy = cow_fault_bytes(std::process::id()).expect("the kernel's release");
            let child = libc::fork();
            assert!(child >= 0);
            if child == 0 {
                libc::pause();
                libc::_exit(0);
            }
            let minflt = || {
                let mut u: libc::rusage = std::mem::zeroed();
                libc::getrusage(libc::RUSAGE_THREAD, &mut u);
                u.ru_minflt as u64
            };
            let before = minflt();
            for off in (0..LEN).step_by(4096) {
                b.add(off).write_volatile(2);
            }
            let faults = minflt() - before;
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
            libc::munmap(p, LEN);
            let said = faults * copy;
            // A few pages may be written without a fault (4088 of 4096 was seen: the kernel
            // can reuse a page no other mapping still shares); a wrong copy size is off by
            // hundreds of times, not by a few pages.
            assert!(
                said >= (LEN as u64) * 7 / 8 && said <= 2 * LEN as u64,
                "{faults} faults of {copy} bytes for {LEN} bytes written"
            );
        }
    }

    #[test]
    fn conf_text_takes_file_then_args_then_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("r.conf");
        std::fs::write(&conf, "appendfilename \"x.aof\"\ndir /elsewhere\n").unwrap();
        let cmd = vec![
            "redis-server".to_string(),
            conf.to_string_lossy().into_owned(),
            "--logfile".into(),
            "/var/log/r.log".into(),
        ];
        let (t, src) = redis_conf_text(&cmd, Some("/data"), &Root::host());
        let dir_lines: Vec<&str> = t.lines().filter(|l| l.starts_with("dir ")).collect();
        assert_eq!(dir_lines.last(), Some(&"dir /data"));
        assert!(t.contains("appendfilename \"x.aof\""));
        assert!(t.contains("logfile /var/log/r.log"));
        assert_eq!(src.len(), 3);
    }

    #[test]
    fn gathers_own_fds_and_threads() {
        let me = std::process::id();
        let f = tempfile::NamedTempFile::new().unwrap();
        let ctx = gather(me);
        let p = f.path().to_string_lossy().into_owned();
        assert!(ctx.fds.iter().any(|(_, w)| *w == p), "{:?}", ctx.fds);
        assert!(ctx.thread_names.contains_key(&me));
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(9300.0), "9,300");
        assert_eq!(thousands(570.0), "570");
        assert_eq!(thousands(1234567.0), "1,234,567");
    }
}
