//! One set of kernel programs for every watched process (`watch --all`): the programs
//! are loaded and attached once (`BpfHost::start`), the processes traced are the keys of
//! the `tgids` map (the `target` fast path is switched off: every tgid is looked up there),
//! and a demultiplexing thread hands each record from the one ring to the tracer of the
//! process it is about, by tgid (`Route`): a process's forked children are routed with it
//! from their fork record on. Each process's `BpfTracer` then turns its records into
//! events as it does alone. What is shared is said per process: the kernel's count of
//! records the ring had no room for cannot tell whose they were, so each tracer counts all
//! of them; a tracer that falls behind loses its own records past `ROUTE_BACKLOG`, counted
//! as its own.

use super::load::{self, errno_of, load_error, Link};
use super::ring::BpfRing;
use super::{arrivals, BpfConfig, KTarget, Measure, Rec, REC_FORK, REC_TASK_EXIT};
use crate::event::Tid;
use crate::live::reader::Reader;
use crate::live::AttachError;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Records waiting for one process's tracer at most (about 60 MiB): past it the demux
/// drops that process's records, counted as lost by its tracer, so one stuck analysis never
/// grows the watcher without bound nor holds up the others.
const ROUTE_BACKLOG: usize = 256 << 10;

/// Where one process's records go.
pub(crate) struct RouteTx {
    tx: mpsc::Sender<Vec<Rec>>,
    /// Records sent and not yet taken.
    backlog: AtomicUsize,
    /// Records dropped for the backlog bound, not yet told to the tracer.
    lost: AtomicU64,
}

/// What the host and its tracers share.
pub(crate) struct HostInner {
    pub(super) bpf: Mutex<aya::Ebpf>,
    /// tgid (a watched process or a forked child of one) -> its route.
    routes: Mutex<FxHashMap<Tid, Arc<RouteTx>>>,
    pub(super) pages: usize,
    pub(super) follow_forks: bool,
    /// Whether the arrival programs run, and which flavour (or why not).
    pub(super) arrivals: Result<&'static str, String>,
    /// Which optional programs run (`BpfTracer::extras`).
    pub(super) extras: super::Extras,
    /// Passes of the demux thread: a tracer that stops waits for passes after it.
    passes: AtomicU64,
    stop: AtomicBool,
}

