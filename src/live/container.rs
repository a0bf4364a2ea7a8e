//! How the host reaches a process that runs in its own namespaces (a container), and what
//! the process's cgroup path names. Inputs layer, beside `procctx`: it reads /proc and
//! enters namespaces, nothing else. One job: give the rest of the crate the target's files
//! (`Root`: its paths read through `/proc/PID/root`), its pids as the host numbers them
//! (`PidNs`), its network (`connect_tcp`: a socket made inside its network namespace) and
//! its identity (`describe`: cgroup path, runtime and id, UTS hostname, the namespaces that
//! differ from ours). The cgroup's own files (quota, throttling, memory) are `cgroup`'s.

use crate::event::Tid;
use crate::report::{Container, NsPid};
use crate::syscalls::{Facts, FdKind, SysInfo};
use rustc_hash::FxHashMap;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The namespaces compared with ours, in the order the report lists them.
const KINDS: &[&str] = &["mnt", "pid", "net", "uts", "ipc", "cgroup", "user", "time"];

/// The kinds of namespace in which `pid` differs from this process (empty on a bare host,
/// or when /proc does not tell: a process gone, no permission).
pub fn differing_namespaces(pid: Tid) -> Vec<String> {
    KINDS
        .iter()
        .filter(|k| differs(pid, k))
        .map(|k| k.to_string())
        .collect()
}

fn differs(pid: Tid, kind: &str) -> bool {
    let ours = std::fs::read_link(format!("/proc/self/ns/{kind}"));
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{kind}"));
    matches!((ours, theirs), (Ok(a), Ok(b)) if a != b)
}

/// Where the host finds a path of the target's: the path itself on a bare host, or the
/// same path under `/proc/PID/root` when the target sees another file tree (its own mount
/// namespace, or a root of its own): there a container's `/data/redis.log` may not exist
/// on the host at all, or be another file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Root {
    /// `/proc/PID/root` when paths go through it.
    via: Option<String>,
    /// The target's root as the host's readlink of /proc/PID/root says it (not `/` for a
    /// chroot: its cwd and fd links then start with it).
    link: Option<String>,
}

impl Root {
    /// The host's own view: paths are read as they are.
    pub fn host() -> Root {
        Root::default()
    }

