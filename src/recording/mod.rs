//! Output layer: a recording of a live session, written and read back in one place. A
//! recording is strace text (`strace`: the `Recorder` that writes the live events in the
//! shape `stallscope analyze` and any strace reader read) and the sidecars beside it that
//! strace text has no words for: `FILE.threads` (thread names), `FILE.redis.conf` (the
//! config the live analysis used), `FILE.lost` (where the kernel dropped records),
//! `FILE.sched` (the scheduler's split of the longer calls and gaps), `FILE.arrivals`
//! (when each socket read's data arrived) and `FILE.container` (the container the process
//! ran in, with its processes' pids inside it: the report's `container`, as JSON), and, from
//! `attach --record`, `FILE.redis.log` (redis's log lines read while recording: `write_log`). `attach --record` and the watch's incident files
//! write them through `RecordingWriter`; `analyze` and the replay tracer read them through
//! `Recording::open`, so a sidecar added here is written and read by every path at once.

pub(crate) mod strace;

use crate::event::{Event, Nanos, SchedSpan, Tid};
use std::collections::HashMap;
use std::io::Write;
pub use strace::{LostMarks, Recorder};

/// The sidecars' suffixes, appended to the trace's path.
pub const THREADS_SUFFIX: &str = ".threads";
pub const CONTAINER_SUFFIX: &str = ".container";
pub use strace::{ARRIVALS_SUFFIX, CONF_SUFFIX, LOST_SUFFIX, SCHED_SUFFIX};

/// `FILE.redis.log`: redis's log lines as `attach --record` followed them (through the
/// container's root when redis runs in one), so that `analyze FILE` joins them wherever the
/// log itself now is: gone with the container, or on another machine. Not through
/// `RecordingWriter`: the lines are complete only once the follower stops, after the trace;
/// `evidence::find_log` reads it as a log beside the trace.
pub const LOG_SUFFIX: &str = crate::evidence::RECORDED_LOG_SUFFIX;

/// Writes `FILE.redis.log` beside the recording at `base`, or removes an earlier
/// recording's when no line was read (`text` None or empty).
pub(crate) fn write_log(base: &str, text: Option<&[u8]>) -> std::io::Result<()> {
    let mut store = FileStore::in_place(base);
    match text.filter(|t| !t.is_empty()) {
        Some(t) => {
            let mut w = store.create(LOG_SUFFIX)?;
            w.write_all(t)?;
            w.flush()
        }
        None => store.remove(LOG_SUFFIX),
    }
}

/// Where a recording's files go. `attach --record` writes them in place as it traces; the
/// watch's incident writer writes each whole under a temporary name and renames it once
/// complete, so that a reader of the incident directory never sees half a recording.
pub(crate) trait Store {
    /// A writer for the trace (`suffix` empty) or one of its sidecars.
    fn create(&mut self, suffix: &str) -> std::io::Result<Box<dyn Write + Send>>;
    /// A sidecar this recording has none of: an earlier recording's must not be read with it.
    fn remove(&mut self, suffix: &str) -> std::io::Result<()>;
    /// Every file written is complete.
    fn commit(&mut self) -> std::io::Result<()>;
}

/// Files at `base` + suffix: written in place (`attach --record`: the user watches the trace
/// grow), or privately (a watch incident: mode 0640, as an incident names files and commands
/// of the service; each under a hidden temporary name, synced and renamed at `commit`).
pub(crate) struct FileStore {
    base: String,
    private: bool,
    written: Vec<String>,
}

impl FileStore {
    pub(crate) fn in_place(base: impl Into<String>) -> FileStore {
        FileStore {
            base: base.into(),
            private: false,
            written: vec![],
        }
    }

    pub(crate) fn private(base: impl Into<String>) -> FileStore {
        FileStore {
            base: base.into(),
            private: true,
            written: vec![],
        }
    }

    fn path(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.base)
    }

    /// `DIR/.NAME.stallscope-tmp`: hidden from whoever lists the directory for finished files.
    fn tmp(path: &str) -> String {
        let p = std::path::Path::new(path);
        let name = p
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        p.with_file_name(format!(".{name}.stallscope-tmp"))
            .to_string_lossy()
            .into_owned()
    }
}