/// The loaded programs, their ring's reader and the demux thread.
pub struct BpfHost {
    pub(crate) inner: Arc<HostInner>,
    links: Vec<(&'static str, Link)>,
    demux: Option<std::thread::JoinHandle<()>>,
}

impl BpfHost {
    /// Loads and attaches the programs with no process traced yet.
    pub fn start(follow_forks: bool, pages: usize) -> Result<BpfHost, AttachError> {
        let cfg = BpfConfig {
            pid: 0,
            follow_forks,
            pages,
        };
        let ring_bytes = (pages * crate::live::page_size()) as u32;
        let layout = arrivals::layout();
        // Whose sends to skip is per process: with many, none is skipped.
        let listening = arrivals::Listening::unknown();
        let mut bpf = load::load(&cfg, Measure::Off, ring_bytes, &layout, &listening)?;
        let btf = load::kernel_btf();
        let (links, arrivals, extras) = load::attach_programs(&mut bpf, &layout, &listening, &btf)?;
        drop(btf);
        every_tgid_in_the_map(&mut bpf)?;
        let ring = bpf
            .take_map("events")
            .ok_or_else(|| AttachError::Other("the BPF object lacks events".into()))?;
        let ring = aya::maps::RingBuf::try_from(ring)
            .map_err(|e| load_error("cannot map the BPF ring buffer", &e, errno_of(&e)))?;
        let ring = BpfRing::new(ring, ring_bytes as usize, false)
            .map_err(|e| AttachError::Other(format!("cannot map the BPF ring buffer: {e}")))?;
        let reader = Reader::start("stallscope-bpf", ring)
            .map_err(|e| AttachError::Other(format!("cannot start the ring reader: {e}")))?;
        let inner = Arc::new(HostInner {
            bpf: Mutex::new(bpf),
            routes: Mutex::default(),
            pages,
            follow_forks,
            arrivals,
            extras,
            passes: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let i2 = inner.clone();
        let demux = std::thread::Builder::new()
            .name("stallscope-demux".into())
            .spawn(move || demux(&i2, reader))
            .map_err(|e| AttachError::Other(format!("cannot start the demux thread: {e}")))?;
        eprintln!("stallscope: one set of bpf programs for every watched process (the traced ones are the keys of the tgids map)");
        Ok(BpfHost {
            inner,
            links,
            demux: Some(demux),
        })
    }
}

impl Drop for BpfHost {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.demux.take() {
            let _ = h.join();
        }
        let mut bpf = self.inner.bpf.lock().unwrap_or_else(|e| e.into_inner());
        for (prog, link) in self.links.drain(..) {
            load::detach(&mut bpf, prog, link);
        }
    }
}

/// `target` says "look every tgid up in `tgids`": no one process is the fast path.
fn every_tgid_in_the_map(bpf: &mut aya::Ebpf) -> Result<(), AttachError> {
    let mut target: aya::maps::Array<_, KTarget> = aya::maps::Array::try_from(
        bpf.map_mut("target")
            .ok_or_else(|| AttachError::Other("the BPF object lacks target".into()))?,
    )
    .map_err(|e| load_error("target", &e, None))?;
    let t = KTarget {
        tgid: 0,
        children: 1,
    };
    target
        .set(0, t, 0)
        .map_err(|e| load_error("cannot set the bpf target", &e, errno_of(&e)))
}

/// The demux thread: each batch the reader copied out, split by tgid and sent on.
fn demux(inner: &HostInner, reader: Reader<BpfRing>) {
    let mut by_route: FxHashMap<usize, (Arc<RouteTx>, Vec<Rec>)> = FxHashMap::default();
    loop {
        let stopping = inner.stop.load(Ordering::SeqCst);
        if let Some(batch) = reader.next(Duration::from_millis(20)) {
            let mut routes = inner.routes.lock().unwrap_or_else(|e| e.into_inner());
            route_batch(&mut routes, inner.follow_forks, &batch, &mut by_route);
            drop(routes);
            reader.give_back(batch);
            for (_, (r, recs)) in by_route.drain() {
                r.backlog.fetch_add(recs.len(), Ordering::Relaxed);
                let _ = r.tx.send(recs);
            }
        }
        inner.passes.fetch_add(1, Ordering::SeqCst);
        if stopping {
            return;
        }
    }
}

/// Sorts one batch's records into their routes (`by_route`, by route address), following
/// forks: a child process's records go where its parent's do, until it exits.
fn route_batch(
    routes: &mut FxHashMap<Tid, Arc<RouteTx>>,
    follow_forks: bool,
    batch: &[Rec],
    by_route: &mut FxHashMap<usize, (Arc<RouteTx>, Vec<Rec>)>,
) {
    for r in batch {
        let Some(route) = routes.get(&r.tgid).cloned() else {
            continue;
        };
        if r.kind == REC_FORK && r.ret != 1 && follow_forks && r.nr > 0 {
            routes.insert(r.nr as Tid, route.clone());
        }
        let key = Arc::as_ptr(&route) as usize;
        let slot = by_route
            .entry(key)
            .or_insert_with(|| (route.clone(), Vec::new()));
        if route.backlog.load(Ordering::Relaxed) + slot.1.len() >= ROUTE_BACKLOG {
            route.lost.fetch_add(1, Ordering::Relaxed);
        } else {
            slot.1.push(*r);
        }
        if r.kind == REC_TASK_EXIT && r.tid == r.tgid {
            // A child's last thread (the watched process's own route is removed by its tracer).
            let owner = routes
                .iter()
                .any(|(t, x)| *t != r.tgid && Arc::ptr_eq(x, &route));
            if owner {
                routes.remove(&r.tgid);
            }
        }
    }
}

/// One process's end of the demux.
pub(crate) struct Route {
    host: Arc<HostInner>,
    pid: Tid,
    tx: Arc<RouteTx>,
    rx: mpsc::Receiver<Vec<Rec>>,
}

impl Route {
    /// Starts routing `pid`'s records here, then puts it in the kernel's map: from then on
    /// every thread of it is traced.
    pub(crate) fn open(host: &Arc<HostInner>, pid: Tid) -> Result<Route, AttachError> {
        let (tx, rx) = mpsc::channel();
        let tx = Arc::new(RouteTx {
            tx,
            backlog: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
        });
        host.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, tx.clone());
        let mut bpf = host.bpf.lock().unwrap_or_else(|e| e.into_inner());
        let mut tgids: aya::maps::HashMap<_, u32, u32> = aya::maps::HashMap::try_from(
            bpf.map_mut("tgids")
                .ok_or_else(|| AttachError::Other("the BPF object lacks tgids".into()))?,
        )
        .map_err(|e| load_error("tgids", &e, None))?;
        tgids
            .insert(pid, 1, 0)
            .map_err(|e| load_error("cannot start tracing", &e, errno_of(&e)))?;
        Ok(Route {
            host: host.clone(),
            pid,
            tx,
            rx,
        })
    }

