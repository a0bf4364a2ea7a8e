//! `watch`'s view of redis's own signals, the live input of the redis-evidence join for
//! incident reports: redis's log followed as it is written (`redis_log::Follower`) and, with
//! `--redis`, the LATENCY/INFO poller (`redis_client::Poller`). `attach` keeps all of both
//! until it ends; a watcher keeps only the last minute or so (what an incident report can
//! reach), and each incident gets the log lines held when it is written and the poller's
//! samples of its window after one SLOWLOG/LATENCY HISTORY round of its own.

use crate::event::Nanos;
use crate::evidence::{FollowedLog, Inputs, LogSource};
use crate::redis_client::{Poller, PollerView};
use crate::redis_log::{Follower, LogLine, ReadStats};
use crate::report::Report;
use std::collections::VecDeque;
use std::time::Duration;

/// Most log lines held (a verbose redis under load logs a lot; the window is short anyway).
const MAX_LINES: usize = 20_000;
/// How long an incident's writer waits for its SLOWLOG/LATENCY HISTORY round.
const HISTORY_WAIT: Duration = Duration::from_secs(3);

pub(crate) struct WatchRedis {
    log: Option<(LogSource, Follower)>,
    poller: Option<Poller>,
    /// (when it was read, monotonic ns; the line)
    lines: VecDeque<(Nanos, LogLine)>,
    stats: ReadStats,
    dropped: u64,
    error: Option<String>,
}

/// What one incident takes of them.
pub(crate) struct IncidentRedis {
    log: Option<FollowedLog>,
    poller: Option<PollerView>,
    from_wall_ms: i64,
}

impl WatchRedis {
    /// Which log to follow, asking redis at `--redis` (`CONFIG GET logfile`) when neither
    /// `--redis-log` nor the config says. Called before the tracer attaches: that one-off
    /// connection is not the poller's, whose connections the analysis is told about
    /// (`take_own_conns`), and once traced its command would count as a client's.
    /// `redis_log`: `--redis-log`; `redis`: `--redis`'s address.
    pub(crate) fn log_source(
        redis_log: Option<&str>,
        redis: Option<&str>,
        ctx: &crate::live::procctx::ProcContext,
        conf: Option<&crate::fdtable::RedisConf>,
    ) -> Option<LogSource> {
        crate::evidence::live_log_source(redis_log, redis, ctx, conf)
    }

    /// `src`: the log to follow (`log_source`, before the attach).
    /// `redis`: `--redis`'s address, polled once a second; `signalling`: each poll also
    /// looks for what is new in LATENCY LATEST and the slow log (`take_signals`, the cheap
    /// tier's triggers).
    pub(crate) fn start(
        redis: Option<&str>,
        ctx: &crate::live::procctx::ProcContext,
        src: Option<LogSource>,
        signalling: bool,
    ) -> WatchRedis {
        let log = src.map(|s| {
            let f = Follower::start(&s.path, Duration::from_millis(200), false);
            (s, f)
        });
        let every = Duration::from_secs(1);
        let poller = redis.map(|a| match signalling {
            true => Poller::start_signalling(a, every, Some(ctx.pid)),
            false => Poller::start_for(a, every, Some(ctx.pid)),
        });
        WatchRedis {
            log,
            poller,
            lines: VecDeque::new(),
            stats: ReadStats::default(),
            dropped: 0,
            error: None,
        }
    }

    /// The log's path and how it was found, for the start message.
    pub(crate) fn followed(&self) -> Option<&LogSource> {
        self.log.as_ref().map(|(s, _)| s)
    }

    /// Takes the log's new lines and forgets what is older than `keep` before `now`.
    pub(crate) fn tick(&mut self, now: Nanos, keep: Nanos) {
        if let Some((_, f)) = &self.log {
            let got = f.take_lines();
            self.stats = got.stats;
            self.error = got.error;
            for l in got.lines {
                if self.lines.len() >= MAX_LINES {
                    self.lines.pop_front();
                    self.dropped += 1;
                }
                self.lines.push_back((now, l));
            }
        }
        while self.lines.front().is_some_and(|(t, _)| *t < now - keep) {
            self.lines.pop_front();
        }
        if let Some(p) = &self.poller {
            let wall = crate::redis_client::wall_ms();
            p.view().forget_before(wall - keep / 1_000_000);
        }
    }

    /// The traced redis's fds of the poller's new connections (`Poller::take_own_conns`).
    pub(crate) fn take_own_conns(&self) -> Vec<(i32, i64)> {
        self.poller
            .as_ref()
            .map(|p| p.take_own_conns())
            .unwrap_or_default()
    }

    /// What the poller found new in redis's own signals since the last call.
    pub(crate) fn take_signals(&self) -> Vec<crate::redis_client::Signal> {
        self.poller
            .as_ref()
            .map(|p| p.take_signals())
            .unwrap_or_default()
    }

    /// What an incident whose events start at `from` (monotonic ns) takes along.
    pub(crate) fn for_incident(&self, from: Nanos) -> Option<IncidentRedis> {
        if self.log.is_none() && self.poller.is_none() {
            return None;
        }
        let now = crate::clock::now_mono();
        let from_wall_ms = crate::redis_client::wall_ms() - (now - from).max(0) / 1_000_000;
        Some(IncidentRedis {
            log: self.log.as_ref().map(|(src, _)| FollowedLog {
                source: Some(src.clone()),
                lines: self.lines.iter().map(|(_, l)| l.clone()).collect(),
                stats: self.stats.clone(),
                dropped: self.dropped,
                error: self.error.clone(),
                followed: true,
            }),
            poller: self.poller.as_ref().map(|p| p.view()),
            from_wall_ms,
        })
    }

    pub(crate) fn stop(self) {
        if let Some((_, f)) = self.log {
            f.finish(Duration::from_millis(0));
        }
        if let Some(p) = self.poller {
            p.stop_detached();
        }
    }
}

impl IncidentRedis {
    /// Joins them onto the incident's report (on the writer thread: the history round
    /// may wait for redis).
    pub(crate) fn apply(self, report: &mut Report) -> anyhow::Result<()> {
        let server = self.poller.map(|v| {
            v.history_round(HISTORY_WAIT);
            v.since(self.from_wall_ms - 1000)
        });
        crate::evidence::apply(
            report,
            Inputs {
                log: None,
                followed: self.log,
                server,
                date_given: false,
            },
        )
    }
}