impl Store for FileStore {
    fn create(&mut self, suffix: &str) -> std::io::Result<Box<dyn Write + Send>> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path(suffix);
        let f = if self.private {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o640)
                .open(Self::tmp(&path))
        } else {
            std::fs::File::create(&path)
        }
        .map_err(|e| named(&path, e))?;
        self.written.push(path);
        Ok(Box::new(f))
    }

    fn remove(&mut self, suffix: &str) -> std::io::Result<()> {
        let path = self.path(suffix);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(std::io::Error::new(
                e.kind(),
                format!("cannot remove the stale {path}: {e}"),
            )),
            _ => Ok(()),
        }
    }

    fn commit(&mut self) -> std::io::Result<()> {
        if self.private {
            for p in std::mem::take(&mut self.written) {
                let tmp = Self::tmp(&p);
                std::fs::File::open(&tmp)?.sync_data()?;
                std::fs::rename(&tmp, &p).map_err(|e| named(&p, e))?;
            }
        }
        Ok(())
    }
}

impl Drop for FileStore {
    /// A private recording abandoned before `commit` leaves no temporary files behind.
    fn drop(&mut self) {
        if self.private {
            for p in &self.written {
                let _ = std::fs::remove_file(Self::tmp(p));
            }
        }
    }
}

fn named(path: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{path}: {e}"))
}

/// What a recording keeps of the session beside the events.
pub(crate) struct RecordingStart<'a> {
    pub pid: Tid,
    /// The live clock at the attach, and the wall time then.
    pub first: Nanos,
    pub wall_at_first: Nanos,
    pub cwd: Option<String>,
    /// The fds open at the attach (from /proc), so their files are named in the trace.
    pub fds: &'a [(i32, String)],
    /// Keep the scheduler's split of calls and gaps this long or longer (None: the backend
    /// has no split).
    pub sched_floor: Option<Nanos>,
    /// The backend dates socket reads' arrivals.
    pub arrivals: bool,
    /// The backend stops the threads at every call (ptrace): said in `FILE.sched`, so that
    /// a replay reads the split's time off a CPU as the tracer's hold only then.
    pub stops_tracee: bool,
}

/// Writes a recording: the trace as the events come, the sidecars at `finish`.
pub(crate) struct RecordingWriter<S: Store> {
    store: S,
    rec: Recorder<Box<dyn Write + Send>>,
}

impl<S: Store> RecordingWriter<S> {
    pub(crate) fn start(mut store: S, s: &RecordingStart) -> std::io::Result<Self> {
        let trace = store.create("")?;
        let mut rec = Recorder::new(trace, s.pid, s.first, s.wall_at_first, s.cwd.clone());
        for (fd, what) in s.fds {
            rec.seed_fd(*fd, what);
        }
        match s.sched_floor {
            Some(floor) => {
                let w = std::io::BufWriter::new(store.create(SCHED_SUFFIX)?);
                rec.record_sched(Box::new(w), floor, s.stops_tracee)?;
            }
            None => store.remove(SCHED_SUFFIX)?,
        }
        if s.arrivals {
            let w = std::io::BufWriter::new(store.create(ARRIVALS_SUFFIX)?);
            rec.record_arrivals(Box::new(w))?;
        } else {
            store.remove(ARRIVALS_SUFFIX)?;
        }
        Ok(RecordingWriter { store, rec })
    }

    /// The tracer dropped `n` records before the next event.
    pub(crate) fn note_lost(&mut self, n: u64) {
        self.rec.note_lost(n);
    }

    pub(crate) fn write_event(&mut self, ev: &Event) -> std::io::Result<()> {
        self.rec.write_event(ev)
    }