    pub(super) fn host(&self) -> &HostInner {
        &self.host
    }

    /// The next batch of this process's records, waiting at most `wait`.
    pub(super) fn next(&self, wait: Duration) -> Option<Vec<Rec>> {
        let b = if wait.is_zero() {
            self.rx.try_recv().ok()
        } else {
            self.rx.recv_timeout(wait).ok()
        }?;
        self.tx.backlog.fetch_sub(b.len(), Ordering::Relaxed);
        Some(b)
    }

    /// Records dropped for the backlog bound since the last call.
    pub(super) fn take_lost(&self) -> u64 {
        self.tx.lost.swap(0, Ordering::Relaxed)
    }

    /// Stops tracing the process and its children (out of the kernel's map), and waits
    /// until the demux has passed over what the ring held then: every record of theirs is
    /// then in this route's queue.
    pub(super) fn stop_tracing(&self) {
        let tgids: Vec<Tid> = {
            let routes = self.host.routes.lock().unwrap_or_else(|e| e.into_inner());
            routes
                .iter()
                .filter(|(_, r)| Arc::ptr_eq(r, &self.tx))
                .map(|(t, _)| *t)
                .collect()
        };
        {
            let mut bpf = self.host.bpf.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(Ok(mut m)) = bpf
                .map_mut("tgids")
                .map(aya::maps::HashMap::<_, u32, u32>::try_from)
            {
                for t in &tgids {
                    let _ = m.remove(t);
                }
            }
        }
        // The reader polls the ring every 5 ms; two demux passes after a pause are past it.
        std::thread::sleep(Duration::from_millis(30));
        let from = self.host.passes.load(Ordering::SeqCst);
        let t = Instant::now();
        while self.host.passes.load(Ordering::SeqCst) < from + 2
            && t.elapsed() < Duration::from_millis(500)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lets go of the kernel's per-thread entries of `tids` (calls in progress when tracing
    /// stopped: the exit program that would delete them no longer runs for them).
    pub(super) fn forget_threads(&self, tids: &[Tid]) {
        let mut bpf = self.host.bpf.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Ok(mut m)) = bpf
            .map_mut("inflight")
            .map(aya::maps::HashMap::<_, u32, super::KEntry>::try_from)
        {
            for t in tids {
                let _ = m.remove(t);
            }
        }
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        let mut routes = self.host.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.retain(|_, r| !Arc::ptr_eq(r, &self.tx));
        drop(routes);
        let mut bpf = self.host.bpf.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Ok(mut m)) = bpf
            .map_mut("tgids")
            .map(aya::maps::HashMap::<_, u32, u32>::try_from)
        {
            let _ = m.remove(&self.pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DATA_MAX, REC_CALL};
    use super::*;

    fn rec(kind: u32, tid: Tid, tgid: Tid) -> Rec {
        Rec {
            kind,
            tid,
            tgid,
            data_len: 0,
            nr: 0,
            ret: 0,
            enter_ns: 0,
            exit_ns: 0,
            args: [0; 6],
            sched_enter: [0; crate::live::bpf::SNAP],
            sched_exit: [0; crate::live::bpf::SNAP],
            arrival_first: 0,
            arrival_at: 0,
            data: [0; DATA_MAX],
        }
    }

    fn route() -> (Arc<RouteTx>, mpsc::Receiver<Vec<Rec>>) {
        let (tx, rx) = mpsc::channel();
        let r = Arc::new(RouteTx {
            tx,
            backlog: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
        });
        (r, rx)
    }

    /// Routes `batch` and returns, per route, the (tid, kind) of what it got.
    fn run(
        routes: &mut FxHashMap<Tid, Arc<RouteTx>>,
        batch: &[Rec],
    ) -> FxHashMap<usize, Vec<(Tid, u32)>> {
        let mut by = FxHashMap::default();
        route_batch(routes, true, batch, &mut by);
        by.into_iter()
            .map(|(k, (_, v))| (k, v.iter().map(|r| (r.tid, r.kind)).collect()))
            .collect()
    }

    #[test]
    fn records_go_to_their_process_and_a_forked_child_goes_with_its_parent() {
        let (a, _ra) = route();
        let (b, _rb) = route();
        let mut routes: FxHashMap<Tid, Arc<RouteTx>> = FxHashMap::default();
        routes.insert(100, a.clone());
        routes.insert(200, b.clone());
        let mut fork = rec(REC_FORK, 100, 100);
        fork.nr = 150;
        fork.ret = 0;
        let mut thread = rec(REC_FORK, 200, 200);
        thread.nr = 201;
        thread.ret = 1;
        let batch = [
            rec(REC_CALL, 101, 100),
            rec(REC_CALL, 200, 200),
            fork,
            thread,
            rec(REC_CALL, 150, 150),
            rec(REC_CALL, 201, 200),
            rec(REC_CALL, 300, 300),
        ];
        let got = run(&mut routes, &batch);
        let ka = Arc::as_ptr(&a) as usize;
        let kb = Arc::as_ptr(&b) as usize;
        assert_eq!(
            got[&ka],
            vec![(101, REC_CALL), (100, REC_FORK), (150, REC_CALL)]
        );
        assert_eq!(
            got[&kb],
            vec![(200, REC_CALL), (200, REC_FORK), (201, REC_CALL)]
        );
        assert_eq!(got.len(), 2, "an untraced tgid goes nowhere");
        assert!(
            Arc::ptr_eq(&routes[&150], &a),
            "the child is routed with its parent"
        );
        assert!(
            !routes.contains_key(&201),
            "a thread shares its process's tgid"
        );
        // The child's last thread exits: its route goes; the watched process's own stays
        // (its tracer removes it).
        let got = run(
            &mut routes,
            &[rec(REC_TASK_EXIT, 150, 150), rec(REC_TASK_EXIT, 100, 100)],
        );
        assert_eq!(got[&ka], vec![(150, REC_TASK_EXIT), (100, REC_TASK_EXIT)]);
        assert!(!routes.contains_key(&150));
        assert!(routes.contains_key(&100));
    }

    #[test]
    fn a_route_that_falls_behind_loses_its_own_records_counted() {
        let (a, _ra) = route();
        let (b, _rb) = route();
        a.backlog.store(ROUTE_BACKLOG - 2, Ordering::Relaxed);
        let mut routes: FxHashMap<Tid, Arc<RouteTx>> = FxHashMap::default();
        routes.insert(100, a.clone());
        routes.insert(200, b.clone());
        let batch: Vec<Rec> = (0..5)
            .flat_map(|_| [rec(REC_CALL, 100, 100), rec(REC_CALL, 200, 200)])
            .collect();
        let got = run(&mut routes, &batch);
        assert_eq!(got[&(Arc::as_ptr(&a) as usize)].len(), 2);
        assert_eq!(a.lost.load(Ordering::Relaxed), 3);
        assert_eq!(
            got[&(Arc::as_ptr(&b) as usize)].len(),
            5,
            "the other is untouched"
        );
        assert_eq!(b.lost.load(Ordering::Relaxed), 0);
    }
}