    /// `pid`'s view, read from /proc now.
    pub fn of(pid: Tid) -> Root {
        let link = std::fs::read_link(format!("/proc/{pid}/root"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        let own_tree = differs(pid, "mnt") || link.as_deref().is_some_and(|l| l != "/");
        Root {
            via: own_tree.then(|| format!("/proc/{pid}/root")),
            link: link.filter(|l| l != "/"),
        }
    }

    /// Whether paths go through `/proc/PID/root`.
    pub fn is_other(&self) -> bool {
        self.via.is_some()
    }

    /// `/proc/PID/root`, when paths go through it.
    pub fn via(&self) -> Option<&str> {
        self.via.as_deref()
    }

    /// The host path of the target's absolute path `p` (a relative `p` is returned as it
    /// is: the caller joins it to the target's cwd first).
    pub fn host_path(&self, p: &str) -> String {
        match &self.via {
            Some(v) if p.starts_with('/') => format!("{v}{p}"),
            _ => p.to_string(),
        }
    }

    /// A path the host's readlink gave for one of the target's links (its cwd, an fd), as
    /// the target names it: without the chroot's prefix, when it has one.
    pub fn target_path(&self, link: &str) -> String {
        match &self.link {
            Some(r) => match link.strip_prefix(r.as_str()) {
                Some("") => "/".to_string(),
                Some(rest) if rest.starts_with('/') => rest.to_string(),
                _ => link.to_string(),
            },
            None => link.to_string(),
        }
    }
}

/// The last (innermost) pid of an `NSpid:` line of /proc/PID/status: the pid the process
/// has in its own pid namespace, which its log and INFO print.
fn ns_pid_of(status: &str) -> Option<Tid> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The pid `host_pid` has inside its own pid namespace (itself on a bare host).
pub fn ns_pid(host_pid: Tid) -> Option<Tid> {
    ns_pid_of(&std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?)
}

/// The traced process's pid namespace: the pids its calls return (clone, wait4) are its
/// own, while the tracer names tasks by the host's pids. Maps the first to the second.
#[derive(Clone, Debug, Default)]
pub struct PidNs {
    /// The traced process is in a pid namespace of its own.
    nested: bool,
    /// Its pids as the namespace numbers them -> as the host does.
    to_host: FxHashMap<Tid, Tid>,
}

impl PidNs {
    /// For traced process `pid` (nothing to map on a bare host).
    pub fn of(pid: Tid) -> PidNs {
        let mut p = PidNs {
            nested: differs(pid, "pid"),
            ..Default::default()
        };
        if let Some(n) = p.nested.then(|| ns_pid(pid)).flatten() {
            p.to_host.insert(n, pid);
        }
        p
    }

    /// The host's pid of the namespace's pid `ns`, a child of process `parent`. `fresh`:
    /// the child was just made (its clone returned `ns`), so it is looked up in /proc
    /// whether or not `ns` was mapped before (a pid the namespace reuses is another
    /// process); else (a wait reaped it, and it is gone from /proc) what was learnt. The
    /// value itself when nothing is to be mapped or it cannot be found.
    pub fn to_host(&mut self, parent: Tid, ns: i64, fresh: bool) -> i64 {
        if !self.nested || ns <= 0 {
            return ns;
        }
        let n = ns as Tid;
        if fresh {
            // Better unmapped than mapped to the process that had the pid before.
            self.to_host.remove(&n);
        }
        if !self.to_host.contains_key(&n) {
            for h in children(parent) {
                if let Some(c) = ns_pid(h) {
                    self.to_host.insert(c, h);
                }
            }
        }
        self.to_host.get(&n).map_or(ns, |h| *h as i64)
    }

    /// A call's result as the host numbers it: the child pid a clone/fork/vfork returns or
    /// a wait reaped (`sys`) is the namespace's, mapped here; every other result is kept.
    /// `caller`: the calling task (its process's children are looked up).
    #[inline]
    pub fn host_ret(&mut self, sys: &SysInfo, ret: Option<i64>, caller: Tid) -> Option<i64> {
        match ret {
            Some(r) if self.nested && r > 0 && returns_pid(sys) => {
                Some(self.to_host(caller, r, sys.fd == FdKind::Clone))
            }
            _ => ret,
        }
    }

    /// (host pid, pid in the namespace) of every process mapped so far.
    pub fn pairs(&self) -> Vec<(Tid, Tid)> {
        let mut v: Vec<(Tid, Tid)> = self.to_host.iter().map(|(n, h)| (*h, *n)).collect();
        v.sort();
        v
    }
}

/// Whether `sys` returns a pid of the caller's pid namespace: a new child, or one reaped.
fn returns_pid(sys: &SysInfo) -> bool {
    sys.fd == FdKind::Clone || sys.facts.has(Facts::WAIT_CHILD)
}

/// The children of process `pid` (of all its threads), by the host's pids.
fn children(pid: Tid) -> Vec<Tid> {
    let mut v = vec![];
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return v;
    };
    for e in rd.flatten() {
        if let Ok(s) = std::fs::read_to_string(e.path().join("children")) {
            v.extend(s.split_whitespace().filter_map(|c| c.parse::<Tid>().ok()));
        }
    }
    v
}

/// Runs `f` on a short-lived thread that has entered `pid`'s namespace of kind `flag`
/// (`/proc/PID/ns/KIND`): network and UTS namespaces are per thread, so the rest of the
/// process stays where it is, and the thread ends with its namespace.
fn in_namespace<T: Send + 'static>(
    pid: Tid,
    kind: &str,
    flag: nix::sched::CloneFlags,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let path = format!("/proc/{pid}/ns/{kind}");
    let ns = std::fs::File::open(&path)?;
    std::thread::Builder::new()
        .name(format!("ns-{kind}"))
        .spawn(move || {
            nix::sched::setns(&ns, flag)
                .map_err(|e| std::io::Error::other(format!("cannot enter {path} (setns): {e}")))?;
            f()
        })?
        .join()
        .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
}

/// A TCP connection to `addr` made from inside `pid`'s network namespace when it differs
/// from ours (a container's `127.0.0.1:6379` is its own, not the host's); a plain connect
/// otherwise. The socket stays in the namespace it was made in, whichever thread uses it.
pub fn connect_tcp(
    addr: SocketAddr,
    timeout: Duration,
    pid: Option<Tid>,
) -> std::io::Result<TcpStream> {
    match pid.filter(|p| differs(*p, "net")) {
        Some(p) => in_namespace(p, "net", nix::sched::CloneFlags::CLONE_NEWNET, move || {
            TcpStream::connect_timeout(&addr, timeout)
        }),
        None => TcpStream::connect_timeout(&addr, timeout),
    }
}