    /// Ends the trace and writes the sidecars: the thread names, the config (if known), the
    /// container (if any), the losses (none: no file, and none left from an earlier
    /// recording of that name, as for the container).
    pub(crate) fn finish(
        mut self,
        names: &HashMap<Tid, String>,
        conf: Option<&str>,
        container: Option<&crate::report::Container>,
    ) -> std::io::Result<()> {
        let lost = self.rec.lost_text();
        self.rec.finish()?;
        let mut put = |suffix: &str, text: &[u8]| -> std::io::Result<()> {
            let mut w = self.store.create(suffix)?;
            w.write_all(text)?;
            w.flush()
        };
        put(THREADS_SUFFIX, threads_text(names).as_bytes())?;
        if let Some(c) = conf {
            put(CONF_SUFFIX, c.as_bytes())?;
        }
        match &lost {
            Some(t) => put(LOST_SUFFIX, t.as_bytes())?,
            None => self.store.remove(LOST_SUFFIX)?,
        }
        match container {
            Some(c) => {
                let mut text = serde_json::to_string_pretty(c).map_err(std::io::Error::other)?;
                text.push('\n');
                let mut w = self.store.create(CONTAINER_SUFFIX)?;
                w.write_all(text.as_bytes())?;
                w.flush()?;
            }
            None => self.store.remove(CONTAINER_SUFFIX)?,
        }
        self.store.commit()
    }
}

/// The `FILE.threads` sidecar: `TID NAME` lines in tid order, the `--threads` format.
pub(crate) fn threads_text(names: &HashMap<Tid, String>) -> String {
    let mut v: Vec<(&Tid, &String)> = names.iter().collect();
    v.sort();
    v.iter().map(|(t, n)| format!("{t} {n}\n")).collect()
}

/// A recording's sidecars, read back. A missing sidecar is an empty one: recordings made
/// by older versions, or by backends that have no such data, have none.
#[derive(Default)]
pub(crate) struct Recording {
    pub threads: Option<String>,
    pub conf: Option<String>,
    pub lost: Option<LostMarks>,
    pub sched: HashMap<u64, SchedSpan>,
    pub arrivals: HashMap<u64, Nanos>,
    /// Whether the tracer stopped the threads at every call, as `FILE.sched` says (None
    /// without it: a trace no backend split, strace's own or an older recording's).
    pub stops_tracee: Option<bool>,
    /// The container the process ran in, as the live report named it.
    pub container: Option<crate::report::Container>,
}

impl Recording {
    /// The sidecars beside the trace at `path`. A sidecar that is there but unreadable as
    /// what it should hold is an error naming it: a replay without it would silently differ
    /// from the live report.
    pub(crate) fn open(path: &str) -> Result<Recording, String> {
        let side = |suffix: &str| {
            let p = format!("{path}{suffix}");
            std::fs::read_to_string(&p).ok().map(|t| (p, t))
        };
        let mut r = Recording {
            threads: side(THREADS_SUFFIX).map(|x| x.1),
            conf: side(CONF_SUFFIX).map(|x| x.1),
            ..Default::default()
        };
        if let Some((p, t)) = side(LOST_SUFFIX) {
            r.lost = Some(LostMarks::parse(&t).map_err(|e| format!("{p}: {e}"))?);
        }
        if let Some((p, t)) = side(SCHED_SUFFIX) {
            r.sched = strace::parse_sched(&t).map_err(|e| format!("{p}: {e}"))?;
            r.stops_tracee = Some(t.lines().any(|l| l == strace::STOPS_LINE));
        }
        if let Some((p, t)) = side(ARRIVALS_SUFFIX) {
            r.arrivals = strace::parse_arrivals(&t).map_err(|e| format!("{p}: {e}"))?;
        }
        if let Some((p, t)) = side(CONTAINER_SUFFIX) {
            r.container = Some(
                serde_json::from_str(&t)
                    .map_err(|e| format!("{p}: not the report's `container` as JSON: {e}"))?,
            );
        }
        Ok(r)
    }

    /// Nothing beside the events: the trace can be analysed without looking each event up.
    pub(crate) fn is_plain(&self) -> bool {
        self.lost.is_none() && self.sched.is_empty() && self.arrivals.is_empty()
    }

