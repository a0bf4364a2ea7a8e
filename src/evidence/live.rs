//! Live (`attach`): the log followed while tracing and the `--redis` poller, started at
//! attach and joined onto the report at the end. The session layer will own this; it sits
//! here until then, with the signature `attach` calls.

use super::{apply, discover, FollowedLog, Inputs, LogSource};
use crate::redis_log;
use crate::report::Report;
use anyhow::Result;

/// Live (`attach`): the log followed while tracing and the `--redis` poller, started at
/// attach and joined onto the report at the end.
pub struct LiveRedis {
    follower: Option<(LogSource, redis_log::Follower)>,
    poller: Option<crate::redis_client::Poller>,
    /// How the host reads the process's files (its log, found at the end).
    root: crate::live::container::Root,
    /// Keep the log's lines as written (`attach --record`).
    keep_log: bool,
}

impl LiveRedis {
    /// The log is `--redis-log`, else the config's `logfile` (relative to the process's
    /// working directory, which redis has changed to its `dir`).
    /// `asked`: the log found before the attach (`log_source_before_attach`), if redis was
    /// asked.
    /// `redis_log`: `--redis-log`; `redis`: `--redis`'s address. `keep_log`: keep the log's
    /// lines as written, for `finish` to hand back.
    pub fn start(
        redis_log: Option<&str>,
        redis: Option<&str>,
        ctx: &crate::live::procctx::ProcContext,
        conf: Option<&crate::fdtable::RedisConf>,
        asked: Option<LogSource>,
        keep_log: bool,
    ) -> LiveRedis {
        let src = asked.or_else(|| discover::live_log_source(redis_log, None, ctx, conf));
        let follower = src.map(|s| {
            let every = std::time::Duration::from_millis(200);
            let f = redis_log::Follower::start(&s.path, every, keep_log);
            (s, f)
        });
        let poller = redis.map(|a| {
            crate::redis_client::Poller::start_for(
                a,
                std::time::Duration::from_secs(1),
                Some(ctx.pid),
            )
        });
        if let Some(a) = redis {
            eprintln!(
                "stallscope: asking redis at {a} for LATENCY, INFO and SLOWLOG once a second"
            );
        }
        LiveRedis {
            follower,
            poller,
            root: ctx.root.clone(),
            keep_log,
        }
    }

    /// The traced redis's fds of the poller's connections made since the last call (see
    /// `Poller::take_own_conns`), for `Analyzer::mark_own_connection`.
    pub fn take_own_conns(&self) -> Vec<(i32, i64)> {
        self.poller
            .as_ref()
            .map(|p| p.take_own_conns())
            .unwrap_or_default()
    }

    /// Joins what was followed and polled onto `report`; returns the log's lines as redis
    /// wrote them, when asked to keep them and a log was read (None otherwise).
    pub fn finish(self, report: &mut Report) -> Result<Option<Vec<u8>>> {
        let server = self.poller.map(|p| p.finish());
        let mut text = None;
        let followed = self.follower.map(|(src, f)| {
            let mut got = f.finish(std::time::Duration::from_millis(400));
            text = Some(std::mem::take(&mut got.text));
            FollowedLog {
                source: Some(src),
                lines: got.lines,
                stats: got.stats,
                dropped: got.dropped,
                error: got.error,
                followed: true,
            }
        });
        // No config named a log: the one the trace saw redis write, read whole (through the
        // helper too: this disk may be the one that stalls).
        let followed = followed.or_else(|| {
            let src = discover::trace_log_file(report, &self.root)?;
            let mut got = redis_log::Follower::read_whole(&src.path, self.keep_log)
                .finish(std::time::Duration::from_secs(2));
            text = Some(std::mem::take(&mut got.text));
            Some(FollowedLog {
                source: Some(src),
                lines: got.lines,
                stats: got.stats,
                dropped: got.dropped,
                error: got.error,
                followed: false,
            })
        });
        apply(
            report,
            Inputs {
                log: None,
                followed,
                server,
                date_given: false,
            },
        )?;
        Ok(text.filter(|_| self.keep_log))
    }
}