/// The host name `pid` sees (a pod's name), when its UTS namespace is its own.
pub fn hostname(pid: Tid) -> Option<String> {
    if !differs(pid, "uts") {
        return None;
    }
    in_namespace(pid, "uts", nix::sched::CloneFlags::CLONE_NEWUTS, || {
        // SAFETY: uname fills the struct it is given.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { libc::uname(&mut u) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: nodename is NUL-terminated by the kernel.
        let n = unsafe { std::ffi::CStr::from_ptr(u.nodename.as_ptr()) };
        Ok(n.to_string_lossy().into_owned())
    })
    .ok()
    .filter(|n| !n.is_empty())
}

/// What a cgroup path names: the container runtime and id, and the Kubernetes pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgroupName {
    pub runtime: Option<&'static str>,
    pub id: Option<String>,
    /// The pod's uid, with dashes (systemd's slice names write them as `_`).
    pub pod_uid: Option<String>,
    /// `burstable`, `besteffort` or `guaranteed`.
    pub qos: Option<String>,
    pub kubernetes: bool,
}

impl CgroupName {
    fn names_something(&self) -> bool {
        self.id.is_some() || self.kubernetes
    }
}

/// A container id: hex, as runtimes make them (docker's and containerd's are 64 digits; a
/// shorter run of 12 or more is accepted for the runtimes that print short ones).
fn is_id(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `PREFIX<id>.scope` (systemd's cgroup driver) -> the id.
fn scoped<'a>(c: &'a str, prefix: &str) -> Option<&'a str> {
    let id = c.strip_prefix(prefix)?.strip_suffix(".scope")?;
    is_id(id).then_some(id)
}

/// One path component as the runtimes name their containers.
fn runtime_component(c: &str, parent: &str) -> Option<(&'static str, String)> {
    for (prefix, rt) in [
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("libpod-", "podman"),
    ] {
        if let Some(id) = scoped(c, prefix) {
            return Some((rt, id.to_string()));
        }
    }
    // containerd's systemd driver under cgroup v2 also writes `SLICE:cri-containerd:ID`.
    if let [_, rt, id] = c.split(':').collect::<Vec<_>>()[..] {
        let rt = match rt {
            "cri-containerd" => "containerd",
            "crio" => "cri-o",
            "docker" => "docker",
            _ => return None,
        };
        return is_id(id).then(|| (rt, id.to_string()));
    }
    (is_id(c) && parent == "docker").then(|| ("docker", c.to_string()))
}

/// What a cgroup path (`/system.slice/docker-ID.scope`, `/kubepods/burstable/podUID/ID`...)
/// says of the container in it. Nothing for a path no runtime made.
pub fn parse_cgroup_path(path: &str) -> CgroupName {
    let mut n = CgroupName::default();
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, c) in parts.iter().enumerate() {
        let parent = if i > 0 { parts[i - 1] } else { "" };
        if c.starts_with("kubepods") {
            n.kubernetes = true;
            // kubepods-burstable-pod<uid>.slice, kubepods-pod<uid>.slice (guaranteed).
            let s = c.split(':').next().unwrap_or(c).trim_end_matches(".slice");
            for q in ["burstable", "besteffort"] {
                if s.split('-').any(|w| w == q) {
                    n.qos = Some(q.to_string());
                }
            }
            if let Some((_, uid)) = s.split_once("-pod") {
                n.pod_uid = Some(uid.replace('_', "-"));
            }
        } else if n.kubernetes && (*c == "burstable" || *c == "besteffort") {
            n.qos = Some(c.to_string());
        } else if let Some(uid) = c.strip_prefix("pod").filter(|_| n.kubernetes) {
            n.pod_uid = Some(uid.replace('_', "-"));
        }
        if let Some((rt, id)) = runtime_component(c, parent) {
            n.runtime = Some(rt);
            n.id = Some(id);
        } else if n.kubernetes && n.pod_uid.is_some() && is_id(c) && parent.starts_with("pod") {
            // cgroupfs driver: /kubepods/QOS/pod<uid>/<id>; the runtime is not named.
            n.id = Some(c.to_string());
        }
    }
    if n.kubernetes && n.qos.is_none() && n.pod_uid.is_some() {
        n.qos = Some("guaranteed".into());
    }
    n
}

