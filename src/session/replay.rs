//! Sessions layer: a tracer that replays a recording (`attach --record`, a watch incident's
//! `.strace`) as the live tracer gave it: the strace text read back by the same source as
//! `analyze`, with what its sidecars keep (the scheduler's split, when reads' data arrived,
//! the losses at their places in the stream) put back on the events. The attach and watch
//! loops run on it unchanged, so they are tested without root and without a redis, and a
//! recording replayed through them must give the report the live session gave.

use crate::event::{Event, EventKind};
use crate::live::procctx::ProcContext;
use crate::live::{Capabilities, Started, Tracer, TracerStats};
use crate::recording::Recording;
use crate::report::LiveBackend;
use crate::source::{InputFormat, Inputs};
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::time::Duration;

/// Events handed on per batch, as a live backend hands on what its ring held.
const BATCH: usize = 256;

pub(crate) struct ReplayTracer {
    inputs: Inputs,
    recording: Recording,
    caps: Capabilities,
    stats: TracerStats,
    /// The traced process (its main thread's tid), from the recording's attach.
    pid: crate::event::Tid,
    /// Events read ahead of the next batch: the first one starts the next batch (it has
    /// records lost before it, which must reach the consumer just before it).
    ahead: Option<(u64, Event)>,
    lost_now: u64,
    /// The recording is read to its end; `done` once what follows its last event (losses
    /// after it) has been handed on too.
    exhausted: bool,
    done: bool,
}

impl ReplayTracer {
    /// Opens the recording at `path` with its sidecars. `caps`: what the backend that made it
    /// could see (a recording does not say whether its backend read buffers or stopped the
    /// tracee); the scheduler's split and the arrivals are the sidecars' own.
    pub(crate) fn open(
        path: &str,
        reads_buffers: bool,
        stops_tracee: bool,
    ) -> Result<ReplayTracer> {
        let recording = Recording::open(path).map_err(anyhow::Error::msg)?;
        let caps = Capabilities {
            stops_tracee,
            reads_buffers,
            splits_sched: !recording.sched.is_empty(),
            dates_arrivals: (!recording.arrivals.is_empty()).then_some(true),
            splits_throttle: false,
        };
        let inputs = Inputs::open(&[path.to_string()], InputFormat::Strace, false)
            .with_context(|| format!("{path}: cannot replay it"))?;
        Ok(ReplayTracer {
            inputs,
            recording,
            caps,
            stats: TracerStats::default(),
            pid: 0,
            ahead: None,
            lost_now: 0,
            exhausted: false,
            done: false,
        })
    }

    /// Starts the replay: reads up to the recording's attach (`Process N attached`), which
    /// names the process and sets the clock, and returns the session's view of it: the
    /// tracer and the process's context as the recording's sidecars keep it.
    pub(crate) fn start(mut self, backend: LiveBackend) -> Result<(Started, ProcContext)> {
        let first = self.pull()?.context("the recording holds no event")?;
        let (pid, threads) = match first.1.kind {
            EventKind::Attach { threads } => (first.1.tid, threads.unwrap_or(1)),
            _ => (first.1.tid, 1),
        };
        self.pid = pid;
        self.stats.attach_mono = first.1.ts;
        self.stats.attach_wall = first.1.ts;
        self.ahead = Some(first);
        let ctx = ProcContext {
            pid,
            thread_names: self
                .recording
                .threads
                .as_deref()
                .map(crate::analyze::parse_thread_names)
                .unwrap_or_default()
                .into_iter()
                .collect(),
            redis_conf: self.recording.conf.clone().unwrap_or_default(),
            ..Default::default()
        };
        Ok((
            Started {
                tracer: Box::new(self),
                backend,
                threads,
            },
            ctx,
        ))
    }

    /// The next event with what its sidecars add, and the records lost before it.
    fn pull(&mut self) -> Result<Option<(u64, Event)>> {
        let Some(ev) = self.inputs.next_event()? else {
            return Ok(None);
        };
        let (lost, restored) = self.recording.restore(&ev);
        Ok(Some((lost, restored.unwrap_or(ev))))
    }

    fn count(&mut self, ev: &Event) {
        if let Some(sc) = ev.syscall() {
            self.stats.count(ev.tid, self.pid, sc.dur);
        }
        self.stats.detach_mono = self.stats.detach_mono.max(ev.end());
    }
}

impl Tracer for ReplayTracer {
    fn next_event_timeout(&mut self, _timeout: Duration) -> Result<Option<Event>> {
        let mut one = VecDeque::new();
        self.next_batch(Duration::ZERO, &mut one)?;
        Ok(one.pop_front())
    }

    fn next_batch(&mut self, _timeout: Duration, out: &mut VecDeque<Event>) -> Result<()> {
        if self.done {
            return Ok(());
        }
        while out.len() < BATCH {
            let next = match self.ahead.take() {
                Some(x) => Some(x),
                None if self.exhausted => None,
                None => self.pull()?,
            };
            let Some((lost, ev)) = next else {
                self.exhausted = true;
                if out.is_empty() {
                    // Losses after the last event come after it, in a round of their own.
                    let rest = self.recording.lost_after_end();
                    self.lost_now += rest;
                    self.stats.lost_events += rest;
                    self.done = true;
                }
                break;
            };
            if lost > 0 {
                if !out.is_empty() {
                    // Its losses must reach the consumer right before it: it opens the next batch.
                    self.ahead = Some((lost, ev));
                    break;
                }
                self.lost_now += lost;
                self.stats.lost_events += lost;
            }
            self.count(&ev);
            out.push_back(ev);
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done && self.ahead.is_none()
    }

    /// A replay has no process to let go of: it ends where the recording does, as the live
    /// session ended there.
    fn stop(&mut self) {}

    fn stats(&self) -> TracerStats {
        self.stats.clone()
    }

    fn warnings(&mut self) -> Vec<String> {
        vec![]
    }

    fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost_now)
    }

    fn stops_tracee(&self) -> bool {
        self.caps.stops_tracee
    }

    fn reads_buffers(&self) -> bool {
        self.caps.reads_buffers
    }

    fn splits_sched(&self) -> bool {
        self.caps.splits_sched
    }

    fn dates_arrivals(&self) -> Option<bool> {
        self.caps.dates_arrivals
    }
}