    /// What the live tracer knew of `ev` that its strace line cannot say: the scheduler's
    /// split and when its data arrived, by the line the event came from. Returns the records
    /// lost before it, and the event to analyse (a copy when something was added).
    pub(crate) fn restore(&mut self, ev: &Event) -> (u64, Option<Event>) {
        let dropped = self.lost.as_mut().map_or(0, |l| l.before(ev.line));
        let split = if self.sched.is_empty() {
            None
        } else {
            self.sched.remove(&ev.line)
        };
        let before = if self.arrivals.is_empty() {
            None
        } else {
            self.arrivals.remove(&ev.line)
        };
        if (split.is_none() && before.is_none()) || ev.syscall().is_none() {
            return (dropped, None);
        }
        let mut ev = ev.clone();
        if let crate::event::EventKind::Syscall(sc) = &mut ev.kind {
            if let Some(s) = split {
                sc.sched = Some(Box::new(s));
            }
            sc.arrived = before.map(|ns| ev.ts - ns);
        }
        (dropped, Some(ev))
    }

    /// Records lost after the last event.
    pub(crate) fn lost_after_end(&mut self) -> u64 {
        self.lost.as_mut().map_or(0, |l| l.rest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Container, NsPid};

    fn write(base: &str, container: Option<&Container>) {
        write_split(base, container, None);
    }

    /// A recording whose backend split calls (`stops`: and stopped each one) or did not.
    fn write_split(base: &str, container: Option<&Container>, stops: Option<bool>) {
        let w = RecordingWriter::start(
            FileStore::in_place(base),
            &RecordingStart {
                pid: 4321,
                first: 0,
                wall_at_first: 0,
                cwd: None,
                fds: &[],
                sched_floor: stops.map(|_| 1_000_000),
                arrivals: false,
                stops_tracee: stops.unwrap_or(false),
            },
        )
        .expect("start");
        w.finish(&HashMap::new(), None, container).expect("finish");
    }

    /// A replay reads the split's time off a CPU as the tracer's stops only where the
    /// recording says its backend stopped each call (ptrace); bpf and perf recordings say
    /// it did not, and a trace with no split (strace's own) says nothing.
    #[test]
    fn the_split_says_whether_the_tracer_stopped_each_call() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("r.strace").to_string_lossy().into_owned();
        for stops in [Some(true), Some(false), None] {
            write_split(&base, None, stops);
            assert_eq!(Recording::open(&base).unwrap().stops_tracee, stops);
        }
    }

    /// redis's log lines kept by `attach --record` go beside the trace where `analyze`
    /// looks for a log; a recording that read none leaves no earlier recording's.
    #[test]
    fn the_log_lines_are_kept_beside_the_trace_and_a_stale_copy_goes() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("r.strace").to_string_lossy().into_owned();
        let side = format!("{base}{LOG_SUFFIX}");
        let lines = b"1:M 07 Dec 2026 03:00:00.000 * Ready to accept connections tcp\n";
        write_log(&base, Some(lines)).unwrap();
        assert_eq!(std::fs::read(&side).unwrap(), lines);
        write_log(&base, Some(b"")).unwrap();
        assert!(!std::path::Path::new(&side).exists());
        write_log(&base, Some(lines)).unwrap();
        write_log(&base, None).unwrap();
        assert!(!std::path::Path::new(&side).exists());
    }

    /// The container (its name, namespaces and the pids inside it) reads back as written; a
    /// recording of a process in no container leaves none, not an earlier one's.
    #[test]
    fn the_container_and_its_pids_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("r.strace").to_string_lossy().into_owned();
        let c = Container {
            cgroup: Some("/docker/0123abcd".into()),
            runtime: Some("docker".into()),
            id: Some("0123abcd".into()),
            hostname: Some("cache-0".into()),
            namespaces: vec!["mnt".into(), "pid".into()],
            files_via: Some("/proc/4321/root".into()),
            pids: vec![NsPid { host: 4321, ns: 1 }, NsPid { host: 4400, ns: 19 }],
            ..Default::default()
        };
        write(&base, Some(&c));
        assert_eq!(Recording::open(&base).unwrap().container, Some(c));
        write(&base, None);
        assert_eq!(Recording::open(&base).unwrap().container, None);
        std::fs::write(format!("{base}{CONTAINER_SUFFIX}"), "{not json").unwrap();
        let err = Recording::open(&base).err().unwrap();
        assert!(err.contains(".container"), "{err}");
    }
}