/// The cgroup path to name, from /proc/PID/cgroup's text (v1: a line per hierarchy; v2:
/// `0::/path`): the one that names a container, else the unified (v2) one, else the cpu
/// or memory controller's, else any that is not the root.
pub fn cgroup_path(text: &str) -> Option<String> {
    let mut lines: Vec<(&str, &str)> = vec![];
    for l in text.lines() {
        let mut it = l.splitn(3, ':');
        let (_, ctrl, path) = (it.next()?, it.next()?, it.next()?);
        lines.push((ctrl, path));
    }
    let named = lines
        .iter()
        .find(|(_, p)| parse_cgroup_path(p).names_something());
    let unified = lines.iter().find(|(c, p)| c.is_empty() && *p != "/");
    let has_ctrl = |c: &str, w: &str| c.split(',').any(|x| x == w);
    let cpu_mem = lines
        .iter()
        .filter(|(_, p)| *p != "/")
        .find(|(c, _)| has_ctrl(c, "cpu") || has_ctrl(c, "memory"));
    let any = lines.iter().find(|(_, p)| *p != "/");
    named
        .or(unified)
        .or(cpu_mem)
        .or(any)
        .or(lines.first())
        .map(|(_, p)| p.to_string())
}

/// Adds the (host, namespace) pid pairs not in `c` yet.
pub fn add_pids(c: &mut Container, pairs: &[(Tid, Tid)]) {
    for (host, ns) in pairs {
        if !c.pids.iter().any(|p| p.host == *host) {
            c.pids.push(NsPid {
                host: *host,
                ns: *ns,
            });
        }
    }
}

/// Learns the namespace pid of `tid`, seen for the first time while tracing, when it is a
/// process (a forked child: its log lines carry that pid) of a container with a pid
/// namespace of its own. Threads are left out: redis's log names processes.
pub fn learn_pid(c: &mut Container, tid: Tid) {
    if !c.namespaces.iter().any(|n| n == "pid") || c.pids.iter().any(|p| p.host == tid) {
        return;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return;
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<Tid>().ok());
    if let (Some(true), Some(ns)) = (tgid.map(|t| t == tid), ns_pid_of(&status)) {
        add_pids(c, &[(tid, ns)]);
    }
}

