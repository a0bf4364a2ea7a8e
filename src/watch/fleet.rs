//! `watch --all` and `watch --name` with several matches: one watcher for every redis (and
//! valkey) on the host. A coordinator rescans /proc every second, starts a watch of its own
//! (a thread with its own analyzers, history ring, incident writer) for each new instance
//! and lets go of those that exit. An instance is named by a label that is stable across
//! its restarts and bounded in number (its listening address, and later its container's
//! name, never a pid: `instance_label`); every per-instance metric carries it, its incident
//! reports go under `--out/<label>/`, and its `--events` lines carry it. The rings of all
//! instances share `--ring-size` (`Budget`). What an instance left behind is let go of: its
//! watch's memory and its cgroup's series when it exits, its other metric series
//! `FORGET_AFTER` later unless it is back.

use super::metrics::{InstanceMetrics, Metrics};
use super::{attached, follow, SharedLog, Watcher};
use crate::analyze::Options;
use crate::cli::WatchArgs;
use crate::event::Tid;
use crate::live::bpf::BpfHost;
use anyhow::Result;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The process names `--all` watches.
pub(crate) const ALL_NAMES: [&str; 2] = ["redis-server", "valkey-server"];
/// How often /proc is scanned for instances that started.
const RESCAN: Duration = Duration::from_secs(1);
/// How long a new process that listens on nothing yet is given to start listening before it
/// is named by its config's port or its name instead.
const LISTEN_GRACE: Duration = Duration::from_secs(3);
/// A departed instance's series stay this long at their last values (`stallscope_attached`
/// 0, the rest no longer growing: a rate over the last minutes still sees its last stalls),
/// then are dropped, unless the instance came back meanwhile; its cgroup's are dropped when
/// it leaves (the cgroup is no longer followed).
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(600);

/// What every instance's watch shares: the command line, the metrics, the event log, the
/// ring budget.
pub(crate) struct Shared<'a> {
    pub args: &'a WatchArgs,
    pub opts: Options,
    pub user_conf: Option<String>,
    pub metrics: Metrics,
    pub events: Option<SharedLog>,
    pub budget: Arc<Budget>,
}

/// `--ring-size` shared by the rings of the instances watched now: each gets an equal part.
pub(crate) struct Budget {
    total: usize,
    live: AtomicUsize,
}

/// No ring gets less than this, whatever the number of instances.
const MIN_SHARE: usize = 1 << 20;

impl Budget {
    pub(crate) fn new(total: usize) -> Budget {
        Budget {
            total,
            live: AtomicUsize::new(0),
        }
    }

    /// One ring's part of the budget now.
    pub(crate) fn share(&self) -> usize {
        (self.total / self.live.load(Ordering::Relaxed).max(1)).max(MIN_SHARE)
    }

    pub(crate) fn join(&self) {
        self.live.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Which instance a watch is of, and where its reports go.
pub(crate) struct Instance {
    pub label: String,
    /// `--out`, or `--out/<label>` when several instances are watched.
    pub out: Option<PathBuf>,
    pub budget: Arc<Budget>,
    /// Several instances are watched: messages say which one.
    pub fleet: bool,
    /// The bpf programs every instance shares, when they run.
    pub host: Option<Arc<BpfHost>>,
    /// The cheap tier's programs every instance shares (`--mode cheap`, when they run).
    pub cheap: Option<Arc<super::cheap::SharedCheap>>,
}

impl Instance {
    /// The prefix of this instance's messages: `[127.0.0.1:6379] ` in a fleet, none alone.
    pub(crate) fn say(&self) -> String {
        if self.fleet {
            format!("[{}] ", self.label)
        } else {
            String::new()
        }
    }
}

/// An instance's label: its listening address (the lowest port, IPv4 before IPv6), else
/// the port its config names; prefixed by its container's name where it has one
/// (`web-7f9c/10.0.0.5:6379` keeps two pods' 6379s apart). None when nothing names it.
pub(crate) fn instance_label(
    listen: &[String],
    conf_port: Option<u16>,
    container: Option<&str>,
) -> Option<String> {
    let port_of = |a: &String| {
        a.rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .unwrap_or(u16::MAX)
    };
    let addr = listen
        .iter()
        .min_by_key(|a| (port_of(a), a.starts_with('['), a.as_str()))
        .cloned()
        .or_else(|| conf_port.filter(|p| *p != 0).map(|p| format!(":{p}")))?;
    Some(match container {
        Some(c) => format!("{c}/{addr}"),
        None => addr,
    })
}

/// The label of process `pid` now: in a container, its name first (the host name of its
/// own UTS namespace, a pod's name; else the short container id its cgroup names).
pub(crate) fn label_of(pid: Tid) -> Option<String> {
    let name = crate::live::container::describe(pid, &[]).and_then(|c| {
        c.hostname
            .or_else(|| c.id.map(|i| i.chars().take(12).collect::<String>()))
    });
    instance_label(&follow::listening(pid), conf_port(pid), name.as_deref())
}

/// The `port` its command line or config file gives (the last one wins, as in redis).
fn conf_port(pid: Tid) -> Option<u16> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    let cwd = cwd.as_ref().and_then(|c| c.to_str());
    let root = crate::live::container::Root::of(pid);
    let (text, _) = crate::live::procctx::redis_conf_text(&args, cwd, &root);
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("port "))
        .filter_map(|v| v.trim().parse().ok())
        .next_back()
}