/// The container `pid` runs in as the report names it, or None on a bare host (no
/// namespace of its own and a cgroup no runtime made). `pids`: (host, namespace) pairs of
/// the traced processes known so far (`PidNs::pairs`).
pub fn describe(pid: Tid, pids: &[(Tid, Tid)]) -> Option<Container> {
    let namespaces = differing_namespaces(pid);
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|t| cgroup_path(&t));
    let name = cgroup.as_deref().map(parse_cgroup_path).unwrap_or_default();
    if namespaces.is_empty() && !name.names_something() {
        return None;
    }
    let root = Root::of(pid);
    let mut c = Container {
        cgroup,
        runtime: name.runtime.map(str::to_string),
        id: name.id,
        kubernetes_pod_uid: name.pod_uid,
        kubernetes_qos: name.qos,
        hostname: hostname(pid),
        namespaces,
        files_via: root.via().map(str::to_string),
        pids: vec![],
    };
    learn_pid(&mut c, pid);
    add_pids(&mut c, pids);
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f6c2d9e8b7a6f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c";

    #[test]
    fn docker_paths_v1_and_v2() {
        for p in [
            format!("/docker/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
        ] {
            let n = parse_cgroup_path(&p);
            assert_eq!(n.runtime, Some("docker"), "{p}");
            assert_eq!(n.id.as_deref(), Some(ID), "{p}");
            assert!(!n.kubernetes);
        }
    }

    #[test]
    fn kubernetes_paths_name_the_pod_and_container() {
        let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let v1 = parse_cgroup_path(&format!("/kubepods/burstable/pod{uid}/{ID}"));
        assert!(v1.kubernetes);
        assert_eq!(v1.pod_uid.as_deref(), Some(uid));
        assert_eq!(v1.qos.as_deref(), Some("burstable"));
        assert_eq!(v1.id.as_deref(), Some(ID));
        assert_eq!(v1.runtime, None);
        let us = uid.replace('-', "_");
        let v2 = parse_cgroup_path(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{us}.slice/cri-containerd-{ID}.scope"
        ));
        assert_eq!(v2.runtime, Some("containerd"));
        assert_eq!(v2.pod_uid.as_deref(), Some(uid));
        assert_eq!(v2.qos.as_deref(), Some("besteffort"));
        assert_eq!(v2.id.as_deref(), Some(ID));
        let crio = parse_cgroup_path(&format!(
            "/kubepods.slice/kubepods-pod{us}.slice/crio-{ID}.scope"
        ));
        assert_eq!(crio.runtime, Some("cri-o"));
        assert_eq!(crio.qos.as_deref(), Some("guaranteed"));
        let colon = parse_cgroup_path(&format!(
            "/system.slice/containerd.service/kubepods-burstable-pod{us}.slice:cri-containerd:{ID}"
        ));
        assert_eq!(colon.runtime, Some("containerd"));
        assert_eq!(colon.id.as_deref(), Some(ID));
        assert_eq!(colon.pod_uid.as_deref(), Some(uid));
    }

    #[test]
    fn paths_no_runtime_made_name_nothing() {
        for p in [
            "/",
            "/user.slice/user-1000.slice/session-2.scope",
            "/system.slice/redis-server.service",
            "/process_api/888c399c9d86d8c1f921559c6fb2710b",
            // A conmon scope is the monitor beside a container, not the container.
            "/machine.slice/libpod-conmon-3f6c2d9e8b7a.scope/x",
        ] {
            let n = parse_cgroup_path(p);
            assert!(!n.names_something(), "{p}: {n:?}");
        }
    }

    #[test]
    fn the_path_named_is_the_container_s_then_v2_then_cpu() {
        let v1 = format!(
            "12:pids:/docker/{ID}\n4:memory:/docker/{ID}\n2:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        assert_eq!(cgroup_path(&v1), Some(format!("/docker/{ID}")));
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            cgroup_path(&v2),
            Some(format!("/system.slice/docker-{ID}.scope"))
        );
        let plain = "4:memory:/jobs/a\n1:cpu:/\n0::/\n";
        assert_eq!(cgroup_path(plain).as_deref(), Some("/jobs/a"));
        assert_eq!(cgroup_path("0::/\n").as_deref(), Some("/"));
        assert_eq!(cgroup_path(""), None);
    }

    #[test]
    fn ns_pid_is_the_innermost() {
        let s = "Name:\tredis-server\nNSpid:\t29669\t1\nNSpgid:\t29669\t1\n";
        assert_eq!(ns_pid_of(s), Some(1));
        assert_eq!(ns_pid_of("NSpid:\t4242\n"), Some(4242));
        assert_eq!(ns_pid_of("Name:\tx\n"), None);
    }

    #[test]
    fn a_chroot_s_links_lose_its_prefix_and_paths_go_through_proc() {
        let r = Root {
            via: Some("/proc/7/root".into()),
            link: Some("/tmp/x/root".into()),
        };
        assert_eq!(r.target_path("/tmp/x/root/data"), "/data");
        assert_eq!(r.target_path("/tmp/x/root"), "/");
        assert_eq!(r.target_path("/tmp/x/rootless"), "/tmp/x/rootless");
        assert_eq!(
            r.host_path("/data/redis.log"),
            "/proc/7/root/data/redis.log"
        );
        assert_eq!(r.host_path("redis.log"), "redis.log");
        assert_eq!(Root::host().host_path("/data/a"), "/data/a");
    }

    /// A wait's pid is the child learnt at its fork; a fork's is looked up afresh, never
    /// taken from a process that had the pid before (here none is found: this process has
    /// no child, so the namespace's value is kept).
    #[test]
    fn a_reused_namespace_pid_is_not_mapped_to_the_old_process() {
        let me = std::process::id();
        let mut p = PidNs {
            nested: true,
            to_host: [(29, 5778)].into_iter().collect(),
        };
        let wait4 = crate::syscalls::info("wait4");
        let clone = crate::syscalls::info("clone");
        let read = crate::syscalls::info("read");
        assert_eq!(p.host_ret(wait4, Some(29), me), Some(5778));
        assert_eq!(p.host_ret(read, Some(29), me), Some(29));
        assert_eq!(p.host_ret(wait4, Some(-10), me), Some(-10));
        assert_eq!(p.host_ret(clone, Some(29), me), Some(29));
        assert!(p.pairs().is_empty());
    }

    /// On a bare host (this test's own process) nothing differs and nothing is mapped.
    #[test]
    fn our_own_process_is_on_the_host() {
        let me = std::process::id();
        assert!(differing_namespaces(me).is_empty());
        assert!(!Root::of(me).is_other());
        let mut p = PidNs::of(me);
        assert_eq!(p.to_host(me, 5, true), 5);
        assert_eq!(hostname(me), None);
    }
}