/// A label for the incident directory: `/` (a container's name before the address) is not
/// a file name character.
pub(crate) fn dir_name(label: &str) -> String {
    label.replace('/', "_")
}

/// The processes a fleet watches: by name (`names`), leaving out forked children of a
/// process of the same names (a BGSAVE child is traced with its parent).
pub(crate) fn discover(names: &[&str]) -> Vec<(Tid, String)> {
    let found = crate::live::find_by_names(names);
    let pids: Vec<Tid> = found.iter().map(|(p, _)| *p).collect();
    found
        .into_iter()
        .filter(|(p, _)| crate::live::check_target(*p).is_ok())
        .filter(|(p, _)| parent_of(*p).is_none_or(|pp| !pids.contains(&pp)))
        .collect()
}

/// The processes `--name` found, one a line with where each listens: what a user picks
/// one by (`  4242  listening on 127.0.0.1:6379  redis-server *:6379`).
pub(crate) fn list_matches(found: &[(Tid, String)]) -> String {
    let lines: Vec<String> = found
        .iter()
        .map(|(p, cmd)| {
            let l = follow::listening(*p);
            let at = if l.is_empty() {
                "listening on no TCP port".to_string()
            } else {
                format!("listening on {}", l.join(", "))
            };
            format!("  {p}  {at}  {cmd}")
        })
        .collect();
    lines.join("\n")
}

fn parent_of(pid: Tid) -> Option<Tid> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The cheap tier's programs for every instance (`--mode cheap`, the default), or None (said
/// on stderr) where they cannot run: then every instance is watched in full mode.
fn start_cheap(args: &WatchArgs) -> Option<super::cheap::SharedCheap> {
    if args.mode != crate::cli::WatchMode::Cheap {
        return None;
    }
    match super::cheap::SharedCheap::start(args) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("stallscope: warning: the cheap tier cannot run here: {e}; every instance is watched in full mode (every syscall traced)");
            None
        }
    }
}

/// The bpf programs for every instance: loaded once for `--backend bpf`, and for `auto`
/// where the kernel allows them (else each instance is traced with perf, which has no
/// shared form: its events are opened per process).
fn start_host(args: &WatchArgs) -> Result<Option<BpfHost>> {
    use crate::cli::Backend;
    if !matches!(args.backend, Backend::Auto | Backend::Bpf) {
        return Ok(None);
    }
    let pages = args.perf_pages.unwrap_or(crate::live::bpf::DEFAULT_PAGES);
    match BpfHost::start(!args.no_follow_forks, pages) {
        Ok(h) => Ok(Some(h)),
        Err(e) if args.backend == Backend::Bpf => {
            anyhow::bail!("--backend bpf: cannot load the bpf programs: {e}")
        }
        Err(e) => {
            eprintln!("stallscope: backend auto: the bpf programs cannot be loaded ({e}); each instance is traced with perf");
            Ok(None)
        }
    }
}

/// One instance's watch, running on a thread of the coordinator.
struct Running<'s> {
    label: String,
    metrics: InstanceMetrics,
    /// Its result: whether it attached.
    handle: std::thread::ScopedJoinHandle<'s, bool>,
}

/// What the coordinator keeps between scans.
#[derive(Default)]
struct Fleet<'s> {
    running: HashMap<Tid, Running<'s>>,
    /// Left instances, by label: when, and their series (dropped `FORGET_AFTER` later).
    departed: HashMap<String, (Instant, InstanceMetrics)>,
    /// New processes that listen on nothing yet: since when.
    unnamed: HashMap<Tid, Instant>,
    /// Processes whose watch could not start: not tried again.
    failed: HashMap<Tid, Instant>,
}

/// Watches every process named one of `names` until a stop is asked for (a signal or
/// `--duration`), each on a thread of its own.
pub(crate) fn run(sh: &Shared, names: &[&str]) -> Result<()> {
    let cheap = start_cheap(sh.args).map(Arc::new);
    // In the cheap mode each instance's incident attaches the full tier for itself, for as
    // long as the incident lasts; the full programs are loaded for all only without it.
    let host = match cheap {
        Some(_) => None,
        None => start_host(sh.args)?.map(Arc::new),
    };
    eprintln!(
        "stallscope: watching every process named {} on this host{} (rescanned every second; --ring-size {} MiB shared between them)",
        names.join(" or "),
        match cheap {
            Some(_) => " with one cheap tier for all, each incident escalating its instance to the full tier",
            None => "",
        },
        sh.args.ring_bytes() >> 20
    );
    let deadline = sh
        .args
        .duration
        .map(|d| Instant::now() + Duration::from_nanos(d as u64));
    let stop = || crate::signals::stop_requested() || deadline.is_some_and(|d| Instant::now() >= d);
    std::thread::scope(|sc| {
        let mut f = Fleet::default();
        while !stop() {
            f.reap();
            f.forget_departed(Instant::now());
            for (pid, _) in discover(names) {
                if !f.running.contains_key(&pid) && !f.failed.contains_key(&pid) {
                    f.start(sc, sh, pid, (host.clone(), cheap.clone()));
                }
            }
            sh.metrics.instances.set(f.running.len() as i64);
            let t = Instant::now();
            while t.elapsed() < RESCAN && !stop() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for (_, r) in f.running.drain() {
            let _ = r.handle.join();
        }
    });
    Ok(())
}

impl<'s> Fleet<'s> {
    /// Starts watching `pid` once it has a label (or its grace to get one is over).
    fn start<'e>(
        &mut self,
        sc: &'s std::thread::Scope<'s, 'e>,
        sh: &'s Shared<'e>,
        pid: Tid,
        (host, cheap): (Option<Arc<BpfHost>>, Option<Arc<super::cheap::SharedCheap>>),
    ) {
        let first = *self.unnamed.entry(pid).or_insert_with(Instant::now);
        let label = match label_of(pid) {
            Some(l) => l,
            None if first.elapsed() < LISTEN_GRACE => return,
            None => std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_else(|_| "redis".into()),
        };
        // A restart: the old process's watch has not ended yet. The new one waits for it,
        // so that it takes over the label instead of a `#2`.
        let old_gone = self
            .running
            .iter()
            .any(|(p, r)| r.label == label && crate::live::check_target(*p).is_err());
        if old_gone {
            return;
        }
        self.unnamed.remove(&pid);
        let label = self.unique(label);
        self.departed.remove(&label);
        let metrics = sh.metrics.instance(&label);
        let inst = Instance {
            out: sh.args.out.as_ref().map(|d| d.join(dir_name(&label))),
            label: label.clone(),
            budget: sh.budget.clone(),
            fleet: true,
            host,
            cheap,
        };
        let m2 = metrics.clone();
        let spawned = std::thread::Builder::new()
            .name("watch-instance".into())
            .spawn_scoped(sc, move || watch_instance(sh, pid, inst, m2));
        match spawned {
            Ok(handle) => {
                self.running.insert(
                    pid,
                    Running {
                        label,
                        metrics,
                        handle,
                    },
                );
            }
            Err(e) => {
                eprintln!("stallscope: warning: cannot start watching {pid} ({label}): {e}");
                self.failed.insert(pid, Instant::now());
            }
        }
    }

    /// The label, made unique among the running instances (`#2`...): two processes with
    /// neither an address nor a port share their name.
    fn unique(&self, label: String) -> String {
        let taken = |l: &str| self.running.values().any(|r| r.label == l);
        if !taken(&label) {
            return label;
        }
        (2..)
            .map(|n| format!("{label}#{n}"))
            .find(|l| !taken(l))
            .expect("a free label")
    }

    /// Joins the watches that ended (their process exited, or could not be watched).
    fn reap(&mut self) {
        let done: Vec<Tid> = self
            .running
            .iter()
            .filter(|(_, r)| r.handle.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for pid in done {
            let Some(r) = self.running.remove(&pid) else {
                continue;
            };
            let attached = r.handle.join().unwrap_or(false);
            if !attached || crate::live::check_target(pid).is_ok() {
                // Never attached, or still there: its watch failed; not tried again.
                self.failed.insert(pid, Instant::now());
            }
            r.metrics.leave();
            self.departed.insert(r.label, (Instant::now(), r.metrics));
        }
        self.failed
            .retain(|p, _| std::path::Path::new(&format!("/proc/{p}")).exists());
        self.unnamed
            .retain(|p, _| std::path::Path::new(&format!("/proc/{p}")).exists());
    }

    /// Drops the series of instances gone for `FORGET_AFTER`.
    fn forget_departed(&mut self, now: Instant) {
        self.departed.retain(|_, (at, m)| {
            let keep = now.duration_since(*at) < FORGET_AFTER;
            if !keep {
                m.forget();
            }
            keep
        });
    }
}

/// One instance's watch, from its attach until its process is gone or a stop is asked for.
fn watch_instance(sh: &Shared, pid: Tid, inst: Instance, metrics: InstanceMetrics) -> bool {
    let label = inst.label.clone();
    sh.budget.join();
    let mut w = match Watcher::new(sh, metrics, inst) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("stallscope: warning: cannot watch {pid} ({label}): {e:#}");
            sh.budget.leave();
            return false;
        }
    };
    let watched = match w.inst.cheap.is_some() {
        true => match super::cheap::watch_one(&mut w, pid) {
            Ok(false) => attached::watch_one(&mut w, pid),
            other => other.map(|_| ()),
        },
        false => attached::watch_one(&mut w, pid),
    };
    let ok = match watched {
        Ok(()) => true,
        Err(e) => {
            eprintln!("stallscope: warning: cannot watch {pid} ({label}): {e:#}");
            w.metrics.attached.get() == 1
        }
    };
    w.metrics.attached.set(0);
    if !w.want_stop(true) {
        eprintln!(
            "stallscope: process {pid} ({label}) is gone; stallscope_attached{{instance=\"{label}\"}} is 0 until an instance listening there runs again"
        );
    }
    super::shutdown(&mut w);
    sh.budget.leave();
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_is_the_lowest_listening_port_ipv4_first_then_the_config_port() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            instance_label(
                &l(&["[::]:6379", "0.0.0.0:16379", "0.0.0.0:6379"]),
                None,
                None
            )
            .as_deref(),
            Some("0.0.0.0:6379")
        );
        assert_eq!(
            instance_label(&l(&["[::1]:7000"]), Some(7000), None).as_deref(),
            Some("[::1]:7000")
        );
        assert_eq!(
            instance_label(&[], Some(6380), None).as_deref(),
            Some(":6380")
        );
        assert_eq!(instance_label(&[], Some(0), None), None);
        assert_eq!(
            instance_label(&l(&["10.0.0.5:6379"]), None, Some("web-7f9c")).as_deref(),
            Some("web-7f9c/10.0.0.5:6379")
        );
        assert_eq!(dir_name("web-7f9c/10.0.0.5:6379"), "web-7f9c_10.0.0.5:6379");
    }

    #[test]
    fn the_budget_is_split_between_the_rings_of_the_instances_watched_now() {
        let b = Budget::new(64 << 20);
        assert_eq!(b.share(), 64 << 20);
        for _ in 0..4 {
            b.join();
        }
        assert_eq!(b.share(), 16 << 20);
        b.leave();
        b.leave();
        assert_eq!(b.share(), 32 << 20);
        for _ in 0..200 {
            b.join();
        }
        assert_eq!(b.share(), MIN_SHARE, "never below the floor");
    }

    #[test]
    fn a_listener_of_this_process_names_it() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // Other tests of this process may listen too: the lowest port names it.
        let label = label_of(std::process::id()).expect("a label");
        let p: u16 = label.rsplit_once(':').unwrap().1.parse().unwrap();
        assert!(p <= port, "{label} {port}");
    }
}
